//! State shared between the store's handles and its writer thread: the waiters a commit wakes,
//! the test hooks, health, the group key index. It uses no other file of the backend but that
//! index and the durable commit count (leaves themselves).

use std::sync::atomic::{AtomicI64, AtomicUsize};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, watch};

use super::group_index::GroupIndex;
use super::syncer::Durable;
use crate::rmp::group::Policy;
use crate::store::health::Health;
#[cfg(feature = "test-hooks")]
use crate::store::test_hooks::Hooks;

pub(in crate::store) use crate::store::wakes::Waiters;
pub(crate) use crate::store::wakes::Wakes;

/// State shared between handles and the writer thread.
pub(in crate::store) struct Shared {
    pub(in crate::store) policy: Policy,
    /// Which row holds a (partner, group id); the writer keeps it, readers look up through it.
    pub(in crate::store) groups: GroupIndex,
    /// Requests waiting for a buffered message of theirs to be delivered (Response pattern),
    /// by (partner, key): another partner's message of the same key is not theirs.
    pub(in crate::store) waiters: Mutex<Waiters>,
    /// Woken after a commit that queued callback acks.
    pub(in crate::store) callbacks_due: Notify,
    /// Woken when an outbound message was submitted or its schedule moved earlier.
    pub(in crate::store) outbound_due: Notify,
    /// Woken after a commit that moved a group deadline before the sweeper's next wake-up.
    pub(in crate::store) deadlines_changed: Notify,
    /// When the sweeper plans to wake next (Unix ms).
    pub(in crate::store) sweeper_wakeup: AtomicI64,
    /// The test hooks' state (failing commits, a group whose messages panic inside the
    /// writer).
    #[cfg(feature = "test-hooks")]
    pub(in crate::store) hooks: Hooks,
    /// Whether the writer's last commit attempt worked (readiness).
    pub(in crate::store) health: Health,
    /// One readiness probe at a time, and when the last one ran.
    pub(super) probe: tokio::sync::Mutex<Option<std::time::Instant>>,
    /// This process's exclusive hold on the database (`{file}.lock`), released when the last
    /// handle and the writer are gone.
    pub(super) _lock: std::fs::File,
    /// Bumped whenever the delivery state changed (subscriptions, sessions, leases, settles);
    /// every delivery worker waits on it.
    pub(in crate::store) deliveries_changed: watch::Sender<u64>,
    /// Bumped after a commit that appended inbox messages; fetches wait on it too.
    pub(in crate::store) inbox_appended: watch::Sender<u64>,
    /// Received requests read and being decided, whose messages the next commit may wait for
    /// (`Arriving`, the writer's group commit).
    pub(in crate::store) arriving: Arc<AtomicUsize>,
    /// Which commits are durable (`syncer.rs`): readers wait on it before answering.
    pub(in crate::store) durable: Arc<Durable>,
}

impl Shared {
    /// Wakes whoever waits for what a commit made possible.
    pub(in crate::store) fn wake(&self, wakes: Wakes) {
        if wakes.appended {
            bump(&self.inbox_appended);
        }
        if wakes.deliveries {
            bump(&self.deliveries_changed);
        }
        if wakes.outbound {
            self.outbound_due.notify_one();
        }
        if wakes.callbacks {
            self.callbacks_due.notify_one();
        }
    }
}

fn bump(changes: &watch::Sender<u64>) {
    changes.send_modify(|n| *n = n.wrapping_add(1));
}
