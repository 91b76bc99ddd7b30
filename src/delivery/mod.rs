//! Delivery to applications (DESIGN §5): subscriptions over the inbox. So far only the pure
//! part that everything else will stand on: topic filters and subscription identities.
//! Subscriptions, leases, receipts, outcomes and push workers come with their issue.

pub mod filter;
