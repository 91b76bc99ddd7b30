//! The store's test hooks: a rule that panics, commits that fail, a full disk — simulated, so
//! that the tests can watch the gateway survive them. Compiled only with the `test-hooks`
//! feature, which the crate's own tests turn on (Cargo.toml: a dev-dependency on itself);
//! nothing outside the tests may call them, and `cargo build` leaves them out.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::error::StoreError;
use super::future::StoreFuture;

/// What the tests may do to a backend (and to `Store`, which passes it on).
pub trait TestHooks {
    /// Every message of `group` panics inside the writer, as a bug would (`None`: none does).
    fn panic_on_group(&self, group: Option<&str>);

    /// Caps the database at its current size (`false`: lifts the cap), so that writes fail as
    /// on a full disk ("database or disk is full").
    fn cap_database_size<'a>(&'a self, capped: bool) -> StoreFuture<'a, Result<(), StoreError>>;

    /// Makes the next `n` commits that carry messages fail (`StoreError::Injected`).
    fn fail_next_commits(&self, n: usize);
}

/// The hooks' state in a backend's shared state, read by its writer.
#[derive(Default)]
pub(in crate::store) struct Hooks {
    /// The next N commits that carry messages fail.
    failing_commits: AtomicUsize,
    /// Messages of this group panic while planned.
    panicking_group: Mutex<Option<String>>,
}

impl Hooks {
    pub(in crate::store) fn panic_on_group(&self, group: Option<&str>) {
        *self
            .panicking_group
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = group.map(str::to_owned);
    }

    pub(in crate::store) fn fail_next_commits(&self, n: usize) {
        self.failing_commits.store(n, Ordering::SeqCst);
    }

    /// Whether a message of `group_id` is to panic while planned.
    pub(in crate::store) fn doomed(&self, group_id: &str) -> bool {
        self.panicking_group
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_deref()
            == Some(group_id)
    }

    /// Whether this commit is to fail: one of the failures `fail_next_commits` asked for,
    /// used up.
    pub(in crate::store) fn commit_fails(&self) -> bool {
        self.failing_commits
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}
