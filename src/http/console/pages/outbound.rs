//! Our messages: the list by state, partner and group, one message with its history and
//! payload, and the operator's resend and fail.

use std::fmt::Write as _;

use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Form, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;

use super::super::html::{self, esc, facts, link, query_value, table};
use super::super::{Acting, Operator};
use super::{
    MAX_EVENTS, MAX_TEXT, NO_PARTNER, PAGE, Page, STATES, bad_request, cell, excerpt, form,
    not_found, partner_filter, query, refused, required, see_other, shown, store, text,
    unavailable, when,
};
use crate::http::AppState;
use crate::outbound::http_client::redacted;
use crate::outbound::operator::{ActionError, OperatorAction, act, check_reason};
use crate::outbound::view::message_json;
use crate::store::outbound::{OutFilter, OutMessage};

/// The partner's business response kept with the message (D16): what it is, and its
/// beginning (`excerpt`) with the link to all of it.
fn business_response(id: &str, kept: &crate::store::outbound::KeptResponse) -> String {
    let info = &kept.info;
    let mut out = String::from("<h2>Business response</h2>");
    out.push_str(&facts(
        "The partner's answer",
        &[
            ("Content-Type", esc(&info.content_type)),
            ("Size", format!("{} bytes", info.size)),
            (
                "SOAP Fault",
                if info.soap_fault { "yes" } else { "no" }.into(),
            ),
            ("Received", when(&info.received_at)),
        ],
    ));
    out.push_str(&excerpt(
        "response",
        &kept.body,
        &download_href("response", id),
    ));
    out
}

/// Where a message's `envelope` or business `response` is downloaded whole.
fn download_href(what: &str, id: &str) -> String {
    format!("/console/message/{what}?id={}", query_value(id))
}

#[derive(Deserialize)]
pub struct MessagesQuery {
    state: Option<String>,
    group: Option<String>,
    partner: Option<String>,
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
    let partner = text("partner", &q.partner)?;
    let after = text("after", &q.after)?;
    let filter = OutFilter {
        state,
        group,
        partner: partner_filter(partner),
        ..OutFilter::default()
    };
    let list = store(app.store.out_messages_of(&filter, after, PAGE).await)?;
    let mut body = messages_form(state, group, partner);
    body.push_str(&messages_table(&list));
    if let (Some(last), true) = (list.last(), list.len() as i64 == PAGE) {
        let href = format!(
            "/console/messages?state={}&group={}&partner={}&after={}",
            query_value(state.unwrap_or("")),
            query_value(group.unwrap_or("")),
            query_value(partner.unwrap_or("")),
            query_value(&last.id)
        );
        let _ = write!(body, "<p>{}</p>", link(&href, "Next page"));
    }
    shown("Outbound messages", &body)
}

/// The filter form, showing the filter in force.
fn messages_form(state: Option<&str>, group: Option<&str>, partner: Option<&str>) -> String {
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
         <input id=\"group\" name=\"group\" value=\"{}\">\
         <label for=\"partner\">Partner</label>\
         <input id=\"partner\" name=\"partner\" value=\"{}\" placeholder=\"{NO_PARTNER} for URL destinations\">\
         <button type=\"submit\">Filter</button></form>",
        esc(group.unwrap_or("")),
        esc(partner.unwrap_or(""))
    );
    body
}

/// One page of messages, a row each.
fn messages_table(list: &[OutMessage]) -> String {
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
                esc(&redacted(&m.destination)),
                esc(if m.partner.is_empty() {
                    "—"
                } else {
                    &m.partner
                }),
                esc(m.outbound.state.name()),
                m.outbound.attempts.to_string(),
                m.outbound.next_attempt.as_ref().map_or("—".into(), when),
                when(&m.outbound.expiry),
            ]
        })
        .collect();
    table(
        "Outbound messages",
        &[
            "Id",
            "Group",
            "Number",
            "Destination",
            "Partner",
            "State",
            "Attempts",
            "Next attempt",
            "Expiry",
        ],
        &rows,
    )
}

#[derive(Deserialize)]
pub struct MessageQuery {
    id: Option<String>,
    done: Option<String>,
}

/// The outbound message the query's `id` names, with that id.
async fn outbound_message<'q>(
    app: &AppState,
    q: &'q MessageQuery,
) -> Result<(&'q str, OutMessage), html::Stop> {
    let id = required("id", &q.id)?;
    match store(app.store.out_message(id).await)? {
        Some(m) => Ok((id, m)),
        None => Err(not_found(&format!("no outbound message {id}"))),
    }
}

pub async fn message(
    Operator(_): Operator,
    State(app): State<AppState>,
    q: Result<Query<MessageQuery>, QueryRejection>,
) -> Page {
    let q = query(q)?;
    let (id, m) = outbound_message(&app, &q).await?;
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
    body.push_str("<h2>Envelope</h2>");
    body.push_str(&excerpt(
        "envelope",
        m.envelope.as_bytes(),
        &download_href("envelope", id),
    ));
    if let Some(kept) = store(app.store.out_response(id).await)? {
        body.push_str(&business_response(id, &kept));
    }
    shown(&format!("Outbound message {id}"), &body)
}

/// `/console/message/envelope?id=…`: the message's whole envelope as stored, a download (the
/// message page shows only its beginning).
pub async fn envelope(
    Operator(_): Operator,
    State(app): State<AppState>,
    q: Result<Query<MessageQuery>, QueryRejection>,
) -> Page {
    let q = query(q)?;
    let (_, m) = outbound_message(&app, &q).await?;
    let content_type = m.version.content_type();
    Ok(html::attachment(
        content_type,
        "envelope.xml",
        m.envelope.into(),
    ))
}

/// `/console/message/response?id=…`: the partner's business response as received, with the
/// Content-Type it came with, a download (as `GET /api/v1/messages/{id}/response` gives it).
pub async fn response(
    Operator(_): Operator,
    State(app): State<AppState>,
    q: Result<Query<MessageQuery>, QueryRejection>,
) -> Page {
    let q = query(q)?;
    let id = required("id", &q.id)?;
    let Some(kept) = store(app.store.out_response(id).await)? else {
        return Err(not_found(&format!(
            "no business response kept for outbound message {id}"
        )));
    };
    let content_type = &kept.info.content_type;
    Ok(html::attachment(content_type, "response", kept.body.into()))
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
