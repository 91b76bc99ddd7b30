//! Gateway settings: a TOML file (optional) and `WSR_*` environment overrides, checked once at
//! start into the values the rest of the gateway uses. With no file at all the gateway serves
//! channel `default` (every feature offered) on 127.0.0.1:8080 with SQLite under `./data/`.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::Deserialize;

use std::collections::BTreeSet;

use crate::endpoint::check_endpoint;
use crate::outbound::destination::DestinationRules;
use crate::partners::{PartnerConfig, Partners, address_only};
use crate::rmp::agreement::{Agreement, Feature, SendTerms};
use crate::rmp::group::Policy;
use crate::secrets::{Stored, Verifier, load_secret, relative_to};
use crate::store::{Database, Durability};
use crate::wsr::Limits;
use crate::wsr::datetime::XsDuration;

/// The longest of the sender's and receiver's retention settings (30 days).
const MAX_SECONDS: u64 = 30 * 86_400;

/// The default horizon of every channel: how far ahead an ExpiryTime, a `groupExpiryTime` or
/// a `groupMaxIdleDuration` may reach (D13). Anything further is refused on arrival.
const DEFAULT_HORIZON_SECONDS: u64 = 30 * 86_400;

/// The largest horizon an operator may configure (about 10 years): far inside chrono's range,
/// so no arithmetic on an accepted date can overflow.
const MAX_HORIZON_SECONDS: u64 = 3_660 * 86_400;

/// Variables of the client commands (`send`, `status`, `bench`, the operator commands) and
/// `serve`'s own `--config`: not gateway settings, so `serve` ignores them.
pub const CLIENT_VARIABLES: &[&str] = &[
    "WSR_CONFIG",
    "WSR_API",
    "WSR_TOKEN",
    "WSR_BENCH_TOKEN",
    "WSR_BENCH_AUTHORIZATION",
];

/// Settings that are tables or lists of tables in the file: no environment variable sets them
/// (`WSR_ADMIN_TOKEN` adds one admin token).
const FILE_ONLY_SETTINGS: &[&str] = &[
    "channels",
    "tokens",
    "partners",
    "tls",
    "trusted_proxy",
    "agreements",
    "default_agreement",
];

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
    /// Open connections (beyond it the gateway stops accepting until one closes), requests
    /// being handled (beyond it: 503 with Retry-After) and body bytes received but not yet
    /// handled, across all requests (beyond it: 503 with Retry-After; default: twice
    /// `max_message_bytes`).
    pub max_connections: usize,
    pub max_requests_in_flight: usize,
    pub max_body_bytes_in_flight: Option<usize>,
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
    /// Delivery: how long an ephemeral subscription outlives its last member.
    pub ephemeral_grace_ms: u64,
    /// Delivery: how long a message no subscription needs any more stays in the inbox
    /// (counted from its arrival).
    pub inbox_retention_seconds: u64,
    /// `serve`'s log lines: "text" (default) or "json" (one object per line).
    pub log_format: String,
    /// When set, `/metrics` answers only `Authorization: Bearer <metrics_token>` (at least 16
    /// characters); unset, anyone who reaches the listener may scrape it, as `/healthz`.
    pub metrics_token: Option<String>,
}

/// How our own messages are sent (DESIGN §6): named in the config or given inline per
/// submission. Fields left out come from `default_agreement`, then from the built-in defaults
/// (acknowledged, duplicate elimination, Response, one hour, 8 attempts 2 s apart doubling).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgreementSpec {
    pub ack_requested: Option<bool>,
    pub duplicate_elimination: Option<bool>,
    pub message_order: Option<bool>,
    /// "Response", "Callback" or "Poll".
    pub reply_pattern: Option<String>,
    /// ExpiryTime = submission time + this.
    pub expiry_seconds: Option<u64>,
    /// Either max_attempts + interval_ms + backoff, or an explicit list of waits.
    pub max_attempts: Option<u32>,
    pub interval_ms: Option<u64>,
    pub backoff: Option<u32>,
    pub waits_ms: Option<Vec<u64>>,
}

impl AgreementSpec {
    /// The terms as given, for the sending rule to combine and check.
    pub fn into_terms(self) -> SendTerms {
        SendTerms {
            ack_requested: self.ack_requested,
            duplicate_elimination: self.duplicate_elimination,
            message_order: self.message_order,
            reply_pattern: self.reply_pattern,
            expiry_seconds: self.expiry_seconds,
            max_attempts: self.max_attempts,
            interval_ms: self.interval_ms,
            backoff: self.backoff,
            waits_ms: self.waits_ms,
        }
    }
}

/// `[tls]`: the listener's certificate and, for mutual TLS, the CA of partners' client
/// certificates. The files are read again on SIGHUP and when they change.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFileConfig {
    /// PEM certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM CA bundle: client certificates are asked for and, when sent, must chain to it
    /// (or be pinned by a partner's `cert_sha256`). Without it no client certificate is asked.
    pub client_ca_file: Option<PathBuf>,
    /// How often the files are checked for a change (default 10 s; 0: only on SIGHUP).
    #[serde(default = "default_tls_reload_seconds")]
    pub reload_check_seconds: u64,
}

fn default_tls_reload_seconds() -> u64 {
    10
}

/// `[trusted_proxy]`: requests whose TCP peer is one of `addresses` may say who the client is.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustedProxyConfig {
    /// IP addresses or CIDR blocks of the proxies (`"10.0.0.5"`, `"10.1.0.0/16"`).
    pub addresses: Vec<String>,
    /// The header carrying the client's verified certificate as URL-encoded PEM (nginx
    /// `$ssl_client_escaped_cert`); a certificate there counts as chain-verified by the proxy.
    pub client_cert_header: Option<String>,
    /// The header carrying the client's address (`X-Forwarded-For`: its last entry, the one
    /// the proxy added, is taken).
    pub peer_address_header: Option<String>,
    /// The header carrying the host the client asked for (`X-Forwarded-Host`), for a proxy
    /// that rewrites `Host`: the console's same-origin check compares against it.
    pub host_header: Option<String>,
}

