//! What partners sent us: received groups (delivered ranges, buffered numbers, faults) and the
//! inbox searched by channel, partner, group id and time, with a message's payload.

use std::fmt::Write as _;

use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Form, Query, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::super::html::{self, Stop, esc, facts, link, query_value, table};
use super::super::{Acting, Operator};
use super::{
    HEAD_READ, MAX_ITEMS, NO_PARTNER, PAGE, Page, bad_request, excerpt_of_head, form, not_found,
    number, partner_filter, partner_shown, query, required, see_other, shown, store, text, when,
};
use crate::http::AppState;
use crate::rmp::group::{GroupState, GroupStatus};
use crate::store::overview::Listed;
use crate::store::{InboxEntry, InboxExcerpt, InboxFilter};
use crate::wsr::datetime::parse_date_time;

#[derive(Deserialize)]
pub struct GroupsQuery {
    after: Option<String>,
    after_partner: Option<String>,
    /// Only groups in this status (open, complete, expired, idle, aborted).
    status: Option<String>,
    /// `yes`: only groups with messages buffered for a gap.
    buffered: Option<String>,
    /// Only this partner's groups (`NO_PARTNER`: anonymous callers').
    partner: Option<String>,
}

/// Store pages of groups a filtered list looks through at most per page it shows: the
/// filters are applied to the groups read, so one page costs a bounded read however few
/// match.
const GROUP_PAGES_LOOKED_AT: usize = 10;

/// The filters of the groups list.
struct GroupFilter<'a> {
    status: Option<GroupStatus>,
    buffered: bool,
    partner: Option<&'a str>,
}

impl GroupFilter<'_> {
    fn keeps(&self, partner: &str, g: &GroupState) -> bool {
        self.status.is_none_or(|s| g.status == s)
            && (!self.buffered || !g.buffered.is_empty())
            && self.partner.is_none_or(|p| p == partner)
    }

    fn is_empty(&self) -> bool {
        self.status.is_none() && !self.buffered && self.partner.is_none()
    }
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

