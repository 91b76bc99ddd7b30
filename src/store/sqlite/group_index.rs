//! Which `groups` row holds a (partner, group id): a map in memory from a keyed hash of the
//! pair to row ids, loaded from the table at start and kept by the writer (migration 0013
//! says why the table has no index of its own for it).
//!
//! The rule that keeps it right: every committed row has an entry; an entry may point to a row
//! that is gone or never committed, and to another pair's row when two hashes collide. So
//! whoever looks up reads the rows the entry names and keeps the one whose partner and group
//! id match. The writer adds an entry as soon as it inserts a row (later jobs of its batch must
//! find it), takes it out again when the commit fails, and removes entries of deleted rows only
//! after the commit that deleted them.
//!
//! The hash is SipHash under a key drawn at start (`RandomState`), so a partner cannot choose
//! group ids that collide; a collision only costs one more row read. The maps from those keys
//! hash them again with foldhash: a key is already a secret-keyed hash, so nothing a partner
//! chooses can make them collide, and hashing it with SipHash again cost every message twice.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};

use foldhash::HashMap;

use crate::store::error::StoreError;

/// A (partner, group id) as the index knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct GroupKey(u64);

#[derive(Default)]
struct Entries {
    /// One row per key: every key but a collision's.
    one: HashMap<GroupKey, i64>,
    /// Keys that name more than one row (collisions, or a stale entry beside a new one).
    more: HashMap<GroupKey, Vec<i64>>,
}

pub(in crate::store) struct GroupIndex {
    keys: RandomState,
    entries: Mutex<Entries>,
}

impl GroupIndex {
    /// Loads every group row's key (one scan of the table, at start).
    pub(super) fn load(conn: &rusqlite::Connection) -> Result<GroupIndex, StoreError> {
        let index = GroupIndex {
            keys: RandomState::new(),
            entries: Mutex::new(Entries::default()),
        };
        let mut select = conn.prepare("SELECT id, partner, group_id FROM groups")?;
        let mut rows = select.query([])?;
        {
            let mut entries = index.lock();
            while let Some(row) = rows.next()? {
                // Borrowed from the row: a million groups load in well under a second.
                let text = |i| -> Result<&str, StoreError> {
                    row.get_ref(i)?
                        .as_str()
                        .map_err(|e| StoreError::Corrupt(format!("a group key is not text: {e}")))
                };
                let key = index.key(text(1)?, text(2)?);
                entries.add(key, row.get(0)?);
            }
        }
        Ok(index)
    }

    pub(super) fn key(&self, partner: &str, group_id: &str) -> GroupKey {
        GroupKey(self.keys.hash_one((partner, group_id)))
    }

    /// The rows that may hold `partner`'s group `group_id` (the caller checks each).
    pub(super) fn rows(&self, partner: &str, group_id: &str) -> Vec<i64> {
        self.rows_of_key(self.key(partner, group_id))
    }

    fn rows_of_key(&self, key: GroupKey) -> Vec<i64> {
        let entries = self.lock();
        match entries.one.get(&key) {
            Some(id) => vec![*id],
            None => entries.more.get(&key).cloned().unwrap_or_default(),
        }
    }

    pub(super) fn add(&self, key: GroupKey, id: i64) {
        self.lock().add(key, id);
    }

    #[cfg(test)]
    fn remove(&self, key: GroupKey, id: i64) {
        self.lock().remove(key, id);
    }

    /// How many rows it knows (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        let entries = self.lock();
        entries.one.len() + entries.more.values().map(Vec::len).sum::<usize>()
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        // The maps stay consistent whatever panicked: every change is one insert or removal.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Entries {
    fn add(&mut self, key: GroupKey, id: i64) {
        if let Some(ids) = self.more.get_mut(&key) {
            if !ids.contains(&id) {
                ids.push(id);
            }
            return;
        }
        match self.one.get(&key) {
            None => {
                self.one.insert(key, id);
            }
            Some(existing) if *existing == id => {}
            Some(existing) => {
                let first = *existing;
                self.one.remove(&key);
                self.more.insert(key, vec![first, id]);
            }
        }
    }

    fn remove(&mut self, key: GroupKey, id: i64) {
        if self.one.get(&key) == Some(&id) {
            self.one.remove(&key);
            return;
        }
        if let Some(ids) = self.more.get_mut(&key) {
            ids.retain(|i| *i != id);
            match ids.as_slice() {
                [] => {
                    self.more.remove(&key);
                }
                [last] => {
                    let last = *last;
                    self.more.remove(&key);
                    self.one.insert(key, last);
                }
                _ => {}
            }
        }
    }
}

/// What a batch did to the index, settled when its commit ends.
#[derive(Debug, Default)]
pub(super) struct IndexChanges {
    /// Entries added for rows the batch inserted (already in the index).
    added: Vec<(GroupKey, i64)>,
    /// Entries of rows the batch deleted (still in the index).
    removed: Vec<(GroupKey, i64)>,
}

