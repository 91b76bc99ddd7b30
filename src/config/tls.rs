//! `[tls]` (the listener's certificate files) and `[trusted_proxy]` (who may say who the client
//! is): as the file gives them and checked. Reads no file: the listener loads the certificates
//! (`http::tls`), so that a reload reads them again.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde::Deserialize;

use crate::secrets::relative_to;

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

impl TlsFileConfig {
    /// The same files, relative paths read from `base` (the config file's folder).
    pub(super) fn relative_to(self, base: Option<&Path>) -> TlsFileConfig {
        TlsFileConfig {
            cert_file: relative_to(base, &self.cert_file),
            key_file: relative_to(base, &self.key_file),
            client_ca_file: self.client_ca_file.map(|p| relative_to(base, &p)),
            reload_check_seconds: self.reload_check_seconds,
        }
    }
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
    pub(super) fn check(c: TrustedProxyConfig) -> anyhow::Result<TrustedProxy> {
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
