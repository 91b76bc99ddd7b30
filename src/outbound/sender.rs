//! The sending RMP's worker: sends due messages (the stored envelope, unchanged, on every
//! attempt), reads the partner's answer for acks and faults, polls for Poll-pattern messages,
//! and tells notify webhooks when a message reaches its final state. Decisions are in
//! `rmp::sender` and `rmp::send_group`; this task only does the I/O, and waits for a commit
//! that made something due or for the next deadline by the gateway's clock.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument as _;

use reqwest::header::CONTENT_TYPE;
use tokio::task::JoinSet;

use super::http_client::{Heard, exchange, redacted};
use super::partner_clients::PartnerClients;
use super::view::Polling;
use crate::clock::Clock;
use crate::rmp::replies::Verdicts;
use crate::rmp::sender::{AttemptFailure, AttemptKind, AttemptNote, AttemptVerdict, Event};
use crate::store::health::Bursts;
use crate::store::outbound::{KeptResponse, OutMessage, ReplySource, ResponseInfo};
use crate::store::{Store, StoreError};
use crate::wsr::{
    FaultCode, Headers, Limits, PollRequest, RefToMessageIds, Reply, ReplyPattern, SeqRange,
    SoapVersion, read_message, write_envelope,
};

#[derive(Debug, Clone)]
pub struct SenderConfig {
    /// Messages of one ordered group in flight at once…
    pub window: u64,
    /// …unless the group's destination URL has its own (a partner's `send_window`: some
    /// peers hold out-of-order requests open). Keyed by URL until messages carry their
    /// partner's name; `send_windows` builds it.
    pub windows: BTreeMap<String, u64>,
    pub poll_interval: Duration,
    /// Concurrent sends.
    pub concurrency: usize,
    /// How long after ExpiryTime a message in doubt is polled for (`Outbound::due`).
    pub resolve_in_doubt: Duration,
    /// How long destinations keep delivered IDs after expiry (`Event::NotHeld`).
    pub partner_id_retention: Duration,
    /// Longest answer read from a destination or notify URL (`max_message_bytes`).
    pub answer_cap: usize,
}

/// The send windows of the partners that have their own, by their address (the destination
/// URL their messages are stored with).
pub fn send_windows(partners: &crate::partners::Partners) -> BTreeMap<String, u64> {
    let mut windows = BTreeMap::new();
    for p in partners.iter() {
        if let (Some(address), Some(window)) = (&p.outbound.address, p.outbound.send_window) {
            // First partner by name wins a URL two partners share, as `Partners::by_address`.
            windows.entry(address.clone()).or_insert(window.max(1));
        }
    }
    windows
}

/// The HTTP clients of the sender (`partner_clients`: the partner's TLS and our credentials
/// for configured partners, the guarded client for URL destinations) and the answer cap.
#[derive(Clone)]
pub struct Clients {
    routes: PartnerClients,
    cap: usize,
    /// For the next poll time notify webhooks show.
    polling: Polling,
    /// Messages this process is sending now (claimed, their answer not yet heard).
    sending: Sending,
}

/// The ids of the messages whose attempt is on its way. A message whose last attempt is
/// claimed counts as in doubt at once (`Outbound::in_doubt`), but a poll about it before its
/// send is answered asks about something the destination may not have read yet: a "not held"
/// then would say "not delivered" of a message arriving that moment. The poller skips these
/// until their attempt is done. (Another gateway's attempts are not known here.)
#[derive(Clone, Default)]
struct Sending(Arc<std::sync::Mutex<std::collections::HashSet<String>>>);

impl Sending {
    /// Marks `id` as being sent until the guard is dropped, however the attempt ends.
    fn hold(&self, id: &str) -> SendingGuard {
        self.ids().insert(id.to_owned());
        SendingGuard {
            sending: self.clone(),
            id: id.to_owned(),
        }
    }

    fn holds(&self, id: &str) -> bool {
        self.ids().contains(id)
    }

