//! The checker: pure, over what the run left behind — the plan, A's final message states, B's
//! inbox, and the consumers' processing log. No I/O here; `run` collects the facts.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::time::Duration;

pub use crate::backend::Call;

/// One message the driver meant to send.
#[derive(Debug, Clone)]
pub struct Planned {
    pub hid: String,
    /// The harness group it belongs to (singletons: each its own group).
    pub group: String,
    /// Position within its group, from 0.
    pub seq: usize,
    pub ordered: bool,
    /// Sent without DuplicateElimination: B delivers each resend again (D2), so several inbox
    /// copies are lawful (the consumers process it once all the same).
    pub copies_allowed: bool,
    /// Sent to a request-response channel (D16): the backend's business response is the
    /// delivery, not B's inbox.
    pub rr: Option<RrPolicy>,
}

/// A request-response channel's `on_unknown`: `fail` (true) or `retry`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RrPolicy {
    pub fail: bool,
}

/// One answer B gave a copy of a request-response message, as proxy-to-b saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RrAnswer {
    pub hid: String,
    pub status: u16,
    pub content_type: String,
    pub body: Vec<u8>,
}

/// A row of B's exchanges table.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub group_id: String,
    /// The group state's slot: a singleton's is 0.
    pub number: i64,
    /// `calling`, `answered` or `in_doubt`.
    pub state: String,
    /// The harness id in the kept business response, if any.
    pub hid: Option<String>,
}

/// What A says became of a message (or that the driver could not submit it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    Acked,
    Failed(String),
    Faulted(String),
    /// A refused the submit: an earlier message of its ordered group had failed.
    Refused(String),
    /// Still queued or sent at the end of the quiet period.
    Pending(String),
    /// A does not know the message at all.
    Unknown,
}

#[derive(Debug, Clone)]
pub struct Processed {
    pub serial: i64,
    pub hid: String,
}

#[derive(Debug, Clone)]
pub struct Handed {
    pub hid: String,
    pub offset: i64,
    pub attempt: i64,
    /// The fetch that handed it out.
    pub batch: i64,
}

#[derive(Debug, Clone)]
pub struct Settled {
    pub offset: i64,
    pub attempt: i64,
    pub status: i64,
}

#[derive(Debug, Default)]
pub struct Facts {
    pub planned: Vec<Planned>,
    pub fates: HashMap<String, Fate>,
    /// The harness id of every row in B's inbox.
    pub inbox: Vec<String>,
    pub processed: Vec<Processed>,
    pub handed: Vec<Handed>,
    pub settled: Vec<Settled>,
    pub kills: usize,
    /// Every call the request-response backend received.
    pub rr_calls: Vec<Call>,
    /// Every answer B gave to a copy of a request-response message.
    pub rr_answers: Vec<RrAnswer>,
    pub exchanges: Vec<Exchange>,
    /// When a B gateway was killed (the backend's clock).
    pub b_kills: Vec<Duration>,
    /// When a B gateway was started, the first time and after each kill (the backend's clock).
    pub b_starts: Vec<Duration>,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub messages: usize,
    pub acked: usize,
    pub failed: usize,
    /// Acked but never processed (or not in B's inbox).
    pub lost: usize,
    /// In B's inbox more than once, or handed out again after its accept was confirmed.
    pub duplicated: usize,
    /// Processed out of sequence within an ordered group, or handed out together with
    /// another message of its group (`ordering = group` allows one at a time).
    pub out_of_order: usize,
    /// Neither acked nor failed at the end.
    pub unresolved: usize,
    /// Reported failed, yet delivered by B (or processed).
    pub failed_processed: usize,
    /// Failed for a reason the rules do not give.
    pub bad_reason: usize,
    /// Legitimate redeliveries (a consumer died or lapsed before its accept counted).
    pub redelivered: usize,
    pub kills: usize,
    /// Messages sent to a request-response channel, and how many of them A saw acked.
    pub rr_messages: usize,
    pub rr_acked: usize,
    /// Calls the backend received, and those that repeated an earlier call of the same
    /// message lawfully: under `retry`, with the same idempotency headers, after a kill of a
    /// B gateway between the two calls.
    pub rr_calls: usize,
    pub rr_recalls: usize,
    /// Failed for good under `fail` after a kill between the call and the commit.
    pub rr_in_doubt: usize,
    /// Business responses B gave (every copy's), and those that differed from another
    /// copy's, answered another message, or came without a kept answer.
    pub rr_answers: usize,
    pub rr_mismatched: usize,
    /// Calls beyond one per message that no kill explains, under `fail`, to another
    /// channel, or with other idempotency headers.
    pub rr_extra_calls: usize,
    /// A success status without a business response for a request-response message.
    pub rr_empty: usize,
    /// The first few violations, spelled out.
    pub examples: Vec<String>,
}

