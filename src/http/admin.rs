//! `/api/v1/*` for operators: callback endpoint registration, group inspection, and reading
//! the inbox (until subscriptions replace it for applications). JSON, bearer tokens with scopes.

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::api::{ApiPath, ApiQuery, Caller, Problem, ProblemBody, json_body};
use super::input;
use super::openapi::InboxMessage;
use crate::consume::view::message_json;
use crate::endpoint::check_endpoint;
use crate::outbound::http_client::redacted;
use crate::rmp::group::GroupState;
use crate::store::Endpoints;
use crate::wsr::datetime::date_time_string;

#[derive(Deserialize, ToSchema)]
pub struct EndpointBody {
    url: String,
    /// Callback endpoints only: the partner that may name it (absent: anonymous callers).
    partner: Option<String>,
    /// Push endpoints only, and required when registering: the principal whose push
    /// subscriptions may POST to it, or `*` for every principal. When unregistering: that
    /// principal's grant (absent: the webhook with all its grants).
    principal: Option<String>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EndpointQuery {
    /// The URL to unregister (or give it in a JSON body).
    url: String,
    /// Callback endpoints only: whose registration (absent: anonymous callers').
    partner: Option<String>,
    /// Push endpoints only: whose grant (absent: the webhook with all its grants).
    principal: Option<String>,
}

/// A registered endpoint; `partner` for callback endpoints only ("": anonymous callers),
/// `principal` for push endpoints only (`*`: every principal).
#[derive(Serialize, ToSchema)]
pub struct Registration {
    url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    partner: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    principal: Option<String>,
}

/// The registered endpoints: each URL once, and (callback endpoints) who may name each.
#[derive(Serialize, ToSchema)]
pub struct EndpointList {
    endpoints: Vec<String>,
    /// Who may use each: callback endpoints' partners, push endpoints' principals.
    #[serde(skip_serializing_if = "Option::is_none")]
    registrations: Option<Vec<Registration>>,
}

/// The registrations of one kind of endpoint, as routes: a named, documented handler per
/// route and method (`utoipa_axum::routes!` takes functions, not closures).
macro_rules! endpoint_routes {
    ($kind:expr, $path:literal, $what:literal, $list:ident, $add:ident, $remove:ident) => {
        #[utoipa::path(
            get,
            path = $path,
            tag = "admin",
            summary = concat!("List the registered ", $what),
            responses((status = 200, description = "The registered URLs", body = EndpointList))
        )]
        pub async fn $list(state: State<AppState>) -> Result<Json<EndpointList>, Problem> {
            list_endpoints($kind, state).await
        }

        #[utoipa::path(
            post,
            path = $path,
            tag = "admin",
            summary = concat!("Register one of the ", $what),
            request_body = EndpointBody,
            responses(
                (status = 201, description = "Registered", body = Registration),
                (status = 200, description = "Registered already", body = Registration),
                (status = 400, description = "Not a usable URL, or an unknown partner", body = ProblemBody),
            )
        )]
        pub async fn $add(
            caller: Extension<Caller>,
            state: State<AppState>,
            bytes: Bytes,
        ) -> Result<Response, Problem> {
            add_endpoint($kind, caller, state, bytes).await
        }

        #[utoipa::path(
            delete,
            path = $path,
            tag = "admin",
            summary = concat!("Unregister one of the ", $what),
            description = "The URL in the query, or (for URLs too long for a request line) in \
                           a JSON body `{\"url\": …, \"partner\": …}`.",
            params(EndpointQuery),
            request_body(content = Option<EndpointBody>),
            responses(
                (status = 204, description = "Unregistered"),
                (status = 400, description = "No URL, or two different ones", body = ProblemBody),
                (status = 404, description = "Not registered", body = ProblemBody),
            )
        )]
        pub async fn $remove(
            caller: Extension<Caller>,
            state: State<AppState>,
            uri: Uri,
            bytes: Bytes,
        ) -> Result<StatusCode, Problem> {
            remove_endpoint($kind, caller, state, uri, bytes).await
        }
    };
}

