//! The OpenAPI 3.1 document of `/api/v1`, served at `GET /api/v1/openapi.json`. Each route is
//! registered and documented by one call (`utoipa_axum::routes!` in `super::router`), and its
//! security and guard answers are written from the same scopes its guard checks (`guarded`),
//! so the document cannot name a route, method or scope the router does not have. Describes;
//! decides nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Extension;
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::Value;
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Content, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{IntoResponses, Modify, OpenApi, ToSchema};

use super::api::ProblemBody;
use crate::config::Scope;

/// The name of the bearer scheme in `components.securitySchemes`.
const BEARER: &str = "bearer";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "wsr-gateway API",
        description = "The JSON API of wsr-gateway: submit and follow outbound WS-Reliability \
                       messages (produce), consume delivered ones through subscriptions \
                       (consume), and operate the gateway (admin). Every route but this \
                       document needs `Authorization: Bearer <token>`; a route's `security` \
                       lists the scopes that may call it (any one of them suffices)."
    ),
    modifiers(&BearerScheme),
    // StateEvent, ResponseEvent: named by no JSON answer (it is the data of each event of a stream), so
    // listed here to be in the document at all.
    components(schemas(
        ProblemBody,
        super::events::StateEvent,
        super::events::ResponseEvent
    ))
)]
pub struct ApiDoc;

/// The bearer scheme; the scopes a route needs are given per operation (OpenAPI 3.1 lets a
/// non-OAuth scheme name roles there).
struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An API token from the configuration ([[tokens]] or WSR_TOKENS); its \
                         scopes are produce, consume and admin.",
                    ))
                    .build(),
            ),
        );
    }
}

/// A JSON problem response, described once and referenced.
fn problem(description: &str) -> RefOr<Response> {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            Content::new(Some(Ref::from_schema_name(ProblemBody::name()))),
        )
        .into()
}

/// What any guarded route may answer besides its own answers: the guard's 401 and 403, and
/// the store's 503.
pub struct Guarded;

impl IntoResponses for Guarded {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        BTreeMap::from([
            (
                "401".to_owned(),
                problem("No bearer token, or one that is not configured"),
            ),
            (
                "403".to_owned(),
                problem(
                    "The token lacks the scope this route needs, or the resource is not the caller's",
                ),
            ),
            (
                "503".to_owned(),
                problem("The store could not answer; try again"),
            ),
        ])
    }
}

/// The security of an operation guarded by `scopes`: any one of them (one requirement each).
fn security(scopes: &[Scope]) -> Vec<SecurityRequirement> {
    scopes
        .iter()
        .map(|s| SecurityRequirement::new(BEARER, [scope_name(*s)]))
        .collect()
}

/// A scope as the configuration spells it.
pub fn scope_name(scope: Scope) -> &'static str {
    match scope {
        Scope::Admin => "admin",
        Scope::Produce => "produce",
        Scope::Consume => "consume",
    }
}

/// Writes the guard into the documentation of `routes`: each operation's security from
/// `scopes`, and the guard's answers (`Guarded`) among its responses.
pub fn document_guard(routes: &mut utoipa::openapi::path::Paths, scopes: &'static [Scope]) {
    for item in routes.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for operation in operations.into_iter().flatten() {
            operation.security = Some(security(scopes));
            for (status, response) in Guarded::responses() {
                operation
                    .responses
                    .responses
                    .entry(status)
                    .or_insert(response);
            }
        }
    }
}

/// The document, serialized once when the router is built.
#[derive(Clone)]
pub struct Document(pub Arc<str>);

/// The OpenAPI 3.1 document of this API. Public: it is the shape of the API, no secret.
#[utoipa::path(
    get,
    path = "/api/v1/openapi.json",
    tag = "meta",
    responses((status = 200, description = "This document", content_type = "application/json", body = Object))
)]
pub async fn openapi_json(Extension(Document(json)): Extension<Document>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        json.to_string(),
    )
}

/// A submit's `agreement`: the name of a configured agreement, or one inline (the keys of an
/// `[agreements.NAME]` table of the configuration).
pub fn agreement_schema() -> Schema {
    OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::String))
        .item(ObjectBuilder::new().schema_type(Type::Object))
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .into()
}

// Shapes built outside `http/` (by `outbound::view`, `delivery`, `delivery::subscription`),
// described here so that those rooms need no OpenAPI dependency; the `openapi` integration
// test and `.ci/openapi-check` hold real answers against them.

