//! A partner's business response kept with our message (`OutboundStore::keep_response`): one
//! row of `out_responses` and its `response` event in one transaction; read back on the pool.

use sqlx::Row;
use sqlx::postgres::PgPool;

use super::write::Events;
use super::{Doing, Failure};
use crate::store::StoreError;
use crate::store::outbound::{KeptResponse, RESPONSE_EVENT, ResponseInfo};
use crate::store::postgres::{Announcement, PostgresStore};
use crate::store::time::{from_millis, millis};

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
    let row = sqlx::query(
        "SELECT content_type, size, soap_fault, received_at, body FROM out_responses \
         WHERE message_id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await
    .doing("reading a business response")?;
    let Some(r) = row else {
        return Ok(None);
    };
    let column = |e: sqlx::Error| StoreError::Corrupt(format!("business response row: {e}"));
    Ok(Some(KeptResponse {
        info: ResponseInfo {
            content_type: r.try_get(0).map_err(column)?,
            size: r
                .try_get::<i64, _>(1)
                .map_err(column)?
                .try_into()
                .unwrap_or(0),
            soap_fault: r.try_get(2).map_err(column)?,
            received_at: from_millis(r.try_get(3).map_err(column)?),
        },
        body: r.try_get(4).map_err(column)?,
    }))
}
