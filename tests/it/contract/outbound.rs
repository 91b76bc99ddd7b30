//! The outbound store trait's contract (see `contract/mod.rs`).