// A submission: a description of `outbound::submit::SubmitRequest`, whose serde attributes
// these repeat (so that the two describe one shape).
#[derive(serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // a description only: the request is read by outbound::submit
pub struct SubmitBody {
    /// A URL, or the name of a partner in the configuration.
    destination: String,
    /// The name of an agreement in the configuration, or one given inline.
    #[serde(default)]
    #[schema(schema_with = agreement_schema)]
    agreement: Option<Value>,
    #[serde(default)]
    group: Option<GroupRef>,
    /// `1.1` (default) or `1.2`.
    #[serde(default)]
    soap_version: Option<String>,
    /// The SOAP Body's content: well-formed XML, no envelope parts.
    body: String,
    /// A registered push endpoint to POST the message's fate to.
    #[serde(default)]
    notify_url: Option<String>,
}

#[derive(serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // a description only: `outbound::submit::GroupRef`
struct GroupRef {
    /// An existing group to continue; absent = a new group.
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    last: bool,
}

/// An outbound message and its fate (`outbound::view::message_json`).
#[derive(ToSchema)]
#[allow(dead_code)] // a description only: the answer is written by outbound::view
pub struct OutboundMessage {
    id: String,
    group_id: String,
    number: Option<u64>,
    destination: String,
    /// The configured partner it goes to ("" for a URL destination).
    partner: String,
    /// `Response`, `Callback` or `Poll`.
    reply_pattern: String,
    /// `1.1` or `1.2`.
    soap_version: String,
    /// `queued`, `sent`, `acked`, `faulted` or `failed`.
    state: String,
    /// The WS-R fault code of a faulted message.
    fault: Option<String>,
    /// Why a failed message failed.
    reason: Option<String>,
    attempts: u32,
    expiry: String,
    /// When the next send is due (null once final, and while in doubt).
    next_attempt: Option<String>,
    /// Sent, no verdict, nothing more to send: only a poll (or an operator) settles it.
    in_doubt: bool,
    /// While in doubt: when it fails as "delivery unknown" unless a poll answer settles it.
    doubt_ends_at: Option<String>,
    /// When a poll last asked about it.
    last_poll_at: Option<String>,
    /// When the next poll asks about it (null: the next poll pass, or no poll will).
    next_poll_at: Option<String>,
    submitted_at: String,
    /// When it became acked, faulted or failed.
    finished_at: Option<String>,
    /// Its attempts and polls.
    attempts_url: String,
    idempotency_key: Option<String>,
    /// The latest failed attempt's cause (kept after a later success).
    last_error: Option<String>,
    last_error_at: Option<String>,
    /// The partner's business response, if one was kept (null: none).
    response: Option<super::events::OutboundResponse>,
}

/// A partner as the operator sees it (`outbound::partner_report::report_json`).
#[derive(ToSchema)]
#[allow(dead_code)] // a description only: the answer is written by report_json
pub struct PartnerView {
    /// Its configured name, or `anonymous`.
    name: String,
    /// Its configuration without secrets (null for `anonymous`).
    configured: Option<PartnerConfigured>,
    /// When an attempt or poll to it last got an answer.
    last_success_at: Option<String>,
    /// Its latest failed exchange's cause (kept after a later success), and when.
    last_error: Option<String>,
    last_error_at: Option<String>,
    /// Exchanges with it that failed since the last answer.
    failures_in_row: u64,
    /// Our messages to it by state: queued, sent (in doubt included), in_doubt, acked,
    /// faulted, failed.
    messages: std::collections::BTreeMap<String, u64>,
    /// Whether `messages.in_doubt` is a floor.
    in_doubt_is_floor: bool,
    callback_acks_owed: u64,
    /// Sign-ins refused for it on this gateway since it started.
    refused_sign_ins: RefusedSignIns,
    /// `anonymous` only: sign-ins refused for usernames nobody has.
    refused_unknown_usernames: Option<RefusedSignIns>,
}

/// What the configuration says of a partner, without secrets.
#[derive(ToSchema)]
#[allow(dead_code)] // a description only
pub struct PartnerConfigured {
    channels: Vec<String>,
    /// How it proves itself: basic, bearer, certificate, username_token.
    credentials: Vec<String>,
    /// Where we send to it (without userinfo or query).
    address: Option<String>,
    poll_address: Option<String>,
    agreement: Option<String>,
    send_window: Option<u64>,
    /// What we present to it: basic, bearer, username_token, client_certificate.
    our_credentials: Vec<String>,
}

