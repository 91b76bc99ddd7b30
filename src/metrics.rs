//! The gateway's Prometheus metrics: the names and label values every room records with (the
//! `metrics` facade) and the one process-wide recorder. It owns no I/O, no rules and imports
//! no room: rooms call the small functions below where the event happens, and `http/metrics.rs`
//! renders the recorder with the store's gauges.
//!
//! Counters and histograms are this process's own (a cluster's totals are the sum over its
//! gateways).
//!
//! Labels are bounded: configured channel and partner names, fault codes, fixed words. Never a
//! group id, message id or URL. Callers and destinations without a partner are `anonymous`
//! (`ANONYMOUS`: the one name of "no partner" everywhere, the console and CLI included).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{LazyLock, Mutex, OnceLock, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// The label value of a request or message without a configured partner.
pub const ANONYMOUS: &str = "anonymous";

/// Buckets of the latency histograms (seconds): group commits take about a millisecond on a
/// fast disk and tens of milliseconds on a slow one; held Response-pattern answers take up
/// to `hold_ms` (default 1 s) and long-poll fetches longer.
const SECONDS_BUCKETS: &[f64] = &[
    0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Buckets of the writer's batch size (jobs per transaction; at most 256).
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// Installs the process-wide recorder (once, whoever asks first) and answers its handle.
/// `None` when another recorder was installed before ours (an embedding program's): the
/// gateway then records into that one and `/metrics` shows only the store's gauges.
pub fn handle() -> Option<&'static PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let installed = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(WRITER_BATCH_SIZE.into()), BATCH_BUCKETS)
                })
                .and_then(PrometheusBuilder::install_recorder);
            match installed {
                Ok(handle) => {
                    describe();
                    Some(handle)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot install the metrics recorder");
                    None
                }
            }
        })
        .as_ref()
}

pub const RECEIVED: &str = "wsr_received_messages_total";
pub const FAULTS: &str = "wsr_faults_total";
pub const ACKS_SENT: &str = "wsr_acks_sent_total";
pub const CALLBACK_FAILURES: &str = "wsr_callback_send_failures_total";
pub const OUTBOUND_ATTEMPTS: &str = "wsr_outbound_attempts_total";
pub const AUTH_REFUSALS: &str = "wsr_auth_refusals_total";
pub const OUTBOUND_FAILURES: &str = "wsr_outbound_attempt_failures_total";
pub const OUTBOUND_POLLS: &str = "wsr_outbound_polls_total";
pub const OUTBOUND_IN_DOUBT: &str = "wsr_outbound_in_doubt_messages";
pub const DELIVERIES: &str = "wsr_deliveries_total";
pub const SETTLES: &str = "wsr_settles_total";
pub const PUSH_FAILURES: &str = "wsr_push_failures_total";
pub const WRITER_BATCH_SIZE: &str = "wsr_writer_batch_size";
pub const WRITER_COMMIT_SECONDS: &str = "wsr_writer_commit_seconds";
pub const WAL_SYNC_SECONDS: &str = "wsr_wal_sync_seconds";
pub const HTTP_SECONDS: &str = "wsr_http_request_duration_seconds";
pub const BACKEND_CALLS: &str = "wsr_backend_calls_total";
pub const BACKEND_SECONDS: &str = "wsr_backend_call_duration_seconds";
pub const REFUSED: &str = "wsr_requests_refused_total";
pub const HELD_BACK: &str = "wsr_source_quota_refusals_total";

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        RECEIVED,
        "Reliable messages and polls received at /wsr/{channel}, by verdict"
    );
    describe_counter!(FAULTS, "WS-R faults answered to partners, by fault code");
    describe_counter!(
        HELD_BACK,
        "Messages refused (MessageProcessingFailure) because their source's storage quota was \
         used up, by channel, partner and quota (stored_bytes, messages_per_second)"
    );
    describe_counter!(
        ACKS_SENT,
        "Acks sent to partners, by reply pattern (response, callback, poll)"
    );
    describe_counter!(
        CALLBACK_FAILURES,
        "Callback ack POSTs that failed (retried later)"
    );
    describe_counter!(
        OUTBOUND_ATTEMPTS,
        "Send attempts of our messages (first or resend), by result: ack, fault, none (an answer \
         without a verdict where the pattern allows one), or why it failed (unreachable, \
         timeout, redirect, error_status, too_large, no_verdict, unreadable, transport)"
    );
    describe_counter!(OUTBOUND_FAILURES, "Send attempts that failed");
    describe_counter!(
        AUTH_REFUSALS,
        "Partner sign-ins refused, by partner (the username's; (unknown username); anonymous: \
         none presented) and reason"
    );
    describe_counter!(OUTBOUND_POLLS, "PollRequests we sent, by result");
    describe_gauge!(
        OUTBOUND_IN_DOUBT,
        "Messages in doubt (sent, no verdict, expired) seen by this gateway's last poll pass"
    );
    describe_counter!(
        DELIVERIES,
        "Messages handed to applications (pull fetches, push POSTs)"
    );
    describe_counter!(SETTLES, "Deliveries settled, by outcome");
    describe_counter!(PUSH_FAILURES, "Push webhook POSTs without an answer");
    describe_counter!(
        REFUSED,
        "Requests and connections the listener refused for load, by class (partners, api, \
         waiting, operators, tls) and reason (class_full, share_used, handshakes_per_source)"
    );
    describe_histogram!(
        WRITER_BATCH_SIZE,
        Unit::Count,
        "Jobs committed in one group-commit transaction"
    );
    describe_histogram!(
        WRITER_COMMIT_SECONDS,
        Unit::Seconds,
        "Time of one group-commit batch, from its first statement to its commit (durable on \
         PostgreSQL; on SQLite the WAL's sync follows, wsr_wal_sync_seconds)"
    );
    describe_histogram!(
        WAL_SYNC_SECONDS,
        Unit::Seconds,
        "Time of one fdatasync of the SQLite WAL, which the answers of the commits it covers wait \
         for"
    );
    describe_counter!(
        BACKEND_CALLS,
        "Calls to request-response channels' SOAP backends, by channel and outcome \
         (answered, fault, not_delivered, unknown)"
    );
    describe_histogram!(
        BACKEND_SECONDS,
        Unit::Seconds,
        "Calls to request-response channels' SOAP backends, until the answer is read"
    );
    describe_histogram!(
        HTTP_SECONDS,
        Unit::Seconds,
        "HTTP requests by route, method and status class, until the response head"
    );
}

