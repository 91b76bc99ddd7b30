//! `/api/v1/subscriptions`, `/api/v1/sessions`, `/api/v1/settle`, `/api/v1/extend`: how
//! applications consume the inbox (DESIGN §5). Thin: the rules are `delivery::subscription`,
//! who may do what `delivery::access`, the decisions `delivery::lease` and `delivery::pick`,
//! the state `store::delivery`; this module reads requests and renders answers and refusals.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::api::ProblemBody;
use super::api::{ApiPath, ApiQuery, Caller, Problem, json_body as body};
use super::openapi::{InboxMessage, Subscription as SubscriptionSchema, SubscriptionRequest};
use crate::consume::pull::fetch_waiting;
use crate::consume::view::{MessageView, message_json};
use crate::delivery::access::{self, Consumer, Denied};
use crate::delivery::lease::Outcome;
use crate::delivery::receipt::{Receipt, ReceiptError};
use crate::delivery::subscription::{CreateRequest, Mode, SpecError};
use crate::store::delivery::{DeadLetterChange, DeliveryError, Subscription};
use crate::wsr::datetime::date_time_string;

const MAX_FETCH: usize = 1000;
const MAX_WAIT: Duration = Duration::from_secs(60);
const MAX_TTL_MS: u64 = 3_600_000;
const MAX_DELAY_MS: u64 = 7 * 24 * 3_600_000;
const MAX_OFFSETS: usize = 1000;

impl From<DeliveryError> for Problem {
    fn from(e: DeliveryError) -> Problem {
        match e {
            DeliveryError::NotFound(why) => Problem(StatusCode::NOT_FOUND, "not-found", why),
            DeliveryError::Conflict(why) => Problem(StatusCode::CONFLICT, "conflict", why),
            DeliveryError::Stale(stale) => {
                Problem(StatusCode::CONFLICT, "stale-receipt", stale.to_string())
            }
            DeliveryError::Store(e) => e.into(),
        }
    }
}

/// A settle or extend refused, as status and JSON body: a stale attempt is 409 naming the
/// current attempt, so the consumer knows its acknowledgement did not count.
type Refusal = (StatusCode, Value);

fn refusal(e: DeliveryError) -> Refusal {
    match e {
        DeliveryError::Stale(stale) => (
            StatusCode::CONFLICT,
            json!({
                "error": "stale-receipt",
                "reason": stale.reason,
                "current_attempt": stale.current_attempt,
            }),
        ),
        other => problem_refusal(other.into()),
    }
}

fn problem_refusal(Problem(status, error, reason): Problem) -> Refusal {
    (status, json!({ "error": error, "reason": reason }))
}

/// The consumer `caller` is, for `delivery::access`.
fn consumer(caller: &Caller) -> Consumer<'_> {
    Consumer {
        principal: &caller.principal,
        operator: caller.admin,
        topics: &caller.topics,
    }
}

/// Why `caller` may not do what it asked with `sub`, as the answer.
fn refused(why: Denied, caller: &Caller, sub: &Subscription) -> Problem {
    let forbidden = |why: String| Problem(StatusCode::FORBIDDEN, "forbidden", why);
    match why {
        Denied::NoGrant => forbidden(format!(
            "{} has no grant on subscription {} ({})",
            caller.principal, sub.id, sub.name
        )),
        Denied::BeyondTopics => beyond_topics(caller, &sub.filter),
        Denied::NotOwner => forbidden(format!(
            "only the owner of subscription {} may change it",
            sub.id
        )),
        Denied::OthersSession => forbidden("the session belongs to another principal".into()),
        Denied::Push => Problem(
            StatusCode::CONFLICT,
            "conflict",
            format!(
                "subscription {} pushes to a webhook; it has no pull members",
                sub.id
            ),
        ),
    }
}

/// 403: `filter` matches topics beyond what `caller`'s token may consume.
fn beyond_topics(caller: &Caller, filter: &str) -> Problem {
    Problem(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!(
            "filter {filter:?} reaches beyond the topics {} may consume",
            caller.principal
        ),
    )
}

