//! Subscriptions: backlog, members and dead letters, with replay and purge.

use std::fmt::Write as _;

use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Form, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;

use super::super::html::{self, esc, facts, link, query_value, table};
use super::super::{Acting, Operator};
use super::{
    MAX_SUBSCRIPTIONS, PAGE, Page, bad_request, form, not_found, number, query, refused, see_other,
    shown, store, text, unavailable, when,
};
use crate::delivery::subscription::{Mode, PushFormat};
use crate::http::AppState;
use crate::store::delivery::{Backlog, DeadLetter, DeadLetterChange, DeliveryError, Subscription};
use crate::store::overview::Member;

/// Members listed at most.
const MAX_MEMBERS: i64 = 100;

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
                Mode::Push {
                    format: PushFormat::Json,
                    ..
                } => "push",
                Mode::Push {
                    format: PushFormat::Soap,
                    ..
                } => "push (SOAP)",
            }),
            b.waiting.to_string(),
            b.unmatched.to_string(),
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
            "Not matched yet (may not match its filter)",
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
    /// Why the action just asked for was not done.
    refused: Option<String>,
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
    let count = number("count", &q.count)?.unwrap_or(0);
    let members = store(app.store.members(id, app.clock.now(), MAX_MEMBERS).await)?;
    let mut body = done_notice(q.done.as_deref(), count);
    if let Some(why) = text("refused", &q.refused)? {
        body.push_str(&html::error(&format!("Not done: {why}")));
    }
    body.push_str(&subscription_facts(&s, &b));
    body.push_str(&push_section(&s, app.push_health.get(s.id)));
    body.push_str(&members_table(&members));
    body.push_str(&dead_letters_section(id, &b, &letters));
    shown(&format!("Subscription {}", s.name), &body)
}

/// A push subscription's health on this gateway and its pause or resume button.
fn push_section(s: &Subscription, h: Option<crate::consume::push::PushHealth>) -> String {
    if !matches!(s.rules.mode, Mode::Push { .. }) {
        return String::new();
    }
    let paused = s.rules.push_paused();
    let mut body = String::from("<h2>Push</h2>");
    body.push_str(&facts(
        "Push health (this gateway)",
        &[
            ("State", if paused { "paused" } else { "pushing" }.into()),
            (
                "Last answer",
                h.as_ref().map_or("—".into(), |h| {
                    let status = h
                        .last_status
                        .map_or("no answer".into(), |s| format!("HTTP {s}"));
                    format!("{status} ({})", when(&h.last_at))
                }),
            ),
            (
                "Last accepted",
                h.as_ref()
                    .and_then(|h| h.last_success_at.as_ref())
                    .map_or("—".into(), when),
            ),
            (
                "Last error",
                h.as_ref()
                    .and_then(|h| Some((h.last_error.as_ref()?, h.last_error_at.as_ref()?)))
                    .map_or("—".into(), |(e, at)| format!("{} ({})", esc(e), when(at))),
            ),
            (
                "Failing in a row",
                h.as_ref().map_or(0, |h| h.failures_in_row).to_string(),
            ),
        ],
    ));
    let sid = s.id.to_string();
    let (action, label) = if paused {
        ("resume", "Resume pushing")
    } else {
        ("pause", "Pause pushing")
    };
    body.push_str(&html::button_form(
        "/console/subscription/push",
        label,
        &[("id", &sid), ("change", action)],
    ));
    body
}

#[derive(Deserialize)]
pub struct PushForm {
    id: Option<String>,
    change: Option<String>,
}

/// `/console/subscription/push`: pauses or resumes a push subscription.
pub async fn change_push(
    Acting(caller): Acting,
    State(app): State<AppState>,
    f: Result<Form<PushForm>, FormRejection>,
) -> Page {
    let f = form(f)?;
    let id = number("id", &f.id)?.ok_or_else(|| bad_request("id: missing"))?;
    let paused = match f.change.as_deref() {
        Some("pause") => true,
        Some("resume") => false,
        _ => return Err(bad_request("change: pause or resume")),
    };
    let back = format!("/console/subscription?id={id}");
    match app.store.set_push_paused(id, paused).await {
        Ok(()) => {
            let action = if paused { "pause_push" } else { "resume_push" };
            let target = format!("subscription {id}");
            crate::http::audit::note(&app, &caller.principal, action, &target, None).await;
            Ok(see_other(&back))
        }
        Err(DeliveryError::Store(e)) => Err(unavailable(&e)),
        Err(DeliveryError::NotFound(why)) => Err(not_found(&why)),
        Err(other) => Ok(see_other(&format!(
            "{back}&refused={}",
            query_value(&other.to_string())
        ))),
    }
}

