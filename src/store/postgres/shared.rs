//! State one gateway's handles share: the waiters a commit wakes (here or, through NOTIFY, in
//! another gateway), the test hooks, health, and this gateway's own id. It must never import
//! the files that use it (the writer, the listener, the trait implementations): it holds the
//! writer's queue (`job.rs`) and the tasks (`tasks.rs`), both leaves.

use std::sync::Mutex;
use std::sync::atomic::AtomicI64;

use tokio::sync::{Notify, oneshot, watch};

use super::job::Writer;
use super::quota_view::QuotaView;
use super::tasks::Tasks;
use crate::rmp::group::Policy;
use crate::store::health::Health;
#[cfg(feature = "test-hooks")]
use crate::store::test_hooks::Hooks;
use crate::store::wakes::{Waiters, Wakes};
use crate::wsr::MessageKey;

pub(in crate::store) struct Shared {
    pub(in crate::store) policy: Policy,
    /// This gateway's id (a UUID, new at every start): the owner its leases name, and the
    /// part of its push sessions' ids that keeps them apart from other gateways'.
    pub(in crate::store) gateway: String,
    /// Requests waiting for a buffered message of theirs to be delivered (Response pattern),
    /// by (partner, key).
    pub(in crate::store) waiters: Mutex<Waiters>,
    pub(in crate::store) callbacks_due: Notify,
    pub(in crate::store) outbound_due: Notify,
    pub(in crate::store) deadlines_changed: Notify,
    /// When the sweeper plans to wake next (Unix ms).
    pub(in crate::store) sweeper_wakeup: AtomicI64,
    /// The test hooks' state (failing commits, a group whose messages panic while planned).
    #[cfg(feature = "test-hooks")]
    pub(in crate::store) hooks: Hooks,
    pub(in crate::store) health: Health,
    /// One readiness probe at a time, and when the last one ran.
    pub(in crate::store) probe: tokio::sync::Mutex<Option<std::time::Instant>>,
    pub(in crate::store) deliveries_changed: watch::Sender<u64>,
    pub(in crate::store) inbox_appended: watch::Sender<u64>,
    /// The task that LISTENs for other gateways' commits; stopped with the last handle.
    pub(super) listener: Tasks,
    /// The group-commit writer every receive goes through; stopped with the last handle.
    pub(super) writer: Writer,
    /// The writer's view of the sources' storage quota (only the writer takes it).
    pub(super) quota: Mutex<QuotaView>,
}

impl Shared {
    pub(super) fn new(policy: Policy, writer: Writer) -> Shared {
        Shared {
            policy,
            gateway: uuid::Uuid::now_v7().to_string(),
            waiters: Mutex::new(Waiters::new()),
            callbacks_due: Notify::new(),
            outbound_due: Notify::new(),
            deadlines_changed: Notify::new(),
            sweeper_wakeup: AtomicI64::new(i64::MIN),
            #[cfg(feature = "test-hooks")]
            hooks: Hooks::default(),
            health: Health::default(),
            probe: tokio::sync::Mutex::new(None),
            deliveries_changed: watch::channel(0).0,
            inbox_appended: watch::channel(0).0,
            listener: Tasks::default(),
            writer,
            quota: Mutex::new(QuotaView::default()),
        }
    }

    /// After a commit that may have freed stored bytes (a purge, a sweep, a settle): the
    /// writer reads its sources' usage again instead of holding them back for what is gone.
    pub(in crate::store) fn stored_bytes_freed(&self) {
        let mut quota = self.quota.lock().unwrap_or_else(|p| p.into_inner());
        quota.forget_stored();
    }

    /// Wakes this gateway's waiters for what a commit (here or elsewhere) made possible.
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

    /// A group deadline at `deadline` (Unix ms) was written: the sweeper looks again if it
    /// planned to sleep past it.
    pub(in crate::store) fn deadline_written(&self, deadline: i64) {
        if deadline
            < self
                .sweeper_wakeup
                .load(std::sync::atomic::Ordering::SeqCst)
        {
            self.deadlines_changed.notify_one();
        }
    }

    /// Tells the requests held for `partner`'s message `key` that it was delivered.
    pub(in crate::store) fn delivered(&self, partner: &str, key: &MessageKey) {
        let mut waiters = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(list) = waiters.remove(&(partner.to_owned(), key.clone())) {
            for waiter in list {
                let _ = waiter.send(());
            }
        }
    }

    pub(in crate::store) fn watch(&self, partner: &str, key: &MessageKey) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let mut waiters = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        let list = waiters
            .entry((partner.to_owned(), key.clone()))
            .or_default();
        list.retain(|w| !w.is_closed());
        list.push(tx);
        rx
    }

    pub(in crate::store) fn forget(&self, partner: &str, key: &MessageKey) {
        let mut waiters = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        let watched = (partner.to_owned(), key.clone());
        if let Some(list) = waiters.get_mut(&watched) {
            list.retain(|w| !w.is_closed());
            if list.is_empty() {
                waiters.remove(&watched);
            }
        }
    }

    /// The (partner, key) pairs some request waits for.
    pub(in crate::store) fn watched(&self) -> Vec<(String, MessageKey)> {
        let waiters = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        waiters.keys().cloned().collect()
    }
}

fn bump(changes: &watch::Sender<u64>) {
    changes.send_modify(|n| *n = n.wrapping_add(1));
}
