//! The writer's reads and locks of a batch's groups: the stored groups by key, the open
//! groups per source, the groups' locks in hash order. A leaf of the writer: it decides
//! nothing and must never import the files that do.

use std::collections::{HashMap, HashSet};

use sqlx::{PgConnection, Row};

use crate::rmp::group::GroupState;
use crate::rmp::receiver::starts_counted_group;
use crate::store::StoreError;
use crate::store::postgres::failure::Failure;
use crate::store::postgres::group_state::decode;
use crate::store::received::ReceivedMessage;

/// The (partner, group id) of each message of a batch, in its order.
pub(super) struct BatchKeys<'m> {
    pub(super) partners: Vec<&'m str>,
    pub(super) group_ids: Vec<String>,
}

impl<'m> BatchKeys<'m> {
    pub(super) fn of(messages: &[&'m ReceivedMessage]) -> BatchKeys<'m> {
        BatchKeys {
            partners: messages.iter().map(|m| m.partner.as_str()).collect(),
            group_ids: messages
                .iter()
                .map(|m| m.request.key().group_id.as_str().to_owned())
                .collect(),
        }
    }
}

// Every statement of the writer joins the batch's arrays to a table by key, and a prepared
// statement's generic plan, made once per connection while a table was small, would keep
// scanning the whole table after it has grown (measured: the read of the batch's groups fell
// from 5,400 to 2,900 msgs/s within 70,000 groups). The writer's connection therefore forbids
// the plans that scan (`KEYED_PLANS_ONLY`): what is left is an index lookup per key, right at
// any size, so its statements are prepared once and planned once, as are those PL/pgSQL
// caches for `wsr_apply_received` (planning each batch's statements anew was measured at a
// fifth of its backend's time).

/// Locks every group of the batch until the transaction ends, in hash order: PostgreSQL
/// evaluates a volatile function of the SELECT list after the ORDER BY, so the locks are taken
/// in that order and two batches sharing groups cannot each hold one the other waits for.
/// `wsr_apply_received` takes the same locks, of the groups that were stored, in the same order.
pub(super) async fn lock_groups(
    conn: &mut PgConnection,
    keys: &BatchKeys<'_>,
) -> Result<(), Failure> {
    sqlx::query(
        "SELECT pg_advisory_xact_lock(k) FROM (SELECT DISTINCT \
         hashtextextended(p || chr(31) || g, 0) AS k FROM unnest($1::text[], $2::text[]) \
         AS t(p, g)) AS keys ORDER BY k",
    )
    .bind(&keys.partners)
    .bind(&keys.group_ids)
    .execute(conn)
    .await?;
    Ok(())
}

/// A group as stored: its row, the row's version (`xmin`: the transaction that last wrote
/// it, renewed by every write) and its state.
pub(super) struct StoredGroup {
    pub(super) id: i64,
    pub(super) version: i64,
    pub(super) state: GroupState,
}

pub(super) type StoredGroups = HashMap<(String, String), Result<StoredGroup, StoreError>>;

/// The stored groups of the batch; an unreadable one fails only its message.
pub(super) async fn read_groups(
    conn: &mut PgConnection,
    keys: &BatchKeys<'_>,
) -> Result<StoredGroups, Failure> {
    let rows = sqlx::query(
        "SELECT g.partner, g.group_id, g.id, g.xmin::text::bigint, g.state_bin FROM groups g \
         JOIN unnest($1::text[], $2::text[]) AS t(p, gid) \
         ON g.partner = t.p AND g.group_id = t.gid",
    )
    .bind(&keys.partners)
    .bind(&keys.group_ids)
    .fetch_all(conn)
    .await?;
    let mut stored = HashMap::with_capacity(rows.len());
    for r in rows {
        let key: (String, String) = (r.try_get(0)?, r.try_get(1)?);
        let state = decode(r.try_get::<&[u8], _>(4)?).map_err(|e| {
            tracing::error!(reason = %e, "message refused: its group's stored state is unreadable");
            e
        });
        let (id, version) = (r.try_get(2)?, r.try_get(3)?);
        stored.insert(key, state.map(|state| StoredGroup { id, version, state }));
    }
    Ok(stored)
}

/// Open groups per source, for the sources of messages that would start a counted group.
pub(super) async fn open_groups_by_source<'m>(
    conn: &mut PgConnection,
    messages: &[&'m ReceivedMessage],
    stored: &StoredGroups,
) -> Result<HashMap<&'m str, u64>, Failure> {
    let sources: Vec<&str> = messages
        .iter()
        .filter(|m| {
            starts_counted_group(&m.request)
                && !stored.contains_key(&(
                    m.partner.clone(),
                    m.request.key().group_id.as_str().to_owned(),
                ))
        })
        .map(|m| m.source.as_str())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let mut open = HashMap::new();
    if sources.is_empty() {
        return Ok(open);
    }
    let counts: Vec<(String, i64)> = sqlx::query_as(
        "SELECT source, count(*) FROM groups WHERE status = 'open' AND source = ANY($1) \
         GROUP BY source",
    )
    .bind(&sources)
    .fetch_all(conn)
    .await?;
    for s in sources {
        let n = counts
            .iter()
            .find(|(source, _)| source == s)
            .map_or(0, |(_, n)| u64::try_from(*n).unwrap_or(0));
        open.insert(s, n);
    }
    Ok(open)
}
