//! `ExchangeStore` for PostgreSQL: every statement on the pool, one row each; the row's
//! primary key makes `begin_call` decide between gateways.

use chrono::{DateTime, Utc};

use super::PostgresStore;
use crate::store::error::StoreError;
use crate::store::exchange::{
    Attempt, Began, BeginCall, CachedAnswer, ExchangeStore, NewCall, slot_of,
};
use crate::store::future::{Committed, StoreFuture};
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

/// `q` with an answer's columns bound next: status, content type, body, size.
fn with_answer<'q>(q: PgQuery<'q>, answer: &'q CachedAnswer) -> PgQuery<'q> {
    q.bind(i64::from(answer.status))
        .bind(&answer.content_type)
        .bind(answer.body.as_ref())
        .bind(answer.body.len() as i64)
}

/// Adds the bytes of the rows `counted` (a CTE returning `source, size`) to their sources'
/// running totals.
const COUNT_AGAINST_QUOTA: &str = "INSERT INTO answer_quota (source, bytes) \
     SELECT source, size FROM counted \
     ON CONFLICT (source) DO UPDATE SET bytes = answer_quota.bytes + EXCLUDED.bytes";

impl ExchangeStore for PostgresStore {
    crate::store::exchange::exchange_reads!();

    fn begin_call<'a>(
        &'a self,
        call: NewCall<'a>,
        how: BeginCall,
    ) -> StoreFuture<'a, Result<(Began, Committed), StoreError>> {
        let attempt = Attempt::fresh();
        // Every statement is committed before it answers.
        let began = async move {
            let quota = match how {
                BeginCall::Fresh { quota } => quota,
                BeginCall::TakeOver { started_before } => {
                    let sql = format!(
                        "UPDATE exchanges SET started_at = $4, attempt = $5 WHERE {WHERE_KEY} \
                         AND state = 'calling' AND started_at < $6"
                    );
                    let taken = keyed(
                        sqlx::query(sqlx::AssertSqlSafe(sql)),
                        call.partner,
                        call.key,
                    )
                    .bind(millis(call.now))
                    .bind(attempt.0)
                    .bind(millis(started_before))
                    .execute(&self.pool)
                    .await?
                    .rows_affected();
                    return Ok::<Began, StoreError>(match taken {
                        1 => Began::Call(attempt),
                        _ => Began::Exists,
                    });
                }
            };
            let quota = i64::try_from(quota).unwrap_or(i64::MAX);
            let inserted = new_row(
                sqlx::query(
                    "INSERT INTO exchanges (partner, group_id, number, channel, source, state, \
                     started_at, keep_until, attempt) SELECT $1, $2, $3, $4, $5, 'calling', $6, \
                     $7, $8 WHERE COALESCE((SELECT bytes FROM answer_quota WHERE source = $5), \
                     0) < $9 ON CONFLICT DO NOTHING",
                ),
                &call,
            )
            .bind(attempt.0)
            .bind(quota)
            .execute(&self.pool)
            .await?
            .rows_affected();
            if inserted == 1 {
                return Ok(Began::Call(attempt));
            }
            let sql = format!(
                "SELECT EXISTS (SELECT 1 FROM exchanges WHERE {WHERE_KEY}), \
                 COALESCE((SELECT bytes FROM answer_quota WHERE source = $4), 0)"
            );
            let (exists, held): (bool, i64) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(call.partner)
                .bind(call.key.group_id.as_str())
                .bind(slot_of(call.key))
                .bind(call.source)
                .fetch_one(&self.pool)
                .await?;
            Ok(match exists {
                true => Began::Exists,
                false => Began::OverQuota {
                    held: held.max(0) as u64,
                },
            })
        };
        Box::pin(async move { Ok((began.await?, Committed::already())) })
    }

    fn call_answered<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
        attempt: Attempt,
        answer: &'a CachedAnswer,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let sql = format!(
                "WITH counted AS (UPDATE exchanges SET state = 'answered', status = $5, \
                 content_type = $6, body = $7, size = $8 WHERE {WHERE_KEY} \
                 AND state = 'calling' AND attempt = $4 RETURNING source, size) \
                 {COUNT_AGAINST_QUOTA}"
            );
            let q = keyed(sqlx::query(sqlx::AssertSqlSafe(sql)), partner, key).bind(attempt.0);
            let answered = with_answer(q, answer)
                .execute(&self.pool)
                .await?
                .rows_affected();
            Ok(answered == 1)
        })
    }

    fn answer_request<'a>(
        &'a self,
        call: NewCall<'a>,
        answer: &'a CachedAnswer,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let sql = format!(
                "WITH counted AS (INSERT INTO exchanges (partner, group_id, number, channel, \
                 source, state, started_at, keep_until, status, content_type, body, size) \
                 VALUES ($1, $2, $3, $4, $5, 'answered', $6, $7, $8, $9, $10, $11) \
                 ON CONFLICT DO NOTHING RETURNING source, size) {COUNT_AGAINST_QUOTA}"
            );
            let inserted = with_answer(
                new_row(sqlx::query(sqlx::AssertSqlSafe(sql)), &call),
                answer,
            )
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
        attempt: Attempt,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let sql = format!(
                "DELETE FROM exchanges WHERE {WHERE_KEY} AND state = 'calling' AND attempt = $4"
            );
            keyed(sqlx::query(sqlx::AssertSqlSafe(sql)), partner, key)
                .bind(attempt.0)
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }

    fn call_unknown<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
        attempt: Attempt,
        in_doubt: bool,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let change = match in_doubt {
                true => "state = 'in_doubt'",
                false => "started_at = 0",
            };
            let sql = format!(
                "UPDATE exchanges SET {change} WHERE {WHERE_KEY} AND state = 'calling' \
                 AND attempt = $4"
            );
            keyed(sqlx::query(sqlx::AssertSqlSafe(sql)), partner, key)
                .bind(attempt.0)
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
            // Data-modifying CTEs run to completion whether or not the final SELECT reads them.
            let purged: i64 = sqlx::query_scalar(
                "WITH gone AS (DELETE FROM exchanges WHERE keep_until < $1 \
                 RETURNING source, size), \
                 freed AS (SELECT source, SUM(size) AS bytes FROM gone GROUP BY source), \
                 eased AS (UPDATE answer_quota q SET bytes = q.bytes - freed.bytes \
                 FROM freed WHERE q.source = freed.source RETURNING 1) \
                 SELECT count(*) FROM gone",
            )
            .bind(millis(now))
            .fetch_one(&self.pool)
            .await?;
            // Re-checked under the row's lock: a total an answer raised meanwhile stays.
            sqlx::query("DELETE FROM answer_quota WHERE bytes <= 0")
                .execute(&self.pool)
                .await?;
            Ok(purged.max(0) as u64)
        })
    }
}
