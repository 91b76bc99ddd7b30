//! What one transaction changes of the bytes stored per source (the storage quota's count,
//! D13): gathered while it stores, releases, discards and purges, and written once at its
//! end, in source order — so that two transactions touching the same sources take their rows
//! in the same order (PostgreSQL) and each source's row is written once per batch.

use std::collections::BTreeMap;

/// Bytes added (positive) or freed (negative) per source. The unknown source (`""`: an
/// anonymous message stored before sources were kept) counts for nobody.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct UsageChanges(BTreeMap<String, i64>);

impl UsageChanges {
    pub fn stored(&mut self, source: &str, bytes: u64) {
        self.add(source, i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    pub fn freed(&mut self, source: &str, bytes: u64) {
        self.add(source, -i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    fn add(&mut self, source: &str, delta: i64) {
        if source.is_empty() || delta == 0 {
            return;
        }
        match self.0.get_mut(source) {
            Some(d) => *d = d.saturating_add(delta),
            None => {
                self.0.insert(source.to_owned(), delta);
            }
        }
    }

    /// What this transaction has changed of `source` so far.
    pub fn of(&self, source: &str) -> i64 {
        self.0.get(source).copied().unwrap_or(0)
    }

    /// The changes in source order, without the ones that cancelled out.
    pub fn iter(&self) -> impl Iterator<Item = (&str, i64)> {
        self.0
            .iter()
            .filter(|(_, d)| **d != 0)
            .map(|(s, d)| (s.as_str(), *d))
    }

    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }
}

/// `stored` bytes changed by `delta`, never below nothing.
pub fn after(stored: i64, delta: i64) -> u64 {
    u64::try_from(stored.saturating_add(delta)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_add_up_per_source_in_source_order_and_cancel_out() {
        let mut c = UsageChanges::default();
        c.stored("partner:b", 10);
        c.stored("192.0.2.1", 5);
        c.freed("partner:b", 4);
        c.stored("x", 3);
        c.freed("x", 3);
        c.stored("", 100);
        assert_eq!(
            c.iter().collect::<Vec<_>>(),
            vec![("192.0.2.1", 5), ("partner:b", 6)]
        );
        assert_eq!(c.of("partner:b"), 6);
        assert_eq!(c.of(""), 0, "the unknown source counts for nobody");
        c.clear();
        assert!(c.is_empty());
    }

    #[test]
    fn usage_never_goes_below_nothing() {
        assert_eq!(after(5, -10), 0);
        assert_eq!(after(5, 10), 15);
    }
}
