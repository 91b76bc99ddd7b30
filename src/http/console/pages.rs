//! The console's pages and actions. Each reads its query or form, calls what the API's
//! handlers call (the store's reads, `outbound::operator::act`, `change_dead_letters`) and
//! renders the answer through `html`: every dynamic value is escaped there. Lists are pages
//! of at most `PAGE` rows, continued with `after`.

use std::fmt::Write as _;

use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Form, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;

use super::html::{self, Stop, esc, facts, link, query_value, table};
use super::{Acting, Operator};
use crate::delivery::subscription::Mode;
use crate::http::AppState;
use crate::outbound::operator::{ActionError, OperatorAction, act, check_reason};
use crate::outbound::view::message_json;
use crate::rmp::group::GroupState;
use crate::store::delivery::{DeadLetterChange, DeliveryError};
use crate::store::{Endpoints, StoreError};
use crate::wsr::datetime::date_time_string;

/// Rows per list page.
const PAGE: i64 = 50;
/// The longest id, group id, partner or reason a page accepts (anything longer names
/// nothing the gateway holds).
const MAX_TEXT: usize = 1000;
/// A message's history shown at most (a message has a handful of state changes).
const MAX_EVENTS: i64 = 200;
/// Subscriptions listed at most (each costs a backlog count).
const MAX_SUBSCRIPTIONS: usize = 200;
/// Ranges, numbers or faults of a group shown at most.
const MAX_ITEMS: usize = 100;
/// The outbound states, as `out_messages` filters them.
const STATES: &[&str] = &["queued", "sent", "acked", "faulted", "failed"];

type Page = Result<Response, Stop>;

/// A 303 to `location` (after a POST, so that reloading does not repeat it).
pub fn see_other(location: &str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    html::secure_headers(response.headers_mut());
    response
}

fn shown(title: &str, body: &str) -> Page {
    Ok(html::page(StatusCode::OK, title, body, true))
}

fn refused(status: StatusCode, title: &str, why: &str, back: Option<&str>) -> Stop {
    let mut body = html::error(why);
    if let Some(back) = back {
        let _ = write!(body, "<p>{}</p>", link(back, "Back"));
    }
    html::page(status, title, &body, true).into()
}

fn bad_request(why: &str) -> Stop {
    refused(StatusCode::BAD_REQUEST, "Bad request", why, None)
}

fn not_found(what: &str) -> Stop {
    refused(StatusCode::NOT_FOUND, "Not found", what, None)
}

fn unavailable(e: &dyn std::fmt::Display) -> Stop {
    crate::store::health::log_store_failure("console answered 503", e);
    refused(
        StatusCode::SERVICE_UNAVAILABLE,
        "Store unavailable",
        "the store could not answer; try again",
        None,
    )
}

fn store<T>(result: Result<T, StoreError>) -> Result<T, Stop> {
    result.map_err(|e| unavailable(&e))
}

fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, Stop> {
    q.map(|Query(q)| q)
        .map_err(|e| bad_request(&format!("the query does not parse: {}", e.body_text())))
}

fn form<T>(f: Result<Form<T>, FormRejection>) -> Result<T, Stop> {
    f.map(|Form(f)| f)
        .map_err(|e| bad_request(&format!("the form does not parse: {}", e.body_text())))
}

/// An optional text parameter: empty is absent; longer than `MAX_TEXT` is refused.
fn text<'a>(name: &str, value: &'a Option<String>) -> Result<Option<&'a str>, Stop> {
    match value.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(v) if v.len() > MAX_TEXT => {
            Err(bad_request(&format!("{name}: at most {MAX_TEXT} bytes")))
        }
        Some(v) => Ok(Some(v)),
    }
}

fn required<'a>(name: &str, value: &'a Option<String>) -> Result<&'a str, Stop> {
    text(name, value)?.ok_or_else(|| bad_request(&format!("{name}: missing")))
}

/// An optional non-negative number parameter (an offset or id).
fn number(name: &str, value: &Option<String>) -> Result<Option<i64>, Stop> {
    match value.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(v) => v
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .map(Some)
            .ok_or_else(|| bad_request(&format!("{name}: not a number from 0 to 2^63-1"))),
    }
}