/// The handles of one metric by the values of its labels, kept once registered. Registering
/// (`metrics::counter!` and the like) builds the key, copies it with every label value and
/// looks it up in the recorder's registry on every call: about ten allocations for each
/// message received, fetched or settled. A kept handle costs one lookup and, once its label
/// set was seen, no allocation. Label sets are as bounded as the metrics' own, and made of
/// configured names (partners, channels, routes) and fixed words, so they hash with foldhash:
/// SipHash's defence against chosen keys buys nothing here, on several lookups a message.
struct Kept<H> {
    handles: LazyLock<RwLock<foldhash::HashMap<String, H>>>,
}

thread_local! {
    /// The lookup key being built, reused: the label values, each after its length.
    static KEY: RefCell<String> = const { RefCell::new(String::new()) };
}

impl<H: Clone> Kept<H> {
    const fn new() -> Kept<H> {
        Kept {
            handles: LazyLock::new(|| RwLock::new(foldhash::HashMap::default())),
        }
    }

    /// The handle of the series `labels` name, registered by `register` the first time.
    fn get(&self, labels: &[&str], register: impl FnOnce() -> H) -> H {
        KEY.with_borrow_mut(|key| {
            key.clear();
            for value in labels {
                // The length first: no two label sets spell the same key. (Writing to a
                // `String` cannot fail.)
                let _ = write!(key, "{}:", value.len());
                key.push_str(value);
            }
            let known = self.handles.read().unwrap_or_else(|e| e.into_inner());
            if let Some(handle) = known.get(key.as_str()) {
                return handle.clone();
            }
            drop(known);
            // Our recorder first, so that no handle of the no-op one is kept.
            let _ = handle();
            let mut handles = self.handles.write().unwrap_or_else(|e| e.into_inner());
            handles.entry(key.clone()).or_insert_with(register).clone()
        })
    }
}

/// The label value of a partner: its configured name, or `anonymous`.
pub fn partner(name: Option<&str>) -> &str {
    match name {
        Some(n) if !n.is_empty() => n,
        _ => ANONYMOUS,
    }
}

