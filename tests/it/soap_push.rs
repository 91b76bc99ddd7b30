//! Push subscriptions with `push_format = "soap"` (DESIGN §5, issue 30): a scripted SOAP
//! endpoint on loopback gets each message as an envelope in the message's SOAP version (its Body
//! as received, no WS-R blocks) with headers naming the message; its answer settles the lease —
//! 2xx accepted, a SOAP Fault or a 4xx rejected, a 503 retried — and a subscription ordered by
//! group gets a group's messages one at a time, in sequence.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use chrono::Duration;
use serde_json::{Value, json};
use wsr_gateway::wsr::model::{SOAP11_NS, SOAP12_NS};
use wsr_gateway::wsr::{Headers, Limits, SoapVersion, read_envelope, write_envelope};

use super::delivery::{Api, OWNER, dead_letters, settled, tokens};
use super::support::{TestApp, serve_local, spawn_app_with};

/// What the scripted endpoint answers to one call.
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// 200 with a response envelope.
    Ok,
    /// A SOAP Fault in the request's version (HTTP 500).
    Fault,
    /// This status, empty body.
    Status(u16),
}

/// One call as the endpoint saw it.
#[derive(Debug, Clone)]
struct Call {
    content_type: Option<String>,
    soap_action: Option<String>,
    group_id: Option<String>,
    number: Option<String>,
    body: String,
}

struct SoapEndpoint {
    url: String,
    calls: tokio::sync::mpsc::UnboundedReceiver<Call>,
    max_concurrent: Arc<AtomicUsize>,
}

fn header(h: &axum::http::HeaderMap, name: &str) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// A SOAP endpoint answering each call with the next planned answer (then `Ok`), after
/// holding it `hold_ms`.
async fn soap_endpoint(plan: Vec<Answer>, hold_ms: u64) -> SoapEndpoint {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let plan = Arc::new(Mutex::new(plan.into_iter()));
    let current = Arc::new(AtomicUsize::new(0));
    let max_concurrent = Arc::new(AtomicUsize::new(0));
    let (c, m) = (current.clone(), max_concurrent.clone());
    let handler = move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
        let (tx, plan, c, m) = (tx.clone(), plan.clone(), c.clone(), m.clone());
        async move {
            let now = c.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(now, Ordering::SeqCst);
            let call = Call {
                content_type: header(&headers, "content-type"),
                soap_action: header(&headers, "soapaction"),
                group_id: header(&headers, "wsr-group-id"),
                number: header(&headers, "wsr-sequence-number"),
                body: String::from_utf8_lossy(&body).into_owned(),
            };
            let soap12 = call
                .content_type
                .as_deref()
                .is_some_and(|ct| ct.starts_with("application/soap+xml"));
            let _ = tx.send(call);
            let next = plan.lock().expect("lock").next().unwrap_or(Answer::Ok);
            tokio::time::sleep(std::time::Duration::from_millis(hold_ms)).await;
            c.fetch_sub(1, Ordering::SeqCst);
            let (ct, ns) = if soap12 {
                ("application/soap+xml; charset=utf-8", SOAP12_NS)
            } else {
                ("text/xml; charset=utf-8", SOAP11_NS)
            };
            let (status, body) = match next {
                Answer::Ok => (
                    200,
                    format!(
                        r#"<s:Envelope xmlns:s="{ns}"><s:Body><r:Done xmlns:r="urn:r"/></s:Body></s:Envelope>"#
                    ),
                ),
                Answer::Fault if soap12 => (
                    500,
                    format!(
                        r#"<s:Envelope xmlns:s="{ns}"><s:Body><s:Fault><s:Code><s:Value>s:Sender</s:Value></s:Code><s:Reason><s:Text xml:lang="en">bad order</s:Text></s:Reason></s:Fault></s:Body></s:Envelope>"#
                    ),
                ),
                Answer::Fault => (
                    500,
                    format!(
                        r#"<s:Envelope xmlns:s="{ns}"><s:Body><s:Fault><faultcode>s:Client</faultcode><faultstring>bad order</faultstring></s:Fault></s:Body></s:Envelope>"#
                    ),
                ),
                Answer::Status(s) => (s, String::new()),
            };
            (
                axum::http::StatusCode::from_u16(status).expect("status"),
                [(axum::http::header::CONTENT_TYPE, ct)],
                body,
            )
        }
    };
    let router = axum::Router::new().route("/soap", axum::routing::post(handler));
    let url = format!("{}/soap", serve_local(router).await);
    SoapEndpoint {
        url,
        calls: rx,
        max_concurrent,
    }
}

