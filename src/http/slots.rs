//! Fair shares: how many of something each key (a key, a source address) holds at
//! once — event streams and waiting fetches per key, requests in flight per source
//! within each class of the listener. A slot per holding, given back when it is dropped.
//! Counting only; it never reads requests.

use std::sync::{Arc, Mutex, PoisonError};

use foldhash::{HashMap, HashMapExt as _};

/// Open `/api/v1/events` streams allowed per key; one more is refused with 429.
pub const MAX_EVENT_STREAMS: usize = 8;

/// Long-polling fetches (`wait_ms` > 0) one key may have waiting at once; one more is
/// refused with 429, so one token cannot hold the waiting requests' whole budget.
pub const MAX_WAITING_FETCHES: usize = 32;

/// What each key holds now. Only keys holding something have an entry (a slot given back to
/// zero takes its key's entry with it), so the map is no larger than what is held at once —
/// bounded by the limits it enforces — and it hashes with foldhash rather than SipHash: every
/// request takes and gives back a slot or two.
#[derive(Debug)]
pub struct KeyedSlots {
    max: usize,
    open: Mutex<HashMap<String, usize>>,
}

/// One holding of a key; dropping it frees the slot.
#[derive(Debug)]
pub struct KeyedSlot {
    slots: Arc<KeyedSlots>,
    key: String,
    count: usize,
}

impl KeyedSlot {
    /// Holds `more` besides, unless the key would then hold more than `max`.
    pub fn grow(&mut self, more: usize) -> bool {
        let mut open = self
            .slots
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let held = open.entry(self.key.clone()).or_insert(0);
        if held.saturating_add(more) > self.slots.max {
            return false;
        }
        *held += more;
        self.count += more;
        true
    }
}

impl KeyedSlots {
    pub fn new(max: usize) -> KeyedSlots {
        KeyedSlots {
            max,
            open: Mutex::new(HashMap::new()),
        }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// A slot for `key`, unless it holds `max` already.
    pub fn take(self: &Arc<Self>, key: &str) -> Option<KeyedSlot> {
        self.take_many(key, 1)
    }

    /// A holding of `count` for `key` (bytes, say), unless it would hold more than `max`.
    pub fn take_many(self: &Arc<Self>, key: &str, count: usize) -> Option<KeyedSlot> {
        // An empty holding grown by `count`: one rule for taking and growing (dropped when it
        // cannot grow, it takes its key's empty entry with it).
        let mut slot = KeyedSlot {
            slots: Arc::clone(self),
            key: key.to_owned(),
            count: 0,
        };
        slot.grow(count).then_some(slot)
    }

    /// How many `key` holds now.
    pub fn open(&self, key: &str) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(key).copied().unwrap_or(0)
    }
}

impl Drop for KeyedSlot {
    fn drop(&mut self) {
        let mut open = self
            .slots
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = open.get_mut(&self.key) {
            *held = held.saturating_sub(self.count);
            if *held == 0 {
                open.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holdings_of_many_count_whole_and_grow_within_the_max() {
        let bytes = Arc::new(KeyedSlots::new(100));
        let mut a = bytes.take_many("10.0.0.1", 60).expect("fits");
        assert!(
            bytes.take_many("10.0.0.1", 41).is_none(),
            "101 would not fit"
        );
        assert!(a.grow(40));
        assert!(!a.grow(1), "the key holds its max");
        let _b = bytes.take_many("10.0.0.2", 100).expect("another key");
        drop(a);
        assert_eq!(bytes.open("10.0.0.1"), 0, "all 100 given back");
    }

    #[test]
    fn slots_per_key_are_bounded_and_given_back() {
        let slots = Arc::new(KeyedSlots::new(2));
        let a1 = slots.take("alice").expect("first");
        let _a2 = slots.take("alice").expect("second");
        assert!(slots.take("alice").is_none(), "a third is refused");
        let _b = slots.take("bob").expect("bob has his own");
        drop(a1);
        assert_eq!(slots.open("alice"), 1);
        assert!(
            slots.take("alice").is_some(),
            "a freed slot can be taken again"
        );
    }
}
