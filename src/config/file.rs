//! The file format: every setting the TOML file may hold, with its default. Only the shape;
//! what the values must satisfy is checked by each section's file, and `mod.rs` puts them
//! together. Never logs or shows a value: tokens and partners' secrets may be inline.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};

use serde::Deserialize;

use super::agreements::AgreementSpec;
use super::bounds::DEFAULT_HORIZON_SECONDS;
use super::channels::ChannelConfig;
use super::tls::{TlsFileConfig, TrustedProxyConfig};
use super::tokens::TokenConfig;
use crate::rmp::quota::SourceQuota;
use crate::wsr::Limits;

/// The file format. Every field has a default; unknown keys are errors, not silently ignored.
/// No `Debug`: tokens and partners' secrets may be inline.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileConfig {
    pub listen: SocketAddr,
    /// The database: a SQLite file (a path or `sqlite://…`, the default) or a PostgreSQL URL
    /// (`postgres://…`).
    pub database: String,
    /// "full" (default: fsync before every ack) or "os" (faster; survives a process crash
    /// but not a power loss).
    pub durability: String,
    /// How far an ExpiryTime may lie in the past before the message counts as expired (D3).
    pub clock_skew_seconds: u64,
    /// How long delivered IDs are kept after their messages expire, so that senders whose
    /// acks were lost can still learn by PollRequest that they were delivered.
    pub delivered_id_retention_seconds: u64,
    /// How far ahead a message's ExpiryTime may lie, on every channel that does not set its
    /// own (D13; default 30 days). Further → `InvalidExpiryTime`, nothing stored.
    pub max_expiry_horizon_seconds: u64,
    /// How far ahead a group's `groupExpiryTime`, or its `groupMaxIdleDuration` from now, may
    /// reach (default 30 days). Further → `InvalidMessageParameters`.
    pub max_group_lifetime_seconds: u64,
    /// Idle limit for groups that name neither limit, as xs:duration (D8).
    pub default_group_idle: String,
    /// Most open groups one source (peer IP address) may have at once; a message that would
    /// open one more gets `MessageProcessingFailure` (transient) (D13).
    pub max_open_groups_per_source: u64,
    /// Storage quota per source (D13): bytes its messages may take in the store until they
    /// are purged (inbox and ordered buffers), and messages per second it may have stored;
    /// beyond either, `MessageProcessingFailure` (transient). `0` turns one off. Channels and
    /// partners may set their own.
    pub max_stored_bytes_per_source: u64,
    pub max_messages_per_second_per_source: u64,
    /// Most bytes of request-response answers one source's requests may hold at once (D16).
    pub max_answer_bytes_per_source: u64,
    /// Per-group buffer for ordered messages ahead of a gap (D6).
    pub buffer_max_messages: usize,
    pub buffer_max_bytes: u64,
    /// How long a Response-pattern answer for a buffered message may wait for the gap (D6).
    pub hold_ms: u64,
    /// Largest accepted HTTP body (D13).
    pub max_message_bytes: usize,
    /// Most references one PollRequest may name, and most statements one Response (a
    /// callback, a partner's answer) may make (D13); beyond it `InvalidPollRequest` /
    /// `InvalidRequest`. Poll answers are bounded by it too.
    pub max_poll_references: usize,
    /// The perimeter (D13): a connection's request head must arrive within
    /// `header_timeout_ms` (from the accept or its first byte); a request body may pause at
    /// most `body_timeout_ms` and must average `body_min_bytes_per_second` once that long has
    /// passed; a keep-alive connection idle for `idle_timeout_ms` is closed.
    pub header_timeout_ms: u64,
    pub body_timeout_ms: u64,
    pub body_min_bytes_per_second: u64,
    pub idle_timeout_ms: u64,
    /// Open connections (beyond it the gateway stops accepting until one closes), and body
    /// bytes received but not yet handled, across all requests (beyond it: 503 with
    /// Retry-After; default: four times `max_message_bytes`) and from each source address
    /// (default: one whole message and 64 KiB).
    pub max_connections: usize,
    pub max_body_bytes_in_flight: Option<usize>,
    pub max_body_bytes_in_flight_per_source: Option<usize>,
    /// Requests being handled, per class (`http::serve::classes`; beyond it: 503 with
    /// Retry-After): partners' (`/wsr`), applications' (`/api/v1`), waiting ones (fetches and
    /// event streams), operators' (console, metrics, the admin-only API).
    pub max_requests_in_flight: usize,
    pub max_api_requests_in_flight: usize,
    pub max_waiting_requests: usize,
    pub max_operator_requests_in_flight: usize,
    /// Each source address's share of every class (beyond it: 429 with Retry-After).
    pub max_requests_in_flight_per_source: usize,
    /// TLS handshakes one source address (its /64 for IPv6) may have in progress at once;
    /// beyond it a new connection is closed before its handshake starts. Trusted proxies
    /// are not counted.
    pub max_tls_handshakes_per_source: usize,
    /// First and longest wait between callback attempts (doubling in between) (D10).
    pub callback_retry_initial_ms: u64,
    pub callback_retry_max_ms: u64,
    pub channels: Vec<ChannelConfig>,
    pub tokens: Vec<TokenConfig>,
    /// Callback endpoints registered at start (more can be added over the admin API).
    pub callback_endpoints: Vec<String>,
    /// Where partners reach us, for the ReplyTo of our Callback-pattern messages
    /// (`{public_url}/wsr/_callback`); default: the listen address.
    pub public_url: Option<String>,
    /// Partners (D14): `[partners.NAME]` tables (`partners::PartnerConfig`), or the old
    /// `NAME = "URL"` form (a destination only).
    pub partners: BTreeMap<String, toml::Value>,
    /// Whether anonymous channels and anonymous callbacks are allowed on a listener that is
    /// not loopback. Off: the gateway refuses to start with one (D14).
    pub allow_anonymous_beyond_loopback: bool,
    /// HTTPS on the listener.
    pub tls: Option<TlsFileConfig>,
    /// A reverse proxy in front that terminates TLS: which peers are trusted to say, in
    /// which headers, who the client is.
    pub trusted_proxy: Option<TrustedProxyConfig>,
    /// Sending: whether a submission may name a URL instead of a configured partner (D15).
    /// Off by default: any produce token could otherwise make the gateway POST anywhere.
    pub allow_url_destinations: bool,
    /// Sending: internal addresses URL destinations may still use (loopback, private,
    /// link-local, … are refused otherwise): `"10.0.0.0/8"`, `"127.0.0.1:9000"`,
    /// `"[::1]:9000"`, `"partner.internal"`, `"localhost:9000"`.
    pub allowed_destination_hosts: Vec<String>,
    pub agreements: BTreeMap<String, AgreementSpec>,
    pub default_agreement: AgreementSpec,
    /// Sending: messages of one ordered group in flight at once.
    pub send_window: u64,
    /// Sending: how often Poll-pattern messages are polled for.
    pub poll_interval_ms: u64,
    /// How long after its ExpiryTime a message that may have been delivered (sent, never
    /// acknowledged) is polled for before it fails as "delivery unknown".
    pub resolve_in_doubt_seconds: u64,
    /// How long our partners keep delivered IDs after their messages expire (a wsr-gateway:
    /// `delivered_id_retention_seconds`). Only within it does a poll answer that does not name
    /// a message prove it was not delivered; 0 (the default, for partners that may forget IDs
    /// at expiry as WS-R allows): it proves nothing.
    pub partner_id_retention_seconds: u64,
    /// Delivery: webhooks push subscriptions may use, registered at start (more over the API).
    pub push_endpoints: Vec<String>,
    /// Delivery: a consumer session's TTL when it does not ask for one.
    pub session_ttl_ms: u64,
    /// Delivery: most payload bytes one fetch answers with (its first message is handed out
    /// whatever its size), so that an answer's memory does not grow with `max`.
    pub max_fetch_bytes: usize,
    /// Delivery: most payload bytes one push subscription has in flight to its webhook (one
    /// message at a time goes out whatever its size), beside its `push_concurrency`.
    pub max_push_bytes_in_flight: usize,
    /// Delivery: most subscriptions one principal may own (each keeps every matching message),
    /// and most sessions one subscription may have at once; beyond them: 429.
    pub max_subscriptions_per_principal: usize,
    pub max_sessions_per_subscription: usize,
    /// Delivery: how long an ephemeral subscription outlives its last member.
    pub ephemeral_grace_ms: u64,
    /// Delivery: how long a message no subscription needs any more stays in the inbox
    /// (counted from its arrival).
    pub inbox_retention_seconds: u64,
    /// `serve`'s log lines: "text" (default) or "json" (one object per line).
    pub log_format: String,
    /// How long the audit trail of operators' actions keeps an entry, in days (1 to 36 500).
    pub audit_retention_days: u64,
    /// Traces: the OTLP/HTTP collector's traces URL (e.g. `http://collector:4318/v1/traces`).
    /// Unset (the default): no spans are exported and nothing is contacted.
    pub otlp_endpoint: Option<String>,
    /// Traces: `http/protobuf` (default) or `http/json`.
    pub otlp_protocol: String,
    /// When set, `/metrics` answers only `Authorization: Bearer <metrics_token>` (at least 16
    /// characters); unset, anyone who reaches the listener may scrape it, as `/healthz`.
    pub metrics_token: Option<String>,
}

