//! A channel's operation (D16): `one-way` (the default: the inbox is the delivery) or
//! `request-response`, answered by a SOAP backend (`[channels.backend]`) or by an application
//! through the API (the spec's Respond). Checked into `outbound::backend::RequestResponse`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};

use super::channels::{BackendConfig, ChannelConfig, Reach};
use crate::endpoint::check_endpoint;
use crate::outbound::backend::{BackendSpec, RequestResponse, Responder};
use crate::partners::{OurCredentialKeys, PartnerTls};
use crate::rmp::exchange::OnUnknown;
use crate::secrets::relative_to;

const DEFAULT_TIMEOUT_MS: u64 = 30_000;
const MAX_TIMEOUT_MS: u64 = 10 * 60_000;

/// The request-response channels, by name.
pub(super) fn check(
    channels: &[ChannelConfig],
    base: Option<&Path>,
) -> anyhow::Result<BTreeMap<String, RequestResponse>> {
    let mut operations = BTreeMap::new();
    for c in channels {
        let ctx = |what: &str| format!("channel {}: {what}", c.name);
        match c.operation.as_deref().unwrap_or("one-way") {
            "one-way" => {
                if c.backend.is_some() || c.on_unknown.is_some() || c.respond_within_ms.is_some() {
                    bail!(
                        "channel {}: backend, on_unknown and respond_within_ms are for \
                         operation = \"request-response\"",
                        c.name
                    );
                }
            }
            "request-response" => {
                let on_unknown = match c.on_unknown.as_deref().unwrap_or("retry") {
                    "retry" => OnUnknown::Retry,
                    "fail" => OnUnknown::Fail,
                    other => bail!(ctx(&format!(
                        "on_unknown must be \"retry\" or \"fail\", not {other:?}"
                    ))),
                };
                let responder = match &c.backend {
                    Some(b) => {
                        if c.respond_within_ms.is_some() {
                            bail!(ctx(
                                "respond_within_ms is for channels answered through the API, not by a backend"
                            ));
                        }
                        Responder::Backend(backend(b, base).with_context(|| ctx("backend"))?)
                    }
                    None => Responder::Api {
                        within: Duration::from_millis(bounded(
                            c.respond_within_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
                        )),
                    },
                };
                operations.insert(
                    c.name.clone(),
                    RequestResponse {
                        responder,
                        on_unknown,
                    },
                );
            }
            other => bail!(ctx(&format!(
                "operation must be \"one-way\" or \"request-response\", not {other:?}"
            ))),
        }
    }
    Ok(operations)
}

/// Anonymous callers are told apart by nothing but their group ids: on a request-response
/// channel one could be given another's cached business response by naming its group. Fine on
/// a loopback listener (everyone there is on this machine already), refused beyond it.
pub(super) fn check_anonymous(
    operations: &BTreeMap<String, RequestResponse>,
    anonymous: &std::collections::BTreeSet<String>,
    reach: Reach,
) -> anyhow::Result<()> {
    if reach.loopback() {
        return Ok(());
    }
    if let Some(channel) = operations.keys().find(|c| anonymous.contains(*c)) {
        bail!(
            "channel {channel}: a request-response channel takes no anonymous callers beyond a \
             loopback listener (they would share one another's cached answers): give its \
             partners credentials"
        );
    }
    Ok(())
}

fn bounded(ms: u64) -> u64 {
    ms.clamp(1, MAX_TIMEOUT_MS)
}

