//! Partners (D14): who may post to which channel and ack which of our messages, how each one
//! proves it (HTTP Basic, a bearer token, a TLS client certificate), what its messages may ask
//! for, and how we reach it (address, poll address, send window, agreement, our credentials,
//! the CA that verifies it). `[partners.NAME]` in the config; the old `NAME = "URL"` form is a
//! partner with an address and nothing else.
//!
//! Identification is decided here from what a request presented, and admission (`admit`) from
//! who it is and where it goes; the HTTP guard (`http::auth`) only gathers the headers and the
//! connection's certificate, and turns the outcome into a status.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde::Deserialize;

use crate::rmp::agreement::Feature;
use crate::secrets::{Secret, Stored, Verifier, load_secret, normal_fingerprint, relative_to};
pub use crate::secrets::{base64_decode, base64_encode};

/// The file format of one `[partners.NAME]` table. No `Debug`: it may hold secrets inline.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PartnerConfig {
    // ---- inbound: how the partner proves it, and where it may post ----
    /// Channels it may post to (any channel marked `anonymous` it may use anyway).
    pub channels: Vec<String>,
    /// HTTP Basic user name (default: the partner's name) and its password's PHC hash.
    pub username: Option<String>,
    pub password_hash: Option<String>,
    /// A bearer token it sends: as a PHC hash (argon2id) or as the SHA-256 of the token in hex
    /// (fine for long random tokens, and fast).
    pub token_hash: Option<String>,
    pub token_sha256: Option<String>,
    /// Client certificates it may present: by SHA-256 fingerprint (any CA, self-signed too),
    /// or by a DNS name or IP address in its subjectAltName, under `tls.client_ca`.
    pub cert_sha256: Vec<String>,
    pub cert_names: Vec<String>,
    /// ReplyTo URLs its Callback-pattern messages and polls may name.
    pub callback_endpoints: Vec<String>,
    /// A WS-Security UsernameToken in the envelope (D14): its `Username`, and either the
    /// PHC hash of its password (PasswordText only, over TLS or on loopback) or the password
    /// itself (PasswordDigest needs it; PasswordText too then).
    pub wss_username: Option<String>,
    pub wss_password_hash: Option<String>,
    pub wss_password: Option<String>,
    pub wss_password_file: Option<PathBuf>,
    pub wss_password_env: Option<String>,
    /// What its messages may ask for and must ask for, on top of the channel's agreement.
    pub offers: Option<Vec<String>>,
    pub requires: Vec<String>,
    /// Its own storage quota (D13), in place of the channel's: bytes its messages may keep
    /// stored, messages per second (`0`: no limit).
    pub max_stored_bytes: Option<u64>,
    pub max_messages_per_second: Option<u64>,
    // ---- outbound: how we reach it ----
    /// Where our messages to it go (`destination = "NAME"` in a submission).
    pub address: Option<String>,
    /// Where PollRequests for our Poll-pattern messages go (default: `address`).
    pub poll_address: Option<String>,
    /// Messages of one ordered group in flight at once (default: the global `send_window`).
    pub send_window: Option<u64>,
    /// The `[agreements]` entry used when a submission names none.
    pub agreement: Option<String>,
    /// PEM CA bundle that verifies its server certificate (default: the system roots).
    pub ca_file: Option<PathBuf>,
    /// Our client certificate chain and key (PEM) towards it.
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
    /// Our HTTP Basic credentials towards it…
    pub our_username: Option<String>,
    pub our_password: Option<String>,
    pub our_password_file: Option<PathBuf>,
    pub our_password_env: Option<String>,
    /// …or our bearer token towards it.
    pub our_token: Option<String>,
    pub our_token_file: Option<PathBuf>,
    pub our_token_env: Option<String>,
    /// Our UsernameToken towards it, added to every message and PollRequest we send it: a
    /// PasswordDigest unless `our_wss_password_text = true`.
    pub our_wss_username: Option<String>,
    pub our_wss_password: Option<String>,
    pub our_wss_password_file: Option<PathBuf>,
    pub our_wss_password_env: Option<String>,
    pub our_wss_password_text: bool,
}

/// A checked partner.
#[derive(Debug, Clone)]
pub struct Partner {
    pub name: String,
    pub inbound: Inbound,
    pub outbound: Outbound,
}

