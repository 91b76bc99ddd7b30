//! The writer's batch decision: every message of a batch decided from its group (as read, or
//! assumed new), the rows gathered and written, and the answers once committed. It owns no
//! connection or transaction (the writer's loop does) and must never import the loop.

use std::collections::HashMap;
use std::time::Instant;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::decided::{Decided, decide};
use super::reads::{StoredGroups, open_groups_by_source};
use super::rows::Rows;
use crate::rmp::quota::SourceRoom;
use crate::rmp::receiver::{Action, starts_counted_group};
use crate::store::StoreError;
use crate::store::postgres::failure::Failure;
use crate::store::postgres::notify::Announcement;
use crate::store::postgres::shared::Shared;
use crate::store::received::{Received, ReceivedMessage};
use crate::store::source_usage::{self, UsageChanges};

/// What a batch is decided from.
pub(super) enum Basis {
    /// Its stored groups, as read.
    Read(StoredGroups),
    /// Nothing read: every group taken for one not stored (singletons; see `write_once`).
    AssumedNew,
}

/// A batch written (or about to be committed, under the locks), with what it announces.
pub(super) struct Written<'m> {
    decided: Vec<Result<Decided<'m>, StoreError>>,
    announcement: Announcement,
    quota: BatchQuota,
}

impl Written<'_> {
    /// After the commit: wakes this gateway's own waiters (the other gateways hear of it by
    /// the NOTIFY the write sent) and answers each message.
    pub(super) fn committed(self, shared: &Shared) -> Vec<Result<Received, StoreError>> {
        self.announcement.wake_here(shared);
        shared.health.committed(true);
        self.quota.committed(shared);
        self.decided
            .into_iter()
            .map(|d| {
                d.map(|d| Received {
                    verdict: d.plan.verdict,
                    action: d.plan.action,
                    held_back: d.plan.held_back,
                })
            })
            .collect()
    }
}

/// Decides each message from `basis` and writes the batch; `None`, with nothing written, when
/// a group changed since it was read (or, read or not, was stored meanwhile), or when a batch
/// decided unread has a decision that stores no group.
pub(super) async fn decide_and_apply<'m>(
    conn: &mut PgConnection,
    shared: &Shared,
    messages: &[&'m ReceivedMessage],
    basis: Basis,
) -> Result<Option<Written<'m>>, Failure> {
    let assumed_new = matches!(basis, Basis::AssumedNew);
    let mut stored = match basis {
        Basis::Read(stored) => stored,
        Basis::AssumedNew => StoredGroups::new(),
    };
    let mut open_by_source = open_groups_by_source(&mut *conn, messages, &stored).await?;
    let mut quota = BatchQuota::read(&mut *conn, shared, messages).await?;
    let mut decided: Vec<Result<Decided<'m>, StoreError>> = Vec::with_capacity(messages.len());
    for m in messages {
        let key = (
            m.partner.clone(),
            m.request.key().group_id.as_str().to_owned(),
        );
        let outcome = match stored.remove(&key) {
            Some(Err(e)) => Err(e),
            Some(Ok(group)) => decide(shared, m, Some(&group), 0, quota.room(shared, m)),
            None => {
                let open = open_by_source.get(m.source.as_str()).copied().unwrap_or(0);
                let d = decide(shared, m, None, open, quota.room(shared, m));
                if let Ok(d) = &d {
                    let opens = d.plan.group.as_ref().is_some_and(|w| {
                        w.state.status.as_str() == "open" && starts_counted_group(&m.request)
                    });
                    if opens {
                        *open_by_source.entry(m.source.as_str()).or_default() += 1;
                    }
                }
                d
            }
        };
        if let Ok(d) = &outcome {
            quota.decided(d);
        }
        decided.push(outcome);
    }

    let stores_every_group = || {
        decided
            .iter()
            .all(|d| d.as_ref().is_ok_and(|d| d.plan.group.is_some()))
    };
    if assumed_new && !stores_every_group() {
        return Ok(None);
    }

    let mut announcement = Announcement::default();
    let mut rows = Rows::default();
    for d in decided.iter().flatten() {
        rows.add(d, &mut announcement);
    }
    announcement.wakes.appended |= rows.appended > 0;
    #[cfg(feature = "test-hooks")]
    if shared.hooks.commit_fails() {
        return Err(StoreError::Injected.into());
    }
    if !rows.apply(conn, &announcement).await? {
        return Ok(None);
    }
    Ok(Some(Written {
        decided,
        announcement,
        quota,
    }))
}

