//! Submit preparation (DESIGN §6): an application's submission checked and made into the
//! message the store keeps — its destination (a configured partner, or a URL where the
//! operator allows them and never an internal address, D15), its agreement (named, inline,
//! the partner's or the default), SOAP version and body, notify webhook, group and the
//! singleton/`last` rules, and our own callback address as its ReplyTo. What the message's
//! group makes of it (its number and envelope) is `rmp::send_group::plan_submit`, applied by
//! the store. Never axum: `http/messages.rs` parses and renders.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::Value;
use tracing::Instrument as _;

use super::destination::{DestinationRules, check_destination};
use crate::partners::Partners;
use crate::rmp::agreement::SendTerms;
use crate::store::outbound::{
    IdempotencyKey, OutMessage, SentAgain, Submission, SubmitError, Submitted,
};
use crate::store::{Store, StoreError};
use crate::telemetry::traced;
use crate::wsr::{
    GroupId, Headers, Limits, ReplyPattern, ReplyTo, SoapVersion, read_envelope, write_envelope,
};

/// A submission as an application sends it (`POST /api/v1/messages`; described for the
/// OpenAPI document by `http::openapi::SubmitBody`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// A URL, or the name of a partner in the configuration.
    pub destination: String,
    /// The name of an agreement in the configuration, or one given inline.
    #[serde(default)]
    pub agreement: Option<AgreementRef>,
    #[serde(default)]
    pub group: Option<GroupRef>,
    /// `1.1` (default) or `1.2`.
    #[serde(default)]
    pub soap_version: Option<String>,
    /// The SOAP Body's content: well-formed XML, no envelope parts.
    pub body: String,
    /// A registered push endpoint to POST the message's fate to.
    #[serde(default)]
    pub notify_url: Option<String>,
}

/// An agreement by name, or inline (checked field by field after the request is parsed, so
/// that a mistake names the agreement's field).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum AgreementRef {
    Named(String),
    Inline(serde_json::Map<String, Value>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupRef {
    /// An existing group to continue; absent = a new group.
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub last: bool,
}

/// Who submits: the message and a new group are theirs; an operator may continue anyone's
/// group.
#[derive(Debug, Clone)]
pub struct Submitter {
    pub principal: String,
    pub operator: bool,
}

/// Why a submission is not taken.
#[derive(Debug)]
pub enum Refusal {
    /// A field that is not valid, and why (the API's 400 `invalid-field`).
    Invalid { field: String, reason: String },
    /// The store refused it (a group conflict, a reused key) or could not be read.
    Store(SubmitError),
}

impl From<StoreError> for Refusal {
    fn from(e: StoreError) -> Refusal {
        Refusal::Store(SubmitError::Store(e))
    }
}

fn refuse(field: &str, reason: impl Into<String>) -> Refusal {
    Refusal::Invalid {
        field: field.to_owned(),
        reason: reason.into(),
    }
}

/// What preparing a submission reads: the store (registered notify webhooks) and the
/// settings that decide destinations and agreements.
#[derive(Clone, Copy)]
pub struct Sending<'a> {
    pub store: &'a Store,
    pub partners: &'a Partners,
    pub destinations: &'a DestinationRules,
    pub agreements: &'a BTreeMap<String, SendTerms>,
    pub default_agreement: &'a SendTerms,
    /// The ReplyTo of our own Callback-pattern messages (`/wsr/_callback` here).
    pub callback_url: &'a str,
}

/// Submits a message as an application sent it (`request`, JSON): the message stored
/// before under the same idempotency key if there is one (a retry), else the request
/// prepared and stored, numbered in its group.
pub async fn submit(
    sending: Sending<'_>,
    request: Value,
    submitter: Submitter,
    idempotency: Option<IdempotencyKey>,
    now: DateTime<Utc>,
) -> Result<Submitted, Refusal> {
    if let Some(idem) = &idempotency
        && let Some(earlier) =
            (sending.store.earlier_submission(idem).await).map_err(Refusal::Store)?
    {
        return Ok(earlier);
    }
    let span = traced!("outbound.submit");
    let request: SubmitRequest =
        serde_json::from_value(request).map_err(|e| refuse("body", e.to_string()))?;
    let store = sending.store;
    async {
        let submission = prepare(sending, request, submitter, idempotency, now).await?;
        // Kept before the message is stored: the sender may attempt it the moment it is.
        keep_trace(store, &span, &submission.id, now).await;
        store.submit(submission, now).await.map_err(Refusal::Store)
    }
    .instrument(span.clone())
    .await
}