/// The groups list's filter form, showing the filter in force.
fn groups_form(filter: &GroupFilter<'_>, partner: Option<&str>) -> String {
    let mut form = String::from(
        "<form method=\"get\" action=\"/console/groups\"><label for=\"status\">Status</label>\
         <select id=\"status\" name=\"status\"><option value=\"\">any</option>",
    );
    for s in ["open", "complete", "expired", "idle", "aborted"] {
        let selected = if filter.status.map(GroupStatus::as_str) == Some(s) {
            " selected"
        } else {
            ""
        };
        let _ = write!(form, "<option value=\"{s}\"{selected}>{s}</option>");
    }
    let checked = if filter.buffered { " checked" } else { "" };
    let _ = write!(
        form,
        "</select><label><input type=\"checkbox\" name=\"buffered\" value=\"yes\"{checked}> \
         with messages buffered for a gap</label>\
         <label for=\"group-partner\">Partner</label>\
         <input id=\"group-partner\" name=\"partner\" value=\"{}\" placeholder=\"{NO_PARTNER}\">\
         <button type=\"submit\">Filter</button></form>",
        esc(partner.unwrap_or(""))
    );
    form
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
    <label for=\"partner\">Partner</label><input id=\"partner\" name=\"partner\" placeholder=\"{NO_PARTNER}\">\
    <button type=\"submit\">Find</button></form>";

pub async fn groups(
    Operator(_): Operator,
    State(app): State<AppState>,
    q: Result<Query<GroupsQuery>, QueryRejection>,
) -> Page {
    let q = query(q)?;
    let after = text("after", &q.after)?;
    let after_partner = text("after_partner", &q.after_partner)?.unwrap_or("");
    let status =
        match text("status", &q.status)? {
            None => None,
            Some(s) => Some(GroupStatus::parse(s).ok_or_else(|| {
                bad_request("status: one of open, complete, expired, idle, aborted")
            })?),
        };
    let buffered = match text("buffered", &q.buffered)? {
        None | Some("no") => false,
        Some("yes") => true,
        Some(_) => return Err(bad_request("buffered: yes or no")),
    };
    let partner = partner_filter(text("partner", &q.partner)?);
    let filter = GroupFilter {
        status,
        buffered,
        partner,
    };
    // Pages of the store until a page of matches, or the bounded look is used up.
    let mut list: Vec<(String, GroupState)> = Vec::new();
    let mut cursor: Option<(String, String)> =
        after.map(|g| (after_partner.to_owned(), g.to_owned()));
    let mut exhausted = false;
    for _ in 0..GROUP_PAGES_LOOKED_AT {
        let from = cursor.as_ref().map(|(p, g)| (p.as_str(), g.as_str()));
        let read = store(app.store.groups(from, PAGE).await)?;
        exhausted = (read.len() as i64) < PAGE;
        if let Some((p, g)) = read.last() {
            cursor = Some((p.clone(), g.group_id.as_str().to_owned()));
        }
        list.extend(read.into_iter().filter(|(p, g)| filter.keeps(p, g)));
        if exhausted || list.len() as i64 >= PAGE || filter.is_empty() {
            break;
        }
    }
    let mut body = String::from(GROUP_SEARCH);
    body.push_str(&groups_form(&filter, q.partner.as_deref()));
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|(partner, g)| {
            vec![
                link(
                    &group_href(partner, g.group_id.as_str()),
                    g.group_id.as_str(),
                ),
                esc(partner_shown(partner)),
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
    if let (Some((partner, group)), false) = (&cursor, exhausted) {
        let href = format!(
            "/console/groups?after={}&after_partner={}&status={}&buffered={}&partner={}",
            query_value(group),
            query_value(partner),
            query_value(q.status.as_deref().unwrap_or("")),
            if buffered { "yes" } else { "" },
            query_value(q.partner.as_deref().unwrap_or("")),
        );
        let _ = write!(body, "<p>{}</p>", link(&href, "Next page"));
    }
    shown("Inbound groups", &body)
}

#[derive(Deserialize)]
pub struct GroupQuery {
    id: Option<String>,
    partner: Option<String>,
    done: Option<String>,
    refused: Option<String>,
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
    let mut body = String::new();
    if q.done.as_deref() == Some("aborted") {
        body.push_str(&html::notice("The group was aborted."));
    }
    if let Some(why) = text("refused", &q.refused)? {
        body.push_str(&html::error(&format!("Not done: {why}")));
    }
    body.push_str(&facts(
        "Group",
        &group_facts(partner, &g, app.store.policy()),
    ));
    if g.status == GroupStatus::Open && g.params.sequenced {
        body.push_str("<h2>Operator actions</h2>");
        body.push_str(&html::confirmed_form(
            "/console/group/abort",
            "Abort the group",
            &[("id", id), ("partner", partner)],
            "its buffered messages are discarded, never delivered; every later message of \
             the group is refused with GroupAborted",
        ));
    }
    shown(&format!("Group {id}"), &body)
}

#[derive(Deserialize)]
pub struct AbortForm {
    id: Option<String>,
    partner: Option<String>,
    confirm: Option<String>,
}

/// `/console/group/abort`: an operator's abort of a stuck group (D7), confirmed.
pub async fn abort_group(
    Acting(caller): Acting,
    State(app): State<AppState>,
    f: Result<Form<AbortForm>, FormRejection>,
) -> Page {
    let f = form(f)?;
    let id = required("id", &f.id)?;
    let partner = text("partner", &f.partner)?.unwrap_or("");
    let back = format!(
        "/console/group?partner={}&id={}",
        query_value(partner),
        query_value(id)
    );
    let refused = |why: &str| Ok(see_other(&format!("{back}&refused={}", query_value(why))));
    if f.confirm.as_deref() != Some("yes") {
        return refused("tick the confirmation to abort the group");
    }
    if !store(app.store.abort_group(partner, id, app.clock.now()).await)? {
        return refused("no such open group: it ended already, or is a singleton");
    }
    let target = format!("{}/{id}", partner_shown(partner));
    crate::http::audit::note(&app, &caller.principal, "abort_group", &target, None).await;
    Ok(see_other(&format!("{back}&done=aborted")))
}

fn group_facts(
    partner: &str,
    g: &GroupState,
    policy: &crate::rmp::group::Policy,
) -> Vec<(&'static str, String)> {
    let open = g.status == crate::rmp::group::GroupStatus::Open;
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
        ("Partner", esc(partner_shown(partner))),
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
        (
            "Aborts at (unless the gap fills)",
            g.aborts_at(policy).as_ref().map_or("—".into(), when),
        ),
        (
            "Ends at (its time limit)",
            g.time_limit(policy)
                .filter(|_| open)
                .as_ref()
                .map_or("—".into(), when),
        ),
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
    channel: Option<String>,
    partner: Option<String>,
    group: Option<String>,
    since: Option<String>,
}

/// A `since` value: an xs:dateTime as the wire reads it (zone-less is UTC, D12), or a
/// browser's `datetime-local`, which leaves out the seconds (`2026-12-04T17:30`).
fn instant(name: &str, value: Option<&str>) -> Result<Option<DateTime<Utc>>, Stop> {
    let Some(v) = value else { return Ok(None) };
    parse_date_time(v)
        .or_else(|_| parse_date_time(&format!("{v}:00")))
        .map(|(t, _)| Some(t))
        .map_err(|_| {
            bad_request(&format!(
                "{name}: a time such as 2026-12-04T17:30 (UTC) or 2026-12-04T17:30:00+01:00"
            ))
        })
}

/// The inbox, searched by channel, partner, group id and time: a page of at most `PAGE`
/// matches, each page having looked through at most `SEARCH_SPAN` offsets.
pub async fn inbox(
    Operator(_): Operator,
    State(app): State<AppState>,
    q: Result<Query<InboxQuery>, QueryRejection>,
) -> Page {
    let q = query(q)?;
    let after = number("after", &q.after)?.unwrap_or(0);
    let channel = text("channel", &q.channel)?;
    let partner = text("partner", &q.partner)?;
    let group = text("group", &q.group)?;
    let since_text = text("since", &q.since)?;
    let filter = InboxFilter {
        channel: channel.map(str::to_owned),
        partner: partner_filter(partner).map(str::to_owned),
        group_id: group.map(str::to_owned),
        since: instant("since", since_text)?,
    };
    let found = store(app.store.search_inbox(&filter, after, PAGE).await)?;
    let mut body = inbox_forms(channel, partner, group, since_text);
    body.push_str(&inbox_table(&found.entries));
    if let Some(next) = found.next_after {
        let href = format!(
            "/console/inbox?channel={}&partner={}&group={}&since={}&after={next}",
            query_value(channel.unwrap_or("")),
            query_value(partner.unwrap_or("")),
            query_value(group.unwrap_or("")),
            query_value(since_text.unwrap_or("")),
        );
        let _ = write!(
            body,
            "<p>{} (looked through offsets up to {next})</p>",
            link(&href, "Next page")
        );
    }
    shown("Inbox", &body)
}

/// The open-by-offset form and the search form, showing the search in force.
fn inbox_forms(
    channel: Option<&str>,
    partner: Option<&str>,
    group: Option<&str>,
    since_text: Option<&str>,
) -> String {
    let mut body = String::from(
        "<form method=\"get\" action=\"/console/inbox/message\">\
         <label for=\"offset\">Offset</label><input id=\"offset\" name=\"offset\" inputmode=\"numeric\" required>\
         <button type=\"submit\">Open</button></form>",
    );
    let _ = write!(
        body,
        "<form method=\"get\" action=\"/console/inbox\">\
         <label for=\"channel\">Channel</label><input id=\"channel\" name=\"channel\" value=\"{}\">\
         <label for=\"partner\">Partner</label><input id=\"partner\" name=\"partner\" value=\"{}\" placeholder=\"{NO_PARTNER}\">\
         <label for=\"group\">Group id</label><input id=\"group\" name=\"group\" value=\"{}\">\
         <label for=\"since\">Received since (UTC)</label><input id=\"since\" name=\"since\" value=\"{}\" placeholder=\"2026-12-04T17:30\">\
         <button type=\"submit\">Search</button></form>",
        esc(channel.unwrap_or("")),
        esc(partner.unwrap_or("")),
        esc(group.unwrap_or("")),
        esc(since_text.unwrap_or("")),
    );
    body
}

/// One page of delivered messages, a row each.
fn inbox_table(entries: &[Listed]) -> String {
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|Listed { entry: e, size }| {
            vec![
                link(
                    &format!("/console/inbox/message?offset={}", e.offset),
                    &e.offset.to_string(),
                ),
                esc(&e.channel),
                esc(&e.topic),
                esc(partner_shown(&e.partner)),
                link(&group_href(&e.partner, &e.group_id), &e.group_id),
                e.number.map_or("—".into(), |n| n.to_string()),
                when(&e.received_at),
                size.to_string(),
            ]
        })
        .collect();
    table(
        "Delivered messages",
        &[
            "Offset", "Channel", "Topic", "Partner", "Group id", "Number", "Received", "Bytes",
        ],
        &rows,
    )
}

/// The query's `offset`.
fn offset_of(q: &InboxQuery) -> Result<i64, Stop> {
    number("offset", &q.offset)?
        .filter(|o| *o >= 1)
        .ok_or_else(|| bad_request("offset: a number from 1"))
}

fn no_message(offset: i64) -> Stop {
    not_found(&format!(
        "no message at offset {offset} (never delivered, or purged)"
    ))
}

/// The delivered message at the query's `offset`, read whole (for its download).
async fn delivered(app: &AppState, q: &InboxQuery) -> Result<InboxEntry, Stop> {
    let offset = offset_of(q)?;
    let found = store(app.store.inbox(offset - 1, 1).await)?;
    found
        .into_iter()
        .find(|e| e.offset == offset)
        .ok_or_else(|| no_message(offset))
}

/// Where the whole payload of the message at `offset` is downloaded.
fn payload_href(offset: i64) -> String {
    format!("/console/inbox/message/payload?offset={offset}")
}

/// The media type of a payload download: a payload is the XML the SOAP Body held, as text
/// (the store keeps no Content-Type of its own for it).
const PAYLOAD_TYPE: &str = "application/xml; charset=utf-8";

pub async fn inbox_message(
    Operator(_): Operator,
    State(app): State<AppState>,
    q: Result<Query<InboxQuery>, QueryRejection>,
) -> Page {
    let offset = offset_of(&query(q)?)?;
    // Only the head of the payload: a page shows no more, and a large message read whole
    // for every view would cost its size (and more) each time.
    let InboxExcerpt {
        entry: e,
        head,
        size,
    } = store(app.store.inbox_excerpt(offset, HEAD_READ).await)?
        .ok_or_else(|| no_message(offset))?;
    let mut body = facts(
        "Delivered message",
        &[
            ("Offset", e.offset.to_string()),
            ("Topic", esc(&e.topic)),
            ("Channel", esc(&e.channel)),
            ("Partner", esc(partner_shown(&e.partner))),
            (
                "Group id",
                link(&group_href(&e.partner, &e.group_id), &e.group_id),
            ),
            ("Number", e.number.map_or("—".into(), |n| n.to_string())),
            ("Received", when(&e.received_at)),
            ("Expiry", when(&e.expiry)),
        ],
    );
    body.push_str("<h2>Payload</h2>");
    body.push_str(&excerpt_of_head(
        "payload",
        &head,
        usize::try_from(size).unwrap_or(usize::MAX),
        &payload_href(offset),
    ));
    shown(&format!("Inbox message {offset}"), &body)
}

/// `/console/inbox/message/payload?offset=…`: the whole payload as stored, a download (the
/// message page shows only its beginning).
pub async fn inbox_payload(
    Operator(_): Operator,
    State(app): State<AppState>,
    q: Result<Query<InboxQuery>, QueryRejection>,
) -> Page {
    let e = delivered(&app, &query(q)?).await?;
    let name = format!("inbox-{}.xml", e.offset);
    Ok(html::attachment(PAYLOAD_TYPE, &name, e.payload.into()))
}
