//! What an operator sees of each partner (the partners view of the API, the CLI and the
//! console): its configuration without secrets, and how it is doing — from the store, the same
//! on every gateway of a cluster: its health as our exchanges with it left it
//! (`OutboundStore::partner_health`), our messages to it by state, the callback acks we owe it —
//! and the sign-ins this gateway refused for it (`metrics::refused_sign_ins`).
//!
//! "No partner" (URL destinations, anonymous callers, usernames nobody has) is listed under
//! its one name, `anonymous`, when there is anything to say of it.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::http_client::redacted;
use super::operator::in_doubt_by_partner;
use crate::metrics::{ANONYMOUS, RefusedSignIns, UNKNOWN_USERNAME};
use crate::partners::{OurCredentials, Partner, Partners};
use crate::store::outbound::PartnerHealth;
use crate::store::{Store, StoreError};
use crate::wsr::datetime::date_time_string;

/// Messages in doubt looked at, at most, to count them by partner.
const IN_DOUBT_LOOKED_AT: usize = 5_000;

/// One partner, as the operator sees it.
#[derive(Debug, Clone)]
pub struct PartnerReport {
    /// Its configured name, or `ANONYMOUS`.
    pub name: String,
    pub configured: Option<Configured>,
    pub health: Option<PartnerHealth>,
    /// Our messages to it by state (`in_doubt` counted apart from `sent`, which includes them).
    pub messages: BTreeMap<String, u64>,
    /// Whether `in_doubt` is a floor (more messages await a poll than were looked at).
    pub in_doubt_floor: bool,
    pub callback_acks_owed: u64,
    /// Sign-ins this gateway refused for it since it started.
    pub refused: Option<RefusedSignIns>,
    /// For `anonymous`: sign-ins refused for usernames nobody has.
    pub refused_unknown: Option<RefusedSignIns>,
}

/// What the configuration says of a partner, without its secrets.
#[derive(Debug, Clone)]
pub struct Configured {
    pub channels: Vec<String>,
    /// How it may prove itself to us: `basic`, `bearer`, `certificate`, `username_token`.
    pub credentials: Vec<&'static str>,
    /// Where we send to it, without userinfo or query.
    pub address: Option<String>,
    pub poll_address: Option<String>,
    pub agreement: Option<String>,
    pub send_window: Option<u64>,
    /// What we present to it: `basic`, `bearer`, `username_token`, `client_certificate`.
    pub our_credentials: Vec<&'static str>,
}

impl Configured {
    fn of(p: &Partner) -> Configured {
        let inbound = &p.inbound;
        let mut credentials = Vec::new();
        if inbound.password.is_some() {
            credentials.push("basic");
        }
        if inbound.token.is_some() {
            credentials.push("bearer");
        }
        if !inbound.cert_sha256.is_empty() || !inbound.cert_names.is_empty() {
            credentials.push("certificate");
        }
        if inbound.wss.is_some() {
            credentials.push("username_token");
        }
        let out = &p.outbound;
        let mut ours = Vec::new();
        match &out.credentials {
            Some(OurCredentials::Basic { .. }) => ours.push("basic"),
            Some(OurCredentials::Bearer(_)) => ours.push("bearer"),
            None => {}
        }
        if out.wss.is_some() {
            ours.push("username_token");
        }
        if out.tls.client_cert_file.is_some() {
            ours.push("client_certificate");
        }
        Configured {
            channels: inbound.channels.iter().cloned().collect(),
            credentials,
            address: out.address.as_deref().map(redacted),
            poll_address: out.poll_address.as_deref().map(redacted),
            agreement: out.agreement.clone(),
            send_window: out.send_window,
            our_credentials: ours,
        }
    }
}