impl Summary {
    pub fn violations(&self) -> usize {
        self.lost
            + self.duplicated
            + self.out_of_order
            + self.unresolved
            + self.failed_processed
            + self.bad_reason
            + self.rr_mismatched
            + self.rr_extra_calls
            + self.rr_empty
    }

    pub fn line(&self) -> String {
        format!(
            "messages={} acked={} failed={} lost={} duplicated={} out_of_order={} kills={} \
             unresolved={} failed_processed={} bad_reason={} redelivered={} \
             rr_messages={} rr_acked={} rr_calls={} rr_recalls={} rr_in_doubt={} \
             rr_answers={} rr_mismatched={} rr_extra_calls={} rr_empty={}",
            self.messages,
            self.acked,
            self.failed,
            self.lost,
            self.duplicated,
            self.out_of_order,
            self.kills,
            self.unresolved,
            self.failed_processed,
            self.bad_reason,
            self.redelivered,
            self.rr_messages,
            self.rr_acked,
            self.rr_calls,
            self.rr_recalls,
            self.rr_in_doubt,
            self.rr_answers,
            self.rr_mismatched,
            self.rr_extra_calls,
            self.rr_empty,
        )
    }

    fn example(&mut self, what: String) {
        if self.examples.len() < 20 {
            self.examples.push(what);
        }
    }
}

/// Failure reasons the rules give (DESIGN §6 stop rules, D7/D8 faults).
fn reason_is_lawful(fate: &Fate) -> bool {
    match fate {
        Fate::Failed(reason) => {
            reason.contains("expired")
                || reason.contains("attempts")
                || reason.contains("ordered group")
        }
        Fate::Faulted(code) => code == "InvalidExpiryTime" || code == "GroupAborted",
        // Lawful only after an earlier message of the ordered group failed: checked in `check`.
        Fate::Refused(_) => true,
        Fate::Acked | Fate::Pending(_) | Fate::Unknown => false,
    }
}

