//! A partner's business response kept with our message (`OutboundStore::keep_response`): one
//! row of `out_responses` and its `response` event, written on the writer's connection; read
//! back on the pool.

use rusqlite::params;
use sqlx::sqlite::SqlitePool;

use super::write::insert_event;
use crate::store::StoreError;
use crate::store::outbound::{KeptResponse, RESPONSE_EVENT, RESPONSE_ROW_SQL, ResponseRow};
use crate::store::time::millis;

/// Keeps `r` with message `id` unless one is kept already (or there is no such message);
/// logs its event when it was kept now.
pub(super) fn keep(
    conn: &rusqlite::Connection,
    id: &str,
    r: &KeptResponse,
) -> Result<bool, StoreError> {
    let info = &r.info;
    let size = i64::try_from(info.size).unwrap_or(i64::MAX);
    let added = conn
        .prepare_cached(
            "INSERT INTO out_responses \
             (message_id, content_type, body, size, soap_fault, received_at) \
             SELECT ?1, ?2, ?3, ?4, ?5, ?6 WHERE EXISTS (SELECT 1 FROM out_messages WHERE id = ?1) \
             ON CONFLICT (message_id) DO NOTHING",
        )?
        .execute(params![
            id,
            info.content_type,
            r.body,
            size,
            info.soap_fault,
            millis(info.received_at)
        ])?;
    if added == 0 {
        return Ok(false);
    }
    let detail = info.event_detail();
    insert_event(conn, id, RESPONSE_EVENT, Some(&detail), info.received_at)?;
    Ok(true)
}

pub(super) async fn out_response(
    pool: &SqlitePool,
    id: &str,
) -> Result<Option<KeptResponse>, StoreError> {
    let row: Option<ResponseRow> = sqlx::query_as(RESPONSE_ROW_SQL)
        .bind(id)
        .fetch_optional(pool)
        .await?;
    Ok(row.map(KeptResponse::from_row))
}
