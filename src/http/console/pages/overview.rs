//! The overview: traffic and backlog by channel and partner, what we send by partner (with the
//! messages in doubt), subscriptions' backlogs, and the faults this gateway answered. The
//! store's figures are the same on every gateway of a cluster; the faults are this process's
//! (as `/metrics` counts them).

use std::collections::BTreeMap;

use axum::extract::State;
use chrono::Duration;

use super::super::Operator;
use super::super::html::{esc, link, query_value, table};
use super::{MAX_SUBSCRIPTIONS, Page, partner_query, partner_shown, store};
use crate::http::AppState;
use crate::metrics::{ANONYMOUS, faults_answered, held_back_sources};
use crate::outbound::backend::{RequestResponse, Responder};
use crate::outbound::http_client::redacted;
use crate::outbound::operator::in_doubt_by_partner;
use crate::rmp::exchange::OnUnknown;
use crate::store::overview::Receiving;

/// The window the received rates are taken over.
const RATE_WINDOW_SECONDS: i64 = 60;
/// Messages a poll may settle looked at, at most, to count those in doubt.
const IN_DOUBT_LOOKED_AT: usize = 5_000;
/// Requests in doubt toward a service listed, at most.
const MAX_IN_DOUBT_SHOWN: i64 = 100;

/// A partner as the fault tally labels it (`ANONYMOUS` for callers without one, the name
/// every page shows them by).
fn fault_partner(label: &str) -> String {
    esc(label)
}

/// A count that may be a floor.
fn at_least(n: u64, floor: bool) -> String {
    if floor {
        format!("≥ {n}")
    } else {
        n.to_string()
    }
}

/// How often the overview reloads itself (`?refresh=off` stops it).
const REFRESH_SECONDS: u32 = 30;

#[derive(serde::Deserialize)]
pub struct OverviewQuery {
    refresh: Option<String>,
}

pub async fn overview(
    Operator(_): Operator,
    State(app): State<AppState>,
    q: Result<axum::extract::Query<OverviewQuery>, axum::extract::rejection::QueryRejection>,
) -> Page {
    let q = super::query(q)?;
    let refreshing = q.refresh.as_deref() != Some("off");
    let now = app.clock.now();
    let traffic = store(
        app.store
            .traffic(now - Duration::seconds(RATE_WINDOW_SECONDS))
            .await,
    )?;
    let stats = store(app.store.stats().await)?;
    let in_doubt = store(in_doubt_by_partner(&app.store, IN_DOUBT_LOOKED_AT).await)?;
    let mut body = String::from(
        "<p>What the store holds, the same on every gateway of a cluster, except the faults: \
         those are this gateway's since it started (<code>wsr_faults_total</code> in \
         <code>/metrics</code> has every gateway's).</p>",
    );
    body.push_str(&if refreshing {
        format!(
            "<p>This page reloads itself every {REFRESH_SECONDS} s. {}</p>",
            link("/console?refresh=off", "Stop reloading")
        )
    } else {
        format!("<p>{}</p>", link("/console", "Reload every 30 s"))
    });
    let rates = store(app.store.rates(now).await)?;
    body.push_str(&super::chart::rates_chart(&rates));
    body.push_str(&receiving(&traffic));
    body.push_str(&sending(&traffic, &in_doubt));
    body.push_str(&faults());
    body.push_str(&held_back());
    body.push_str(&request_response(&app.config.operations));
    let doubted = store(app.store.exchanges_in_doubt(MAX_IN_DOUBT_SHOWN).await)?;
    body.push_str(&in_doubt_toward_services(&doubted));

    let groups: Vec<Vec<String>> = stats
        .groups
        .iter()
        .map(|(state, n)| vec![esc(state), n.to_string()])
        .collect();
    body.push_str(&table(
        "Received groups by state",
        &["State", "Groups"],
        &groups,
    ));
    let subs: Vec<Vec<String>> = stats
        .subscriptions
        .iter()
        .take(MAX_SUBSCRIPTIONS)
        .map(|s| {
            vec![
                esc(&s.name),
                s.waiting.to_string(),
                s.unmatched.to_string(),
                s.in_flight.to_string(),
                s.dead_letters.to_string(),
            ]
        })
        .collect();
    body.push_str(&table(
        "Subscriptions",
        &[
            "Subscription",
            "Waiting",
            "Not matched yet (may not match its filter)",
            "In flight",
            "Dead letters",
        ],
        &subs,
    ));
    Ok(super::super::html::page_refreshing(
        axum::http::StatusCode::OK,
        "Overview",
        &body,
        true,
        refreshing.then_some(REFRESH_SECONDS),
    ))
}