/// Every configured partner, by name, and `anonymous` when anything is known of it.
pub async fn partner_reports(
    store: &Store,
    partners: &Partners,
    now: DateTime<Utc>,
) -> Result<Vec<PartnerReport>, StoreError> {
    let health = store.partner_health().await?;
    let traffic = store.traffic(now).await?;
    let in_doubt = in_doubt_by_partner(store, IN_DOUBT_LOOKED_AT).await?;
    let mut refused = crate::metrics::refused_sign_ins();
    let refused_unknown = refused.remove(UNKNOWN_USERNAME);
    let report = |name: &str, configured: Option<Configured>, refused: Option<RefusedSignIns>| {
        let key = stored_name(name);
        let mut messages: BTreeMap<String, u64> = traffic
            .sending
            .iter()
            .filter(|s| s.partner == key)
            .flat_map(|s| s.states.iter().cloned())
            .collect();
        messages.insert(
            "in_doubt".into(),
            in_doubt.by_partner.get(key).copied().unwrap_or(0),
        );
        PartnerReport {
            name: name.to_owned(),
            configured,
            health: health.iter().find(|h| h.partner == key).cloned(),
            messages,
            in_doubt_floor: !in_doubt.complete,
            callback_acks_owed: traffic
                .callbacks_owed
                .iter()
                .find(|(p, _)| p == key)
                .map_or(0, |(_, n)| *n),
            refused,
            refused_unknown: None,
        }
    };
    let mut reports: Vec<PartnerReport> = partners
        .iter()
        .map(|p| report(&p.name, Some(Configured::of(p)), refused.remove(&p.name)))
        .collect();
    let mut anonymous = report(ANONYMOUS, None, refused.remove(ANONYMOUS));
    anonymous.refused_unknown = refused_unknown;
    let known = anonymous.health.is_some()
        || anonymous.messages.values().any(|n| *n > 0)
        || anonymous.callback_acks_owed > 0
        || anonymous.refused.is_some()
        || anonymous.refused_unknown.is_some();
    if known {
        reports.push(anonymous);
    }
    Ok(reports)
}

/// A partner as the store keeps it ("" for no partner), as every view names it.
pub fn shown_partner(partner: &str) -> &str {
    if partner.is_empty() {
        ANONYMOUS
    } else {
        partner
    }
}

/// A partner's name as the store keeps it ("" for `ANONYMOUS`).
fn stored_name(name: &str) -> &str {
    if name == ANONYMOUS { "" } else { name }
}

fn refused_json(r: Option<&RefusedSignIns>) -> Value {
    match r {
        None => json!({ "count": 0, "last_at": null, "last_username": null, "last_reason": null }),
        Some(r) => json!({
            "count": r.count,
            "last_at": date_time_string(&r.last),
            "last_username": r.last_username,
            "last_reason": r.last_reason,
        }),
    }
}

/// The JSON of one partner (`GET /api/v1/partners`).
pub fn report_json(r: &PartnerReport) -> Value {
    let configured = r.configured.as_ref().map(|c| {
        json!({
            "channels": c.channels,
            "credentials": c.credentials,
            "address": c.address,
            "poll_address": c.poll_address,
            "agreement": c.agreement,
            "send_window": c.send_window,
            "our_credentials": c.our_credentials,
        })
    });
    let health = r.health.as_ref();
    let mut v = json!({
        "name": r.name,
        "configured": configured,
        "last_success_at": health.and_then(|h| h.last_success_at.as_ref()).map(date_time_string),
        "last_error": health.and_then(|h| h.last_error.as_ref()).map(|e| e.cause.as_str()),
        "last_error_at": health.and_then(|h| h.last_error.as_ref()).map(|e| date_time_string(&e.at)),
        "failures_in_row": health.map_or(0, |h| h.failures_in_row),
        "messages": r.messages,
        "in_doubt_is_floor": r.in_doubt_floor,
        "callback_acks_owed": r.callback_acks_owed,
        "refused_sign_ins": refused_json(r.refused.as_ref()),
    });
    if r.name == ANONYMOUS {
        v["refused_unknown_usernames"] = refused_json(r.refused_unknown.as_ref());
    }
    v
}
