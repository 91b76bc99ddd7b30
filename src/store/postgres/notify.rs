//! Wake-ups across gateways: a commit says what it made possible with NOTIFY on one channel,
//! inside its own transaction (PostgreSQL delivers it at the commit, or never); every gateway
//! LISTENs and wakes its own waiters. A lost connection may have lost notifications, so after
//! reconnecting a gateway wakes everything once and checks its held requests against the
//! stored groups. It must never import the handle (`PostgresStore`) nor the writer: they
//! import it, for `Announcement`.

use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use sqlx::{PgConnection, Row};

use super::group_state::decode;
use super::shared::Shared;
use crate::store::error::StoreError;
use crate::store::wakes::Wakes;
use crate::wsr::{GroupId, MessageKey};

/// The one channel every gateway of a database listens on.
const CHANNEL: &str = "wsr_gateway";

/// Longest payload we send; PostgreSQL takes up to 8000 bytes.
const MAX_PAYLOAD: usize = 7_900;

/// Between the fields of a delivered key (never in a partner name or a group id: both are
/// XML text, where U+001F cannot appear).
const SEPARATOR: char = '\u{1f}';

/// What one commit made possible, to be announced to every gateway of the database.
#[derive(Debug, Default)]
pub(in crate::store) struct Announcement {
    pub wakes: Wakes,
    /// Buffered messages delivered, by (partner, key): their held requests may answer.
    pub delivered: Vec<(String, MessageKey)>,
    /// The earliest group deadline written (Unix ms).
    pub earliest_deadline: Option<i64>,
}

impl Announcement {
    pub(in crate::store) fn wakes(wakes: Wakes) -> Announcement {
        Announcement {
            wakes,
            ..Announcement::default()
        }
    }

    pub(in crate::store) fn deadline(&mut self, d: Option<i64>) {
        if let Some(d) = d {
            self.earliest_deadline = Some(self.earliest_deadline.map_or(d, |e| e.min(d)));
        }
    }

    fn payloads(&self) -> Vec<String> {
        let mut out = Vec::new();
        let w = self.wakes;
        if w != Wakes::NONE {
            let mut flags = String::from("w");
            for (set, c) in [
                (w.appended, 'a'),
                (w.deliveries, 'd'),
                (w.outbound, 'o'),
                (w.callbacks, 'c'),
            ] {
                if set {
                    flags.push(c);
                }
            }
            out.push(flags);
        }
        if let Some(d) = self.earliest_deadline {
            out.push(format!("t{d}"));
        }
        for (partner, key) in &self.delivered {
            let number = key.number.map(|n| n.to_string()).unwrap_or_default();
            let p = format!(
                "k{partner}{SEPARATOR}{}{SEPARATOR}{number}",
                key.group_id.as_str()
            );
            // Too long to send: every gateway checks its held requests against the groups.
            out.push(if p.len() > MAX_PAYLOAD { "r".into() } else { p });
        }
        out.sort();
        out.dedup();
        out
    }

    /// This gateway's own waiters, told at once after the commit (the NOTIFY comes back
    /// later, and waking twice is harmless).
    pub(in crate::store) fn wake_here(&self, shared: &Shared) {
        shared.wake(self.wakes);
        for (partner, key) in &self.delivered {
            shared.delivered(partner, key);
        }
        if let Some(d) = self.earliest_deadline {
            shared.deadline_written(d);
        }
    }
}

/// The channel and payloads that announce `announcement`, for a write that sends them with
/// its own statement (the group-commit writer's `wsr_apply_received`).
pub(super) fn notifications(announcement: &Announcement) -> (&'static str, Vec<String>) {
    (CHANNEL, announcement.payloads())
}

/// Sends the announcement inside the caller's transaction: it reaches the other gateways when
/// (and only if) that transaction commits.
pub(in crate::store) async fn announce(
    conn: &mut PgConnection,
    announcement: &Announcement,
) -> Result<(), StoreError> {
    let (channel, payloads) = notifications(announcement);
    if payloads.is_empty() {
        return Ok(());
    }
    sqlx::query("SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p")
        .bind(channel)
        .bind(&payloads)
        .execute(conn)
        .await?;
    Ok(())
}

/// Starts this gateway's listener; it stops when the last handle is dropped.
pub(super) async fn start(pool: &PgPool, shared: &Arc<Shared>) -> Result<(), StoreError> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    let task = tokio::spawn(listen(listener, pool.clone(), Arc::downgrade(shared)));
    shared.listener.add(task);
    Ok(())
}

