//! Group states as SQLite rows hold them: the compact record (`store::group_state`) in
//! `state_bin`, or, in rows written before it, JSON in `state` (`group_json`).

pub use crate::store::group_state::encode;

use super::group_json;
use crate::rmp::group::GroupState;

/// A stored group row's state: the compact record when there is one, else the JSON of rows
/// written before it.
/// (`state` holds '' when the record is in `state_bin`.)
pub fn decode_stored(json: &str, bin: Option<&[u8]>) -> Result<GroupState, String> {
    match bin {
        Some(bin) if json.is_empty() => crate::store::group_state::decode(bin),
        _ => group_json::decode(json),
    }
}

/// `decode_stored` over rusqlite's column values (`state`, `state_bin`).
pub(super) fn decode_row(
    json: rusqlite::types::ValueRef<'_>,
    bin: rusqlite::types::ValueRef<'_>,
) -> Result<GroupState, String> {
    use rusqlite::types::ValueRef;
    let bin = match bin {
        ValueRef::Blob(bin) => Some(bin),
        _ => None,
    };
    match json {
        ValueRef::Text(json) => decode_stored(
            std::str::from_utf8(json).map_err(|_| "group state: not UTF-8")?,
            bin,
        ),
        _ => Err("group state: neither JSON nor a record".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rmp::group::GroupParams;
    use crate::wsr::GroupId;

    #[test]
    fn the_json_of_old_rows_still_reads() {
        let state = GroupState::new(
            GroupId::parse("mid:g@test").expect("id"),
            GroupParams {
                channel: "default".into(),
                sequenced: true,
                ack_requested: true,
                duplicate_elimination: false,
                message_order: true,
                limit: None,
            },
            chrono::DateTime::from_timestamp_millis(1_700_000_000_000).expect("time"),
        );
        assert_eq!(
            decode_stored(&group_json::encode(&state), None),
            Ok(state.clone())
        );
        let mut bin = Vec::new();
        encode(&state, &mut bin);
        assert_eq!(decode_stored("", Some(&bin)), Ok(state));
    }
}
