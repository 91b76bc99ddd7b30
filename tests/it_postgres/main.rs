//! The gateway's behaviour tests of `tests/it`, run again with every gateway on a PostgreSQL
//! database of its own (`tests/it/test_database.rs`): the same files, compiled into a second
//! binary whose `BACKEND` is PostgreSQL. Left out: what has no store behaviour (the codec
//! tables, the XSD, TLS handshakes, the perimeter's limits, the example configuration), what
//! only a SQLite file has (`sqlite_file.rs`), the benchmarks, and the store contract suites,
//! which `it` already runs on both backends. Two gateways on one database: `it`'s
//! `cluster.rs`.
#![allow(dead_code, reason = "helpers the modules left out here use")]

/// The backend this binary's gateways run on.
pub const BACKEND: test_database::TestBackend = test_database::TestBackend::Postgres;

#[path = "../it/api_security.rs"]
mod api_security;
#[path = "../it/audit.rs"]
mod audit;
#[path = "../it/bounded.rs"]
mod bounded;
#[path = "../it/console_sign_out.rs"]
mod console_sign_out;
#[path = "../it/crash.rs"]
mod crash;
#[path = "../it/delivery.rs"]
mod delivery;
#[path = "../it/health.rs"]
mod health;
#[path = "../it/hostile.rs"]
mod hostile;
#[path = "../it/interop.rs"]
mod interop;
#[path = "../it/interop_rr.rs"]
mod interop_rr;
#[path = "../it/metrics.rs"]
mod metrics;
#[path = "../it/outbound_trust.rs"]
mod outbound_trust;
#[path = "../it/partner_clients.rs"]
mod partner_clients;
#[path = "../it/partners_auth.rs"]
mod partners_auth;
#[path = "../it/partners_tls.rs"]
mod partners_tls;
#[path = "../it/receiver.rs"]
mod receiver;
#[path = "../it/request_response.rs"]
mod request_response;
#[path = "../it/responses.rs"]
mod responses;
#[path = "../it/scoping.rs"]
mod scoping;
#[path = "../it/sender.rs"]
mod sender;
#[path = "../it/soap_push.rs"]
mod soap_push;
#[path = "../it/source_quota.rs"]
mod source_quota;
#[path = "../it/store_check.rs"]
mod store_check;
#[path = "../it/support.rs"]
mod support;
#[path = "../it/test_database.rs"]
mod test_database;
#[path = "../it/unstorable_input.rs"]
mod unstorable_input;
#[path = "../it/username_token.rs"]
mod username_token;
#[path = "../it/why_stuck.rs"]
mod why_stuck;