fn when(t: &chrono::DateTime<chrono::Utc>) -> String {
    esc(&date_time_string(t))
}

/// A JSON value as a cell: strings without quotes, nothing as a dash.
fn cell(v: &Value) -> String {
    match v {
        Value::Null => "—".into(),
        Value::String(s) => esc(s),
        other => esc(&other.to_string()),
    }
}

// ---- overview ----------------------------------------------------------------------------

pub async fn overview(Operator(_): Operator, State(app): State<AppState>) -> Page {
    let stats = store(app.store.stats().await)?;
    let mut body =
        String::from("<p>What the store holds now, the same on every gateway of a cluster.</p>");
    body.push_str(&facts(
        "Receiving",
        &[
            (
                "Callback acks owed to partners",
                stats.pending_callbacks.to_string(),
            ),
            (
                "Ordered messages buffered for a gap",
                stats.buffered_messages.to_string(),
            ),
        ],
    ));
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
    let outbound: Vec<Vec<String>> = stats
        .outbound
        .iter()
        .map(|(state, n)| {
            let href = format!("/console/messages?state={}", query_value(state));
            vec![link(&href, state), n.to_string()]
        })
        .collect();
    body.push_str(&table(
        "Outbound messages by state",
        &["State", "Messages"],
        &outbound,
    ));
    let subs: Vec<Vec<String>> = stats
        .subscriptions
        .iter()
        .take(MAX_SUBSCRIPTIONS)
        .map(|s| {
            vec![
                esc(&s.name),
                s.waiting.to_string(),
                s.in_flight.to_string(),
                s.dead_letters.to_string(),
            ]
        })
        .collect();
    body.push_str(&table(
        "Subscriptions",
        &["Subscription", "Waiting", "In flight", "Dead letters"],
        &subs,
    ));
    shown("Overview", &body)
}

// ---- outbound ----------------------------------------------------------------------------

#[derive(Deserialize)]
pub struct MessagesQuery {
    state: Option<String>,
    group: Option<String>,
    after: Option<String>,
}

pub async fn messages(
    Operator(_): Operator,
    State(app): State<AppState>,
    q: Result<Query<MessagesQuery>, QueryRejection>,
) -> Page {
    let q = query(q)?;
    let state = text("state", &q.state)?;
    if let Some(s) = state
        && !STATES.contains(&s)
    {
        return Err(bad_request(
            "state: one of queued, sent, acked, faulted, failed",
        ));
    }
    let group = text("group", &q.group)?;
    let after = text("after", &q.after)?;
    let list = store(app.store.out_messages(state, group, after, PAGE).await)?;
    let mut body = String::from(
        "<form method=\"get\" action=\"/console/messages\"><label for=\"state\">State</label>\
         <select id=\"state\" name=\"state\"><option value=\"\">any</option>",
    );
    for s in STATES {
        let selected = if state == Some(*s) { " selected" } else { "" };
        let _ = write!(body, "<option value=\"{s}\"{selected}>{s}</option>");
    }
    let _ = write!(
        body,
        "</select><label for=\"group\">Group id</label>\
         <input id=\"group\" name=\"group\" value=\"{}\"><button type=\"submit\">Filter</button></form>",
        esc(group.unwrap_or(""))
    );
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|m| {
            vec![
                link(
                    &format!("/console/message?id={}", query_value(&m.id)),
                    &m.id,
                ),
                esc(m.group_id.as_str()),
                m.number.map_or("—".into(), |n| n.to_string()),
                esc(&m.destination),
                esc(m.outbound.state.name()),
                m.outbound.attempts.to_string(),
                m.outbound.next_attempt.as_ref().map_or("—".into(), when),
                when(&m.outbound.expiry),
            ]
        })
        .collect();
    body.push_str(&table(
        "Outbound messages",
        &[
            "Id",
            "Group",
            "Number",
            "Destination",
            "State",
            "Attempts",
            "Next attempt",
            "Expiry",
        ],
        &rows,
    ));
    if let (Some(last), true) = (list.last(), list.len() as i64 == PAGE) {
        let href = format!(
            "/console/messages?state={}&group={}&after={}",
            query_value(state.unwrap_or("")),
            query_value(group.unwrap_or("")),
            query_value(&last.id)
        );
        let _ = write!(body, "<p>{}</p>", link(&href, "Next page"));
    }
    shown("Outbound messages", &body)
}

