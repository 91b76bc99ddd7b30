//! Delivery's workers (DESIGN §3, §5): long-poll fetch, push to webhooks (JSON and SOAP),
//! admissions under the caps and housekeeping, over the store, the outbound HTTP client and tokio; never axum — handlers call
//! these and render what they return. The decisions they apply are `delivery`'s pure rules.

pub mod admit;
pub mod maintain;
pub mod pull;
pub mod push;
pub mod traced;
pub mod view;
pub mod wait;