/// The request-response channels (D16) and who answers each.
fn request_response(operations: &BTreeMap<String, RequestResponse>) -> String {
    let rows: Vec<Vec<String>> = operations
        .iter()
        .map(|(channel, op)| {
            let responder = match &op.responder {
                Responder::Backend(b) => format!("SOAP service {}", redacted(&b.url)),
                Responder::Api { within } => {
                    format!(
                        "applications (POST /api/v1/respond within {} ms)",
                        within.as_millis()
                    )
                }
            };
            let on_unknown = match op.on_unknown {
                OnUnknown::Retry => "call again",
                OnUnknown::Fail => "fail (PermanentProcessingFailure)",
            };
            vec![esc(channel), esc(&responder), on_unknown.into()]
        })
        .collect();
    table(
        "Request-response channels",
        &["Channel", "Answered by", "Unknown outcome"],
        &rows,
    )
}

/// Requests whose call to their service had an unknown outcome, failed for good under
/// `on_unknown = "fail"`: the service may or may not have acted on them.
fn in_doubt_toward_services(doubted: &[crate::store::Exchange]) -> String {
    let rows: Vec<Vec<String>> = doubted
        .iter()
        .map(|e| {
            vec![
                esc(&e.channel),
                esc(partner_shown(&e.partner)),
                esc(e.key.group_id.as_str()),
                e.key.number.map_or("—".into(), |n| n.to_string()),
                e.started_at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
            ]
        })
        .collect();
    table(
        "Requests in doubt toward a service (oldest first)",
        &["Channel", "Partner", "Group id", "Number", "Called at"],
        &rows,
    )
}

/// Received traffic and what waits, by channel and partner, with the faults this gateway
/// answered each.
fn receiving(traffic: &crate::store::Traffic) -> String {
    let mut faults: BTreeMap<(String, String), u64> = BTreeMap::new();
    for f in faults_answered() {
        *faults.entry((f.channel, f.partner)).or_default() += f.count;
    }
    let floor = traffic.received_capped;
    let mut rows: Vec<Vec<String>> = traffic
        .receiving
        .iter()
        .map(|r| receiving_row(r, floor, &mut faults))
        .collect();
    // Faults from callers who never got a message through still show.
    for ((channel, partner), n) in faults {
        rows.push(vec![
            esc(&channel),
            fault_partner(&partner),
            "0".into(),
            "0.00".into(),
            "0".into(),
            "0".into(),
            n.to_string(),
        ]);
    }
    let mut html = table(
        "Receiving, by channel and partner",
        &[
            "Channel",
            "Partner",
            "Received, last minute",
            "Per second",
            "Open groups",
            "Buffered for a gap",
            "Faults (this gateway)",
        ],
        &rows,
    );
    html.push_str(&callbacks_owed(&traffic.callbacks_owed));
    html
}

