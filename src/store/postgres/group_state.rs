//! Group states as PostgreSQL rows hold them: the compact record (`store::group_state`) in
//! `state_bin`, an unreadable one reported as a corrupt store. A leaf: it must never import
//! another file of the backend.

pub(super) use crate::store::group_state::encode;

use crate::rmp::group::GroupState;
use crate::store::StoreError;

/// A stored group row's state, from its `state_bin` column.
pub(super) fn decode(bin: &[u8]) -> Result<GroupState, StoreError> {
    crate::store::group_state::decode(bin).map_err(StoreError::Corrupt)
}
