//! Push subscriptions (DESIGN §5): the gateway is the member. One worker per push
//! subscription leases messages like any consumer session and POSTs each to the
//! subscription's registered webhook, at most `concurrency` at a time — as JSON, or (format
//! `soap`) as a SOAP envelope with headers naming the message (`delivery::soap`). The answer
//! settles the lease (and `max_push_bytes_in_flight` bounds the payload bytes out at once): 2xx accepted, 4xx (except 408 and 429) or a SOAP Fault rejected, anything
//! else — other statuses, timeouts, refused connections — a failed attempt retried with the
//! subscription's backoff until max deliveries sends it to the dead letters. A subscription
//! ordered by group gets the store's group order whatever the format: a group's next message
//! is leased only once the one before is settled.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument as _;

use reqwest::StatusCode;
use serde_json::json;
use tokio::task::{JoinHandle, JoinSet};

use super::view::message_json;
use super::wait::Waker;
use crate::clock::Clock;
use crate::delivery::fetch::Take;
use crate::delivery::lease::Outcome;
use crate::delivery::soap;
use crate::delivery::subscription::{Mode, PushFormat};
use crate::delivery::{session, wake};
use crate::outbound::http_client::{exchange, redacted};
use crate::rmp::sender::AttemptFailure;
use crate::store::Store;
use crate::store::delivery::{DeliveryError, Handed, Subscription};

/// Pause after a failed read, so a persistent failure cannot spin the supervisor.
const AFTER_ERROR: Duration = Duration::from_secs(1);
/// The ack wait of a subscription whose rules cannot say (never: they are checked).
const FALLBACK_ACK_WAIT: Duration = Duration::from_secs(30);

/// What a webhook's answer means for the lease. `None`: no answer (timeout, connection).
pub fn outcome_for(status: Option<StatusCode>) -> Outcome {
    match status {
        Some(s) if s.is_success() => Outcome::Accepted,
        Some(s)
            if s.is_client_error()
                && s != StatusCode::REQUEST_TIMEOUT
                && s != StatusCode::TOO_MANY_REQUESTS =>
        {
            Outcome::Rejected
        }
        _ => Outcome::Modified {
            delivery_failed: true,
            undeliverable_here: false,
            delay: None,
        },
    }
}

/// What one push worker may hold.
#[derive(Debug, Clone, Copy)]
pub struct PushLimits {
    /// The longest webhook answer read (`max_message_bytes`); a longer one is a failed attempt.
    pub answer_cap: usize,
    /// Most payload bytes in flight to the webhook (`max_push_bytes_in_flight`): with
    /// `push_concurrency` only, a subscription over large messages would hold that many of
    /// them in memory at once, each with its request body.
    pub bytes_in_flight: usize,
}

/// How a push subscription's webhook is doing on this gateway: its last answer and failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushHealth {
    /// The last POST's HTTP status (`None`: no answer came).
    pub last_status: Option<u16>,
    pub last_at: chrono::DateTime<chrono::Utc>,
    /// When a POST was last accepted.
    pub last_success_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The last failed POST's cause (kept after a later success), and when.
    pub last_error: Option<String>,
    pub last_error_at: Option<chrono::DateTime<chrono::Utc>>,
    pub failures_in_row: u64,
}

/// Push health by subscription, as this gateway's pushes found it: shared by the push
/// supervisor (which writes it) and the API and console (which read it). Bounded by the push
/// subscriptions there are; a subscription's entry goes with it.
#[derive(Debug, Clone, Default)]
pub struct PushHealthBook(Arc<std::sync::Mutex<std::collections::BTreeMap<i64, PushHealth>>>);

