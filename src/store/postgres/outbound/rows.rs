//! How outbound rows are read on PostgreSQL: the column list every message read uses and its
//! one mapping to `OutMessage` (the stored forms of a state and a schedule are both backends',
//! `store::stored_outbound`).

use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::rmp::sender::Outbound;
use crate::store::StoreError;
use crate::store::outbound::{KeyedSubmission, LastError, OutMessage, ResponseInfo};
use crate::store::stored_outbound::{decode_schedule, state_of};
use crate::store::time::from_millis;
use crate::wsr::{GroupId, SoapVersion};

/// A static query over messages joined with their group, in the column order `message` reads
/// (static, so that no value is spliced into the SQL).
macro_rules! select_messages {
    ($tail:literal) => {
        select_messages!("", $tail)
    };
    ($extra:literal, $tail:literal) => {
        select_messages!(@envelope "m.envelope", $extra, $tail)
    };
    // Reads that never send (polls) take `''` for the envelope: it may be megabytes a row.
    (@envelope $envelope:literal, $extra:literal, $tail:literal) => {
        concat!(
            "SELECT m.id, m.group_id, m.number, m.destination, m.soap12, m.reply_pattern, ",
            $envelope,
            ", m.expiry, m.schedule, m.state, m.fault, m.reason, m.attempts, ",
            "m.next_attempt, m.notify_url, g.ordered, m.idem_key, m.unreached, m.last_error, ",
            "m.last_error_at, m.principal, m.partner, ",
            "resp.content_type, resp.size, resp.soap_fault, resp.received_at, ",
            "m.created_at, m.updated_at, m.last_poll_at",
            $extra,
            " FROM out_messages m JOIN out_groups g USING (group_id) ",
            "LEFT JOIN out_responses resp ON resp.message_id = m.id ",
            $tail
        )
    };
}
pub(super) use select_messages;

/// How many columns `select_messages!` reads (extra columns of a query follow them).
pub(super) const COLUMNS: usize = 29;

/// The message stored under an idempotency key (principal, key).
pub(super) const EARLIER_SUBMISSION: &str = "SELECT id, group_id, number, idem_fingerprint \
     FROM out_messages WHERE idem_principal = $1 AND idem_key = $2";

/// A row of `select_messages!` as an `OutMessage`.
pub(super) fn message(r: &PgRow) -> Result<OutMessage, StoreError> {
    let column = |e: sqlx::Error| StoreError::Corrupt(format!("outbound message row: {e}"));
    let state: String = r.try_get(9).map_err(column)?;
    let fault: Option<String> = r.try_get(10).map_err(column)?;
    let group_id: String = r.try_get(1).map_err(column)?;
    let schedule: String = r.try_get(8).map_err(column)?;
    let last_error: Option<String> = r.try_get(18).map_err(column)?;
    let last_error_at: Option<i64> = r.try_get(19).map_err(column)?;
    Ok(OutMessage {
        id: r.try_get(0).map_err(column)?,
        group_id: GroupId::parse(&group_id).map_err(StoreError::Corrupt)?,
        number: r
            .try_get::<Option<i64>, _>(2)
            .map_err(column)?
            .map(|n| n as u64),
        destination: r.try_get(3).map_err(column)?,
        version: if r.try_get(4).map_err(column)? {
            SoapVersion::Soap12
        } else {
            SoapVersion::Soap11
        },
        reply: r.try_get(5).map_err(column)?,
        envelope: r.try_get(6).map_err(column)?,
        outbound: Outbound {
            state: state_of(&state, fault.as_deref(), r.try_get(11).map_err(column)?)?,
            attempts: r
                .try_get::<i32, _>(12)
                .map_err(column)?
                .try_into()
                .unwrap_or(u32::MAX),
            unreached: r
                .try_get::<i32, _>(17)
                .map_err(column)?
                .try_into()
                .unwrap_or(0),
            expiry: from_millis(r.try_get(7).map_err(column)?),
            schedule: decode_schedule(&schedule)?,
            next_attempt: r
                .try_get::<Option<i64>, _>(13)
                .map_err(column)?
                .map(from_millis),
        },
        notify_url: r.try_get(14).map_err(column)?,
        ordered: r.try_get(15).map_err(column)?,
        idempotency_key: r.try_get(16).map_err(column)?,
        last_error: match (last_error, last_error_at) {
            (Some(cause), Some(at)) => Some(LastError {
                cause,
                at: from_millis(at),
            }),
            _ => None,
        },
        principal: r.try_get(20).map_err(column)?,
        partner: r.try_get(21).map_err(column)?,
        response: response_info(r).map_err(column)?,
        submitted_at: from_millis(r.try_get(26).map_err(column)?),
        updated_at: from_millis(r.try_get(27).map_err(column)?),
        last_poll_at: r
            .try_get::<Option<i64>, _>(28)
            .map_err(column)?
            .map(from_millis),
    })
}

/// The kept business response's columns of a `select_messages!` row (`NULL`s: none).
fn response_info(r: &PgRow) -> Result<Option<ResponseInfo>, sqlx::Error> {
    let content_type: Option<String> = r.try_get(22)?;
    let size: Option<i64> = r.try_get(23)?;
    let soap_fault: Option<bool> = r.try_get(24)?;
    let received_at: Option<i64> = r.try_get(25)?;
    Ok(match (content_type, size, soap_fault, received_at) {
        (Some(content_type), Some(size), Some(soap_fault), Some(at)) => Some(ResponseInfo {
            content_type,
            size: size.try_into().unwrap_or(0),
            soap_fault,
            received_at: from_millis(at),
        }),
        _ => None,
    })
}

/// A row of `EARLIER_SUBMISSION`.
pub(super) fn keyed(r: &PgRow) -> Result<KeyedSubmission, StoreError> {
    let column = |e: sqlx::Error| StoreError::Corrupt(format!("idempotency key row: {e}"));
    Ok(KeyedSubmission {
        id: r.try_get(0).map_err(column)?,
        group_id: r.try_get(1).map_err(column)?,
        number: r
            .try_get::<Option<i64>, _>(2)
            .map_err(column)?
            .map(|n| n as u64),
        fingerprint: r.try_get(3).map_err(column)?,
    })
}