/// The storage quota (D13) as one batch decides it: the gateway's view of its sources, read
/// again where stale, plus what the batch's own decisions store.
struct BatchQuota {
    changes: UsageChanges,
    /// Messages stored per source, with the rate they count against.
    counted: HashMap<String, (u64, u64)>,
    /// The decision time of the last message counted.
    at: Option<DateTime<Utc>>,
}

impl BatchQuota {
    /// Reads the stored bytes of the batch's sources that this gateway has not read within
    /// the last second.
    async fn read(
        conn: &mut PgConnection,
        shared: &Shared,
        messages: &[&ReceivedMessage],
    ) -> Result<BatchQuota, Failure> {
        let now = Instant::now();
        let counted = messages
            .iter()
            .filter(|m| m.source_quota().max_stored_bytes > 0)
            .map(|m| m.source.as_str());
        let stale: Vec<String> = {
            let view = shared.quota.lock().unwrap_or_else(|p| p.into_inner());
            view.stale(counted, now)
                .into_iter()
                .map(str::to_owned)
                .collect()
        };
        if !stale.is_empty() {
            let rows: Vec<(String, i64)> =
                sqlx::query_as("SELECT source, bytes FROM source_usage WHERE source = ANY($1)")
                    .bind(&stale)
                    .fetch_all(conn)
                    .await?;
            let mut view = shared.quota.lock().unwrap_or_else(|p| p.into_inner());
            for source in &stale {
                let bytes = rows
                    .iter()
                    .find(|(s, _)| s == source)
                    .map_or(0, |(_, b)| u64::try_from(*b).unwrap_or(0));
                view.read(source, bytes, now);
            }
        }
        Ok(BatchQuota {
            changes: UsageChanges::default(),
            counted: HashMap::new(),
            at: None,
        })
    }

    /// What `m`'s source may still store, as of this point of the batch.
    fn room(&self, shared: &Shared, m: &ReceivedMessage) -> SourceRoom {
        let quota = m.source_quota();
        let view = shared.quota.lock().unwrap_or_else(|p| p.into_inner());
        let stored = i64::try_from(view.stored(&m.source)).unwrap_or(i64::MAX);
        let pending = self.counted.get(&m.source).map_or(0, |(_, n)| *n);
        SourceRoom {
            quota,
            stored_bytes: source_usage::after(stored, self.changes.of(&m.source)),
            rate_allows: view.rates.allows(
                &m.source,
                quota.max_messages_per_second,
                m.now,
                pending,
            ),
        }
    }

    fn decided(&mut self, d: &Decided<'_>) {
        let m = d.message;
        if d.plan.action == Action::Drop {
            return;
        }
        if d.stores() {
            self.changes.stored(&m.source, m.payload.len() as u64);
        }
        let counted = self
            .counted
            .entry(m.source.clone())
            .or_insert((m.quota.max_messages_per_second, 0));
        counted.1 += 1;
        self.at = Some(self.at.map_or(m.now, |at| at.max(m.now)));
    }

    fn committed(self, shared: &Shared) {
        let Some(at) = self.at else { return };
        let mut view = shared.quota.lock().unwrap_or_else(|p| p.into_inner());
        view.committed(&self.changes, &self.counted, at);
    }
}
