//! `/api/v1/subscriptions`, `/api/v1/sessions`, `/api/v1/settle`, `/api/v1/extend`: how
//! applications consume the inbox (DESIGN §5). Thin: the rules are `delivery::subscription`,
//! the decisions `delivery::lease` and `delivery::pick`, the state `store::delivery`.
//!
//! Access: the creator of a subscription owns it; other principals need a grant to join, fetch
//! or settle. Operators (admin scope) may inspect, delete and manage dead letters of any
//! subscription, but take messages only where they are owner or grantee like anyone else.
//! Every principal takes and sees messages only within its token's `topics`: a subscription
//! whose filter reaches beyond them cannot be created, joined, fetched from or inspected by it.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::AppState;
use super::admin::{Caller, Problem};
use crate::delivery::lease::Outcome;
use crate::delivery::pull::fetch_waiting;
use crate::delivery::receipt::{Receipt, ReceiptError};
use crate::delivery::subscription::{CreateRequest, Mode, SpecError};
use crate::delivery::{MessageView, message_json};
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

fn body<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, Problem> {
    let bytes: &[u8] = if bytes.is_empty() { b"{}" } else { bytes };
    serde_json::from_slice(bytes).map_err(|e| Problem::field("body", e.to_string()))
}

fn forbidden(caller: &Caller, sub: &Subscription) -> Problem {
    Problem(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!(
            "{} has no grant on subscription {} ({})",
            caller.principal, sub.id, sub.name
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

/// 403 unless every topic `filter` can match is within `caller`'s allow-list (its token's
/// `topics`): a subscription delivers nothing beyond what its filter matches.
fn within_topics(caller: &Caller, filter: &str) -> Result<(), Problem> {
    if caller.may_consume(filter) {
        Ok(())
    } else {
        Err(Problem(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "filter {filter:?} reaches beyond the topics {} may consume",
                caller.principal
            ),
        ))
    }
}

/// Whether `caller` may take messages from `sub`: its owner or a grantee, and only within its
/// own topics (checked each time, so a token whose topics were narrowed takes nothing beyond
/// them). Operators inspect, but take messages only where this holds too.
fn may_take(caller: &Caller, sub: &Subscription) -> Result<(), Problem> {
    if !sub.admits(&caller.principal) {
        return Err(forbidden(caller, sub));
    }
    within_topics(caller, &sub.filter)
}

/// The subscription, if `caller` may see it: an operator, or one who may take from it.
async fn visible(app: &AppState, caller: &Caller, id: i64) -> Result<Subscription, Problem> {
    let sub = existing(app, id).await?;
    if !caller.admin {
        may_take(caller, &sub)?;
    }
    Ok(sub)
}

/// The subscription, if `caller` may manage it (owner or operator). Managing reads no
/// messages, so an owner may do it even beyond its topics (e.g. delete it).
async fn managed(app: &AppState, caller: &Caller, id: i64) -> Result<Subscription, Problem> {
    let sub = existing(app, id).await?;
    if caller.admin || sub.owner == caller.principal {
        Ok(sub)
    } else if sub.admits(&caller.principal) {
        Err(Problem(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("only the owner of subscription {id} may change it"),
        ))
    } else {
        Err(forbidden(caller, &sub))
    }
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
    within_topics(&caller, spec.id.filter().as_str())?;
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

pub async fn list(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
) -> Result<Json<Value>, Problem> {
    let subs: Vec<Value> = app
        .store
        .subscriptions()
        .await?
        .iter()
        .filter(|s| caller.admin || may_take(&caller, s).is_ok())
        .map(subscription_json)
        .collect();
    Ok(Json(json!({ "subscriptions": subs })))
}

pub async fn get(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    Path(id): Path<i64>,
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

pub async fn delete(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    Path(id): Path<i64>,
) -> Result<StatusCode, Problem> {
    managed(&app, &caller, id).await?;
    app.store.delete_subscription(id).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn grant(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    Path((id, principal)): Path<(i64, String)>,
) -> Result<StatusCode, Problem> {
    managed(&app, &caller, id).await?;
    app.store.grant(id, &principal).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn revoke(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    Path((id, principal)): Path<(i64, String)>,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JoinBody {
    ttl_ms: Option<u64>,
}

pub async fn join(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    Path(id): Path<i64>,
    bytes: Bytes,
) -> Result<Response, Problem> {
    let request: JoinBody = body(&bytes)?;
    let sub = existing(&app, id).await?;
    may_take(&caller, &sub)?;
    if matches!(sub.rules.mode, Mode::Push { .. }) {
        return Err(Problem(
            StatusCode::CONFLICT,
            "conflict",
            format!("subscription {id} pushes to a webhook; it has no pull members"),
        ));
    }
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
        Json(json!({
            "session": session.id,
            "subscription": id,
            "ttl_ms": session.ttl.num_milliseconds(),
            "expires_at": date_time_string(&session.expires_at),
        })),
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
    if session.principal != caller.principal {
        return Err(Problem(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("session {id:?} belongs to another principal"),
        ));
    }
    let sub = app
        .store
        .subscription(session.subscription_id)
        .await?
        .ok_or_else(gone)?;
    may_take(caller, &sub)?;
    if matches!(sub.rules.mode, Mode::Push { .. }) {
        return Err(Problem(
            StatusCode::CONFLICT,
            "conflict",
            format!("session {id:?} is the gateway's own push worker"),
        ));
    }
    Ok(session)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FetchBody {
    max: Option<usize>,
    wait_ms: Option<u64>,
}

pub async fn fetch(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    Path(session): Path<String>,
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

/// One handed-out message: the message, and what settling it takes.
#[derive(Serialize)]
struct HandedView<'a> {
    #[serde(flatten)]
    message: MessageView<'a>,
    receipt: String,
    attempt: u32,
    deadline: Option<String>,
}

pub async fn heartbeat(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    Path(session): Path<String>,
) -> Result<Json<Value>, Problem> {
    own_session(&app, &caller, &session).await?;
    let expires_at = app.store.heartbeat(&session, app.clock.now()).await?;
    Ok(Json(
        json!({ "session": session, "expires_at": date_time_string(&expires_at) }),
    ))
}

pub async fn leave(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    Path(session): Path<String>,
) -> Result<StatusCode, Problem> {
    own_session(&app, &caller, &session).await?;
    app.store.leave(&session, app.clock.now()).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleBody {
    receipt: String,
    /// accepted | rejected | released | modified; absent: the subscription's default outcome.
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
    if !sub.admits(&caller.principal) {
        return Err(forbidden(caller, sub));
    }
    Ok(receipt)
}

/// Several settlements in one request (and one transaction).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleBatch {
    settlements: Vec<SettleBody>,
}

const MAX_SETTLEMENTS: usize = 1000;

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

fn settled_json(receipt: &Receipt) -> Value {
    json!({ "offset": receipt.offset, "attempt": receipt.attempt, "settled": true })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExtendBody {
    receipt: String,
}

pub async fn extend(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    bytes: Bytes,
) -> Result<Response, Problem> {
    let request: ExtendBody = body(&bytes)?;
    let receipt = receipt_for(&app, &caller, &request.receipt, &mut HashMap::new()).await?;
    Ok(match app.store.extend(&receipt, app.clock.now()).await {
        Ok(deadline) => Json(json!({
            "offset": receipt.offset,
            "attempt": receipt.attempt,
            "deadline": date_time_string(&deadline),
        }))
        .into_response(),
        Err(e) => {
            let (status, body) = refusal(e);
            (status, Json(body)).into_response()
        }
    })
}

#[derive(Deserialize)]
pub struct DeadLetterPage {
    after: Option<i64>,
    limit: Option<i64>,
}

pub async fn dead_letters(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    Path(id): Path<i64>,
    Query(page): Query<DeadLetterPage>,
) -> Result<Json<Value>, Problem> {
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
    let letters: Vec<Value> = letters
        .iter()
        .map(|l| {
            json!({
                "offset": l.offset,
                "reason": l.reason,
                "attempts": l.attempts,
                "message": l.message.as_ref().map(message_json),
            })
        })
        .collect();
    Ok(Json(json!({ "dead_letters": letters, "next_after": next })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadLetterSelection {
    /// Offsets to act on; absent: all of the subscription's dead letters.
    offsets: Option<Vec<i64>>,
}

/// `POST …/dead-letters/replay` and `…/purge`.
pub async fn change_dead_letters(
    change: DeadLetterChange,
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    Path(id): Path<i64>,
    bytes: Bytes,
) -> Result<Json<Value>, Problem> {
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
    let key = match change {
        DeadLetterChange::Replay => "replayed",
        DeadLetterChange::Purge => "purged",
    };
    Ok(Json(json!({ key: changed })))
}
