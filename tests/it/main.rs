//! One integration-test binary (it links once): the codec against tables, properties, the XSD
//! and the recorded Holodeck exchanges; and the running gateway's health endpoint.

mod api_security;
mod bench;
mod bounded;
mod chaos;
mod cluster;
mod contract;
mod crash;
mod delivery;
mod example_pair;
mod health;
mod hostile;
mod interop;
mod malformed;
mod outbound_trust;
mod partner_clients;
mod partners_auth;
mod partners_tls;
mod perimeter;
mod postgres;
mod receiver;
mod roundtrip;
mod schema;
mod scoping;
mod sender;
mod support;
mod tls;
mod valid;
