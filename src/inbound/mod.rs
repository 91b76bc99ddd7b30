//! The receiving RMP as services (DESIGN §3): what a reliable message or a PollRequest posted
//! to `/wsr/{channel}` gets. Each service takes the store, the clock, the settings, the
//! authenticated caller and a read envelope, decides over the store, and returns a domain
//! `Answer` with what the access log should say of it. Never axum, never rendering: that is
//! `http/wsr.rs` and `http/soap.rs`.

pub mod callback;
pub mod poll;
pub mod receive;
pub mod respond;
pub mod security;

use std::net::{IpAddr, SocketAddr};

use crate::clock::Clock;
use crate::config::Config;
use crate::outbound::backend::Backends;
use crate::partners::Caller;
use crate::rmp::agreement::Agreement;
use crate::store::{CachedAnswer, Received, ReceivedMessage, Store};
use crate::wsr::{FaultCode, Response, SoapVersion};

/// What the services work with: the store, the clock every decision reads, the settings.
#[derive(Clone, Copy)]
pub struct Inbound<'a> {
    pub store: &'a Store,
    pub clock: &'a dyn Clock,
    pub config: &'a Config,
    /// The SOAP services behind request-response channels (D16).
    pub backends: &'a Backends,
}

/// How a request is answered, before it is rendered (DESIGN D4, D5, D11).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// HTTP 200 with a `wsrm:Response` header and an empty Body; `None`: nothing to say on
    /// this connection (answered by callback or poll, or not yet), HTTP 202 with no body.
    Replies(Option<Response>),
    /// A SOAP Fault. With `replies`, the message's own fault indication (and any poll answers)
    /// ride along in the header — the Response pattern's fault (D4); without, a synchronous
    /// fault for a message whose reply pattern cannot carry it.
    Fault {
        code: FaultCode,
        reason: String,
        replies: Option<Response>,
    },
    /// Header blocks marked `mustUnderstand` that this gateway does not understand (SOAP's
    /// own MustUnderstand fault, not a WS-R one).
    NotUnderstood(Vec<String>),
    /// A request-response channel's answer (D16): the bytes every copy of the request gets.
    Business(CachedAnswer),
}

impl Answer {
    /// A synchronous WS-R fault, with no `wsrm:Response`.
    pub fn fault(code: FaultCode, reason: impl Into<String>) -> Answer {
        Answer::Fault {
            code,
            reason: reason.into(),
            replies: None,
        }
    }
}

/// A service's answer, in the SOAP version to render it in, with its access-log note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub version: SoapVersion,
    pub answer: Answer,
    pub note: Note,
}

/// What the access log and the metrics say of one `/wsr` request: filled in as the service
/// decides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Note {
    /// The partner a UsernameToken in the envelope proved (the guard knows the others).
    pub partner: Option<String>,
    pub group_id: Option<String>,
    pub number: Option<u64>,
    /// What became of it: `delivered`, `duplicate`, `buffered`, a fault code, `poll`, …
    pub verdict: Option<String>,
    /// The WS-R fault it got, if any (then also its `verdict`).
    pub fault: Option<FaultCode>,
}

impl Note {
    pub fn faulted(&mut self, code: FaultCode) {
        self.verdict = Some(code.local_name().to_owned());
        self.fault = Some(code);
    }
}

/// Who sent the request: the authenticated partner (or an anonymous caller), and the source
/// its new groups count against.
#[derive(Debug, Clone, Default)]
pub struct Sender {
    pub caller: Caller,
    /// `partner:{name}`, or the anonymous peer's address (`source_of`).
    pub source: String,
}

impl Sender {
    /// New groups count against the partner's quota, or the peer address's when anonymous.
    pub fn new(caller: Caller, peer: Option<SocketAddr>) -> Sender {
        let source = match &caller.partner {
            Some(name) => partner_source(name),
            None => source_of(peer),
        };
        Sender { caller, source }
    }

    /// Whose state the request may see and change ("" for an anonymous caller, D14).
    pub fn partner(&self) -> &str {
        self.caller.key()
    }
}

/// Tells the operator of a message its source's storage quota held back (D13): the metric,
/// the console's list of sources held back, and a log line once a minute per source.
pub fn note_held_back(message: &ReceivedMessage, received: &Received) {
    note_held_back_of(
        &message.channel,
        &message.partner,
        &message.source,
        received,
    );
}

/// `note_held_back` for a message handed to the store already: its channel, partner ("" for
/// anonymous) and source.
pub fn note_held_back_of(channel: &str, partner: &str, source: &str, received: &Received) {
    let Some(held) = received.held_back else {
        return;
    };
    if crate::metrics::held_back(channel, partner, source, held.as_str(), chrono::Utc::now()) {
        tracing::warn!(
            %channel,
            partner = %crate::metrics::partner(Some(partner)),
            %source,
            quota = held.as_str(),
            "a source is held back by its storage quota: its messages get MessageProcessingFailure until it has room"
        );
    }
}

