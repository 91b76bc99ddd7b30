//! `ExchangeStore` for SQLite: changes through the writer (`keep`), reads from the pool.

use chrono::{DateTime, Utc};
use rusqlite::{OptionalExtension as _, params};

use super::{SqliteStore, Wakes};
use crate::store::error::StoreError;
use crate::store::exchange::{
    Attempt, Began, BeginCall, CachedAnswer, ExchangeStore, NewCall, slot_of,
};
use crate::store::future::{Committed, StoreFuture};
use crate::store::time::millis;
use crate::wsr::MessageKey;

/// A new exchange row's columns, owned for the writer's thread.
type CallRow = (String, String, i64, String, String, i64, i64);

fn call_row(call: &NewCall<'_>) -> CallRow {
    (
        call.partner.to_owned(),
        call.key.group_id.as_str().to_owned(),
        slot_of(call.key),
        call.channel.to_owned(),
        call.source.to_owned(),
        millis(call.now),
        millis(call.keep_until),
    )
}

/// Adds `bytes` to `source`'s running total.
fn count_against_quota(
    conn: &rusqlite::Connection,
    source: &str,
    bytes: i64,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO answer_quota (source, bytes) VALUES (?1, ?2) \
         ON CONFLICT (source) DO UPDATE SET bytes = bytes + excluded.bytes",
    )?
    .execute(params![source, bytes])?;
    Ok(())
}

/// `attempt`'s answer kept as its request's (`call_answered`), counted against the source's
/// quota. False when the exchange is no longer that attempt's. Also run by the writer for a
/// message that carries its answer (`ReceivedMessage::answer`), in the same transaction.
pub(super) fn keep_answer(
    conn: &rusqlite::Connection,
    partner: &str,
    group_id: &str,
    number: i64,
    attempt: Attempt,
    answer: &CachedAnswer,
) -> Result<bool, StoreError> {
    let size = answer.body.len() as i64;
    let source: Option<String> = conn
        .prepare_cached(
            "UPDATE exchanges SET state = 'answered', status = ?5, content_type = ?6, \
             body = ?7, size = ?8 WHERE partner = ?1 AND group_id = ?2 AND number = ?3 \
             AND state = 'calling' AND attempt = ?4 RETURNING source",
        )?
        .query_row(
            params![
                partner,
                group_id,
                number,
                attempt.0,
                answer.status,
                answer.content_type,
                answer.body.as_ref(),
                size
            ],
            |r| r.get(0),
        )
        .optional()?;
    let Some(source) = source else {
        return Ok(false);
    };
    count_against_quota(conn, &source, size)?;
    Ok(true)
}

impl ExchangeStore for SqliteStore {
    crate::store::exchange::exchange_reads!();

