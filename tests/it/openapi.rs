//! The OpenAPI document of `/api/v1` (issue 16): served without a token, OpenAPI 3.1, naming
//! every route and method the router has (and no other) with the scopes its guard checks, and
//! describing the answers the running gateway really gives.

use std::collections::BTreeSet;

use reqwest::Method;
use serde_json::{Value, json};
use wsr_gateway::config::{ApiToken, Config, Scope, all_topics};
use wsr_gateway::rmp::agreement::Agreement;

use super::support::{TestApp, repo_root, spawn_app_with};

const ADMIN: &str = "openapi-admin-token-00001";
const PRODUCE: &str = "openapi-produce-token-0002";
const CONSUME: &str = "openapi-consume-token-0003";

fn token(secret: &str, principal: &str, scope: Scope) -> ApiToken {
    ApiToken {
        secret: wsr_gateway::secrets::Stored::Plain(wsr_gateway::secrets::Secret::new(secret)),
        principal: principal.into(),
        scopes: vec![scope],
        topics: all_topics(),
    }
}

fn configure(c: &mut Config) {
    c.tokens = vec![
        token(ADMIN, "operator", Scope::Admin),
        token(PRODUCE, "app", Scope::Produce),
        token(CONSUME, "app", Scope::Consume),
    ];
    // A channel anyone may send to, to have something delivered.
    c.channels.insert("orders".into(), Agreement::everything());
    c.anonymous_channels.insert("orders".into());
    // A partner nobody listens at (the discard port, refused locally): submits are stored.
    c.partners
        .insert_address("nowhere", "http://127.0.0.1:9/wsr");
}

async fn document(app: &TestApp) -> Value {
    let r = app
        .client
        .get(app.url("/api/v1/openapi.json"))
        .send()
        .await
        .expect("the gateway answers");
    assert_eq!(r.status().as_u16(), 200, "served without a token");
    let content_type = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert_eq!(content_type, "application/json");
    let text = r.text().await.expect("a body");
    serde_json::from_str(&text).expect("the document is JSON")
}

const METHODS: [&str; 5] = ["get", "put", "post", "delete", "patch"];

/// Every (METHOD, path template) the document names.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut found = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in METHODS {
            if item.get(method).is_some() {
                found.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    found
}

/// Whether a concrete path (query dropped) fits a template such as `/a/{id}/b`.
fn fits(template: &str, path: &str) -> bool {
    let path = path.split('?').next().unwrap_or(path);
    let (t, p): (Vec<&str>, Vec<&str>) = (template.split('/').collect(), path.split('/').collect());
    t.len() == p.len()
        && t.iter()
            .zip(&p)
            .all(|(t, p)| (t.starts_with('{') && t.ends_with('}')) || t == p)
}

/// A request to `template` with every path parameter filled in, and no query or body.
fn concrete(template: &str) -> String {
    template
        .split('/')
        .map(|s| if s.starts_with('{') { "1" } else { s })
        .collect::<Vec<_>>()
        .join("/")
}