#[derive(Debug, Clone, Default)]
pub struct Inbound {
    pub channels: BTreeSet<String>,
    pub username: String,
    pub password: Option<Stored>,
    pub token: Option<Stored>,
    /// Lowercase hex.
    pub cert_sha256: BTreeSet<String>,
    pub cert_names: Vec<String>,
    pub callback_endpoints: Vec<String>,
    /// `None`: the channel's agreement alone.
    pub offers: Option<Vec<Feature>>,
    pub requires: Vec<Feature>,
    /// Its WS-Security UsernameToken, if it may prove itself in the envelope.
    pub wss: Option<WssCredential>,
    /// Its own storage quota, where it sets one (`None`: the channel's).
    pub max_stored_bytes: Option<u64>,
    pub max_messages_per_second: Option<u64>,
}

/// A partner's UsernameToken (D14): its username, and what its password is checked against.
#[derive(Debug, Clone)]
pub struct WssCredential {
    pub username: String,
    /// A PHC hash (PasswordText only), or the password itself (PasswordText and Digest).
    pub password: Stored,
}

/// Our UsernameToken towards a partner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OurWssToken {
    pub username: String,
    pub password: Secret,
    pub digest: bool,
}

impl Inbound {
    /// Whether the partner can prove who it is at all. One that cannot (an address-only
    /// partner) is reached by us but can only ever call in anonymously.
    pub fn has_credentials(&self) -> bool {
        self.password.is_some()
            || self.token.is_some()
            || self.wss.is_some()
            || !self.cert_sha256.is_empty()
            || !self.cert_names.is_empty()
    }
}

#[derive(Debug, Clone, Default)]
pub struct Outbound {
    pub address: Option<String>,
    pub poll_address: Option<String>,
    pub send_window: Option<u64>,
    pub agreement: Option<String>,
    pub tls: PartnerTls,
    pub credentials: Option<OurCredentials>,
    /// Our UsernameToken in every envelope we send it.
    pub wss: Option<OurWssToken>,
}

/// TLS towards a partner: files, read when the sender builds the partner's client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartnerTls {
    pub ca_file: Option<PathBuf>,
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
}

impl PartnerTls {
    pub fn is_default(&self) -> bool {
        *self == PartnerTls::default()
    }
}

/// What we present to a partner on every request we send it (messages, polls, callbacks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OurCredentials {
    Basic { username: String, password: Secret },
    Bearer(Secret),
}

/// The `our_*` keys of a partner or of a SOAP backend (`[channels.backend]`): what we present.
pub struct OurCredentialKeys<'a> {
    pub username: Option<String>,
    pub password: Option<&'a str>,
    pub password_file: Option<&'a Path>,
    pub password_env: Option<&'a str>,
    pub token: Option<&'a str>,
    pub token_file: Option<&'a Path>,
    pub token_env: Option<&'a str>,
}

impl OurCredentialKeys<'_> {
    /// Basic (username and password), Bearer (a token), or none; `who` names the owner in
    /// errors. Secrets are read here (inline, from a file, or from the environment).
    pub fn check(self, who: &str, base: Option<&Path>) -> anyhow::Result<Option<OurCredentials>> {
        let ctx = |what: &str| format!("{who}: {what}");
        let password = load_secret(
            &ctx("our_password"),
            base,
            self.password,
            self.password_file,
            self.password_env,
        )?;
        let token = load_secret(
            &ctx("our_token"),
            base,
            self.token,
            self.token_file,
            self.token_env,
        )?;
        Ok(match (self.username, password, token) {
            (_, Some(_), Some(_)) => bail!("{who}: give our_password or our_token, not both"),
            (Some(username), Some(password), None) => {
                if username.contains(':') {
                    bail!("{who}: our_username may not contain ':'");
                }
                Some(OurCredentials::Basic { username, password })
            }
            (None, Some(_), None) => bail!("{who}: our_password needs our_username"),
            (Some(_), None, _) => bail!("{who}: our_username needs our_password"),
            (None, None, Some(token)) => Some(OurCredentials::Bearer(token)),
            (None, None, None) => None,
        })
    }
}

impl OurCredentials {
    /// The `Authorization` header value.
    pub fn header(&self) -> String {
        match self {
            OurCredentials::Basic { username, password } => format!(
                "Basic {}",
                base64_encode(format!("{username}:{}", password.expose()).as_bytes())
            ),
            OurCredentials::Bearer(token) => format!("Bearer {}", token.expose()),
        }
    }
}

