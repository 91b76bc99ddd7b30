//! How we reach each configured partner (D15, DESIGN §6): its HTTP client (only its CA bundle
//! verifies it, or the system roots; our client certificate where configured), our
//! credentials towards it, and where its PollRequests go. Built once at start: a partner file
//! that cannot be used fails the start, naming the partner and the file. Never logs or
//! returns a credential.

use crate::partners::OurWssToken;
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::destination::DestinationRules;
use super::http_client;
use crate::partners::{Partner, PartnerTls, Partners};
use crate::wsr::SoapVersion;

/// Every outbound client of the sender and the callback worker, built once (`App::build`).
/// Cheap to clone.
#[derive(Clone)]
pub struct PartnerClients {
    inner: Arc<Inner>,
}

struct Inner {
    /// Registered endpoints that are no partner's, notify webhooks, and partners without TLS
    /// settings of their own: the system roots, no client certificate.
    shared: reqwest::Client,
    /// URLs an application named (URL destinations): DNS answers obey the destination rules.
    guarded: reqwest::Client,
    /// By partner name.
    partners: BTreeMap<String, Reach>,
    /// Message destination URL → partner name, and callback endpoint URL → partner name: the
    /// stand-ins until messages and callbacks carry their partner's name (`partner_of_*`).
    by_address: BTreeMap<String, String>,
    by_callback: BTreeMap<String, String>,
}

/// How one partner is reached. No `Debug`: it holds our credentials.
struct Reach {
    client: reqwest::Client,
    /// Marked sensitive, so that no `Debug` of a request or header map shows it.
    authorization: Option<HeaderValue>,
    poll_address: Option<String>,
    /// Our UsernameToken towards it, put in every envelope we send it.
    wss: Option<OurWssToken>,
}

/// Where and how one request goes: the client, our credentials (if the target is a partner
/// that has them), and the SOAP headers of its version.
#[derive(Clone, Copy)]
pub struct Route<'a> {
    client: &'a reqwest::Client,
    authorization: Option<&'a HeaderValue>,
    poll_address: Option<&'a str>,
    wss: Option<&'a OurWssToken>,
}

impl PartnerClients {
    /// The clients for `partners`: each answer must come within `timeout`; URL destinations
    /// obey `rules`. Fails on a partner file that cannot be read or used, or on credentials
    /// that cannot go in an HTTP header.
    pub fn new(
        partners: &Partners,
        timeout: Duration,
        rules: Arc<DestinationRules>,
    ) -> anyhow::Result<PartnerClients> {
        let targets = partners.iter().flat_map(|p| {
            let has_ca = p.outbound.tls.ca_file.is_some();
            [&p.outbound.address, &p.outbound.poll_address]
                .into_iter()
                .flatten()
                .map(move |url| (format!("partner {}", p.name), url.as_str(), has_ca))
        });
        http_client::check_system_roots(targets)?;
        let shared = http_client::client(timeout).context("cannot build the HTTP client")?;
        let guarded = http_client::guarded_client(timeout, rules)
            .context("cannot build the HTTP client for URL destinations")?;
        let mut reach = BTreeMap::new();
        let (mut by_address, mut by_callback) = (BTreeMap::new(), BTreeMap::new());
        for p in partners.iter() {
            let client = if p.outbound.tls.is_default() {
                shared.clone()
            } else {
                partner_client(p, timeout)?
            };
            let authorization = p
                .outbound
                .credentials
                .as_ref()
                .map(|c| {
                    let mut v = HeaderValue::from_str(&c.header()).map_err(|_| {
                        anyhow!(
                            "partner {}: our credentials cannot be sent in an Authorization \
                             header (control characters)",
                            p.name
                        )
                    })?;
                    v.set_sensitive(true);
                    anyhow::Ok(v)
                })
                .transpose()?;
            // First partner by name wins a URL two partners share, as `Partners::by_address`.
            if let Some(address) = &p.outbound.address {
                by_address
                    .entry(address.clone())
                    .or_insert_with(|| p.name.clone());
            }
            for endpoint in &p.inbound.callback_endpoints {
                by_callback
                    .entry(endpoint.clone())
                    .or_insert_with(|| p.name.clone());
            }
            reach.insert(
                p.name.clone(),
                Reach {
                    client,
                    authorization,
                    poll_address: p.outbound.poll_address.clone(),
                    wss: p.outbound.wss.clone(),
                },
            );
        }
        Ok(PartnerClients {
            inner: Arc::new(Inner {
                shared,
                guarded,
                partners: reach,
                by_address,
                by_callback,
            }),
        })
    }

