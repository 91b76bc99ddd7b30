//! Subscriptions themselves: create (or find the same again), list, read with the backlog,
//! delete.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::{beyond_topics, consumer, managed, visible};
use crate::delivery::access;
use crate::delivery::subscription::{CreateRequest, Mode, SpecError};
use crate::http::AppState;
use crate::http::api::{ApiPath, Caller, Problem, ProblemBody, json_body as body};
use crate::http::openapi::{Subscription as SubscriptionSchema, SubscriptionRequest};
use crate::store::delivery::Subscription;
use crate::wsr::datetime::date_time_string;

fn subscription_json(sub: &Subscription) -> Value {
    let mut rules = serde_json::to_value(&sub.rules).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut rules {
        map.insert("id".into(), json!(sub.id));
        map.insert("name".into(), json!(sub.name));
        map.insert("filter".into(), json!(sub.filter));
        map.insert("owner".into(), json!(sub.owner));
        map.insert("grants".into(), json!(sub.grants));
        map.insert(
            "created_at".into(),
            json!(date_time_string(&sub.created_at)),
        );
    }
    rules
}

#[utoipa::path(
    post,
    path = "/api/v1/subscriptions",
    tag = "consume",
    summary = "Create a subscription (or find the same one again)",
    request_body = SubscriptionRequest,
    responses(
        (status = 201, description = "Created", body = SubscriptionSchema),
        (status = 200, description = "The same subscription existed already", body = SubscriptionSchema),
        (status = 400, description = "A field that is not valid", body = ProblemBody),
        (status = 409, description = "A subscription of that name exists with other rules", body = ProblemBody),
        (status = 429, description = "The principal owns max_subscriptions_per_principal subscriptions", body = ProblemBody),
        (status = 501, description = "A value this gateway does not implement", body = ProblemBody),
    )
)]
pub async fn create(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    bytes: Bytes,
) -> Result<Response, Problem> {
    let request: CreateRequest = body(&bytes)?;
    let spec = request.check().map_err(|e| match e {
        SpecError::Invalid { field, reason } => Problem::field(field, reason),
        SpecError::NotImplemented { field, reason } => Problem(
            StatusCode::NOT_IMPLEMENTED,
            "not-implemented",
            format!("{field}: {reason}"),
        ),
    })?;
    let filter = spec.id.filter().as_str();
    access::within_topics(&consumer(&caller), filter)
        .map_err(|_| beyond_topics(&caller, filter))?;
    // Only a webhook registered for the caller (or for every principal): a token must not
    // aim messages at another application's endpoint.
    if let Mode::Push { url, .. } = &spec.rules.mode
        && !app.store.may_push_to(&caller.principal, url).await?
    {
        return Err(Problem::field(
            "push_url",
            format!(
                "{url} is not a push endpoint registered for {}",
                caller.principal
            ),
        ));
    }
    let (sub, created) = app
        .admissions
        .create_subscription(&spec, &caller.principal, app.clock.now())
        .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(subscription_json(&sub))).into_response())
}

/// The subscriptions a caller may see.
#[derive(Serialize, ToSchema)]
pub struct SubscriptionList {
    #[schema(value_type = Vec<SubscriptionSchema>)]
    subscriptions: Vec<Value>,
}

#[utoipa::path(
    get,
    path = "/api/v1/subscriptions",
    tag = "consume",
    summary = "List the subscriptions the caller may take from (an operator: all)",
    responses((status = 200, description = "The subscriptions", body = SubscriptionList))
)]
pub async fn list(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
) -> Result<Json<SubscriptionList>, Problem> {
    let subs: Vec<Value> = app
        .store
        .subscriptions()
        .await?
        .iter()
        .filter(|s| access::visible(&consumer(&caller), &s.held()).is_ok())
        .map(subscription_json)
        .collect();
    Ok(Json(SubscriptionList {
        subscriptions: subs,
    }))
}

