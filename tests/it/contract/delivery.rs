//! The delivery store trait's contract (see `contract/mod.rs`).
