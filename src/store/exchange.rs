//! Request-response operations' storage (D16): per request, the call to the channel's
//! responder while it is out, then the business response every copy of the request gets.
//! Every backend implements it; the decisions are `rmp::exchange`'s, the calls
//! `inbound::respond`'s.

use bytes::Bytes;
use chrono::{DateTime, Utc};

use super::error::StoreError;
use super::future::{Committed, StoreFuture};
pub use crate::rmp::exchange::ExchangeState;
use crate::wsr::MessageKey;

/// The bytes a request is answered with, as they go on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedAnswer {
    pub status: u16,
    pub content_type: String,
    pub body: Bytes,
}

/// One request's exchange as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    pub partner: String,
    pub key: MessageKey,
    pub channel: String,
    pub state: ExchangeState,
    pub started_at: DateTime<Utc>,
    /// The call it is (or last was) waiting for.
    pub attempt: Attempt,
    pub answer: Option<CachedAnswer>,
}

/// A call about to go out.
#[derive(Debug, Clone)]
pub struct NewCall<'a> {
    pub partner: &'a str,
    pub key: &'a MessageKey,
    pub channel: &'a str,
    /// Whose byte quota the answer counts against.
    pub source: &'a str,
    pub now: DateTime<Utc>,
    /// The request's ExpiryTime plus the delivered-ID retention.
    pub keep_until: DateTime<Utc>,
}

/// Which call a `calling` exchange belongs to: every call (the first, or one that takes over a
/// call whose outcome became unknown) gets a new one, and only that call's outcome is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt(pub i64);

impl Attempt {
    pub fn fresh() -> Attempt {
        // v7 is time-ordered in its high half; the low half is random.
        Attempt(uuid::Uuid::now_v7().as_u64_pair().1 as i64)
    }
}

/// How a call is begun.
#[derive(Debug, Clone, Copy)]
pub enum BeginCall {
    /// The request's first call, unless its source's kept answers hold `quota` bytes or more.
    Fresh { quota: u64 },
    /// A call again, taking over a `calling` exchange started before `started_before` (its
    /// outcome unknown: the gateway that made it gave up or died).
    TakeOver { started_before: DateTime<Utc> },
}

/// What `begin_call` decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Began {
    /// Call now; write the outcome as this attempt's.
    Call(Attempt),
    /// The request has an exchange (or, taking over, its call is no longer unknown).
    Exists,
    /// The source's kept answers hold `held` bytes: no call.
    OverQuota { held: u64 },
}

pub trait ExchangeStore: Send + Sync {
    /// `partner`'s exchange for request `key`, if one is kept at `now`.
    fn exchange<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Option<Exchange>, StoreError>>;

    /// Records that a call goes out, as `how` says: decided at once, durable once
    /// `Committed` resolves (a caller that must not call before the record is durable waits
    /// for it).
    fn begin_call<'a>(
        &'a self,
        call: NewCall<'a>,
        how: BeginCall,
    ) -> StoreFuture<'a, Result<(Began, Committed), StoreError>>;

    /// The responder answered `attempt`: the call becomes the request's cached answer and its
    /// bytes count against the source's quota. False when the exchange is no longer that
    /// attempt's (taken over, or purged): the answer is not kept. (A backend's answer usually
    /// travels with its request's delivery instead: `ReceivedMessage::answer`.)
    fn call_answered<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
        attempt: Attempt,
        answer: &'a CachedAnswer,
    ) -> StoreFuture<'a, Result<bool, StoreError>>;

    /// An application answered a delivered request (the spec's Respond): kept as answered,
    /// counted against the source's quota, unless the request has an exchange already (false
    /// then).
    fn answer_request<'a>(
        &'a self,
        call: NewCall<'a>,
        answer: &'a CachedAnswer,
    ) -> StoreFuture<'a, Result<bool, StoreError>>;

    /// `attempt` certainly did not deliver (no connection, a gateway error): forgotten, so
    /// the next copy calls afresh.
    fn call_failed<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
        attempt: Attempt,
    ) -> StoreFuture<'a, Result<(), StoreError>>;

    /// `attempt`'s outcome is unknown: kept for the next copy to call again (`in_doubt`
    /// false: its start moves back so that it can be taken over at once), or in doubt for good.
    fn call_unknown<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
        attempt: Attempt,
        in_doubt: bool,
    ) -> StoreFuture<'a, Result<(), StoreError>>;

    /// The bytes of the answers `source`'s requests hold (its quota's running total; answers
    /// past their keep are counted until the sweeper purges them).
    fn answer_bytes_of<'a>(&'a self, source: &'a str) -> StoreFuture<'a, Result<u64, StoreError>>;

    /// Requests in doubt toward their responder, the oldest first, at most `limit`.
    fn exchanges_in_doubt<'a>(
        &'a self,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<Exchange>, StoreError>>;

    /// Forgets exchanges kept until before `now`, and their bytes from their sources' quotas;
    /// returns how many.
    fn purge_exchanges<'a>(
        &'a self,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, StoreError>>;
}

