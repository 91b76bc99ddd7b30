//! How both backends store an outbound message's state (name, fault code, reason columns)
//! and its retry schedule (JSON), so that the two read and write the same values, and the one
//! rewrite of a stored envelope (closing its group after the fact).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::rmp::sender::{OutState, RetrySchedule};
use crate::store::StoreError;
use crate::wsr::{FaultCode, Headers, write_envelope};

/// A stored state with its fault code or reason.
pub(in crate::store) fn state_of(
    name: &str,
    fault: Option<&str>,
    reason: Option<String>,
) -> Result<OutState, StoreError> {
    Ok(match name {
        "queued" => OutState::Queued,
        "sent" => OutState::Sent,
        "acked" => OutState::Acked,
        "faulted" => OutState::Faulted(
            fault
                .and_then(FaultCode::from_local_name)
                .ok_or_else(|| StoreError::Corrupt("faulted without a known fault".into()))?,
        ),
        "failed" => OutState::Failed(reason.unwrap_or_default()),
        other => {
            return Err(StoreError::Corrupt(format!(
                "unknown outbound state {other}"
            )));
        }
    })
}

/// The fault code column of a state.
pub(in crate::store) fn fault_of(state: &OutState) -> Option<&'static str> {
    match state {
        OutState::Faulted(code) => Some(code.local_name()),
        _ => None,
    }
}

/// The reason column of a state.
pub(in crate::store) fn reason_of(state: &OutState) -> Option<&str> {
    match state {
        OutState::Failed(reason) => Some(reason.as_str()),
        _ => None,
    }
}

#[derive(Serialize, Deserialize)]
enum StoredSchedule {
    Interval {
        max_attempts: u32,
        interval_ms: u64,
        backoff: u32,
    },
    Waits(Vec<u64>),
}

pub(in crate::store) fn encode_schedule(s: &RetrySchedule) -> String {
    let stored = match s {
        RetrySchedule::Interval {
            max_attempts,
            interval,
            backoff,
        } => StoredSchedule::Interval {
            max_attempts: *max_attempts,
            interval_ms: interval.as_millis().try_into().unwrap_or(u64::MAX),
            backoff: *backoff,
        },
        RetrySchedule::Waits(w) => StoredSchedule::Waits(
            w.iter()
                .map(|d| d.as_millis().try_into().unwrap_or(u64::MAX))
                .collect(),
        ),
    };
    serde_json::to_string(&stored).unwrap_or_default()
}

pub(in crate::store) fn decode_schedule(s: &str) -> Result<RetrySchedule, StoreError> {
    let stored: StoredSchedule =
        serde_json::from_str(s).map_err(|e| StoreError::Corrupt(format!("schedule: {e}")))?;
    Ok(match stored {
        StoredSchedule::Interval {
            max_attempts,
            interval_ms,
            backoff,
        } => RetrySchedule::Interval {
            max_attempts,
            interval: Duration::from_millis(interval_ms),
            backoff,
        },
        StoredSchedule::Waits(w) => {
            RetrySchedule::Waits(w.into_iter().map(Duration::from_millis).collect())
        }
    })
}

/// Our own stored envelope with `last="true"` on its SequenceNum, rewritten by the codec.
pub(in crate::store) fn mark_last(envelope: &str) -> Option<String> {
    let env =
        crate::wsr::read_envelope(envelope.as_bytes(), &crate::wsr::Limits::default()).ok()?;
    let mut request = env.request?;
    request.message_id.sequence.as_mut()?.last = true;
    Some(write_envelope(
        env.version,
        Headers {
            request: Some(&request),
            ..Headers::default()
        },
        env.body.content,
    ))
}
