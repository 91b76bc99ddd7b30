//! The overview: the store's figures, the same on every gateway of a cluster, traffic by
//! channel and partner, and the faults this gateway answered.

use super::super::Operator;
use super::super::html::esc;
use super::super::html::facts;
use super::super::html::link;
use super::super::html::query_value;
use super::super::html::table;
use super::{MAX_SUBSCRIPTIONS, Page, shown, store};
use crate::http::AppState;
use axum::extract::State;

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
