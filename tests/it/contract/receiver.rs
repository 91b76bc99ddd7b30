//! The receiver store trait's contract (see `contract/mod.rs`).