/// `[trusted_proxy]`, checked.
#[derive(Debug, Clone)]
pub struct TrustedProxy {
    /// (network, prefix length).
    pub networks: Vec<(std::net::IpAddr, u8)>,
    pub client_cert_header: Option<axum::http::HeaderName>,
    pub peer_address_header: Option<axum::http::HeaderName>,
    pub host_header: Option<axum::http::HeaderName>,
}

impl TrustedProxy {
    fn check(c: TrustedProxyConfig) -> anyhow::Result<TrustedProxy> {
        if c.addresses.is_empty() {
            bail!("trusted_proxy.addresses: name at least one proxy");
        }
        let networks = c
            .addresses
            .iter()
            .map(|a| {
                crate::outbound::destination::parse_network(a).with_context(|| {
                    format!("trusted_proxy.addresses: {a:?} is not an IP address or CIDR block")
                })
            })
            .collect::<anyhow::Result<_>>()?;
        let header = |key: &str, name: &Option<String>| {
            name.as_deref()
                .map(|n| {
                    axum::http::HeaderName::try_from(n)
                        .with_context(|| format!("trusted_proxy.{key}: {n:?} is not a header name"))
                })
                .transpose()
        };
        Ok(TrustedProxy {
            networks,
            client_cert_header: header("client_cert_header", &c.client_cert_header)?,
            peer_address_header: header("peer_address_header", &c.peer_address_header)?,
            host_header: header("host_header", &c.host_header)?,
        })
    }

    /// Whether `ip` is one of the proxies.
    pub fn trusts(&self, ip: std::net::IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.networks
            .iter()
            .any(|(net, prefix)| crate::outbound::destination::in_net(ip, *net, *prefix))
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelConfig {
    pub name: String,
    /// Whether requests without credentials may post here. Unset: only on a loopback
    /// listener, and only while no partner lists the channel (as the built-in `default`
    /// channel); `false`: never.
    #[serde(default)]
    pub anonymous: Option<bool>,
    /// Features offered; absent = all.
    pub offers: Option<Vec<String>>,
    #[serde(default)]
    pub requires: Vec<String>,
    /// Overrides the top-level `max_expiry_horizon_seconds` for this channel.
    pub max_expiry_horizon_seconds: Option<u64>,
    /// Overrides the top-level `max_group_lifetime_seconds` for this channel.
    pub max_group_lifetime_seconds: Option<u64>,
}

/// An API token: inline (`token`), in a file or an environment variable (`token_file`,
/// `token_env`), or only its hash (`token_hash`: PHC from `hash-secret`; `token_sha256`).
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    #[serde(default)]
    pub token_env: Option<String>,
    #[serde(default)]
    pub token_hash: Option<String>,
    #[serde(default)]
    pub token_sha256: Option<String>,
    pub principal: String,
    pub scopes: Vec<Scope>,
    /// The topics this token may consume, as MQTT-style filters (`orders/#`): it may create,
    /// join and fetch only subscriptions whose filter lies within them. Default `["#"]`.
    #[serde(default = "all_topics")]
    pub topics: Vec<String>,
}

impl ApiToken {
    /// A token kept as given, as tests use them.
    pub fn plain(token: &str, principal: &str, scopes: Vec<Scope>) -> ApiToken {
        ApiToken {
            secret: Stored::Plain(crate::secrets::Secret::new(token)),
            principal: principal.to_owned(),
            scopes,
            topics: all_topics(),
        }
    }
}

impl TokenConfig {
    /// A token given inline, as tests and `WSR_ADMIN_TOKEN` do.
    pub fn plain(token: &str, principal: &str, scopes: Vec<Scope>) -> TokenConfig {
        TokenConfig {
            token: Some(token.to_owned()),
            principal: principal.to_owned(),
            scopes,
            topics: all_topics(),
            ..TokenConfig::default()
        }
    }
}

/// A checked API token.
#[derive(Debug, Clone)]
pub struct ApiToken {
    pub secret: Stored,
    pub principal: String,
    pub scopes: Vec<Scope>,
    pub topics: Vec<String>,
}

/// Every topic: the allow-list of a token that names none.
pub fn all_topics() -> Vec<String> {
    vec!["#".to_owned()]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    #[default]
    Admin,
    Produce,
    Consume,
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
            max_body_bytes_in_flight: None,
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
            ephemeral_grace_ms: 60_000,
            inbox_retention_seconds: 86_400,
            log_format: "text".into(),
            metrics_token: None,
        }
    }
}

/// The checked settings.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub database: Database,
    pub durability: Durability,
    pub policy: Policy,
    pub hold: Duration,
    pub limits: Limits,
    pub perimeter: Perimeter,
    pub callback_retry_initial: Duration,
    pub callback_retry_max: Duration,
    pub channels: BTreeMap<String, Agreement>,
    /// Channels requests without credentials may post to.
    pub anonymous_channels: BTreeSet<String>,
    /// Whether `/wsr/_callback` takes acks without credentials (for messages to partners
    /// that have none): on a loopback listener, or where the operator allows it.
    pub anonymous_callbacks: bool,
    pub tokens: Vec<ApiToken>,
    /// Checks presented secrets against hashed ones (API tokens, partners), with one cache.
    pub verifier: Verifier,
    pub callback_endpoints: Vec<String>,
    pub public_url: Option<String>,
    pub partners: Partners,
    pub tls: Option<TlsFileConfig>,
    pub trusted_proxy: Option<TrustedProxy>,
    /// `allow_url_destinations` and `allowed_destination_hosts`, checked.
    pub destinations: DestinationRules,
    /// The named agreements and the default one, as the sending rule takes them.
    pub agreements: BTreeMap<String, SendTerms>,
    pub default_agreement: SendTerms,
    pub send_window: u64,
    pub poll_interval: Duration,
    pub resolve_in_doubt: Duration,
    pub partner_id_retention: Duration,
    pub delivery: DeliverySettings,
    pub log_format: LogFormat,
    /// The bearer token `/metrics` requires, if any.
    pub metrics_token: Option<crate::secrets::Secret>,
}

