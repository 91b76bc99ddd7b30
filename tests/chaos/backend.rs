//! The recording SOAP backend behind B's request-response channels (D16): it writes down
//! every call — which channel, the harness id in the body, the idempotency headers
//! (`WSR-Group-Id`, `WSR-Sequence-Number`) and when it came — and answers with a business
//! response that depends on the request: it echoes the harness id, the group id and number
//! it was called with, and the call's serial, so the checker can tell which call an answer
//! came from. Each answer is held back a little (up to `max_delay`) so that a kill of B
//! falls now and then between the call and B's commit.
//!
//! It lives in the run's own process, which is never killed: its record is complete.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use bytes::Bytes;

use crate::consumer::harness_id;

/// The namespace of the request-response messages' bodies: the proxy's answer log marks them
/// by it, and the backend answers in it.
pub const RR_NAMESPACE: &str = "urn:chaos-rr";

/// One call the backend received.
#[derive(Debug, Clone)]
pub struct Call {
    /// The path's channel: `rr` or `rr-fail`.
    pub channel: String,
    pub hid: String,
    pub group_id: Option<String>,
    pub number: Option<String>,
    /// Since the run's start (the same clock as its kills).
    pub at: Duration,
    pub serial: u64,
}

#[derive(Clone)]
pub struct Backend {
    pub url: String,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Backend {
    /// Serves on 127.0.0.1 until the run ends; `epoch` is the run's clock.
    pub async fn start(epoch: Instant, max_delay: Duration, seed: u64) -> anyhow::Result<Backend> {
        let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
        let rng = Arc::new(Mutex::new(fastrand::Rng::with_seed(seed)));
        let record = calls.clone();
        let handler = move |axum::extract::Path(channel): axum::extract::Path<String>,
                            headers: HeaderMap,
                            body: Bytes| {
            let (record, rng) = (record.clone(), rng.clone());
            async move {
                let text = String::from_utf8_lossy(&body);
                let header = |name: &str| {
                    headers
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned)
                };
                let call = {
                    let mut calls = record.lock().unwrap_or_else(|e| e.into_inner());
                    let call = Call {
                        channel,
                        hid: harness_id(&text).unwrap_or("?").to_owned(),
                        group_id: header("wsr-group-id"),
                        number: header("wsr-sequence-number"),
                        at: epoch.elapsed(),
                        serial: calls.len() as u64,
                    };
                    calls.push(call.clone());
                    call
                };
                let delay = {
                    let mut rng = rng.lock().unwrap_or_else(|e| e.into_inner());
                    max_delay.mul_f64(rng.f64())
                };
                // Not waiting for an event: the business takes its time, and a kill of B
                // may land meanwhile.
                tokio::time::sleep(delay).await;
                let soap12 =
                    header("content-type").is_some_and(|ct| ct.starts_with("application/soap+xml"));
                let (ns, ct) = if soap12 {
                    (
                        "http://www.w3.org/2003/05/soap-envelope",
                        "application/soap+xml; charset=utf-8",
                    )
                } else {
                    (
                        "http://schemas.xmlsoap.org/soap/envelope/",
                        "text/xml; charset=utf-8",
                    )
                };
                let body = format!(
                    "<s:Envelope xmlns:s=\"{ns}\"><s:Body><r:ItemResponse xmlns:r=\"{RR_NAMESPACE}\" \
                     id=\"{}\" group=\"{}\" number=\"{}\" call=\"{}\">done</r:ItemResponse>\
                     </s:Body></s:Envelope>",
                    call.hid,
                    call.group_id.as_deref().unwrap_or(""),
                    call.number.as_deref().unwrap_or(""),
                    call.serial,
                );
                (StatusCode::OK, [("content-type", ct)], body)
            }
        };
        let router = axum::Router::new().route("/soap/{channel}", axum::routing::post(handler));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/soap", listener.local_addr()?);
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                eprintln!("chaos: the SOAP backend stopped: {e}");
            }
        });
        Ok(Backend { url, calls })
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