/// One (channel, partner) row of `receiving`, taking its faults answered out of `faults`
/// (what is left there are callers who never got a message through). `floor`: the counts
/// were capped, so they are lower bounds.
fn receiving_row(
    r: &Receiving,
    floor: bool,
    faults: &mut BTreeMap<(String, String), u64>,
) -> Vec<String> {
    let label = if r.partner.is_empty() {
        ANONYMOUS
    } else {
        &r.partner
    };
    let answered = faults
        .remove(&(r.channel.clone(), label.to_owned()))
        .unwrap_or(0);
    let search = format!(
        "/console/inbox?channel={}&partner={}",
        query_value(&r.channel),
        query_value(partner_query(&r.partner))
    );
    vec![
        link(&search, &r.channel),
        esc(partner_shown(&r.partner)),
        at_least(r.received, floor),
        format!(
            "{}{:.2}",
            if floor { "≥ " } else { "" },
            r.received as f64 / RATE_WINDOW_SECONDS as f64
        ),
        link(
            &format!(
                "/console/groups?status=open&partner={}",
                query_value(partner_query(&r.partner))
            ),
            &r.open_groups.to_string(),
        ),
        link(
            &format!(
                "/console/groups?buffered=yes&partner={}",
                query_value(partner_query(&r.partner))
            ),
            &r.buffered.to_string(),
        ),
        answered.to_string(),
    ]
}

/// Callback acks and faults owed, by partner.
fn callbacks_owed(owed: &[(String, u64)]) -> String {
    let owed: Vec<Vec<String>> = owed
        .iter()
        .map(|(p, n)| vec![esc(partner_shown(p)), n.to_string()])
        .collect();
    table(
        "Callback acks owed, by partner",
        &["Partner", "Owed"],
        &owed,
    )
}

/// Our messages by partner and state, with those in doubt (a poll alone can settle them; the
/// operator may resend or fail them).
fn sending(
    traffic: &crate::store::Traffic,
    in_doubt: &crate::outbound::operator::InDoubt,
) -> String {
    let state = |states: &[(String, u64)], name: &str| {
        states
            .iter()
            .find(|(s, _)| s == name)
            .map_or(0, |(_, n)| *n)
    };
    let rows: Vec<Vec<String>> = traffic
        .sending
        .iter()
        .map(|s| {
            let list = |state: &str| {
                format!(
                    "/console/messages?partner={}&state={state}",
                    query_value(partner_query(&s.partner))
                )
            };
            let doubt = in_doubt.by_partner.get(&s.partner).copied().unwrap_or(0);
            vec![
                esc(partner_shown(&s.partner)),
                link(&list("queued"), &state(&s.states, "queued").to_string()),
                link(&list("sent"), &state(&s.states, "sent").to_string()),
                link(&list("in_doubt"), &at_least(doubt, !in_doubt.complete)),
                link(&list("failed"), &state(&s.states, "failed").to_string()),
                link(&list("faulted"), &state(&s.states, "faulted").to_string()),
                link(&list("acked"), &state(&s.states, "acked").to_string()),
            ]
        })
        .collect();
    table(
        "Sending, by partner",
        &[
            "Partner",
            "Queued",
            "Sent, no verdict yet",
            "In doubt",
            "Failed",
            "Faulted",
            "Acked",
        ],
        &rows,
    )
}

/// Sources whose storage quota (D13) held messages back, on this gateway since it started:
/// who is being told to resend later, and by which quota.
fn held_back() -> String {
    let rows: Vec<Vec<String>> = held_back_sources()
        .into_iter()
        .map(|h| {
            vec![
                esc(&h.source),
                fault_partner(&h.partner),
                esc(&h.channel),
                esc(h.quota),
                h.count.to_string(),
                h.first.format("%Y-%m-%d %H:%M:%S").to_string(),
                h.last.format("%Y-%m-%d %H:%M:%S").to_string(),
            ]
        })
        .collect();
    table(
        "Sources held back by their storage quota (this gateway, since it started)",
        &[
            "Source", "Partner", "Channel", "Quota", "Refused", "First", "Latest",
        ],
        &rows,
    )
}

/// Faults this gateway answered since it started, by code.
fn faults() -> String {
    let rows: Vec<Vec<String>> = faults_answered()
        .into_iter()
        .map(|f| {
            vec![
                esc(&f.channel),
                fault_partner(&f.partner),
                esc(f.code),
                f.count.to_string(),
            ]
        })
        .collect();
    table(
        "Faults answered by this gateway since it started",
        &["Channel", "Partner", "Fault", "Count"],
        &rows,
    )
}
