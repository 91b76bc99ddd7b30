//! The writer's statements on the `groups` table: rows are found through the key index
//! (group_index.rs) and then read, changed and deleted by their id.

use rusqlite::{Connection, OptionalExtension as _, params};

use super::group_index::GroupIndex;
use super::group_state;
use crate::rmp::group::GroupState;
use crate::store::error::StoreError;

/// A stored group: its row and its state (`Err(reason)`: unreadable).
pub(super) struct StoredGroup {
    pub(super) id: i64,
    pub(super) state: Result<GroupState, String>,
}

/// `partner`'s group `group_id`, if it is stored.
pub(super) fn find(
    conn: &Connection,
    index: &GroupIndex,
    (partner, group_id): (&str, &str),
) -> Result<Option<StoredGroup>, StoreError> {
    let ids = index.rows(partner, group_id);
    let mut select = conn
        .prepare_cached("SELECT partner, group_id, state, state_bin FROM groups WHERE id = ?1")?;
    for id in ids {
        // A stale entry (the row is gone) or a collision (another pair's row) is passed over.
        let found = select
            .query_row([id], |r| {
                let theirs = r.get_ref(0)?.as_str().is_ok_and(|p| p == partner)
                    && r.get_ref(1)?.as_str().is_ok_and(|g| g == group_id);
                if !theirs {
                    return Ok(None);
                }
                Ok(Some(group_state::decode_row(r.get_ref(2)?, r.get_ref(3)?)))
            })
            .optional()?;
        if let Some(Some(state)) = found {
            return Ok(Some(StoredGroup { id, state }));
        }
    }
    Ok(None)
}

/// What a group row holds besides its key.
pub(super) struct GroupRow<'a> {
    pub(super) status: &'a str,
    pub(super) deadline: Option<i64>,
    pub(super) updated_at: i64,
    pub(super) state_bin: &'a [u8],
}

/// Inserts a new group; answers its row id (the caller adds it to the index).
pub(super) fn insert(
    conn: &Connection,
    (partner, group_id): (&str, &str),
    channel: &str,
    source: &str,
    row: &GroupRow<'_>,
) -> Result<i64, StoreError> {
    conn.prepare_cached(
        "INSERT INTO groups (partner, group_id, channel, status, next_deadline, updated_at, \
         state, state_bin, source) VALUES (?1, ?2, ?3, ?4, ?5, ?6, '', ?7, ?8)",
    )?
    .execute(params![
        partner,
        group_id,
        channel,
        row.status,
        row.deadline,
        row.updated_at,
        row.state_bin,
        source
    ])?;
    Ok(conn.last_insert_rowid())
}

/// Writes a stored group's new state (its channel and source stay as first written).
/// `stored_status`: the status the row holds, when known; a state that keeps it leaves the
/// status column alone, and with it the partial index of open groups by source, which SQLite
/// rewrites whenever an UPDATE assigns the column.
pub(super) fn update(
    conn: &Connection,
    id: i64,
    row: &GroupRow<'_>,
    stored_status: Option<&str>,
) -> Result<(), StoreError> {
    // Both bind the status as ?2; the first does not use it.
    let sql = if stored_status == Some(row.status) {
        "UPDATE groups SET next_deadline = ?3, updated_at = ?4, state = '', state_bin = ?5 \
         WHERE id = ?1"
    } else {
        "UPDATE groups SET status = ?2, next_deadline = ?3, updated_at = ?4, state = '', \
         state_bin = ?5 WHERE id = ?1"
    };
    let changed = conn.prepare_cached(sql)?.execute(params![
        id,
        row.status,
        row.deadline,
        row.updated_at,
        row.state_bin
    ])?;
    one_row(changed, id)
}

/// A group row the writer wrote through its id must still be there: it is read back (or kept
/// in the warm map) only by the writer, and a row gone from under it fails the batch, so that
/// nothing is acknowledged on a state that was not stored (and the warm map is forgotten).
fn one_row(changed: usize, id: i64) -> Result<(), StoreError> {
    if changed == 1 {
        Ok(())
    } else {
        Err(StoreError::Failed(format!("group row {id} is gone")))
    }
}

/// Takes a group whose state cannot be read out of the sweep (kept for an operator).
pub(super) fn stop_sweeping(conn: &Connection, id: i64) -> Result<(), StoreError> {
    conn.prepare_cached("UPDATE groups SET next_deadline = NULL WHERE id = ?1")?
        .execute([id])?;
    Ok(())
}

/// Deletes a group row (the caller removes its index entry once that is committed).
pub(super) fn delete(conn: &Connection, id: i64) -> Result<(), StoreError> {
    conn.prepare_cached("DELETE FROM groups WHERE id = ?1")?
        .execute([id])?;
    Ok(())
}
