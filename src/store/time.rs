//! How both backends store instants: Unix milliseconds in integer columns (INTEGER, BIGINT).

use chrono::{DateTime, Utc};

pub fn millis(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

/// The instant of stored milliseconds; one out of chrono's range reads as the earliest.
pub fn from_millis(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MIN_UTC)
}
