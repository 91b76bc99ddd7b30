//! Delivery to applications (DESIGN §5), the pure part: topic filters and identities,
//! subscription rules, unforgeable per-attempt receipts, one message's lease/outcome state
//! machine, the choice of what a member gets, group heads, sessions coming and going, what
//! handing out and settling do, and when time alone changes something. No I/O, no store, no
//! async runtime: the workers that apply these rules over the store live in `consume`.

pub mod access;
pub mod fetch;
pub mod filter;
pub mod group;
pub mod lease;
pub mod pick;
pub mod receipt;
pub mod retention;
pub mod session;
pub mod settle;
pub mod soap;
pub mod subscription;
pub mod wake;