    fn begin_call<'a>(
        &'a self,
        call: NewCall<'a>,
        how: BeginCall,
    ) -> StoreFuture<'a, Result<(Began, Committed), StoreError>> {
        let row = call_row(&call);
        let attempt = Attempt::fresh();
        Box::pin(async move {
            self.keep_in_order(move |conn| {
                let (partner, group_id, number, channel, source, now, keep_until) = row;
                let began = match how {
                    BeginCall::Fresh { quota } => {
                        let held: i64 = conn
                            .prepare_cached("SELECT bytes FROM answer_quota WHERE source = ?1")?
                            .query_row(params![source], |r| r.get(0))
                            .optional()?
                            .unwrap_or(0);
                        let held = held.max(0) as u64;
                        let inserted = held < quota
                            && conn
                                .prepare_cached(
                                    "INSERT INTO exchanges (partner, group_id, number, channel, \
                                     source, state, started_at, keep_until, attempt) VALUES \
                                     (?1, ?2, ?3, ?4, ?5, 'calling', ?6, ?7, ?8) \
                                     ON CONFLICT DO NOTHING",
                                )?
                                .execute(params![
                                    partner, group_id, number, channel, source, now, keep_until,
                                    attempt.0
                                ])?
                                == 1;
                        let exists = || -> Result<bool, StoreError> {
                            Ok(conn
                                .prepare_cached(
                                    "SELECT 1 FROM exchanges WHERE partner = ?1 \
                                     AND group_id = ?2 AND number = ?3",
                                )?
                                .exists(params![partner, group_id, number])?)
                        };
                        match inserted {
                            true => Began::Call(attempt),
                            false if exists()? => Began::Exists,
                            false => Began::OverQuota { held },
                        }
                    }
                    BeginCall::TakeOver { started_before } => {
                        let taken = conn
                            .prepare_cached(
                                "UPDATE exchanges SET started_at = ?4, attempt = ?5 \
                                 WHERE partner = ?1 AND group_id = ?2 AND number = ?3 \
                                 AND state = 'calling' AND started_at < ?6",
                            )?
                            .execute(params![
                                partner,
                                group_id,
                                number,
                                now,
                                attempt.0,
                                millis(started_before)
                            ])?;
                        match taken {
                            1 => Began::Call(attempt),
                            _ => Began::Exists,
                        }
                    }
                };
                Ok((began, Wakes::NONE))
            })
            .await
        })
    }

    fn call_answered<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
        attempt: Attempt,
        answer: &'a CachedAnswer,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        let (partner, group_id, number) = owned_key(partner, key);
        let answer = answer.clone();
        Box::pin(async move {
            self.keep(move |conn| {
                let kept = keep_answer(conn, &partner, &group_id, number, attempt, &answer)?;
                Ok((kept, Wakes::NONE))
            })
            .await
        })
    }

    fn answer_request<'a>(
        &'a self,
        call: NewCall<'a>,
        answer: &'a CachedAnswer,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        let row = call_row(&call);
        let answer = answer.clone();
        Box::pin(async move {
            self.keep(move |conn| {
                let (partner, group_id, number, channel, source, now, keep_until) = row;
                let size = answer.body.len() as i64;
                let inserted = conn
                    .prepare_cached(
                        "INSERT INTO exchanges (partner, group_id, number, channel, source, \
                         state, started_at, keep_until, status, content_type, body, size) \
                         VALUES (?1, ?2, ?3, ?4, ?5, 'answered', ?6, ?7, ?8, ?9, ?10, ?11) \
                         ON CONFLICT DO NOTHING",
                    )?
                    .execute(params![
                        partner,
                        group_id,
                        number,
                        channel,
                        source,
                        now,
                        keep_until,
                        answer.status,
                        answer.content_type,
                        answer.body.as_ref(),
                        size
                    ])?;
                if inserted == 1 {
                    count_against_quota(conn, &source, size)?;
                }
                Ok((inserted == 1, Wakes::NONE))
            })
            .await
        })
    }

    fn call_failed<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
        attempt: Attempt,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        let (partner, group_id, number) = owned_key(partner, key);
        Box::pin(async move {
            self.keep(move |conn| {
                conn.prepare_cached(
                    "DELETE FROM exchanges WHERE partner = ?1 AND group_id = ?2 \
                     AND number = ?3 AND state = 'calling' AND attempt = ?4",
                )?
                .execute(params![partner, group_id, number, attempt.0])?;
                Ok(((), Wakes::NONE))
            })
            .await
        })
    }

    fn call_unknown<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
        attempt: Attempt,
        in_doubt: bool,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        let (partner, group_id, number) = owned_key(partner, key);
        Box::pin(async move {
            self.keep(move |conn| {
                let sql = match in_doubt {
                    true => {
                        "UPDATE exchanges SET state = 'in_doubt' WHERE partner = ?1 \
                         AND group_id = ?2 AND number = ?3 AND state = 'calling' \
                         AND attempt = ?4"
                    }
                    false => {
                        "UPDATE exchanges SET started_at = 0 WHERE partner = ?1 \
                         AND group_id = ?2 AND number = ?3 AND state = 'calling' \
                         AND attempt = ?4"
                    }
                };
                conn.prepare_cached(sql)?
                    .execute(params![partner, group_id, number, attempt.0])?;
                Ok(((), Wakes::NONE))
            })
            .await
        })
    }

    fn purge_exchanges<'a>(
        &'a self,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, StoreError>> {
        let now = millis(now);
        Box::pin(async move {
            self.keep(move |conn| {
                let freed: Vec<(String, i64)> = conn
                    .prepare_cached(
                        "SELECT source, SUM(size) FROM exchanges WHERE keep_until < ?1 \
                         GROUP BY source HAVING SUM(size) > 0",
                    )?
                    .query_map(params![now], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()?;
                for (source, bytes) in freed {
                    conn.prepare_cached(
                        "UPDATE answer_quota SET bytes = bytes - ?2 WHERE source = ?1",
                    )?
                    .execute(params![source, bytes])?;
                }
                conn.prepare_cached("DELETE FROM answer_quota WHERE bytes <= 0")?
                    .execute([])?;
                let purged = conn
                    .prepare_cached("DELETE FROM exchanges WHERE keep_until < ?1")?
                    .execute(params![now])?;
                Ok((purged as u64, Wakes::NONE))
            })
            .await
        })
    }
}

fn owned_key(partner: &str, key: &MessageKey) -> (String, String, i64) {
    (
        partner.to_owned(),
        key.group_id.as_str().to_owned(),
        slot_of(key),
    )
}