/// How `serve` writes its log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    /// One JSON object per line, with the fields of the spans it happened in (`request_id`).
    Json,
}

/// Timeouts and caps of the HTTP listener (D13); see `FileConfig` for their meaning.
#[derive(Debug, Clone)]
pub struct Perimeter {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub body_min_bytes_per_second: u64,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub max_requests_in_flight: usize,
    pub max_body_bytes_in_flight: usize,
}

/// Settings of delivery to applications (DESIGN §5).
#[derive(Debug, Clone)]
pub struct DeliverySettings {
    pub push_endpoints: Vec<String>,
    pub session_ttl: chrono::Duration,
    pub ephemeral_grace: chrono::Duration,
    pub inbox_retention: chrono::Duration,
}

impl Default for Config {
    fn default() -> Self {
        FileConfig::default()
            .check(None)
            .unwrap_or_else(|e| unreachable!("the built-in defaults are valid: {e}"))
    }
}

impl Config {
    /// Reads the file (if any), applies `WSR_*` overrides from `env`, checks the result.
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> anyhow::Result<Config> {
        let mut file = match path {
            None => FileConfig::default(),
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("cannot read config file {}", p.display()))?;
                toml::from_str(&text)
                    .with_context(|| format!("invalid config file {}", p.display()))?
            }
        };
        for (key, value) in env {
            file.apply_env(&key, &value)
                .with_context(|| format!("invalid environment override {key}"))?;
        }
        // Relative `…_file` paths are read from the config file's folder.
        let base = path
            .and_then(Path::parent)
            .filter(|d| !d.as_os_str().is_empty());
        file.check(base)
    }

    /// What `check-config` reports: where the gateway would listen and keep its data, and
    /// how many of each thing it would serve; never a secret.
    pub fn summary(&self) -> String {
        let channels: Vec<&str> = self.channels.keys().map(String::as_str).collect();
        format!(
            "listen {}\ndatabase {} (durability {})\nchannels {}\npartners {}\napi tokens {}",
            self.listen,
            self.database,
            match self.durability {
                Durability::Full => "full",
                Durability::Os => "os",
            },
            channels.join(", "),
            self.partners.iter().count(),
            self.tokens.len(),
        )
    }

    /// A configuration for tests: port 0, the given database, defaults otherwise.
    pub fn for_tests(database: PathBuf) -> Config {
        Config {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            database: Database::Sqlite(database),
            ..Config::default()
        }
    }
}

impl FileConfig {
    fn apply_env(&mut self, key: &str, value: &str) -> anyhow::Result<()> {
        match key {
            "WSR_LISTEN" => self.listen = value.parse()?,
            "WSR_DATABASE" => self.database = value.to_owned(),
            "WSR_DURABILITY" => self.durability = value.to_owned(),
            "WSR_HOLD_MS" => self.hold_ms = value.parse()?,
            "WSR_CLOCK_SKEW_SECONDS" => self.clock_skew_seconds = value.parse()?,
            "WSR_DELIVERED_ID_RETENTION_SECONDS" => {
                self.delivered_id_retention_seconds = value.parse()?
            }
            "WSR_DEFAULT_GROUP_IDLE" => self.default_group_idle = value.to_owned(),
            "WSR_MAX_EXPIRY_HORIZON_SECONDS" => self.max_expiry_horizon_seconds = value.parse()?,
            "WSR_MAX_GROUP_LIFETIME_SECONDS" => self.max_group_lifetime_seconds = value.parse()?,
            "WSR_MAX_MESSAGE_BYTES" => self.max_message_bytes = value.parse()?,
            "WSR_MAX_OPEN_GROUPS_PER_SOURCE" => self.max_open_groups_per_source = value.parse()?,
            "WSR_MAX_POLL_REFERENCES" => self.max_poll_references = value.parse()?,
            "WSR_HEADER_TIMEOUT_MS" => self.header_timeout_ms = value.parse()?,
            "WSR_BODY_TIMEOUT_MS" => self.body_timeout_ms = value.parse()?,
            "WSR_BODY_MIN_BYTES_PER_SECOND" => self.body_min_bytes_per_second = value.parse()?,
            "WSR_IDLE_TIMEOUT_MS" => self.idle_timeout_ms = value.parse()?,
            "WSR_MAX_CONNECTIONS" => self.max_connections = value.parse()?,
            "WSR_MAX_REQUESTS_IN_FLIGHT" => self.max_requests_in_flight = value.parse()?,
            "WSR_MAX_BODY_BYTES_IN_FLIGHT" => self.max_body_bytes_in_flight = Some(value.parse()?),
            "WSR_ADMIN_TOKEN" => {
                self.tokens
                    .push(TokenConfig::plain(value, "admin", vec![Scope::Admin]))
            }
            "WSR_ALLOW_ANONYMOUS_BEYOND_LOOPBACK" => {
                self.allow_anonymous_beyond_loopback = value.parse()?
            }
            "WSR_CALLBACK_ENDPOINTS" => self.callback_endpoints.extend(url_list(value)),
            "WSR_PUSH_ENDPOINTS" => self.push_endpoints.extend(url_list(value)),
            "WSR_LOG_FORMAT" => self.log_format = value.to_owned(),
            "WSR_METRICS_TOKEN" => self.metrics_token = Some(value.to_owned()),
            "WSR_INBOX_RETENTION_SECONDS" => self.inbox_retention_seconds = value.parse()?,
            "WSR_ALLOW_URL_DESTINATIONS" => self.allow_url_destinations = value.parse()?,
            "WSR_ALLOWED_DESTINATION_HOSTS" => {
                self.allowed_destination_hosts.extend(url_list(value))
            }
            "WSR_BUFFER_MAX_MESSAGES" => self.buffer_max_messages = value.parse()?,
            "WSR_BUFFER_MAX_BYTES" => self.buffer_max_bytes = value.parse()?,
            "WSR_CALLBACK_RETRY_INITIAL_MS" => self.callback_retry_initial_ms = value.parse()?,
            "WSR_CALLBACK_RETRY_MAX_MS" => self.callback_retry_max_ms = value.parse()?,
            "WSR_PUBLIC_URL" => self.public_url = Some(value.to_owned()),
            "WSR_SEND_WINDOW" => self.send_window = value.parse()?,
            "WSR_POLL_INTERVAL_MS" => self.poll_interval_ms = value.parse()?,
            "WSR_RESOLVE_IN_DOUBT_SECONDS" => self.resolve_in_doubt_seconds = value.parse()?,
            "WSR_PARTNER_ID_RETENTION_SECONDS" => {
                self.partner_id_retention_seconds = value.parse()?
            }
            "WSR_SESSION_TTL_MS" => self.session_ttl_ms = value.parse()?,
            "WSR_EPHEMERAL_GRACE_MS" => self.ephemeral_grace_ms = value.parse()?,
            // The client commands' own variables: `export WSR_TOKEN=…` for `send` must not stop
            // a later `serve` in the same shell.
            client if CLIENT_VARIABLES.contains(&client) => {}
            table
                if FILE_ONLY_SETTINGS.contains(
                    &table
                        .trim_start_matches("WSR_")
                        .to_ascii_lowercase()
                        .as_str(),
                ) =>
            {
                bail!("{table}: this setting is a table; set it in the config file")
            }
            other if other.starts_with("WSR_") => {
                bail!("unknown setting {other}; see README for the WSR_* variables")
            }
            _ => {}
        }
        Ok(())
    }

