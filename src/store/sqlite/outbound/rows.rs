//! How outbound rows are read: the column list every message read uses, and one mapping from
//! those columns to `OutMessage` for both connections (the sqlx pool's reads and the writer's
//! rusqlite connection). The stored forms of a state and a retry schedule are both backends'
//! (`store::stored_outbound`).

use sqlx::Row;

use crate::rmp::sender::Outbound;
use crate::store::StoreError;
use crate::store::outbound::{LastError, OutMessage, ResponseInfo};
use crate::store::stored_outbound::decode_schedule;
pub(super) use crate::store::stored_outbound::{encode_schedule, fault_of, reason_of, state_of};
use crate::store::time::from_millis;
use crate::wsr::{GroupId, SoapVersion};

/// A static query over messages joined with their group, in the column order `Columns`
/// reads (static, so that no value is spliced into the SQL).
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

/// One message's columns as stored, before they are checked.
pub(super) struct Columns {
    id: String,
    group_id: String,
    number: Option<i64>,
    destination: String,
    soap12: i64,
    reply: String,
    envelope: String,
    expiry: i64,
    schedule: String,
    state: String,
    fault: Option<String>,
    reason: Option<String>,
    attempts: i64,
    next_attempt: Option<i64>,
    notify_url: Option<String>,
    ordered: i64,
    idem_key: Option<String>,
    unreached: i64,
    last_error: Option<String>,
    last_error_at: Option<i64>,
    principal: Option<String>,
    partner: String,
    response: ResponseColumns,
    created_at: i64,
    updated_at: i64,
    last_poll_at: Option<i64>,
}

/// The columns of a kept business response (all `NULL` when there is none).
struct ResponseColumns {
    content_type: Option<String>,
    size: Option<i64>,
    soap_fault: Option<i64>,
    received_at: Option<i64>,
}

impl ResponseColumns {
    fn info(self) -> Option<ResponseInfo> {
        Some(ResponseInfo {
            content_type: self.content_type?,
            size: self.size?.try_into().unwrap_or(0),
            soap_fault: self.soap_fault? != 0,
            received_at: from_millis(self.received_at?),
        })
    }
}

impl Columns {
    /// From a row of the read pool.
    pub(super) fn of_pool(r: &sqlx::sqlite::SqliteRow) -> Columns {
        Columns {
            id: r.get(0),
            group_id: r.get(1),
            number: r.get(2),
            destination: r.get(3),
            soap12: r.get(4),
            reply: r.get(5),
            envelope: r.get(6),
            expiry: r.get(7),
            schedule: r.get(8),
            state: r.get(9),
            fault: r.get(10),
            reason: r.get(11),
            attempts: r.get(12),
            next_attempt: r.get(13),
            notify_url: r.get(14),
            ordered: r.get(15),
            idem_key: r.get(16),
            unreached: r.get(17),
            last_error: r.get(18),
            last_error_at: r.get(19),
            principal: r.get(20),
            partner: r.get(21),
            response: ResponseColumns {
                content_type: r.get(22),
                size: r.get(23),
                soap_fault: r.get(24),
                received_at: r.get(25),
            },
            created_at: r.get(26),
            updated_at: r.get(27),
            last_poll_at: r.get(28),
        }
    }

    /// From a row of the writer's connection (reads inside a change).
    pub(super) fn of_writer(r: &rusqlite::Row<'_>) -> rusqlite::Result<Columns> {
        Ok(Columns {
            id: r.get(0)?,
            group_id: r.get(1)?,
            number: r.get(2)?,
            destination: r.get(3)?,
            soap12: r.get(4)?,
            reply: r.get(5)?,
            envelope: r.get(6)?,
            expiry: r.get(7)?,
            schedule: r.get(8)?,
            state: r.get(9)?,
            fault: r.get(10)?,
            reason: r.get(11)?,
            attempts: r.get(12)?,
            next_attempt: r.get(13)?,
            notify_url: r.get(14)?,
            ordered: r.get(15)?,
            idem_key: r.get(16)?,
            unreached: r.get(17)?,
            last_error: r.get(18)?,
            last_error_at: r.get(19)?,
            principal: r.get(20)?,
            partner: r.get(21)?,
            response: ResponseColumns {
                content_type: r.get(22)?,
                size: r.get(23)?,
                soap_fault: r.get(24)?,
                received_at: r.get(25)?,
            },
            created_at: r.get(26)?,
            updated_at: r.get(27)?,
            last_poll_at: r.get(28)?,
        })
    }

    pub(super) fn message(self) -> Result<OutMessage, StoreError> {
        Ok(OutMessage {
            group_id: GroupId::parse(&self.group_id).map_err(StoreError::Corrupt)?,
            number: self.number.map(|n| n as u64),
            version: if self.soap12 != 0 {
                SoapVersion::Soap12
            } else {
                SoapVersion::Soap11
            },
            outbound: Outbound {
                state: state_of(&self.state, self.fault.as_deref(), self.reason)?,
                attempts: self.attempts.try_into().unwrap_or(u32::MAX),
                unreached: self.unreached.try_into().unwrap_or(0),
                expiry: from_millis(self.expiry),
                schedule: decode_schedule(&self.schedule)?,
                next_attempt: self.next_attempt.map(from_millis),
            },
            ordered: self.ordered != 0,
            last_error: match (self.last_error, self.last_error_at) {
                (Some(cause), Some(at)) => Some(LastError {
                    cause,
                    at: from_millis(at),
                }),
                _ => None,
            },
            id: self.id,
            destination: self.destination,
            partner: self.partner,
            reply: self.reply,
            envelope: self.envelope,
            notify_url: self.notify_url,
            idempotency_key: self.idem_key,
            principal: self.principal,
            response: self.response.info(),
            submitted_at: from_millis(self.created_at),
            updated_at: from_millis(self.updated_at),
            last_poll_at: self.last_poll_at.map(from_millis),
        })
    }
}

/// The message stored under an idempotency key (principal, key), for both drivers; read into
/// a `KeyedSubmission`.
pub(super) const EARLIER_SUBMISSION: &str = "SELECT id, group_id, number, idem_fingerprint \
     FROM out_messages WHERE idem_principal = ?1 AND idem_key = ?2";