/// One received message or poll at `/wsr/{channel}` (`verdict`: `delivered`, `buffered`,
/// `duplicate`, `fault`, `poll`, `not_stored`), and its fault code if it got one.
pub fn received(channel: &str, partner: &str, verdict: &'static str, fault: Option<&'static str>) {
    static KEPT: Kept<metrics::Counter> = Kept::new();
    KEPT.get(&[channel, partner, verdict], || {
        metrics::counter!(RECEIVED, "channel" => channel.to_owned(), "partner" => partner.to_owned(), "verdict" => verdict)
    })
    .increment(1);
    if let Some(code) = fault {
        metrics::counter!(FAULTS, "channel" => channel.to_owned(), "partner" => partner.to_owned(), "code" => code).increment(1);
        let mut answered = FAULTS_ANSWERED.lock().unwrap_or_else(|e| e.into_inner());
        *answered
            .entry((channel.to_owned(), partner.to_owned(), code))
            .or_default() += 1;
    }
}

/// The faults this process answered, as `wsr_faults_total` counts them, kept readable for the
/// console's overview (the recorder's own values are write-only). Keyed by the same bounded
/// labels, so it stays as small as the metric.
static FAULTS_ANSWERED: Mutex<BTreeMap<(String, String, &'static str), u64>> =
    Mutex::new(BTreeMap::new());

/// One count of faults answered by this process since it started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultsAnswered {
    pub channel: String,
    /// A configured partner's name, or `anonymous`.
    pub partner: String,
    /// The WS-R fault code's local name (`InvalidRequest`, …).
    pub code: &'static str,
    pub count: u64,
}

/// Faults answered by this process since it started, by channel, partner and code.
pub fn faults_answered() -> Vec<FaultsAnswered> {
    let answered = FAULTS_ANSWERED.lock().unwrap_or_else(|e| e.into_inner());
    answered
        .iter()
        .map(|((channel, partner, code), count)| FaultsAnswered {
            channel: channel.clone(),
            partner: partner.clone(),
            code,
            count: *count,
        })
        .collect()
}

/// A message its source's storage quota held back (D13): counted by channel, partner and
/// quota (`stored_bytes`, `messages_per_second`), and its source kept for the console.
/// `true` when the source had not been held back for a minute (worth a log line).
pub fn held_back(
    channel: &str,
    partner: &str,
    source: &str,
    quota: &'static str,
    at: DateTime<Utc>,
) -> bool {
    metrics::counter!(HELD_BACK, "channel" => channel.to_owned(), "partner" => self::partner(Some(partner)).to_owned(), "quota" => quota).increment(1);
    let mut held = HELD_BACK_SOURCES.lock().unwrap_or_else(|e| e.into_inner());
    if held.len() >= MAX_HELD_BACK_SOURCES && !held.contains_key(source) {
        let oldest = held
            .iter()
            .min_by_key(|(_, h)| h.last)
            .map(|(s, _)| s.clone());
        if let Some(oldest) = oldest {
            held.remove(&oldest);
        }
    }
    let entry = held
        .entry(source.to_owned())
        .or_insert_with(|| HeldBackSource {
            source: source.to_owned(),
            partner: self::partner(Some(partner)).to_owned(),
            channel: channel.to_owned(),
            quota,
            count: 0,
            first: at,
            last: at - chrono::Duration::minutes(1),
        });
    let quiet_for_a_minute = at - entry.last >= chrono::Duration::minutes(1);
    entry.count += 1;
    entry.last = at;
    entry.quota = quota;
    entry.channel = channel.to_owned();
    quiet_for_a_minute
}

/// A partner sign-in this process refused (`partners::Unidentified`): counted in
/// `wsr_auth_refusals_total{partner,reason}` — `partner` a configured name when the username
/// presented is one (a wrong password), `UNKNOWN_USERNAME` when it is nobody's, `ANONYMOUS`
/// when no username was presented (a token, a certificate) — and kept for the partners view
/// with the last username tried. Usernames are never labels (anyone may send any).
pub fn auth_refused(
    partner: Option<&str>,
    username: Option<&str>,
    reason: &'static str,
    at: DateTime<Utc>,
) {
    let key = match (partner, username) {
        (Some(p), _) => p,
        (None, Some(_)) => UNKNOWN_USERNAME,
        (None, None) => ANONYMOUS,
    };
    metrics::counter!(AUTH_REFUSALS, "partner" => key.to_owned(), "reason" => reason).increment(1);
    let mut refused = REFUSED_SIGN_INS.lock().unwrap_or_else(|p| p.into_inner());
    let entry = refused
        .entry(key.to_owned())
        .or_insert_with(|| RefusedSignIns {
            count: 0,
            last: at,
            last_username: None,
            last_reason: reason,
        });
    entry.count += 1;
    entry.last = at;
    entry.last_reason = reason;
    if let Some(user) = username {
        entry.last_username = Some(username_shown(user));
    }
}