/// The notice of a replay or purge just done (`done`), with how many it changed.
fn done_notice(done: Option<&str>, count: i64) -> String {
    match done {
        Some("replay") => html::notice(&format!("{count} dead letter(s) replayed.")),
        Some("purge") => html::notice(&format!("{count} dead letter(s) purged.")),
        _ => String::new(),
    }
}

/// The subscription's identity and rules, and its backlog.
fn subscription_facts(s: &Subscription, b: &Backlog) -> String {
    let mut body = facts(
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
    );
    body.push_str(&facts(
        "Backlog",
        &[
            ("Waiting", b.waiting.to_string()),
            ("In flight", b.in_flight.to_string()),
            ("Dead letters", b.dead_letters.to_string()),
            ("Not matched yet", b.unmatched.to_string()),
        ],
    ));
    body
}

/// The live members and what each holds.
fn members_table(members: &[Member]) -> String {
    let rows: Vec<Vec<String>> = members
        .iter()
        .map(|m| {
            vec![
                esc(&m.principal),
                esc(&m.session),
                when(&m.expires_at),
                m.in_flight.to_string(),
                m.groups.to_string(),
            ]
        })
        .collect();
    table(
        &format!("Members (live sessions; at most {MAX_MEMBERS} shown)"),
        &[
            "Principal",
            "Session",
            "Expires unless renewed",
            "In flight",
            "Groups bound",
        ],
        &rows,
    )
}

/// One page of dead letters of subscription `id`, with replay and purge buttons (all, and
/// each), and the link to the next page when this one is full.
fn dead_letters_section(id: i64, b: &Backlog, letters: &[DeadLetter]) -> String {
    let mut body = String::from("<h2>Dead letters</h2>");
    let sid = id.to_string();
    if b.dead_letters > 0 {
        body.push_str(&html::button_form(
            "/console/subscription/dead-letters",
            "Replay all dead letters",
            &[("id", &sid), ("change", "replay")],
        ));
        body.push_str(&html::confirmed_form(
            "/console/subscription/dead-letters",
            "Purge all dead letters",
            &[("id", &sid), ("change", "purge")],
            "purged for good: not delivered again",
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
                    &format!("Replay {offset}"),
                    &[("id", &sid), ("change", "replay"), ("offset", &offset)],
                ) + &html::confirmed_form(
                    "/console/subscription/dead-letters",
                    &format!("Purge {offset}"),
                    &[("id", &sid), ("change", "purge"), ("offset", &offset)],
                    "for good",
                ),
            ]
        })
        .collect();
    body.push_str(&table(
        "Dead letters",
        &["Offset", "Topic", "Attempts", "Reason", "Actions"],
        &rows,
    ));
    if let (Some(last), true) = (letters.last(), letters.len() as i64 == PAGE) {
        let href = format!("/console/subscription?id={id}&after={}", last.offset);
        let _ = write!(body, "<p>{}</p>", link(&href, "Next page"));
    }
    body
}

#[derive(Deserialize)]
pub struct DeadLetterForm {
    id: Option<String>,
    change: Option<String>,
    offset: Option<String>,
    /// `yes`: the purge's confirmation was ticked.
    confirm: Option<String>,
}

pub async fn change_dead_letters(
    Acting(caller): Acting,
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
    if change == DeadLetterChange::Purge && f.confirm.as_deref() != Some("yes") {
        let why = "tick the confirmation to purge: a purged dead letter is gone for good";
        return Ok(see_other(&format!("{back}&refused={}", query_value(why))));
    }
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
    let action = change.action();
    let detail = Some(match offset {
        Some([o]) => format!("offset {o}: {changed} changed"),
        None => format!("all: {changed} changed"),
    });
    let target = format!("subscription {id}");
    crate::http::audit::note(&app, &caller.principal, action, &target, detail).await;
    Ok(see_other(&format!("{back}&done={done}&count={changed}")))
}