/// Keeps the trace context of `span` for message `id`, so that its attempts, in the
/// background, join this trace (traces exported only). Best effort: a context not kept makes
/// them a trace of their own, nothing more; one kept for a submit that then fails is purged
/// with the rest after `TRACES_KEPT`.
async fn keep_trace(store: &Store, span: &tracing::Span, id: &str, now: DateTime<Utc>) {
    if let Some(traceparent) = crate::telemetry::traceparent_of(span)
        && let Err(e) = store.keep_out_trace(id, &traceparent, now).await
    {
        tracing::debug!(error = %e, "a submitted message's trace context was not kept");
    }
}

/// Checks `request` field by field, in the order an application reads the answer, and makes
/// the submission the store keeps. Nothing is stored or sent for a refused one.
pub async fn prepare(
    sending: Sending<'_>,
    request: SubmitRequest,
    submitter: Submitter,
    idempotency: Option<IdempotencyKey>,
    now: DateTime<Utc>,
) -> Result<Submission, Refusal> {
    let partner = sending.partners.get(&request.destination);
    let destination = destination(sending, &request.destination, partner.is_some()).await?;
    let partner_agreement = partner.and_then(|p| p.outbound.agreement.as_deref());
    let agreement = agreement(sending, request.agreement, partner_agreement)?;
    let checked = agreement
        .check()
        .map_err(|(field, why)| refuse(&format!("agreement.{field}"), why))?;
    let version = soap_version(request.soap_version.as_deref())?;
    check_body(version, &request.body)?;
    // Notify URLs are application webhooks: registered like push endpoints, in that registry,
    // and only for the principals they are registered for.
    if let Some(url) = &request.notify_url
        && !sending.store.may_push_to(&submitter.principal, url).await?
    {
        return Err(refuse(
            "notify_url",
            format!(
                "{url:?} is not a webhook registered for {} (see /api/v1/push-endpoints)",
                submitter.principal
            ),
        ));
    }
    let group = Grouping::of(request.group.as_ref(), checked.message_order)?;
    let reply = checked.reply_by.pattern(sending.callback_url);
    Ok(Submission {
        id: new_id(now),
        destination,
        partner: partner.map(|p| p.name.clone()).unwrap_or_default(),
        group_id: group.id,
        sequenced: group.sequenced,
        last: group.last,
        ack_requested: checked.ack_requested,
        duplicate_elimination: checked.duplicate_elimination,
        message_order: checked.message_order,
        reply,
        version,
        body: request.body,
        expiry: now + checked.lifetime,
        schedule: checked.schedule,
        notify_url: request.notify_url,
        idempotency,
        principal: submitter.principal,
        any_group: submitter.operator,
        sent_again: None,
    })
}

