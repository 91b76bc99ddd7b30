//! `/api/v1/subscriptions`, `/api/v1/sessions`, `/api/v1/settle`, `/api/v1/extend`: how
//! applications consume the inbox (DESIGN §5). Thin: the rules are `delivery::subscription`,
//! who may do what `delivery::access`, the decisions `delivery::lease` and `delivery::pick`,
//! the state `store::delivery`, the long-poll `consume::pull`; these modules read requests and
//! render answers and refusals. By area: subscriptions themselves (`crud`), who else may use
//! one (`grants`), members (`sessions`), taking messages (`fetch`), settling and extending
//! them (`settle`), and what died (`dead_letters`); here what they share — the caller as a
//! `delivery::access::Consumer`, refusals as answers, and reading a subscription one may see
//! or manage.

mod crud;
mod dead_letters;
mod fetch;
mod grants;
mod respond;
mod sessions;
mod settle;

// Globs, so that each handler's `#[utoipa::path]` companion is re-exported with it for the
// router's `routes!` in `http::mod`.
pub use crud::*;
pub use dead_letters::*;
pub use fetch::*;
pub use grants::*;
pub use respond::*;
pub use sessions::*;
pub use settle::*;

use axum::http::StatusCode;

use super::AppState;
use super::api::{Caller, Problem};
use crate::consume::admit::AdmitError;
use crate::delivery::access::{self, Consumer, Denied};
use crate::store::delivery::{DeliveryError, Subscription};

/// How the session path parameter is documented.
const SESSION: &str = "The session id the join answered";

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

impl From<AdmitError> for Problem {
    fn from(e: AdmitError) -> Problem {
        match e {
            AdmitError::TooManySubscriptions { .. } => Problem(
                StatusCode::TOO_MANY_REQUESTS,
                "too-many-subscriptions",
                e.to_string(),
            ),
            AdmitError::TooManySessions { .. } => Problem(
                StatusCode::TOO_MANY_REQUESTS,
                "too-many-sessions",
                e.to_string(),
            ),
            AdmitError::Delivery(e) => e.into(),
        }
    }
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
