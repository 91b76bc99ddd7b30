//! What a commit makes possible, as both backends announce it, and who waits for it.

use std::collections::HashMap;

use tokio::sync::oneshot;

use crate::wsr::MessageKey;

/// What a committed change makes possible; the backend wakes the matching waiters after the
/// commit, never before (PostgreSQL: in every gateway, by NOTIFY).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wakes {
    /// Messages were appended to the inbox: fetchers may have more to hand out. Only the
    /// fetchers wait for this; the housekeeper and the push supervisor need not look again
    /// for every message received.
    pub appended: bool,
    /// The delivery state changed (subscriptions, sessions, leases, settles): fetchers may
    /// have something new to hand out, and deadlines may have moved.
    pub deliveries: bool,
    /// An outbound message is due (submitted, or its schedule moved earlier).
    pub outbound: bool,
    /// Callback acks were queued.
    pub callbacks: bool,
}

impl Wakes {
    pub(crate) const NONE: Wakes = Wakes {
        appended: false,
        deliveries: false,
        outbound: false,
        callbacks: false,
    };

    pub(crate) fn absorb(&mut self, other: Wakes) {
        self.appended |= other.appended;
        self.deliveries |= other.deliveries;
        self.outbound |= other.outbound;
        self.callbacks |= other.callbacks;
    }
}

/// Held Response-pattern requests by (partner, message key), each told when its message is
/// delivered.
pub(in crate::store) type Waiters = HashMap<(String, MessageKey), Vec<oneshot::Sender<()>>>;