impl PartnerConfig {
    /// Checks one partner. `base` is the config file's folder (relative `…_file` paths);
    /// `channels` the configured channel names.
    pub fn check(
        self,
        name: &str,
        base: Option<&Path>,
        channels: &BTreeSet<String>,
    ) -> anyhow::Result<Partner> {
        let ctx = |what: &str| format!("partner {name}: {what}");
        if name.is_empty() || name.contains(['/', ':']) || name.chars().any(char::is_whitespace) {
            bail!("partner name {name:?} is not allowed (empty, '/', ':' or whitespace)");
        }
        // `anonymous` is the metrics label, and "(…)" the console's words, for callers that
        // are no configured partner: a partner of that name would be counted as them.
        if name == crate::metrics::ANONYMOUS || name.starts_with('(') {
            bail!(
                "partner name {name:?} is reserved (\"anonymous\" and names starting with '(' \
                 stand for callers without a partner)"
            );
        }
        for c in &self.channels {
            if !channels.contains(c) {
                bail!("partner {name}: channels: there is no channel {c:?}");
            }
        }
        let password = self
            .password_hash
            .as_deref()
            .map(|h| Stored::hash(&ctx("password_hash"), h))
            .transpose()?;
        let token = match (&self.token_hash, &self.token_sha256) {
            (Some(_), Some(_)) => {
                bail!("partner {name}: give token_hash or token_sha256, not both")
            }
            (Some(h), None) => Some(Stored::hash(&ctx("token_hash"), h)?),
            (None, Some(hex)) => Some(Stored::sha256(&ctx("token_sha256"), hex)?),
            (None, None) => None,
        };
        let mut cert_sha256 = BTreeSet::new();
        for f in &self.cert_sha256 {
            let hex = normal_fingerprint(f).with_context(|| {
                ctx(&format!("cert_sha256: {f:?} is not a SHA-256 fingerprint"))
            })?;
            cert_sha256.insert(hex);
        }
        for n in &self.cert_names {
            if rustls::pki_types::ServerName::try_from(n.as_str()).is_err() {
                bail!("partner {name}: cert_names: {n:?} is not a DNS name or IP address");
            }
        }
        for url in self
            .callback_endpoints
            .iter()
            .chain(&self.address)
            .chain(&self.poll_address)
        {
            crate::endpoint::check_endpoint(url).with_context(|| ctx("URL"))?;
        }
        let features = |names: &[String]| -> anyhow::Result<Vec<Feature>> {
            names
                .iter()
                .map(|n| Feature::parse(n).with_context(|| ctx(&format!("unknown feature {n:?}"))))
                .collect()
        };
        let offers = self.offers.as_deref().map(features).transpose()?;
        let requires = features(&self.requires)?;
        let credentials = OurCredentialKeys {
            username: self.our_username,
            password: self.our_password.as_deref(),
            password_file: self.our_password_file.as_deref(),
            password_env: self.our_password_env.as_deref(),
            token: self.our_token.as_deref(),
            token_file: self.our_token_file.as_deref(),
            token_env: self.our_token_env.as_deref(),
        }
        .check(&format!("partner {name}"), base)?;
        let wss_secret = load_secret(
            &ctx("wss_password"),
            base,
            self.wss_password.as_deref(),
            self.wss_password_file.as_deref(),
            self.wss_password_env.as_deref(),
        )?;
        let wss = match (self.wss_username, &self.wss_password_hash, wss_secret) {
            (None, None, None) => None,
            (Some(_), Some(_), Some(_)) => {
                bail!("partner {name}: give wss_password_hash or wss_password, not both")
            }
            (Some(username), Some(hash), None) => Some(WssCredential {
                username,
                password: Stored::hash(&ctx("wss_password_hash"), hash)?,
            }),
            (Some(username), None, Some(secret)) => Some(WssCredential {
                username,
                password: Stored::Plain(secret),
            }),
            (Some(_), None, None) => {
                bail!("partner {name}: wss_username needs wss_password_hash or wss_password")
            }
            (None, _, _) => bail!("partner {name}: a wss password needs wss_username"),
        };
        let our_wss_secret = load_secret(
            &ctx("our_wss_password"),
            base,
            self.our_wss_password.as_deref(),
            self.our_wss_password_file.as_deref(),
            self.our_wss_password_env.as_deref(),
        )?;
        let our_wss = match (self.our_wss_username, our_wss_secret) {
            (Some(username), Some(password)) => Some(OurWssToken {
                username,
                password,
                digest: !self.our_wss_password_text,
            }),
            (None, None) => None,
            _ => bail!("partner {name}: our_wss_username and our_wss_password go together"),
        };
        if self.client_cert_file.is_some() != self.client_key_file.is_some() {
            bail!("partner {name}: client_cert_file and client_key_file go together");
        }
        if self.send_window == Some(0) {
            bail!("partner {name}: send_window must be at least 1");
        }
        let username = self.username.unwrap_or_else(|| name.to_owned());
        if username.contains(':') {
            bail!("partner {name}: username may not contain ':'");
        }
        Ok(Partner {
            name: name.to_owned(),
            inbound: Inbound {
                channels: self.channels.into_iter().collect(),
                username,
                password,
                token,
                cert_sha256,
                cert_names: self.cert_names,
                callback_endpoints: self.callback_endpoints,
                offers,
                requires,
                wss,
                max_stored_bytes: self.max_stored_bytes,
                max_messages_per_second: self.max_messages_per_second,
            },
            outbound: Outbound {
                address: self.address,
                poll_address: self.poll_address,
                send_window: self.send_window,
                agreement: self.agreement,
                tls: PartnerTls {
                    ca_file: self.ca_file.map(|p| relative_to(base, &p)),
                    client_cert_file: self.client_cert_file.map(|p| relative_to(base, &p)),
                    client_key_file: self.client_key_file.map(|p| relative_to(base, &p)),
                },
                credentials,
                wss: our_wss,
            },
        })
    }
}

