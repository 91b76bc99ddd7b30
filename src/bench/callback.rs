//! The Callback mode of `wsr-gateway bench`: our listener for the gateway's callback acks (and
//! its registration), and the send that waits for its ack there. It never reads the report.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::json;
use tokio::sync::oneshot;

use super::wire::{Outcome, envelope, key, post};
use super::{BenchArgs, Shared};
use wsr_gateway::rmp::replies::items;
use wsr_gateway::wsr::read::{Limits, read_envelope};
use wsr_gateway::wsr::{ReplyPattern, ReplyTo};

/// The workers waiting for their callback ack, by group id.
pub(super) type Waiters = Arc<Mutex<HashMap<String, oneshot::Sender<Result<(), String>>>>>;

pub(super) async fn send_callback(shared: &Shared, worker: usize, i: u64) -> Outcome {
    let Some((reply_to, waiters)) = &shared.callback else {
        return Outcome::Failed("no-listener".into());
    };
    let key = key(shared, worker, i, false);
    let (tx, rx) = oneshot::channel();
    lock(waiters).insert(key.group_id.to_string(), tx);
    let xml = envelope(
        shared,
        &key,
        ReplyPattern::Callback(ReplyTo::bare(reply_to.as_str())),
        false,
    );
    let sent = Instant::now();
    let outcome = match post(shared, xml).await {
        Ok((200 | 202, _)) => match tokio::time::timeout(Duration::from_secs(30), rx).await {
            Ok(Ok(Ok(()))) => Outcome::Acked(sent.elapsed()),
            Ok(Ok(Err(kind))) => Outcome::Failed(kind),
            _ => Outcome::Failed("callback-timeout".into()),
        },
        Ok((status, _)) => Outcome::Failed(format!("http-{status}")),
        Err(kind) => Outcome::Failed(kind),
    };
    lock(waiters).remove(key.group_id.as_str());
    outcome
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts our listener for callback acks and (with a token) registers it with the gateway.
pub(super) async fn start_listener(
    client: &reqwest::Client,
    args: &BenchArgs,
) -> anyhow::Result<(String, Waiters)> {
    let waiters: Waiters = Arc::default();
    let listener = tokio::net::TcpListener::bind(args.callback_listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.callback_listen))?;
    let url = format!(
        "http://{}/acks",
        listener.local_addr().context("listener address")?
    );
    let for_handler = waiters.clone();
    let handler = move |body: axum::body::Bytes| {
        let waiters = for_handler.clone();
        async move {
            if let Ok(env) = read_envelope(&body, &Limits::default()) {
                for reply in env.response.iter().flat_map(|r| &r.replies) {
                    for item in items(reply) {
                        let answer = match item.fault {
                            None => Ok(()),
                            Some(code) => Err(format!("fault:{}", code.local_name())),
                        };
                        if let Some(tx) = lock(&waiters).remove(item.group_id.as_str()) {
                            let _ = tx.send(answer);
                        }
                    }
                }
            }
            axum::http::StatusCode::OK
        }
    };
    let router = axum::Router::new().route("/acks", axum::routing::post(handler));
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    if let Some(token) = &args.token {
        let (origin, _) = args
            .url
            .rsplit_once("/wsr/")
            .context("--url must end in /wsr/{channel}")?;
        client
            .post(format!("{origin}/api/v1/callback-endpoints"))
            .bearer_auth(token)
            .json(&json!({ "url": url }))
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .context("cannot register our callback listener (needs an admin token)")?;
    }
    Ok((url, waiters))
}