/// An operator's "send again" of an ended (failed or faulted) message: a new message — new
/// identity, a singleton — with the stored envelope's Body, its SOAP version, reply pattern,
/// acknowledgment and duplicate-elimination requests, retry schedule, lifetime (counted from
/// now) and notify webhook, to the same partner or URL, for the same principal; its history
/// names the old one, and the old one's the new (`SentAgain`). The destination is checked
/// again as a submit's is: a partner since removed, or URL destinations since disallowed,
/// refuse it.
pub async fn again(
    sending: Sending<'_>,
    old: &OutMessage,
    operator: &str,
    now: DateTime<Utc>,
) -> Result<Submission, Refusal> {
    let named = if old.partner.is_empty() {
        &old.destination
    } else {
        &old.partner
    };
    let partner = sending
        .partners
        .get(named)
        .filter(|_| !old.partner.is_empty());
    let destination = destination(sending, named, partner.is_some()).await?;
    // Our own envelope, as stored: read within its own size.
    let limits = Limits {
        max_bytes: old.envelope.len(),
        ..Limits::default()
    };
    let env = read_envelope(old.envelope.as_bytes(), &limits).map_err(|defect| {
        refuse(
            "envelope",
            format!("the stored envelope cannot be read: {}", defect.reason),
        )
    })?;
    let request = env.request.as_ref().ok_or_else(|| {
        refuse(
            "envelope",
            "the stored envelope holds no wsrm:Request to send again",
        )
    })?;
    let reply = match request.reply_pattern {
        ReplyPattern::Callback(_) => ReplyPattern::Callback(ReplyTo::bare(sending.callback_url)),
        ref other => other.clone(),
    };
    let lifetime = (old.outbound.expiry - old.submitted_at).max(chrono::Duration::seconds(1));
    Ok(Submission {
        id: new_id(now),
        destination,
        partner: old.partner.clone(),
        group_id: None,
        sequenced: false,
        last: false,
        ack_requested: request.ack_requested,
        duplicate_elimination: request.duplicate_elimination,
        message_order: false,
        reply,
        version: old.version,
        body: env.body.content.to_owned(),
        expiry: now + lifetime,
        schedule: old.outbound.schedule.clone(),
        notify_url: old.notify_url.clone(),
        idempotency: None,
        principal: old.principal.clone().unwrap_or_else(|| operator.to_owned()),
        any_group: false,
        sent_again: Some(SentAgain {
            from: old.id.clone(),
            operator: operator.to_owned(),
        }),
    })
}

/// Where the message goes (D15): a configured partner's address, or a URL only where the
/// operator allows them — and never an internal address it did not list. Refused before
/// anything is stored or sent, so that message fates cannot tell what answers where.
async fn destination(
    sending: Sending<'_>,
    named: &str,
    is_partner: bool,
) -> Result<String, Refusal> {
    if is_partner {
        let address = sending
            .partners
            .get(named)
            .and_then(|p| p.outbound.address.clone());
        return address.ok_or_else(|| {
            refuse(
                "destination",
                format!("partner {named:?} has no address to send to"),
            )
        });
    }
    if !sending.destinations.allow_urls() {
        return Err(refuse(
            "destination",
            format!(
                "{named:?} is not a configured partner (URL destinations are not allowed: \
                 allow_url_destinations)"
            ),
        ));
    }
    if !named.contains("://") {
        // A name, not a URL: most likely a partner that is not configured (or misspelt).
        return Err(refuse(
            "destination",
            format!("{named:?} is not a configured partner (nor a URL such as https://host/path)"),
        ));
    }
    check_destination(sending.destinations, named)
        .await
        .map_err(|why| refuse("destination", format!("{named:?} {why}")))?;
    Ok(named.to_owned())
}

/// The agreement the message is sent under: the one it names or gives inline, else its
/// partner's own, else the default — each over the default for what it leaves out.
fn agreement(
    sending: Sending<'_>,
    asked: Option<AgreementRef>,
    partner_agreement: Option<&str>,
) -> Result<SendTerms, Refusal> {
    let base = sending.default_agreement;
    Ok(match asked {
        None => match partner_agreement.and_then(|name| sending.agreements.get(name)) {
            Some(spec) => spec.over(base),
            None => base.clone(),
        },
        Some(AgreementRef::Named(name)) => sending
            .agreements
            .get(&name)
            .ok_or_else(|| refuse("agreement", format!("no agreement named {name:?}")))?
            .over(base),
        Some(AgreementRef::Inline(fields)) => {
            serde_json::from_value::<SendTerms>(Value::Object(fields))
                .map_err(|e| refuse("agreement", e.to_string()))?
                .over(base)
        }
    })
}

fn soap_version(asked: Option<&str>) -> Result<SoapVersion, Refusal> {
    match asked {
        None | Some("1.1") => Ok(SoapVersion::Soap11),
        Some("1.2") => Ok(SoapVersion::Soap12),
        Some(other) => Err(refuse(
            "soap_version",
            format!("{other:?} is not \"1.1\" or \"1.2\""),
        )),
    }
}