pub fn check(facts: &Facts) -> Summary {
    let mut s = Summary {
        messages: facts.planned.len(),
        kills: facts.kills,
        ..Summary::default()
    };
    let mut in_inbox: HashMap<&str, usize> = HashMap::new();
    for hid in &facts.inbox {
        *in_inbox.entry(hid.as_str()).or_default() += 1;
    }
    let processed: HashSet<&str> = facts.processed.iter().map(|p| p.hid.as_str()).collect();
    let by_hid: HashMap<&str, &Planned> =
        facts.planned.iter().map(|p| (p.hid.as_str(), p)).collect();
    // Per group, the position of its first failed or faulted message.
    let mut first_failure: HashMap<&str, usize> = HashMap::new();
    for p in &facts.planned {
        if let Some(Fate::Failed(_) | Fate::Faulted(_)) = facts.fates.get(&p.hid) {
            let first = first_failure.entry(p.group.as_str()).or_insert(p.seq);
            *first = (*first).min(p.seq);
        }
    }

    let rr = RrFacts::of(facts);
    for p in &facts.planned {
        let fate = facts.fates.get(&p.hid).unwrap_or(&Fate::Unknown);
        if let Some(policy) = p.rr {
            let refused_without_cause = matches!(fate, Fate::Refused(_))
                && first_failure
                    .get(p.group.as_str())
                    .is_none_or(|&first| first >= p.seq);
            if refused_without_cause {
                s.bad_reason += 1;
                s.example(format!("bad reason: {} {fate:?}", p.hid));
            }
            let copies = in_inbox.get(p.hid.as_str()).copied();
            check_rr(&mut s, &rr, p, policy, fate, copies);
            continue;
        }
        let was_processed = processed.contains(p.hid.as_str());
        match fate {
            Fate::Acked => {
                s.acked += 1;
                if !was_processed || !in_inbox.contains_key(p.hid.as_str()) {
                    s.lost += 1;
                    s.example(format!(
                        "lost: {} acked by A; in B's inbox {} time(s), processed: {was_processed}",
                        p.hid,
                        in_inbox.get(p.hid.as_str()).copied().unwrap_or(0)
                    ));
                }
            }
            Fate::Failed(_) | Fate::Faulted(_) | Fate::Refused(_) => {
                s.failed += 1;
                let refused_without_cause = matches!(fate, Fate::Refused(_))
                    && first_failure
                        .get(p.group.as_str())
                        .is_none_or(|&first| first >= p.seq);
                if !reason_is_lawful(fate) || refused_without_cause {
                    s.bad_reason += 1;
                    s.example(format!("bad reason: {} {fate:?}", p.hid));
                }
                // B delivering it is enough: consumers drain the inbox in the quiet period.
                let delivered = in_inbox.contains_key(p.hid.as_str());
                if was_processed || delivered {
                    s.failed_processed += 1;
                    s.example(format!(
                        "failed but delivered: {} {fate:?}, processed: {was_processed}",
                        p.hid
                    ));
                }
            }
            Fate::Pending(_) | Fate::Unknown => {
                s.unresolved += 1;
                s.example(format!(
                    "unresolved: {} {fate:?}, processed: {was_processed}",
                    p.hid
                ));
            }
        }
    }
    check_rr_calls(&mut s, &rr, facts);
    check_rr_answers(&mut s, &rr);
    let planned: HashSet<&str> = facts.planned.iter().map(|p| p.hid.as_str()).collect();
    for (hid, n) in &in_inbox {
        let copies_allowed = by_hid.get(hid).is_some_and(|p| p.copies_allowed);
        if *n > 1 && !copies_allowed {
            s.duplicated += n - 1;
            s.example(format!("duplicated: {hid} is in B's inbox {n} times"));
        }
        if !planned.contains(hid) {
            s.duplicated += 1;
            s.example(format!("in B's inbox but never planned: {hid}"));
        }
    }

    // Handed out again after an accept was confirmed: a duplicate the gateway caused.
    let mut accepted_at: HashMap<i64, i64> = HashMap::new();
    for st in facts.settled.iter().filter(|st| st.status == 200) {
        let a = accepted_at.entry(st.offset).or_insert(st.attempt);
        *a = (*a).min(st.attempt);
    }
    let mut seen_attempts: HashSet<(i64, i64)> = HashSet::new();
    for h in &facts.handed {
        if !seen_attempts.insert((h.offset, h.attempt)) {
            s.duplicated += 1;
            s.example(format!(
                "duplicated: {} attempt {} handed out twice",
                h.hid, h.attempt
            ));
        } else if h.attempt > 1 {
            s.redelivered += 1;
        }
        if let Some(&accepted) = accepted_at.get(&h.offset).filter(|&&a| h.attempt > a) {
            s.duplicated += 1;
            s.example(format!(
                "duplicated: {} handed out as attempt {} after attempt {accepted} was accepted",
                h.hid, h.attempt
            ));
        }
    }

    // One message of a group at a time: never two in one fetch.
    let mut per_batch: HashMap<(i64, &str), usize> = HashMap::new();
    for h in &facts.handed {
        if let Some(plan) = by_hid.get(h.hid.as_str()) {
            *per_batch.entry((h.batch, plan.group.as_str())).or_default() += 1;
        }
    }
    for ((batch, group), n) in per_batch {
        if n > 1 {
            s.out_of_order += n - 1;
            s.example(format!(
                "{n} messages of group {group} handed out in one fetch ({batch})"
            ));
        }
    }

    // Ordered groups: processed strictly in sequence, from 0, without gaps.
    let mut processed_in_order = facts.processed.clone();
    processed_in_order.sort_by_key(|p| p.serial);
    let mut next: BTreeMap<&str, usize> = BTreeMap::new();
    for p in &processed_in_order {
        let Some(plan) = by_hid.get(p.hid.as_str()) else {
            continue;
        };
        if !plan.ordered {
            continue;
        }
        let expected = next.entry(plan.group.as_str()).or_insert(0);
        if plan.seq != *expected {
            s.out_of_order += 1;
            s.example(format!(
                "out of order: {} (position {}) processed when {} was due",
                p.hid, plan.seq, expected
            ));
        }
        *expected = plan.seq + 1;
    }
    s
}

/// The request-response facts by harness id.
struct RrFacts<'f> {
    calls: HashMap<&'f str, Vec<&'f Call>>,
    exchanges: HashMap<&'f str, &'f Exchange>,
    answers: HashMap<&'f str, Vec<&'f RrAnswer>>,
    /// In-doubt exchanges no call names: a B was killed after recording the call out and
    /// before the request reached the backend (the gateway cannot tell that from a kill
    /// after it did, so under `fail` it is in doubt all the same). Each accounts for one
    /// message failed for good without a call.
    uncalled_in_doubt: std::cell::Cell<usize>,
}