/// The subscription `id`, or 404.
async fn existing(app: &AppState, id: i64) -> Result<Subscription, Problem> {
    app.store.subscription(id).await?.ok_or_else(|| {
        Problem(
            StatusCode::NOT_FOUND,
            "not-found",
            format!("no subscription {id}"),
        )
    })
}

/// The subscription, if `caller` may see it (`access::visible`).
async fn visible(app: &AppState, caller: &Caller, id: i64) -> Result<Subscription, Problem> {
    let sub = existing(app, id).await?;
    access::visible(&consumer(caller), &sub.held()).map_err(|why| refused(why, caller, &sub))?;
    Ok(sub)
}

/// The subscription, if `caller` may manage it (`access::managed`).
async fn managed(app: &AppState, caller: &Caller, id: i64) -> Result<Subscription, Problem> {
    let sub = existing(app, id).await?;
    access::managed(&consumer(caller), &sub.held()).map_err(|why| refused(why, caller, &sub))?;
    Ok(sub)
}

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
    if let Mode::Push { url, .. } = &spec.rules.mode
        && !app.store.is_push_endpoint(url).await?
    {
        return Err(Problem::field(
            "push_url",
            format!("{url} is not a registered push endpoint"),
        ));
    }
    let (sub, created) = app
        .store
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
    let mut answer = subscription_json(&visible(&app, &caller, id).await?);
    let backlog = app.store.backlog(id).await?;
    answer["backlog"] = json!({
        "waiting": backlog.waiting,
        "in_flight": backlog.in_flight,
        "dead_letters": backlog.dead_letters,
        "unmatched": backlog.unmatched,
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
    managed(&app, &caller, id).await?;
    app.store.delete_subscription(id).await?;
    Ok(StatusCode::NO_CONTENT)
}

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
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(Problem(
            StatusCode::NOT_FOUND,
            "not-found",
            format!("{principal} has no grant on subscription {id}"),
        ))
    }
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct JoinBody {
    /// How long the session lives without a fetch or heartbeat: 100 to 3600000 ms (default
    /// from the configuration).
    ttl_ms: Option<u64>,
}

/// A consumer session.
#[derive(Serialize, ToSchema)]
pub struct SessionAnswer {
    session: String,
    subscription: i64,
    ttl_ms: i64,
    expires_at: String,
}

#[utoipa::path(
    post,
    path = "/api/v1/subscriptions/{id}/sessions",
    tag = "consume",
    summary = "Join a pull subscription: a session to fetch with",
    params(("id" = i64, Path, description = "The subscription's id")),
    request_body(content = Option<JoinBody>, description = "May be empty"),
    responses(
        (status = 201, description = "Joined", body = SessionAnswer),
        (status = 400, description = "A field that is not valid", body = ProblemBody),
        (status = 404, description = "No such subscription", body = ProblemBody),
        (status = 409, description = "A push subscription has no pull members", body = ProblemBody),
    )
)]
pub async fn join(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<i64>,
    bytes: Bytes,
) -> Result<Response, Problem> {
    let request: JoinBody = body(&bytes)?;
    let sub = existing(&app, id).await?;
    access::may_join(&consumer(&caller), &sub.held()).map_err(|why| refused(why, &caller, &sub))?;
    let ttl = match request.ttl_ms {
        None => app.config.delivery.session_ttl,
        Some(ms) if (100..=MAX_TTL_MS).contains(&ms) => chrono::Duration::milliseconds(ms as i64),
        Some(_) => {
            return Err(Problem::field(
                "ttl_ms",
                format!("must be 100 to {MAX_TTL_MS}"),
            ));
        }
    };
    let session = app
        .store
        .join(
            id,
            &new_session_id()?,
            &caller.principal,
            ttl,
            app.clock.now(),
        )
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(SessionAnswer {
            session: session.id,
            subscription: id,
            ttl_ms: session.ttl.num_milliseconds(),
            expires_at: date_time_string(&session.expires_at),
        }),
    )
        .into_response())
}