#[derive(Deserialize)]
pub struct MessageQuery {
    id: Option<String>,
    done: Option<String>,
}

pub async fn message(
    Operator(_): Operator,
    State(app): State<AppState>,
    q: Result<Query<MessageQuery>, QueryRejection>,
) -> Page {
    let q = query(q)?;
    let id = required("id", &q.id)?;
    let Some(m) = store(app.store.out_message(id).await)? else {
        return Err(not_found(&format!("no outbound message {id}")));
    };
    let history = store(app.store.out_message_events(id, MAX_EVENTS).await)?;
    let mut body = String::new();
    match q.done.as_deref() {
        Some("resent") => body.push_str(&html::notice("Resend ordered: the message is due now.")),
        Some("failed") => body.push_str(&html::notice("The message was failed.")),
        _ => {}
    }
    let view = message_json(&m);
    let rows: Vec<(&str, String)> = view
        .as_object()
        .map(|o| o.iter().map(|(k, v)| (k.as_str(), cell(v))).collect())
        .unwrap_or_default();
    body.push_str(&facts("Message", &rows));
    if !m.outbound.state.is_final() {
        body.push_str("<h2>Operator actions</h2>");
        body.push_str(&html::button_form(
            "/console/message/resend",
            "Resend now",
            &[("id", id)],
        ));
        let _ = write!(
            body,
            "<form method=\"post\" action=\"/console/message/fail\">\
             <input type=\"hidden\" name=\"id\" value=\"{}\">\
             <label for=\"reason\">Reason</label><input id=\"reason\" name=\"reason\" maxlength=\"{MAX_TEXT}\">\
             <button type=\"submit\">Fail</button></form>",
            esc(id)
        );
    }
    let events: Vec<Vec<String>> = history
        .iter()
        .map(|e| {
            vec![
                e.seq.to_string(),
                esc(&e.state),
                e.detail.as_deref().map_or("—".into(), esc),
                when(&e.at),
            ]
        })
        .collect();
    body.push_str("<h2>History</h2>");
    body.push_str(&table(
        "State changes",
        &["Event", "State", "Detail", "At"],
        &events,
    ));
    let _ = write!(body, "<h2>Envelope</h2><pre>{}</pre>", esc(&m.envelope));
    shown(&format!("Outbound message {id}"), &body)
}

#[derive(Deserialize)]
pub struct ActionForm {
    id: Option<String>,
    reason: Option<String>,
}

pub async fn resend(
    Acting(_): Acting,
    State(app): State<AppState>,
    f: Result<Form<ActionForm>, FormRejection>,
) -> Page {
    let f = form(f)?;
    let id = required("id", &f.id)?;
    let outcome = act(&app.store, id, OperatorAction::Resend, app.clock.now()).await;
    acted(id, outcome, "resent")
}

pub async fn fail(
    Acting(caller): Acting,
    State(app): State<AppState>,
    f: Result<Form<ActionForm>, FormRejection>,
) -> Page {
    let f = form(f)?;
    let id = required("id", &f.id)?;
    let why = text("reason", &f.reason)?.unwrap_or("");
    check_reason(why).map_err(|e| bad_request(&format!("reason: {e}")))?;
    let action = OperatorAction::Fail {
        operator: &caller.principal,
        why,
    };
    let outcome = act(&app.store, id, action, app.clock.now()).await;
    acted(id, outcome, "failed")
}

