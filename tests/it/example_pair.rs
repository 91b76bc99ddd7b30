//! `examples/partners/`: the two gateways of the README's "Partners and security", started from
//! their own files (certificates from the example's `make-certs.sh`, free ports, databases in a
//! temporary folder), send to each other over mutual TLS with partner credentials by the
//! Response, Callback and Poll patterns.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::support::{free_port, repo_root, start_gateway};

struct Pair {
    _dir: tempfile::TempDir,
    children: Vec<Child>,
    client: reqwest::Client,
    a: String,
    b: String,
}

impl Drop for Pair {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The example's files in a temporary folder, with its ports and databases moved there.
fn lay_out(dir: &Path) -> (u16, u16) {
    let example = repo_root().join("examples/partners");
    let made = Command::new(example.join("make-certs.sh"))
        .arg(dir.join("certs"))
        .output()
        .expect("make-certs.sh runs (openssl)");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    std::fs::create_dir_all(dir.join("secrets")).expect("secrets folder");
    std::fs::copy(
        example.join("secrets/a-to-b.pass"),
        dir.join("secrets/a-to-b.pass"),
    )
    .expect("copy the secret");
    let (pa, pb) = (free_port(), free_port());
    for name in ["a", "b"] {
        let text = std::fs::read_to_string(example.join(format!("gateway-{name}.toml")))
            .expect("example config");
        let text = text
            .replace("127.0.0.1:8443", &format!("127.0.0.1:{pa}"))
            .replace("127.0.0.1:9443", &format!("127.0.0.1:{pb}"))
            .replace(
                &format!("database = \"data/{name}.db\""),
                &format!("database = {:?}", dir.join(format!("{name}.db"))),
            );
        std::fs::write(dir.join(format!("gateway-{name}.toml")), text).expect("write config");
    }
    (pa, pb)
}

fn start_pair() -> Pair {
    let dir = tempfile::tempdir().expect("temp dir");
    let (pa, pb) = lay_out(dir.path());
    let children = vec![
        start_gateway(&dir.path().join("gateway-a.toml")),
        start_gateway(&dir.path().join("gateway-b.toml")),
    ];
    let ca = std::fs::read(dir.path().join("certs/ca.pem")).expect("CA");
    let client = reqwest::Client::builder()
        .tls_certs_only(reqwest::Certificate::from_pem_bundle(&ca).expect("CA PEM"))
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    Pair {
        _dir: dir,
        children,
        client,
        a: format!("https://127.0.0.1:{pa}"),
        b: format!("https://127.0.0.1:{pb}"),
    }
}

async fn submit(pair: &Pair, from: &str, token: &str, to: &str, pattern: &str) -> String {
    let answer = pair
        .client
        .post(format!("{from}/api/v1/messages"))
        .bearer_auth(token)
        .json(&json!({
            "destination": to,
            "agreement": {"reply_pattern": pattern},
            "body": format!("<o:Order xmlns:o=\"urn:example\">{pattern}</o:Order>"),
        }))
        .send()
        .await
        .expect("submit");
    assert_eq!(answer.status(), 202, "{pattern}");
    let body: Value = answer.json().await.expect("JSON");
    body["id"].as_str().expect("id").to_owned()
}

/// Waits (bounded) until the message is final, and returns its JSON.
async fn final_state(pair: &Pair, at: &str, token: &str, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m: Value = pair
            .client
            .get(format!("{at}/api/v1/messages/{id}"))
            .bearer_auth(token)
            .send()
            .await
            .expect("status")
            .json()
            .await
            .expect("JSON");
        let state = m["state"].as_str().unwrap_or_default().to_owned();
        if ["acked", "faulted", "failed"].contains(&state.as_str()) || Instant::now() > deadline {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_example_pair_sends_both_ways_over_mutual_tls() {
    let pair = start_pair();
    let (a_token, b_token) = ("a-admin-token-0123456789", "b-admin-token-0123456789");
    let mut sent = Vec::new();
    for pattern in ["Response", "Callback", "Poll"] {
        sent.push((
            pattern,
            pair.a.clone(),
            a_token,
            submit(&pair, &pair.a, a_token, "b", pattern).await,
        ));
        sent.push((
            pattern,
            pair.b.clone(),
            b_token,
            submit(&pair, &pair.b, b_token, "a", pattern).await,
        ));
    }
    for (pattern, at, token, id) in &sent {
        let m = final_state(&pair, at, token, id).await;
        assert_eq!(m["state"], "acked", "{pattern} from {at}: {m}");
    }
    // Plain HTTP to a TLS listener is no way in.
    let plain = reqwest::Client::new()
        .get(format!("{}/healthz", pair.a.replace("https", "http")))
        .send()
        .await;
    assert!(plain.map(|r| !r.status().is_success()).unwrap_or(true));
}
