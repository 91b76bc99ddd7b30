//! Who else may use a subscription: its owner (or an operator) grants and revokes.

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;

use super::managed;
use crate::http::AppState;
use crate::http::api::{ApiPath, Caller, Problem, ProblemBody};

#[utoipa::path(
    put,
    path = "/api/v1/subscriptions/{id}/grants/{principal}",
    tag = "consume",
    summary = "Let another principal join, fetch and settle (the owner, or an operator)",
    params(
        ("id" = i64, Path, description = "The subscription's id"),
        ("principal" = String, Path, description = "The principal to grant"),
    ),
    responses(
        (status = 204, description = "Granted"),
        (status = 400, description = "Not a subscription id", body = ProblemBody),
        (status = 404, description = "No such subscription", body = ProblemBody),
    )
)]
pub async fn grant(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath((id, principal)): ApiPath<(i64, String)>,
) -> Result<StatusCode, Problem> {
    managed(&app, &caller, id).await?;
    app.store.grant(id, &principal).await?;
    let (target, detail) = (
        format!("subscription {id}"),
        Some(format!("to {principal}")),
    );
    crate::http::audit::note(&app, &caller.principal, "grant", &target, detail).await;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    delete,
    path = "/api/v1/subscriptions/{id}/grants/{principal}",
    tag = "consume",
    summary = "Revoke a grant (its sessions end)",
    params(
        ("id" = i64, Path, description = "The subscription's id"),
        ("principal" = String, Path, description = "The principal to revoke"),
    ),
    responses(
        (status = 204, description = "Revoked"),
        (status = 400, description = "Not a subscription id", body = ProblemBody),
        (status = 404, description = "No such subscription, or no such grant", body = ProblemBody),
    )
)]
pub async fn revoke(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath((id, principal)): ApiPath<(i64, String)>,
) -> Result<StatusCode, Problem> {
    managed(&app, &caller, id).await?;
    if app.store.revoke(id, &principal, app.clock.now()).await? {
        let (target, detail) = (
            format!("subscription {id}"),
            Some(format!("from {principal}")),
        );
        crate::http::audit::note(&app, &caller.principal, "revoke", &target, detail).await;
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(Problem(
            StatusCode::NOT_FOUND,
            "not-found",
            format!("{principal} has no grant on subscription {id}"),
        ))
    }
}
