//! The one way the gateway calls out over HTTP (partners, callback endpoints, push webhooks,
//! notify URLs): every client is built here, follows no redirect (a 3xx is a failed attempt,
//! so only the URL we chose is ever sent to), and reads every answer chunk by chunk up to a
//! cap (`max_message_bytes`), giving up — as a failed attempt — at the first byte beyond it.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::CONTENT_TYPE;

use super::destination::{DestinationRules, GuardedResolver};
use crate::rmp::sender::AttemptFailure;

/// A client for registered or configured targets: a total timeout per exchange, no redirects.
pub fn client(timeout: Duration) -> reqwest::Result<reqwest::Client> {
    builder(timeout).build()
}

/// A client for URLs an application named (URL destinations): like `client`, and its DNS
/// answers lose the internal addresses the rules do not list.
pub fn guarded_client(
    timeout: Duration,
    rules: Arc<DestinationRules>,
) -> reqwest::Result<reqwest::Client> {
    builder(timeout)
        .dns_resolver(Arc::new(GuardedResolver(rules)))
        .build()
}

/// The settings every client shares (partners' own clients add their TLS to it).
pub(crate) fn builder(timeout: Duration) -> reqwest::ClientBuilder {
    // No proxy from the environment (HTTP(S)_PROXY): it would take every call somewhere
    // nobody configured here, and the destination resolver would only ever see its name.
    let builder = reqwest::Client::builder()
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .tls_version_min(reqwest::tls::Version::TLS_1_2);
    if system_roots() {
        builder
    } else {
        // No system CA certificates (a minimal container): trust nothing by default rather
        // than fail to start. What has its own `ca_file` adds it; an https call to anything
        // else fails as an attempt, and what the configuration itself reaches over https
        // without a `ca_file` is refused at start (`needing_system_roots`).
        builder.tls_certs_only(Vec::new())
    }
}

/// Whether the system's CA certificates could be loaded (asked once: the client verifier
/// reads them when a client is built).
pub fn system_roots() -> bool {
    static LOADED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LOADED.get_or_init(|| {
        let loaded = reqwest::Client::builder().no_proxy().build().is_ok();
        if !loaded {
            tracing::warn!("no system CA certificates: https calls trust only the ca_file given for them (partners, backends); callbacks, webhooks, notify URLs and URL destinations over https will fail");
        }
        loaded
    })
}

/// Refuses a start in which something the configuration reaches over https has no
/// `ca_file` of its own while the system has no CA certificates (`targets`: who, its URL,
/// whether it has a `ca_file`): it could never be reached, and should be said now.
pub fn check_system_roots<'a>(
    targets: impl Iterator<Item = (String, &'a str, bool)>,
) -> anyhow::Result<()> {
    if system_roots() {
        return Ok(());
    }
    let https = |url: &str| {
        url.get(..8)
            .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
    };
    match targets
        .into_iter()
        .find(|(_, url, has_ca)| !has_ca && https(url))
    {
        None => Ok(()),
        Some((who, url, _)) => anyhow::bail!(
            "{who} is reached over https ({}) without a ca_file, and the system has no CA \
             certificates: install them (Debian: ca-certificates) or give it a ca_file",
            redacted(url)
        ),
    }
}

/// An answer read in full (within the cap).
#[derive(Debug, Clone)]
pub struct Heard {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

/// Sends `request` and reads its answer, at most `cap` bytes of body. A redirect, a transport
/// failure, a timeout (also while the body is read) and an answer beyond the cap are failed
/// attempts; any other status is the caller's to judge.
pub async fn exchange(
    request: reqwest::RequestBuilder,
    cap: usize,
) -> Result<Heard, AttemptFailure> {
    let mut answer = request.send().await.map_err(failure_of)?;
    let status = answer.status().as_u16();
    if answer.status().is_redirection() {
        return Err(AttemptFailure::Redirected(status));
    }
    let content_type = answer
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let too_large = AttemptFailure::TooLarge { limit: cap };
    if answer
        .content_length()
        .is_some_and(|n| n > u64::try_from(cap).unwrap_or(u64::MAX))
    {
        return Err(too_large);
    }
    let mut body: Vec<u8> = Vec::new();
    while let Some(chunk) = answer.chunk().await.map_err(failure_of)? {
        if body.len().saturating_add(chunk.len()) > cap {
            return Err(too_large);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Heard {
        status,
        content_type,
        body,
    })
}

/// A reqwest error as a failed attempt, with its causes and without the URL (which may carry
/// credentials).
pub fn failure_of(e: reqwest::Error) -> AttemptFailure {
    // A request that could not be built never left: as certain not to have arrived as a
    // refused connection.
    let (connect, timeout) = (e.is_connect() || e.is_builder(), e.is_timeout());
    let e = e.without_url();
    let mut why = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        why.push_str(": ");
        why.push_str(&cause.to_string());
        source = cause.source();
    }
    if connect {
        AttemptFailure::Unreached(why)
    } else if timeout {
        AttemptFailure::TimedOut
    } else {
        AttemptFailure::Transport(why)
    }
}

/// A URL fit for a log line: no user name, password, query or fragment.
pub fn redacted(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.set_query(None);
            u.set_fragment(None);
            u.to_string()
        }
        Err(_) => "(not a URL)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_carry_no_credentials() {
        assert_eq!(
            redacted("https://user:secret@partner.example:8443/wsr/in?token=abc#x"),
            "https://partner.example:8443/wsr/in"
        );
        assert_eq!(redacted("nonsense"), "(not a URL)");
    }
}
