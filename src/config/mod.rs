//! Gateway settings: a TOML file (optional) and `WSR_*` environment overrides, checked once at
//! start into the values the rest of the gateway uses. With no file at all the gateway serves
//! channel `default` (every feature offered) on 127.0.0.1:8080 with SQLite under `./data/`.
//!
//! One file per section of the file: `file.rs` the format and its defaults, `env.rs` the
//! overrides, then `receiving`, `channels`, `tokens`, `partners`, `tls` (with the trusted
//! proxy), `agreements`, `limits` (the listener's and the reader's) and `delivery`; `bounds.rs`
//! the outer bounds they share. Here: the checked `Config`, loading, and the order in which
//! the sections are checked. The sections never import this file. Nothing here opens the
//! store, binds or serves: `App::build` does, with the checked settings.

mod agreements;
mod bounds;
mod channels;
mod delivery;
mod env;
mod file;
mod limits;
mod operations;
mod partners;
mod receiving;
mod tls;
mod tokens;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};

pub use agreements::AgreementSpec;
pub use channels::ChannelConfig;
pub use delivery::DeliverySettings;
pub use env::CLIENT_VARIABLES;
pub use file::FileConfig;
pub use limits::Perimeter;
pub use tls::{TlsFileConfig, TrustedProxy, TrustedProxyConfig};
pub use tokens::{ApiToken, Scope, TokenConfig, all_topics};

use bounds::MAX_SECONDS;
use channels::{Channels, Reach};
use receiving::Receiving;

use crate::endpoint::check_endpoint;
use crate::outbound::backend::RequestResponse;
use crate::outbound::destination::DestinationRules;
use crate::partners::Partners;
use crate::rmp::agreement::{Agreement, SendTerms};
use crate::rmp::group::Policy;
use crate::secrets::{Secret, Verifier};
use crate::store::{Database, Durability};
use crate::wsr::Limits;

/// The checked settings.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub database: Database,
    pub durability: Durability,
    pub policy: Policy,
    pub hold: Duration,
    /// Most bytes of request-response answers one source's requests may hold (D16).
    pub max_answer_bytes_per_source: u64,
    pub limits: Limits,
    pub perimeter: Perimeter,
    pub callback_retry_initial: Duration,
    pub callback_retry_max: Duration,
    pub channels: BTreeMap<String, Agreement>,
    /// The request-response channels (D16); every other channel is one-way.
    pub operations: BTreeMap<String, RequestResponse>,
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
    pub metrics_token: Option<Secret>,
    /// How long the audit trail keeps an entry.
    pub audit_retention: chrono::Duration,
    /// Where spans are exported, if anywhere (`otlp_endpoint`).
    pub otlp: Option<crate::telemetry::OtlpConfig>,
}