#[tokio::test]
async fn the_document_is_openapi_3_1_served_without_a_token_and_names_every_api_route() {
    let app = spawn_app_with(configure).await;
    let doc = document(&app).await;
    let version = doc["openapi"].as_str().unwrap_or_default();
    assert!(version.starts_with("3.1."), "openapi: {version}");
    let bearer = &doc["components"]["securitySchemes"]["bearer"];
    assert_eq!(
        (&bearer["type"], &bearer["scheme"]),
        (&json!("http"), &json!("bearer"))
    );
    let events = &doc["paths"]["/api/v1/events"]["get"]["responses"]["200"]["content"];
    assert!(
        events["text/event-stream"].is_object(),
        "the event stream is documented as one: {events}"
    );
    assert!(doc["components"]["schemas"]["StateEvent"].is_object());
    assert!(doc["components"]["schemas"]["ResponseEvent"].is_object());
    let message = &doc["components"]["schemas"]["OutboundMessage"]["properties"];
    assert!(
        message["response"].is_object(),
        "the response field: {message}"
    );
    let response = &doc["paths"]["/api/v1/messages/{id}/response"]["get"]["responses"];
    assert!(
        response["200"]["content"]["multipart/related"].is_object(),
        "served as received: {response}"
    );

    // The same routes as the table the access tests walk (api_security.rs), no more, no
    // fewer: a route added to one and not the other fails here.
    let documented = operations(&doc);
    let table = super::api_security::routes();
    let mut missing = Vec::new();
    for (method, path, _) in &table {
        if !documented
            .iter()
            .any(|(m, t)| m == method.as_str() && fits(t, path))
        {
            missing.push(format!("{method} {path}"));
        }
    }
    assert!(missing.is_empty(), "not in the document: {missing:?}");
    let unlisted: Vec<_> = documented
        .iter()
        .filter(|(m, t)| {
            t != "/api/v1/openapi.json"
                && !table
                    .iter()
                    .any(|(method, path, _)| method.as_str() == m && fits(t, path))
        })
        .collect();
    assert!(
        unlisted.is_empty(),
        "documented, but not in api_security::routes(): {unlisted:?}"
    );
}