/// An `exchanges` row as both backends read it (`SELECT_COLUMNS`).
pub(in crate::store) type ExchangeRow = (
    String,
    String,
    i64,
    String,
    String,
    i64,
    i64,
    String,
    Option<Vec<u8>>,
    i64,
);

/// The columns of an `ExchangeRow`, in its order.
macro_rules! exchange_columns {
    () => {
        "partner, group_id, number, channel, state, started_at, status, content_type, body, \
         attempt"
    };
}
pub(in crate::store) use exchange_columns;

/// The reads both backends share (one SQL text each, `$n` placeholders).
macro_rules! exchange_reads {
    () => {
        fn exchange<'a>(
            &'a self,
            partner: &'a str,
            key: &'a $crate::wsr::MessageKey,
            now: chrono::DateTime<chrono::Utc>,
        ) -> $crate::store::StoreFuture<
            'a,
            Result<Option<$crate::store::Exchange>, $crate::store::StoreError>,
        > {
            Box::pin(self.durable(async move {
                let row: Option<$crate::store::exchange::ExchangeRow> = sqlx::query_as(concat!(
                    "SELECT ",
                    $crate::store::exchange::exchange_columns!(),
                    " FROM exchanges WHERE partner = $1 AND group_id = $2 AND number = $3 \
                     AND keep_until >= $4"
                ))
                .bind(partner)
                .bind(key.group_id.as_str())
                .bind($crate::store::exchange::slot_of(key))
                .bind($crate::store::time::millis(now))
                .fetch_optional(&self.pool)
                .await?;
                row.map($crate::store::exchange::exchange_of).transpose()
            }))
        }

        fn answer_bytes_of<'a>(
            &'a self,
            source: &'a str,
        ) -> $crate::store::StoreFuture<'a, Result<u64, $crate::store::StoreError>> {
            Box::pin(self.durable(async move {
                let bytes: Option<i64> =
                    sqlx::query_scalar("SELECT bytes FROM answer_quota WHERE source = $1")
                        .bind(source)
                        .fetch_optional(&self.pool)
                        .await?;
                Ok(bytes.unwrap_or(0).max(0) as u64)
            }))
        }

        fn exchanges_in_doubt<'a>(
            &'a self,
            limit: i64,
        ) -> $crate::store::StoreFuture<
            'a,
            Result<Vec<$crate::store::Exchange>, $crate::store::StoreError>,
        > {
            Box::pin(self.durable(async move {
                let rows: Vec<$crate::store::exchange::ExchangeRow> = sqlx::query_as(concat!(
                    "SELECT ",
                    $crate::store::exchange::exchange_columns!(),
                    " FROM exchanges WHERE state = 'in_doubt' ORDER BY started_at LIMIT $1"
                ))
                .bind(limit)
                .fetch_all(&self.pool)
                .await?;
                rows.into_iter()
                    .map($crate::store::exchange::exchange_of)
                    .collect()
            }))
        }
    };
}
pub(in crate::store) use exchange_reads;

/// An `ExchangeRow` read back.
pub(in crate::store) fn exchange_of(row: ExchangeRow) -> Result<Exchange, StoreError> {
    let (
        partner,
        group_id,
        number,
        channel,
        state,
        started_at,
        status,
        content_type,
        body,
        attempt,
    ) = row;
    let state = ExchangeState::parse(&state)
        .ok_or_else(|| StoreError::Corrupt(format!("exchange state {state:?}")))?;
    let group_id = crate::wsr::GroupId::parse(&group_id).map_err(StoreError::Corrupt)?;
    Ok(Exchange {
        partner,
        key: MessageKey {
            group_id,
            number: Some(number as u64),
        },
        channel,
        state,
        started_at: crate::store::time::from_millis(started_at),
        attempt: Attempt(attempt),
        answer: match (state, body) {
            (ExchangeState::Answered, Some(body)) => Some(CachedAnswer {
                status: u16::try_from(status).unwrap_or(500),
                content_type,
                body: body.into(),
            }),
            _ => None,
        },
    })
}

/// The number column of a key: the group state's slot (a singleton is 0).
pub(in crate::store) fn slot_of(key: &MessageKey) -> i64 {
    crate::rmp::group::slot(key.number) as i64
}