impl IndexChanges {
    /// A row inserted: its entry goes in now, so the rest of the batch finds it.
    pub(super) fn inserted(&mut self, index: &GroupIndex, key: GroupKey, id: i64) {
        index.add(key, id);
        self.added.push((key, id));
    }

    /// A row deleted: its entry goes when the deletion is committed.
    pub(super) fn deleted(&mut self, key: GroupKey, id: i64) {
        self.removed.push((key, id));
    }

    /// The batch committed: deleted rows leave the index.
    pub(super) fn committed(self, index: &GroupIndex) {
        let mut entries = index.lock();
        for (key, id) in self.removed {
            entries.remove(key, id);
        }
    }

    /// The batch rolled back: rows it inserted never were.
    pub(super) fn rolled_back(self, index: &GroupIndex) {
        let mut entries = index.lock();
        for (key, id) in self.added {
            entries.remove(key, id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index() -> GroupIndex {
        GroupIndex {
            keys: RandomState::new(),
            entries: Mutex::new(Entries::default()),
        }
    }

    fn rows(index: &GroupIndex, key: GroupKey) -> Vec<i64> {
        index.rows_of_key(key)
    }

    #[test]
    fn partners_keep_their_own_groups_of_one_id() {
        let index = index();
        let (a, b) = (index.key("a", "mid:1"), index.key("b", "mid:1"));
        assert_ne!(a, b);
        assert_eq!(index.key("a", "mid:1"), a, "the key is stable");
        // The pair, not its concatenation: ("ab", "c") and ("a", "bc") are two groups.
        assert_ne!(index.key("ab", "c"), index.key("a", "bc"));
        index.add(a, 1);
        assert_eq!(rows(&index, a), vec![1]);
        assert!(rows(&index, b).is_empty());
    }

    #[test]
    fn a_colliding_key_names_every_row_until_each_is_removed() {
        let index = index();
        let key = index.key("", "mid:x");
        index.add(key, 1);
        index.add(key, 1);
        assert_eq!(index.len(), 1, "adding the same row twice keeps one entry");
        index.add(key, 7);
        index.add(key, 9);
        assert_eq!(rows(&index, key), vec![1, 7, 9]);
        index.remove(key, 7);
        assert_eq!(rows(&index, key), vec![1, 9]);
        index.remove(key, 1);
        assert_eq!(rows(&index, key), vec![9]);
        index.remove(key, 2);
        assert_eq!(
            rows(&index, key),
            vec![9],
            "removing another row changes nothing"
        );
        index.remove(key, 9);
        assert!(rows(&index, key).is_empty());
        assert_eq!(index.len(), 0);
    }

    #[test]
    fn a_batch_undoes_its_inserts_when_it_rolls_back_and_applies_deletes_when_it_commits() {
        let index = index();
        let (old, new) = (index.key("", "mid:old"), index.key("", "mid:new"));
        index.add(old, 1);
        let mut changes = IndexChanges::default();
        changes.inserted(&index, new, 2);
        changes.deleted(old, 1);
        assert_eq!(
            rows(&index, new),
            vec![2],
            "later jobs of the batch find it"
        );
        assert_eq!(
            rows(&index, old),
            vec![1],
            "readers still find the committed row"
        );
        changes.rolled_back(&index);
        assert!(rows(&index, new).is_empty());
        assert_eq!(rows(&index, old), vec![1]);

        let mut changes = IndexChanges::default();
        changes.inserted(&index, new, 2);
        changes.deleted(old, 1);
        changes.committed(&index);
        assert_eq!(rows(&index, new), vec![2]);
        assert!(rows(&index, old).is_empty());
    }

    #[test]
    fn a_group_deleted_and_opened_again_in_one_batch_keeps_its_new_row() {
        let index = index();
        let key = index.key("", "mid:again");
        index.add(key, 1);
        let mut changes = IndexChanges::default();
        changes.deleted(key, 1);
        changes.inserted(&index, key, 5);
        changes.committed(&index);
        assert_eq!(rows(&index, key), vec![5]);
    }

    #[test]
    fn it_loads_every_row_of_the_table() {
        let conn = rusqlite::Connection::open_in_memory().expect("open");
        conn.execute_batch(
            "CREATE TABLE groups (id INTEGER PRIMARY KEY, partner TEXT, group_id TEXT);
             INSERT INTO groups (partner, group_id) VALUES ('', 'mid:a'), ('p', 'mid:a'), ('', 'mid:b');",
        )
        .expect("schema");
        let index = GroupIndex::load(&conn).expect("load");
        assert_eq!(index.len(), 3);
        assert_eq!(rows(&index, index.key("p", "mid:a")), vec![2]);
    }
}
