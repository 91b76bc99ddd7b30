//! How many long-lived answers (`/api/v1/events` streams) each principal holds open at once:
//! a slot per stream, given back when the stream ends. Counting only; it never reads requests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Open `/api/v1/events` streams allowed per principal; one more is refused with 429.
pub const MAX_EVENT_STREAMS: usize = 8;

/// The open streams, by principal.
#[derive(Debug)]
pub struct StreamSlots {
    max: usize,
    open: Mutex<HashMap<String, usize>>,
}

impl Default for StreamSlots {
    fn default() -> Self {
        StreamSlots::new(MAX_EVENT_STREAMS)
    }
}

/// One open stream of a principal; dropping it frees the slot.
#[derive(Debug)]
pub struct StreamSlot {
    slots: Arc<StreamSlots>,
    principal: String,
}

impl StreamSlots {
    pub fn new(max: usize) -> StreamSlots {
        StreamSlots {
            max,
            open: Mutex::new(HashMap::new()),
        }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// A slot for `principal`, unless it holds `max` already.
    pub fn take(self: &Arc<Self>, principal: &str) -> Option<StreamSlot> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(principal.to_owned()).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(StreamSlot {
            slots: Arc::clone(self),
            principal: principal.to_owned(),
        })
    }

    /// Streams `principal` holds open now.
    pub fn open(&self, principal: &str) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(principal).copied().unwrap_or(0)
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self
            .slots
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.principal) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.principal);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_per_principal_are_bounded_and_given_back() {
        let slots = Arc::new(StreamSlots::new(2));
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
