//! `ExchangeStore` for PostgreSQL: every statement on the pool, one row each; the row's
//! primary key makes `begin_call` decide between gateways.

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::PostgresStore;
use crate::store::error::StoreError;
use crate::store::exchange::{
    CachedAnswer, Exchange, ExchangeState, ExchangeStore, NewCall, slot_of,
};
use crate::store::future::StoreFuture;
use crate::store::time::{from_millis, millis};
use crate::wsr::{GroupId, MessageKey};

const COLUMNS: &str = "partner, group_id, number, channel, state, started_at, status, \
                       content_type, body";

fn exchange_of(r: &sqlx::postgres::PgRow) -> Result<Exchange, StoreError> {
    let state: String = r.try_get("state")?;
    let state = ExchangeState::parse(&state)
        .ok_or_else(|| StoreError::Corrupt(format!("exchange state {state:?}")))?;
    let group_id: String = r.try_get("group_id")?;
    let group_id = GroupId::parse(&group_id).map_err(StoreError::Corrupt)?;
    let body: Option<Vec<u8>> = r.try_get("body")?;
    let status: i32 = r.try_get("status")?;
    Ok(Exchange {
        partner: r.try_get("partner")?,
        key: MessageKey {
            group_id,
            number: Some(r.try_get::<i64, _>("number")? as u64),
        },
        channel: r.try_get("channel")?,
        state,
        started_at: from_millis(r.try_get("started_at")?),
        answer: match (state, body) {
            (ExchangeState::Answered, Some(body)) => Some(CachedAnswer {
                status: u16::try_from(status).unwrap_or(500),
                content_type: r.try_get("content_type")?,
                body: body.into(),
            }),
            _ => None,
        },
    })
}

const WHERE_KEY: &str = "partner = $1 AND group_id = $2 AND number = $3";

impl ExchangeStore for PostgresStore {
    fn exchange<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Option<Exchange>, StoreError>> {
        Box::pin(async move {
            let sql =
                format!("SELECT {COLUMNS} FROM exchanges WHERE {WHERE_KEY} AND keep_until >= $4");
            let row = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(partner)
                .bind(key.group_id.as_str())
                .bind(slot_of(key))
                .bind(millis(now))
                .fetch_optional(&self.pool)
                .await?;
            row.as_ref().map(exchange_of).transpose()
        })
    }

    fn begin_call<'a>(
        &'a self,
        call: NewCall<'a>,
        take_over_before: Option<DateTime<Utc>>,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let inserted = sqlx::query(
                "INSERT INTO exchanges (partner, group_id, number, channel, source, state, \
                 started_at, keep_until) VALUES ($1, $2, $3, $4, $5, 'calling', $6, $7) \
                 ON CONFLICT DO NOTHING",
            )
            .bind(call.partner)
            .bind(call.key.group_id.as_str())
            .bind(slot_of(call.key))
            .bind(call.channel)
            .bind(call.source)
            .bind(millis(call.now))
            .bind(millis(call.keep_until))
            .execute(&self.pool)
            .await?
            .rows_affected();
            if inserted == 1 {
                return Ok(true);
            }
            let Some(before) = take_over_before else {
                return Ok(false);
            };
            let sql = format!(
                "UPDATE exchanges SET started_at = $4 WHERE {WHERE_KEY} AND state = 'calling' \
                 AND started_at < $5"
            );
            let taken = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(call.partner)
                .bind(call.key.group_id.as_str())
                .bind(slot_of(call.key))
                .bind(millis(call.now))
                .bind(millis(before))
                .execute(&self.pool)
                .await?
                .rows_affected();
            Ok(taken == 1)
        })
    }

    fn call_answered<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
        answer: &'a CachedAnswer,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let sql = format!(
                "UPDATE exchanges SET state = 'answered', status = $4, content_type = $5, \
                 body = $6, size = $7 WHERE {WHERE_KEY}"
            );
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(partner)
                .bind(key.group_id.as_str())
                .bind(slot_of(key))
                .bind(i32::from(answer.status))
                .bind(&answer.content_type)
                .bind(answer.body.as_ref())
                .bind(answer.body.len() as i64)
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }

    fn answer_request<'a>(
        &'a self,
        call: NewCall<'a>,
        answer: &'a CachedAnswer,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let inserted = sqlx::query(
                "INSERT INTO exchanges (partner, group_id, number, channel, source, state, \
                 started_at, keep_until, status, content_type, body, size) VALUES ($1, $2, $3, \
                 $4, $5, 'answered', $6, $7, $8, $9, $10, $11) ON CONFLICT DO NOTHING",
            )
            .bind(call.partner)
            .bind(call.key.group_id.as_str())
            .bind(slot_of(call.key))
            .bind(call.channel)
            .bind(call.source)
            .bind(millis(call.now))
            .bind(millis(call.keep_until))
            .bind(i32::from(answer.status))
            .bind(&answer.content_type)
            .bind(answer.body.as_ref())
            .bind(answer.body.len() as i64)
            .execute(&self.pool)
            .await?
            .rows_affected();
            Ok(inserted == 1)
        })
    }

    fn call_failed<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let sql = format!("DELETE FROM exchanges WHERE {WHERE_KEY} AND state = 'calling'");
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(partner)
                .bind(key.group_id.as_str())
                .bind(slot_of(key))
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }

    fn call_unknown<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
        in_doubt: bool,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let change = match in_doubt {
                true => "state = 'in_doubt'",
                false => "started_at = 0",
            };
            let sql =
                format!("UPDATE exchanges SET {change} WHERE {WHERE_KEY} AND state = 'calling'");
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(partner)
                .bind(key.group_id.as_str())
                .bind(slot_of(key))
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }

    fn answer_bytes_of<'a>(
        &'a self,
        source: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let bytes: Option<i64> = sqlx::query_scalar(
                "SELECT SUM(size)::BIGINT FROM exchanges WHERE source = $1 AND keep_until >= $2",
            )
            .bind(source)
            .bind(millis(now))
            .fetch_one(&self.pool)
            .await?;
            Ok(bytes.unwrap_or(0).max(0) as u64)
        })
    }

    fn exchanges_in_doubt<'a>(
        &'a self,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<Exchange>, StoreError>> {
        Box::pin(async move {
            let sql = format!(
                "SELECT {COLUMNS} FROM exchanges WHERE state = 'in_doubt' \
                 ORDER BY started_at LIMIT $1"
            );
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(limit)
                .fetch_all(&self.pool)
                .await?;
            rows.iter().map(exchange_of).collect()
        })
    }

    fn purge_exchanges<'a>(
        &'a self,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let purged = sqlx::query("DELETE FROM exchanges WHERE keep_until < $1")
                .bind(millis(now))
                .execute(&self.pool)
                .await?
                .rows_affected();
            Ok(purged)
        })
    }
}