impl<'f> RrFacts<'f> {
    fn of(facts: &'f Facts) -> RrFacts<'f> {
        let mut calls: HashMap<&str, Vec<&Call>> = HashMap::new();
        for c in &facts.rr_calls {
            calls.entry(c.hid.as_str()).or_default().push(c);
        }
        for list in calls.values_mut() {
            list.sort_by_key(|c| c.serial);
        }
        // An exchange names its message by the business response it keeps, or else by the
        // idempotency headers its calls were made with (a singleton's slot is 0).
        let mut by_key: HashMap<(&str, i64), &str> = HashMap::new();
        for c in &facts.rr_calls {
            if let Some(group) = c.group_id.as_deref() {
                let number = c.number.as_deref().map_or(Some(0), |n| n.parse().ok());
                if let Some(number) = number {
                    by_key.insert((group, number), c.hid.as_str());
                }
            }
        }
        let mut exchanges = HashMap::new();
        let mut uncalled_in_doubt = 0;
        for e in &facts.exchanges {
            let hid = e
                .hid
                .as_deref()
                .or_else(|| by_key.get(&(e.group_id.as_str(), e.number)).copied());
            match hid {
                Some(hid) => {
                    exchanges.insert(hid, e);
                }
                None if e.state == "in_doubt" && !facts.b_kills.is_empty() => {
                    uncalled_in_doubt += 1;
                }
                None => {}
            }
        }
        let mut answers: HashMap<&str, Vec<&RrAnswer>> = HashMap::new();
        for a in &facts.rr_answers {
            answers.entry(a.hid.as_str()).or_default().push(a);
        }
        RrFacts {
            calls,
            exchanges,
            answers,
            uncalled_in_doubt: std::cell::Cell::new(uncalled_in_doubt),
        }
    }

    fn answered(&self, hid: &str) -> bool {
        self.exchanges
            .get(hid)
            .is_some_and(|e| e.state == "answered")
    }
}

/// A request-response message's fate: acked means B kept its business response (and the
/// backend was called); failed means it did not; failed for good (`PermanentProcessingFailure`)
/// only under `fail`, after a kill fell between a call and its commit.
fn check_rr(
    s: &mut Summary,
    rr: &RrFacts,
    p: &Planned,
    policy: RrPolicy,
    fate: &Fate,
    in_inbox: Option<usize>,
) {
    s.rr_messages += 1;
    let hid = p.hid.as_str();
    let answered = rr.answered(hid);
    let calls = rr.calls.get(hid).map_or(0, Vec::len);
    if let Some(n) = in_inbox {
        s.duplicated += n;
        s.example(format!(
            "duplicated: request-response {hid} in B's inbox {n} time(s)"
        ));
    }
    match fate {
        Fate::Acked => {
            s.acked += 1;
            s.rr_acked += 1;
            if !answered || calls == 0 {
                s.lost += 1;
                s.example(format!(
                    "lost: request-response {hid} acked by A; exchange {:?}, {calls} call(s)",
                    rr.exchanges.get(hid).map(|e| e.state.as_str())
                ));
            }
        }
        Fate::Failed(_) | Fate::Faulted(_) | Fate::Refused(_) => {
            s.failed += 1;
            let in_doubt =
                matches!(fate, Fate::Faulted(code) if code == "PermanentProcessingFailure");
            if in_doubt {
                let state = rr.exchanges.get(hid).map(|e| e.state.as_str());
                let uncalled = rr.uncalled_in_doubt.get();
                if policy.fail && calls > 0 && !answered {
                    s.rr_in_doubt += 1;
                } else if policy.fail && calls == 0 && uncalled > 0 {
                    rr.uncalled_in_doubt.set(uncalled - 1);
                    s.rr_in_doubt += 1;
                } else {
                    s.bad_reason += 1;
                    s.example(format!(
                        "bad reason: request-response {hid} {fate:?} (fail: {}, {calls} call(s),                          exchange {state:?})",
                        policy.fail
                    ));
                }
            } else if !reason_is_lawful(fate) {
                s.bad_reason += 1;
                s.example(format!("bad reason: {hid} {fate:?}"));
            }
            if answered {
                s.failed_processed += 1;
                s.example(format!(
                    "failed but answered: request-response {hid} {fate:?}, {calls} call(s)"
                ));
            }
        }
        Fate::Pending(_) | Fate::Unknown => {
            s.unresolved += 1;
            s.example(format!("unresolved: request-response {hid} {fate:?}"));
        }
    }
}

/// Once per message, always with the same idempotency headers, to the message's channel; a
/// second call only under `retry` and only after a kill of a B gateway between the two. The
/// calls are timed when the backend reads them, so a call a B wrote just before it was killed
/// may be read after the kill (more than half a second late, seen on a loaded machine): a B
/// started again between the two calls counts as a kill between them, the restart coming
/// seconds after the kill.
fn check_rr_calls(s: &mut Summary, rr: &RrFacts, facts: &Facts) {
    let plans: HashMap<&str, &Planned> = facts
        .planned
        .iter()
        .filter(|p| p.rr.is_some())
        .map(|p| (p.hid.as_str(), p))
        .collect();
    for (hid, calls) in &rr.calls {
        s.rr_calls += calls.len();
        let Some(policy) = plans.get(hid).and_then(|p| p.rr) else {
            s.rr_extra_calls += calls.len();
            s.example(format!("extra call: {hid} is no request-response message"));
            continue;
        };
        let channel = if policy.fail { "rr-fail" } else { "rr" };
        let first = calls[0];
        for (i, c) in calls.iter().enumerate() {
            if c.channel != channel
                || c.group_id != first.group_id
                || c.number != first.number
                || c.group_id.is_none()
            {
                s.rr_extra_calls += 1;
                s.example(format!(
                    "extra call: {hid} called on {} with {:?}/{:?}, first on {} with {:?}/{:?}",
                    c.channel, c.group_id, c.number, first.channel, first.group_id, first.number
                ));
                continue;
            }
            if i == 0 {
                continue;
            }
            let before = calls[i - 1].at;
            let between = |t: &Duration| *t >= before && *t <= c.at;
            let killed_between =
                facts.b_kills.iter().any(between) || facts.b_starts.iter().any(between);
            if !policy.fail && killed_between {
                s.rr_recalls += 1;
            } else {
                s.rr_extra_calls += 1;
                s.example(format!(
                    "extra call: {hid} called again at {:?} (before: {before:?}; fail: {}, a B killed between: {killed_between})",
                    c.at, policy.fail
                ));
            }
        }
    }
}

/// Every copy's business response byte for byte the same, the one kept for the message and
/// made by one of its calls; never a success without one.
fn check_rr_answers(s: &mut Summary, rr: &RrFacts) {
    for (hid, answers) in &rr.answers {
        let business: Vec<&&RrAnswer> = answers
            .iter()
            .filter(|a| contains(&a.body, b"ItemResponse"))
            .collect();
        for a in answers.iter().filter(|a| (200..300).contains(&a.status)) {
            if !contains(&a.body, b"ItemResponse") {
                s.rr_empty += 1;
                s.example(format!(
                    "empty: {hid} answered {} without its business response: {}",
                    a.status,
                    String::from_utf8_lossy(&a.body)
                ));
            }
        }
        let Some(first) = business.first() else {
            continue;
        };
        s.rr_answers += business.len();
        for a in &business[1..] {
            if (a.status, &a.content_type, &a.body)
                != (first.status, &first.content_type, &first.body)
            {
                s.rr_mismatched += 1;
                s.example(format!(
                    "mismatched: {hid} answered {} {:?} and {} {:?}",
                    first.status,
                    String::from_utf8_lossy(&first.body),
                    a.status,
                    String::from_utf8_lossy(&a.body)
                ));
            }
        }
        // The answer is this message's, from one of its calls, and kept by B.
        let text = String::from_utf8_lossy(&first.body);
        let made_by = rr.calls.get(hid).is_some_and(|calls| {
            calls.iter().any(|c| {
                text.contains(&format!(" id=\"{hid}\""))
                    && text.contains(&format!(" call=\"{}\"", c.serial))
            })
        });
        if !made_by || !rr.answered(hid) {
            s.rr_mismatched += 1;
            s.example(format!(
                "mismatched: {hid} answered with {text} (one of its calls: {made_by}; kept: {})",
                rr.answered(hid)
            ));
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// How many failures of each kind: `expired=… attempts=… group=… refused=… faulted:Code=…`.
pub fn failure_kinds(facts: &Facts) -> String {
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for fate in facts.fates.values() {
        let kind = match fate {
            Fate::Failed(r) if r.contains("ordered group") => "group".to_owned(),
            Fate::Failed(r) if r.contains("delivery unknown") => "unknown".to_owned(),
            Fate::Failed(r) if r.contains("no attempt reached") => "unreached".to_owned(),
            Fate::Failed(r) if r.contains("confirms") => "confirmed_not_delivered".to_owned(),
            Fate::Failed(r) if r.contains("attempts") => "attempts".to_owned(),
            Fate::Failed(r) if r.contains("expired") => "expired".to_owned(),
            Fate::Failed(_) => "other".to_owned(),
            Fate::Faulted(code) => format!("faulted:{code}"),
            Fate::Refused(_) => "refused".to_owned(),
            Fate::Acked | Fate::Pending(_) | Fate::Unknown => continue,
        };
        *kinds.entry(kind).or_default() += 1;
    }
    let parts: Vec<String> = kinds.iter().map(|(k, n)| format!("{k}={n}")).collect();
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join(" ")
    }
}

/// The examples, one per line, for the run's report.
pub fn report(summary: &Summary) -> String {
    let mut out = String::new();
    for e in &summary.examples {
        let _ = writeln!(out, "  {e}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(group: &str, n: usize, ordered: bool) -> Vec<Planned> {
        (0..n)
            .map(|seq| Planned {
                hid: format!("{group}-{seq}"),
                group: group.into(),
                seq,
                ordered,
                copies_allowed: false,
                rr: None,
            })
            .collect()
    }

    /// Two groups, all acked, processed once each in order: no violation.
    fn clean() -> Facts {
        let mut planned = plan("g0", 3, true);
        planned.extend(plan("g1", 2, false));
        let mut facts = Facts {
            fates: planned
                .iter()
                .map(|p| (p.hid.clone(), Fate::Acked))
                .collect(),
            inbox: planned.iter().map(|p| p.hid.clone()).collect(),
            kills: 3,
            ..Facts::default()
        };
        for (i, p) in planned.iter().enumerate() {
            facts.processed.push(Processed {
                serial: i as i64,
                hid: p.hid.clone(),
            });
            facts.handed.push(Handed {
                hid: p.hid.clone(),
                offset: i as i64,
                attempt: 1,
                batch: i as i64,
            });
            facts.settled.push(Settled {
                offset: i as i64,
                attempt: 1,
                status: 200,
            });
        }
        facts.planned = planned;
        facts
    }

    #[test]
    fn a_clean_run_has_no_violation() {
        let s = check(&clean());
        assert_eq!(s.violations(), 0, "{}", report(&s));
        assert_eq!(
            s.line(),
            "messages=5 acked=5 failed=0 lost=0 duplicated=0 out_of_order=0 kills=3 \
             unresolved=0 failed_processed=0 bad_reason=0 redelivered=0 rr_messages=0 \
             rr_acked=0 rr_calls=0 rr_recalls=0 rr_in_doubt=0 rr_answers=0 rr_mismatched=0 \
             rr_extra_calls=0 rr_empty=0"
        );
    }

    #[test]
    fn an_acked_message_never_processed_is_lost() {
        let mut f = clean();
        f.processed.retain(|p| p.hid != "g1-1");
        assert_eq!(check(&f).lost, 1);
    }

    #[test]
    fn a_second_inbox_row_or_a_handout_after_accept_is_a_duplicate() {
        let mut f = clean();
        f.inbox.push("g0-1".into());
        assert_eq!(check(&f).duplicated, 1);
        // Unless it was sent without DuplicateElimination (D2).
        f.planned[1].copies_allowed = true;
        assert_eq!(check(&f).duplicated, 0);
        let mut f = clean();
        f.handed.push(Handed {
            hid: "g0-2".into(),
            offset: 2,
            attempt: 2,
            batch: 100,
        });
        assert_eq!(check(&f).duplicated, 1);
    }

    #[test]
    fn a_redelivery_before_any_accept_is_not_a_duplicate() {
        let mut f = clean();
        f.settled.retain(|s| s.offset != 2);
        f.handed.push(Handed {
            hid: "g0-2".into(),
            offset: 2,
            attempt: 2,
            batch: 100,
        });
        f.settled.push(Settled {
            offset: 2,
            attempt: 2,
            status: 200,
        });
        let s = check(&f);
        assert_eq!((s.duplicated, s.redelivered), (0, 1));
    }

    #[test]
    fn ordered_groups_must_be_processed_in_sequence_unordered_need_not() {
        let mut f = clean();
        f.processed.swap(0, 1);
        for (i, p) in f.processed.iter_mut().enumerate() {
            p.serial = i as i64;
        }
        // g0 processed as 1, 0, 2: none of the three came when it was due.
        assert_eq!(check(&f).out_of_order, 3);
        let mut f = clean();
        f.processed.swap(3, 4);
        for (i, p) in f.processed.iter_mut().enumerate() {
            p.serial = i as i64;
        }
        assert_eq!(check(&f).out_of_order, 0);
    }

    #[test]
    fn failures_must_be_lawful_and_unprocessed() {
        let mut f = clean();
        f.fates.insert(
            "g1-1".into(),
            Fate::Failed("expired before it was acknowledged".into()),
        );
        let s = check(&f);
        assert_eq!((s.failed, s.failed_processed), (1, 1));
        f.processed.retain(|p| p.hid != "g1-1");
        assert_eq!(check(&f).failed_processed, 1, "still in B's inbox");
        f.inbox.retain(|hid| hid != "g1-1");
        assert_eq!(check(&f).violations(), 0);
        f.fates
            .insert("g1-1".into(), Fate::Faulted("InvalidRequest".into()));
        assert_eq!(check(&f).bad_reason, 1);
        f.fates.insert("g1-1".into(), Fate::Pending("sent".into()));
        assert_eq!(check(&f).unresolved, 1);
    }

    #[test]
    fn a_refusal_is_lawful_only_after_an_earlier_failure_in_its_group() {
        let mut f = clean();
        for hid in ["g0-1", "g0-2"] {
            f.processed.retain(|p| p.hid != hid);
            f.inbox.retain(|h| h != hid);
        }
        f.fates
            .insert("g0-2".into(), Fate::Refused("group failed".into()));
        assert_eq!(check(&f).bad_reason, 1, "nothing before it failed");
        f.fates.insert(
            "g0-1".into(),
            Fate::Failed("expired before it was acknowledged".into()),
        );
        assert_eq!(check(&f).violations(), 0);
    }

    /// One request-response message per policy, each acked, called once, answered twice
    /// with the same bytes.
    fn clean_rr() -> Facts {
        let mut f = Facts::default();
        for (i, fail) in [false, true].into_iter().enumerate() {
            let hid = format!("r{i}-0");
            f.planned.push(Planned {
                hid: hid.clone(),
                group: hid.clone(),
                seq: 0,
                ordered: false,
                copies_allowed: false,
                rr: Some(RrPolicy { fail }),
            });
            f.fates.insert(hid.clone(), Fate::Acked);
            f.rr_calls.push(Call {
                channel: if fail { "rr-fail" } else { "rr" }.into(),
                hid: hid.clone(),
                group_id: Some(format!("urn:uuid:{i}")),
                number: None,
                at: Duration::from_secs(10 * i as u64 + 1),
                serial: i as u64,
            });
            let body = format!("<r:ItemResponse id=\"{hid}\" call=\"{i}\"/>").into_bytes();
            for _ in 0..2 {
                f.rr_answers.push(RrAnswer {
                    hid: hid.clone(),
                    status: 200,
                    content_type: "text/xml".into(),
                    body: body.clone(),
                });
            }
            f.exchanges.push(Exchange {
                group_id: format!("urn:uuid:{i}"),
                number: 0,
                state: "answered".into(),
                hid: Some(hid),
            });
        }
        f
    }

    #[test]
    fn request_response_copies_get_the_same_bytes_from_one_call() {
        let s = check(&clean_rr());
        assert_eq!(s.violations(), 0, "{}", report(&s));
        assert_eq!(
            (s.rr_messages, s.rr_acked, s.rr_calls, s.rr_answers),
            (2, 2, 2, 4)
        );
        let mut f = clean_rr();
        f.rr_answers[1].body = b"<r:ItemResponse id=\"r0-0\" call=\"7\"/>".to_vec();
        assert_eq!(check(&f).rr_mismatched, 1);
        let mut f = clean_rr();
        f.rr_answers[0].body = b"<r:ItemResponse id=\"r0-0\" call=\"9\"/>".to_vec();
        f.rr_answers[1].body = f.rr_answers[0].body.clone();
        assert_eq!(check(&f).rr_mismatched, 1, "no call of r0-0 made it");
        let mut f = clean_rr();
        f.rr_answers[1].body = b"<ack/>".to_vec();
        assert_eq!(check(&f).rr_empty, 1);
        let mut f = clean_rr();
        f.exchanges[0].state = "calling".into();
        let s = check(&f);
        assert_eq!(
            (s.lost, s.rr_mismatched),
            (1, 1),
            "acked and answered, yet not kept"
        );
    }

    /// The backend reads the `i`th call again, `at_secs` into the run, as call `serial`.
    fn call_again(f: &mut Facts, i: usize, at_secs: u64, serial: u64) {
        let mut again = f.rr_calls[i].clone();
        again.at = Duration::from_secs(at_secs);
        again.serial = serial;
        f.rr_calls.push(again);
    }

    #[test]
    fn a_second_call_is_lawful_only_under_retry_after_a_kill_with_the_same_headers() {
        let mut f = clean_rr();
        call_again(&mut f, 0, 5, 5);
        assert_eq!(check(&f).rr_extra_calls, 1, "no kill in between");
        f.b_kills.push(Duration::from_secs(3));
        let s = check(&f);
        assert_eq!((s.rr_extra_calls, s.rr_recalls), (0, 1));
        f.rr_calls[2].number = Some("1".into());
        assert_eq!(check(&f).rr_extra_calls, 1, "other idempotency headers");
        let mut f = clean_rr();
        call_again(&mut f, 1, 15, 6);
        f.b_kills.push(Duration::from_secs(12));
        assert_eq!(check(&f).rr_extra_calls, 1, "never again under fail");
    }

    #[test]
    fn a_call_read_after_its_gateway_was_killed_may_be_made_again_by_the_next_one() {
        let mut f = clean_rr();
        call_again(&mut f, 0, 5, 5);
        // Killed before the backend read the first call (at 1 s): not between the two reads.
        f.b_kills.push(Duration::from_millis(500));
        assert_eq!(
            check(&f).rr_extra_calls,
            1,
            "no restart between the two calls"
        );
        f.b_starts.push(Duration::from_secs(3));
        let s = check(&f);
        assert_eq!((s.rr_extra_calls, s.rr_recalls), (0, 1));
    }

    #[test]
    fn failed_for_good_is_lawful_only_under_fail_without_a_kept_answer() {
        let mut f = clean_rr();
        f.fates.insert(
            "r1-0".into(),
            Fate::Faulted("PermanentProcessingFailure".into()),
        );
        assert_eq!(check(&f).failed_processed, 1, "its answer was kept");
        f.exchanges[1].state = "in_doubt".into();
        f.rr_answers.retain(|a| a.hid != "r1-0");
        let s = check(&f);
        assert_eq!((s.violations(), s.rr_in_doubt), (0, 1), "{}", report(&s));
        f.fates.insert(
            "r0-0".into(),
            Fate::Faulted("PermanentProcessingFailure".into()),
        );
        f.exchanges[0].state = "in_doubt".into();
        f.rr_answers.retain(|a| a.hid != "r0-0");
        assert_eq!(check(&f).bad_reason, 1, "not under retry");
    }

    /// A B killed after recording its call out, before the request reached the backend:
    /// under `fail` the message is in doubt with no call made, and its exchange names no
    /// call. Lawful once per such exchange, and only if a B was killed.
    #[test]
    fn failed_for_good_without_a_call_needs_an_in_doubt_exchange_and_a_kill() {
        let mut f = clean_rr();
        f.fates.insert(
            "r1-0".into(),
            Fate::Faulted("PermanentProcessingFailure".into()),
        );
        f.rr_calls.retain(|c| c.hid != "r1-0");
        f.rr_answers.retain(|a| a.hid != "r1-0");
        f.exchanges[1].state = "in_doubt".into();
        f.exchanges[1].hid = None;
        assert_eq!(check(&f).bad_reason, 1, "no B was killed");
        f.b_kills.push(Duration::from_secs(5));
        let s = check(&f);
        assert_eq!((s.violations(), s.rr_in_doubt), (0, 1), "{}", report(&s));
        f.exchanges.pop();
        assert_eq!(
            check(&f).bad_reason,
            1,
            "no in-doubt exchange accounts for it"
        );
    }

    #[test]
    fn two_messages_of_a_group_in_one_fetch_are_out_of_order() {
        let mut f = clean();
        f.handed[1].batch = f.handed[0].batch;
        assert_eq!(check(&f).out_of_order, 1);
        let mut f = clean();
        f.handed[4].batch = f.handed[0].batch;
        assert_eq!(
            check(&f).out_of_order,
            0,
            "different groups may share a fetch"
        );
    }
}
