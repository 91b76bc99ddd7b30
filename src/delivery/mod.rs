//! Delivery to applications (DESIGN §5): subscriptions over the inbox. So far only the pure
//! parts that everything else will stand on: topic filters and subscription identities, and
//! unforgeable per-attempt receipts. Subscriptions, sessions, leases, outcomes, the API and
//! push workers come with the rest of their issue.

pub mod filter;
pub mod receipt;