/// A partner in the old form: a name for an address, nothing else.
pub fn address_only(name: &str, address: String) -> Partner {
    Partner {
        name: name.to_owned(),
        inbound: Inbound {
            username: name.to_owned(),
            ..Inbound::default()
        },
        outbound: Outbound {
            address: Some(address),
            ..Outbound::default()
        },
    }
}

/// Who made a request to /wsr: a configured partner, or anonymous ("" in the store).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Caller {
    pub partner: Option<String>,
}

impl Caller {
    pub fn key(&self) -> &str {
        self.partner.as_deref().unwrap_or("")
    }
}

/// Why a request to `/wsr` may not go on, once it is known who sent it (or that it presented
/// nothing): the guard logs it and answers with its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Nothing presented, where anonymous requests are not allowed (401).
    CredentialsRequired,
    /// This partner posted to a channel that is neither its own nor anonymous (403).
    ChannelNotAllowed { partner: String },
}

/// The access rule of D14, after identification: a partner may post to its own channels and to
/// anonymous ones, and may always send acks and faults for our messages (`channel` `None`: the
/// callback route); a request that presented nothing goes on only where `anonymous_ok`.
pub fn admit(
    partner: Option<&Partner>,
    channel: Option<&str>,
    anonymous_ok: bool,
) -> Result<Caller, Refused> {
    match partner {
        Some(p) => {
            let may_post = channel.is_none_or(|c| anonymous_ok || p.inbound.channels.contains(c));
            if !may_post {
                return Err(Refused::ChannelNotAllowed {
                    partner: p.name.clone(),
                });
            }
            Ok(Caller {
                partner: Some(p.name.clone()),
            })
        }
        None if anonymous_ok => Ok(Caller::default()),
        None => Err(Refused::CredentialsRequired),
    }
}

/// The client certificate a request came with: from this connection's TLS handshake, or
/// from a trusted proxy's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCertificate {
    /// The end-entity certificate, DER.
    pub der: Vec<u8>,
    /// Whether it chains to `tls.client_ca` (checked in the handshake, or by the proxy).
    /// Only then do `cert_names` count; a fingerprint counts either way.
    pub chain_verified: bool,
}

/// What a request presented.
#[derive(Debug, Clone, Copy, Default)]
pub struct Presented<'a> {
    /// The `Authorization` header, if any (not valid UTF-8: counted as wrong).
    pub authorization: Option<&'a [u8]>,
    pub certificate: Option<&'a ClientCertificate>,
}

/// Why a request could not be identified: both are 401, with a reason for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unidentified {
    /// Why what was presented matched no partner (or two different ones): a fixed text.
    pub why: &'static str,
    /// The username presented (Basic, UsernameToken), when there was one: the operator's
    /// partners view tells refused sign-ins by it.
    pub username: Option<String>,
    /// The partner whose username it is (a wrong password), when it is one.
    pub partner: Option<String>,
}