impl PushHealthBook {
    /// Push subscription `id`'s health on this gateway, if it pushed here.
    pub fn get(&self, id: i64) -> Option<PushHealth> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }

    /// Notes one POST's result: accepted, or failed with `cause`.
    fn note(
        &self,
        id: i64,
        status: Option<u16>,
        outcome: &Outcome,
        cause: &str,
        at: chrono::DateTime<chrono::Utc>,
    ) {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let h = all.entry(id).or_insert(PushHealth {
            last_status: None,
            last_at: at,
            last_success_at: None,
            last_error: None,
            last_error_at: None,
            failures_in_row: 0,
        });
        h.last_status = status;
        h.last_at = at;
        if *outcome == Outcome::Accepted {
            h.last_success_at = Some(at);
            h.failures_in_row = 0;
        } else {
            h.last_error = Some(cause.to_owned());
            h.last_error_at = Some(at);
            h.failures_in_row = h.failures_in_row.saturating_add(1);
        }
    }

    /// Forgets the health of push subscriptions that are gone.
    fn keep_only(&self, kept: &[i64]) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| kept.contains(id));
    }
}

/// Keeps one worker running per push subscription.
pub async fn run(store: Store, clock: Arc<dyn Clock>, limits: PushLimits, book: PushHealthBook) {
    let mut workers: HashMap<i64, JoinHandle<()>> = HashMap::new();
    // Subscriptions created or deleted wake us (their commits announce delivery changes).
    let mut waker = Waker::new(&store, &clock);
    loop {
        waker.mark();
        match store.push_subscriptions().await {
            Ok(subs) => {
                // A paused subscription has no worker: its messages wait until it is resumed
                // (what its worker held lapses back to the subscription).
                book.keep_only(&subs.iter().map(|s| s.id).collect::<Vec<_>>());
                let subs: Vec<Subscription> = subs
                    .into_iter()
                    .filter(|s| !s.rules.push_paused())
                    .collect();
                workers.retain(|id, w| {
                    let keep = !w.is_finished() && subs.iter().any(|s| s.id == *id);
                    if !keep {
                        w.abort();
                    }
                    keep
                });
                for sub in subs {
                    workers.entry(sub.id).or_insert_with(|| {
                        let book = book.clone();
                        tokio::spawn(worker(store.clone(), clock.clone(), sub, limits, book))
                    });
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot list push subscriptions");
                tokio::time::sleep(AFTER_ERROR).await;
                continue;
            }
        }
        waker.wait(None).await;
    }
}

async fn worker(
    store: Store,
    clock: Arc<dyn Clock>,
    sub: Subscription,
    limits: PushLimits,
    book: PushHealthBook,
) {
    let Mode::Push {
        url,
        concurrency,
        format,
        ..
    } = sub.rules.mode.clone()
    else {
        return;
    };
    let ack_wait = sub
        .rules
        .policy()
        .ack_wait
        .to_std()
        .unwrap_or(FALLBACK_ACK_WAIT);
    // Answer (or give up) before the lease ends, so the settle still counts.
    let timeout = ack_wait.mul_f64(0.9).max(Duration::from_millis(1));
    // No redirects: only the registered URL is ever POSTed to (a 3xx is a failed attempt).
    let client = match crate::outbound::http_client::client(timeout) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the push HTTP client");
            return;
        }
    };
    // A fixed member id per gateway: a restarted worker first takes back (releases) what its
    // predecessor held. Gateways sharing a database are members each; one that died loses
    // what it held when its session lapses (its id is new at every start).
    let session = match store.gateway_id() {
        "" => format!("push-{}", sub.id),
        gateway => format!("push-{gateway}-{}", sub.id),
    };
    let ttl = chrono::Duration::from_std(ack_wait * 2)
        .unwrap_or_default()
        .max(chrono::Duration::seconds(30));
    let mut renewed_at = clock.now();
    if let Err(e) = store
        .join(sub.id, &session, &sub.owner, ttl, renewed_at)
        .await
    {
        tracing::error!(error = %e, subscription = sub.id, "push worker cannot join");
        return;
    }
    let mut waker = Waker::for_fetching(&store, &clock);
    let mut inflight: JoinSet<Pushed> = JoinSet::new();
    // The payload bytes of each post in flight, by its task.
    let mut sizes: HashMap<tokio::task::Id, usize> = HashMap::new();
    loop {
        waker.mark();
        let bytes_out: usize = sizes.values().sum();
        let free_bytes = limits.bytes_in_flight.saturating_sub(bytes_out);
        let free = match free_bytes {
            0 => 0,
            _ => (concurrency as usize).saturating_sub(inflight.len()),
        };
        let now = clock.now();
        let mut next = None;
        if free > 0 {
            let take = Take {
                max: free,
                max_bytes: free_bytes,
                first_may_exceed: inflight.is_empty(),
            };
            match store.fetch(&session, take, now).await {
                Ok(handed) => {
                    renewed_at = now;
                    let fetched = handed.len();
                    for h in handed {
                        let size = h.message.payload.len();
                        let task = inflight.spawn(post(
                            client.clone(),
                            store.clone(),
                            Webhook {
                                url: url.clone(),
                                owner: sub.owner.clone(),
                            },
                            format,
                            h,
                            limits.answer_cap,
                        ));
                        sizes.insert(task.id(), size);
                    }
                    if fetched == free {
                        continue;
                    }
                    // Nothing more now: look again when time alone frees something.
                    match store.delivery_deadlines(Some(sub.id), now).await {
                        Ok(deadlines) => next = wake::next_fetch(&deadlines),
                        Err(e) => {
                            tracing::error!(error = %e, subscription = sub.id, "push deadlines unreadable")
                        }
                    }
                }
                Err(DeliveryError::NotFound(why)) => {
                    tracing::info!(subscription = sub.id, %why, "push worker stops");
                    return;
                }
                Err(e) => {
                    tracing::error!(error = %e, subscription = sub.id, "push fetch failed");
                    tokio::time::sleep(AFTER_ERROR).await;
                    continue;
                }
            }
        } else if now >= session::renew_by(renewed_at, ttl) {
            // Every slot busy: the session is renewed without fetching.
            match store.heartbeat(&session, now).await {
                Ok(_) => renewed_at = now,
                Err(DeliveryError::NotFound(why)) => {
                    tracing::info!(subscription = sub.id, %why, "push worker stops");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, subscription = sub.id, "push session renewal failed");
                    tokio::time::sleep(AFTER_ERROR).await;
                }
            }
        }
        let renew = session::renew_by(renewed_at, ttl);
        let next = next.map_or(renew, |n| n.min(renew));
        tokio::select! {
            Some(done) = inflight.join_next_with_id(), if !inflight.is_empty() => {
                match done {
                    Ok((task, (handed, outcome, cause, status))) => {
                        sizes.remove(&task);
                        book.note(sub.id, status, &outcome, &cause, clock.now());
                        settle(&store, &clock, &handed, outcome, cause).await;
                    }
                    Err(e) => {
                        sizes.remove(&e.id());
                    }
                }
            }
            _ = waker.wait(Some(next)) => {}
        }
    }
}

