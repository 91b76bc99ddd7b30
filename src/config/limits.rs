//! The bounds of what the listener and the reader take on (D13): the perimeter's timeouts and
//! caps, and what one message may cost. Checked here; enforced by `http::serve` and the reader.

use std::time::Duration;

use anyhow::bail;

use super::bounds::MAX_SECONDS;
use super::file::FileConfig;
use crate::wsr::Limits;

/// What a source's share of the body budget holds beyond one whole message by default: the
/// reads past a message's end that tell it is too long.
const BODY_SLACK: usize = 64 * 1024;

/// Timeouts and caps of the HTTP listener (D13); see `FileConfig` for their meaning.
#[derive(Debug, Clone)]
pub struct Perimeter {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub body_min_bytes_per_second: u64,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    /// Requests in flight per class (`http::serve::classes`), and each source's share.
    pub max_requests_in_flight: usize,
    pub max_api_requests_in_flight: usize,
    pub max_waiting_requests: usize,
    pub max_operator_requests_in_flight: usize,
    pub max_requests_in_flight_per_source: usize,
    pub max_body_bytes_in_flight: usize,
    /// Each source address's share of `max_body_bytes_in_flight`.
    pub max_body_bytes_in_flight_per_source: usize,
    /// TLS handshakes in progress per source address (`http::serve`).
    pub max_tls_handshakes_per_source: usize,
}

impl Perimeter {
    pub(super) fn check(f: &FileConfig) -> anyhow::Result<Perimeter> {
        for (name, value) in [
            ("max_connections", f.max_connections),
            ("max_requests_in_flight", f.max_requests_in_flight),
            ("max_api_requests_in_flight", f.max_api_requests_in_flight),
            ("max_waiting_requests", f.max_waiting_requests),
            (
                "max_operator_requests_in_flight",
                f.max_operator_requests_in_flight,
            ),
            (
                "max_requests_in_flight_per_source",
                f.max_requests_in_flight_per_source,
            ),
            (
                "max_tls_handshakes_per_source",
                f.max_tls_handshakes_per_source,
            ),
        ] {
            if value == 0 {
                bail!("{name} must be at least 1");
            }
        }
        let body_budget = f
            .max_body_bytes_in_flight
            .unwrap_or(f.max_message_bytes.saturating_mul(4));
        // One whole message (and the read ahead past its end, that tells it is too long) must
        // fit in the budget and in each source's share, or the largest allowed message could
        // never be received.
        let one_message = f.max_message_bytes.saturating_add(BODY_SLACK);
        let share = f
            .max_body_bytes_in_flight_per_source
            .unwrap_or(one_message)
            .min(body_budget);
        if body_budget <= f.max_message_bytes || share <= f.max_message_bytes {
            bail!(
                "max_body_bytes_in_flight and max_body_bytes_in_flight_per_source must be larger \
                 than max_message_bytes"
            );
        }
        // A semaphore holds at most usize::MAX >> 3 permits; timeouts are clamped to 30 days
        // so that no deadline can overflow.
        let max_permits = usize::MAX >> 3;
        let timeout = |ms: u64| Duration::from_millis(ms.clamp(1, MAX_SECONDS * 1000));
        Ok(Perimeter {
            header_timeout: timeout(f.header_timeout_ms),
            body_timeout: timeout(f.body_timeout_ms),
            body_min_bytes_per_second: f.body_min_bytes_per_second,
            idle_timeout: timeout(f.idle_timeout_ms),
            max_connections: f.max_connections.min(max_permits),
            max_requests_in_flight: f.max_requests_in_flight.min(max_permits),
            max_api_requests_in_flight: f.max_api_requests_in_flight.min(max_permits),
            max_waiting_requests: f.max_waiting_requests.min(max_permits),
            max_operator_requests_in_flight: f.max_operator_requests_in_flight.min(max_permits),
            max_requests_in_flight_per_source: f.max_requests_in_flight_per_source,
            max_body_bytes_in_flight: body_budget.min(max_permits),
            max_body_bytes_in_flight_per_source: share,
            max_tls_handshakes_per_source: f.max_tls_handshakes_per_source,
        })
    }
}

/// What one message may cost the reader: the largest body, and the most references a
/// PollRequest (or statements a Response) may carry (at least one).
pub(super) fn message_limits(f: &FileConfig) -> Limits {
    Limits {
        max_bytes: f.max_message_bytes,
        max_references: f.max_poll_references.max(1),
        ..Limits::default()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::MAX_SECONDS;
    use crate::config::Config;

    #[test]
    fn perimeter_defaults_overrides_and_checks() {
        let c = Config::load(None, []).expect("defaults");
        assert_eq!(c.perimeter.header_timeout, Duration::from_secs(10));
        assert_eq!(c.perimeter.idle_timeout, Duration::from_secs(60));
        assert_eq!(c.perimeter.max_connections, 1024);
        assert_eq!(c.perimeter.max_requests_in_flight, 512);
        assert_eq!(
            c.perimeter.max_body_bytes_in_flight,
            4 * c.limits.max_bytes,
            "four times the largest message by default"
        );
        assert_eq!(
            c.perimeter.max_body_bytes_in_flight_per_source,
            c.limits.max_bytes + 64 * 1024,
            "one whole message per source by default"
        );
        assert_eq!(
            (
                c.perimeter.max_api_requests_in_flight,
                c.perimeter.max_waiting_requests,
                c.perimeter.max_operator_requests_in_flight,
                c.perimeter.max_requests_in_flight_per_source
            ),
            (256, 256, 64, 128)
        );
        assert_eq!(c.perimeter.max_tls_handshakes_per_source, 32);
        let env = |k: &str, v: &str| [(k.to_owned(), v.to_owned())];
        let c = Config::load(None, env("WSR_HEADER_TIMEOUT_MS", "300")).expect("valid");
        assert_eq!(c.perimeter.header_timeout, Duration::from_millis(300));
        let c = Config::load(None, env("WSR_IDLE_TIMEOUT_MS", &u64::MAX.to_string()))
            .expect("clamped, not overflowing");
        assert_eq!(c.perimeter.idle_timeout, Duration::from_secs(MAX_SECONDS));
        assert!(Config::load(None, env("WSR_MAX_CONNECTIONS", "0")).is_err());
        assert!(Config::load(None, env("WSR_MAX_BODY_BYTES_IN_FLIGHT", "1000")).is_err());
        let share = env("WSR_MAX_BODY_BYTES_IN_FLIGHT_PER_SOURCE", "1000");
        assert!(
            Config::load(None, share).is_err(),
            "a share must hold a message"
        );
        assert!(Config::load(None, env("WSR_MAX_WAITING_REQUESTS", "0")).is_err());
        let c = Config::load(None, env("WSR_MAX_TLS_HANDSHAKES_PER_SOURCE", "2")).expect("valid");
        assert_eq!(c.perimeter.max_tls_handshakes_per_source, 2);
        assert!(Config::load(None, env("WSR_MAX_TLS_HANDSHAKES_PER_SOURCE", "0")).is_err());
    }
}
