//! Our messages: the list by state, partner and group, one message with its history and
//! payload, and the operator's resend and fail.

use std::fmt::Write as _;

use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Form, Query, State};
use serde::Deserialize;

use super::super::html::{self, esc, facts, link, query_value, table};
use super::super::{Acting, Operator};
use super::{
    MAX_EVENTS, MAX_TEXT, NO_PARTNER, PAGE, Page, bad_request, cell, excerpt, form, not_found,
    partner_filter, partner_shown, query, required, see_other, shown, store, text, unavailable,
    when,
};
use crate::http::messages::IN_DOUBT;
use crate::http::{AppState, audit};
use crate::outbound::http_client::redacted;
use crate::outbound::operator::{
    self, ActionError, OperatorAction, SendAgainError, act, check_reason,
};
use crate::outbound::view::message_json;
use crate::store::outbound::{AttemptHistory, OutFilter, OutMessage};

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

/// The list's state filters: the stored states, and `in_doubt` (sent, nothing more to send,
/// only polls settle them).
const LIST_STATES: &[&str] = &["queued", "sent", IN_DOUBT, "acked", "faulted", "failed"];

/// A message's state as the console shows it: in doubt is a state of its own there.
fn state_shown(m: &OutMessage) -> &'static str {
    if m.outbound.in_doubt() {
        "in doubt"
    } else {
        m.outbound.state.name()
    }
}

pub async fn messages(
    Operator(_): Operator,
    State(app): State<AppState>,
    q: Result<Query<MessagesQuery>, QueryRejection>,
) -> Page {
    let q = query(q)?;
    let state = text("state", &q.state)?;
    if let Some(s) = state
        && !LIST_STATES.contains(&s)
    {
        return Err(bad_request(
            "state: one of queued, sent, in_doubt, acked, faulted, failed",
        ));
    }
    let group = text("group", &q.group)?;
    let partner = text("partner", &q.partner)?;
    let after = text("after", &q.after)?;
    let in_doubt = state == Some(IN_DOUBT);
    // Newest first: what an operator looks for is what just happened.
    let filter = OutFilter {
        state: state.filter(|_| !in_doubt),
        group,
        partner: partner_filter(partner),
        principal: None,
        in_doubt,
        newest_first: true,
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
        let _ = write!(body, "<p>{}</p>", link(&href, "Older"));
    }
    shown("Outbound messages", &body)
}