fn acted(
    id: &str,
    outcome: Result<crate::store::outbound::OutMessage, ActionError>,
    done: &str,
) -> Page {
    let back = format!("/console/message?id={}", query_value(id));
    match outcome {
        Ok(_) => Ok(see_other(&format!("{back}&done={done}"))),
        Err(ActionError::NotFound(_)) => Err(not_found(&format!("no outbound message {id}"))),
        Err(e @ (ActionError::Refused(_) | ActionError::Changed(_))) => Err(refused(
            StatusCode::CONFLICT,
            "Not done",
            &e.to_string(),
            Some(&back),
        )),
        Err(ActionError::Store(e)) => Err(unavailable(&e)),
    }
}

// ---- inbound -----------------------------------------------------------------------------

#[derive(Deserialize)]
pub struct GroupsQuery {
    after: Option<String>,
    after_partner: Option<String>,
}

fn ranges(pairs: &[(u64, u64)]) -> String {
    let mut shown: Vec<String> = pairs
        .iter()
        .take(MAX_ITEMS)
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}–{b}")
            }
        })
        .collect();
    if pairs.len() > MAX_ITEMS {
        shown.push(format!("… ({} ranges)", pairs.len()));
    }
    if shown.is_empty() {
        "—".into()
    } else {
        shown.join(", ")
    }
}

fn group_href(partner: &str, group_id: &str) -> String {
    format!(
        "/console/group?partner={}&id={}",
        query_value(partner),
        query_value(group_id)
    )
}

const GROUP_SEARCH: &str = "<form method=\"get\" action=\"/console/group\">\
    <label for=\"group-id\">Group id</label><input id=\"group-id\" name=\"id\" required>\
    <label for=\"partner\">Partner</label><input id=\"partner\" name=\"partner\" placeholder=\"(anonymous)\">\
    <button type=\"submit\">Find</button></form>";

pub async fn groups(
    Operator(_): Operator,
    State(app): State<AppState>,
    q: Result<Query<GroupsQuery>, QueryRejection>,
) -> Page {
    let q = query(q)?;
    let after = text("after", &q.after)?;
    let after_partner = text("after_partner", &q.after_partner)?.unwrap_or("");
    let list = store(
        app.store
            .groups(after.map(|g| (after_partner, g)), PAGE)
            .await,
    )?;
    let mut body = String::from(GROUP_SEARCH);
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|(partner, g)| {
            vec![
                link(
                    &group_href(partner, g.group_id.as_str()),
                    g.group_id.as_str(),
                ),
                esc(if partner.is_empty() {
                    "(anonymous)"
                } else {
                    partner
                }),
                esc(&g.params.channel),
                esc(g.status.as_str()),
                esc(&ranges(g.delivered.pairs())),
                g.buffered.len().to_string(),
                g.faults.len().to_string(),
                when(&g.last_activity),
            ]
        })
        .collect();
    body.push_str(&table(
        "Received groups",
        &[
            "Group id",
            "Partner",
            "Channel",
            "Status",
            "Delivered",
            "Buffered",
            "Faults",
            "Last activity",
        ],
        &rows,
    ));
    if let (Some((partner, g)), true) = (list.last(), list.len() as i64 == PAGE) {
        let href = format!(
            "/console/groups?after={}&after_partner={}",
            query_value(g.group_id.as_str()),
            query_value(partner)
        );
        let _ = write!(body, "<p>{}</p>", link(&href, "Next page"));
    }
    shown("Inbound groups", &body)
}

#[derive(Deserialize)]
pub struct GroupQuery {
    id: Option<String>,
    partner: Option<String>,
}

pub async fn group(
    Operator(_): Operator,
    State(app): State<AppState>,
    q: Result<Query<GroupQuery>, QueryRejection>,
) -> Page {
    let q = query(q)?;
    let id = required("id", &q.id)?;
    let partner = text("partner", &q.partner)?.unwrap_or("");
    let Some(g) = store(app.store.group(partner, id).await)? else {
        let mut body = html::error(&format!(
            "no group {id} of {}",
            if partner.is_empty() {
                "anonymous callers"
            } else {
                partner
            }
        ));
        body.push_str(GROUP_SEARCH);
        return Err(html::page(StatusCode::NOT_FOUND, "Group not found", &body, true).into());
    };
    let body = facts("Group", &group_facts(partner, &g));
    shown(&format!("Group {id}"), &body)
}

