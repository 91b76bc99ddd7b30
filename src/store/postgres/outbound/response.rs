//! A partner's business response kept with our message (`OutboundStore::keep_response`): one
//! row of `out_responses` and its `response` event in one transaction; read back on the pool.

use sqlx::postgres::PgPool;

use super::write::Events;
use super::{Doing, Failure};
use crate::store::StoreError;
use crate::store::outbound::{KeptResponse, RESPONSE_EVENT, RESPONSE_ROW_SQL, ResponseRow};
use crate::store::postgres::{Announcement, PostgresStore};
use crate::store::time::millis;

/// Keeps `r` with message `id` unless one is kept already (or there is no such message);
/// logs its event when it was kept now.
pub(super) async fn keep(
    store: &PostgresStore,
    id: &str,
    r: &KeptResponse,
) -> Result<bool, Failure> {
    let info = &r.info;
    let mut tx = store.begin().await?;
    let added = sqlx::query(
        "INSERT INTO out_responses (message_id, content_type, body, size, soap_fault, received_at) \
         SELECT $1, $2, $3, $4, $5, $6 WHERE EXISTS (SELECT 1 FROM out_messages WHERE id = $1) \
         ON CONFLICT (message_id) DO NOTHING",
    )
    .bind(id)
    .bind(&info.content_type)
    .bind(&r.body)
    .bind(i64::try_from(info.size).unwrap_or(i64::MAX))
    .bind(info.soap_fault)
    .bind(millis(info.received_at))
    .execute(&mut *tx)
    .await
    .doing("keeping a business response")?
    .rows_affected();
    if added == 0 {
        return Ok(false);
    }
    let mut events = Events::default();
    events.push(
        id,
        RESPONSE_EVENT,
        Some(&info.event_detail()),
        info.received_at,
    );
    events.write(&mut tx).await?;
    store.commit(tx, Announcement::default()).await?;
    Ok(true)
}

pub(super) async fn out_response(
    pool: &PgPool,
    id: &str,
) -> Result<Option<KeptResponse>, StoreError> {
    let row: Option<ResponseRow> = sqlx::query_as(RESPONSE_ROW_SQL)
        .bind(id)
        .fetch_optional(pool)
        .await
        .doing("reading a business response")?;
    Ok(row.map(KeptResponse::from_row))
}