fn new_session_id() -> Result<String, Problem> {
    let mut bytes = [0u8; 16];
    aws_lc_rs::rand::fill(&mut bytes).map_err(|_| {
        Problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "no randomness for a session id".into(),
        )
    })?;
    Ok(crate::hex::lower_hex(&bytes))
}

/// The live session `id` of `caller`, on a subscription `caller` still may use.
async fn own_session(
    app: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<crate::store::delivery::Session, Problem> {
    let gone = || {
        Problem(
            StatusCode::NOT_FOUND,
            "not-found",
            format!("no live session {id:?} (unknown or lapsed); join again"),
        )
    };
    let session = app
        .store
        .session(id, app.clock.now())
        .await?
        .ok_or_else(gone)?;
    let who = consumer(caller);
    access::owns_session(&who, &session.principal).map_err(|_| {
        Problem(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("session {id:?} belongs to another principal"),
        )
    })?;
    let sub = app
        .store
        .subscription(session.subscription_id)
        .await?
        .ok_or_else(gone)?;
    access::may_join(&who, &sub.held()).map_err(|why| match why {
        Denied::Push => Problem(
            StatusCode::CONFLICT,
            "conflict",
            format!("session {id:?} is the gateway's own push worker"),
        ),
        other => refused(other, caller, &sub),
    })?;
    Ok(session)
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct FetchBody {
    /// At most this many messages: 1 to 1000 (default 10).
    max: Option<usize>,
    /// Wait up to this long for a first message (at most 60000; default 0).
    wait_ms: Option<u64>,
}

const SESSION: &str = "The session id the join answered";

#[utoipa::path(
    post,
    path = "/api/v1/sessions/{session}/fetch",
    tag = "consume",
    summary = "Take messages: each leased until settled or its deadline",
    params(("session" = String, Path, description = SESSION)),
    request_body(content = Option<FetchBody>, description = "May be empty"),
    responses(
        (status = 200, description = "The messages handed out (maybe none)", body = FetchAnswerSchema),
        (status = 400, description = "A field that is not valid", body = ProblemBody),
        (status = 404, description = "No live session of that id", body = ProblemBody),
        (status = 409, description = "The session is a push worker's", body = ProblemBody),
    )
)]
pub async fn fetch(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(session): ApiPath<String>,
    bytes: Bytes,
) -> Result<Response, Problem> {
    let request: FetchBody = body(&bytes)?;
    let max = request.max.unwrap_or(10);
    if !(1..=MAX_FETCH).contains(&max) {
        return Err(Problem::field("max", format!("must be 1 to {MAX_FETCH}")));
    }
    let wait = Duration::from_millis(request.wait_ms.unwrap_or(0)).min(MAX_WAIT);
    own_session(&app, &caller, &session).await?;
    let handed = fetch_waiting(&app.store, &app.clock, &session, max, wait).await?;
    crate::metrics::delivered("pull", handed.len());
    let messages = handed
        .iter()
        .map(|h| HandedView {
            message: MessageView::of(&h.message),
            receipt: h.receipt.sign(&app.receipts),
            attempt: h.receipt.attempt,
            deadline: h.deadline.as_ref().map(date_time_string),
        })
        .collect();
    // Written from the borrowed rows: a batch of payloads is not copied into a JSON tree first.
    Ok(Json(FetchAnswer { messages }).into_response())
}

/// A fetch's answer.
#[derive(Serialize)]
struct FetchAnswer<'a> {
    messages: Vec<HandedView<'a>>,
}

/// A fetch's answer, as documented (`FetchAnswer` borrows, which a schema cannot).
#[derive(ToSchema)]
#[schema(as = FetchAnswer)]
#[allow(dead_code)] // a description only: the answer is a FetchAnswer
struct FetchAnswerSchema {
    messages: Vec<HandedSchema>,
}

/// One handed-out message: an inbox message with what settling it takes.
#[derive(ToSchema)]
#[schema(as = HandedMessage)]
#[allow(dead_code)] // a description only: the answer is a HandedView
struct HandedSchema {
    #[serde(flatten)]
    message: InboxMessage,
    /// Give it to settle or extend.
    receipt: String,
    attempt: u32,
    /// When the lease ends (absent: settled on sending).
    deadline: Option<String>,
}