    /// The partner a message is for: the one it names (`OutMessage.partner`), or for a
    /// message stored before messages named their partner, the one whose address it goes to.
    fn partner_of_message(&self, partner: &str, destination: &str) -> Option<&Reach> {
        let name = match partner {
            "" => self.inner.by_address.get(destination)?,
            name => name,
        };
        self.inner.partners.get(name)
    }

    /// The partner whose message a callback acks (`PendingCallback.partner`), or for one
    /// owed to an anonymous caller, the partner whose `callback_endpoints` list the endpoint.
    fn partner_of_callback(&self, partner: &str, endpoint: &str) -> Option<&Reach> {
        let name = match partner {
            "" => self.inner.by_callback.get(endpoint)?,
            name => name,
        };
        self.inner.partners.get(name)
    }

    /// How a message to `destination` (and a poll about it) goes: a partner's client and
    /// credentials, or the guarded client for a URL an application named.
    pub fn for_message(&self, partner: &str, destination: &str) -> Route<'_> {
        match self.partner_of_message(partner, destination) {
            Some(r) => r.route(),
            None => Route {
                client: &self.inner.guarded,
                authorization: None,
                poll_address: None,
                wss: None,
            },
        }
    }

    /// How callback acks to `endpoint` (a registered one) go.
    pub fn for_callback(&self, partner: &str, endpoint: &str) -> Route<'_> {
        match self.partner_of_callback(partner, endpoint) {
            Some(r) => r.route(),
            None => Route {
                client: &self.inner.shared,
                authorization: None,
                poll_address: None,
                wss: None,
            },
        }
    }

    /// The client for registered webhooks (notify URLs): no partner's credentials.
    pub fn webhooks(&self) -> &reqwest::Client {
        &self.inner.shared
    }
}

impl Reach {
    fn route(&self) -> Route<'_> {
        Route {
            client: &self.client,
            authorization: self.authorization.as_ref(),
            poll_address: self.poll_address.as_deref(),
            wss: self.wss.as_ref(),
        }
    }
}

impl<'a> Route<'a> {
    /// `envelope` as it goes to this partner: with our UsernameToken (a fresh nonce and
    /// `Created` each time) when it requires one. The stored envelope stays as it was: its
    /// identity is the same on every resend, only the token is new.
    pub fn secured(&self, envelope: String, version: SoapVersion, now: DateTime<Utc>) -> String {
        let Some(ours) = self.wss else {
            return envelope;
        };
        let token = crate::wss::our_token(&ours.username, ours.password.expose(), ours.digest, now);
        match crate::wsr::write::with_security(&envelope, version, &token) {
            Some(secured) => secured,
            None => {
                tracing::error!("an envelope without a Header: sent without our UsernameToken");
                envelope
            }
        }
    }

    /// A POST of a SOAP envelope to `url`: its media type, the `SOAPAction` its version
    /// requires, and our credentials.
    pub fn post_soap(
        &self,
        url: &str,
        version: SoapVersion,
        body: impl Into<reqwest::Body>,
    ) -> reqwest::RequestBuilder {
        let mut request = self
            .client
            .post(url)
            .header(CONTENT_TYPE, version.content_type())
            .body(body);
        if let Some(action) = version.soap_action() {
            request = request.header("SOAPAction", action);
        }
        if let Some(auth) = self.authorization {
            request = request.header(AUTHORIZATION, auth.clone());
        }
        request
    }

    /// Where PollRequests about messages to `destination` go: the partner's poll address
    /// (some peers answer polls only at a pure WS-R endpoint), else the destination itself.
    pub fn poll_target<'d>(&self, destination: &'d str) -> &'d str
    where
        'a: 'd,
    {
        self.poll_address.unwrap_or(destination)
    }
}

/// A client of a partner's own: only its CA bundle's roots (if given), our client certificate
/// (if given). Each file is checked here so that the error names the partner and the file.
fn partner_client(p: &Partner, timeout: Duration) -> anyhow::Result<reqwest::Client> {
    tls_client(&format!("partner {}", p.name), &p.outbound.tls, timeout)
}