/// How `serve` writes its log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    /// One JSON object per line, with the fields of the spans it happened in (`request_id`).
    Json,
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
    /// Checks every section into the settings. The order is the order in which mistakes are
    /// reported (the first one found stops the start).
    fn check(mut self, base: Option<&Path>) -> anyhow::Result<Config> {
        let log_format = log_format(&self.log_format)?;
        let metrics_token = metrics_token(self.metrics_token.take())?;
        let otlp = otlp(self.otlp_endpoint.take(), &self.otlp_protocol)?;
        if !(1..=36_500).contains(&self.audit_retention_days) {
            bail!(
                "audit_retention_days must be 1 to 36500, not {}",
                self.audit_retention_days
            );
        }
        let durability = durability(&self.durability)?;
        let receiving = Receiving::check(&self)?;
        let reach = Reach::new(self.listen, self.allow_anonymous_beyond_loopback);
        let mut channels = Channels::check(&self.channels, receiving.horizons, reach)?;
        let operations = operations::check(&self.channels, base)?;
        let verifier = Verifier::default();
        let tokens = tokens::check(std::mem::take(&mut self.tokens), base)?;
        let partners = std::mem::take(&mut self.partners);
        let partners = partners::check(partners, base, &channels.names(), &self.agreements)?;
        channels.check_reached(&self.channels, &partners, reach)?;
        operations::check_anonymous(&operations, &channels.anonymous, reach)?;
        let partners = Partners::new(partners, verifier.clone());
        check_endpoint_urls(&self.callback_endpoints, &self.push_endpoints)?;
        let trusted_proxy = self.trusted_proxy.take().map(TrustedProxy::check);
        let trusted_proxy = trusted_proxy.transpose()?;
        let tls = self.tls.take().map(|t| t.relative_to(base));
        let destinations =
            DestinationRules::new(self.allow_url_destinations, &self.allowed_destination_hosts)
                .map_err(|e| anyhow::anyhow!("allowed_destination_hosts: {e}"))?;
        let named = std::mem::take(&mut self.agreements);
        let default = std::mem::take(&mut self.default_agreement);
        let (agreements, default_agreement) = agreements::check(named, default)?;
        let perimeter = Perimeter::check(&self)?;
        Ok(Config {
            listen: self.listen,
            database: Database::parse(&self.database),
            durability,
            policy: receiving.policy,
            hold: Duration::from_millis(self.hold_ms),
            max_answer_bytes_per_source: self.max_answer_bytes_per_source,
            limits: limits::message_limits(&self),
            perimeter,
            callback_retry_initial: Duration::from_millis(self.callback_retry_initial_ms.max(1)),
            callback_retry_max: Duration::from_millis(self.callback_retry_max_ms.max(1)),
            channels: channels.agreements,
            anonymous_channels: channels.anonymous,
            operations,
            anonymous_callbacks: reach.loopback() || self.allow_anonymous_beyond_loopback,
            tokens,
            verifier,
            delivery: DeliverySettings::from_file(&self),
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
            log_format,
            metrics_token,
            audit_retention: chrono::Duration::days(self.audit_retention_days as i64),
            otlp,
        })
    }
}

/// The endpoints registered at start: each must be usable, and unregistrable again.
fn check_endpoint_urls(callback: &[String], push: &[String]) -> anyhow::Result<()> {
    let urls = (callback.iter().map(|u| ("callback_endpoints", u)))
        .chain(push.iter().map(|u| ("push_endpoints", u)));
    for (field, url) in urls {
        check_endpoint(url).with_context(|| field.to_owned())?;
    }
    Ok(())
}

fn log_format(name: &str) -> anyhow::Result<LogFormat> {
    match name {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        other => bail!("log_format must be \"text\" or \"json\", not {other:?}"),
    }
}

/// `otlp_endpoint` and `otlp_protocol`: an absolute http(s) URL (the collector's traces path)
/// and one of OTLP's two HTTP encodings.
fn otlp(
    endpoint: Option<String>,
    protocol: &str,
) -> anyhow::Result<Option<crate::telemetry::OtlpConfig>> {
    let json = match protocol {
        "http/protobuf" => false,
        "http/json" => true,
        other => bail!("otlp_protocol must be \"http/protobuf\" or \"http/json\", not {other:?}"),
    };
    let Some(endpoint) = endpoint.filter(|e| !e.is_empty()) else {
        return Ok(None);
    };
    crate::endpoint::check_endpoint(&endpoint)
        .map_err(|e| anyhow::anyhow!("otlp_endpoint: {e}"))?;
    Ok(Some(crate::telemetry::OtlpConfig { endpoint, json }))
}

fn metrics_token(token: Option<String>) -> anyhow::Result<Option<Secret>> {
    match token {
        // Compared as given, like an inline API token: short ones are guessable.
        Some(t) if t.len() < 16 => bail!("metrics_token is shorter than 16 characters"),
        other => Ok(other.map(Secret::new)),
    }
}

fn durability(name: &str) -> anyhow::Result<Durability> {
    match name {
        "full" => Ok(Durability::Full),
        "os" => Ok(Durability::Os),
        other => bail!("durability must be \"full\" or \"os\", not {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::MAX_URL_BYTES;
    use crate::rmp::agreement::Feature;

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
    fn endpoint_urls_are_capped() {
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
    }
}