fn group_facts(partner: &str, g: &GroupState) -> Vec<(&'static str, String)> {
    let buffered: Vec<String> = g
        .buffered
        .keys()
        .take(MAX_ITEMS)
        .map(u64::to_string)
        .collect();
    let faults: Vec<String> = g
        .faults
        .iter()
        .take(MAX_ITEMS)
        .map(|(n, c)| format!("{n}: {}", c.local_name()))
        .collect();
    let or_dash = |v: Vec<String>| {
        if v.is_empty() {
            "—".into()
        } else {
            esc(&v.join(", "))
        }
    };
    vec![
        (
            "Partner",
            esc(if partner.is_empty() {
                "(anonymous)"
            } else {
                partner
            }),
        ),
        ("Group id", esc(g.group_id.as_str())),
        ("Channel", esc(&g.params.channel)),
        ("Status", esc(g.status.as_str())),
        ("Sequenced", g.params.sequenced.to_string()),
        ("Ordered", g.params.message_order.to_string()),
        ("Last number", g.last.map_or("—".into(), |n| n.to_string())),
        ("Delivered", esc(&ranges(g.delivered.pairs()))),
        (
            "Next expected",
            if g.params.message_order {
                g.next_expected.to_string()
            } else {
                "—".into()
            },
        ),
        ("Buffered numbers", or_dash(buffered)),
        ("Faults", or_dash(faults)),
        ("Kept at least until", when(&g.max_expiry)),
        ("Last activity", when(&g.last_activity)),
        (
            "Terminated at",
            g.terminated_at.as_ref().map_or("—".into(), when),
        ),
    ]
}

#[derive(Deserialize)]
pub struct InboxQuery {
    after: Option<String>,
    offset: Option<String>,
}

pub async fn inbox(
    Operator(_): Operator,
    State(app): State<AppState>,
    q: Result<Query<InboxQuery>, QueryRejection>,
) -> Page {
    let q = query(q)?;
    let after = number("after", &q.after)?.unwrap_or(0);
    let list = store(app.store.inbox(after, PAGE).await)?;
    let mut body = String::from(
        "<form method=\"get\" action=\"/console/inbox/message\">\
         <label for=\"offset\">Offset</label><input id=\"offset\" name=\"offset\" inputmode=\"numeric\" required>\
         <button type=\"submit\">Open</button></form>",
    );
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|e| {
            vec![
                link(
                    &format!("/console/inbox/message?offset={}", e.offset),
                    &e.offset.to_string(),
                ),
                esc(&e.topic),
                esc(if e.partner.is_empty() {
                    "(anonymous)"
                } else {
                    &e.partner
                }),
                link(&group_href(&e.partner, &e.group_id), &e.group_id),
                e.number.map_or("—".into(), |n| n.to_string()),
                when(&e.received_at),
                e.payload.len().to_string(),
            ]
        })
        .collect();
    body.push_str(&table(
        "Delivered messages",
        &[
            "Offset", "Topic", "Partner", "Group id", "Number", "Received", "Bytes",
        ],
        &rows,
    ));
    if let (Some(last), true) = (list.last(), list.len() as i64 == PAGE) {
        let href = format!("/console/inbox?after={}", last.offset);
        let _ = write!(body, "<p>{}</p>", link(&href, "Next page"));
    }
    shown("Inbox", &body)
}