endpoint_routes!(
    Endpoints::Callback,
    "/api/v1/callback-endpoints",
    "callback endpoints",
    list_callback_endpoints,
    add_callback_endpoint,
    remove_callback_endpoint
);
endpoint_routes!(
    Endpoints::Push,
    "/api/v1/push-endpoints",
    "push endpoints",
    list_push_endpoints,
    add_push_endpoint,
    remove_push_endpoint
);

/// Whose registration of an endpoint a request names: a callback endpoint's partner (only a
/// configured one: a typo would register an endpoint nobody can use), or a push webhook's
/// principal (one a token of this configuration has, or `*`). `registering`: a push webhook
/// must name its principal — which applications may aim push subscriptions at a webhook is
/// the operator's decision, never a default.
fn registrant(
    app: &AppState,
    kind: Endpoints,
    partner: Option<String>,
    principal: Option<String>,
    registering: bool,
) -> Result<Option<String>, Problem> {
    match kind {
        Endpoints::Callback => {
            if principal.is_some() {
                return Err(Problem::field(
                    "principal",
                    "callback endpoints belong to partners, not principals".into(),
                ));
            }
            if let Some(name) = &partner
                && registering
                && app.config.partners.get(name).is_none()
            {
                return Err(Problem::field(
                    "partner",
                    format!("{name:?} is not a configured partner"),
                ));
            }
            Ok(partner)
        }
        Endpoints::Push => {
            if partner.is_some() {
                return Err(Problem::field(
                    "partner",
                    "push endpoints belong to no partner; name a principal".into(),
                ));
            }
            match principal {
                None if registering => Err(Problem::field(
                    "principal",
                    "name the principal whose push subscriptions may use it (\"*\": every \
                     principal)"
                        .into(),
                )),
                Some(name)
                    if registering
                        && name != "*"
                        && !app.config.tokens.iter().any(|t| t.principal == name) =>
                {
                    Err(Problem::field(
                        "principal",
                        format!("{name:?} is no principal of a configured token"),
                    ))
                }
                principal => Ok(principal),
            }
        }
    }
}

pub async fn add_endpoint(
    kind: Endpoints,
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    bytes: Bytes,
) -> Result<Response, Problem> {
    let body: EndpointBody = json_body(&bytes)?;
    check_endpoint(&body.url).map_err(|e| Problem::field("url", e.to_string()))?;
    let whose = registrant(&app, kind, body.partner, body.principal, true)?;
    let created = app
        .store
        .add_endpoint(kind, whose.as_deref(), &body.url, app.clock.now())
        .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let detail = endpoint_audit_detail(kind, whose.as_deref(), created);
    let action = endpoint_action(kind, "register");
    let target = redacted(&body.url);
    super::audit::note(&app, &caller.principal, &action, &target, detail).await;
    let answer = match kind {
        Endpoints::Callback => Registration {
            url: body.url,
            partner: Some(whose.unwrap_or_default()),
            principal: None,
        },
        Endpoints::Push => Registration {
            url: body.url,
            partner: None,
            principal: whose,
        },
    };
    Ok((status, Json(answer)).into_response())
}

pub async fn list_endpoints(
    kind: Endpoints,
    State(app): State<AppState>,
) -> Result<Json<EndpointList>, Problem> {
    let endpoints = app.store.endpoints(kind).await?;
    if kind == Endpoints::Push {
        // Each URL once in `endpoints`; whose push subscriptions may use it in `registrations`.
        let registrations = app
            .store
            .push_grants()
            .await?
            .into_iter()
            .map(|(principal, url)| Registration {
                url,
                partner: None,
                principal: Some(principal),
            })
            .collect();
        return Ok(Json(EndpointList {
            endpoints,
            registrations: Some(registrations),
        }));
    }
    // Each URL once in `endpoints`; who may name it in `registrations` ("" : anonymous).
    let registrations = app
        .store
        .callback_endpoints()
        .await?
        .into_iter()
        .map(|(partner, url)| Registration {
            url,
            partner: Some(partner),
            principal: None,
        })
        .collect();
    Ok(Json(EndpointList {
        endpoints,
        registrations: Some(registrations),
    }))
}