impl Unidentified {
    fn wrong(why: &'static str) -> Unidentified {
        Unidentified {
            why,
            username: None,
            partner: None,
        }
    }

    /// This refusal of `username`, which is `partner`'s (or nobody's).
    fn of_user(self, username: &str, partner: Option<&Partner>) -> Unidentified {
        Unidentified {
            username: Some(username.to_owned()),
            partner: partner.map(|p| p.name.clone()),
            ..self
        }
    }
}

impl std::fmt::Display for Unidentified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.why)
    }
}

/// Every configured partner, by name; what identifies a request.
#[derive(Debug, Clone, Default)]
pub struct Partners {
    by_name: BTreeMap<String, Partner>,
    verifier: Verifier,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Verifier")
    }
}

impl Partners {
    pub fn new(partners: impl IntoIterator<Item = Partner>, verifier: Verifier) -> Partners {
        Partners {
            by_name: partners.into_iter().map(|p| (p.name.clone(), p)).collect(),
            verifier,
        }
    }

    /// Adds (or replaces) a partner in the old form: a name for an address.
    pub fn insert_address(&mut self, name: &str, address: impl Into<String>) {
        self.by_name
            .insert(name.to_owned(), address_only(name, address.into()));
    }

    /// Adds (or replaces) a partner.
    pub fn insert(&mut self, partner: Partner) {
        self.by_name.insert(partner.name.clone(), partner);
    }

    pub fn clear(&mut self) {
        self.by_name.clear();
    }

    /// Whose messages a callback from `caller` may settle (D14): an authenticated partner
    /// only its own; an anonymous caller those sent to URL destinations ("") and to partners
    /// that cannot authenticate (they can only ever call in anonymously), never a
    /// credentialed partner's.
    pub fn settled_by(&self, caller: &Caller) -> Vec<String> {
        match &caller.partner {
            Some(partner) => vec![partner.clone()],
            None => std::iter::once(String::new())
                .chain(
                    self.iter()
                        .filter(|p| !p.inbound.has_credentials())
                        .map(|p| p.name.clone()),
                )
                .collect(),
        }
    }

