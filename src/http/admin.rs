//! `/api/v1/*` for operators: callback endpoint registration, group inspection, and reading
//! the inbox (until subscriptions replace it for applications). JSON, bearer tokens with scopes.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use crate::config::{Scope, check_endpoint};
use crate::delivery::filter::Filter;
use crate::delivery::message_json;
use crate::rmp::group::GroupState;
use crate::store::ReceiverStore as _;
use crate::store::{Endpoints, StoreError};
use crate::wsr::datetime::date_time_string;

/// A JSON problem answer: status, error kind, reason, and the offending field if any.
pub struct Problem(pub StatusCode, pub &'static str, pub String);

impl Problem {
    /// A 400 naming the request field at fault.
    pub fn field(field: &str, reason: String) -> Problem {
        Problem(
            StatusCode::BAD_REQUEST,
            "invalid-field",
            format!("{field}: {reason}"),
        )
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let Problem(status, error, reason) = self;
        (status, Json(json!({ "error": error, "reason": reason }))).into_response()
    }
}

impl From<StoreError> for Problem {
    fn from(e: StoreError) -> Problem {
        crate::store::health::log_store_failure("API answered 503", &e);
        Problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "store-unavailable",
            "the store could not answer; try again".into(),
        )
    }
}

/// Who called: the principal of the bearer token, whether it is an operator, and the topics
/// it may consume.
#[derive(Debug, Clone)]
pub struct Caller {
    pub principal: String,
    pub admin: bool,
    pub topics: Vec<Filter>,
}

impl Caller {
    /// Whether every topic `filter` can match is within this caller's allow-list.
    pub fn may_consume(&self, filter: &str) -> bool {
        Filter::parse(filter).is_ok_and(|f| f.within(&self.topics))
    }
}

/// Checks the bearer token and that it carries one of `scopes`. The one place tokens are
/// checked; every `/api/v1` route runs it (in `router`'s guard) before reading the request.
pub(super) async fn authorize(
    app: &AppState,
    headers: &HeaderMap,
    scopes: &[Scope],
) -> Result<Caller, Problem> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| {
            Problem(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "send Authorization: Bearer <token>".into(),
            )
        })?;
    let mut found = None;
    for t in &app.config.tokens {
        if app.config.verifier.matches(&t.secret, presented).await {
            found = Some(t);
            break;
        }
    }
    let token = found.ok_or_else(|| {
        Problem(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "unknown token".into(),
        )
    })?;
    if !token.scopes.iter().any(|s| scopes.contains(s)) {
        return Err(Problem(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("{} may not do this", token.principal),
        ));
    }
    Ok(Caller {
        principal: token.principal.clone(),
        admin: token.scopes.contains(&Scope::Admin),
        // Checked when the configuration is loaded; one that is not valid allows nothing.
        topics: token
            .topics
            .iter()
            .filter_map(|t| Filter::parse(t).ok())
            .collect(),
    })
}

/// Compares secrets without revealing where they differ.

#[derive(Deserialize)]
pub struct EndpointBody {
    url: String,
    /// Callback endpoints only: the partner that may name it (absent: anonymous callers).
    partner: Option<String>,
}

#[derive(Deserialize)]
pub struct EndpointQuery {
    url: String,
    partner: Option<String>,
}

/// A partner given with an endpoint: only callback endpoints belong to partners, and only to
/// configured ones (a typo would register an endpoint nobody can use).
fn endpoint_partner(app: &AppState, kind: Endpoints, partner: Option<&str>) -> Result<(), Problem> {
    match (kind, partner) {
        (_, None) => Ok(()),
        (Endpoints::Push, Some(_)) => Err(Problem::field(
            "partner",
            "push endpoints belong to no partner".into(),
        )),
        (Endpoints::Callback, Some(name)) if app.config.partners.get(name).is_none() => Err(
            Problem::field("partner", format!("{name:?} is not a configured partner")),
        ),
        (Endpoints::Callback, Some(_)) => Ok(()),
    }
}

pub async fn add_endpoint(
    kind: Endpoints,
    State(app): State<AppState>,
    Json(body): Json<EndpointBody>,
) -> Result<Response, Problem> {
    check_endpoint(&body.url).map_err(|e| Problem::field("url", e.to_string()))?;
    let partner = body.partner.as_deref();
    endpoint_partner(&app, kind, partner)?;
    let created = app
        .store
        .add_endpoint(kind, partner, &body.url, app.clock.now())
        .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let answer = match kind {
        Endpoints::Callback => json!({ "url": body.url, "partner": partner.unwrap_or("") }),
        Endpoints::Push => json!({ "url": body.url }),
    };
    Ok((status, Json(answer)).into_response())
}

pub async fn list_endpoints(
    kind: Endpoints,
    State(app): State<AppState>,
) -> Result<Json<Value>, Problem> {
    let urls = app.store.endpoints(kind).await?;
    if kind == Endpoints::Push {
        return Ok(Json(json!({ "endpoints": urls })));
    }
    // Each URL once in `endpoints`; who may name it in `registrations` ("" : anonymous).
    let registrations: Vec<Value> = app
        .store
        .callback_endpoints()
        .await?
        .into_iter()
        .map(|(partner, url)| json!({ "partner": partner, "url": url }))
        .collect();
    Ok(Json(
        json!({ "endpoints": urls, "registrations": registrations }),
    ))
}