    fn check(self, base: Option<&Path>) -> anyhow::Result<Config> {
        let log_format = match self.log_format.as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => bail!("log_format must be \"text\" or \"json\", not {other:?}"),
        };
        let metrics_token = match self.metrics_token {
            // Compared as given, like an inline API token: short ones are guessable.
            Some(t) if t.len() < 16 => bail!("metrics_token is shorter than 16 characters"),
            other => other.map(crate::secrets::Secret::new),
        };
        let durability = match self.durability.as_str() {
            "full" => Durability::Full,
            "os" => Durability::Os,
            other => bail!("durability must be \"full\" or \"os\", not {other:?}"),
        };
        let default_idle = XsDuration::parse(&self.default_group_idle)
            .map_err(|e| anyhow::anyhow!("default_group_idle: {e}"))?;
        if default_idle.negative || default_idle.is_zero() {
            bail!("default_group_idle must be positive");
        }
        if self.max_open_groups_per_source == 0 {
            bail!("max_open_groups_per_source must be at least 1");
        }
        let horizon = |key: &str, seconds: u64| -> anyhow::Result<chrono::Duration> {
            if seconds == 0 || seconds > MAX_HORIZON_SECONDS {
                bail!("{key} must be between 1 and {MAX_HORIZON_SECONDS}");
            }
            Ok(chrono::Duration::seconds(seconds as i64))
        };
        let expiry_horizon = horizon(
            "max_expiry_horizon_seconds",
            self.max_expiry_horizon_seconds,
        )?;
        let group_lifetime = horizon(
            "max_group_lifetime_seconds",
            self.max_group_lifetime_seconds,
        )?;
        // The default idle limit is added to every group's last activity: keep it a horizon.
        let epoch = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH;
        let longest = epoch + chrono::Duration::seconds(MAX_HORIZON_SECONDS as i64);
        if default_idle.add_to(epoch).is_none_or(|end| end > longest) {
            bail!("default_group_idle must be at most {MAX_HORIZON_SECONDS} seconds");
        }
        let mut channels = BTreeMap::new();
        let mut anonymous_channels = BTreeSet::new();
        let loopback = self.listen.ip().is_loopback();
        for c in &self.channels {
            if c.anonymous == Some(true) {
                anonymous_channels.insert(c.name.clone());
            }
            // No '%': the guard matches the path as sent, and no escape may name a channel.
            if c.name.is_empty() || c.name.starts_with('_') || c.name.contains(['/', '%']) {
                bail!(
                    "channel name {:?} is not allowed (empty, '/', '%', or a leading '_')",
                    c.name
                );
            }
            let features = |names: &[String]| -> anyhow::Result<Vec<Feature>> {
                names
                    .iter()
                    .map(|n| {
                        Feature::parse(n).ok_or_else(|| {
                            anyhow::anyhow!("channel {}: unknown feature {n:?}", c.name)
                        })
                    })
                    .collect()
            };
            let agreement = Agreement {
                offers: match &c.offers {
                    None => Feature::ALL.to_vec(),
                    Some(names) => features(names)?,
                },
                requires: features(&c.requires)?,
                expiry_horizon: match c.max_expiry_horizon_seconds {
                    None => expiry_horizon,
                    Some(s) => horizon(
                        &format!("channel {}: max_expiry_horizon_seconds", c.name),
                        s,
                    )?,
                },
                group_lifetime: match c.max_group_lifetime_seconds {
                    None => group_lifetime,
                    Some(s) => horizon(
                        &format!("channel {}: max_group_lifetime_seconds", c.name),
                        s,
                    )?,
                },
            };
            if let Some(f) = agreement
                .requires
                .iter()
                .find(|f| !agreement.offers.contains(f))
            {
                bail!(
                    "channel {} requires {} but does not offer it",
                    c.name,
                    f.name()
                );
            }
            if channels.insert(c.name.clone(), agreement).is_some() {
                bail!("channel {} is defined twice", c.name);
            }
        }
        if channels.is_empty() {
            channels.insert(
                "default".to_owned(),
                Agreement {
                    expiry_horizon,
                    group_lifetime,
                    ..Agreement::everything()
                },
            );
            // Anyone who can reach a loopback listener is on this machine already; beyond
            // it, the built-in channel takes nobody until partners or `anonymous` say so.
            if loopback || self.allow_anonymous_beyond_loopback {
                anonymous_channels.insert("default".to_owned());
            }
        }
        if !loopback
            && !self.allow_anonymous_beyond_loopback
            && let Some(c) = anonymous_channels.first()
        {
            bail!(
                "channel {c} is anonymous but the listener {} is not loopback: give its \
                 partners credentials, or set allow_anonymous_beyond_loopback = true",
                self.listen
            );
        }
        let verifier = Verifier::default();
        let mut tokens = Vec::new();
        for t in self.tokens {
            let who = format!("token of {}", t.principal);
            let inline = load_secret(
                &who,
                base,
                t.token.as_deref(),
                t.token_file.as_deref(),
                t.token_env.as_deref(),
            )?;
            let secret = match (inline, &t.token_hash, &t.token_sha256) {
                (Some(secret), None, None) => {
                    if secret.expose().len() < 16 {
                        bail!("{who} is shorter than 16 characters");
                    }
                    Stored::Plain(secret)
                }
                (None, Some(phc), None) => Stored::hash(&format!("{who}: token_hash"), phc)?,
                (None, None, Some(hex)) => Stored::sha256(&format!("{who}: token_sha256"), hex)?,
                _ => bail!(
                    "{who}: give exactly one of token, token_file, token_env, token_hash, \
                     token_sha256"
                ),
            };
            for topic in &t.topics {
                crate::delivery::filter::Filter::parse(topic)
                    .map_err(|e| anyhow::anyhow!("{who}: topics: {e}"))?;
            }
            tokens.push(ApiToken {
                secret,
                principal: t.principal,
                scopes: t.scopes,
                topics: t.topics,
            });
        }
        let channel_names: BTreeSet<String> = channels.keys().cloned().collect();
        let mut partners = Vec::new();
        for (name, value) in self.partners {
            let partner = match value {
                toml::Value::String(url) => {
                    check_endpoint(&url).with_context(|| format!("partners: {name}"))?;
                    address_only(&name, url)
                }
                table @ toml::Value::Table(_) => table
                    .try_into::<PartnerConfig>()
                    .with_context(|| format!("partners.{name}"))?
                    .check(&name, base, &channel_names)?,
                _ => bail!("partners.{name}: give a URL or a [partners.{name}] table"),
            };
            if let Some(agreement) = &partner.outbound.agreement
                && !self.agreements.contains_key(agreement)
            {
                bail!("partner {name}: agreement: there is no agreement {agreement:?}");
            }
            partners.push(partner);
        }
        let explicit: BTreeMap<&str, Option<bool>> = self
            .channels
            .iter()
            .map(|c| (c.name.as_str(), c.anonymous))
            .collect();
        for name in channels.keys() {
            let listed = partners.iter().any(|p| p.inbound.channels.contains(name));
            if anonymous_channels.contains(name) || listed {
                continue;
            }
            // A configured channel no partner lists, on a listener only this machine
            // reaches, takes anyone here, as the built-in channel does (and as every channel
            // did before partners existed). Beyond loopback it would take no one: a mistake.
            if loopback && explicit.get(name.as_str()) == Some(&None) {
                anonymous_channels.insert(name.clone());
                continue;
            }
            let beyond = if loopback {
                ""
            } else {
                "; a channel no partner lists is anonymous only on a loopback listener, and \
                 this one listens beyond it"
            };
            bail!(
                "channel {name} takes no one: it is not anonymous and no partner lists it in \
                 its channels{beyond} (add a partner for it, or make it anonymous with \
                 anonymous = true and allow_anonymous_beyond_loopback = true)"
            );
        }
        let partners = Partners::new(partners, verifier.clone());
        let urls = (self
            .callback_endpoints
            .iter()
            .map(|u| ("callback_endpoints", u)))
        .chain(self.push_endpoints.iter().map(|u| ("push_endpoints", u)));
        for (field, url) in urls {
            check_endpoint(url).with_context(|| field.to_owned())?;
        }
        let trusted_proxy = self.trusted_proxy.map(TrustedProxy::check).transpose()?;
        let tls = self.tls.map(|t| TlsFileConfig {
            cert_file: relative_to(base, &t.cert_file),
            key_file: relative_to(base, &t.key_file),
            client_ca_file: t.client_ca_file.map(|p| relative_to(base, &p)),
            reload_check_seconds: t.reload_check_seconds,
        });
        let destinations =
            DestinationRules::new(self.allow_url_destinations, &self.allowed_destination_hosts)
                .map_err(|e| anyhow::anyhow!("allowed_destination_hosts: {e}"))?;
        let agreements: BTreeMap<String, SendTerms> = self
            .agreements
            .into_iter()
            .map(|(name, spec)| (name, spec.into_terms()))
            .collect();
        let default_agreement = self.default_agreement.into_terms();
        let named = agreements
            .iter()
            .map(|(n, t)| (n.as_str(), t.over(&default_agreement)));
        for (name, terms) in named.chain([("default_agreement", default_agreement.clone())]) {
            terms
                .check()
                .map_err(|(field, why)| anyhow::anyhow!("agreement {name}: {field}: {why}"))?;
        }
        if self.max_connections == 0 || self.max_requests_in_flight == 0 {
            bail!("max_connections and max_requests_in_flight must be at least 1");
        }
        let body_budget = self
            .max_body_bytes_in_flight
            .unwrap_or(self.max_message_bytes.saturating_mul(2));
        // One whole message must fit, or the largest allowed message could never be received.
        if body_budget <= self.max_message_bytes {
            bail!("max_body_bytes_in_flight must be larger than max_message_bytes");
        }
        // A semaphore holds at most usize::MAX >> 3 permits; timeouts are clamped to 30 days
        // so that no deadline can overflow.
        let max_permits = usize::MAX >> 3;
        let perimeter = Perimeter {
            header_timeout: Duration::from_millis(
                self.header_timeout_ms.clamp(1, MAX_SECONDS * 1000),
            ),
            body_timeout: Duration::from_millis(self.body_timeout_ms.clamp(1, MAX_SECONDS * 1000)),
            body_min_bytes_per_second: self.body_min_bytes_per_second,
            idle_timeout: Duration::from_millis(self.idle_timeout_ms.clamp(1, MAX_SECONDS * 1000)),
            max_connections: self.max_connections.min(max_permits),
            max_requests_in_flight: self.max_requests_in_flight.min(max_permits),
            max_body_bytes_in_flight: body_budget.min(max_permits),
        };
        Ok(Config {
            listen: self.listen,
            database: Database::parse(&self.database),
            durability,
            policy: Policy {
                clock_skew: chrono::Duration::seconds(self.clock_skew_seconds.min(86_400) as i64),
                default_idle,
                buffer_max_messages: self.buffer_max_messages,
                buffer_max_bytes: self.buffer_max_bytes,
                max_open_groups_per_source: self.max_open_groups_per_source,
                answer_polls_for: chrono::Duration::seconds(
                    self.delivered_id_retention_seconds.min(MAX_SECONDS) as i64,
                ),
            },
            hold: Duration::from_millis(self.hold_ms),
            limits: Limits {
                max_bytes: self.max_message_bytes,
                max_references: self.max_poll_references.max(1),
                ..Limits::default()
            },
            perimeter,
            callback_retry_initial: Duration::from_millis(self.callback_retry_initial_ms.max(1)),
            callback_retry_max: Duration::from_millis(self.callback_retry_max_ms.max(1)),
            channels,
            anonymous_callbacks: loopback || self.allow_anonymous_beyond_loopback,
            anonymous_channels,
            tokens,
            verifier,
            callback_endpoints: self.callback_endpoints,
            public_url: self.public_url,
            partners,
            tls,
            trusted_proxy,
            destinations,
            agreements,
            default_agreement,
            send_window: self.send_window.max(1),
            poll_interval: Duration::from_millis(self.poll_interval_ms.max(10)),
            resolve_in_doubt: Duration::from_secs(self.resolve_in_doubt_seconds.min(MAX_SECONDS)),
            partner_id_retention: Duration::from_secs(
                self.partner_id_retention_seconds.min(MAX_SECONDS),
            ),
            delivery: DeliverySettings {
                push_endpoints: self.push_endpoints,
                session_ttl: millis(self.session_ttl_ms.max(1)),
                ephemeral_grace: millis(self.ephemeral_grace_ms),
                inbox_retention: millis(self.inbox_retention_seconds.saturating_mul(1000)),
            },
            log_format,
            metrics_token,
        })
    }
}