/// One handed-out message: the message, and what settling it takes.
#[derive(Serialize)]
struct HandedView<'a> {
    #[serde(flatten)]
    message: MessageView<'a>,
    receipt: String,
    attempt: u32,
    deadline: Option<String>,
}

/// A session kept alive.
#[derive(Serialize, ToSchema)]
pub struct HeartbeatAnswer {
    session: String,
    expires_at: String,
}

#[utoipa::path(
    post,
    path = "/api/v1/sessions/{session}/heartbeat",
    tag = "consume",
    summary = "Keep a session alive",
    params(("session" = String, Path, description = SESSION)),
    responses(
        (status = 200, description = "Alive until expires_at", body = HeartbeatAnswer),
        (status = 404, description = "No live session of that id", body = ProblemBody),
        (status = 409, description = "The session is a push worker's", body = ProblemBody),
    )
)]
pub async fn heartbeat(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(session): ApiPath<String>,
) -> Result<Json<HeartbeatAnswer>, Problem> {
    own_session(&app, &caller, &session).await?;
    let expires_at = app.store.heartbeat(&session, app.clock.now()).await?;
    Ok(Json(HeartbeatAnswer {
        session,
        expires_at: date_time_string(&expires_at),
    }))
}

#[utoipa::path(
    delete,
    path = "/api/v1/sessions/{session}",
    tag = "consume",
    summary = "Leave: the session's leased messages go back to the others",
    params(("session" = String, Path, description = SESSION)),
    responses(
        (status = 204, description = "Left"),
        (status = 404, description = "No live session of that id", body = ProblemBody),
        (status = 409, description = "The session is a push worker's", body = ProblemBody),
    )
)]
pub async fn leave(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(session): ApiPath<String>,
) -> Result<StatusCode, Problem> {
    own_session(&app, &caller, &session).await?;
    app.store.leave(&session, app.clock.now()).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct SettleBody {
    receipt: String,
    /// accepted | rejected | released | modified; absent: the subscription's default outcome.
    #[schema(pattern = "^(accepted|rejected|released|modified)$")]
    outcome: Option<String>,
    #[serde(default)]
    delivery_failed: bool,
    #[serde(default)]
    undeliverable_here: bool,
    delay_ms: Option<u64>,
}

impl SettleBody {
    fn outcome(&self) -> Result<Option<Outcome>, Problem> {
        let modifiers = self.delivery_failed || self.undeliverable_here || self.delay_ms.is_some();
        let outcome = match self.outcome.as_deref() {
            None if !modifiers => None,
            None | Some("modified") => Some(Outcome::Modified {
                delivery_failed: self.delivery_failed,
                undeliverable_here: self.undeliverable_here,
                delay: match self.delay_ms {
                    None => None,
                    Some(ms) if ms <= MAX_DELAY_MS => {
                        Some(chrono::Duration::milliseconds(ms as i64))
                    }
                    Some(_) => {
                        return Err(Problem::field(
                            "delay_ms",
                            format!("at most {MAX_DELAY_MS} (one week)"),
                        ));
                    }
                },
            }),
            Some(plain) if modifiers => {
                return Err(Problem::field(
                    "outcome",
                    format!("{plain:?} takes no delivery_failed, undeliverable_here or delay_ms"),
                ));
            }
            Some("accepted") => Some(Outcome::Accepted),
            Some("rejected") => Some(Outcome::Rejected),
            Some("released") => Some(Outcome::Released),
            Some(other) => {
                return Err(Problem::field(
                    "outcome",
                    format!("{other:?} is not accepted, rejected, released or modified"),
                ));
            }
        };
        Ok(outcome)
    }
}

/// The receipt's delivery, if genuine and `caller` may settle on its subscription; `known`
/// keeps the subscriptions already read for this request.
async fn receipt_for(
    app: &AppState,
    caller: &Caller,
    token: &str,
    known: &mut HashMap<i64, Subscription>,
) -> Result<Receipt, Problem> {
    let receipt = Receipt::verify(token, &app.receipts).map_err(|e| match e {
        ReceiptError::Malformed | ReceiptError::Forged => Problem::field("receipt", e.to_string()),
    })?;
    let id: i64 = receipt.subscription.parse().map_err(|_| {
        Problem(
            StatusCode::NOT_FOUND,
            "not-found",
            "no such delivery".into(),
        )
    })?;
    let sub = match known.get(&id) {
        Some(sub) => sub,
        None => known.entry(id).or_insert(existing(app, id).await?),
    };
    access::may_settle(&consumer(caller), &sub.held()).map_err(|why| refused(why, caller, sub))?;
    Ok(receipt)
}

/// Several settlements in one request (and one transaction).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct SettleBatch {
    settlements: Vec<SettleBody>,
}