impl Default for FileConfig {
    fn default() -> Self {
        FileConfig {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 8080)),
            database: "data/wsr-gateway.db".to_owned(),
            durability: "full".into(),
            clock_skew_seconds: 0,
            delivered_id_retention_seconds: 3600,
            max_expiry_horizon_seconds: DEFAULT_HORIZON_SECONDS,
            max_group_lifetime_seconds: DEFAULT_HORIZON_SECONDS,
            default_group_idle: "P1D".into(),
            max_open_groups_per_source: 10_000,
            max_answer_bytes_per_source: 256 * 1024 * 1024,
            max_stored_bytes_per_source: SourceQuota::DEFAULT.max_stored_bytes,
            max_messages_per_second_per_source: SourceQuota::DEFAULT.max_messages_per_second,
            buffer_max_messages: 1000,
            buffer_max_bytes: 64 * 1024 * 1024,
            hold_ms: 1000,
            max_message_bytes: 16 * 1024 * 1024,
            max_poll_references: Limits::default().max_references,
            header_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
            body_min_bytes_per_second: 1024,
            idle_timeout_ms: 60_000,
            max_connections: 1024,
            max_requests_in_flight: 512,
            max_api_requests_in_flight: 256,
            max_waiting_requests: 256,
            max_operator_requests_in_flight: 64,
            max_requests_in_flight_per_source: 128,
            max_tls_handshakes_per_source: 32,
            max_body_bytes_in_flight: None,
            max_body_bytes_in_flight_per_source: None,
            callback_retry_initial_ms: 1000,
            callback_retry_max_ms: 60_000,
            channels: Vec::new(),
            tokens: Vec::new(),
            callback_endpoints: Vec::new(),
            public_url: None,
            partners: BTreeMap::new(),
            allow_anonymous_beyond_loopback: false,
            tls: None,
            trusted_proxy: None,
            allow_url_destinations: false,
            allowed_destination_hosts: Vec::new(),
            agreements: BTreeMap::new(),
            default_agreement: AgreementSpec::default(),
            send_window: 8,
            poll_interval_ms: 5000,
            resolve_in_doubt_seconds: crate::rmp::sender::RESOLVE_FOR.as_secs(),
            partner_id_retention_seconds: 0,
            push_endpoints: Vec::new(),
            session_ttl_ms: 30_000,
            max_fetch_bytes: 8 * 1024 * 1024,
            max_push_bytes_in_flight: 32 * 1024 * 1024,
            max_subscriptions_per_principal: 100,
            max_sessions_per_subscription: 100,
            ephemeral_grace_ms: 60_000,
            inbox_retention_seconds: 86_400,
            log_format: "text".into(),
            metrics_token: None,
            audit_retention_days: 400,
            otlp_endpoint: None,
            otlp_protocol: "http/protobuf".into(),
        }
    }
}
