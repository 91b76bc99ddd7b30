//! What a polling sender learns (PostgreSQL): faults recorded for its messages, and the
//! answer to a poll from the stored groups and those faults (`rmp::replies`). It writes only
//! the fault rows and must never import the trait implementation.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use crate::rmp::group::slot;
use crate::rmp::replies::{Asked, RecordedFault, answer_poll};
use crate::store::StoreError;
use crate::store::postgres::PostgresStore;
use crate::store::postgres::failure::Failure;
use crate::store::postgres::group_state::decode;
use crate::store::time::millis;
use crate::wsr::{FaultCode, GroupId, MessageKey, RefToMessageIds, Response};

async fn insert_fault(
    conn: &mut PgConnection,
    partner: &str,
    group_id: &GroupId,
    number: Option<u64>,
    code: FaultCode,
    keep_until: DateTime<Utc>,
) -> Result<(), Failure> {
    sqlx::query(
        "INSERT INTO message_faults (partner, group_id, singleton, number, fault, expiry) \
         VALUES ($1, $2, $3, $4, $5, $6) \
         ON CONFLICT (partner, group_id, singleton, number) DO NOTHING",
    )
    .bind(partner)
    .bind(group_id.as_str())
    .bind(number.is_none())
    .bind(slot(number) as i64)
    .bind(code.local_name())
    .bind(millis(keep_until))
    .execute(conn)
    .await?;
    Ok(())
}

/// Records the fault a sender learns by polling for its message (`ReceiverStore::record_fault`).
pub(super) async fn record_fault(
    store: &PostgresStore,
    partner: &str,
    key: &MessageKey,
    code: FaultCode,
    expiry: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let keep_until = crate::rmp::receive_plan::fault_notice_until(expiry, now);
    let mut conn = store.pool.acquire().await?;
    insert_fault(
        &mut conn,
        partner,
        &key.group_id,
        key.number,
        code,
        keep_until,
    )
    .await?;
    Ok(())
}

/// The answer to `partner`'s poll (`ReceiverStore::poll_answer`). Every receive commits
/// before it answers, so whatever a sender was told before it polled is in what this reads.
pub(super) async fn answer(
    store: &PostgresStore,
    partner: &str,
    refs: &[RefToMessageIds],
) -> Result<Option<Response>, StoreError> {
    let asked = Asked::new(refs);
    let ids: Vec<&str> = asked.group_ids().map(GroupId::as_str).collect();
    let mut states = HashMap::new();
    let rows =
        sqlx::query("SELECT state_bin FROM groups WHERE partner = $1 AND group_id = ANY($2)")
            .bind(partner)
            .bind(&ids)
            .fetch_all(&store.pool)
            .await?;
    for row in rows {
        let state = decode(row.try_get::<&[u8], _>(0)?)?;
        states.insert(state.group_id.clone(), state);
    }
    let mut recorded: HashMap<GroupId, Vec<RecordedFault>> = HashMap::new();
    let rows: Vec<(String, bool, i64, String)> = sqlx::query_as(
        "SELECT group_id, singleton, number, fault FROM message_faults \
         WHERE partner = $1 AND group_id = ANY($2)",
    )
    .bind(partner)
    .bind(&ids)
    .fetch_all(&store.pool)
    .await?;
    for (group_id, singleton, number, fault) in rows {
        let Ok(group_id) = GroupId::parse(&group_id) else {
            continue;
        };
        let Some(code) = FaultCode::from_local_name(&fault) else {
            continue;
        };
        let number = (!singleton).then_some(number as u64);
        recorded
            .entry(group_id)
            .or_default()
            .push(RecordedFault { number, code });
    }
    let replies = answer_poll(
        &asked,
        |g| states.get(g),
        |g| recorded.get(g).map_or(&[][..], Vec::as_slice),
    );
    Ok(replies.into_response())
}
