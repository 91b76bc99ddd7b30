//! The console's pages and actions, one file per area (`overview`, `outbound`, `inbound`,
//! `subscriptions`, `endpoints`), and what they share here: parameter parsing, refusals and
//! limits. Each page reads its query or form, calls what the API's handlers call (the store's
//! reads, `outbound::operator::act`, `change_dead_letters`) and renders the answer through
//! `html`: every dynamic value is escaped there. Lists are pages of at most `PAGE` rows,
//! continued with `after`.

mod endpoints;
mod inbound;
mod outbound;
mod overview;
mod subscriptions;

pub use endpoints::endpoints;
pub use inbound::{group, groups, inbox, inbox_message};
pub use outbound::{fail, message, messages, resend};
pub use overview::overview;
pub use subscriptions::{change_dead_letters, subscription, subscriptions};

use std::fmt::Write as _;

use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Form, Query};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::html::{self, Stop, esc, link};
use crate::store::StoreError;
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

/// The `partner` query value of "no configured partner": anonymous senders, URL destinations.
const NO_PARTNER: &str = "(none)";

/// A partner as a `partner` query value (`NO_PARTNER` for "").
fn partner_query(partner: &str) -> &str {
    if partner.is_empty() {
        NO_PARTNER
    } else {
        partner
    }
}

/// A sender as the store keeps it, shown ("" is a caller without a configured partner).
fn sender_shown(partner: &str) -> &str {
    if partner.is_empty() {
        "(anonymous)"
    } else {
        partner
    }
}

/// A `partner` query value as the store keeps partners ("" for `NO_PARTNER`).
fn partner_filter(value: Option<&str>) -> Option<&str> {
    value.map(|p| if p == NO_PARTNER { "" } else { p })
}

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
