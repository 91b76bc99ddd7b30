//! The open sequenced groups the writer wrote last, kept decoded between its batches: a
//! sequenced group is written by message after message, and reading its row back and decoding
//! its state for each one cost about a twentieth of an ordered message (issue 35).
//!
//! The rule that keeps it right: an entry is the group's state as the writer's own transaction
//! left it, and nothing but the writer's message batches writes a group while entries live.
//! So the writer takes an entry out when a batch reads the group, puts it back when the batch
//! ends, and forgets every entry when a batch fails (its states were never committed) and
//! before any other job runs (a sweep, an operator's abort or any change may write groups by
//! statements of its own). Singletons and finished groups are not kept: no message follows.

use foldhash::HashMap;

use super::group_rows::StoredGroup;
use crate::rmp::group::{GroupState, GroupStatus};

/// At most this many groups are kept; when a new one finds the map full, the map starts over.
/// More open groups than this at once only cost a row read each.
const MAX_WARM_GROUPS: usize = 4096;

/// A state with more entries than this in any of its sets (delivered ranges, buffered
/// messages, kept faults) is not kept: a partner sending an unordered group with a gap after
/// every message grows its ranges without bound, and the map's memory must stay bounded: tens
/// of MB at the very worst, a few hundred bytes per group as ordered groups go.
const MAX_KEPT_ENTRIES: usize = 64;

/// By partner, then group id, like the batch's own map (looked up by `&str`): each kept
/// group's row id and state.
#[derive(Default)]
pub(super) struct WarmGroups {
    groups: HashMap<String, HashMap<String, (i64, GroupState)>>,
}

impl WarmGroups {
    /// Takes `partner`'s group `group_id` out, if it is kept: the group as its row holds it.
    pub(super) fn take(&mut self, partner: &str, group_id: &str) -> Option<StoredGroup> {
        let (id, state) = self.groups.get_mut(partner)?.remove(group_id)?;
        Some(StoredGroup {
            id,
            state: Ok(state),
        })
    }

    /// Keeps a group as its batch leaves it, if another message of it may follow.
    pub(super) fn keep(&mut self, partner: &str, group_id: &str, id: i64, state: GroupState) {
        let small = state.delivered.len() <= MAX_KEPT_ENTRIES
            && state.buffered.len() <= MAX_KEPT_ENTRIES
            && state.faults.len() <= MAX_KEPT_ENTRIES;
        if state.status != GroupStatus::Open || !state.params.sequenced || !small {
            return;
        }
        if self.len() >= MAX_WARM_GROUPS {
            self.forget_all();
        }
        let of_partner = match self.groups.get_mut(partner) {
            Some(g) => g,
            None => self.groups.entry(partner.to_owned()).or_default(),
        };
        of_partner.insert(group_id.to_owned(), (id, state));
    }

    pub(super) fn forget_all(&mut self) {
        self.groups.clear();
    }

    /// Groups kept (the outer map has one entry per partner: a few).
    fn len(&self) -> usize {
        self.groups.values().map(HashMap::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rmp::group::GroupParams;
    use crate::wsr::GroupId;

    fn state(sequenced: bool, status: GroupStatus) -> GroupState {
        let params = GroupParams {
            channel: "default".into(),
            sequenced,
            ack_requested: true,
            duplicate_elimination: true,
            message_order: sequenced,
            limit: None,
        };
        let id = GroupId::parse("mid:g@example.com").expect("group id");
        let mut state = GroupState::new(id, params, chrono::Utc::now());
        state.status = status;
        state
    }

    #[test]
    fn only_open_sequenced_groups_are_kept_and_a_take_removes_them() {
        let mut warm = WarmGroups::default();
        warm.keep("p", "mid:single", 1, state(false, GroupStatus::Open));
        warm.keep("p", "mid:done", 2, state(true, GroupStatus::Complete));
        warm.keep("p", "mid:open", 3, state(true, GroupStatus::Open));
        assert_eq!(warm.len(), 1);
        assert!(warm.take("p", "mid:single").is_none());
        assert!(
            warm.take("other", "mid:open").is_none(),
            "partners are apart"
        );
        assert_eq!(warm.take("p", "mid:open").map(|g| g.id), Some(3));
        assert!(warm.take("p", "mid:open").is_none(), "taken out");
        assert_eq!(warm.len(), 0);
    }

    #[test]
    fn a_state_with_many_gaps_is_not_kept() {
        let mut warm = WarmGroups::default();
        let mut gappy = state(true, GroupStatus::Open);
        for n in 0..=MAX_KEPT_ENTRIES as u64 {
            gappy.delivered.insert(n * 2);
        }
        assert_eq!(gappy.delivered.len(), MAX_KEPT_ENTRIES + 1);
        warm.keep("p", "mid:gappy", 1, gappy);
        assert_eq!(warm.len(), 0);
    }

    #[test]
    fn a_full_map_starts_over_instead_of_growing() {
        let mut warm = WarmGroups::default();
        for i in 0..MAX_WARM_GROUPS {
            warm.keep(
                "p",
                &format!("mid:g{i}"),
                i as i64,
                state(true, GroupStatus::Open),
            );
        }
        assert_eq!(warm.len(), MAX_WARM_GROUPS);
        warm.keep("p", "mid:one-more", 0, state(true, GroupStatus::Open));
        assert_eq!(warm.len(), 1);
        assert!(warm.take("p", "mid:one-more").is_some());
    }
}