/// `DELETE …?url=…`, or with the URL in a JSON body `{"url": …}` (for URLs too long for a
/// request line: whatever could be registered can be removed).
pub async fn remove_endpoint(
    kind: Endpoints,
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    uri: Uri,
    body: Bytes,
) -> Result<StatusCode, Problem> {
    // Read here rather than by `ApiQuery` and `json_body` (either may hold the URL): checked
    // as they check.
    input::query(&uri)?;
    input::json_bytes(&body)?;
    let from_query = match uri.query() {
        None | Some("") => None,
        Some(_) => {
            let q = Query::<EndpointQuery>::try_from_uri(&uri)
                .map_err(|e| Problem::field("url", e.body_text()))?
                .0;
            Some((q.url, q.partner, q.principal))
        }
    };
    let from_body = if body.is_empty() {
        None
    } else {
        let body: EndpointBody =
            serde_json::from_slice(&body).map_err(|e| Problem::field("body", e.to_string()))?;
        Some((body.url, body.partner, body.principal))
    };
    let (url, partner, principal) = match (from_query, from_body) {
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
    // Any partner or principal name: one removed from the configuration may leave
    // registrations.
    let whose = registrant(&app, kind, partner, principal, false)?;
    if app
        .store
        .remove_endpoint(kind, whose.as_deref(), &url)
        .await?
    {
        let detail = endpoint_audit_detail(kind, whose.as_deref(), true);
        let action = endpoint_action(kind, "unregister");
        super::audit::note(&app, &caller.principal, &action, &redacted(&url), detail).await;
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(Problem(
            StatusCode::NOT_FOUND,
            "not-found",
            format!("{url} is not registered"),
        ))
    }
}

/// `register_callback_endpoint`, `unregister_push_endpoint`, … (the audit trail's words).
fn endpoint_action(kind: Endpoints, verb: &str) -> String {
    match kind {
        Endpoints::Callback => format!("{verb}_callback_endpoint"),
        Endpoints::Push => format!("{verb}_push_endpoint"),
    }
}

/// For whom an endpoint was registered or unregistered, for the audit trail.
fn endpoint_audit_detail(kind: Endpoints, whose: Option<&str>, changed: bool) -> Option<String> {
    let whose = match (kind, whose) {
        (Endpoints::Callback, Some(p)) if !p.is_empty() => format!("partner {p}"),
        (Endpoints::Callback, _) => "anonymous partners".to_owned(),
        (Endpoints::Push, Some(p)) => format!("principal {p}"),
        (Endpoints::Push, None) => "every principal".to_owned(),
    };
    Some(if changed {
        format!("for {whose}")
    } else {
        format!("for {whose} (registered already)")
    })
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct Page {
    /// The groupId to list after (the previous page's `next_after`).
    after: Option<String>,
    /// The partner of the `after` group ("" when absent: anonymous callers' groups).
    after_partner: Option<String>,
    /// 1 to 1000 (default 100; values beyond are clamped).
    limit: Option<i64>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct GroupQuery {
    /// Whose group (absent: an anonymous caller's).
    partner: Option<String>,
}

fn limit(page: &Page) -> i64 {
    page.limit.unwrap_or(100).clamp(1, 1000)
}

/// A page of groups.
#[derive(Serialize, ToSchema)]
pub struct GroupList {
    groups: Vec<GroupView>,
    /// Give as `after` (and `next_after_partner` as `after_partner`) for the next page.
    next_after: Option<String>,
    next_after_partner: Option<String>,
}

#[utoipa::path(
    get,
    path = "/api/v1/groups",
    tag = "admin",
    summary = "List received groups with their state",
    params(Page),
    responses(
        (status = 200, description = "A page of groups, by (partner, groupId)", body = GroupList),
        (status = 400, description = "A query parameter that does not parse", body = ProblemBody),
    )
)]
pub async fn list_groups(
    State(app): State<AppState>,
    ApiQuery(page): ApiQuery<Page>,
) -> Result<Json<GroupList>, Problem> {
    let after = page
        .after
        .as_deref()
        .map(|g| (page.after_partner.as_deref().unwrap_or(""), g));
    let groups = app.store.groups(after, limit(&page)).await?;
    let next = groups.last().map(|(_, g)| g.group_id.as_str().to_owned());
    let next_partner = groups.last().map(|(p, _)| p.clone());
    let policy = app.store.policy();
    let groups = groups
        .iter()
        .map(|(p, g)| group_view(p, g, policy))
        .collect();
    Ok(Json(GroupList {
        groups,
        next_after: next,
        next_after_partner: next_partner,
    }))
}

#[utoipa::path(
    get,
    path = "/api/v1/groups/{id}",
    tag = "admin",
    summary = "One received group: status, delivered ranges, buffered numbers, faults",
    params(("id" = String, Path, description = "The groupId"), GroupQuery),
    responses(
        (status = 200, description = "The group", body = GroupView),
        (status = 400, description = "A parameter that does not parse", body = ProblemBody),
        (status = 404, description = "No such group of that partner", body = ProblemBody),
    )
)]
pub async fn get_group(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<GroupQuery>,
) -> Result<Json<GroupView>, Problem> {
    let partner = query.partner.unwrap_or_default();
    match app.store.group(&partner, &id).await? {
        Some(g) => Ok(Json(group_view(&partner, &g, app.store.policy()))),
        None => Err(Problem(
            StatusCode::NOT_FOUND,
            "not-found",
            format!("no group {id}"),
        )),
    }
}

