//! Sends the acks and faults we owe by the Callback pattern: everything due for one endpoint
//! goes out in one `wsrm:Response` (D10), retried with doubling waits until it is taken or the
//! acknowledged messages expire. A reply is forgotten only after the partner answered 2xx.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument as _;

use super::http_client::{exchange, redacted};
use super::partner_clients::PartnerClients;
use crate::clock::Clock;
use crate::rmp::replies::Replies;
use crate::store::traces::message_key;
use crate::store::{PendingCallback, Store};
use crate::wsr::{Headers, SoapVersion, write_envelope};

/// Most replies fetched per pass.
const BATCH: i64 = 1000;
/// Longest sleep without anything due, so that a clock jump is noticed eventually.
const IDLE_RECHECK: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct RetryPolicy {
    pub initial: Duration,
    pub max: Duration,
    /// Longest answer read from a callback endpoint (`max_message_bytes`).
    pub answer_cap: usize,
}

impl RetryPolicy {
    /// The wait after the `attempts`-th failure: initial × 2^(attempts−1), capped.
    pub fn backoff(&self, attempts: u32) -> Duration {
        let factor = 1u32
            .checked_shl(attempts.saturating_sub(1).min(20))
            .unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// Sends callbacks until dropped, with the clients built at start (`App::build`): a
/// partner's endpoint gets its TLS and our credentials towards it.
pub async fn run(store: Store, clock: Arc<dyn Clock>, policy: RetryPolicy, client: PartnerClients) {
    loop {
        if let Err(e) = send_due(&store, &client, clock.as_ref(), &policy).await {
            // Pause, or a persistent store failure would repeat the same POSTs in a tight loop.
            tracing::error!(error = %e, "callback pass failed; retrying shortly");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        // On the gateway's clock: an ack another gateway leased is due again when the lease
        // runs out on the same clock its deadline was written with.
        let now = clock.now();
        let recheck = crate::wsr::datetime::saturating_add_std(now, IDLE_RECHECK);
        let wake_at = match store.next_callback_due().await {
            Ok(Some(t)) => t.min(recheck),
            Ok(None) | Err(_) => recheck,
        };
        if wake_at <= now {
            tokio::task::yield_now().await;
            continue;
        }
        tokio::select! {
            _ = clock.sleep_until(wake_at) => {}
            _ = store.callbacks_due().notified() => {}
        }
    }
}

async fn send_due(
    store: &Store,
    client: &PartnerClients,
    clock: &dyn Clock,
    policy: &RetryPolicy,
) -> Result<(), crate::store::StoreError> {
    let now = clock.now();
    let due = store.due_callbacks(now, BATCH).await?;
    // One POST per (partner, endpoint): each carries our credentials for that partner.
    let mut by_target: BTreeMap<(String, String, bool), Vec<PendingCallback>> = BTreeMap::new();
    for p in due {
        by_target
            .entry((p.partner.clone(), p.endpoint.clone(), p.soap12))
            .or_default()
            .push(p);
    }
    for ((partner, endpoint, soap12), pending) in by_target {
        let version = if soap12 {
            SoapVersion::Soap12
        } else {
            SoapVersion::Soap11
        };
        let ids: Vec<i64> = pending.iter().map(|p| p.id).collect();
        let Some(xml) = envelope_for(version, &pending) else {
            store.callbacks_sent(&ids).await?;
            continue;
        };
        let request = client
            .for_callback(&partner, &endpoint)
            .post_soap(&endpoint, version, xml);
        // In the trace of the (first) message it acknowledges, which the partner may go on.
        let span = callback_span(store, &pending).await;
        let request = crate::telemetry::with_traceparent(request, &span);
        // A redirect is not followed (only the registered endpoint gets our acks, D10), and
        // the answer is read at most to the cap: both are failed attempts.
        match exchange(request, policy.answer_cap).instrument(span).await {
            Ok(answer) if (200..300).contains(&answer.status) => {
                tracing::debug!(endpoint = %redacted(&endpoint), replies = ids.len(), "callback delivered");
                let acks = pending.iter().filter(|p| p.reply.fault.is_none()).count();
                crate::metrics::acks_sent("callback", acks as u64);
                store.callbacks_sent(&ids).await?;
            }
            failed => {
                let attempts = pending.iter().map(|p| p.attempts).max().unwrap_or(0) + 1;
                let wait = policy.backoff(attempts);
                let what = match failed {
                    Ok(answer) => format!("HTTP {}", answer.status),
                    Err(failure) => failure.to_string(),
                };
                let endpoint = redacted(&endpoint);
                tracing::warn!(%endpoint, attempts, error = %what, retry_in = ?wait, "callback failed");
                crate::metrics::callback_failed(&partner);
                let next = crate::wsr::datetime::saturating_add_std(clock.now(), wait);
                store.callbacks_failed(&ids, next).await?;
            }
        }
    }
    Ok(())
}

/// One envelope acknowledging (or faulting) everything pending for an endpoint.
pub fn envelope_for(version: SoapVersion, pending: &[PendingCallback]) -> Option<String> {
    let mut replies = Replies::new();
    for p in pending {
        replies.add_item(&p.reply);
    }
    let response = replies.into_response()?;
    Some(write_envelope(
        version,
        Headers {
            response: Some(&response),
            ..Headers::default()
        },
        "",
    ))
}

/// A callback POST's span, a child of the trace its first acknowledged message came in on
/// (traces exported only).
async fn callback_span(store: &Store, pending: &[PendingCallback]) -> tracing::Span {
    let span = crate::telemetry::traced!("callback.send", replies = pending.len());
    let Some(first) = pending.first() else {
        return span;
    };
    let number = first.reply.range.map(|r| r.from());
    let key = message_key(&first.partner, first.reply.group_id.as_str(), number);
    crate::telemetry::child_of(span, store.message_trace(&key)).await
}