/// The body must be well-formed XML our codec accepts, so that the envelope we store and
/// resend is valid: checked by reading it back inside an envelope.
fn check_body(version: SoapVersion, body: &str) -> Result<(), Refusal> {
    let probe = write_envelope(version, Headers::default(), body);
    match read_envelope(probe.as_bytes(), &Limits::default()) {
        Ok(env)
            if env.request.is_none() && env.response.is_none() && env.poll_request.is_none() =>
        {
            Ok(())
        }
        Ok(_) => Err(refuse(
            "body",
            "the body must not contain SOAP envelope parts",
        )),
        Err(defect) => Err(refuse(
            "body",
            format!("not well-formed XML: {}", defect.reason),
        )),
    }
}

/// The group a submission asks for.
#[derive(Debug, PartialEq, Eq)]
struct Grouping {
    /// The group to continue; `None`: a new one.
    id: Option<GroupId>,
    /// A sequenced group (asked for, or needed by ordering); else a singleton.
    sequenced: bool,
    last: bool,
}

impl Grouping {
    fn of(group: Option<&GroupRef>, ordered: bool) -> Result<Grouping, Refusal> {
        let id = match group.and_then(|g| g.id.as_deref()) {
            None => None,
            Some(id) => Some(GroupId::parse(id).map_err(|why| refuse("group.id", why))?),
        };
        let sequenced = group.is_some() || ordered;
        let last = group.is_some_and(|g| g.last);
        if last && !sequenced {
            return Err(refuse("group.last", "a singleton has no group to end"));
        }
        Ok(Grouping {
            id,
            sequenced,
            last,
        })
    }
}

