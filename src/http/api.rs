//! The JSON API's vocabulary, shared by every `/api/v1` handler and the console: the problem
//! answer (`Problem`, described as `ProblemBody`), extractors whose refusals are problems
//! (`ApiPath`, `ApiQuery`, `json_body`; each also refuses text the store cannot hold, as
//! `input` checks it), and who called (`Caller`, checked from the bearer token by
//! `authorize`). A leaf of `http/`: it imports no handler file.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{FromRequestParts, Path, Query, RawPathParams};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use utoipa::ToSchema;

use super::AppState;
use super::input::{self, Unstorable};
use crate::config::{ApiToken, Scope};
use crate::delivery::filter::Filter;
use crate::store::StoreError;

/// Every JSON problem answer of `/api/v1`: a stable error kind and a reason for people.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProblemBody {
    /// A stable kind: `unauthorized`, `forbidden`, `invalid-field`, `not-found`, `conflict`, …
    pub error: &'static str,
    /// Why, for people; an invalid field's reason starts with the field's name.
    pub reason: String,
}

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

impl From<Unstorable> for Problem {
    fn from(e: Unstorable) -> Problem {
        Problem::field(&e.field, Unstorable::REASON.into())
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let Problem(status, error, reason) = self;
        (status, Json(ProblemBody { error, reason })).into_response()
    }
}

/// A JSON answer its handler wrote itself (a fetch's, with its payloads written by
/// `json_text`), or the 500 for an answer that could not be written.
pub fn json_written(written: serde_json::Result<Vec<u8>>) -> Response {
    match written {
        Ok(json) => {
            let content_type = HeaderValue::from_static("application/json");
            ([(header::CONTENT_TYPE, content_type)], json).into_response()
        }
        Err(e) => Problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "unwritable-answer",
            format!("the answer could not be written as JSON: {e}"),
        )
        .into_response(),
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

/// `Path`, but a segment that does not parse is a JSON problem (axum's own answer is
/// text/plain, which the API's clients and its OpenAPI document do not expect).
pub struct ApiPath<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        // Each segment by its name, before it becomes a typed value; one that does not
        // decode is left to `Path`'s refusal.
        if let Ok(raw) = RawPathParams::from_request_parts(parts, state).await {
            raw.iter()
                .try_for_each(|(name, value)| input::text(name, value))?;
        }
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(ApiPath(value)),
            Err(e) => Err(Problem::field("path", e.body_text())),
        }
    }
}

/// `Query`, but a parameter that does not parse is a JSON problem (as `ApiPath`).
pub struct ApiQuery<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        input::query(&parts.uri)?;
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(value)) => Ok(ApiQuery(value)),
            Err(e) => Err(Problem::field("query", e.body_text())),
        }
    }
}

/// Reads a JSON request body (an empty body as `{}`): a body that does not parse is a 400
/// naming `body`, whatever its media type (axum's `Json` answers 415/422 in text/plain); a
/// string the store cannot hold is a 400 naming its field.
pub fn json_body<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, Problem> {
    let bytes: &[u8] = if bytes.is_empty() { b"{}" } else { bytes };
    input::json_bytes(bytes)?;
    serde_json::from_slice(bytes).map_err(|e| Problem::field("body", e.to_string()))
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
    /// The principal whose outbound messages this caller sees: its own, or (`None`)
    /// everyone's for an operator.
    pub fn sees_outbound(&self) -> Option<&str> {
        (!self.admin).then_some(self.principal.as_str())
    }

    /// Whether every topic `filter` can match is within this caller's allow-list.
    pub fn may_consume(&self, filter: &str) -> bool {
        Filter::parse(filter).is_ok_and(|f| f.within(&self.topics))
    }
}

/// Checks the bearer token and that it carries one of `scopes`. The one place tokens are
/// checked; every `/api/v1` route runs it (in `router`'s guard) before reading the request.
pub async fn authorize(
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
    authorized_token(app, presented, scopes)
        .await
        .map(caller_of)
}

/// The configured API token `presented` is, if it has one of `scopes` (secrets compared in
/// constant time): 401 for an unknown token, 403 for one without the scope.
pub async fn authorized_token<'a>(
    app: &'a AppState,
    presented: &str,
    scopes: &[Scope],
) -> Result<&'a ApiToken, Problem> {
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
    Ok(token)
}

/// Who a configured token speaks for.
pub fn caller_of(token: &ApiToken) -> Caller {
    Caller {
        principal: token.principal.clone(),
        admin: token.scopes.contains(&Scope::Admin),
        // Checked when the configuration is loaded; one that is not valid allows nothing.
        topics: token
            .topics
            .iter()
            .filter_map(|t| Filter::parse(t).ok())
            .collect(),
    }
}
