//! Settling deliveries by their receipts (one or a batch, in one transaction) and extending
//! a lease; a stale attempt is refused naming the current one.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::{consumer, existing, refused};
use crate::delivery::access;
use crate::delivery::lease::Outcome;
use crate::delivery::receipt::{Receipt, ReceiptError};
use crate::http::AppState;
use crate::http::api::{Caller, Problem, ProblemBody, json_body as body};
use crate::store::delivery::{DeliveryError, Subscription};
use crate::wsr::datetime::date_time_string;

const MAX_DELAY_MS: u64 = 7 * 24 * 3_600_000;

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
    /// Why (at most 1 000 bytes, no control characters): a dead letter's reason names it,
    /// after who settled.
    reason: Option<String>,
}

impl SettleBody {
    /// Who settled and why, as a dead letter's reason names it: the caller's principal and
    /// the reason it gave.
    fn by(&self, caller: &Caller) -> Result<String, Problem> {
        let Some(reason) = self
            .reason
            .as_deref()
            .map(str::trim)
            .filter(|r| !r.is_empty())
        else {
            return Ok(caller.principal.clone());
        };
        if reason.len() > 1000 || reason.chars().any(char::is_control) {
            return Err(Problem::field(
                "reason",
                "at most 1000 bytes, no control characters".to_owned(),
            ));
        }
        Ok(format!("{}: {reason}", caller.principal))
    }

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
pub(super) async fn receipt_for(
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
    let (batch, items) = settlements(&bytes)?;
    // Check every settlement first; the valid ones are settled together.
    let checked = check_all(&app, &caller, &items).await;
    let valid: Vec<_> = checked
        .iter()
        .filter_map(|c| c.as_ref().ok())
        .cloned()
        .collect();
    // In each settled message's trace, lasting the commit.
    let offsets = valid.iter().map(|(receipt, _, _)| receipt.offset);
    let spans = crate::consume::traced::settling(&app.store, offsets).await;
    let settled = app.store.settle_many(&valid, app.clock.now()).await?;
    drop(spans);
    let results = paired(checked, settled);
    Ok(if batch {
        batch_answer(results)
    } else {
        one_answer(results)
    })
}

/// The request's settlements, and whether it was a batch (`{settlements: […]}`).
fn settlements(bytes: &Bytes) -> Result<(bool, Vec<SettleBody>), Problem> {
    /// Only whether the body names `settlements`: read without building anything, so the
    /// body is then read once into what it is, not first into a `Value` tree and again out
    /// of it (a consumer's batch settles a page of messages per request).
    #[derive(Deserialize)]
    struct Shape {
        settlements: Option<serde::de::IgnoredAny>,
    }
    let shape: Shape = body(bytes)?;
    if shape.settlements.is_none() {
        return Ok((false, vec![body(bytes)?]));
    }
    let batch: SettleBatch = body(bytes)?;
    if batch.settlements.len() > MAX_SETTLEMENTS {
        return Err(Problem::field(
            "settlements",
            format!("at most {MAX_SETTLEMENTS} per request"),
        ));
    }
    Ok((true, batch.settlements))
}

/// A settlement checked: its genuine receipt, which `caller` may settle, its outcome, and who
/// settled and why.
type Checked = Result<(Receipt, Option<Outcome>, Option<String>), Problem>;

/// Each settlement checked, in order; a subscription is read once for all of them.
async fn check_all(app: &AppState, caller: &Caller, items: &[SettleBody]) -> Vec<Checked> {
    let mut known = HashMap::new();
    let mut checked = Vec::with_capacity(items.len());
    for item in items {
        let check = match (item.outcome(), item.by(caller)) {
            (Ok(outcome), Ok(by)) => receipt_for(app, caller, &item.receipt, &mut known)
                .await
                .map(|r| (r, outcome, Some(by))),
            (Err(p), _) | (_, Err(p)) => Err(p),
        };
        checked.push(check);
    }
    checked
}

/// Each settlement's result, in order: the store answered the valid ones, in their order.
fn paired(
    checked: Vec<Checked>,
    settled: Vec<Result<(), DeliveryError>>,
) -> Vec<Result<Receipt, Refusal>> {
    let mut settled = settled.into_iter();
    let mut results = Vec::with_capacity(checked.len());
    for check in checked {
        results.push(match check {
            Ok((receipt, outcome, _)) => match settled.next() {
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
    results
}

/// One settlement's answer: 200 settled, or the refusal with its status.
fn one_answer(mut results: Vec<Result<Receipt, Refusal>>) -> Response {
    match results.pop() {
        Some(Ok(receipt)) => Json(Settled::of(&receipt)).into_response(),
        Some(Err((status, body))) => (status, Json(body)).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

/// A batch's answer: 200 with one result per settlement, a refusal carrying its status.
fn batch_answer(results: Vec<Result<Receipt, Refusal>>) -> Response {
    /// One result as `BatchResult` describes it: a settlement serialized as it is (not built
    /// as a `Value` map first: a batch answers one per message settled), a refusal as its
    /// problem body with the status added.
    #[derive(Serialize)]
    #[serde(untagged)]
    enum Written {
        Settled(Settled),
        Refused(Value),
    }
    #[derive(Serialize)]
    struct Answer {
        results: Vec<Written>,
    }
    let results = results
        .into_iter()
        .map(|r| match r {
            Ok(receipt) => Written::Settled(Settled::of(&receipt)),
            Err((status, mut body)) => {
                body["status"] = json!(status.as_u16());
                Written::Refused(body)
            }
        })
        .collect();
    Json(Answer { results }).into_response()
}

/// A settle's answer: one settlement's, or a batch's.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // a description only: written by `settle`
enum SettleAnswer {
    One(Settled),
    Batch(BatchAnswer),
}

impl Settled {
    fn of(receipt: &Receipt) -> Settled {
        Settled {
            offset: receipt.offset,
            attempt: receipt.attempt,
            settled: true,
        }
    }
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