#[utoipa::path(
    post,
    path = "/api/v1/groups/{id}/abort",
    tag = "admin",
    summary = "Abort a stuck received group (D7): its buffered messages are discarded",
    description = "For an ordered group whose gap will not fill: what the gateway does itself \
                   when a buffered message expires — the messages buffered for the gap are \
                   discarded, never delivered (their senders are told `GroupAborted` by \
                   callback where they asked for one), only the contiguous prefix from 0 stays \
                   delivered, and every later message of the group gets `GroupAborted`.",
    params(("id" = String, Path, description = "The groupId"), GroupQuery),
    responses(
        (status = 200, description = "Aborted; the group as it is now", body = GroupView),
        (status = 400, description = "A parameter that does not parse", body = ProblemBody),
        (status = 404, description = "No such group of that partner", body = ProblemBody),
        (status = 409, description = "It ended already, or is a singleton", body = ProblemBody),
    )
)]
pub async fn abort_group(
    axum::Extension(caller): axum::Extension<super::api::Caller>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<GroupQuery>,
) -> Result<Json<GroupView>, Problem> {
    let partner = query.partner.unwrap_or_default();
    let not_found = || Problem(StatusCode::NOT_FOUND, "not-found", format!("no group {id}"));
    if app.store.group(&partner, &id).await?.is_none() {
        return Err(not_found());
    }
    if !app
        .store
        .abort_group(&partner, &id, app.clock.now())
        .await?
    {
        return Err(Problem(
            StatusCode::CONFLICT,
            "conflict",
            format!("group {id} has ended already (or is a singleton): nothing to abort"),
        ));
    }
    let target = format!(
        "{}/{id}",
        crate::outbound::partner_report::shown_partner(&partner)
    );
    super::audit::note(&app, &caller.principal, "abort_group", &target, None).await;
    match app.store.group(&partner, &id).await? {
        Some(g) => Ok(Json(group_view(&partner, &g, app.store.policy()))),
        None => Err(not_found()),
    }
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct InboxPage {
    /// The offset to read after (the previous page's `next_after`; default 0).
    after: Option<i64>,
    /// 1 to 1000 (default 100; values beyond are clamped).
    limit: Option<i64>,
}

/// A page of delivered messages.
#[derive(Serialize, ToSchema)]
pub struct InboxPageAnswer {
    #[schema(value_type = Vec<InboxMessage>)]
    messages: Vec<Value>,
    /// Give as `after` for the next page.
    next_after: Option<i64>,
}

/// The raw inbox, every topic: for operators only (applications read through subscriptions,
/// within their tokens' topics).
#[utoipa::path(
    get,
    path = "/api/v1/inbox",
    tag = "admin",
    summary = "Read the inbox (every topic) in order",
    params(InboxPage),
    responses(
        (status = 200, description = "A page of delivered messages", body = InboxPageAnswer),
        (status = 400, description = "A query parameter that does not parse", body = ProblemBody),
    )
)]
pub async fn read_inbox(
    State(app): State<AppState>,
    ApiQuery(page): ApiQuery<InboxPage>,
) -> Result<Json<InboxPageAnswer>, Problem> {
    let entries = app
        .store
        .inbox(
            page.after.unwrap_or(0),
            page.limit.unwrap_or(100).clamp(1, 1000),
        )
        .await?;
    let next = entries.last().map(|e| e.offset);
    let messages = entries.iter().map(message_json).collect();
    Ok(Json(InboxPageAnswer {
        messages,
        next_after: next,
    }))
}