/// Where a push subscription POSTs, and whose subscription it is.
struct Webhook {
    url: String,
    owner: String,
}

/// What a push attempt came to: the message, its outcome, and what the endpoint answered (or
/// why it did not), which a dead letter's reason names.
type Pushed = (Handed, Outcome, String, Option<u16>);

/// How much of an endpoint's answer a dead letter's reason quotes.
const ANSWER_QUOTED: usize = 200;

/// An endpoint's answer as a dead letter's reason quotes it: its status and the beginning of
/// its body (control characters as spaces).
fn answered_with(answer: &crate::outbound::http_client::Heard) -> String {
    let text = String::from_utf8_lossy(&answer.body);
    let quoted: String = text
        .chars()
        .take(ANSWER_QUOTED)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let quoted = quoted.trim();
    if quoted.is_empty() {
        format!("HTTP {}", answer.status)
    } else {
        format!("HTTP {}: {quoted}", answer.status)
    }
}

async fn post(
    client: reqwest::Client,
    store: Store,
    webhook: Webhook,
    format: PushFormat,
    handed: Handed,
    answer_cap: usize,
) -> Pushed {
    let failed = outcome_for(None);
    let Webhook { url, owner } = webhook;
    let shown = redacted(&url);
    let cause = |why: &str| format!("push to {shown}: {why}");
    // Only webhooks registered for the subscription's owner: a registration or grant
    // withdrawn since the subscription was created stops the pushing (the attempt fails and,
    // in the end, dead-letters).
    match store.may_push_to(&owner, &url).await {
        Ok(true) => {}
        Ok(false) => {
            let url = redacted(&url);
            tracing::warn!(%url, %owner, "push endpoint is no longer registered for the subscription's owner; not sent");
            let why = cause("no longer registered for the subscription's owner");
            return (handed, failed, why, None);
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot check the push endpoint");
            let why = cause("the store could not check the endpoint");
            return (handed, failed, why, None);
        }
    }
    let request = match format {
        PushFormat::Json => {
            let mut body = message_json(&handed.message);
            body["attempt"] = json!(handed.receipt.attempt);
            body["subscription"] = json!(handed.receipt.subscription);
            client.post(&url).json(&body)
        }
        PushFormat::Soap => {
            let m = &handed.message;
            let soap = match soap::soap_request(&m.payload, &m.namespaces, &m.group_id, m.number) {
                Ok(soap) => soap,
                Err(why) => {
                    tracing::error!(offset = m.offset, %why, "message cannot be pushed as SOAP");
                    let why = cause(&format!("cannot be pushed as SOAP: {why}"));
                    return (handed, failed, why, None);
                }
            };
            soap.headers
                .iter()
                .fold(client.post(&url), |r, (name, value)| r.header(*name, value))
                .body(soap.envelope)
        }
    };
    crate::metrics::delivered("push", 1);
    let span =
        crate::telemetry::traced!("delivery.push", offset = handed.message.offset, url = %shown);
    let span = super::traced::of_message(&store, span, &handed.message).await;
    // The webhook may go on with the message's trace.
    let request = crate::telemetry::with_traceparent(request, &span);
    let failure = match exchange(request, answer_cap).instrument(span).await {
        Ok(answer) => {
            let by_status = outcome_for(StatusCode::from_u16(answer.status).ok());
            let outcome = match format {
                PushFormat::Json => by_status,
                PushFormat::Soap => soap::outcome(
                    soap::is_fault(answer.content_type.as_deref(), &answer.body),
                    by_status,
                ),
            };
            let why = cause(&answered_with(&answer));
            return (handed, outcome, why, Some(answer.status));
        }
        // Not followed: a failed attempt like any status that is not 2xx or 4xx.
        Err(AttemptFailure::Redirected(status)) => {
            let why = cause(&format!("HTTP {status}: a redirect, not followed"));
            let outcome = outcome_for(StatusCode::from_u16(status).ok());
            return (handed, outcome, why, Some(status));
        }
        Err(failure) => failure,
    };
    tracing::warn!(url = %shown, subscription = handed.receipt.subscription, error = %failure, "push attempt failed");
    crate::metrics::push_failed();
    (handed, failed, cause(&failure.to_string()), None)
}