async fn listen(mut listener: PgListener, pool: PgPool, shared: Weak<Shared>) {
    loop {
        let received = listener.try_recv().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        match received {
            Ok(Some(n)) => {
                if heard(&shared, n.payload()) {
                    recheck(&pool, shared).await;
                }
            }
            // The connection was lost (and is re-established on the next call): whatever was
            // announced meanwhile is lost, so act as if everything had been.
            Ok(None) => {
                tracing::warn!("lost the database's notifications; reconnecting");
                shared.wake(Wakes {
                    appended: true,
                    deliveries: true,
                    outbound: true,
                    callbacks: true,
                });
                shared.deadlines_changed.notify_one();
                recheck(&pool, shared).await;
            }
            Err(sqlx::Error::PoolClosed) => return,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for the database's notifications; retrying");
                drop(shared);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Acts on one payload; `true` when the held requests must be checked against the groups.
fn heard(shared: &Shared, payload: &str) -> bool {
    let mut chars = payload.chars();
    match chars.next() {
        Some('w') => {
            let flags = chars.as_str();
            shared.wake(Wakes {
                appended: flags.contains('a'),
                deliveries: flags.contains('d'),
                outbound: flags.contains('o'),
                callbacks: flags.contains('c'),
            });
            false
        }
        Some('t') => {
            if let Ok(d) = chars.as_str().parse::<i64>() {
                shared.deadline_written(d);
            }
            false
        }
        Some('k') => match delivered_key(chars.as_str()) {
            Some((partner, key)) => {
                shared.delivered(partner, &key);
                false
            }
            None => true,
        },
        Some('r') => true,
        _ => {
            tracing::debug!(payload, "unknown notification ignored");
            false
        }
    }
}

fn delivered_key(text: &str) -> Option<(&str, MessageKey)> {
    let mut fields = text.split(SEPARATOR);
    let partner = fields.next()?;
    let group_id = GroupId::parse(fields.next()?).ok()?;
    let number = match fields.next()? {
        "" => None,
        n => Some(n.parse().ok()?),
    };
    Some((partner, MessageKey { group_id, number }))
}

/// Tells each held request whose message the stored group now counts as delivered.
async fn recheck(pool: &PgPool, shared: Arc<Shared>) {
    if let Err(e) = recheck_waiters(pool, &shared).await {
        tracing::warn!(error = %e, "cannot check held requests against the stored groups");
    }
}

/// Tells each held request whose message its stored group now counts as delivered.
async fn recheck_waiters(pool: &PgPool, shared: &Shared) -> Result<(), StoreError> {
    for (partner, key) in shared.watched() {
        let Some(number) = key.number else { continue };
        let row = sqlx::query("SELECT state_bin FROM groups WHERE partner = $1 AND group_id = $2")
            .bind(&partner)
            .bind(key.group_id.as_str())
            .fetch_optional(pool)
            .await?;
        if let Some(row) = row {
            let state = decode(row.try_get::<&[u8], _>(0)?)?;
            if state.delivered.contains(number) {
                shared.delivered(&partner, &key);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announcement_reads_back_as_the_same_wakes_and_keys() {
        let key = MessageKey {
            group_id: GroupId::parse("mid:g@x").expect("id"),
            number: Some(7),
        };
        let a = Announcement {
            wakes: Wakes {
                appended: true,
                callbacks: true,
                ..Wakes::NONE
            },
            delivered: vec![("acme".into(), key.clone())],
            earliest_deadline: Some(42),
        };
        let payloads = a.payloads();
        assert_eq!(payloads.len(), 3, "{payloads:?}");
        assert!(payloads.contains(&"wac".to_owned()));
        assert!(payloads.contains(&"t42".to_owned()));
        let k = payloads.iter().find(|p| p.starts_with('k')).expect("key");
        assert_eq!(delivered_key(&k[1..]), Some(("acme", key)));
    }

    #[test]
    fn a_key_too_long_to_send_asks_every_gateway_to_check_its_groups() {
        // A group id is at most 1024 bytes, so only a partner name past any sane length
        // could make a key this long; the branch exists so that one never fails a commit.
        let a = Announcement {
            delivered: vec![(
                "p".repeat(MAX_PAYLOAD),
                MessageKey {
                    group_id: GroupId::parse("mid:g@x").expect("id"),
                    number: Some(1),
                },
            )],
            ..Announcement::default()
        };
        assert_eq!(a.payloads(), vec!["r".to_owned()]);
        assert!(delivered_key("acme\u{1f}not a group").is_none());
    }
}