fn url_list(value: &str) -> impl Iterator<Item = String> + '_ {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

fn millis(ms: u64) -> chrono::Duration {
    chrono::Duration::milliseconds(ms.min(i64::MAX as u64 / 2) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::MAX_URL_BYTES;

    #[test]
    fn defaults_need_no_file() {
        let c = Config::load(None, []).expect("defaults");
        assert_eq!(c.listen.port(), 8080);
        assert_eq!(c.durability, Durability::Full);
        assert_eq!(c.channels.keys().collect::<Vec<_>>(), vec!["default"]);
        assert_eq!(c.channels["default"], Agreement::everything());
        assert_eq!(
            c.channels["default"].expiry_horizon,
            chrono::Duration::days(30),
            "the built-in channel has a horizon too"
        );
    }

    #[test]
    fn perimeter_defaults_overrides_and_checks() {
        let c = Config::load(None, []).expect("defaults");
        assert_eq!(c.perimeter.header_timeout, Duration::from_secs(10));
        assert_eq!(c.perimeter.idle_timeout, Duration::from_secs(60));
        assert_eq!(c.perimeter.max_connections, 1024);
        assert_eq!(c.perimeter.max_requests_in_flight, 512);
        assert_eq!(
            c.perimeter.max_body_bytes_in_flight,
            2 * c.limits.max_bytes,
            "twice the largest message by default"
        );
        let env = |k: &str, v: &str| [(k.to_owned(), v.to_owned())];
        let c = Config::load(None, env("WSR_HEADER_TIMEOUT_MS", "300")).expect("valid");
        assert_eq!(c.perimeter.header_timeout, Duration::from_millis(300));
        let c = Config::load(None, env("WSR_IDLE_TIMEOUT_MS", &u64::MAX.to_string()))
            .expect("clamped, not overflowing");
        assert_eq!(c.perimeter.idle_timeout, Duration::from_secs(MAX_SECONDS));
        assert!(Config::load(None, env("WSR_MAX_CONNECTIONS", "0")).is_err());
        assert!(Config::load(None, env("WSR_MAX_BODY_BYTES_IN_FLIGHT", "1000")).is_err());
    }

    /// Every setting of the file that is not a table has its `WSR_*` variable (README says
    /// any may be overridden), and the client commands' variables do not stop `serve`.
    #[test]
    fn every_plain_setting_has_a_variable() {
        let err = toml::from_str::<FileConfig>("no_such_setting = 1")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        let (_, expected) = err
            .split_once("expected one of")
            .expect("serde names the known fields");
        let fields: Vec<&str> = expected
            .split(',')
            .map(|f| {
                f.trim()
                    .trim_matches(|c: char| c == '`' || c.is_whitespace())
            })
            .filter(|f| !f.is_empty())
            .collect();
        assert!(fields.len() > 30, "{fields:?}");
        for field in fields {
            let variable = format!("WSR_{}", field.to_ascii_uppercase());
            let mut file = FileConfig::default();
            let answer = file.apply_env(&variable, "not a value of any kind");
            let said = answer.err().map(|e| format!("{e:#}")).unwrap_or_default();
            assert!(!said.contains("unknown setting"), "{variable}: {said}");
            if FILE_ONLY_SETTINGS.contains(&field) {
                assert!(said.contains("config file"), "{variable}: {said}");
            }
        }
        for client in CLIENT_VARIABLES {
            let env = [(
                client.to_string(),
                "http://127.0.0.1:1/ or a token".to_owned(),
            )];
            Config::load(None, env).expect("a client variable is not a gateway setting");
        }
        let env = [("WSR_SEND_WINDOW".to_owned(), "3".to_owned())];
        assert_eq!(Config::load(None, env).expect("valid").send_window, 3);
    }

    #[test]
    fn file_and_environment() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gw.toml");
        std::fs::write(
            &path,
            r#"
durability = "os"
[[channels]]
name = "orders"
anonymous = true
offers = ["AckRequested", "DuplicateElimination", "Response"]
requires = ["AckRequested"]
"#,
        )
        .expect("write config");
        let env = [
            ("WSR_LISTEN".to_owned(), "127.0.0.1:9999".to_owned()),
            ("WSR_ADMIN_TOKEN".to_owned(), "0123456789abcdef".to_owned()),
            ("HOME".to_owned(), "/root".to_owned()),
        ];
        let c = Config::load(Some(&path), env).expect("valid");
        assert_eq!(c.listen.port(), 9999);
        assert_eq!(c.durability, Durability::Os);
        assert_eq!(c.channels["orders"].requires, vec![Feature::AckRequested]);
        assert_eq!(c.tokens.len(), 1);
        assert_eq!(
            c.database,
            Database::Sqlite("data/wsr-gateway.db".into()),
            "SQLite by default"
        );
        let env = [(
            "WSR_DATABASE".to_owned(),
            "postgres://wsr@db.internal/wsr".to_owned(),
        )];
        let c = Config::load(Some(&path), env).expect("valid");
        assert_eq!(
            c.database,
            Database::Postgres("postgres://wsr@db.internal/wsr".into())
        );
    }

    #[test]
    fn partner_names_that_stand_for_no_partner_are_reserved() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gw.toml");
        for name in ["anonymous", "(none)", "(anonymous)"] {
            std::fs::write(
                &path,
                format!("[partners.\"{name}\"]\nchannels = [\"default\"]\nusername = \"u\"\n"),
            )
            .expect("write config");
            let err = Config::load(Some(&path), []).expect_err("reserved");
            assert!(
                format!("{err:#}").contains("is reserved"),
                "{name}: {err:#}"
            );
        }
    }

    #[test]
    fn anonymous_channels_only_on_loopback_unless_allowed() {
        let env = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>()
        };
        let c = Config::load(None, []).expect("loopback default");
        assert!(c.anonymous_channels.contains("default") && c.anonymous_callbacks);
        let outside = env(&[("WSR_LISTEN", "0.0.0.0:8080")]);
        let err = Config::load(None, outside.clone()).expect_err("no partner, not loopback");
        assert!(format!("{err:#}").contains("takes no one"), "{err:#}");
        let mut allowed = outside;
        allowed.push(("WSR_ALLOW_ANONYMOUS_BEYOND_LOOPBACK".into(), "true".into()));
        let c = Config::load(None, allowed).expect("the operator said so");
        assert!(c.anonymous_channels.contains("default") && c.anonymous_callbacks);

        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gw.toml");
        std::fs::write(
            &path,
            "listen = \"0.0.0.0:8080\"\n[[channels]]\nname = \"open\"\nanonymous = true\n",
        )
        .expect("write config");
        let err = Config::load(Some(&path), []).expect_err("anonymous beyond loopback");
        assert!(format!("{err:#}").contains("not loopback"), "{err:#}");
        // On loopback, a channel no partner lists takes anyone unless it says otherwise.
        for (text, anonymous) in [
            ("[[channels]]\nname = \"open\"\n", Some(true)),
            ("[[channels]]\nname = \"shut\"\nanonymous = false\n", None),
        ] {
            std::fs::write(&path, text).expect("write config");
            let loaded = Config::load(Some(&path), []);
            assert_eq!(
                loaded.ok().map(|c| c.anonymous_channels.contains("open")),
                anonymous,
                "{text}"
            );
        }
    }

    #[test]
    fn partners_in_both_forms() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gw.toml");
        std::fs::write(dir.path().join("our.pass"), "s3cret\n").expect("write secret");
        let hash = crate::secrets::hash_secret("pw").expect("hash");
        std::fs::write(
            &path,
            format!(
                r#"
listen = "0.0.0.0:8443"
[[channels]]
name = "orders"
[partners]
old = "https://old.example/wsr"
[partners.acme]
channels = ["orders"]
password_hash = "{hash}"
address = "https://acme.example/wsr/in"
send_window = 1
our_username = "us"
our_password_file = "our.pass"
"#
            ),
        )
        .expect("write config");
        let c = Config::load(Some(&path), []).expect("valid");
        assert!(c.anonymous_channels.is_empty() && !c.anonymous_callbacks);
        let old = c.partners.get("old").expect("old form");
        assert_eq!(
            old.outbound.address.as_deref(),
            Some("https://old.example/wsr")
        );
        assert!(!old.inbound.has_credentials());
        let acme = c.partners.get("acme").expect("table form");
        assert!(acme.inbound.channels.contains("orders"));
        assert_eq!(acme.outbound.send_window, Some(1));
        assert_eq!(
            acme.outbound.credentials.as_ref().map(|c| c.header()),
            Some(format!(
                "Basic {}",
                crate::partners::base64_encode(b"us:s3cret")
            )),
            "the secret file is read relative to the config file, newline dropped"
        );
        for bad in [
            "[partners.x]\nchannels = [\"nope\"]\n",
            "[partners.x]\nunknown_key = 1\n",
            "[partners]\nx = 3\n",
            "[partners.x]\nagreement = \"missing\"\n",
        ] {
            std::fs::write(&path, bad).expect("write config");
            assert!(Config::load(Some(&path), []).is_err(), "{bad}");
        }
    }

    #[test]
    fn api_tokens_may_be_hashes_files_or_variables() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gw.toml");
        let sha = crate::secrets::sha256_hex(b"a-long-random-token-0123");
        std::fs::write(dir.path().join("tok"), "token-from-a-file-0123\n").expect("write");
        std::fs::write(
            &path,
            format!(
                "[[tokens]]\ntoken_sha256 = \"{sha}\"\nprincipal = \"a\"\nscopes = [\"admin\"]\n\
                 [[tokens]]\ntoken_file = \"tok\"\nprincipal = \"b\"\nscopes = [\"admin\"]\n"
            ),
        )
        .expect("write config");
        let c = Config::load(Some(&path), []).expect("valid");
        assert!(matches!(c.tokens[0].secret, Stored::Sha256(_)));
        assert_eq!(
            c.tokens[1].secret,
            Stored::Plain(crate::secrets::Secret::new("token-from-a-file-0123"))
        );
        std::fs::write(
            &path,
            "[[tokens]]\ntoken = \"0123456789abcdef\"\ntoken_sha256 = \"00\"\nprincipal = \"a\"\nscopes = []\n",
        )
        .expect("write config");
        assert!(Config::load(Some(&path), []).is_err(), "two sources");
    }

    #[test]
    fn mistakes_are_refused_not_ignored() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gw.toml");
        for bad in [
            "listen_port = 1",
            "durability = \"sometimes\"",
            "[[channels]]\nname = \"x\"\noffers = [\"Telepathy\"]",
            "[[channels]]\nname = \"x\"\noffers = [\"Response\"]\nrequires = [\"Poll\"]",
            "default_group_idle = \"-P1D\"",
            "default_group_idle = \"P300000Y\"",
            "max_expiry_horizon_seconds = 0",
            "max_group_lifetime_seconds = 9223372036854775807",
            "[[channels]]\nname = \"x\"\nmax_expiry_horizon_seconds = 400000000",
            "allowed_destination_hosts = [\"10.0.0.0/40\"]",
        ] {
            std::fs::write(&path, bad).expect("write config");
            assert!(Config::load(Some(&path), []).is_err(), "{bad}");
        }
        let env = [("WSR_LISTN".to_owned(), "x".to_owned())];
        assert!(Config::load(None, env).is_err(), "a misspelt WSR_ variable");
    }

    #[test]
    fn log_format_and_metrics_token_from_the_environment() {
        let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let c = Config::load(None, env(&[])).expect("defaults");
        assert_eq!(c.log_format, LogFormat::Text);
        assert!(c.metrics_token.is_none());
        let c = Config::load(
            None,
            env(&[
                ("WSR_LOG_FORMAT", "json"),
                ("WSR_METRICS_TOKEN", "0123456789abcdef"),
            ]),
        )
        .expect("valid");
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(
            c.metrics_token.as_ref().map(|t| t.expose().to_owned()),
            Some("0123456789abcdef".to_owned())
        );
        assert!(Config::load(None, env(&[("WSR_LOG_FORMAT", "xml")])).is_err());
        assert!(Config::load(None, env(&[("WSR_METRICS_TOKEN", "short")])).is_err());
    }

    #[test]
    fn endpoint_urls_are_capped_and_token_topics_checked() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gw.toml");
        let prefix = "https://partner.example/";
        let at_cap = format!("{prefix}{}", "a".repeat(MAX_URL_BYTES - prefix.len()));
        let over = format!("{at_cap}a");
        for (text, ok) in [
            (format!("callback_endpoints = [\"{at_cap}\"]"), true),
            (format!("callback_endpoints = [\"{over}\"]"), false),
            (format!("push_endpoints = [\"{over}\"]"), false),
            (format!("[partners]\np = \"{over}\""), false),
        ] {
            std::fs::write(&path, &text).expect("write config");
            assert_eq!(Config::load(Some(&path), []).is_ok(), ok, "{}", &text[..40]);
        }
        let token = "[[tokens]]\ntoken = \"0123456789abcdef\"\nprincipal = \"bob\"\n\
                     scopes = [\"consume\"]\n";
        std::fs::write(&path, token).expect("write config");
        let c = Config::load(Some(&path), []).expect("topics default");
        assert_eq!(c.tokens[0].topics, vec!["#"]);
        std::fs::write(&path, format!("{token}topics = [\"bob/#\"]")).expect("write config");
        let c = Config::load(Some(&path), []).expect("valid topics");
        assert_eq!(c.tokens[0].topics, vec!["bob/#"]);
        std::fs::write(&path, format!("{token}topics = [\"bob/#/x\"]")).expect("write config");
        assert!(Config::load(Some(&path), []).is_err(), "an invalid filter");
    }

    #[test]
    fn agreements_are_checked_over_the_default() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gw.toml");
        let text = "[default_agreement]\nreply_pattern = \"Poll\"\n\
                    [agreements.orders]\nmessage_order = true\n";
        std::fs::write(&path, text).expect("write config");
        let c = Config::load(Some(&path), []).expect("valid");
        let orders = c.agreements["orders"].over(&c.default_agreement);
        assert_eq!(orders.reply_pattern.as_deref(), Some("Poll"));
        assert_eq!(orders.message_order, Some(true));
        for bad in [
            "[agreements.x]\nreply_pattern = \"Pigeon\"\n",
            "[default_agreement]\nexpiry_seconds = 0\n",
            "[default_agreement]\nack_requested = false\n[agreements.x]\nmessage_order = true\n",
            "[agreements.x]\nwaits_ms = [1]\nbackoff = 2\n",
        ] {
            std::fs::write(&path, bad).expect("write config");
            let err = Config::load(Some(&path), []).expect_err(bad);
            assert!(
                format!("{err:#}").starts_with("agreement "),
                "{bad}: {err:#}"
            );
        }
    }
}