impl SoapEndpoint {
    async fn next(&mut self) -> Call {
        tokio::time::timeout(std::time::Duration::from_secs(10), self.calls.recv())
            .await
            .expect("a push within 10 s")
            .expect("endpoint alive")
    }

    async fn quiet(&mut self, ms: u64) -> bool {
        tokio::time::timeout(std::time::Duration::from_millis(ms), self.calls.recv())
            .await
            .is_err()
    }
}

async fn gateway() -> TestApp {
    spawn_app_with(|c| c.tokens = tokens()).await
}

fn payload(group: &str, number: Option<u64>) -> String {
    format!("<p:Order xmlns:p=\"urn:p\"><p:Ref>{group}#{number:?}</p:Ref></p:Order>")
}

/// A reliable message for channel `default` in `version`; acked.
async fn deliver(
    app: &TestApp,
    version: SoapVersion,
    group: &str,
    number: Option<u64>,
    ordered: bool,
) {
    let request = super::delivery::wsr_request(group, number, ordered);
    let xml = write_envelope(
        version,
        Headers {
            request: Some(&request),
            ..Headers::default()
        },
        &payload(group, number),
    );
    let mut post = app
        .client
        .post(app.url("/wsr/default"))
        .header("content-type", version.content_type());
    if let Some(action) = version.soap_action() {
        post = post.header("soapaction", action);
    }
    let r = post.body(xml).send().await.expect("gateway answers");
    let status = r.status().as_u16();
    let body = r.text().await.unwrap_or_default();
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("Fault"), "{body}");
}

async fn soap_subscription(app: &TestApp, url: &str, extra: Value) -> (Api, i64) {
    app.register_webhook(url).await;
    let api = Api::of(app, OWNER);
    let mut create = json!({
        "name": "soap-hooked", "filter": "default/#", "mode": "push", "push_url": url,
        "push_format": "soap", "ack_wait_ms": 1_000, "backoff_ms": [10_000],
        "max_deliveries": 5,
    });
    if let (Some(c), Some(e)) = (create.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    let (status, answer) = api.post("/api/v1/subscriptions", create).await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["format"], "soap", "shown in its JSON: {answer}");
    (api, answer["id"].as_i64().expect("id"))
}

/// The call is a plain envelope of `version` around the message's Body, with its headers.
fn assert_call(call: &Call, version: SoapVersion, group: &str, number: Option<u64>) {
    let env = read_envelope(call.body.as_bytes(), &Limits::default()).expect("a SOAP envelope");
    assert_eq!(env.version, version, "{}", call.body);
    assert!(
        env.request.is_none() && env.response.is_none() && env.poll_request.is_none(),
        "no WS-R blocks: {}",
        call.body
    );
    assert!(!call.body.contains("wsrm"), "{}", call.body);
    assert_eq!(env.body.content, payload(group, number), "Body as received");
    assert_eq!(call.content_type.as_deref(), Some(version.content_type()));
    assert_eq!(call.soap_action.as_deref(), version.soap_action());
    assert_eq!(call.group_id.as_deref(), Some(group));
    assert_eq!(call.number, number.map(|n| n.to_string()));
}