#[utoipa::path(
    get,
    path = "/api/v1/subscriptions/{id}",
    tag = "consume",
    summary = "One subscription with its backlog",
    params(("id" = i64, Path, description = "The subscription's id")),
    responses(
        (status = 200, description = "The subscription", body = SubscriptionSchema),
        (status = 400, description = "Not a subscription id", body = ProblemBody),
        (status = 404, description = "No such subscription", body = ProblemBody),
    )
)]
pub async fn get(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> Result<Json<Value>, Problem> {
    let sub = visible(&app, &caller, id).await?;
    let mut answer = subscription_json(&sub);
    if matches!(sub.rules.mode, Mode::Push { .. }) {
        answer["push_health"] = push_health_json(app.push_health.get(id).as_ref());
    }
    let backlog = app.store.backlog(id).await?;
    answer["backlog"] = json!({
        "waiting": backlog.waiting,
        "in_flight": backlog.in_flight,
        "dead_letters": backlog.dead_letters,
        "unmatched": backlog.unmatched,
        "members": backlog.members,
    });
    Ok(Json(answer))
}

#[utoipa::path(
    delete,
    path = "/api/v1/subscriptions/{id}",
    tag = "consume",
    summary = "Delete a subscription (its owner, or an operator)",
    params(("id" = i64, Path, description = "The subscription's id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "Not a subscription id", body = ProblemBody),
        (status = 404, description = "No such subscription", body = ProblemBody),
    )
)]
pub async fn delete(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> Result<StatusCode, Problem> {
    let sub = managed(&app, &caller, id).await?;
    app.store.delete_subscription(id).await?;
    let target = format!("subscription {id}");
    let detail = Some(format!("{} ({})", sub.name, sub.filter));
    crate::http::audit::note(
        &app,
        &caller.principal,
        "delete_subscription",
        &target,
        detail,
    )
    .await;
    Ok(StatusCode::NO_CONTENT)
}

/// A push subscription's health on this gateway (`consume::push::health`): the last POST's
/// status and when, the last failure and when, failures in a row.
pub fn push_health_json(h: Option<&crate::consume::push::PushHealth>) -> Value {
    match h {
        None => json!({ "last_status": null, "last_at": null, "last_success_at": null,
                        "last_error": null, "last_error_at": null, "failures_in_row": 0 }),
        Some(h) => json!({
            "last_status": h.last_status,
            "last_at": date_time_string(&h.last_at),
            "last_success_at": h.last_success_at.as_ref().map(date_time_string),
            "last_error": h.last_error,
            "last_error_at": h.last_error_at.as_ref().map(date_time_string),
            "failures_in_row": h.failures_in_row,
        }),
    }
}

#[utoipa::path(
    post,
    path = "/api/v1/subscriptions/{id}/pause",
    tag = "consume",
    summary = "Pause a push subscription: nothing is POSTed until it is resumed",
    description = "For a webhook that is broken: messages wait in the subscription (and what \
                   was in flight lapses back to it) instead of failing their deliveries \
                   towards the dead letters. Its owner, or an operator.",
    params(("id" = i64, Path, description = "The subscription's id")),
    responses(
        (status = 200, description = "Paused", body = SubscriptionSchema),
        (status = 400, description = "Not a subscription id", body = ProblemBody),
        (status = 404, description = "No such subscription", body = ProblemBody),
        (status = 409, description = "A pull subscription", body = ProblemBody),
    )
)]
pub async fn pause(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> Result<Json<Value>, Problem> {
    set_paused(&app, &caller, id, true).await
}

#[utoipa::path(
    post,
    path = "/api/v1/subscriptions/{id}/resume",
    tag = "consume",
    summary = "Resume a paused push subscription",
    params(("id" = i64, Path, description = "The subscription's id")),
    responses(
        (status = 200, description = "Resumed", body = SubscriptionSchema),
        (status = 400, description = "Not a subscription id", body = ProblemBody),
        (status = 404, description = "No such subscription", body = ProblemBody),
        (status = 409, description = "A pull subscription", body = ProblemBody),
    )
)]
pub async fn resume(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> Result<Json<Value>, Problem> {
    set_paused(&app, &caller, id, false).await
}

async fn set_paused(
    app: &AppState,
    caller: &Caller,
    id: i64,
    paused: bool,
) -> Result<Json<Value>, Problem> {
    managed(app, caller, id).await?;
    app.store.set_push_paused(id, paused).await?;
    let action = if paused { "pause_push" } else { "resume_push" };
    let target = format!("subscription {id}");
    crate::http::audit::note(app, &caller.principal, action, &target, None).await;
    let sub = visible(app, caller, id).await?;
    Ok(Json(subscription_json(&sub)))
}
