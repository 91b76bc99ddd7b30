//! What the partners' perimeter tells the operator and the client (issue 32 items 3–7), on a
//! gateway process of its own whose JSON log lines are read: a refusal before the body says
//! `Connection: close`; the access line of a 403 names the partner it proved to be; every fault
//! is noted and counted (an unregistered ReplyTo's `InvalidReplyPattern` too); peers print as
//! addresses.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wsr_gateway::partners::base64_encode;
use wsr_gateway::secrets::hash_secret;
use wsr_gateway::wsr::{ReplyPattern, ReplyTo};

use super::partners_auth::singleton;
use super::support::{free_port, start_gateway_logged};

const PASSWORD: &str = "acme-lines-password-0123";

struct Gateway {
    child: std::process::Child,
    logged: Arc<Mutex<Vec<String>>>,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Gateway {
    fn start() -> Gateway {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let config = dir.path().join("gateway.toml");
        let hash = hash_secret(PASSWORD).expect("hash");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:{port}\"\ndatabase = {:?}\nlog_format = \"json\"\n\n\
                 [[channels]]\nname = \"orders\"\n\n\
                 [[channels]]\nname = \"billing\"\nanonymous = false\n\n\
                 [[channels]]\nname = \"open\"\nanonymous = true\n\n\
                 [partners.acme]\nchannels = [\"orders\"]\npassword_hash = {hash:?}\n\n\
                 [partners.globex]\nchannels = [\"billing\"]\ntoken_sha256 = \"{}\"\n",
                dir.path().join("gw.db").display().to_string(),
                "0".repeat(64),
            ),
        )
        .expect("config");
        let (child, logged) = start_gateway_logged(&config);
        Gateway {
            child,
            logged,
            port,
            _dir: dir,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The lines logged so far that contain every one of `parts`, once some do.
    async fn lines_with(&self, parts: &[&str]) -> Vec<String> {
        super::support::eventually(&format!("a log line with {parts:?}"), || async {
            let lines = self.logged.lock().unwrap_or_else(|p| p.into_inner());
            let found: Vec<String> = lines
                .iter()
                .filter(|l| parts.iter().all(|p| l.contains(p)))
                .cloned()
                .collect();
            (!found.is_empty()).then_some(found)
        })
        .await
    }
}

fn basic() -> String {
    format!(
        "Basic {}",
        base64_encode(format!("acme:{PASSWORD}").as_bytes())
    )
}

#[tokio::test]
async fn a_forbidden_channel_is_refused_with_the_partner_named_and_the_connection_closed() {
    let gw = Gateway::start();
    let client = reqwest::Client::new();
    let r = client
        .post(gw.url("/wsr/billing"))
        .header("Authorization", basic())
        .header("Content-Type", "text/xml; charset=utf-8")
        .body(singleton("mid:forbidden@lines", ReplyPattern::Response))
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 403);
    assert_eq!(
        r.headers().get("connection").and_then(|v| v.to_str().ok()),
        Some("close")
    );
    let access = gw.lines_with(&["wsr request", "\"status\":403"]).await;
    assert!(access[0].contains("\"partner\":\"acme\""), "{}", access[0]);
    let warned = gw.lines_with(&["channel not allowed"]).await;
    assert!(
        warned[0].contains("\"peer\":\"127.0.0.1:") && !warned[0].contains("Some("),
        "the peer is an address: {}",
        warned[0]
    );
}

#[tokio::test]
async fn a_refusal_before_the_body_arrives_says_the_connection_is_closed() {
    let gw = Gateway::start();
    let port = gw.port;
    let answer = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connects");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        // The head alone: a SOAP stack that writes its body separately.
        stream
            .write_all(
                b"POST /wsr/orders HTTP/1.1\r\nHost: x\r\nContent-Type: text/xml\r\n\
                  Content-Length: 500\r\n\r\n",
            )
            .expect("head");
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).expect("reads");
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&answer).to_lowercase()
    })
    .await
    .expect("join");
    assert!(answer.starts_with("http/1.1 401"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    let warned = gw.lines_with(&["refused: no credentials"]).await;
    assert!(!warned[0].contains("Some("), "{}", warned[0]);
}

#[tokio::test]
async fn an_unregistered_reply_to_is_noted_and_counted_as_its_fault() {
    let gw = Gateway::start();
    let client = reqwest::Client::new();
    let pattern = ReplyPattern::Callback(ReplyTo {
        uri: "http://127.0.0.1:9/nobody-registered".into(),
        reference_scheme: None,
    });
    let r = client
        .post(gw.url("/wsr/open"))
        .header("Content-Type", "text/xml; charset=utf-8")
        .body(singleton("mid:reply-to@lines", pattern))
        .send()
        .await
        .expect("answers");
    let body = r.text().await.expect("body");
    assert!(body.contains("InvalidReplyPattern"), "{body}");
    let access = gw.lines_with(&["wsr request", "mid:reply-to@lines"]).await;
    assert!(
        access[0].contains("\"verdict\":\"InvalidReplyPattern\""),
        "{}",
        access[0]
    );
    let metrics = client
        .get(gw.url("/metrics"))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text");
    let counted = super::metrics::sample(
        &metrics,
        "wsr_faults_total",
        &[("channel", "open"), ("code", "InvalidReplyPattern")],
    );
    assert_eq!(counted, 1.0, "{metrics}");
}