/// `DELETE …?url=…`, or with the URL in a JSON body `{"url": …}` (for URLs too long for a
/// request line: whatever could be registered can be removed).
pub async fn remove_endpoint(
    kind: Endpoints,
    State(app): State<AppState>,
    uri: Uri,
    body: Bytes,
) -> Result<StatusCode, Problem> {
    let from_query = match uri.query() {
        None | Some("") => None,
        Some(_) => {
            let q = Query::<EndpointQuery>::try_from_uri(&uri)
                .map_err(|e| Problem::field("url", e.body_text()))?
                .0;
            Some((q.url, q.partner))
        }
    };
    let from_body = if body.is_empty() {
        None
    } else {
        let body: EndpointBody =
            serde_json::from_slice(&body).map_err(|e| Problem::field("body", e.to_string()))?;
        Some((body.url, body.partner))
    };
    let (url, partner) = match (from_query, from_body) {
        (Some(q), Some(b)) if q != b => {
            return Err(Problem::field(
                "url",
                "given in the query and in the body, differently".into(),
            ));
        }
        (Some(url), _) | (None, Some(url)) => url,
        (None, None) => {
            return Err(Problem::field(
                "url",
                "missing: give ?url=… or a JSON body {\"url\": …}".into(),
            ));
        }
    };
    // Any partner name: a partner removed from the configuration may leave registrations.
    if kind == Endpoints::Push && partner.is_some() {
        return Err(Problem::field(
            "partner",
            "push endpoints belong to no partner".into(),
        ));
    }
    if app
        .store
        .remove_endpoint(kind, partner.as_deref(), &url)
        .await?
    {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(Problem(
            StatusCode::NOT_FOUND,
            "not-found",
            format!("{url} is not registered"),
        ))
    }
}

#[derive(Deserialize)]
pub struct Page {
    after: Option<String>,
    /// The partner of the `after` group ("" when absent: anonymous callers' groups).
    after_partner: Option<String>,
    limit: Option<i64>,
}

#[derive(Deserialize)]
pub struct GroupQuery {
    /// Whose group (absent: an anonymous caller's).
    partner: Option<String>,
}

fn limit(page: &Page) -> i64 {
    page.limit.unwrap_or(100).clamp(1, 1000)
}

pub async fn list_groups(
    State(app): State<AppState>,
    Query(page): Query<Page>,
) -> Result<Json<Value>, Problem> {
    let after = page
        .after
        .as_deref()
        .map(|g| (page.after_partner.as_deref().unwrap_or(""), g));
    let groups = app.store.groups(after, limit(&page)).await?;
    let next = groups.last().map(|(_, g)| g.group_id.as_str().to_owned());
    let next_partner = groups.last().map(|(p, _)| p.clone());
    let groups: Vec<Value> = groups.iter().map(|(p, g)| group_json(p, g)).collect();
    Ok(Json(json!({
        "groups": groups,
        "next_after": next,
        "next_after_partner": next_partner,
    })))
}

pub async fn get_group(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<GroupQuery>,
) -> Result<Json<Value>, Problem> {
    let partner = query.partner.unwrap_or_default();
    match app.store.group(&partner, &id).await? {
        Some(g) => Ok(Json(group_json(&partner, &g))),
        None => Err(Problem(
            StatusCode::NOT_FOUND,
            "not-found",
            format!("no group {id}"),
        )),
    }
}

#[derive(Deserialize)]
pub struct InboxPage {
    after: Option<i64>,
    limit: Option<i64>,
}

/// The raw inbox, every topic: for operators only (applications read through subscriptions,
/// within their tokens' topics).
pub async fn read_inbox(
    State(app): State<AppState>,
    Query(page): Query<InboxPage>,
) -> Result<Json<Value>, Problem> {
    let entries = app
        .store
        .inbox(
            page.after.unwrap_or(0),
            page.limit.unwrap_or(100).clamp(1, 1000),
        )
        .await?;
    let next = entries.last().map(|e| e.offset);
    let messages: Vec<Value> = entries.iter().map(message_json).collect();
    Ok(Json(json!({ "messages": messages, "next_after": next })))
}

fn group_json(partner: &str, g: &GroupState) -> Value {
    let delivered: Vec<[u64; 2]> = g.delivered.pairs().iter().map(|&(a, b)| [a, b]).collect();
    let faults: Vec<Value> = g
        .faults
        .iter()
        .map(|(n, c)| json!({ "number": n, "fault": c.local_name() }))
        .collect();
    json!({
        "partner": partner,
        "group_id": g.group_id.as_str(),
        "channel": g.params.channel,
        "sequenced": g.params.sequenced,
        "ordered": g.params.message_order,
        "status": g.status.as_str(),
        "last": g.last,
        "delivered": delivered,
        "next_expected": g.params.message_order.then_some(g.next_expected),
        "buffered": g.buffered.keys().collect::<Vec<_>>(),
        "faults": faults,
        "max_expiry": date_time_string(&g.max_expiry),
        "last_activity": date_time_string(&g.last_activity),
        "terminated_at": g.terminated_at.as_ref().map(date_time_string),
    })
}