pub async fn inbox_message(
    Operator(_): Operator,
    State(app): State<AppState>,
    q: Result<Query<InboxQuery>, QueryRejection>,
) -> Page {
    let q = query(q)?;
    let offset = number("offset", &q.offset)?
        .filter(|o| *o >= 1)
        .ok_or_else(|| bad_request("offset: a number from 1"))?;
    let found = store(app.store.inbox(offset - 1, 1).await)?;
    let Some(e) = found.into_iter().find(|e| e.offset == offset) else {
        return Err(not_found(&format!(
            "no message at offset {offset} (never delivered, or purged)"
        )));
    };
    let mut body = facts(
        "Delivered message",
        &[
            ("Offset", e.offset.to_string()),
            ("Topic", esc(&e.topic)),
            ("Channel", esc(&e.channel)),
            (
                "Partner",
                esc(if e.partner.is_empty() {
                    "(anonymous)"
                } else {
                    &e.partner
                }),
            ),
            (
                "Group id",
                link(&group_href(&e.partner, &e.group_id), &e.group_id),
            ),
            ("Number", e.number.map_or("—".into(), |n| n.to_string())),
            ("Received", when(&e.received_at)),
            ("Expiry", when(&e.expiry)),
        ],
    );
    let _ = write!(body, "<h2>Payload</h2><pre>{}</pre>", esc(&e.payload));
    shown(&format!("Inbox message {offset}"), &body)
}

// ---- subscriptions -------------------------------------------------------------------------

pub async fn subscriptions(Operator(_): Operator, State(app): State<AppState>) -> Page {
    let subs = store(app.store.subscriptions().await)?;
    let mut rows = Vec::new();
    for s in subs.iter().take(MAX_SUBSCRIPTIONS) {
        let b = store(app.store.backlog(s.id).await)?;
        rows.push(vec![
            link(&format!("/console/subscription?id={}", s.id), &s.name),
            esc(&s.filter),
            esc(&s.owner),
            esc(match s.rules.mode {
                Mode::Pull => "pull",
                Mode::Push { .. } => "push",
            }),
            b.waiting.to_string(),
            b.in_flight.to_string(),
            b.dead_letters.to_string(),
        ]);
    }
    let mut body = table(
        "Subscriptions",
        &[
            "Name",
            "Filter",
            "Owner",
            "Mode",
            "Waiting",
            "In flight",
            "Dead letters",
        ],
        &rows,
    );
    if subs.len() > MAX_SUBSCRIPTIONS {
        let _ = write!(
            body,
            "<p>The first {MAX_SUBSCRIPTIONS} of {} subscriptions.</p>",
            subs.len()
        );
    }
    shown("Subscriptions", &body)
}

#[derive(Deserialize)]
pub struct SubscriptionQuery {
    id: Option<String>,
    after: Option<String>,
    done: Option<String>,
    count: Option<String>,
}

pub async fn subscription(
    Operator(_): Operator,
    State(app): State<AppState>,
    q: Result<Query<SubscriptionQuery>, QueryRejection>,
) -> Page {
    let q = query(q)?;
    let id = number("id", &q.id)?.ok_or_else(|| bad_request("id: missing"))?;
    let after = number("after", &q.after)?.unwrap_or(0);
    let Some(s) = store(app.store.subscription(id).await)? else {
        return Err(not_found(&format!("no subscription {id}")));
    };
    let b = store(app.store.backlog(id).await)?;
    let letters = store(app.store.dead_letters(id, after, PAGE).await)?;
    let mut body = String::new();
    let count = number("count", &q.count)?.unwrap_or(0);
    match q.done.as_deref() {
        Some("replay") => {
            body.push_str(&html::notice(&format!("{count} dead letter(s) replayed.")))
        }
        Some("purge") => body.push_str(&html::notice(&format!("{count} dead letter(s) purged."))),
        _ => {}
    }
    body.push_str(&facts(
        "Subscription",
        &[
            ("Name", esc(&s.name)),
            ("Filter", esc(&s.filter)),
            ("Owner", esc(&s.owner)),
            ("Grants", esc(&s.grants.join(", "))),
            (
                "Rules",
                esc(&serde_json::to_string(&s.rules).unwrap_or_default()),
            ),
            ("Created", when(&s.created_at)),
        ],
    ));
    body.push_str(&facts(
        "Backlog",
        &[
            ("Waiting", b.waiting.to_string()),
            ("In flight", b.in_flight.to_string()),
            ("Dead letters", b.dead_letters.to_string()),
            ("Not matched yet", b.unmatched.to_string()),
        ],
    ));
    body.push_str("<h2>Dead letters</h2>");
    let sid = id.to_string();
    if b.dead_letters > 0 {
        body.push_str(&html::button_form(
            "/console/subscription/dead-letters",
            "Replay all dead letters",
            &[("id", &sid), ("change", "replay")],
        ));
        body.push_str(&html::button_form(
            "/console/subscription/dead-letters",
            "Purge all dead letters",
            &[("id", &sid), ("change", "purge")],
        ));
    }
    let rows: Vec<Vec<String>> = letters
        .iter()
        .map(|d| {
            let offset = d.offset.to_string();
            vec![
                link(&format!("/console/inbox/message?offset={offset}"), &offset),
                d.message.as_ref().map_or("—".into(), |m| esc(&m.topic)),
                d.attempts.to_string(),
                esc(&d.reason),
                html::button_form(
                    "/console/subscription/dead-letters",
                    "Replay",
                    &[("id", &sid), ("change", "replay"), ("offset", &offset)],
                ),
            ]
        })
        .collect();
    body.push_str(&table(
        "Dead letters",
        &["Offset", "Topic", "Attempts", "Reason", "Action"],
        &rows,
    ));
    if let (Some(last), true) = (letters.last(), letters.len() as i64 == PAGE) {
        let href = format!("/console/subscription?id={id}&after={}", last.offset);
        let _ = write!(body, "<p>{}</p>", link(&href, "Next page"));
    }
    shown(&format!("Subscription {}", s.name), &body)
}