/// A message id: a UUID v7 — time-ordered, so listings sort by submission, and with 74 random
/// bits from a cryptographic generator the OS seeds (uuid's `fast-rng`), so ids are unique
/// across processes and hosts (two containerised gateways are both pid 1) and a partner
/// cannot guess a neighbour of one it saw. Our groupIds are made from it
/// (`send_group::our_group_id`).
fn new_id(now: DateTime<Utc>) -> String {
    let millis = u64::try_from(now.timestamp_millis()).unwrap_or(0);
    let ts = uuid::Timestamp::from_unix(
        uuid::NoContext,
        millis / 1000,
        ((millis % 1000) * 1_000_000) as u32,
    );
    uuid::Uuid::new_v7(ts).to_string()
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use serde_json::json;

    use super::*;
    use crate::config::Config;
    use crate::store::StoreConfig;
    use crate::wsr::{ReplyPattern, ReplyTo};

    const CALLBACK_URL: &str = "https://gateway.example/wsr/_callback";

    /// A partner `acme` with an address and its own Callback agreement, another without an
    /// address, and an agreement `fast`.
    const SETTINGS: &str = r#"
        [partners.acme]
        address = "https://acme.example.org/wsr/orders"
        agreement = "orders"
        [partners.listener]
        channels = ["default"]
        [agreements.orders]
        reply_pattern = "Callback"
        message_order = true
        [agreements.fast]
        expiry_seconds = 60
    "#;

    struct Rig {
        store: Store,
        config: Config,
        _dir: tempfile::TempDir,
    }

    async fn rig() -> Rig {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let file = dir.path().join("gateway.toml");
        let db = dir.path().join("gateway.db");
        let text = format!("database = {:?}\n{SETTINGS}", db.display().to_string());
        std::fs::write(&file, text).expect("written");
        let config = Config::load(Some(&file), []).expect("a valid configuration");
        let store = Store::open(&StoreConfig {
            database: config.database.clone(),
            durability: config.durability,
            policy: config.policy.clone(),
        })
        .await
        .expect("a fresh store");
        Rig {
            store,
            config,
            _dir: dir,
        }
    }

    impl Rig {
        fn sending(&self) -> Sending<'_> {
            Sending {
                store: &self.store,
                partners: &self.config.partners,
                destinations: &self.config.destinations,
                agreements: &self.config.agreements,
                default_agreement: &self.config.default_agreement,
                callback_url: CALLBACK_URL,
            }
        }

        async fn prepare(&self, request: Value) -> Result<Submission, Refusal> {
            let request = serde_json::from_value(request).expect("a well-formed request");
            let submitter = Submitter {
                principal: "app".into(),
                operator: false,
            };
            prepare(self.sending(), request, submitter, None, now()).await
        }
    }

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 5, 12, 0, 0)
            .single()
            .expect("a valid time")
    }

    fn field_of(refused: Result<Submission, Refusal>) -> String {
        match refused {
            Err(Refusal::Invalid { field, .. }) => field,
            Err(Refusal::Store(e)) => panic!("not a field refusal: {e:?}"),
            Ok(s) => panic!("prepared: {s:?}"),
        }
    }

    const BODY: &str = "<m:Order xmlns:m=\"urn:test\"/>";

    #[tokio::test]
    async fn a_partner_is_sent_to_at_its_address_under_its_own_agreement() {
        let rig = rig().await;
        let s = rig
            .prepare(json!({"destination": "acme", "body": BODY}))
            .await
            .expect("prepared");
        assert_eq!(s.destination, "https://acme.example.org/wsr/orders");
        assert_eq!(s.partner, "acme");
        assert!(
            s.message_order && s.sequenced,
            "ordering makes a sequenced group"
        );
        assert_eq!(s.group_id, None, "a new group");
        // Our own callback address, never a placeholder.
        assert_eq!(s.reply, ReplyPattern::Callback(ReplyTo::bare(CALLBACK_URL)));
        assert_eq!(s.principal, "app");
        assert!(!s.any_group);
    }

    #[tokio::test]
    async fn destinations_are_configured_partners_with_an_address_unless_urls_are_allowed() {
        let rig = rig().await;
        let url = json!({"destination": "https://elsewhere.example/wsr", "body": BODY});
        assert_eq!(field_of(rig.prepare(url).await), "destination");
        let no_address = json!({"destination": "listener", "body": BODY});
        assert_eq!(field_of(rig.prepare(no_address).await), "destination");
    }

    #[tokio::test]
    async fn a_named_or_inline_agreement_goes_over_the_default_and_is_checked() {
        let rig = rig().await;
        let named = json!({"destination": "acme", "agreement": "fast", "body": BODY});
        let s = rig.prepare(named).await.expect("prepared");
        assert_eq!(s.expiry, now() + chrono::Duration::seconds(60));
        assert_eq!(s.reply, ReplyPattern::Response, "the default's, not acme's");
        let missing = json!({"destination": "acme", "agreement": "nope", "body": BODY});
        assert_eq!(field_of(rig.prepare(missing).await), "agreement");
        let inline =
            json!({"destination": "acme", "agreement": {"expiry_seconds": 0}, "body": BODY});
        assert_eq!(
            field_of(rig.prepare(inline).await),
            "agreement.expiry_seconds"
        );
    }

    #[tokio::test]
    async fn groups_version_and_body_are_checked_field_by_field() {
        let rig = rig().await;
        let fast = |extra: Value| {
            let mut request = json!({"destination": "acme", "agreement": "fast", "body": BODY});
            if let (Some(r), Some(e)) = (request.as_object_mut(), extra.as_object()) {
                r.extend(e.clone());
            }
            request
        };
        let last = rig
            .prepare(fast(json!({"group": {"id": "urn:our:g", "last": true}})))
            .await
            .expect("prepared");
        assert!(last.sequenced && last.last);
        assert_eq!(
            last.group_id.as_ref().map(GroupId::as_str),
            Some("urn:our:g")
        );
        let singleton = rig.prepare(fast(json!({}))).await.expect("prepared");
        assert!(
            !singleton.sequenced,
            "no group asked, no ordering: a singleton"
        );
        let bad_group = fast(json!({"group": {"id": ""}}));
        assert_eq!(field_of(rig.prepare(bad_group).await), "group.id");
        let version = fast(json!({"soap_version": "1.3"}));
        assert_eq!(field_of(rig.prepare(version).await), "soap_version");
        let body = fast(json!({"body": "<unclosed>"}));
        assert_eq!(field_of(rig.prepare(body).await), "body");
        let unregistered = fast(json!({"notify_url": "https://app.example/fate"}));
        assert_eq!(field_of(rig.prepare(unregistered).await), "notify_url");
    }
}