/// Refused sign-ins: how many, the latest, and the username it tried.
#[derive(ToSchema)]
#[allow(dead_code)] // a description only
pub struct RefusedSignIns {
    count: u64,
    last_at: Option<String>,
    /// At most 64 characters, control characters removed.
    last_username: Option<String>,
    last_reason: Option<String>,
}

/// An outbound message's kept attempts (`outbound::view::attempts_json`).
#[derive(ToSchema)]
#[allow(dead_code)] // a description only: the answer is written by attempts_json
pub struct AttemptList {
    /// How many there were.
    total: u64,
    /// How many were dropped between the first 5 and the latest 20.
    omitted: u64,
    attempts: Vec<Attempt>,
}

/// One send of a message, or one poll that asked about it.
#[derive(ToSchema)]
#[allow(dead_code)] // a description only
pub struct Attempt {
    /// Its number among the message's attempts, from 1.
    n: u64,
    /// `send` or `poll`.
    kind: String,
    at: String,
    /// The partner's HTTP status (null: no answer came).
    status: Option<u16>,
    /// What the answer said of this message: `ack`, `fault` or `none`.
    verdict: String,
    /// The WS-R fault code of a `fault` verdict.
    fault: Option<String>,
    /// Why it came to nothing, if it did (as `last_error`).
    cause: Option<String>,
}

/// A delivered message as applications see it (`consume::view::MessageView`).
#[derive(ToSchema)]
#[allow(dead_code)] // a description only: the answer is written by consume::view::MessageView
pub struct InboxMessage {
    offset: i64,
    partner: String,
    channel: String,
    topic: String,
    group_id: String,
    number: Option<u64>,
    /// The SOAP Body's content, as XML text.
    payload: String,
    /// The namespace declarations in scope of the payload, as `[prefix, URI]` pairs (null
    /// only for a stored row that cannot be read back).
    namespaces: Option<Vec<[String; 2]>>,
    received_at: String,
    expiry: String,
}

/// A subscription request (`delivery::subscription::CreateRequest`); every field but the
/// name has a default.
#[derive(ToSchema)]
#[allow(dead_code)] // a description only: the request is read as a CreateRequest
pub struct SubscriptionRequest {
    /// A plain name, or `$share/{share}/{filter}`.
    name: String,
    /// A topic filter (`+` one level, `#` the rest); default `#`.
    filter: Option<String>,
    /// `pull` (default) or `push`.
    mode: Option<String>,
    /// Push mode: a registered push endpoint.
    push_url: Option<String>,
    push_concurrency: Option<u32>,
    /// Push mode: `json` (default: the message as fetched, plus `attempt`) or `soap` (a SOAP
    /// envelope in the message's version around its Body as received, without WS-R blocks,
    /// with `WSR-Group-Id` and, when sequenced, `WSR-Sequence-Number` headers; a SOAP Fault
    /// in the answer rejects the message).
    push_format: Option<String>,
    /// `unsettled` (default) or `settled`.
    settle_mode: Option<String>,
    /// `accepted`, `rejected`, `released` or `modified`.
    default_outcome: Option<String>,
    ack_wait_ms: Option<u64>,
    max_deliveries: Option<u32>,
    backoff_ms: Option<Vec<u64>>,
    /// `none` or `group`.
    ordering: Option<String>,
    durable: Option<bool>,
    /// `new` (default) or `oldest`.
    start: Option<String>,
}

/// A subscription with its checked rules (`http::subscriptions::subscription_json`).
#[derive(ToSchema)]
#[allow(dead_code)] // a description only: the answer is written from the store's Rules
pub struct Subscription {
    id: i64,
    name: String,
    filter: String,
    owner: String,
    grants: Vec<String>,
    created_at: String,
    /// `pull` or `push`.
    mode: String,
    /// Push mode only.
    url: Option<String>,
    /// Push mode only.
    concurrency: Option<u32>,
    /// Push mode only: `json` or `soap`.
    format: Option<String>,
    settle_mode: String,
    default_outcome: String,
    ack_wait_ms: u64,
    max_deliveries: u32,
    backoff_ms: Vec<u64>,
    ordering: String,
    durable: bool,
    /// `GET /api/v1/subscriptions/{id}` only.
    backlog: Option<Backlog>,
}

/// How many of a subscription's messages are in each state.
#[derive(ToSchema)]
#[allow(dead_code)] // a description only: written by http::subscriptions::get
pub struct Backlog {
    waiting: u64,
    in_flight: u64,
    dead_letters: u64,
    unmatched: u64,
    /// Its members' sessions.
    members: u64,
}
