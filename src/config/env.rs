//! `WSR_*` environment overrides of the file's settings: one variable per setting that is not
//! a table, the tables refused, the client commands' own variables let through. Sets values
//! only; they are checked with the file's.

use anyhow::bail;

use super::file::FileConfig;
use super::tokens::{Scope, TokenConfig};

/// Variables of the client commands (`send`, `status`, `bench`, the operator commands) and
/// `serve`'s own `--config`: not gateway settings, so `serve` ignores them.
pub const CLIENT_VARIABLES: &[&str] = &[
    "WSR_CONFIG",
    "WSR_API",
    "WSR_TOKEN",
    "WSR_CA_FILE",
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

impl FileConfig {
    /// Sets what a `WSR_*` variable names; a variable of no setting, or of a table, is an
    /// error, and a variable outside `WSR_*` is none of ours.
    pub(super) fn apply_env(&mut self, key: &str, value: &str) -> anyhow::Result<()> {
        if self.set_receiving(key, value)?
            || self.set_listener(key, value)?
            || self.set_sending(key, value)?
        {
            return Ok(());
        }
        match key {
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

    /// The store and the receiver's settings. Whether `key` is one of them.
    fn set_receiving(&mut self, key: &str, value: &str) -> anyhow::Result<bool> {
        match key {
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
            "WSR_MAX_OPEN_GROUPS_PER_SOURCE" => self.max_open_groups_per_source = value.parse()?,
            "WSR_MAX_STORED_BYTES_PER_SOURCE" => {
                self.max_stored_bytes_per_source = value.parse()?
            }
            "WSR_MAX_MESSAGES_PER_SECOND_PER_SOURCE" => {
                self.max_messages_per_second_per_source = value.parse()?
            }
            "WSR_MAX_ANSWER_BYTES_PER_SOURCE" => {
                self.max_answer_bytes_per_source = value.parse()?
            }
            "WSR_BUFFER_MAX_MESSAGES" => self.buffer_max_messages = value.parse()?,
            "WSR_BUFFER_MAX_BYTES" => self.buffer_max_bytes = value.parse()?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The listener's settings: where, its limits, who may use it, its logs. Whether `key` is one of them.
    fn set_listener(&mut self, key: &str, value: &str) -> anyhow::Result<bool> {
        match key {
            "WSR_LISTEN" => self.listen = value.parse()?,
            "WSR_MAX_MESSAGE_BYTES" => self.max_message_bytes = value.parse()?,
            "WSR_MAX_POLL_REFERENCES" => self.max_poll_references = value.parse()?,
            "WSR_HEADER_TIMEOUT_MS" => self.header_timeout_ms = value.parse()?,
            "WSR_BODY_TIMEOUT_MS" => self.body_timeout_ms = value.parse()?,
            "WSR_BODY_MIN_BYTES_PER_SECOND" => self.body_min_bytes_per_second = value.parse()?,
            "WSR_IDLE_TIMEOUT_MS" => self.idle_timeout_ms = value.parse()?,
            "WSR_MAX_CONNECTIONS" => self.max_connections = value.parse()?,
            "WSR_MAX_REQUESTS_IN_FLIGHT" => self.max_requests_in_flight = value.parse()?,
            "WSR_MAX_API_REQUESTS_IN_FLIGHT" => self.max_api_requests_in_flight = value.parse()?,
            "WSR_MAX_WAITING_REQUESTS" => self.max_waiting_requests = value.parse()?,
            "WSR_MAX_OPERATOR_REQUESTS_IN_FLIGHT" => {
                self.max_operator_requests_in_flight = value.parse()?
            }
            "WSR_MAX_REQUESTS_IN_FLIGHT_PER_SOURCE" => {
                self.max_requests_in_flight_per_source = value.parse()?
            }
            "WSR_MAX_TLS_HANDSHAKES_PER_SOURCE" => {
                self.max_tls_handshakes_per_source = value.parse()?
            }
            "WSR_MAX_BODY_BYTES_IN_FLIGHT" => self.max_body_bytes_in_flight = Some(value.parse()?),
            "WSR_MAX_BODY_BYTES_IN_FLIGHT_PER_SOURCE" => {
                self.max_body_bytes_in_flight_per_source = Some(value.parse()?)
            }
            "WSR_ADMIN_TOKEN" => {
                self.tokens
                    .push(TokenConfig::plain(value, "admin", vec![Scope::Admin]))
            }
            "WSR_ALLOW_ANONYMOUS_BEYOND_LOOPBACK" => {
                self.allow_anonymous_beyond_loopback = value.parse()?
            }
            "WSR_LOG_FORMAT" => self.log_format = value.to_owned(),
            "WSR_METRICS_TOKEN" => self.metrics_token = Some(value.to_owned()),
            "WSR_AUDIT_RETENTION_DAYS" => self.audit_retention_days = value.parse()?,
            "WSR_OTLP_ENDPOINT" => self.otlp_endpoint = Some(value.to_owned()),
            "WSR_OTLP_PROTOCOL" => self.otlp_protocol = value.to_owned(),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Sending, callbacks and delivery to applications. Whether `key` is one of them.
    fn set_sending(&mut self, key: &str, value: &str) -> anyhow::Result<bool> {
        match key {
            "WSR_CALLBACK_ENDPOINTS" => self.callback_endpoints.extend(url_list(value)),
            "WSR_PUSH_ENDPOINTS" => self.push_endpoints.extend(url_list(value)),
            "WSR_INBOX_RETENTION_SECONDS" => self.inbox_retention_seconds = value.parse()?,
            "WSR_MAX_FETCH_BYTES" => self.max_fetch_bytes = value.parse()?,
            "WSR_MAX_PUSH_BYTES_IN_FLIGHT" => self.max_push_bytes_in_flight = value.parse()?,
            "WSR_MAX_SUBSCRIPTIONS_PER_PRINCIPAL" => {
                self.max_subscriptions_per_principal = value.parse()?
            }
            "WSR_MAX_SESSIONS_PER_SUBSCRIPTION" => {
                self.max_sessions_per_subscription = value.parse()?
            }
            "WSR_ALLOW_URL_DESTINATIONS" => self.allow_url_destinations = value.parse()?,
            "WSR_ALLOWED_DESTINATION_HOSTS" => {
                self.allowed_destination_hosts.extend(url_list(value))
            }
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
            _ => return Ok(false),
        }
        Ok(true)
    }
}

fn url_list(value: &str) -> impl Iterator<Item = String> + '_ {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

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
}
