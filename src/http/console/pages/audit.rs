//! The audit trail: operators' actions, newest first (as `GET /api/v1/audit` gives them).

use std::fmt::Write as _;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use serde::Deserialize;

use super::super::Operator;
use super::super::html::{esc, link, table};
use super::{PAGE, Page, number, query, shown, store, when};
use crate::http::AppState;

#[derive(Deserialize)]
pub struct AuditQuery {
    before: Option<String>,
}

pub async fn audit(
    Operator(_): Operator,
    State(app): State<AppState>,
    q: Result<Query<AuditQuery>, QueryRejection>,
) -> Page {
    let q = query(q)?;
    let before = number("before", &q.before)?;
    let entries = store(app.store.audit_entries(before, PAGE).await)?;
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|(seq, e)| {
            vec![
                seq.to_string(),
                when(&e.at),
                esc(&e.principal),
                esc(&e.action),
                esc(&e.target),
                e.detail.as_deref().map_or("—".into(), esc),
                esc(&e.result),
            ]
        })
        .collect();
    let mut body = format!(
        "<p>Every change an operator asked for — through the console or the admin API — and \
         every console sign-in, with who asked (the token's principal), when, on what and what \
         came of it. Kept {} days (<code>audit_retention_days</code>).</p>",
        app.config.audit_retention.num_days()
    );
    body.push_str(&table(
        "Operator actions, newest first",
        &["#", "At", "Principal", "Action", "On", "Detail", "Result"],
        &rows,
    ));
    if let (Some((seq, _)), true) = (entries.last(), entries.len() as i64 == PAGE) {
        let _ = write!(
            body,
            "<p>{}</p>",
            link(&format!("/console/audit?before={seq}"), "Older")
        );
    }
    shown("Audit trail", &body)
}
