//! The console's pages and actions, one file per area (`overview`, `outbound`, `inbound`,
//! `subscriptions`, `endpoints`), and what they share here: parameter parsing, refusals and
//! limits. Each page reads its query or form, calls what the API's handlers call (the store's
//! reads, `outbound::operator::act`, `change_dead_letters`) and renders the answer through
//! `html`: every dynamic value is escaped there. Lists are pages of at most `PAGE` rows,
//! continued with `after`; a stored payload, envelope or response is shown as an `excerpt`
//! of at most `MAX_SHOWN` bytes, with a link to its download (`html::attachment`).

mod audit;
mod chart;
mod endpoints;
mod inbound;
mod outbound;
mod overview;
mod partners;
mod subscriptions;

pub use audit::audit;
pub use endpoints::endpoints;
pub use inbound::{abort_group, group, groups, inbox, inbox_message, inbox_payload};
pub use outbound::{envelope, fail, message, messages, resend, response, send_again};
pub use overview::overview;
pub use partners::partners;
pub use subscriptions::{change_dead_letters, change_push, subscription, subscriptions};

use std::fmt::Write as _;

use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Form, Query};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::html::{self, Stop, esc, link};
use crate::http::input;
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
/// The most of a payload, envelope or business response a page shows. A whole one may be as
/// large as the largest message taken (`max_message_bytes`, megabytes): rendered whole it
/// made pages of tens of megabytes. The rest is downloaded, as stored.
const MAX_SHOWN: usize = 64 * 1024;

/// How much of a stored value to read for its excerpt: what is shown, and the few bytes past
/// it that tell where the last character shown ends.
const HEAD_READ: usize = MAX_SHOWN + 4;
type Page = Result<Response, Stop>;

/// "No configured partner" — anonymous senders, URL destinations — as every page shows it
/// and filters on it: the one name the metrics, the access log and the CLI use too.
const NO_PARTNER: &str = crate::metrics::ANONYMOUS;

/// A partner as a `partner` query value (`NO_PARTNER` for "").
fn partner_query(partner: &str) -> &str {
    crate::outbound::partner_report::shown_partner(partner)
}

/// A partner as the store keeps it, shown ("" is a caller or destination without a
/// configured partner: `NO_PARTNER`).
fn partner_shown(partner: &str) -> &str {
    partner_query(partner)
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

/// An optional text parameter: empty is absent; longer than `MAX_TEXT`, or holding what the
/// store cannot (`input`), is refused. Every text a page or action takes comes through here.
fn text<'a>(name: &str, value: &'a Option<String>) -> Result<Option<&'a str>, Stop> {
    match value.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(v) if v.len() > MAX_TEXT => {
            Err(bad_request(&format!("{name}: at most {MAX_TEXT} bytes")))
        }
        Some(v) => {
            input::text(name, v).map_err(|e| bad_request(&e.to_string()))?;
            Ok(Some(v))
        }
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

/// Stored bytes as a page shows them: escaped text of at most `MAX_SHOWN` bytes, cut on a
/// character boundary, saying how much that is of the whole, and a link to `href`, where the
/// whole `what` is downloaded as stored. Bytes that are not UTF-8 show as replacement
/// characters (the download has them as they are).
fn excerpt(what: &str, bytes: &[u8], href: &str) -> String {
    excerpt_of_head(what, bytes, bytes.len(), href)
}

/// `excerpt` of something of `total` bytes of which only the head was read: `head` holds at
/// least `HEAD_READ` bytes when `total` is more.
fn excerpt_of_head(what: &str, head: &[u8], total: usize, href: &str) -> String {
    let end = shown_len(head, MAX_SHOWN);
    let mut out = String::new();
    if end < total {
        let _ = write!(
            out,
            "<p class=\"notice\" role=\"status\">Showing the first {end} of {total} bytes. {}</p>",
            link(href, &format!("Download the whole {what}"))
        );
    } else {
        let _ = write!(
            out,
            "<p>{} ({total} bytes)</p>",
            link(href, &format!("Download the {what}"))
        );
    }
    let more = if end < total { "\n…" } else { "" };
    let text = String::from_utf8_lossy(&head[..end]);
    let _ = write!(out, "<pre>{}{more}</pre>", esc(&text));
    out
}

/// How many of `bytes` to show, at most `max`: never ending inside a UTF-8 character (one is
/// at most 4 bytes, so at most 3 continuation bytes are stepped back over).
fn shown_len(bytes: &[u8], max: usize) -> usize {
    if bytes.len() <= max {
        return bytes.len();
    }
    let mut end = max;
    while end > max.saturating_sub(3) && bytes.get(end).is_some_and(|b| b & 0xC0 == 0x80) {
        end -= 1;
    }
    end
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_excerpt_ends_on_a_character_boundary() {
        // "é" is two bytes: a cut after 3 would split the second one.
        let text = "aéé";
        assert_eq!(shown_len(text.as_bytes(), 3), 3, "a + é");
        assert_eq!(shown_len(text.as_bytes(), 4), 3, "not inside the second é");
        assert_eq!(shown_len(text.as_bytes(), 5), 5, "all of it");
        let four = "a😀b"; // a 4-byte character
        for max in 2..=4 {
            assert_eq!(shown_len(four.as_bytes(), max), 1, "{max}");
        }
        assert_eq!(shown_len(four.as_bytes(), 5), 5);
        // Not UTF-8 at all: at most 3 bytes stepped back over, whatever they are.
        assert_eq!(shown_len(&[0x80; 10], 5), 2);
    }

    #[test]
    fn an_excerpt_says_how_much_it_shows_and_links_to_the_whole() {
        let big = "<&>".repeat(MAX_SHOWN); // 3 × MAX_SHOWN bytes
        let shown = excerpt("payload", big.as_bytes(), "/console/x?offset=1");
        assert!(shown.contains(&format!(
            "Showing the first {MAX_SHOWN} of {} bytes.",
            big.len()
        )));
        assert!(shown.contains("<a href=\"/console/x?offset=1\">Download the whole payload</a>"));
        assert!(!shown.contains("<&>"), "escaped");
        assert!(shown.len() < 6 * MAX_SHOWN, "bounded: {}", shown.len());
        let small = excerpt("envelope", b"<e/>", "/console/y");
        assert!(
            small.contains("Download the envelope</a> (4 bytes)"),
            "{small}"
        );
        assert!(small.contains("<pre>&lt;e/&gt;</pre>"), "{small}");
    }
}
