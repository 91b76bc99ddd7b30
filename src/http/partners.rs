//! `/api/v1/partners` for operators: each configured partner (and `anonymous`) with its
//! configuration without secrets and how it is doing (`outbound::partner_report`).

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::AppState;
use super::api::{Problem, ProblemBody};
use crate::outbound::partner_report::{partner_reports, report_json};

/// Every partner.
#[derive(Serialize, ToSchema)]
pub struct PartnerList {
    #[schema(value_type = Vec<super::openapi::PartnerView>)]
    partners: Vec<Value>,
}

#[utoipa::path(
    get,
    path = "/api/v1/partners",
    tag = "admin",
    summary = "Partners: configuration without secrets, health, messages by state, refused sign-ins",
    description = "Every configured partner by name, then `anonymous` (URL destinations, \
                   anonymous callers, usernames nobody has) when anything is known of it. \
                   Health, messages and callback acks owed come from the store (the same on \
                   every gateway of a cluster); refused sign-ins are this gateway's since it \
                   started (`wsr_auth_refusals_total` has every gateway's).",
    responses(
        (status = 200, description = "The partners", body = PartnerList),
        (status = 503, description = "The store could not answer", body = ProblemBody),
    )
)]
pub async fn list_partners(State(app): State<AppState>) -> Result<Json<PartnerList>, Problem> {
    let reports = partner_reports(&app.store, &app.config.partners, app.clock.now()).await?;
    Ok(Json(PartnerList {
        partners: reports.iter().map(report_json).collect(),
    }))
}
