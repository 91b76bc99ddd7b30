//! The audit trail of operators' actions (issue 34): `note`, which every door that changes
//! something on an operator's word calls once the change held — the API's handlers and the
//! console's actions alike — and `GET /api/v1/audit`, the trail newest first.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::api::{ApiQuery, Problem, ProblemBody};
use crate::store::console::AuditEntry;
use crate::wsr::datetime::date_time_string;

/// Records that `principal` did `action` on `target`: in the store's audit trail, and as an
/// INFO line (`wsr_gateway::audit`). The action has happened: a trail the store cannot write
/// is logged as a store failure, never turned into the action's failure.
pub async fn note(
    app: &AppState,
    principal: &str,
    action: &str,
    target: &str,
    detail: Option<String>,
) {
    record(app, principal, action, target, detail, "done".to_owned()).await;
}

/// Records an action the gateway refused (a console sign-in with a wrong token), with why.
/// Anyone can make these, so at most `REFUSALS_PER_MINUTE` a minute are written one by one;
/// the next one written says how many were left out.
pub async fn note_refused(app: &AppState, principal: &str, action: &str, target: &str, why: &str) {
    let Some(left_out) = app.audit_refusals.admit(app.clock.now()) else {
        return;
    };
    let detail = (left_out > 0)
        .then(|| format!("{left_out} more refusals before this one were not recorded one by one"));
    record(
        app,
        principal,
        action,
        target,
        detail,
        format!("refused: {why}"),
    )
    .await;
}

async fn record(
    app: &AppState,
    principal: &str,
    action: &str,
    target: &str,
    detail: Option<String>,
    result: String,
) {
    tracing::info!(target: "wsr_gateway::audit", %principal, %action, %target, detail = detail.as_deref(), %result, "operator action");
    let entry = AuditEntry {
        at: app.clock.now(),
        principal: principal.to_owned(),
        action: action.to_owned(),
        target: target.to_owned(),
        detail,
        result,
    };
    if let Err(e) = app.store.record_audit(&entry).await {
        crate::store::health::log_store_failure("audit trail", &e);
    }
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// The `seq` to list before (the previous page's `next_before`).
    before: Option<i64>,
    /// 1 to 1000 (default 100; values beyond are clamped).
    limit: Option<i64>,
}

/// Refusals written to the audit trail one by one, at most, per minute.
pub const REFUSALS_PER_MINUTE: u32 = 20;

/// Bounds the refusals a stranger can write to the trail (`note_refused`).
#[derive(Default)]
pub struct RefusalLimiter(std::sync::Mutex<RefusalWindow>);

#[derive(Default)]
struct RefusalWindow {
    minute: i64,
    written: u32,
    left_out: u64,
}

impl RefusalLimiter {
    /// `Some(left out since the last one written)` when this refusal may be written now.
    pub fn admit(&self, now: chrono::DateTime<chrono::Utc>) -> Option<u64> {
        let mut w = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let minute = now.timestamp().div_euclid(60);
        if minute != w.minute {
            w.minute = minute;
            w.written = 0;
        }
        if w.written >= REFUSALS_PER_MINUTE {
            w.left_out += 1;
            return None;
        }
        w.written += 1;
        Some(std::mem::take(&mut w.left_out))
    }
}

/// One operator action.
#[derive(Serialize, ToSchema)]
pub struct AuditView {
    seq: i64,
    at: String,
    /// The principal of the token or console sign-in that did it.
    principal: String,
    /// `resend`, `fail`, `send_again`, `abort_group`, `pause_push`, `resume_push`,
    /// `replay_dead_letters`, `purge_dead_letters`, `register_callback_endpoint`,
    /// `unregister_callback_endpoint`, `register_push_endpoint`, `unregister_push_endpoint`,
    /// `grant`, `revoke`, `delete_subscription`, `console_sign_in`, `console_sign_out`.
    action: String,
    /// What it was done to: a message id, `partner/group id`, `subscription N`.
    target: String,
    detail: Option<String>,
    /// `done`, or `refused: <why>` (a console sign-in with a token that is not an admin's).
    result: String,
}

/// A page of the audit trail.
#[derive(Serialize, ToSchema)]
pub struct AuditList {
    entries: Vec<AuditView>,
    /// Give as `before` for the next (older) page.
    next_before: Option<i64>,
}

#[utoipa::path(
    get,
    path = "/api/v1/audit",
    tag = "admin",
    summary = "The audit trail: operators' actions, newest first",
    params(AuditQuery),
    responses(
        (status = 200, description = "A page of the trail", body = AuditList),
        (status = 400, description = "A query parameter that does not parse", body = ProblemBody),
    )
)]
pub async fn list(
    State(app): State<AppState>,
    ApiQuery(q): ApiQuery<AuditQuery>,
) -> Result<Json<AuditList>, Problem> {
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let entries = app.store.audit_entries(q.before, limit).await?;
    let next_before = entries.last().map(|(seq, _)| *seq);
    Ok(Json(AuditList {
        entries: entries
            .into_iter()
            .map(|(seq, e)| AuditView {
                seq,
                at: date_time_string(&e.at),
                principal: e.principal,
                action: e.action,
                target: e.target,
                detail: e.detail,
                result: e.result,
            })
            .collect(),
        next_before,
    }))
}