async fn settle(
    store: &Store,
    clock: &Arc<dyn Clock>,
    handed: &Handed,
    outcome: Outcome,
    cause: String,
) {
    let label = outcome.label();
    match store
        .settle_by(&handed.receipt, Some(outcome), Some(cause), clock.now())
        .await
    {
        Ok(()) => crate::metrics::settled("push", label),
        Err(e) => {
            tracing::warn!(error = %e, offset = handed.message.offset, "push settle not applied")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_answers_map_to_outcomes() {
        assert_eq!(outcome_for(Some(StatusCode::OK)), Outcome::Accepted);
        assert_eq!(outcome_for(Some(StatusCode::NO_CONTENT)), Outcome::Accepted);
        assert_eq!(
            outcome_for(Some(StatusCode::BAD_REQUEST)),
            Outcome::Rejected
        );
        assert_eq!(outcome_for(Some(StatusCode::GONE)), Outcome::Rejected);
        for retried in [
            Some(StatusCode::REQUEST_TIMEOUT),
            Some(StatusCode::TOO_MANY_REQUESTS),
            Some(StatusCode::INTERNAL_SERVER_ERROR),
            Some(StatusCode::MOVED_PERMANENTLY),
            None,
        ] {
            assert!(
                matches!(
                    outcome_for(retried),
                    Outcome::Modified {
                        delivery_failed: true,
                        ..
                    }
                ),
                "{retried:?}"
            );
        }
    }
}