/// A received group's state.
#[derive(Serialize, ToSchema)]
pub struct GroupView {
    /// "" for anonymous callers.
    partner: String,
    group_id: String,
    channel: String,
    sequenced: bool,
    ordered: bool,
    status: &'static str,
    /// The number of the group's last message, once known.
    last: Option<u64>,
    /// Delivered numbers as inclusive ranges `[from, to]`.
    delivered: Vec<[u64; 2]>,
    /// Ordered groups only.
    next_expected: Option<u64>,
    /// Numbers received ahead of a gap, waiting.
    buffered: Vec<u64>,
    faults: Vec<GroupFault>,
    max_expiry: String,
    last_activity: String,
    terminated_at: Option<String>,
    /// While open: when its time limit ends it (`groupExpiryTime` or the idle limit).
    ends_at: Option<String>,
    /// While open with messages buffered for a gap: when it is aborted unless the gap fills
    /// (D7: the earliest of their ExpiryTime and its time limit).
    aborts_at: Option<String>,
}

/// A message of a group that was faulted, and its WS-R fault code.
#[derive(Serialize, ToSchema)]
pub struct GroupFault {
    number: u64,
    fault: &'static str,
}

fn group_view(partner: &str, g: &GroupState, policy: &crate::rmp::group::Policy) -> GroupView {
    let open = g.status == crate::rmp::group::GroupStatus::Open;
    GroupView {
        ends_at: g
            .time_limit(policy)
            .filter(|_| open)
            .as_ref()
            .map(date_time_string),
        aborts_at: g.aborts_at(policy).as_ref().map(date_time_string),
        partner: partner.to_owned(),
        group_id: g.group_id.as_str().to_owned(),
        channel: g.params.channel.clone(),
        sequenced: g.params.sequenced,
        ordered: g.params.message_order,
        status: g.status.as_str(),
        last: g.last,
        delivered: g.delivered.pairs().iter().map(|&(a, b)| [a, b]).collect(),
        next_expected: g.params.message_order.then_some(g.next_expected),
        buffered: g.buffered.keys().copied().collect(),
        faults: g
            .faults
            .iter()
            .map(|(n, c)| GroupFault {
                number: *n,
                fault: c.local_name(),
            })
            .collect(),
        max_expiry: date_time_string(&g.max_expiry),
        last_activity: date_time_string(&g.last_activity),
        terminated_at: g.terminated_at.as_ref().map(date_time_string),
    }
}
