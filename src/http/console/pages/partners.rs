//! Partners: each configured partner (and `anonymous`) with its address, how it proves itself,
//! its health — last answer, last error, failures in a row — our messages to it by state (each
//! a link to the list), the callback acks we owe it and the sign-ins refused for it
//! (`outbound::partner_report`, as `GET /api/v1/partners` gives it).

use axum::extract::State;

use super::super::Operator;
use super::super::html::{esc, link, query_value, table};
use super::{Page, shown, store, when};
use crate::http::AppState;
use crate::metrics::RefusedSignIns;
use crate::outbound::partner_report::{PartnerReport, partner_reports};

pub async fn partners(Operator(_): Operator, State(app): State<AppState>) -> Page {
    let reports = store(partner_reports(&app.store, &app.config.partners, app.clock.now()).await)?;
    let rows: Vec<Vec<String>> = reports.iter().map(row).collect();
    let mut body = String::from(
        "<p>Health, messages and acks owed are the store's (every gateway of a cluster shows \
         the same); refused sign-ins are this gateway's since it started \
         (<code>wsr_auth_refusals_total</code> in <code>/metrics</code> has every gateway's).</p>",
    );
    body.push_str(&table(
        "Partners",
        &[
            "Partner",
            "Address",
            "Proves itself by",
            "Last answer",
            "Failing in a row",
            "Last error",
            "Queued",
            "Sent",
            "In doubt",
            "Failed",
            "Acked",
            "Callback acks owed",
            "Refused sign-ins",
        ],
        &rows,
    ));
    shown("Partners", &body)
}

fn row(r: &PartnerReport) -> Vec<String> {
    let configured = r.configured.as_ref();
    let count = |state: &str| r.messages.get(state).copied().unwrap_or(0);
    let list = |state: &str| {
        // `anonymous` is also the list's filter value of "no partner".
        let href = format!(
            "/console/messages?partner={}&state={state}",
            query_value(&r.name)
        );
        link(&href, &count(state).to_string())
    };
    let health = r.health.as_ref();
    let mut refused = refused_cell(r.refused.as_ref());
    if let Some(unknown) = &r.refused_unknown {
        refused.push_str(&format!(
            "<br>unknown usernames: {}",
            refused_cell(Some(unknown))
        ));
    }
    vec![
        esc(&r.name),
        configured
            .and_then(|c| c.address.as_deref())
            .map_or("—".into(), esc),
        configured.map_or("—".into(), |c| {
            if c.credentials.is_empty() {
                "nothing (anonymous channels only)".into()
            } else {
                esc(&c.credentials.join(", "))
            }
        }),
        health
            .and_then(|h| h.last_success_at.as_ref())
            .map_or("never".into(), when),
        health.map_or(0, |h| h.failures_in_row).to_string(),
        health
            .and_then(|h| h.last_error.as_ref())
            .map_or("—".into(), |e| {
                format!("{} ({})", esc(&e.cause), when(&e.at))
            }),
        list("queued"),
        list("sent"),
        format!(
            "{}{}",
            if r.in_doubt_floor { "≥ " } else { "" },
            list("in_doubt")
        ),
        list("failed"),
        list("acked"),
        r.callback_acks_owed.to_string(),
        refused,
    ]
}

fn refused_cell(r: Option<&RefusedSignIns>) -> String {
    match r {
        None => "0".into(),
        Some(r) => format!(
            "{}, latest {}{}: {}",
            r.count,
            when(&r.last),
            r.last_username
                .as_deref()
                .map_or(String::new(), |u| format!(" as {}", esc(&format!("{u:?}")))),
            esc(r.last_reason)
        ),
    }
}
