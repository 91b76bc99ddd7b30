//! `ExchangeStore` for PostgreSQL: every statement on the pool, one row each; the row's
//! primary key makes `begin_call` decide between gateways.

use chrono::{DateTime, Utc};

use super::PostgresStore;
use crate::store::error::StoreError;
use crate::store::exchange::{CachedAnswer, ExchangeStore, NewCall, slot_of};
use crate::store::future::StoreFuture;
use crate::store::time::millis;
use crate::wsr::MessageKey;

const WHERE_KEY: &str = "partner = $1 AND group_id = $2 AND number = $3";

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// `q` with a row's key bound as $1..$3 (`WHERE_KEY`).
fn keyed<'q>(q: PgQuery<'q>, partner: &'q str, key: &'q MessageKey) -> PgQuery<'q> {
    q.bind(partner)
        .bind(key.group_id.as_str())
        .bind(slot_of(key))
}

/// `q` with a new row's columns bound as $1..$7 (key, channel, source, start, keep until).
fn new_row<'q>(q: PgQuery<'q>, call: &NewCall<'q>) -> PgQuery<'q> {
    keyed(q, call.partner, call.key)
        .bind(call.channel)
        .bind(call.source)
        .bind(millis(call.now))
        .bind(millis(call.keep_until))
}

impl ExchangeStore for PostgresStore {
    crate::store::exchange::exchange_reads!();

    fn begin_call<'a>(
        &'a self,
        call: NewCall<'a>,
        take_over_before: Option<DateTime<Utc>>,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let inserted = new_row(
                sqlx::query(
                    "INSERT INTO exchanges (partner, group_id, number, channel, source, state, \
                 started_at, keep_until) VALUES ($1, $2, $3, $4, $5, 'calling', $6, $7) \
                 ON CONFLICT DO NOTHING",
                ),
                &call,
            )
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
            let taken = keyed(
                sqlx::query(sqlx::AssertSqlSafe(sql)),
                call.partner,
                call.key,
            )
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
            keyed(sqlx::query(sqlx::AssertSqlSafe(sql)), partner, key)
                .bind(i64::from(answer.status))
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
            let inserted = new_row(
                sqlx::query(
                    "INSERT INTO exchanges (partner, group_id, number, channel, source, state, \
                 started_at, keep_until, status, content_type, body, size) VALUES ($1, $2, $3, \
                 $4, $5, 'answered', $6, $7, $8, $9, $10, $11) ON CONFLICT DO NOTHING",
                ),
                &call,
            )
            .bind(i64::from(answer.status))
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
            keyed(sqlx::query(sqlx::AssertSqlSafe(sql)), partner, key)
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
            keyed(sqlx::query(sqlx::AssertSqlSafe(sql)), partner, key)
                .execute(&self.pool)
                .await?;
            Ok(())
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