#[derive(Deserialize)]
pub struct DeadLetterForm {
    id: Option<String>,
    change: Option<String>,
    offset: Option<String>,
}

pub async fn change_dead_letters(
    Acting(_): Acting,
    State(app): State<AppState>,
    f: Result<Form<DeadLetterForm>, FormRejection>,
) -> Page {
    let f = form(f)?;
    let id = number("id", &f.id)?.ok_or_else(|| bad_request("id: missing"))?;
    let (change, done) = match f.change.as_deref() {
        Some("replay") => (DeadLetterChange::Replay, "replay"),
        Some("purge") => (DeadLetterChange::Purge, "purge"),
        _ => return Err(bad_request("change: replay or purge")),
    };
    let offset = number("offset", &f.offset)?.map(|o| [o]);
    if store(app.store.subscription(id).await)?.is_none() {
        return Err(not_found(&format!("no subscription {id}")));
    }
    let back = format!("/console/subscription?id={id}");
    let changed = app
        .store
        .change_dead_letters(id, offset.as_ref().map(|o| &o[..]), change, app.clock.now())
        .await
        .map_err(|e| match e {
            DeliveryError::Store(e) => unavailable(&e),
            DeliveryError::NotFound(why) => not_found(&why),
            other => refused(
                StatusCode::CONFLICT,
                "Not done",
                &other.to_string(),
                Some(&back),
            ),
        })?;
    Ok(see_other(&format!("{back}&done={done}&count={changed}")))
}

// ---- endpoints -----------------------------------------------------------------------------

pub async fn endpoints(Operator(_): Operator, State(app): State<AppState>) -> Page {
    let callbacks = store(app.store.callback_endpoints().await)?;
    let push = store(app.store.endpoints(Endpoints::Push).await)?;
    let rows: Vec<Vec<String>> = callbacks
        .iter()
        .map(|(partner, url)| {
            vec![
                esc(url),
                esc(if partner.is_empty() {
                    "(anonymous callers)"
                } else {
                    partner
                }),
            ]
        })
        .collect();
    let mut body = table(
        "Callback endpoints (ReplyTo addresses partners may name)",
        &["URL", "Who may name it"],
        &rows,
    );
    let rows: Vec<Vec<String>> = push.iter().map(|url| vec![esc(url)]).collect();
    body.push_str(&table(
        "Push endpoints (webhooks of push subscriptions)",
        &["URL"],
        &rows,
    ));
    body.push_str(
        "<p>Register and remove endpoints with the admin API or <code>wsr-gateway endpoints</code>.</p>",
    );
    shown("Endpoints", &body)
}