fn backend(b: &BackendConfig, base: Option<&Path>) -> anyhow::Result<BackendSpec> {
    check_endpoint(&b.url).context("url")?;
    if b.client_cert_file.is_some() != b.client_key_file.is_some() {
        bail!("client_cert_file and client_key_file go together");
    }
    let path = |p: &Option<PathBuf>| p.as_deref().map(|p| relative_to(base, p));
    let credentials = OurCredentialKeys {
        username: b.our_username.clone(),
        password: b.our_password.as_deref(),
        password_file: b.our_password_file.as_deref(),
        password_env: b.our_password_env.as_deref(),
        token: b.our_token.as_deref(),
        token_file: b.our_token_file.as_deref(),
        token_env: b.our_token_env.as_deref(),
    }
    .check("backend", base)?;
    Ok(BackendSpec {
        url: b.url.clone(),
        timeout: Duration::from_millis(bounded(b.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS))),
        max_concurrency: b.max_concurrency.unwrap_or(16).clamp(1, 4096),
        tls: PartnerTls {
            ca_file: path(&b.ca_file),
            client_cert_file: path(&b.client_cert_file),
            client_key_file: path(&b.client_key_file),
        },
        credentials,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::outbound::backend::Responder;
    use crate::rmp::exchange::OnUnknown;

    fn load(text: &str) -> anyhow::Result<Config> {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gw.toml");
        std::fs::write(&path, text).expect("write config");
        Config::load(Some(&path), [])
    }

    #[test]
    fn a_request_response_channel_names_its_responder() {
        let c = load(
            "[[channels]]\nname = \"echo\"\noperation = \"request-response\"\n\
             on_unknown = \"fail\"\n[channels.backend]\nurl = \"http://127.0.0.1:9/echo\"\n\
             timeout_ms = 500\nour_username = \"gw\"\nour_password = \"pw\"\n\
             [[channels]]\nname = \"ask\"\noperation = \"request-response\"\n\
             [[channels]]\nname = \"plain\"\n",
        )
        .expect("valid");
        let echo = &c.operations["echo"];
        assert_eq!(echo.on_unknown, OnUnknown::Fail);
        match &echo.responder {
            Responder::Backend(b) => {
                assert_eq!(b.url, "http://127.0.0.1:9/echo");
                assert_eq!(b.timeout.as_millis(), 500);
                assert!(matches!(
                    b.credentials,
                    Some(crate::partners::OurCredentials::Basic { .. })
                ));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(c.operations["ask"].on_unknown, OnUnknown::Retry);
        assert!(matches!(
            c.operations["ask"].responder,
            Responder::Api { .. }
        ));
        assert!(!c.operations.contains_key("plain"));
    }

    #[test]
    fn a_wrong_operation_is_refused_with_its_reason() {
        for (text, why) in [
            ("operation = \"notify\"\n", "operation must be"),
            ("on_unknown = \"retry\"\n", "are for operation"),
            (
                "operation = \"request-response\"\non_unknown = \"maybe\"\n",
                "on_unknown must be",
            ),
            (
                "operation = \"request-response\"\n[channels.backend]\nurl = \"ftp://x/\"\n",
                "backend",
            ),
        ] {
            let err = load(&format!("[[channels]]\nname = \"c\"\n{text}")).expect_err(text);
            assert!(format!("{err:#}").contains(why), "{text}: {err:#}");
        }
    }

    #[test]
    fn an_anonymous_request_response_channel_is_refused_beyond_loopback() {
        let channel = "[[channels]]\nname = \"ask\"\noperation = \"request-response\"\n\
                       anonymous = true\n";
        let wide =
            format!("listen = \"0.0.0.0:8080\"\nallow_anonymous_beyond_loopback = true\n{channel}");
        let err = load(&wide).expect_err("anonymous request-response beyond loopback");
        assert!(
            format!("{err:#}").contains("takes no anonymous callers"),
            "{err:#}"
        );
        // One-way channels stay as the operator allows; on loopback both are fine.
        let one_way = "listen = \"0.0.0.0:8080\"\nallow_anonymous_beyond_loopback = true\n\
                       [[channels]]\nname = \"in\"\nanonymous = true\n";
        load(one_way).expect("anonymous one-way channel");
        load(&format!("listen = \"127.0.0.1:8080\"\n{channel}")).expect("on loopback");
    }
}
