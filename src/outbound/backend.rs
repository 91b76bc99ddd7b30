//! The SOAP services behind request-response channels (D16): how each is reached (its own
//! client: no redirects, its timeout, its TLS), how many calls may be out at once, and one
//! call: the partner's envelope without its WS-R blocks, with the idempotency headers, the
//! answer read within the cap and judged (`rmp::exchange::judge`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::http_client::{self, exchange};
use super::partner_clients::tls_client;
use crate::partners::{OurCredentials, PartnerTls};
use crate::rmp::exchange::{Judged, OnUnknown, judge};
use crate::rmp::sender::AttemptFailure;
use crate::wsr::SoapVersion;

/// A request-response channel: who answers, and what an unknown outcome gets.
#[derive(Debug, Clone)]
pub struct RequestResponse {
    pub responder: Responder,
    pub on_unknown: OnUnknown,
}

#[derive(Debug, Clone)]
pub enum Responder {
    /// A SOAP service, called once per delivered request.
    Backend(BackendSpec),
    /// An application, through the API (`response` when it settles the message): the
    /// partner's exchange waits up to `within`.
    Api { within: Duration },
}

/// Where and how a SOAP backend is called.
#[derive(Debug, Clone)]
pub struct BackendSpec {
    pub url: String,
    pub timeout: Duration,
    pub max_concurrency: usize,
    pub tls: PartnerTls,
    /// What we present to the service (never logged: `Secret`).
    pub credentials: Option<OurCredentials>,
}

/// One call to a backend, owned: it runs to its end in a task of its own.
pub struct Call {
    /// The partner's envelope without its WS-R blocks.
    pub envelope: String,
    pub version: SoapVersion,
    /// The partner's own SOAPAction, passed through.
    pub soap_action: Option<String>,
    pub idempotency: Vec<(&'static str, String)>,
}

/// One of a channel's `max_concurrency` calls: taken before the call is recorded as out, held
/// until its outcome is recorded.
pub struct Slot {
    channel: String,
    _permit: OwnedSemaphorePermit,
}

/// Every request-response channel's backend, built once at start (`App::build`).
#[derive(Clone, Default)]
pub struct Backends {
    by_channel: Arc<BTreeMap<String, Backend>>,
}

/// No `Debug`: it holds our credentials.
struct Backend {
    /// Parsed once: a call clones it instead of parsing (and IDNA-mapping) the text again.
    url: reqwest::Url,
    client: reqwest::Client,
    /// Marked sensitive, so that no `Debug` of a request shows it.
    authorization: Option<HeaderValue>,
    slots: Arc<Semaphore>,
}

impl Backends {
    /// The clients of the backends `operations` name. Fails on a TLS file that cannot be used.
    pub fn new(operations: &BTreeMap<String, RequestResponse>) -> anyhow::Result<Backends> {
        let mut by_channel = BTreeMap::new();
        for (channel, op) in operations {
            let Responder::Backend(spec) = &op.responder else {
                continue;
            };
            let who = format!("channel {channel}: backend");
            let has_ca = spec.tls.ca_file.is_some();
            http_client::check_system_roots(std::iter::once((
                who.clone(),
                spec.url.as_str(),
                has_ca,
            )))?;
            let client = if spec.tls == PartnerTls::default() {
                http_client::client(spec.timeout)
                    .with_context(|| format!("{who}: cannot build its HTTP client"))?
            } else {
                tls_client(&who, &spec.tls, spec.timeout)?
            };
            let authorization = spec
                .credentials
                .as_ref()
                .map(|c| {
                    let mut v = HeaderValue::from_str(&c.header()).map_err(|_| {
                        anyhow::anyhow!(
                            "{who}: our credentials cannot be sent in an Authorization header \
                             (control characters)"
                        )
                    })?;
                    v.set_sensitive(true);
                    anyhow::Ok(v)
                })
                .transpose()?;
            by_channel.insert(
                channel.clone(),
                Backend {
                    url: reqwest::Url::parse(&spec.url)
                        .with_context(|| format!("{who}: its url"))?,
                    client,
                    authorization,
                    slots: Arc::new(Semaphore::new(spec.max_concurrency)),
                },
            );
        }
        Ok(Backends {
            by_channel: Arc::new(by_channel),
        })
    }

    /// One of `channel`'s call slots, waiting up to `wait` for one to be free; `None` when
    /// every slot stayed busy (or the channel has no backend).
    pub async fn slot(&self, channel: &str, wait: Duration) -> Option<Slot> {
        let backend = self.by_channel.get(channel)?;
        let permit = tokio::time::timeout(wait, backend.slots.clone().acquire_owned())
            .await
            .ok()?
            .ok()?;
        Some(Slot {
            channel: channel.to_owned(),
            _permit: permit,
        })
    }

    /// Calls the backend of the slot's channel; reads at most `cap` bytes of its answer.
    pub async fn call(&self, slot: &Slot, call: Call, cap: usize) -> Judged {
        let channel = slot.channel.as_str();
        let Some(backend) = self.by_channel.get(channel) else {
            return Judged::NotDelivered(format!("channel {channel} has no backend"));
        };
        let mut request = backend
            .client
            .post(backend.url.clone())
            .header(
                CONTENT_TYPE,
                content_type(call.version, call.soap_action.as_deref()),
            )
            .body(call.envelope);
        if call.version == SoapVersion::Soap11 {
            let action = call.soap_action.as_deref().unwrap_or("\"\"");
            request = request.header("SOAPAction", action);
        }
        if let Some(auth) = &backend.authorization {
            request = request.header(AUTHORIZATION, auth.clone());
        }
        for (name, value) in &call.idempotency {
            request = request.header(*name, value);
        }
        let started = std::time::Instant::now();
        let judged = match exchange(request, cap).await {
            Ok(heard) => judge(heard.status, heard.content_type.as_deref(), &heard.body),
            Err(failure) => judged_failure(failure),
        };
        crate::metrics::backend_call(channel, outcome_label(&judged), started.elapsed());
        judged
    }
}

/// The media type of a call: SOAP 1.2 carries the partner's action in it (where it can be
/// written as a quoted parameter as it is).
fn content_type(version: SoapVersion, action: Option<&str>) -> String {
    let base = version.content_type();
    match (version, action) {
        (SoapVersion::Soap12, Some(a)) if !a.contains(['"', '\\']) && !a.is_empty() => {
            format!("{base}; action=\"{a}\"")
        }
        _ => base.to_owned(),
    }
}

/// A failed exchange: certain not to have reached the service, or of unknown outcome.
fn judged_failure(failure: AttemptFailure) -> Judged {
    let why = failure.to_string();
    match failure {
        AttemptFailure::Unreached(_) | AttemptFailure::Redirected(_) => Judged::NotDelivered(why),
        AttemptFailure::TimedOut
        | AttemptFailure::TooLarge { .. }
        | AttemptFailure::Status(_)
        | AttemptFailure::NoVerdict(_)
        | AttemptFailure::Unreadable(_)
        | AttemptFailure::Transport(_) => Judged::Unknown(why),
    }
}

fn outcome_label(judged: &Judged) -> &'static str {
    match judged {
        Judged::Business(b) if b.shape.fault => "fault",
        Judged::Business(_) => "answered",
        Judged::NotDelivered(_) => "not_delivered",
        Judged::Unknown(_) => "unknown",
    }
}