const MAX_SETTLEMENTS: usize = 1000;

/// One settlement, or a batch.
#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // a description only: `settle` tells the two apart by `settlements`
enum SettleRequest {
    One(SettleBody),
    Batch(SettleBatch),
}

/// A settlement that counted.
#[derive(Serialize, ToSchema)]
pub struct Settled {
    offset: i64,
    attempt: u32,
    settled: bool,
}

/// A settle or extend refused because the attempt is not the current one.
#[derive(ToSchema)]
#[allow(dead_code)] // a description only: written by `refusal`
struct StaleReceipt {
    /// `stale-receipt` (or another problem kind).
    error: String,
    reason: String,
    current_attempt: Option<u32>,
}

/// One result of a batch: `settled: true`, or the refusal with its HTTP status.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)] // a description only: written by `settle`
struct BatchResult {
    offset: Option<i64>,
    attempt: Option<u32>,
    settled: Option<bool>,
    error: Option<String>,
    reason: Option<String>,
    current_attempt: Option<u32>,
    status: Option<u16>,
}

/// The results of a batch, in the order of its settlements.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)] // a description only: written by `settle`
struct BatchAnswer {
    results: Vec<BatchResult>,
}

#[utoipa::path(
    post,
    path = "/api/v1/settle",
    tag = "consume",
    summary = "Settle deliveries by their receipts",
    request_body = SettleRequest,
    responses(
        (status = 200, description = "Settled (one), or one result per settlement (a batch)", body = SettleAnswer),
        (status = 400, description = "A field that is not valid, or a receipt that is not genuine", body = ProblemBody),
        (status = 404, description = "No such delivery", body = ProblemBody),
        (status = 409, description = "The attempt is not the current one", body = StaleReceipt),
    )
)]
/// `POST /api/v1/settle`: one settlement (`{receipt, outcome, …}`: 200, or 409 naming the
/// current attempt), or a batch (`{settlements: […]}`: 200 with one result per settlement,
/// in order, each `settled: true` or the refusal with its status).
pub async fn settle(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    bytes: Bytes,
) -> Result<Response, Problem> {
    let value: Value = body(&bytes)?;
    let batch = value.get("settlements").is_some();
    let items = if batch {
        let batch: SettleBatch =
            serde_json::from_value(value).map_err(|e| Problem::field("body", e.to_string()))?;
        if batch.settlements.len() > MAX_SETTLEMENTS {
            return Err(Problem::field(
                "settlements",
                format!("at most {MAX_SETTLEMENTS} per request"),
            ));
        }
        batch.settlements
    } else {
        vec![serde_json::from_value(value).map_err(|e| Problem::field("body", e.to_string()))?]
    };
    // Check every settlement first; the valid ones are settled together.
    let mut known = HashMap::new();
    let mut checked = Vec::with_capacity(items.len());
    for item in &items {
        let check = match item.outcome() {
            Ok(outcome) => receipt_for(&app, &caller, &item.receipt, &mut known)
                .await
                .map(|r| (r, outcome)),
            Err(p) => Err(p),
        };
        checked.push(check);
    }
    let valid: Vec<_> = checked
        .iter()
        .filter_map(|c| c.as_ref().ok())
        .cloned()
        .collect();
    let mut settled = app
        .store
        .settle_many(&valid, app.clock.now())
        .await?
        .into_iter();
    let mut results: Vec<Result<Receipt, Refusal>> = Vec::with_capacity(checked.len());
    for check in checked {
        results.push(match check {
            Ok((receipt, outcome)) => match settled.next() {
                Some(Ok(())) => {
                    crate::metrics::settled(
                        "pull",
                        outcome.as_ref().map_or("default", Outcome::label),
                    );
                    Ok(receipt)
                }
                Some(Err(e)) => Err(refusal(e)),
                None => Err(problem_refusal(
                    crate::store::StoreError::Failed("a settlement went unanswered".into()).into(),
                )),
            },
            Err(problem) => Err(problem_refusal(problem)),
        });
    }
    if !batch {
        return Ok(match results.pop() {
            Some(Ok(receipt)) => Json(settled_json(&receipt)).into_response(),
            Some(Err((status, body))) => (status, Json(body)).into_response(),
            None => StatusCode::NO_CONTENT.into_response(),
        });
    }
    let results: Vec<Value> = results
        .into_iter()
        .map(|r| match r {
            Ok(receipt) => settled_json(&receipt),
            Err((status, mut body)) => {
                body["status"] = json!(status.as_u16());
                body
            }
        })
        .collect();
    Ok(Json(json!({ "results": results })).into_response())
}