#[tokio::test]
async fn each_documented_route_is_guarded_by_exactly_the_scopes_it_documents() {
    let app = spawn_app_with(configure).await;
    let doc = document(&app).await;
    let mut wrong = Vec::new();
    for (method, template) in operations(&doc) {
        let operation = &doc["paths"][&template][method.to_lowercase()];
        let path = concrete(&template);
        let method = Method::from_bytes(method.as_bytes()).expect("a method");
        if template == "/api/v1/openapi.json" {
            assert!(operation.get("security").is_none(), "public");
            continue;
        }
        // The scopes the document names: any one of them suffices.
        let scopes: BTreeSet<&str> = operation["security"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|r| r["bearer"].as_array().into_iter().flatten())
            .filter_map(Value::as_str)
            .collect();
        for status in ["401", "403"] {
            if operation["responses"].get(status).is_none() {
                wrong.push(format!("{method} {template}: {status} not documented"));
            }
        }
        for (token, scope) in [
            (None, ""),
            (Some(ADMIN), "admin"),
            (Some(PRODUCE), "produce"),
            (Some(CONSUME), "consume"),
        ] {
            let mut r = app.client.request(method.clone(), app.url(&path));
            if let Some(t) = token {
                r = r.bearer_auth(t);
            }
            // The guard answers before anything is read; past it, the handler answers (an
            // event stream's head is enough: the body is not read).
            let status = r.send().await.expect("API answers").status().as_u16();
            let expected = match token {
                None => Some(401),
                Some(_) if !scopes.contains(scope) => Some(403),
                Some(_) => None,
            };
            let fine = match expected {
                Some(code) => status == code,
                // Nothing these requests name exists, so no handler refuses with 403 either.
                None => status != 401 && status != 403,
            };
            if !fine {
                wrong.push(format!(
                    "{method} {template} as {scope:?}: {status}, documented scopes {scopes:?}"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn no_api_route_is_registered_beside_the_documented_router() {
    // `routes!` registers and documents in one call; a plain `.route("/api/v1…")` would
    // register without documenting. Whitespace is ignored so a wrapped call is caught too.
    let mut found = Vec::new();
    let mut dirs = vec![repo_root().join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src is readable") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("a source file");
                let squeezed: String = text.chars().filter(|c| !c.is_whitespace()).collect();
                for needle in [".route(\"/api/", ".nest(\"/api/", ".route_service(\"/api/"] {
                    if squeezed.contains(needle) {
                        found.push(format!("{}: {needle}", path.display()));
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "register /api routes with routes! in http::api: {found:?}"
    );
}

/// Checks `value` against `schema` (the subset of JSON Schema utoipa writes: $ref, type,
/// properties, required, items, oneOf, allOf, additionalProperties); the mismatches, with
/// where.
fn mismatches(doc: &Value, schema: &Value, value: &Value, at: &str, out: &mut Vec<String>) {
    if let Some(reference) = schema["$ref"].as_str() {
        let name = reference.trim_start_matches("#/components/schemas/");
        let target = &doc["components"]["schemas"][name];
        assert!(!target.is_null(), "{reference} is not in the document");
        return mismatches(doc, target, value, at, out);
    }
    if let Some(parts) = schema["allOf"].as_array() {
        // A flattened struct: one object with the properties and requirements of all parts.
        let mut merged = json!({ "type": "object", "properties": {}, "required": [] });
        for part in parts {
            let mut part = part;
            while let Some(reference) = part["$ref"].as_str() {
                part = &doc["components"]["schemas"]
                    [reference.trim_start_matches("#/components/schemas/")];
            }
            for (name, property) in part["properties"].as_object().into_iter().flatten() {
                merged["properties"][name] = property.clone();
            }
            for name in part["required"].as_array().into_iter().flatten() {
                if let Some(required) = merged["required"].as_array_mut() {
                    required.push(name.clone());
                }
            }
        }
        return mismatches(doc, &merged, value, at, out);
    }
    if let Some(options) = schema["oneOf"].as_array() {
        let fitting = options
            .iter()
            .filter(|o| {
                let mut inner = Vec::new();
                mismatches(doc, o, value, at, &mut inner);
                inner.is_empty()
            })
            .count();
        if fitting != 1 {
            out.push(format!("{at}: fits {fitting} of oneOf, not 1: {value}"));
        }
        return;
    }
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let is = |t: &str| match (t, value) {
        ("null", Value::Null)
        | ("boolean", Value::Bool(_))
        | ("string", Value::String(_))
        | ("array", Value::Array(_))
        | ("object", Value::Object(_))
        | ("number", Value::Number(_)) => true,
        ("integer", Value::Number(n)) => n.is_i64() || n.is_u64(),
        _ => false,
    };
    if !types.is_empty() && !types.iter().any(|t| is(t)) {
        out.push(format!("{at}: {value} is not {types:?}"));
        return;
    }
    if let (Some(minimum), Some(n)) = (schema["minimum"].as_f64(), value.as_f64())
        && n < minimum
    {
        out.push(format!("{at}: {n} < minimum {minimum}"));
    }
    match value {
        Value::Object(fields) => {
            let properties = schema["properties"].as_object();
            for required in schema["required"].as_array().into_iter().flatten() {
                let name = required.as_str().unwrap_or_default();
                if !fields.contains_key(name) {
                    out.push(format!("{at}: required {name} is missing"));
                }
            }
            for (name, field) in fields {
                match properties.and_then(|p| p.get(name)) {
                    Some(s) => mismatches(doc, s, field, &format!("{at}.{name}"), out),
                    None if schema["additionalProperties"] == json!(false)
                        || properties.is_some() =>
                    {
                        // utoipa describes every field of the types it derives from: a field
                        // it does not name is a field the answer has and the document lacks.
                        out.push(format!("{at}.{name}: not in the schema"));
                    }
                    None => {}
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    mismatches(doc, item, v, &format!("{at}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

/// Calls the API and holds the answer to the document's schema for that route and status.
async fn conforms(
    app: &TestApp,
    doc: &Value,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut r = app.client.request(method.clone(), app.url(path));
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    if let Some(body) = body {
        r = r.json(&body);
    }
    let r = r.send().await.expect("API answers");
    let status = r.status().as_u16();
    let content_type = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let answer: Value = r.json().await.expect("a JSON answer");
    let template = doc["paths"]
        .as_object()
        .expect("paths")
        .keys()
        .find(|t| fits(t, path))
        .unwrap_or_else(|| panic!("{path} is not documented"));
    let response =
        &doc["paths"][template][method.as_str().to_lowercase()]["responses"][status.to_string()];
    assert!(
        !response.is_null(),
        "{method} {path}: {status} is not documented"
    );
    let schema = &response["content"][&content_type]["schema"];
    assert!(
        !schema.is_null(),
        "{method} {path}: {status} as {content_type} is not documented"
    );
    let mut out = Vec::new();
    mismatches(doc, schema, &answer, "answer", &mut out);
    assert!(
        out.is_empty(),
        "{method} {path} ({status}) against its schema:\n{}\n{answer:#}",
        out.join("\n")
    );
    (status, answer)
}

#[tokio::test]
async fn real_answers_fit_their_documented_schemas() {
    let app = spawn_app_with(configure).await;
    let doc = document(&app).await;
    let submit = json!({ "destination": "nowhere", "body": "<order xmlns=\"urn:x\">1</order>" });
    let (status, submitted) = conforms(
        &app,
        &doc,
        Method::POST,
        "/api/v1/messages",
        Some(PRODUCE),
        Some(submit),
    )
    .await;
    assert_eq!(status, 202);
    let id = submitted["id"].as_str().expect("an id").to_owned();
    let (status, _) = conforms(
        &app,
        &doc,
        Method::GET,
        &format!("/api/v1/messages/{id}"),
        Some(PRODUCE),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (_, list) = conforms(
        &app,
        &doc,
        Method::GET,
        "/api/v1/messages",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(list["messages"].as_array().map(Vec::len), Some(1));
    // A delivered message: in the inbox, in a received group, and fetched.
    super::api_security::deliver(&app, "orders", 1).await;
    let (_, inbox) = conforms(&app, &doc, Method::GET, "/api/v1/inbox", Some(ADMIN), None).await;
    assert_eq!(inbox["messages"].as_array().map(Vec::len), Some(1));
    conforms(
        &app,
        &doc,
        Method::GET,
        "/api/v1/groups/mid:orders-1@api-security",
        Some(ADMIN),
        None,
    )
    .await;
    let (status, subscription) = conforms(
        &app,
        &doc,
        Method::POST,
        "/api/v1/subscriptions",
        Some(CONSUME),
        Some(json!({ "name": "orders", "filter": "#", "start": "oldest" })),
    )
    .await;
    assert_eq!(status, 201);
    let (_, session) = conforms(
        &app,
        &doc,
        Method::POST,
        &format!("/api/v1/subscriptions/{}/sessions", subscription["id"]),
        Some(CONSUME),
        None,
    )
    .await;
    let (_, fetched) = conforms(
        &app,
        &doc,
        Method::POST,
        &format!(
            "/api/v1/sessions/{}/fetch",
            session["session"].as_str().expect("a session")
        ),
        Some(CONSUME),
        Some(json!({ "max": 10 })),
    )
    .await;
    assert_eq!(fetched["messages"].as_array().map(Vec::len), Some(1));
    conforms(
        &app,
        &doc,
        Method::GET,
        "/api/v1/subscriptions",
        Some(CONSUME),
        None,
    )
    .await;
    conforms(&app, &doc, Method::GET, "/api/v1/groups", Some(ADMIN), None).await;
    // The problem answers: the guard's, a bad path segment's and a bad query's (both once
    // axum's text/plain), and a handler's.
    let refusals = [
        (Method::GET, "/api/v1/inbox", None, 401),
        (Method::GET, "/api/v1/inbox", Some(PRODUCE), 403),
        (Method::GET, "/api/v1/subscriptions/NaN", Some(CONSUME), 400),
        (Method::GET, "/api/v1/inbox?limit=many", Some(ADMIN), 400),
        (Method::GET, "/api/v1/messages/none", Some(PRODUCE), 404),
    ];
    for (method, path, token, expected) in refusals {
        let (status, answer) = conforms(&app, &doc, method, path, token, None).await;
        assert_eq!(status, expected, "{path}: {answer}");
    }
    // A registration with no JSON media type is read as JSON all the same (it was 415).
    let r = app
        .client
        .post(app.url("/api/v1/push-endpoints"))
        .bearer_auth(ADMIN)
        .body(r#"{"url": "http://127.0.0.1:9/hook", "principal": "*"}"#)
        .send()
        .await
        .expect("API answers");
    assert!(r.status().is_success(), "{}", r.status());
}