#[tokio::test]
async fn soap_push_sends_each_version_with_its_headers_and_settles_by_the_answer() {
    let app = gateway().await;
    // Calls in order: 1.1 accepted, 1.2 accepted, a 1.1 fault, a 1.2 fault, a 400, a 503
    // then (after the backoff) accepted.
    let mut soap = soap_endpoint(
        vec![
            Answer::Ok,
            Answer::Ok,
            Answer::Fault,
            Answer::Fault,
            Answer::Status(400),
            Answer::Status(503),
            Answer::Ok,
        ],
        0,
    )
    .await;
    let (api, sub) = soap_subscription(&app, &soap.url, json!({ "push_concurrency": 1 })).await;
    let (_, shown) = api.get(&format!("/api/v1/subscriptions/{sub}")).await;
    assert_eq!(shown["format"], "soap", "{shown}");

    let cases = [
        (SoapVersion::Soap11, "urn:soap-push:accepted-11", None),
        (SoapVersion::Soap12, "urn:soap-push:accepted-12", Some(1)),
        (SoapVersion::Soap11, "urn:soap-push:fault-11", None),
        (SoapVersion::Soap12, "urn:soap-push:fault-12", Some(1)),
        (SoapVersion::Soap12, "urn:soap-push:client-error", None),
    ];
    for (version, group, number) in cases {
        deliver(&app, version, group, number, false).await;
        let call = soap.next().await;
        assert_call(&call, version, group, number);
        settled(&api, sub).await;
    }

    // A 503 without a fault: retried after the backoff, with the same headers.
    let group = "urn:soap-push:unavailable";
    deliver(&app, SoapVersion::Soap11, group, Some(3), false).await;
    assert_call(&soap.next().await, SoapVersion::Soap11, group, Some(3));
    settled(&api, sub).await;
    assert!(soap.quiet(300).await, "the 503 waits out its backoff");
    app.clock.advance(Duration::seconds(10));
    assert_call(&soap.next().await, SoapVersion::Soap11, group, Some(3));
    settled(&api, sub).await;

    let dead: Vec<String> = dead_letters(&api, sub)
        .await
        .iter()
        .map(|d| d["message"]["group_id"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(
        dead,
        [
            "urn:soap-push:fault-11",
            "urn:soap-push:fault-12",
            "urn:soap-push:client-error"
        ],
        "faults and the 4xx rejected, the rest accepted"
    );
    app.clock.advance(Duration::seconds(60));
    assert!(soap.quiet(300).await, "nothing accepted comes again");
}

#[tokio::test]
async fn soap_push_ordered_by_group_sends_a_group_in_sequence_one_at_a_time() {
    let app = gateway().await;
    // The group's first call is a 503: nothing after it may go before it is accepted.
    let mut soap = soap_endpoint(vec![Answer::Status(503)], 30).await;
    let (api, sub) = soap_subscription(
        &app,
        &soap.url,
        json!({ "ordering": "group", "push_concurrency": 8 }),
    )
    .await;
    let group = "urn:soap-push:ordered";
    // WS-R numbers start at 0.
    for n in 0..5 {
        deliver(&app, SoapVersion::Soap12, group, Some(n), true).await;
    }
    assert_call(&soap.next().await, SoapVersion::Soap12, group, Some(0));
    settled(&api, sub).await;
    assert!(soap.quiet(300).await, "number 1 waits for number 0");
    app.clock.advance(Duration::seconds(10));
    let mut numbers = Vec::new();
    while numbers.len() < 5 {
        let call = soap.next().await;
        assert_eq!(call.group_id.as_deref(), Some(group));
        numbers.push(call.number.unwrap_or_default());
    }
    assert_eq!(numbers, ["0", "1", "2", "3", "4"], "in sequence order");
    assert_eq!(
        soap.max_concurrent.load(Ordering::SeqCst),
        1,
        "one call of the group at a time"
    );
    settled(&api, sub).await;
    assert!(dead_letters(&api, sub).await.is_empty());
}

#[tokio::test]
async fn only_a_push_subscription_has_a_format_and_json_stays_the_default() {
    let app = gateway().await;
    let api = Api::of(&app, OWNER);
    let (status, answer) = api
        .post(
            "/api/v1/subscriptions",
            json!({ "name": "pulled", "filter": "default/#", "push_format": "soap" }),
        )
        .await;
    assert_eq!(status, 400, "{answer}");
    let url = "http://127.0.0.1:9/json-hook";
    app.register_webhook(url).await;
    let (status, answer) = api
        .post(
            "/api/v1/subscriptions",
            json!({ "name": "json-hooked", "filter": "default/#", "mode": "push", "push_url": url }),
        )
        .await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["format"], "json");
}