/// The source a named partner's groups and kept answers count against.
pub fn partner_source(name: &str) -> String {
    format!("partner:{name}")
}

/// The source an anonymous request's new groups count against: the peer's IPv4 address, or
/// its IPv6 /64 (one host may hold a whole /64, so a single address would be no quota at all).
pub fn source_of(peer: Option<SocketAddr>) -> String {
    let Some(addr) = peer else {
        return String::new();
    };
    // An IPv4 address written as IPv6 (`::ffff:192.0.2.7`) is that IPv4 address.
    match addr.ip().to_canonical() {
        IpAddr::V4(v4) => dotted_quad(v4),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
        }
    }
}

/// `a.b.c.d`, as `Ipv4Addr`'s `Display` writes it, without `core::fmt` (which buffers the
/// address to pad it): every anonymous request names its source, some twice.
fn dotted_quad(v4: std::net::Ipv4Addr) -> String {
    let mut text = String::with_capacity(15);
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            text.push('.');
        }
        crate::wsr::datetime::push_decimal(&mut text, u32::from(octet), 1);
    }
    text
}

/// The agreement a channel holds `caller` to, or `None` for a channel that does not exist:
/// a partner's own agreement narrows the channel's (D14).
pub fn agreement_for(config: &Config, channel: &str, caller: &Caller) -> Option<Agreement> {
    let channel_agreement = config.channels.get(channel)?;
    let profile = caller
        .partner
        .as_deref()
        .and_then(|p| config.partners.get(p));
    Some(match profile {
        Some(p) => {
            let mut agreement =
                channel_agreement.for_partner(p.inbound.offers.as_deref(), &p.inbound.requires);
            agreement.quota = agreement.quota.overridden(
                p.inbound.max_stored_bytes,
                p.inbound.max_messages_per_second,
            );
            agreement
        }
        None => channel_agreement.clone(),
    })
}

#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod tests {
    use super::*;

    fn of(addr: &str) -> String {
        source_of(Some(addr.parse().expect("address")))
    }

    #[test]
    fn a_source_is_an_ipv4_address_or_an_ipv6_64() {
        assert_eq!(of("192.0.2.7:4000"), "192.0.2.7");
        assert_eq!(of("192.0.2.7:4001"), "192.0.2.7", "any port");
        assert_eq!(of("[2001:db8:1:2:aaaa::1]:80"), "2001:db8:1:2::/64");
        assert_eq!(
            of("[2001:db8:1:2:bbbb::9]:80"),
            "2001:db8:1:2::/64",
            "one /64"
        );
        assert_eq!(of("[::ffff:192.0.2.7]:80"), "192.0.2.7");
        assert_eq!(source_of(None), "");
    }

    #[test]
    fn an_ipv4_source_is_written_as_display_writes_it() {
        for octets in [
            [0, 0, 0, 0],
            [255, 255, 255, 255],
            [9, 10, 99, 100],
            [127, 0, 0, 1],
        ] {
            let v4 = std::net::Ipv4Addr::from(octets);
            assert_eq!(dotted_quad(v4), v4.to_string());
        }
    }

    #[test]
    fn a_named_partner_counts_against_its_own_quota() {
        let caller = Caller {
            partner: Some("acme".into()),
        };
        let sender = Sender::new(caller, Some("192.0.2.7:4000".parse().expect("addr")));
        assert_eq!(sender.source, "partner:acme");
        assert_eq!(sender.partner(), "acme");
    }
}

#[cfg(test)]
mod quota_tests {
    use super::*;
    use crate::rmp::quota::SourceQuota;

    #[test]
    fn a_partners_quota_replaces_its_channels_which_replaces_the_top_levels() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gateway.toml");
        std::fs::write(
            &path,
            r#"
max_stored_bytes_per_source = 5000
max_messages_per_second_per_source = 50

[[channels]]
name = "plain"

[[channels]]
name = "tight"
max_stored_bytes_per_source = 100

[partners.acme]
channels = ["tight"]
token_sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
max_messages_per_second = 0
"#,
        )
        .expect("write config");
        let config = Config::load(Some(&path), []).expect("valid");
        let quota = |channel: &str, partner: Option<&str>| {
            let caller = Caller {
                partner: partner.map(str::to_owned),
            };
            agreement_for(&config, channel, &caller)
                .expect("channel")
                .quota
        };
        let q = |max_stored_bytes, max_messages_per_second| SourceQuota {
            max_stored_bytes,
            max_messages_per_second,
        };
        assert_eq!(quota("plain", None), q(5000, 50));
        assert_eq!(quota("tight", None), q(100, 50));
        assert_eq!(quota("tight", Some("acme")), q(100, 0));
    }
}
