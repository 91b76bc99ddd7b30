//! Traces across the message path (issue 34), through the real binary: a gateway whose
//! `otlp_endpoint` is a local OTLP/HTTP (JSON) receiver continues a partner's W3C trace from
//! its POST through the commit, and a consumer's fetch and settle of that message join the
//! same trace; a submitted message's attempts join the submit's trace and carry `traceparent`
//! to the partner. Without `otlp_endpoint` nothing is sent anywhere (the other tests).

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::support::{free_port, mock_partner, serve_local, start_gateway};

const TOKEN: &str = "traces-admin-token-0123456789";
/// The partner's trace, as its own tracing would have sent it.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// Every span the receiver was sent: (trace id, span id, parent span id, name).
fn spans(exports: &[Value]) -> Vec<(String, String, String, String)> {
    let mut out = Vec::new();
    for export in exports {
        for rs in export["resourceSpans"].as_array().into_iter().flatten() {
            for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                for s in ss["spans"].as_array().into_iter().flatten() {
                    let text = |k: &str| s[k].as_str().unwrap_or_default().to_lowercase();
                    out.push((
                        text("traceId"),
                        text("spanId"),
                        text("parentSpanId"),
                        s["name"].as_str().unwrap_or_default().to_owned(),
                    ));
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_from_a_partners_post_to_the_settle_and_from_a_submit_to_the_partner() {
    let exports = Arc::new(Mutex::new(Vec::<Value>::new()));
    let kept = exports.clone();
    let collector = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let kept = kept.clone();
            async move {
                if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                    kept.lock().expect("lock").push(v);
                }
                axum::Json(json!({}))
            }
        }),
    );
    let collector = serve_local(collector).await;
    let mut partner = mock_partner(vec![503; 100]).await;

    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndatabase = {:?}\n\
             otlp_endpoint = \"{collector}/v1/traces\"\notlp_protocol = \"http/json\"\n\
             allow_url_destinations = true\nallowed_destination_hosts = [\"127.0.0.1\"]\n\
             [default_agreement]\nmax_attempts = 100\ninterval_ms = 200\nbackoff = 1\nexpiry_seconds = 3600\n\
             [[tokens]]\ntoken = \"{TOKEN}\"\nprincipal = \"ops\"\nscopes = [\"admin\"]\n",
            dir.path().join("gw.db").display().to_string()
        ),
    )
    .expect("config");
    let mut child = start_gateway(&config);
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let api = |method: reqwest::Method, path: &str| {
        client
            .request(method, format!("{base}/api/v1{path}"))
            .bearer_auth(TOKEN)
    };

    // The consumer's subscription first, then the partner's message with its traceparent.
    let r = api(reqwest::Method::POST, "/subscriptions")
        .json(&json!({ "name": "traced", "filter": "default/#" }))
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 201);
    let sub = r.json::<Value>().await.expect("json")["id"]
        .as_i64()
        .expect("id");
    let expiry = (chrono::Utc::now() + chrono::Duration::hours(1))
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let example =
        std::fs::read_to_string(super::support::repo_root().join("examples/purchase-order.xml"))
            .expect("the README's example")
            .replace("2099-12-31T23:59:59Z", &expiry);
    let partner_span = "00f067aa0ba902b7";
    let r = client
        .post(format!("{base}/wsr/default"))
        .header("content-type", "text/xml; charset=utf-8")
        .header("traceparent", format!("00-{TRACE_ID}-{partner_span}-01"))
        .body(example)
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 200);
    let answer = r.text().await.expect("body");
    assert!(answer.contains("NonSequenceReply"), "{answer}");

    let r = api(
        reqwest::Method::POST,
        &format!("/subscriptions/{sub}/sessions"),
    )
    .json(&json!({ "ttl_ms": 60000 }))
    .send()
    .await
    .expect("answers");
    let session = r.json::<Value>().await.expect("json")["session"]
        .as_str()
        .expect("session")
        .to_owned();
    let r = api(reqwest::Method::POST, &format!("/sessions/{session}/fetch"))
        .json(&json!({ "max": 10 }))
        .send()
        .await
        .expect("answers");
    let fetched = r.json::<Value>().await.expect("json");
    let receipt = fetched["messages"][0]["receipt"].clone();
    assert!(receipt.is_string(), "{fetched}");
    let r = api(reqwest::Method::POST, "/settle")
        .json(&json!({ "receipt": receipt, "outcome": "accepted" }))
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 200);

    // An application's submit, in a trace of its own.
    let app_trace = "0af7651916cd43dd8448eb211c80319c";
    let r = api(reqwest::Method::POST, "/messages")
        .header("traceparent", format!("00-{app_trace}-b7ad6b7169203331-01"))
        .json(&json!({ "destination": partner.url, "body": "<r:One xmlns:r=\"urn:r\">1</r:One>" }))
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 202);
    let mut carried = Vec::new();
    for _ in 0..2 {
        let (headers, _) = partner.next_post().await;
        carried.push(
            headers
                .get("traceparent")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
        );
    }

    // SIGTERM: the gateway drains and sends the spans still queued.
    let pid = child.id().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    assert!(killed.is_ok_and(|s| s.success()));
    let status = child.wait().expect("the gateway stops");
    assert!(status.success(), "{status:?}");

    let spans = spans(&exports.lock().expect("lock"));
    let names_in = |trace: &str| -> Vec<String> {
        spans
            .iter()
            .filter(|s| s.0 == trace)
            .map(|s| s.3.clone())
            .collect()
    };
    let received = names_in(TRACE_ID);
    for name in [
        "request",
        "receive.read",
        "receive.decide",
        "receive.commit",
        "receive.answer",
        "delivery.fetch",
        "delivery.settle",
    ] {
        assert!(
            received.contains(&name.to_owned()),
            "{name} in {received:?}"
        );
    }
    // The partner's span is the parent of our request.
    assert!(
        spans
            .iter()
            .any(|s| s.0 == TRACE_ID && s.3 == "request" && s.2 == partner_span),
        "{spans:?}"
    );
    let sent = names_in(app_trace);
    assert!(sent.contains(&"outbound.submit".to_owned()), "{sent:?}");
    let attempts = sent.iter().filter(|n| *n == "outbound.attempt").count();
    assert!(attempts >= 2, "{sent:?}");
    for traceparent in &carried {
        assert!(
            traceparent.starts_with(&format!("00-{app_trace}-")),
            "the partner received {traceparent:?}"
        );
    }
    assert_ne!(carried[0], carried[1], "each attempt its own span");
}
