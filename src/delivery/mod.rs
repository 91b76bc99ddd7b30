//! Delivery to applications (DESIGN §5): subscriptions over the inbox. So far only the pure
//! parts that everything else will stand on: topic filters and subscription identities,
//! unforgeable per-attempt receipts, and one message's lease/outcome state machine.
//! Subscriptions and their storage, consumer sessions, group ordering, the API and push
//! workers come with the rest of their issue.

pub mod filter;
pub mod lease;
pub mod receipt;