/// A settle's answer: one settlement's, or a batch's.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // a description only: written by `settle`
enum SettleAnswer {
    One(Settled),
    Batch(BatchAnswer),
}

fn settled_json(receipt: &Receipt) -> Value {
    json!(Settled {
        offset: receipt.offset,
        attempt: receipt.attempt,
        settled: true
    })
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ExtendBody {
    receipt: String,
}

/// A lease extended.
#[derive(Serialize, ToSchema)]
pub struct Extended {
    offset: i64,
    attempt: u32,
    deadline: String,
}

#[utoipa::path(
    post,
    path = "/api/v1/extend",
    tag = "consume",
    summary = "Extend a delivery's lease by the subscription's ack wait",
    request_body = ExtendBody,
    responses(
        (status = 200, description = "The new deadline", body = Extended),
        (status = 400, description = "A field that is not valid, or a receipt that is not genuine", body = ProblemBody),
        (status = 404, description = "No such delivery", body = ProblemBody),
        (status = 409, description = "The attempt is not the current one", body = StaleReceipt),
    )
)]
pub async fn extend(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    bytes: Bytes,
) -> Result<Response, Problem> {
    let request: ExtendBody = body(&bytes)?;
    let receipt = receipt_for(&app, &caller, &request.receipt, &mut HashMap::new()).await?;
    Ok(match app.store.extend(&receipt, app.clock.now()).await {
        Ok(deadline) => Json(Extended {
            offset: receipt.offset,
            attempt: receipt.attempt,
            deadline: date_time_string(&deadline),
        })
        .into_response(),
        Err(e) => {
            let (status, body) = refusal(e);
            (status, Json(body)).into_response()
        }
    })
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeadLetterPage {
    /// The offset to list after (the previous page's `next_after`; default 0).
    after: Option<i64>,
    /// 1 to 1000 (default 100; values beyond are clamped).
    limit: Option<i64>,
}

/// A dead letter: why it died, after how many attempts, and the message if still kept.
#[derive(Serialize, ToSchema)]
pub struct DeadLetterView {
    offset: i64,
    reason: String,
    attempts: u32,
    #[schema(value_type = Option<InboxMessage>)]
    message: Option<Value>,
}

/// A page of dead letters.
#[derive(Serialize, ToSchema)]
pub struct DeadLetterList {
    dead_letters: Vec<DeadLetterView>,
    /// Give as `after` for the next page.
    next_after: Option<i64>,
}

#[utoipa::path(
    get,
    path = "/api/v1/subscriptions/{id}/dead-letters",
    tag = "consume",
    summary = "List a subscription's dead letters",
    params(("id" = i64, Path, description = "The subscription's id"), DeadLetterPage),
    responses(
        (status = 200, description = "A page of dead letters", body = DeadLetterList),
        (status = 400, description = "A parameter that does not parse", body = ProblemBody),
        (status = 404, description = "No such subscription", body = ProblemBody),
    )
)]
pub async fn dead_letters(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<i64>,
    ApiQuery(page): ApiQuery<DeadLetterPage>,
) -> Result<Json<DeadLetterList>, Problem> {
    visible(&app, &caller, id).await?;
    let letters = app
        .store
        .dead_letters(
            id,
            page.after.unwrap_or(0),
            page.limit.unwrap_or(100).clamp(1, 1000),
        )
        .await?;
    let next = letters.last().map(|l| l.offset);
    let dead_letters = letters
        .iter()
        .map(|l| DeadLetterView {
            offset: l.offset,
            reason: l.reason.clone(),
            attempts: l.attempts,
            message: l.message.as_ref().map(message_json),
        })
        .collect();
    Ok(Json(DeadLetterList {
        dead_letters,
        next_after: next,
    }))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct DeadLetterSelection {
    /// Offsets to act on (at most 1000); absent: all of the subscription's dead letters.
    offsets: Option<Vec<i64>>,
}

/// How many dead letters a replay put back.
#[derive(Serialize, ToSchema)]
pub struct Replayed {
    replayed: u64,
}

/// How many dead letters a purge removed.
#[derive(Serialize, ToSchema)]
pub struct Purged {
    purged: u64,
}

#[utoipa::path(
    post,
    path = "/api/v1/subscriptions/{id}/dead-letters/replay",
    tag = "consume",
    summary = "Put dead letters back to be delivered again (owner or operator)",
    params(("id" = i64, Path, description = "The subscription's id")),
    request_body(content = Option<DeadLetterSelection>, description = "May be empty: all"),
    responses(
        (status = 200, description = "How many were put back", body = Replayed),
        (status = 400, description = "A field that is not valid", body = ProblemBody),
        (status = 404, description = "No such subscription", body = ProblemBody),
    )
)]
pub async fn replay_dead_letters(
    caller: Extension<Caller>,
    state: State<AppState>,
    id: ApiPath<i64>,
    bytes: Bytes,
) -> Result<Json<Replayed>, Problem> {
    let replayed = change_dead_letters(DeadLetterChange::Replay, caller, state, id, bytes).await?;
    Ok(Json(Replayed { replayed }))
}