/// The filter form, showing the filter in force.
fn messages_form(state: Option<&str>, group: Option<&str>, partner: Option<&str>) -> String {
    let mut body = String::from(
        "<form method=\"get\" action=\"/console/messages\"><label for=\"state\">State</label>\
         <select id=\"state\" name=\"state\"><option value=\"\">any</option>",
    );
    for s in LIST_STATES {
        let selected = if state == Some(*s) { " selected" } else { "" };
        let label = s.replace('_', " ");
        let _ = write!(body, "<option value=\"{s}\"{selected}>{label}</option>");
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

/// One page of messages, a row each, newest first.
fn messages_table(list: &[OutMessage]) -> String {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|m| {
            let href = format!("/console/message?id={}", query_value(&m.id));
            vec![
                html::id_link(&href, &m.id),
                esc(state_shown(m)),
                esc(partner_shown(&m.partner)),
                esc(&redacted(&m.destination)),
                m.outbound.attempts.to_string(),
                m.last_error.as_ref().map_or("—".into(), |e| {
                    format!("{} ({})", esc(&e.cause), when(&e.at))
                }),
                when(&m.submitted_at),
                m.outbound.next_attempt.as_ref().map_or("—".into(), when),
                html::id_text(m.group_id.as_str()),
                m.number.map_or("—".into(), |n| n.to_string()),
            ]
        })
        .collect();
    table(
        "Outbound messages",
        &[
            "Id",
            "State",
            "Partner",
            "Destination",
            "Attempts",
            "Last error",
            "Submitted",
            "Next attempt",
            "Group",
            "Number",
        ],
        &rows,
    )
}

#[derive(Deserialize)]
pub struct MessageQuery {
    id: Option<String>,
    done: Option<String>,
    /// Why the action just asked for was not done (`acted`).
    refused: Option<String>,
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
    let attempts = store(app.store.out_attempts(id).await)?;
    let mut body = String::new();
    match q.done.as_deref() {
        Some("resent") => body.push_str(&html::notice("Resend ordered: the message is due now.")),
        Some("failed") => body.push_str(&html::notice("The message was failed.")),
        Some("sent_again") => body.push_str(&html::notice(
            "Sent again: this is the new message (its history names the old one).",
        )),
        _ => {}
    }
    if let Some(why) = text("refused", &q.refused)? {
        body.push_str(&html::error(&format!("Not done: {why}")));
    }
    let mut view = message_json(&m, app.polling());
    view["state"] = state_shown(&m).into();
    view["partner"] = partner_shown(&m.partner).into();
    let rows: Vec<(&str, String)> = view
        .as_object()
        .map(|o| o.iter().map(|(k, v)| (k.as_str(), cell(v))).collect())
        .unwrap_or_default();
    body.push_str(&facts("Message", &rows));
    body.push_str(&actions(&m, app.clock.now()));
    body.push_str("<h2>Attempts and polls</h2>");
    body.push_str(&attempts_table(&attempts));
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

/// The operator's actions that apply to the message now: a resend only where the rules allow
/// one (not final, not expired), a fail (with its reason and a confirmation; in an ordered
/// group it fails the later messages too).
fn actions(m: &OutMessage, now: chrono::DateTime<chrono::Utc>) -> String {
    if m.outbound.state.may_send_again().is_ok() {
        let mut body = String::from("<h2>Operator actions</h2>");
        body.push_str(&html::notice(
            "Send again makes a new message (a new identity) with this one's body and terms, \
             to the same destination; this one stays as it is.",
        ));
        body.push_str(&html::button_form(
            "/console/message/send-again",
            "Send again",
            &[("id", &m.id)],
        ));
        return body;
    }
    if m.outbound.state.is_final() {
        return String::new();
    }
    let mut body = String::from("<h2>Operator actions</h2>");
    if m.outbound.clone().resend_now(now).is_ok() {
        body.push_str(&html::button_form(
            "/console/message/resend",
            "Resend now",
            &[("id", &m.id)],
        ));
    } else {
        body.push_str(&html::notice(
            "No resend: the message has expired, and the destination would refuse it. Polls \
             settle it, or fail it.",
        ));
    }
    let consequence = if m.ordered {
        "Failing it also fails every later message of its ordered group that is not final."
    } else {
        "Failing it is final: it is not sent again."
    };
    let _ = write!(
        body,
        "<form method=\"post\" action=\"/console/message/fail\">\
         <input type=\"hidden\" name=\"id\" value=\"{}\">\
         <label for=\"reason\">Reason</label>\
         <input id=\"reason\" name=\"reason\" maxlength=\"{MAX_TEXT}\" required>\
         <label><input type=\"checkbox\" name=\"confirm\" value=\"yes\" required> {}</label>\
         <button type=\"submit\">Fail</button></form>",
        esc(&m.id),
        esc(consequence)
    );
    body
}

/// A message's kept attempts and polls, oldest first, with a line for those dropped between.
fn attempts_table(history: &AttemptHistory) -> String {
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut previous = 0;
    for (n, a) in &history.kept {
        if *n > previous + 1 {
            rows.push(vec![
                "…".into(),
                format!("{} not kept", n - previous - 1),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ]);
        }
        previous = *n;
        let verdict = match a.verdict.fault() {
            Some(code) => format!("fault {}", code.local_name()),
            None => a.verdict.name().to_owned(),
        };
        rows.push(vec![
            n.to_string(),
            a.kind.name().into(),
            when(&a.at),
            a.status.map_or("no answer".into(), |s| s.to_string()),
            esc(&verdict),
            a.failure.as_deref().map_or("—".into(), esc),
        ]);
    }
    table(
        &format!("Attempts and polls ({} in all)", history.total),
        &["#", "Kind", "At", "HTTP status", "Verdict", "Cause"],
        &rows,
    )
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
    /// `yes` when the operator ticked the confirmation of a destructive action.
    confirm: Option<String>,
}

pub async fn resend(
    Acting(caller): Acting,
    State(app): State<AppState>,
    f: Result<Form<ActionForm>, FormRejection>,
) -> Page {
    let f = form(f)?;
    let id = required("id", &f.id)?;
    let outcome = act(&app.store, id, OperatorAction::Resend, app.clock.now()).await;
    if outcome.is_ok() {
        audit::note(&app, &caller.principal, "resend", id, None).await;
    }
    acted(id, outcome, "resent")
}

pub async fn fail(
    Acting(caller): Acting,
    State(app): State<AppState>,
    f: Result<Form<ActionForm>, FormRejection>,
) -> Page {
    let f = form(f)?;
    let id = required("id", &f.id)?;
    let back = message_href(id);
    let Some(why) = text("reason", &f.reason)? else {
        return Ok(refused_at(&back, "give a reason to fail the message"));
    };
    if f.confirm.as_deref() != Some("yes") {
        return Ok(refused_at(
            &back,
            "tick the confirmation to fail the message",
        ));
    }
    check_reason(why).map_err(|e| bad_request(&format!("reason: {e}")))?;
    let action = OperatorAction::Fail {
        operator: &caller.principal,
        why,
    };
    let outcome = act(&app.store, id, action, app.clock.now()).await;
    if outcome.is_ok() {
        audit::note(&app, &caller.principal, "fail", id, Some(why.to_owned())).await;
    }
    acted(id, outcome, "failed")
}

/// `/console/message/send-again`: a failed or faulted message sent again as a new one; on to
/// the new message's page.
pub async fn send_again(
    Acting(caller): Acting,
    State(app): State<AppState>,
    f: Result<Form<ActionForm>, FormRejection>,
) -> Page {
    let f = form(f)?;
    let id = required("id", &f.id)?;
    let sending = crate::http::messages::sending_of(&app);
    match operator::send_again(sending, id, &caller.principal, app.clock.now()).await {
        Ok(new) => {
            let detail = Some(format!("as {}", new.id));
            audit::note(&app, &caller.principal, "send_again", id, detail).await;
            Ok(see_other(&format!(
                "{}&done=sent_again",
                message_href(&new.id)
            )))
        }
        Err(SendAgainError::NotFound(_)) => Err(not_found(&format!("no outbound message {id}"))),
        Err(e @ (SendAgainError::Refused(_) | SendAgainError::Submit(_))) => {
            Ok(refused_at(&message_href(id), &e.to_string()))
        }
        Err(SendAgainError::Store(e)) => Err(unavailable(&e)),
    }
}

/// A message's page.
fn message_href(id: &str) -> String {
    format!("/console/message?id={}", query_value(id))
}

/// Back to the page an action was asked on, which says why it was not done.
fn refused_at(back: &str, why: &str) -> axum::response::Response {
    see_other(&format!("{back}&refused={}", query_value(why)))
}

fn acted(
    id: &str,
    outcome: Result<crate::store::outbound::OutMessage, ActionError>,
    done: &str,
) -> Page {
    let back = message_href(id);
    match outcome {
        Ok(_) => Ok(see_other(&format!("{back}&done={done}"))),
        Err(ActionError::NotFound(_)) => Err(not_found(&format!("no outbound message {id}"))),
        Err(e @ (ActionError::Refused(_) | ActionError::Changed(_))) => {
            Ok(refused_at(&back, &e.to_string()))
        }
        Err(ActionError::Store(e)) => Err(unavailable(&e)),
    }
}