/// A username someone presented, as the partners view and the log show it: at most 64
/// characters, without control characters (anyone may send any).
pub fn username_shown(user: &str) -> String {
    user.chars().filter(|c| !c.is_control()).take(64).collect()
}

/// The `partner` of a refused sign-in whose username is nobody's.
pub const UNKNOWN_USERNAME: &str = "(unknown username)";

static REFUSED_SIGN_INS: Mutex<BTreeMap<String, RefusedSignIns>> = Mutex::new(BTreeMap::new());

/// Refused sign-ins of one partner (or of unknown usernames, or without one) on this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedSignIns {
    pub count: u64,
    pub last: DateTime<Utc>,
    /// The username of the latest refusal that presented one (at most 64 characters).
    pub last_username: Option<String>,
    pub last_reason: &'static str,
}

/// This process's refused sign-ins, by partner (`UNKNOWN_USERNAME`, `ANONYMOUS` included).
/// Bounded: the keys are configured partner names and the two fixed words.
pub fn refused_sign_ins() -> BTreeMap<String, RefusedSignIns> {
    REFUSED_SIGN_INS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

/// Most sources the console's "held back" list keeps (the least recent go first).
const MAX_HELD_BACK_SOURCES: usize = 64;

static HELD_BACK_SOURCES: Mutex<BTreeMap<String, HeldBackSource>> = Mutex::new(BTreeMap::new());

/// A source this process held back by its storage quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldBackSource {
    /// `partner:{name}`, or the anonymous peer's address (IPv6: its /64).
    pub source: String,
    pub partner: String,
    /// The channel and quota of its latest refusal.
    pub channel: String,
    pub quota: &'static str,
    pub count: u64,
    pub first: DateTime<Utc>,
    pub last: DateTime<Utc>,
}

/// The sources held back by this process since it started (at most 64), latest first.
pub fn held_back_sources() -> Vec<HeldBackSource> {
    let held = HELD_BACK_SOURCES.lock().unwrap_or_else(|e| e.into_inner());
    let mut sources: Vec<HeldBackSource> = held.values().cloned().collect();
    sources.sort_by_key(|h| std::cmp::Reverse(h.last));
    sources
}

/// `n` acks sent by `pattern` (`response`, `callback`, `poll`).
pub fn acks_sent(pattern: &'static str, n: u64) {
    if n > 0 {
        static KEPT: Kept<metrics::Counter> = Kept::new();
        KEPT.get(
            &[pattern],
            || metrics::counter!(ACKS_SENT, "pattern" => pattern),
        )
        .increment(n);
    }
}

pub fn callback_failed(partner: &str) {
    metrics::counter!(CALLBACK_FAILURES, "partner" => self::partner(Some(partner)).to_owned())
        .increment(1);
}

/// The label value of the partner an outbound message goes to: `url` for a URL destination.
fn destination(partner: &str) -> String {
    if partner.is_empty() {
        ANONYMOUS.to_owned()
    } else {
        partner.to_owned()
    }
}

/// A send attempt of one of our messages: its first, or a resend.
pub fn outbound_attempt(partner: &str, resend: bool, result: &'static str) {
    let kind = if resend { "resend" } else { "first" };
    metrics::counter!(OUTBOUND_ATTEMPTS, "partner" => destination(partner), "kind" => kind, "result" => result)
        .increment(1);
}

pub fn outbound_failed(partner: &str) {
    metrics::counter!(OUTBOUND_FAILURES, "partner" => destination(partner)).increment(1);
}

/// One PollRequest we sent (`answered` or `failed`).
pub fn outbound_poll(partner: &str, answered: bool) {
    let result = if answered { "answered" } else { "failed" };
    metrics::counter!(OUTBOUND_POLLS, "partner" => destination(partner), "result" => result)
        .increment(1);
}

pub fn outbound_in_doubt(n: usize) {
    metrics::gauge!(OUTBOUND_IN_DOUBT).set(n as f64);
}

/// `n` messages handed out (`mode`: `pull` or `push`).
pub fn delivered(mode: &'static str, n: usize) {
    if n > 0 {
        static KEPT: Kept<metrics::Counter> = Kept::new();
        KEPT.get(&[mode], || metrics::counter!(DELIVERIES, "mode" => mode))
            .increment(n as u64);
    }
}

