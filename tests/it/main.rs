//! One integration-test binary (it links once): the codec against tables, properties, the XSD
//! and the recorded Holodeck exchanges; the running gateway, on SQLite (`it-postgres` runs the
//! gateway's behaviour tests again on PostgreSQL); the store contract suites on both.

/// The backend this binary's gateways run on (`test_database.rs`).
pub const BACKEND: test_database::TestBackend = test_database::TestBackend::Sqlite;

mod api_security;
mod audit;
mod backup;
mod bench;
mod bounded;
mod chaos;
mod cli;
mod cluster;
mod console;
mod console_sign_out;
mod contract;
mod crash;
mod delivery;
mod example_pair;
mod fair_shares;
mod health;
mod hostile;
mod interop;
mod interop_rr;
mod malformed;
mod metrics;
mod openapi;
mod outbound_trust;
mod partner_clients;
mod partners_auth;
mod partners_tls;
mod perimeter;
mod perimeter_lines;
mod postgres;
mod receiver;
mod request_response;
mod responses;
mod roundtrip;
mod schema;
mod scoping;
mod sender;
mod soap_push;
mod source_quota;
mod sqlite_file;
mod store_check;
mod support;
mod test_database;
mod tls;
mod traces;
mod unstorable_input;
mod username_token;
mod valid;
mod why_stuck;
