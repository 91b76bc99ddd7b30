//! `ExchangeStore` for SQLite: changes through the writer (`keep`), reads from the pool.

use chrono::{DateTime, Utc};
use rusqlite::params;

use super::{SqliteStore, Wakes};
use crate::store::error::StoreError;
use crate::store::exchange::{CachedAnswer, ExchangeStore, NewCall, slot_of};
use crate::store::future::StoreFuture;
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

impl ExchangeStore for SqliteStore {
    crate::store::exchange::exchange_reads!();

    fn begin_call<'a>(
        &'a self,
        call: NewCall<'a>,
        take_over_before: Option<DateTime<Utc>>,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        let row = call_row(&call);
        let take_over = take_over_before.map(millis);
        Box::pin(async move {
            self.keep(move |conn| {
                let (partner, group_id, number, channel, source, now, keep_until) = row;
                let inserted = conn
                    .prepare_cached(
                        "INSERT INTO exchanges (partner, group_id, number, channel, source, \
                         state, started_at, keep_until) VALUES (?1, ?2, ?3, ?4, ?5, 'calling', \
                         ?6, ?7) ON CONFLICT DO NOTHING",
                    )?
                    .execute(params![
                        partner, group_id, number, channel, source, now, keep_until
                    ])?;
                if inserted == 1 {
                    return Ok((true, Wakes::NONE));
                }
                let Some(before) = take_over else {
                    return Ok((false, Wakes::NONE));
                };
                let taken = conn
                    .prepare_cached(
                        "UPDATE exchanges SET started_at = ?4 WHERE partner = ?1 \
                         AND group_id = ?2 AND number = ?3 AND state = 'calling' \
                         AND started_at < ?5",
                    )?
                    .execute(params![partner, group_id, number, now, before])?;
                Ok((taken == 1, Wakes::NONE))
            })
            .await
        })
    }

    fn call_answered<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
        answer: &'a CachedAnswer,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        let (partner, group_id, number) = owned_key(partner, key);
        let answer = answer.clone();
        Box::pin(async move {
            self.keep(move |conn| {
                conn.prepare_cached(
                    "UPDATE exchanges SET state = 'answered', status = ?4, content_type = ?5, \
                     body = ?6, size = ?7 WHERE partner = ?1 AND group_id = ?2 AND number = ?3",
                )?
                .execute(params![
                    partner,
                    group_id,
                    number,
                    answer.status,
                    answer.content_type,
                    answer.body.as_ref(),
                    answer.body.len() as i64
                ])?;
                Ok(((), Wakes::NONE))
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
                        answer.body.len() as i64
                    ])?;
                Ok((inserted == 1, Wakes::NONE))
            })
            .await
        })
    }

    fn call_failed<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        let (partner, group_id, number) = owned_key(partner, key);
        Box::pin(async move {
            self.keep(move |conn| {
                conn.prepare_cached(
                    "DELETE FROM exchanges WHERE partner = ?1 AND group_id = ?2 \
                     AND number = ?3 AND state = 'calling'",
                )?
                .execute(params![partner, group_id, number])?;
                Ok(((), Wakes::NONE))
            })
            .await
        })
    }

    fn call_unknown<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
        in_doubt: bool,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        let (partner, group_id, number) = owned_key(partner, key);
        Box::pin(async move {
            self.keep(move |conn| {
                let sql = match in_doubt {
                    true => {
                        "UPDATE exchanges SET state = 'in_doubt' WHERE partner = ?1 \
                         AND group_id = ?2 AND number = ?3 AND state = 'calling'"
                    }
                    false => {
                        "UPDATE exchanges SET started_at = 0 WHERE partner = ?1 \
                         AND group_id = ?2 AND number = ?3 AND state = 'calling'"
                    }
                };
                conn.prepare_cached(sql)?
                    .execute(params![partner, group_id, number])?;
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