    fn ids(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct SendingGuard {
    sending: Sending,
    id: String,
}

impl Drop for SendingGuard {
    fn drop(&mut self) {
        self.sending.ids().remove(&self.id);
    }
}

/// Messages asked about in one PollRequest at most.
const POLL_PAGE: i64 = 500;

/// Why a 2xx poll answer told nothing (`read_poll_answer`).
const NOT_A_POLL_ANSWER: &str = "not a poll answer (a SOAP Fault, an error page or unreadable)";

/// Messages taken in one send pass at most.
const SEND_PAGE: i64 = 500;

/// The pause after a pass the store failed, before the next one.
const AFTER_STORE_FAILURE: Duration = Duration::from_secs(1);

/// Sends and polls until dropped, with the clients built at start (`App::build`).
pub async fn run(
    store: Store,
    clock: Arc<dyn Clock>,
    config: SenderConfig,
    clients: PartnerClients,
) {
    let client = Clients {
        routes: clients,
        cap: config.answer_cap,
        polling: Polling {
            interval: config.poll_interval,
        },
        sending: Sending::default(),
    };
    // Polls run beside the sends, not between them: a long poll pass (many messages waiting
    // on polls, a slow partner) must not hold up first attempts until they expire.
    tokio::join!(
        send_loop(&store, &client, &clock, &config),
        poll_loop(&store, &client, &clock, &config)
    );
}

/// Sends what is due, then waits for the next reason to look again: a commit that made a
/// message due (`outbound_due`), the next attempt due, or the ExpiryTime of a message its
/// window holds back — each by the gateway's clock.
async fn send_loop(store: &Store, client: &Clients, clock: &Arc<dyn Clock>, config: &SenderConfig) {
    loop {
        let now = clock.now();
        let pass = match send_due(store, client, clock, config, now).await {
            Ok(pass) => pass,
            Err(e) => {
                tracing::error!(error = %e, "outbound pass failed; retrying shortly");
                tokio::time::sleep(AFTER_STORE_FAILURE).await;
                continue;
            }
        };
        if pass.full {
            // More are due than one pass takes.
            tokio::task::yield_now().await;
            continue;
        }
        if pass.store_failed {
            // An attempt could not be saved: it is still due; try again after a pause.
            tokio::time::sleep(AFTER_STORE_FAILURE).await;
            continue;
        }
        // Everything due at `now` was taken or is held by its window; attempts since have
        // moved their own next attempt past `now`.
        let next = match store.next_outbound_due(now).await {
            Ok(next) => next,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the next attempt due; retrying shortly");
                tokio::time::sleep(AFTER_STORE_FAILURE).await;
                continue;
            }
        };
        let deadline = match (next, pass.held_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let due = async {
            match deadline {
                Some(t) => clock.sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = due => {}
            _ = store.outbound_due().notified() => {}
        }
    }
}

/// A poll pass every `poll_interval` of the gateway's clock.
async fn poll_loop(store: &Store, client: &Clients, clock: &Arc<dyn Clock>, config: &SenderConfig) {
    loop {
        if let Err(e) = poll(store, client, clock, config.partner_id_retention).await {
            tracing::error!(error = %e, "poll pass failed");
        }
        let next = crate::wsr::datetime::saturating_add_std(clock.now(), config.poll_interval);
        clock.sleep_until(next).await;
    }
}

/// What a send pass found.
struct Pass {
    /// It took as many as a pass takes: more may be due.
    full: bool,
    /// The store failed to save an attempt (logged).
    store_failed: bool,
    /// When a message its window holds back expires (`Due::held_until`).
    held_until: Option<chrono::DateTime<chrono::Utc>>,
}

/// One pass over the messages due at `now`. One message's failure is logged and does not
/// stop the others (it is still due, and retried on the next pass).
async fn send_due(
    store: &Store,
    client: &Clients,
    clock: &Arc<dyn Clock>,
    config: &SenderConfig,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Pass, StoreError> {
    let due = store
        .due_outbound(now, config.window.max(1), &config.windows, SEND_PAGE)
        .await?;
    let full = due.messages.len() as i64 >= SEND_PAGE;
    let mut store_failed = false;
    let mut tasks = JoinSet::new();
    for message in due.messages {
        while tasks.len() >= config.concurrency.max(1) {
            store_failed |= log_failure(tasks.join_next().await);
        }
        let (store, client, clock) = (store.clone(), client.clone(), clock.clone());
        let resolve_in_doubt = config.resolve_in_doubt;
        tasks.spawn(async move {
            attempt(&store, &client, clock.as_ref(), message, resolve_in_doubt).await
        });
    }
    while !tasks.is_empty() {
        store_failed |= log_failure(tasks.join_next().await);
    }
    Ok(Pass {
        full,
        store_failed,
        held_until: due.held_until,
    })
}

/// Logs an attempt that failed in the store or as a task; whether it did.
fn log_failure(done: Option<Result<Result<(), StoreError>, tokio::task::JoinError>>) -> bool {
    match done {
        Some(Ok(Err(e))) => tracing::error!(error = %e, "an attempt failed in the store"),
        Some(Err(e)) => tracing::error!(error = %e, "an attempt task failed"),
        _ => return false,
    }
    true
}

/// One attempt: counted and saved before the POST, so a crash can only cause a resend with
/// the same identity, never a lost attempt count.
async fn attempt(
    store: &Store,
    client: &Clients,
    clock: &dyn Clock,
    m: OutMessage,
    resolve_in_doubt: Duration,
) -> Result<(), StoreError> {
    let now = clock.now();
    let before = m.outbound.state.clone();
    let mut out = m.outbound.clone();
    if !out.due(now, resolve_in_doubt) {
        // Expired or out of attempts: the stop rules failed it.
        if out != m.outbound {
            let finished = store.save_outbound(&m.id, &before, &out, now).await?;
            notify(store, client, &finished).await;
        }
        return Ok(());
    }
    out.apply(Event::Sent, now);
    // Held before the claim: once the claim commits, the message reads as sent, and the poller
    // must already see it on its way, or it polls (and notes the poll) before the send.
    let _sending = client.sending.hold(&m.id);
    let Some(envelope) = store.claim_attempt(&m.id, &m.outbound, &out, now).await? else {
        // Acked, failed or claimed since it was read: nothing to send.
        return Ok(());
    };
    let route = client.routes.for_message(&m.partner, &m.destination);
    let envelope = route.secured(envelope, m.version, now);
    let request = route.post_soap(&m.destination, m.version, envelope);
    // The attempt is a span of the trace the message was submitted in, and the partner may
    // go on with it (`traceparent`).
    let span = attempt_span(store, &m).await;
    let request = crate::telemetry::with_traceparent(request, &span);
    let exchanged = exchange(request, client.cap).instrument(span.clone()).await;
    let heard = match exchanged {
        Ok(answer) => answered(store, &m, answer, clock).instrument(span).await?,
        Err(failure) => {
            if let AttemptFailure::TooLarge { limit } = failure {
                tracing::warn!(id = %m.id, limit, "the partner's answer is longer than max_message_bytes: a business response in it is not kept");
            }
            if failure.never_arrived() {
                // Refused before a byte went out: this attempt cannot have been delivered,
                // so it leaves no doubt to resolve by poll.
                out.apply(Event::Unreached, clock.now());
                store.save_unreached(&m.id, &out).await?;
            }
            send_noted(store, &m, None, Err(failure), clock.now()).await?;
            PartnerAnswer::default()
        }
    };
    let source = ReplySource::Destination(&m.destination);
    let mut finished = store
        .apply_replies(&heard.replies, source, clock.now())
        .await?;
    // A bare SOAP Fault with a WS-R code answers the message it responds to.
    if let (true, Some(code)) = (heard.replies.is_empty(), heard.fault) {
        let mut faulted = out.clone();
        faulted.apply(Event::Faulted(code), clock.now());
        finished.extend(
            store
                .save_outbound(&m.id, &out.state, &faulted, clock.now())
                .await?,
        );
    }
    notify(store, client, &finished).await;
    Ok(())
}

/// An attempt's span, in the trace its message was submitted in (traces exported only).
async fn attempt_span(store: &Store, m: &OutMessage) -> tracing::Span {
    let span = crate::telemetry::traced!("outbound.attempt", id = %m.id, attempt = m.outbound.attempts + 1);
    crate::telemetry::child_of(span, store.out_trace(&m.id)).await
}

/// What a partner's answer to an attempt says. Its business response, if it carries one, is
/// kept first (before its ack settles the message, so that whoever hears of the ack can
/// read the response); the attempt is noted with what the answer said of the message, and an
/// answer without a verdict the pattern needs is a failed attempt.
async fn answered(
    store: &Store,
    m: &OutMessage,
    answer: Heard,
    clock: &dyn Clock,
) -> Result<PartnerAnswer, StoreError> {
    let (heard, unreadable) = read_answer_or_defect(answer.content_type.as_deref(), &answer.body);
    let said = !heard.replies.is_empty() || heard.fault.is_some();
    tracing::debug!(id = %m.id, status = answer.status, replies = heard.replies.len(), "sent");
    let verdict = AttemptVerdict::on(&heard.replies, heard.fault, &m.key());
    let failure =
        AttemptFailure::of_answer(answer.status, said, unreadable.as_deref()).or_else(|| {
            let silent = m.reply == ReplyPattern::Response.value()
                && (200..300).contains(&answer.status)
                && verdict == AttemptVerdict::Nothing;
            silent.then_some(AttemptFailure::NoVerdict(answer.status))
        });
    let outcome = match failure {
        Some(failure) => Err(failure),
        None => Ok(verdict),
    };
    send_noted(store, m, Some(answer.status), outcome, clock.now()).await?;
    if let Some(soap_fault) = heard.business {
        keep_response(store, m, answer, soap_fault, clock.now()).await?;
    }
    Ok(heard)
}

/// Keeps the business response in a partner's answer with our message (Notify with a
/// response, D16): the answer as received, which `exchange` read within `max_message_bytes`.
async fn keep_response(
    store: &Store,
    m: &OutMessage,
    answer: Heard,
    soap_fault: bool,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), StoreError> {
    let content_type = answer
        .content_type
        .unwrap_or_else(|| m.version.content_type().to_owned());
    let response = KeptResponse {
        info: ResponseInfo {
            content_type,
            size: answer.body.len() as u64,
            soap_fault,
            received_at: now,
        },
        body: answer.body,
    };
    if store.keep_response(&m.id, &response).await? {
        tracing::debug!(id = %m.id, size = response.info.size, soap_fault, "business response kept");
    }
    Ok(())
}

/// What a partner's answer says: the acks and faults of its `wsrm:Response`, the WS-R code of
/// a SOAP Fault body, and whether its Body holds a business response (`Some(true)`: an
/// application SOAP Fault).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartnerAnswer {
    pub replies: Vec<Reply>,
    pub fault: Option<FaultCode>,
    pub business: Option<bool>,
}

/// Failure lines per partner (or URL destination) and kind of failure: one partner that is
/// down would otherwise write a line per message and attempt.
static PARTNER_FAILURES: Bursts = Bursts::new();

/// Notes a send attempt in the message's story and the metrics: what the answer (`status`,
/// none when none came) said of the message, or why the attempt failed. A failure is kept as
/// the message's `last_error` and logged at WARN when its cause is new for the message —
/// at most one line per partner and kind of failure per `REPEAT_EVERY`, with how many were
/// not logged (the rest at DEBUG).
async fn send_noted(
    store: &Store,
    m: &OutMessage,
    status: Option<u16>,
    outcome: Result<AttemptVerdict, AttemptFailure>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), StoreError> {
    let resend = m.outbound.attempts > 0;
    let note = match &outcome {
        Ok(verdict) => {
            crate::metrics::outbound_attempt(&m.partner, resend, verdict.name());
            AttemptNote::answered(AttemptKind::Send, now, status, *verdict)
        }
        Err(failure) => {
            crate::metrics::outbound_attempt(&m.partner, resend, failure.result());
            crate::metrics::outbound_failed(&m.partner);
            let note = AttemptNote::failed(AttemptKind::Send, now, status, failure);
            let cause = note.failure.as_deref().unwrap_or_default();
            let new_cause = m.last_error.as_ref().is_none_or(|e| e.cause != cause);
            let to = partner_or_destination(&m.partner, &m.destination);
            let burst = format!("{to}\u{0}{}", failure.result());
            let destination = redacted(&m.destination);
            let attempt = m.outbound.attempts + 1;
            match new_cause.then(|| PARTNER_FAILURES.admit(&burst, Instant::now())) {
                Some(Some(repeated)) => {
                    tracing::warn!(id = %m.id, partner = %to, %destination, attempt, error = %cause, repeated, "send attempt failed; will resend while the schedule allows")
                }
                _ => {
                    tracing::debug!(id = %m.id, partner = %to, %destination, attempt, error = %cause, "send attempt failed")
                }
            }
            note
        }
    };
    store
        .record_attempts(&m.partner, &[(m.id.clone(), note)])
        .await
}

/// Who a failure line names: the configured partner, or the URL (without credentials) of a
/// message sent to a URL destination.
fn partner_or_destination(partner: &str, destination: &str) -> String {
    if partner.is_empty() {
        redacted(destination)
    } else {
        partner.to_owned()
    }
}

/// Reads a partner's answer (any SOAP version, plain or MIME). An answer that says nothing
/// or cannot be read says nothing: the message is then simply resent.
pub fn read_answer(content_type: Option<&str>, body: &[u8]) -> PartnerAnswer {
    read_answer_or_defect(content_type, body).0
}

/// `read_answer`, and why the body could not be read, if it could not.
fn read_answer_or_defect(
    content_type: Option<&str>,
    body: &[u8],
) -> (PartnerAnswer, Option<String>) {
    if body.is_empty() {
        return (PartnerAnswer::default(), None);
    }
    match read_message(content_type, body, &Limits::default()) {
        Ok(env) => (
            PartnerAnswer {
                business: env.body.business_response(),
                replies: env.response.map(|r| r.replies).unwrap_or_default(),
                fault: env.body.fault,
            },
            None,
        ),
        Err(defect) => (PartnerAnswer::default(), Some(defect.to_string())),
    }
}

/// A poll's answer as the destination's own word: its acks and faults, or `None` when the
/// answer is not one (an error status, a SOAP Fault, an unreadable body, an intermediary's
/// error page) and nothing may be concluded from it — least of all "not delivered".
pub fn read_poll_answer(
    status: u16,
    content_type: Option<&str>,
    body: &[u8],
) -> Option<Vec<Reply>> {
    match status {
        // D11: nothing to say is an answer without a wsrm:Response.
        202 if body.is_empty() => Some(Vec::new()),
        200 => {
            let env = read_message(content_type, body, &Limits::default()).ok()?;
            if env.body.fault.is_some() {
                return None;
            }
            Some(env.response.map(|r| r.replies).unwrap_or_default())
        }
        _ => None,
    }
}

/// Asks each destination about the messages only a poll can settle: Poll-pattern messages
/// waiting for an ack, and messages in doubt (`Outbound::in_doubt`).
async fn poll(
    store: &Store,
    client: &Clients,
    clock: &Arc<dyn Clock>,
    partner_id_retention: Duration,
) -> Result<(), StoreError> {
    let mut after = String::new();
    let mut in_doubt = 0;
    loop {
        let page = store.awaiting_poll(&after, POLL_PAGE).await?;
        let Some(last) = page.last() else {
            crate::metrics::outbound_in_doubt(in_doubt);
            return Ok(());
        };
        in_doubt += page.iter().filter(|m| m.outbound.in_doubt()).count();
        after = last.id.clone();
        let not_on_their_way = page.into_iter().filter(|m| !client.sending.holds(&m.id));
        poll_page(
            store,
            client,
            clock,
            partner_id_retention,
            not_on_their_way.collect(),
        )
        .await?;
    }
}

/// Polls each destination about one page of messages.
async fn poll_page(
    store: &Store,
    client: &Clients,
    clock: &Arc<dyn Clock>,
    partner_id_retention: Duration,
    waiting: Vec<OutMessage>,
) -> Result<(), StoreError> {
    // One PollRequest per (partner, destination, version): each carries our credentials for
    // that partner, and asks only about messages sent to it.
    let mut by_destination: BTreeMap<(String, String, SoapVersion), Vec<OutMessage>> =
        BTreeMap::new();
    for m in waiting {
        by_destination
            .entry((m.partner.clone(), m.destination.clone(), m.version))
            .or_default()
            .push(m);
    }
    for ((partner, destination, version), messages) in by_destination {
        let refs = messages
            .iter()
            .map(|m| RefToMessageIds {
                group_id: m.group_id.clone(),
                ranges: m.number.map(SeqRange::single).into_iter().collect(),
            })
            .collect();
        let poll = PollRequest {
            refs,
            reply_to: None,
        };
        let xml = write_envelope(
            version,
            Headers {
                poll_request: Some(&poll),
                ..Headers::default()
            },
            "",
        );
        let asked_at = clock.now();
        // Asked at the partner's poll address, if it has one; the answer still speaks for
        // the destination (`ReplySource` below), where the messages went.
        let route = client.routes.for_message(&partner, &destination);
        let xml = route.secured(xml, version, asked_at);
        let request = route.post_soap(route.poll_target(&destination), version, xml);
        let asked: Vec<String> = messages.iter().map(|m| m.id.clone()).collect();
        let span =
            crate::telemetry::traced!("outbound.poll", partner = %partner, messages = asked.len());
        let (status, ct, body) = match exchange(request, client.cap).instrument(span).await {
            Ok(answer) => (answer.status, answer.content_type, answer.body),
            Err(failure) => {
                crate::metrics::outbound_poll(&partner, false);
                let note = AttemptNote::failed(AttemptKind::Poll, clock.now(), None, &failure);
                poll_failed(store, &partner, &destination, &asked, note, &failure).await?;
                continue;
            }
        };
        let Some(replies) = read_poll_answer(status, ct.as_deref(), &body) else {
            crate::metrics::outbound_poll(&partner, false);
            let failure = AttemptFailure::of_answer(status, false, Some(NOT_A_POLL_ANSWER))
                .unwrap_or(AttemptFailure::Unreadable(NOT_A_POLL_ANSWER.into()));
            let note = AttemptNote::failed(AttemptKind::Poll, clock.now(), Some(status), &failure);
            poll_failed(store, &partner, &destination, &asked, note, &failure).await?;
            continue;
        };
        crate::metrics::outbound_poll(&partner, true);
        let verdicts = Verdicts::new(&replies);
        let answered_at = clock.now();
        let notes: Vec<(String, AttemptNote)> = messages
            .iter()
            .map(|m| {
                let verdict = AttemptVerdict::said(&verdicts, None, &m.key());
                let note =
                    AttemptNote::answered(AttemptKind::Poll, answered_at, Some(status), verdict);
                (m.id.clone(), note)
            })
            .collect();
        store.record_attempts(&partner, &notes).await?;
        let source = ReplySource::Destination(&destination);
        let mut finished = store.apply_replies(&replies, source, clock.now()).await?;
        let unnamed = unnamed(&messages, &replies);
        finished.extend(
            store
                .not_held(&unnamed, asked_at, partner_id_retention, clock.now())
                .await?,
        );
        notify(store, client, &finished).await;
    }
    Ok(())
}

/// A poll that got no usable answer: noted in the story of every message it asked about and
/// kept as their `last_error`; one WARN line for the destination, at most one per
/// `REPEAT_EVERY` and kind of failure. They are asked again on the next pass.
async fn poll_failed(
    store: &Store,
    partner: &str,
    destination: &str,
    asked: &[String],
    note: AttemptNote,
    failure: &AttemptFailure,
) -> Result<(), StoreError> {
    let to = partner_or_destination(partner, destination);
    let burst = format!("{to}\u{0}poll\u{0}{}", failure.result());
    let cause = note.failure.as_deref().unwrap_or_default();
    if let Some(repeated) = PARTNER_FAILURES.admit(&burst, Instant::now()) {
        let destination = redacted(destination);
        tracing::warn!(partner = %to, %destination, messages = asked.len(), error = %cause, repeated, "poll failed; asking again later");
    }
    let notes: Vec<(String, AttemptNote)> =
        asked.iter().map(|id| (id.clone(), note.clone())).collect();
    store.record_attempts(partner, &notes).await
}

/// The messages a poll answer does not name: the destination does not hold them. One pass
/// over the answer and one lookup per message, never answer × messages.
fn unnamed(messages: &[OutMessage], replies: &[Reply]) -> Vec<String> {
    let verdicts = Verdicts::new(replies);
    messages
        .iter()
        .filter(|m| !verdicts.names(&m.key()))
        .map(|m| m.id.clone())
        .collect()
}

/// A notify webhook's JSON: the message's, with its business response inline when small
/// (else its link only, as when the response cannot be read now).
async fn notify_body(store: &Store, m: &OutMessage, polling: Polling) -> String {
    let small = m
        .response
        .as_ref()
        .is_some_and(|r| r.size <= super::view::INLINE_RESPONSE_BYTES);
    let response = if small {
        store.out_response(&m.id).await.ok().flatten()
    } else {
        None
    };
    super::view::notify_json(m, polling, response.as_ref()).to_string()
}

/// Tells a submission's notify webhook its message reached a final state. Best effort: the
/// state and the event are stored either way (`GET /api/v1/messages/{id}`, `/api/v1/events`).
pub async fn notify(store: &Store, client: &Clients, finished: &[String]) {
    for id in finished {
        let Ok(Some(m)) = store.out_message(id).await else {
            continue;
        };
        let Some(url) = &m.notify_url else {
            continue;
        };
        // Only webhooks registered for the submitter (the push endpoints), also if withdrawn
        // since the submit. A message stored before principals were has none: only a webhook
        // registered for every principal serves it.
        let principal = m.principal.as_deref().unwrap_or("*");
        match store.may_push_to(principal, url).await {
            Ok(true) => {}
            Ok(false) => {
                let url = redacted(url);
                tracing::warn!(%id, %url, "notify URL is no longer registered for the submitter; not notified");
                continue;
            }
            Err(e) => {
                tracing::error!(%id, error = %e, "cannot check the notify URL");
                continue;
            }
        }
        let body = notify_body(store, &m, client.polling).await;
        let request = client
            .routes
            .webhooks()
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .body(body);
        let failure = match exchange(request, client.cap).await {
            Ok(answer) if (200..300).contains(&answer.status) => continue,
            Ok(answer) => AttemptFailure::Status(answer.status),
            Err(failure) => failure,
        };
        let url = redacted(url);
        tracing::warn!(%id, %url, error = %failure, "notify webhook failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wsr::{GroupId, ReplyRange, Response, SoapFault, write_soap_fault};

    #[test]
    fn a_message_is_skipped_by_the_poller_exactly_while_its_attempt_is_on_its_way() {
        let sending = Sending::default();
        let attempt = sending.hold("m1");
        assert!(sending.holds("m1"));
        assert!(!sending.holds("m2"));
        // An attempt that ends any way (answered, failed, its task dropped) lets it go.
        drop(attempt);
        assert!(!sending.holds("m1"));
    }

    fn ack_envelope() -> String {
        let response = Response {
            replies: vec![Reply::Sequence {
                group_id: GroupId::parse("mid:g").expect("group"),
                ranges: vec![ReplyRange {
                    range: SeqRange::single(3),
                    fault: None,
                }],
            }],
        };
        write_envelope(
            SoapVersion::Soap11,
            Headers {
                response: Some(&response),
                ..Headers::default()
            },
            "",
        )
    }

    /// A Body with an application's answer is a business response (an application SOAP
    /// Fault one too); an empty Body, or a SOAP Fault with a WS-R code, is not.
    #[test]
    fn business_responses_are_told_apart() {
        let ct = Some("text/xml; charset=utf-8");
        let echo = "<soap:Envelope xmlns:soap=\"http://schemas.xmlsoap.org/soap/envelope/\">\
                    <soap:Body><e:echoResponse xmlns:e=\"urn:e\"/></soap:Body></soap:Envelope>";
        assert_eq!(read_answer(ct, echo.as_bytes()).business, Some(false));
        let app_fault = "<soap:Envelope xmlns:soap=\"http://schemas.xmlsoap.org/soap/envelope/\">\
                         <soap:Body><soap:Fault><faultcode>soap:Server</faultcode>\
                         <faultstring>no</faultstring></soap:Fault></soap:Body></soap:Envelope>";
        assert_eq!(read_answer(ct, app_fault.as_bytes()).business, Some(true));
        assert_eq!(read_answer(ct, ack_envelope().as_bytes()).business, None);
        let wsr_fault = write_soap_fault(
            SoapVersion::Soap11,
            &SoapFault {
                code: FaultCode::MessageProcessingFailure,
                reason: "later".into(),
            },
            None,
        );
        let answer = read_answer(ct, wsr_fault.as_bytes());
        assert_eq!((answer.business, answer.fault.is_some()), (None, true));
        let multipart =
            format!("--b\r\nContent-Type: text/xml\r\nContent-ID: <r>\r\n\r\n{echo}\r\n--b--");
        let mime = Some("multipart/related; boundary=b; type=\"text/xml\"; start=\"<r>\"");
        assert_eq!(
            read_answer(mime, multipart.as_bytes()).business,
            Some(false)
        );
    }

    /// Silence means "not held" only when it is the destination's answer: a proxy's 503, a
    /// SOAP Fault or an unreadable page must never fail a message that may be delivered.
    #[test]
    fn only_the_destinations_own_answer_counts() {
        let ct = Some("text/xml; charset=utf-8");
        assert_eq!(read_poll_answer(202, None, b""), Some(Vec::new()));
        let acks = read_poll_answer(200, ct, ack_envelope().as_bytes()).expect("an answer");
        assert_eq!(acks.len(), 1);
        assert_eq!(read_poll_answer(503, Some("text/plain"), b"busy"), None);
        assert_eq!(
            read_poll_answer(200, Some("text/html"), b"<html>oops"),
            None
        );
        assert_eq!(read_poll_answer(202, None, b"accepted, maybe"), None);
        let fault = write_soap_fault(
            SoapVersion::Soap11,
            &SoapFault {
                code: FaultCode::MessageProcessingFailure,
                reason: "poll again later".into(),
            },
            None,
        );
        assert_eq!(read_poll_answer(200, ct, fault.as_bytes()), None);
        assert_eq!(read_poll_answer(500, ct, fault.as_bytes()), None);
    }
}