/// A delivery settled (`outcome`: accepted, rejected, released, modified, or `default`).
pub fn settled(mode: &'static str, outcome: &'static str) {
    static KEPT: Kept<metrics::Counter> = Kept::new();
    KEPT.get(
        &[mode, outcome],
        || metrics::counter!(SETTLES, "mode" => mode, "outcome" => outcome),
    )
    .increment(1);
}

/// A request (or a TLS connection) the listener refused: its class full, or its source's share
/// of it used.
pub fn refused(class: &'static str, reason: &'static str) {
    metrics::counter!(REFUSED, "class" => class, "reason" => reason).increment(1);
}

pub fn push_failed() {
    metrics::counter!(PUSH_FAILURES).increment(1);
}

/// One call to a request-response channel's backend (D16) and what came of it.
pub fn backend_call(channel: &str, outcome: &'static str, took: Duration) {
    let channel = channel.to_owned();
    metrics::counter!(BACKEND_CALLS, "channel" => channel.clone(), "outcome" => outcome)
        .increment(1);
    metrics::histogram!(BACKEND_SECONDS, "channel" => channel).record(took.as_secs_f64());
}

/// One group-commit batch of `jobs` that took `took` (`backend`: `sqlite` or `postgres`).
pub fn writer_batch(backend: &'static str, jobs: usize, took: Duration) {
    static SIZES: Kept<metrics::Histogram> = Kept::new();
    static COMMITS: Kept<metrics::Histogram> = Kept::new();
    SIZES
        .get(
            &[backend],
            || metrics::histogram!(WRITER_BATCH_SIZE, "backend" => backend),
        )
        .record(jobs as f64);
    COMMITS
        .get(
            &[backend],
            || metrics::histogram!(WRITER_COMMIT_SECONDS, "backend" => backend),
        )
        .record(took.as_secs_f64());
}

/// One sync of the SQLite WAL that took `took` (`store::sqlite::syncer`).
pub fn wal_sync(took: Duration) {
    // A few hundred a second at most (one per sync, not per message): no handle kept.
    metrics::histogram!(WAL_SYNC_SECONDS).record(took.as_secs_f64());
}

/// One HTTP request: `route` is the router's pattern (`/wsr/{channel}`), never the path.
pub fn http_request(route: &str, method: &'static str, status: u16, took: Duration) {
    let class = match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    };
    static KEPT: Kept<metrics::Histogram> = Kept::new();
    KEPT.get(&[route, method, class], || {
        metrics::histogram!(HTTP_SECONDS, "route" => route.to_owned(), "method" => method, "status" => class)
    })
    .record(took.as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partners_without_a_name_are_anonymous() {
        assert_eq!(partner(None), ANONYMOUS);
        assert_eq!(partner(Some("")), ANONYMOUS);
        assert_eq!(partner(Some("acme")), "acme");
    }

    #[test]
    fn kept_handles_count_each_label_set_apart() {
        let rendered = || handle().expect("our recorder").render();
        let series = |channel: &str, partner: &str| {
            format!(
                "{RECEIVED}{{channel=\"{channel}\",partner=\"{partner}\",verdict=\"delivered\"}}"
            )
        };
        // Spelt one after the other, both label sets read "kept-unitxp".
        received("kept-unitx", "p", "delivered", None);
        received("kept-unitx", "p", "delivered", None);
        received("kept-unit", "xp", "delivered", None);
        let text = rendered();
        assert!(
            text.contains(&format!("{} 2", series("kept-unitx", "p"))),
            "{text}"
        );
        assert!(
            text.contains(&format!("{} 1", series("kept-unit", "xp"))),
            "{text}"
        );
    }

    #[test]
    fn faults_answered_are_kept_by_channel_partner_and_code_and_nothing_else() {
        let channel = "faults-answered-unit";
        let of = || {
            faults_answered()
                .into_iter()
                .filter(|f| f.channel == channel)
                .map(|f| (f.partner, f.code, f.count))
                .collect::<Vec<_>>()
        };
        received(channel, "acme", "delivered", None);
        assert!(of().is_empty(), "a delivered message is no fault");
        received(channel, "acme", "fault", Some("InvalidExpiryTime"));
        received(channel, "acme", "fault", Some("InvalidExpiryTime"));
        received(channel, ANONYMOUS, "fault", Some("InvalidRequest"));
        assert_eq!(
            of(),
            [
                ("acme".to_owned(), "InvalidExpiryTime", 2),
                (ANONYMOUS.to_owned(), "InvalidRequest", 1)
            ]
        );
    }
}
