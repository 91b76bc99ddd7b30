//! The writer's batch decision: every message of a batch decided from its group (as read, or
//! assumed new), the rows gathered and written, and the answers once committed. It owns no
//! connection or transaction (the writer's loop does) and must never import the loop.

use sqlx::PgConnection;

use super::decided::{Decided, decide};
use super::reads::{StoredGroups, open_groups_by_source};
use super::rows::Rows;
use crate::rmp::receiver::starts_counted_group;
use crate::store::StoreError;
use crate::store::postgres::failure::Failure;
use crate::store::postgres::notify::Announcement;
use crate::store::postgres::shared::Shared;
use crate::store::received::{Received, ReceivedMessage};

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
}

impl Written<'_> {
    /// After the commit: wakes this gateway's own waiters (the other gateways hear of it by
    /// the NOTIFY the write sent) and answers each message.
    pub(super) fn committed(self, shared: &Shared) -> Vec<Result<Received, StoreError>> {
        self.announcement.wake_here(shared);
        shared.health.committed(true);
        self.decided
            .into_iter()
            .map(|d| {
                d.map(|d| Received {
                    verdict: d.plan.verdict,
                    action: d.plan.action,
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
    let mut decided: Vec<Result<Decided<'m>, StoreError>> = Vec::with_capacity(messages.len());
    for m in messages {
        let key = (
            m.partner.clone(),
            m.request.key().group_id.as_str().to_owned(),
        );
        let outcome = match stored.remove(&key) {
            Some(Err(e)) => Err(e),
            Some(Ok(group)) => decide(shared, m, Some(&group), 0),
            None => {
                let open = open_by_source.get(m.source.as_str()).copied().unwrap_or(0);
                let d = decide(shared, m, None, open);
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
    }))
}