#[utoipa::path(
    post,
    path = "/api/v1/subscriptions/{id}/dead-letters/purge",
    tag = "consume",
    summary = "Remove dead letters for good (owner or operator)",
    params(("id" = i64, Path, description = "The subscription's id")),
    request_body(content = Option<DeadLetterSelection>, description = "May be empty: all"),
    responses(
        (status = 200, description = "How many were removed", body = Purged),
        (status = 400, description = "A field that is not valid", body = ProblemBody),
        (status = 404, description = "No such subscription", body = ProblemBody),
    )
)]
pub async fn purge_dead_letters(
    caller: Extension<Caller>,
    state: State<AppState>,
    id: ApiPath<i64>,
    bytes: Bytes,
) -> Result<Json<Purged>, Problem> {
    let purged = change_dead_letters(DeadLetterChange::Purge, caller, state, id, bytes).await?;
    Ok(Json(Purged { purged }))
}

/// Replays or purges the selected dead letters; how many.
async fn change_dead_letters(
    change: DeadLetterChange,
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<i64>,
    bytes: Bytes,
) -> Result<u64, Problem> {
    managed(&app, &caller, id).await?;
    let selection: DeadLetterSelection = body(&bytes)?;
    if selection
        .offsets
        .as_ref()
        .is_some_and(|o| o.len() > MAX_OFFSETS)
    {
        return Err(Problem::field(
            "offsets",
            format!("at most {MAX_OFFSETS} per request; leave it out for all"),
        ));
    }
    let changed = app
        .store
        .change_dead_letters(id, selection.offsets.as_deref(), change, app.clock.now())
        .await?;
    Ok(changed)
}