/// A client that trusts only `tls`'s CA bundle (if given) and presents its client
/// certificate (if given): a partner's, or a SOAP backend's (D16). `who` names it in errors.
pub fn tls_client(
    who: &str,
    tls: &PartnerTls,
    timeout: Duration,
) -> anyhow::Result<reqwest::Client> {
    let mut builder = http_client::builder(timeout);
    if let Some(path) = &tls.ca_file {
        let pem = read(who, "ca_file", path)?;
        let ders = certificates(who, "ca_file", path, &pem)?;
        let mut roots = Vec::with_capacity(ders.len());
        for der in &ders {
            webpki::anchor_from_trusted_cert(der).map_err(|e| {
                anyhow!(
                    "{}: ca_file {}: a certificate in it cannot be a root: {e}",
                    who,
                    path.display()
                )
            })?;
            roots.push(
                reqwest::Certificate::from_der(der)
                    .with_context(|| format!("{}: ca_file {}", who, path.display()))?,
            );
        }
        // Only these roots: a partner's private CA must not widen to every public CA too.
        builder = builder.tls_certs_only(roots);
    }
    match (&tls.client_cert_file, &tls.client_key_file) {
        (Some(cert_path), Some(key_path)) => {
            let cert_pem = read(who, "client_cert_file", cert_path)?;
            let key_pem = read(who, "client_key_file", key_path)?;
            let chain = certificates(who, "client_cert_file", cert_path, &cert_pem)?;
            // The error of the PEM parser says nothing of the key's bytes.
            let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
                anyhow!(
                    "{}: client_key_file {}: no usable PEM private key in it ({e})",
                    who,
                    key_path.display()
                )
            })?;
            // reqwest would take a key of another certificate and fail every handshake later.
            let provider = rustls::crypto::aws_lc_rs::default_provider();
            rustls::sign::CertifiedKey::from_der(chain, key, &provider).map_err(|e| {
                anyhow!(
                    "{}: client_key_file {} does not go with client_cert_file {}: {e}",
                    who,
                    key_path.display(),
                    cert_path.display()
                )
            })?;
            let mut both = cert_pem;
            both.push(b'\n');
            both.extend_from_slice(&key_pem);
            let identity = reqwest::Identity::from_pem(&both).map_err(|e| {
                anyhow!(
                    "{}: client_cert_file {} with client_key_file {}: {}",
                    who,
                    cert_path.display(),
                    key_path.display(),
                    e.without_url()
                )
            })?;
            builder = builder.identity(identity);
        }
        (None, None) => {}
        // `PartnerConfig::check` refuses one without the other; a Partner built by hand may not.
        _ => bail!("{}: client_cert_file and client_key_file go together", who),
    }
    builder
        .build()
        .map_err(|e| anyhow!("{}: cannot build its HTTP client: {e}", who))
}

fn read(who: &str, key: &str, path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path)
        .with_context(|| format!("{}: {key} {}: cannot read it", who, path.display()))
}

/// The certificates of a PEM file; at least one.
fn certificates(
    who: &str,
    key: &str,
    path: &Path,
    pem: &[u8],
) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("{}: {key} {}: not a PEM file ({e})", who, path.display()))?;
    if certs.is_empty() {
        bail!(
            "{}: {key} {}: no PEM certificate in it",
            who,
            path.display()
        );
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::partners::PartnerConfig;
    use crate::secrets::Verifier;

    const URL: &str = "http://127.0.0.1:9/wsr";

    fn clients(config: PartnerConfig) -> PartnerClients {
        let partner = config
            .check("p", None, &BTreeSet::new())
            .expect("valid partner");
        let partners = Partners::new([partner], Verifier::default());
        PartnerClients::new(&partners, Duration::from_secs(1), Arc::default()).expect("clients")
    }

    #[test]
    fn our_credentials_go_in_a_header_no_debug_line_shows() {
        let clients = clients(PartnerConfig {
            address: Some(URL.into()),
            our_token: Some("tok-secret-0123".into()),
            ..PartnerConfig::default()
        });
        let request = clients
            .for_message("", URL)
            .post_soap(URL, SoapVersion::Soap12, "<x/>")
            .build()
            .expect("request");
        let auth = &request.headers()[AUTHORIZATION];
        assert_eq!(auth, "Bearer tok-secret-0123");
        assert!(auth.is_sensitive());
        assert!(!format!("{request:?}").contains("tok-secret-0123"));
        assert!(
            request.headers().get("soapaction").is_none(),
            "not SOAP 1.2"
        );
        // Another URL is no partner's: no credentials.
        let other = "http://127.0.0.1:9/other";
        let request = clients
            .for_message("", other)
            .post_soap(other, SoapVersion::Soap11, "<x/>")
            .build()
            .expect("request");
        assert!(request.headers().get(AUTHORIZATION).is_none());
        assert_eq!(request.headers()["soapaction"], "\"\"");
    }

    #[test]
    fn credentials_that_cannot_be_a_header_fail_without_showing_them() {
        let partner = PartnerConfig {
            address: Some(URL.into()),
            our_token: Some("tok\nsecret".into()),
            ..PartnerConfig::default()
        }
        .check("p", None, &BTreeSet::new())
        .expect("valid partner");
        let partners = Partners::new([partner], Verifier::default());
        let error = match PartnerClients::new(&partners, Duration::from_secs(1), Arc::default()) {
            Ok(_) => panic!("a token with a newline was taken"),
            Err(e) => format!("{e:#}"),
        };
        assert!(error.contains("partner p"), "{error}");
        assert!(!error.contains("secret"), "{error}");
    }
}
