//! `ExchangeStore` for SQLite: changes through the writer (`keep`), reads from the pool.

use chrono::{DateTime, Utc};
use rusqlite::params;
use sqlx::Row;

use super::{SqliteStore, Wakes};
use crate::store::error::StoreError;
use crate::store::exchange::{
    CachedAnswer, Exchange, ExchangeState, ExchangeStore, NewCall, slot_of,
};
use crate::store::future::StoreFuture;
use crate::store::time::{from_millis, millis};
use crate::wsr::{GroupId, MessageKey};

const COLUMNS: &str = "partner, group_id, number, channel, state, started_at, status, \
                       content_type, body";

fn exchange_of(r: &sqlx::sqlite::SqliteRow) -> Result<Exchange, StoreError> {
    let state: String = r.try_get("state")?;
    let state = ExchangeState::parse(&state)
        .ok_or_else(|| StoreError::Corrupt(format!("exchange state {state:?}")))?;
    let group_id: String = r.try_get("group_id")?;
    let group_id = GroupId::parse(&group_id).map_err(StoreError::Corrupt)?;
    let body: Option<Vec<u8>> = r.try_get("body")?;
    let status: i64 = r.try_get("status")?;
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

impl ExchangeStore for SqliteStore {
    fn exchange<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Option<Exchange>, StoreError>> {
        Box::pin(async move {
            let sql = format!(
                "SELECT {COLUMNS} FROM exchanges WHERE partner = $1 AND group_id = $2 \
                 AND number = $3 AND keep_until >= $4"
            );
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
        let row = (
            call.partner.to_owned(),
            call.key.group_id.as_str().to_owned(),
            slot_of(call.key),
            call.channel.to_owned(),
            call.source.to_owned(),
            millis(call.now),
            millis(call.keep_until),
        );
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
        let row = (
            call.partner.to_owned(),
            call.key.group_id.as_str().to_owned(),
            slot_of(call.key),
            call.channel.to_owned(),
            call.source.to_owned(),
            millis(call.now),
            millis(call.keep_until),
        );
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

    fn answer_bytes_of<'a>(
        &'a self,
        source: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let bytes: Option<i64> = sqlx::query_scalar(
                "SELECT SUM(size) FROM exchanges WHERE source = $1 AND keep_until >= $2",
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
