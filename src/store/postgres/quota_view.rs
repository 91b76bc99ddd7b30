//! One gateway's view of the storage quota (D13) for its writer: the bytes stored per source,
//! read from `source_usage` at most once a second per source (other gateways store too) plus
//! what this gateway has written since, and the sources' message rates, which are this
//! gateway's own (several gateways each allow a source its rate). A leaf: it reads nothing
//! itself and imports no file of this backend.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::rmp::quota::SourceRates;
use crate::store::source_usage::{self, UsageChanges};

/// How long a source's stored bytes as read stay good enough to decide on. Another gateway's
/// writes show within it, so a source can overshoot by what the other gateways store in it.
const FRESH_FOR: Duration = Duration::from_secs(1);

/// Most sources whose stored bytes are remembered; beyond it the view starts again empty
/// (each source is then read again when it next sends).
const MAX_REMEMBERED: usize = 10_000;

#[derive(Debug, Default)]
pub(in crate::store) struct QuotaView {
    stored: HashMap<String, (u64, Instant)>,
    pub(in crate::store) rates: SourceRates,
}

impl QuotaView {
    /// Which of `sources` must be read again before deciding.
    pub(in crate::store) fn stale<'s>(
        &self,
        sources: impl Iterator<Item = &'s str>,
        now: Instant,
    ) -> Vec<&'s str> {
        let mut stale: Vec<&str> = sources
            .filter(|s| {
                self.stored
                    .get(*s)
                    .is_none_or(|(_, at)| now.duration_since(*at) >= FRESH_FOR)
            })
            .collect();
        stale.sort_unstable();
        stale.dedup();
        stale
    }

    /// `source` holds `bytes`, as read at `at`.
    pub(in crate::store) fn read(&mut self, source: &str, bytes: u64, at: Instant) {
        if self.stored.len() >= MAX_REMEMBERED && !self.stored.contains_key(source) {
            self.stored.clear();
        }
        self.stored.insert(source.to_owned(), (bytes, at));
    }

    /// After this gateway freed stored bytes (a purge, a sweep): read every source again, so
    /// that a source is not held back for what is gone.
    pub(in crate::store) fn forget_stored(&mut self) {
        self.stored.clear();
    }

    /// What `source` holds, as far as this gateway knows.
    pub(in crate::store) fn stored(&self, source: &str) -> u64 {
        self.stored.get(source).map_or(0, |(b, _)| *b)
    }

    /// After a commit: what it stored, and the messages its sources' rates count.
    pub(in crate::store) fn committed(
        &mut self,
        changes: &UsageChanges,
        counted: &HashMap<String, (u64, u64)>,
        now: DateTime<Utc>,
    ) {
        for (source, delta) in changes.iter() {
            if let Some((bytes, _)) = self.stored.get_mut(source) {
                *bytes = source_usage::after(i64::try_from(*bytes).unwrap_or(i64::MAX), delta);
            }
        }
        for (source, (per_second, n)) in counted {
            self.rates.take(source, *per_second, now, *n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_read_again_once_a_second_has_passed() {
        let mut view = QuotaView::default();
        let t = Instant::now();
        assert_eq!(view.stale(["a", "b", "a"].into_iter(), t), vec!["a", "b"]);
        view.read("a", 10, t);
        assert_eq!(view.stale(["a", "b"].into_iter(), t), vec!["b"]);
        assert_eq!(view.stale(["a"].into_iter(), t + FRESH_FOR), vec!["a"]);
        assert_eq!(view.stored("a"), 10);
        let mut changes = UsageChanges::default();
        changes.stored("a", 5);
        view.committed(&changes, &HashMap::new(), Utc::now());
        assert_eq!(
            view.stored("a"),
            15,
            "what this gateway wrote counts at once"
        );
    }
}
