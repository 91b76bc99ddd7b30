//! How a store is opened: where, how durable, under which receiver policy.

use std::path::PathBuf;

use crate::rmp::group::Policy;

/// How hard a commit presses the data to disk before the ack goes out (DESIGN §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous=FULL`: acked messages survive power loss. The default.
    Full,
    /// `synchronous=NORMAL`: acked messages survive a process crash, but the last commits can
    /// be lost on power failure. Faster.
    Os,
}

#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub path: PathBuf,
    pub durability: Durability,
    pub policy: Policy,
}