    pub fn get(&self, name: &str) -> Option<&Partner> {
        self.by_name.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Partner> {
        self.by_name.values()
    }

    /// Who presented this: `Ok(None)` if nothing was presented (an anonymous request; whether
    /// it may go on is the caller's rule), the partner whose credentials match, or
    /// `Unidentified` when what was presented matches nobody. A certificate and an
    /// `Authorization` header that both match must match the same partner.
    pub async fn identify(
        &self,
        presented: Presented<'_>,
    ) -> Result<Option<&Partner>, Unidentified> {
        // A certificate no partner owns is no identity, but not a refusal by itself: under a
        // shared CA a partner may hold a certificate it does not authenticate with here (it
        // uses Basic). With nothing else presented, though, it is refused, not anonymous.
        let by_cert = presented.certificate.and_then(|c| self.by_certificate(c));
        let by_header = match presented.authorization {
            None => None,
            Some(raw) => {
                let value = std::str::from_utf8(raw)
                    .map_err(|_| Unidentified::wrong("unreadable Authorization header"))?;
                Some(self.by_authorization(value).await?)
            }
        };
        match (by_cert, by_header) {
            (Some(a), Some(b)) if a.name != b.name => Err(Unidentified::wrong(
                "the certificate and the Authorization header name different partners",
            )),
            (Some(p), _) | (None, Some(p)) => Ok(Some(p)),
            (None, None) if presented.certificate.is_some() => Err(Unidentified::wrong(
                "the client certificate is not a partner's",
            )),
            (None, None) => Ok(None),
        }
    }

    fn by_certificate(&self, cert: &ClientCertificate) -> Option<&Partner> {
        let fingerprint = crate::secrets::sha256_hex(&cert.der);
        if let Some(p) = self
            .iter()
            .find(|p| p.inbound.cert_sha256.contains(&fingerprint))
        {
            return Some(p);
        }
        if !cert.chain_verified {
            return None;
        }
        let der = rustls::pki_types::CertificateDer::from(cert.der.as_slice());
        let end_entity = webpki::EndEntityCert::try_from(&der).ok()?;
        self.iter().find(|p| {
            p.inbound.cert_names.iter().any(|n| {
                rustls::pki_types::ServerName::try_from(n.as_str())
                    .is_ok_and(|name| end_entity.verify_is_valid_for_subject_name(&name).is_ok())
            })
        })
    }

    /// Whether some partner may prove itself by a UsernameToken on `channel` (`None`: the
    /// callback route, which every partner may use): a request without other credentials is
    /// then let in to have its envelope read.
    pub fn token_may_reach(&self, channel: Option<&str>) -> bool {
        self.iter().any(|p| {
            p.inbound.wss.is_some() && channel.is_none_or(|c| p.inbound.channels.contains(c))
        })
    }

    /// The partner a WS-Security UsernameToken proves (D14): its username and its password,
    /// as a PasswordDigest of the token's nonce and `Created`, or as PasswordText where
    /// `text_allowed` (over TLS or from loopback: elsewhere the password would cross the
    /// network readable). A username nobody has costs what a wrong password costs.
    pub async fn by_username_token(
        &self,
        token: &crate::wsr::UsernameToken,
        text_allowed: bool,
    ) -> Result<&Partner, Unidentified> {
        let wrong = Unidentified::wrong("wrong UsernameToken");
        let presented = token.password.as_deref().unwrap_or_default();
        let tokens = || {
            self.iter()
                .filter_map(|p| Some((p, p.inbound.wss.as_ref()?)))
        };
        let Some((partner, wss)) = tokens().find(|(_, w)| w.username == token.username) else {
            let like = tokens()
                .map(|(_, w)| &w.password)
                .find(|stored| matches!(stored, Stored::Hash(_)))
                .or_else(|| tokens().map(|(_, w)| &w.password).next());
            if let Some(like) = like {
                self.verifier.refuse_like(like, presented).await;
            }
            return Err(wrong.of_user(&token.username, None));
        };
        let wrong = wrong.of_user(&token.username, Some(partner));
        if token.digest {
            let Stored::Plain(secret) = &wss.password else {
                return Err(Unidentified {
                    why: "this partner's UsernameToken is checked as PasswordText only",
                    ..wrong
                });
            };
            let nonce = token.nonce.as_deref().unwrap_or_default();
            let created = token.created.as_deref().unwrap_or_default();
            let Some(expected) = crate::wss::password_digest(nonce, created, secret.expose())
            else {
                return Err(Unidentified {
                    why: "the UsernameToken's Nonce is not base64",
                    ..wrong
                });
            };
            return match crate::secrets::constant_time_eq(expected.as_bytes(), presented.as_bytes())
            {
                true => Ok(partner),
                false => Err(wrong),
            };
        }
        if !text_allowed {
            return Err(Unidentified {
                why: "a PasswordText is accepted only over TLS or from loopback",
                ..wrong
            });
        }
        match self.verifier.matches(&wss.password, presented).await {
            true => Ok(partner),
            false => Err(wrong),
        }
    }

    async fn by_authorization(&self, value: &str) -> Result<&Partner, Unidentified> {
        let wrong = Unidentified::wrong("wrong credentials");
        let Some((scheme, rest)) = value.trim().split_once(' ') else {
            return Err(wrong);
        };
        let rest = rest.trim();
        if scheme.eq_ignore_ascii_case("basic") {
            let decoded =
                base64_decode(rest).ok_or(Unidentified::wrong("unreadable Basic credentials"))?;
            let decoded = String::from_utf8(decoded)
                .map_err(|_| Unidentified::wrong("unreadable Basic credentials"))?;
            let (user, password) = decoded
                .split_once(':')
                .ok_or(Unidentified::wrong("unreadable Basic credentials"))?;
            let Some(partner) = self
                .iter()
                .find(|p| p.inbound.username == user && p.inbound.password.is_some())
            else {
                // A user nobody is costs what a wrong password costs: the time taken does not
                // tell which users exist.
                // The costliest kind configured is imitated: a hashed password if any partner
                // has one (the others cost microseconds and would set it apart).
                let passwords = || self.iter().filter_map(|p| p.inbound.password.as_ref());
                let like = passwords()
                    .find(|stored| matches!(stored, Stored::Hash(_)))
                    .or_else(|| passwords().next());
                if let Some(like) = like {
                    self.verifier.refuse_like(like, password).await;
                }
                return Err(wrong.of_user(user, None));
            };
            match &partner.inbound.password {
                Some(stored) if self.verifier.matches(stored, password).await => Ok(partner),
                _ => Err(wrong.of_user(user, Some(partner))),
            }
        } else if scheme.eq_ignore_ascii_case("bearer") {
            for partner in self.iter() {
                if let Some(stored) = &partner.inbound.token
                    && self.verifier.matches(stored, rest).await
                {
                    return Ok(partner);
                }
            }
            Err(wrong)
        } else {
            Err(Unidentified::wrong("unsupported Authorization scheme"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_and_refuses_junk() {
        for s in ["", "a", "ab", "abc", "abcd", "acme:pä ss"] {
            let e = base64_encode(s.as_bytes());
            assert_eq!(base64_decode(&e).as_deref(), Some(s.as_bytes()), "{s}");
        }
        assert_eq!(base64_encode(b"acme:secret"), "YWNtZTpzZWNyZXQ=");
        for bad in ["YWN", "YW=j", "Y===", "!!!!"] {
            assert_eq!(base64_decode(bad), None, "{bad}");
        }
    }

    fn partner(name: &str, config: PartnerConfig) -> Partner {
        let channels: BTreeSet<String> = ["orders".to_owned()].into();
        config.check(name, None, &channels).expect("valid partner")
    }

    #[tokio::test]
    async fn requests_are_identified_by_what_they_present() {
        let hash = crate::secrets::hash_secret("pw-of-acme").expect("hash");
        let token = "tok-of-globex-0123456789";
        let acme = partner(
            "acme",
            PartnerConfig {
                channels: vec!["orders".into()],
                password_hash: Some(hash),
                cert_sha256: vec![crate::secrets::sha256_hex(b"acme-cert")],
                ..PartnerConfig::default()
            },
        );
        let globex = partner(
            "globex",
            PartnerConfig {
                token_sha256: Some(crate::secrets::sha256_hex(token.as_bytes())),
                ..PartnerConfig::default()
            },
        );
        let partners = Partners::new([acme, globex], Verifier::default());
        let basic = |user: &str, pw: &str| {
            format!("Basic {}", base64_encode(format!("{user}:{pw}").as_bytes()))
        };
        let who = |auth: Option<String>, cert: Option<ClientCertificate>| {
            let partners = &partners;
            async move {
                partners
                    .identify(Presented {
                        authorization: auth.as_deref().map(str::as_bytes),
                        certificate: cert.as_ref(),
                    })
                    .await
                    .map(|p| p.map(|p| p.name.clone()))
            }
        };
        assert_eq!(who(None, None).await, Ok(None));
        assert_eq!(
            who(Some(basic("acme", "pw-of-acme")), None).await,
            Ok(Some("acme".into()))
        );
        assert!(who(Some(basic("acme", "wrong")), None).await.is_err());
        assert!(
            who(Some(basic("globex", "pw-of-acme")), None)
                .await
                .is_err()
        );
        assert_eq!(
            who(Some(format!("Bearer {token}")), None).await,
            Ok(Some("globex".into()))
        );
        assert!(who(Some("Bearer nope".into()), None).await.is_err());
        assert!(who(Some("Digest x".into()), None).await.is_err());
        let cert = |der: &[u8]| ClientCertificate {
            der: der.to_vec(),
            chain_verified: false,
        };
        assert_eq!(
            who(None, Some(cert(b"acme-cert"))).await,
            Ok(Some("acme".into()))
        );
        assert!(who(None, Some(cert(b"other-cert"))).await.is_err());
        assert_eq!(
            who(Some(format!("Bearer {token}")), Some(cert(b"other-cert"))).await,
            Ok(Some("globex".into())),
            "a certificate nobody owns does not spoil valid Basic or bearer credentials"
        );
        assert!(
            who(Some(format!("Bearer {token}")), Some(cert(b"acme-cert")))
                .await
                .is_err(),
            "two different partners"
        );
    }

    /// Basic credentials naming a user nobody is cost one argon2 check, as a wrong password
    /// does (review item 9): the time taken does not tell which users exist.
    #[tokio::test]
    async fn an_unknown_user_costs_what_a_wrong_password_costs() {
        let acme = partner(
            "acme",
            PartnerConfig {
                channels: vec!["orders".into()],
                password_hash: Some(crate::secrets::hash_secret("pw-of-acme").expect("hash")),
                ..PartnerConfig::default()
            },
        );
        let verifier = Verifier::default();
        let partners = Partners::new([acme], verifier.clone());
        let basic = |user: &str, pw: &str| {
            let value = format!("Basic {}", base64_encode(format!("{user}:{pw}").as_bytes()));
            let partners = &partners;
            async move {
                partners
                    .identify(Presented {
                        authorization: Some(value.as_bytes()),
                        certificate: None,
                    })
                    .await
                    .map(|p| p.map(|p| p.name.clone()))
            }
        };
        for (user, password) in [
            ("acme", "wrong"),
            ("nobody", "wrong"),
            ("nobody", "pw-of-acme"),
            ("", ""),
        ] {
            let before = verifier.hashes_computed();
            let refused = basic(user, password).await.expect_err("refused");
            assert_eq!(refused.why, "wrong credentials", "{user}:{password}");
            // The refusal names the username tried, and the partner only when it is one's.
            assert_eq!(refused.username.as_deref(), Some(user), "{user}:{password}");
            let owner = (user == "acme").then(|| "acme".to_owned());
            assert_eq!(refused.partner, owner, "{user}:{password}");
            assert_eq!(
                verifier.hashes_computed(),
                before + 1,
                "{user}:{password} cost one check"
            );
        }
        assert_eq!(basic("acme", "pw-of-acme").await, Ok(Some("acme".into())));
        // With no partner that has a password there is no user to tell apart: no check.
        let nobody = Partners::new([], verifier.clone());
        let before = verifier.hashes_computed();
        let value = format!("Basic {}", base64_encode(b"acme:pw-of-acme"));
        let refused = nobody
            .identify(Presented {
                authorization: Some(value.as_bytes()),
                certificate: None,
            })
            .await;
        assert!(refused.is_err());
        assert_eq!(verifier.hashes_computed(), before);
    }

    #[test]
    fn partners_post_to_their_channels_and_anyone_where_anonymous() {
        let acme = partner(
            "acme",
            PartnerConfig {
                channels: vec!["orders".into()],
                ..PartnerConfig::default()
            },
        );
        let as_acme = Ok(Caller {
            partner: Some("acme".into()),
        });
        assert_eq!(admit(Some(&acme), Some("orders"), false), as_acme);
        assert_eq!(
            admit(Some(&acme), Some("invoices"), false),
            Err(Refused::ChannelNotAllowed {
                partner: "acme".into()
            })
        );
        assert_eq!(admit(Some(&acme), Some("invoices"), true), as_acme);
        assert_eq!(admit(Some(&acme), None, false), as_acme, "callbacks");
        assert_eq!(admit(None, Some("orders"), true), Ok(Caller::default()));
        assert_eq!(
            admit(None, Some("orders"), false),
            Err(Refused::CredentialsRequired)
        );
        assert_eq!(admit(None, None, true), Ok(Caller::default()));
        assert_eq!(admit(None, None, false), Err(Refused::CredentialsRequired));
    }

    #[test]
    fn partner_mistakes_are_refused() {
        let channels: BTreeSet<String> = ["orders".to_owned()].into();
        let bad = [
            PartnerConfig {
                channels: vec!["nowhere".into()],
                ..Default::default()
            },
            PartnerConfig {
                password_hash: Some("plain".into()),
                ..Default::default()
            },
            PartnerConfig {
                cert_sha256: vec!["abcd".into()],
                ..Default::default()
            },
            PartnerConfig {
                our_password: Some("x".into()),
                ..Default::default()
            },
            PartnerConfig {
                client_cert_file: Some("c.pem".into()),
                ..Default::default()
            },
            PartnerConfig {
                address: Some("ftp://x".into()),
                ..Default::default()
            },
            PartnerConfig {
                send_window: Some(0),
                ..Default::default()
            },
            // A UsernameToken needs its username and exactly one kind of password.
            PartnerConfig {
                wss_username: Some("u".into()),
                ..Default::default()
            },
            PartnerConfig {
                wss_password: Some("x".into()),
                ..Default::default()
            },
            PartnerConfig {
                wss_username: Some("u".into()),
                wss_password: Some("x".into()),
                wss_password_hash: Some(crate::secrets::hash_secret("x").expect("hash")),
                ..Default::default()
            },
            PartnerConfig {
                our_wss_username: Some("u".into()),
                ..Default::default()
            },
        ];
        for (i, config) in bad.into_iter().enumerate() {
            assert!(config.check("p", None, &channels).is_err(), "case {i}");
        }
        assert!(
            PartnerConfig::default()
                .check("a/b", None, &channels)
                .is_err()
        );
    }
}
