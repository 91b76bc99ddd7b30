//! The group-commit writer (DESIGN §7): one task per gateway, on a connection of its own,
//! takes every received message waiting for it, reads their groups, decides them all and
//! writes the batch in one call of `wsr_apply_received` (migration 0002), which is its own
//! transaction: two round trips and one commit per batch (one round trip for a batch of
//! singletons; see `write_once`). A commit is what a durable ack waits for (the WAL flush), and the
//! `sequences` row that hands out inbox offsets is held from the moment offsets are taken to
//! the end of that flush, so one commit per message would serialise every gateway on one flush
//! each; one commit per batch shares each flush among everything that arrived meanwhile.
//!
//! A batch holds at most one message per group: the decisions about a group then never depend
//! on another message of the same batch, and a message of a group already in the batch starts
//! the next one. The groups are read without a lock; the write locks them, in hash order so
//! that two gateways' batches wait for each other instead of deadlocking, and writes only if
//! each is still the version that was read; if one is not, the batch is decided again in a
//! transaction holding the locks from before the read. A message whose decision fails (an
//! unreadable group, a panic) fails alone; a write that fails takes the batch back, and then
//! each message is tried in a batch of its own, so that only the one at fault fails.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::{Connection as _, PgConnection, Row};
use tokio::sync::mpsc;

use super::failure::{Failure, worth_again};
use super::group_state::{decode, encode};
use super::job::Job;
use super::notify::{Announcement, notifications};
use super::shared::Shared;
use crate::rmp::group::{GroupState, slot};
use crate::rmp::receive_plan::{ReceivePlan, plan_receive};
use crate::rmp::receiver::{Action, Incoming, starts_counted_group};
use crate::store::StoreError;
use crate::store::error::panic_message;
use crate::store::received::{Received, ReceivedMessage};
use crate::store::time::millis;
use crate::wsr::MessageKey;

/// Most messages one transaction decides.
const MAX_BATCH: usize = 256;

/// Most payload bytes one transaction carries; a larger message goes in a batch of its own.
const MAX_BATCH_BYTES: usize = 16 << 20;

/// The SQLSTATE `wsr_apply_received` raises when buffered messages its batch releases are not
/// there (a group and its buffer disagree: the store is corrupt).
const RELEASE_MISSING: &str = "WR001";

/// The constraint `wsr_apply_received` violates when a group its batch found unstored was
/// stored meanwhile (the batch is then decided again, as when a stored group changed).
const ONE_ROW_PER_GROUP: &str = "groups_partner_group_id_key";

/// Planner settings of the writer's connection: no sequential scans, and no hash or merge joins
/// (which would read a whole table or index to join the batch's few keys), so that every plan
/// looks rows up by index (see the note above `lock_groups`); and then one generic plan per
/// statement, made once, instead of one per batch.
const KEYED_PLANS_ONLY: [(&str, &str); 4] = [
    ("enable_seqscan", "off"),
    ("enable_hashjoin", "off"),
    ("enable_mergejoin", "off"),
    ("plan_cache_mode", "force_generic_plan"),
];

/// How long the writer waits for its connection to the database (as the pool does).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts the writer; it stops with the last handle to `shared` (which holds its queue). It
/// has a connection of its own, outside the pool: one that keeps the planner settings its
/// statements need (`KEYED_PLANS_ONLY`), and that it never waits for (nor pings) in the pool.
pub(super) fn spawn(pool: &PgPool, shared: &Arc<Shared>, jobs: mpsc::Receiver<Job>) {
    let options = (*pool.connect_options()).clone().options(KEYED_PLANS_ONLY);
    let task = tokio::spawn(run(options, Arc::downgrade(shared), jobs));
    shared.writer.tasks.add(task);
}

/// The writer's own connection, opened when first needed and again after it broke.
struct WriterConnection {
    options: PgConnectOptions,
    open: Option<PgConnection>,
}

impl WriterConnection {
    async fn get(&mut self) -> Result<&mut PgConnection, Failure> {
        let conn = match self.open.take() {
            Some(conn) => conn,
            None => {
                tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&self.options))
                    .await
                    .map_err(|_| {
                        sqlx::Error::Io(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "the writer's connection to the database was not open within 10 s",
                        ))
                    })??
            }
        };
        Ok(self.open.insert(conn))
    }

    /// After a failed transaction: a connection that failed other than by the database's
    /// answer (I/O, protocol) is closed, and the next batch opens a new one.
    fn failed(&mut self, failure: &Failure) {
        if let Failure::Db(e) = failure
            && e.as_database_error().is_none()
        {
            self.open = None;
        }
    }
}

/// The writer's loop: a batch of whatever is waiting, decided and committed, then the next.
/// One batch at a time: a second batch in flight on a second connection, read and decided
/// while the first waits for its commit, was measured (twice, before and after the batch
/// became two round trips) to make smaller batches that cost more CPU per message, for less
/// throughput on two cores.
async fn run(options: PgConnectOptions, shared: Weak<Shared>, mut queue: mpsc::Receiver<Job>) {
    let mut connection = WriterConnection {
        options,
        open: None,
    };
    let mut held_over: Option<Job> = None;
    loop {
        let first = match held_over.take() {
            Some(job) => job,
            None => match queue.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        let mut batch = vec![first];
        let mut groups: HashSet<(String, String)> = HashSet::new();
        groups.insert(group_of(&batch[0].message));
        let mut bytes = batch[0].message.payload.len();
        while batch.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
            let Ok(job) = queue.try_recv() else { break };
            let group = group_of(&job.message);
            let size = job.message.payload.len();
            if groups.contains(&group) || bytes + size > MAX_BATCH_BYTES {
                held_over = Some(job);
                break;
            }
            groups.insert(group);
            bytes += size;
            batch.push(job);
        }
        let Some(shared) = shared.upgrade() else {
            for job in batch {
                let _ = job.answer.send(Err(StoreError::Closed));
            }
            return;
        };
        let started = std::time::Instant::now();
        let results = write(&mut connection, &shared, &batch).await;
        crate::metrics::writer_batch("postgres", batch.len(), started.elapsed());
        for (job, result) in batch.into_iter().zip(results) {
            // The request may have gone (its client hung up); the decision stands.
            let _ = job.answer.send(result);
        }
    }
}

/// The group a message's decision is about, by partner (a singleton's is its own).
fn group_of(m: &ReceivedMessage) -> (String, String) {
    (
        m.partner.clone(),
        m.request.key().group_id.as_str().to_owned(),
    )
}

/// Decides and commits `batch`, one result per job in its order.
async fn write(
    connection: &mut WriterConnection,
    shared: &Shared,
    batch: &[Job],
) -> Vec<Result<Received, StoreError>> {
    let messages: Vec<&ReceivedMessage> = batch.iter().map(|j| &j.message).collect();
    match write_retrying(connection, shared, &messages).await {
        Ok(results) => results,
        Err(StoreError::Injected) => messages.iter().map(|_| Err(StoreError::Injected)).collect(),
        Err(e) if messages.len() == 1 => vec![Err(e)],
        Err(e) => {
            tracing::debug!(error = %e, messages = messages.len(), "batch failed; each message again on its own");
            let mut results = Vec::with_capacity(messages.len());
            for m in &messages {
                let alone = write_retrying(connection, shared, &[*m]).await;
                results.push(alone.and_then(|mut r| r.pop().unwrap_or(Err(StoreError::Closed))));
            }
            results
        }
    }
}

/// `write_once`, again while PostgreSQL aborts it to break a deadlock between gateways (the
/// rule `PostgresStore::retrying` applies to the pool's transactions; that one cannot lend
/// the writer's connection to each attempt).
async fn write_retrying(
    connection: &mut WriterConnection,
    shared: &Shared,
    messages: &[&ReceivedMessage],
) -> Result<Vec<Result<Received, StoreError>>, StoreError> {
    let mut tries = 0;
    loop {
        tries += 1;
        let failure = match connection.get().await {
            Ok(conn) => match write_once(conn, shared, messages).await {
                Ok(results) => return Ok(results),
                Err(failure) => failure,
            },
            Err(failure) => failure,
        };
        connection.failed(&failure);
        if !worth_again(&failure, tries) {
            return Err(failure.into());
        }
    }
}

/// One attempt at `messages` (at most one per group; see the module's comment). They are
/// decided from their groups as read without a lock, and written in one call that checks,
/// under the groups' locks, that none changed meanwhile (`wsr_apply_received`, migration
/// 0002): two round trips a batch. When one did change (another gateway, or this one's
/// sweeper, wrote it between the read and the write), the batch is decided again in a
/// transaction that holds the locks from before the read.
///
/// A batch of singletons skips the read: a singleton is almost always new, so each is decided
/// as one whose group is not stored, and the write's insert of that group is the check (a
/// resend finds its group there, and the batch goes the way above). This holds only if every
/// decision stores its group; a decision that stores nothing (a fault) is not written
/// unread: the batch is read and decided again.
async fn write_once(
    conn: &mut PgConnection,
    shared: &Shared,
    messages: &[&ReceivedMessage],
) -> Result<Vec<Result<Received, StoreError>>, Failure> {
    let keys = BatchKeys::of(messages);
    if messages.iter().all(|m| m.request.key().number.is_none()) {
        let written = decide_and_apply(&mut *conn, shared, messages, Basis::AssumedNew).await?;
        if let Some(written) = written {
            return Ok(written.committed(shared));
        }
    }
    let stored = read_groups(&mut *conn, &keys).await?;
    let written = decide_and_apply(&mut *conn, shared, messages, Basis::Read(stored)).await?;
    if let Some(written) = written {
        return Ok(written.committed(shared));
    }
    tracing::debug!(
        messages = messages.len(),
        "a group of the batch changed since it was read; deciding again under its lock"
    );
    let mut tx = conn.begin().await?;
    lock_groups(&mut tx, &keys).await?;
    let stored = read_groups(&mut tx, &keys).await?;
    let Some(written) = decide_and_apply(&mut tx, shared, messages, Basis::Read(stored)).await?
    else {
        let why = "a group changed while this gateway held its lock".to_owned();
        tracing::error!(reason = %why, "messages refused; their transaction rolled back");
        return Err(StoreError::Corrupt(why).into());
    };
    tx.commit().await?;
    Ok(written.committed(shared))
}

/// What a batch is decided from.
enum Basis {
    /// Its stored groups, as read.
    Read(StoredGroups),
    /// Nothing read: every group taken for one not stored (singletons; see `write_once`).
    AssumedNew,
}

/// The (partner, group id) of each message of a batch, in its order.
struct BatchKeys<'m> {
    partners: Vec<&'m str>,
    group_ids: Vec<String>,
}

impl<'m> BatchKeys<'m> {
    fn of(messages: &[&'m ReceivedMessage]) -> BatchKeys<'m> {
        BatchKeys {
            partners: messages.iter().map(|m| m.partner.as_str()).collect(),
            group_ids: messages
                .iter()
                .map(|m| m.request.key().group_id.as_str().to_owned())
                .collect(),
        }
    }
}

/// A batch written (or about to be committed, under the locks), with what it announces.
struct Written<'m> {
    decided: Vec<Result<Decided<'m>, StoreError>>,
    announcement: Announcement,
}

impl Written<'_> {
    /// After the commit: wakes this gateway's own waiters (the other gateways hear of it by
    /// the NOTIFY the write sent) and answers each message.
    fn committed(self, shared: &Shared) -> Vec<Result<Received, StoreError>> {
        self.announcement.wake_here(shared);
        shared.health.committed(true);
        self.decided
            .into_iter()
            .map(|d| {
                d.map(|d| Received {
                    verdict: d.plan.verdict,
                    action: d.plan.action,
                })
            })
            .collect()
    }
}

/// Decides each message from `basis` and writes the batch; `None`, with nothing written, when
/// a group changed since it was read (or, read or not, was stored meanwhile), or when a batch
/// decided unread has a decision that stores no group.
async fn decide_and_apply<'m>(
    conn: &mut PgConnection,
    shared: &Shared,
    messages: &[&'m ReceivedMessage],
    basis: Basis,
) -> Result<Option<Written<'m>>, Failure> {
    let assumed_new = matches!(basis, Basis::AssumedNew);
    let mut stored = match basis {
        Basis::Read(stored) => stored,
        Basis::AssumedNew => StoredGroups::new(),
    };
    let mut open_by_source = open_groups_by_source(&mut *conn, messages, &stored).await?;
    let mut decided: Vec<Result<Decided<'m>, StoreError>> = Vec::with_capacity(messages.len());
    for m in messages {
        let key = (
            m.partner.clone(),
            m.request.key().group_id.as_str().to_owned(),
        );
        let outcome = match stored.remove(&key) {
            Some(Err(e)) => Err(e),
            Some(Ok(group)) => decide(shared, m, Some(&group), 0),
            None => {
                let open = open_by_source.get(m.source.as_str()).copied().unwrap_or(0);
                let d = decide(shared, m, None, open);
                if let Ok(d) = &d {
                    let opens = d.plan.group.as_ref().is_some_and(|w| {
                        w.state.status.as_str() == "open" && starts_counted_group(&m.request)
                    });
                    if opens {
                        *open_by_source.entry(m.source.as_str()).or_default() += 1;
                    }
                }
                d
            }
        };
        decided.push(outcome);
    }

    let stores_every_group = || {
        decided
            .iter()
            .all(|d| d.as_ref().is_ok_and(|d| d.plan.group.is_some()))
    };
    if assumed_new && !stores_every_group() {
        return Ok(None);
    }

    let mut announcement = Announcement::default();
    let mut rows = Rows::default();
    for d in decided.iter().flatten() {
        rows.add(d, &mut announcement);
    }
    announcement.wakes.appended |= rows.appended > 0;
    let injected = shared
        .failing_commits
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if injected {
        return Err(StoreError::Injected.into());
    }
    if !rows.apply(conn, &announcement).await? {
        return Ok(None);
    }
    Ok(Some(Written {
        decided,
        announcement,
    }))
}

/// The pure rules' decision for one message, a panic in them caught as its failure.
fn decide<'m>(
    shared: &Shared,
    m: &'m ReceivedMessage,
    stored: Option<&StoredGroup>,
    open_groups_of_source: u64,
) -> Result<Decided<'m>, StoreError> {
    let doomed = shared
        .panicking_group
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_deref()
        == Some(m.request.key().group_id.as_str());
    let planned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if doomed {
            panic!("injected panic (test hook)");
        }
        plan_receive(
            stored.map(|g| &g.state),
            Incoming {
                request: &m.request,
                channel: &m.channel,
                body_bytes: m.payload.len() as u64,
                open_groups_of_source,
            },
            m.now,
            &shared.policy,
        )
    }));
    let plan = planned.map_err(|p| StoreError::Panicked(panic_message(&*p)))?;
    Ok(Decided {
        message: m,
        group_row: stored.map(|g| g.id),
        group_version: stored.map(|g| g.version),
        plan,
    })
}

/// One message's decision, with the row id and version of its group when the group was stored.
struct Decided<'m> {
    message: &'m ReceivedMessage,
    group_row: Option<i64>,
    group_version: Option<i64>,
    plan: ReceivePlan,
}

impl Decided<'_> {
    fn group_id(&self) -> String {
        self.message.request.key().group_id.as_str().to_owned()
    }

    fn delivers(&self) -> bool {
        self.plan.action == Action::Deliver
    }
}

// Every statement of the writer joins the batch's arrays to a table by key, and a prepared
// statement's generic plan, made once per connection while a table was small, would keep
// scanning the whole table after it has grown (measured: the read of the batch's groups fell
// from 5,400 to 2,900 msgs/s within 70,000 groups). The writer's connection therefore forbids
// the plans that scan (`KEYED_PLANS_ONLY`): what is left is an index lookup per key, right at
// any size, so its statements are prepared once and planned once, as are those PL/pgSQL
// caches for `wsr_apply_received` (planning each batch's statements anew was measured at a
// fifth of its backend's time).

/// Locks every group of the batch until the transaction ends, in hash order: PostgreSQL
/// evaluates a volatile function of the SELECT list after the ORDER BY, so the locks are taken
/// in that order and two batches sharing groups cannot each hold one the other waits for.
/// `wsr_apply_received` takes the same locks in the same order.
async fn lock_groups(conn: &mut PgConnection, keys: &BatchKeys<'_>) -> Result<(), Failure> {
    sqlx::query(
        "SELECT pg_advisory_xact_lock(k) FROM (SELECT DISTINCT \
         hashtextextended(p || chr(31) || g, 0) AS k FROM unnest($1::text[], $2::text[]) \
         AS t(p, g)) AS keys ORDER BY k",
    )
    .bind(&keys.partners)
    .bind(&keys.group_ids)
    .execute(conn)
    .await?;
    Ok(())
}

/// A group as stored: its row, the row's version (`xmin`: the transaction that last wrote
/// it, renewed by every write) and its state.
struct StoredGroup {
    id: i64,
    version: i64,
    state: GroupState,
}

type StoredGroups = HashMap<(String, String), Result<StoredGroup, StoreError>>;

/// The stored groups of the batch; an unreadable one fails only its message.
async fn read_groups(
    conn: &mut PgConnection,
    keys: &BatchKeys<'_>,
) -> Result<StoredGroups, Failure> {
    let rows = sqlx::query(
        "SELECT g.partner, g.group_id, g.id, g.xmin::text::bigint, g.state_bin FROM groups g \
         JOIN unnest($1::text[], $2::text[]) AS t(p, gid) \
         ON g.partner = t.p AND g.group_id = t.gid",
    )
    .bind(&keys.partners)
    .bind(&keys.group_ids)
    .fetch_all(conn)
    .await?;
    let mut stored = HashMap::with_capacity(rows.len());
    for r in rows {
        let key: (String, String) = (r.try_get(0)?, r.try_get(1)?);
        let state = decode(r.try_get::<&[u8], _>(4)?).map_err(|e| {
            tracing::error!(reason = %e, "message refused: its group's stored state is unreadable");
            e
        });
        let (id, version) = (r.try_get(2)?, r.try_get(3)?);
        stored.insert(key, state.map(|state| StoredGroup { id, version, state }));
    }
    Ok(stored)
}

/// Open groups per source, for the sources of messages that would start a counted group.
async fn open_groups_by_source<'m>(
    conn: &mut PgConnection,
    messages: &[&'m ReceivedMessage],
    stored: &StoredGroups,
) -> Result<HashMap<&'m str, u64>, Failure> {
    let sources: Vec<&str> = messages
        .iter()
        .filter(|m| {
            starts_counted_group(&m.request)
                && !stored.contains_key(&(
                    m.partner.clone(),
                    m.request.key().group_id.as_str().to_owned(),
                ))
        })
        .map(|m| m.source.as_str())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let mut open = HashMap::new();
    if sources.is_empty() {
        return Ok(open);
    }
    let counts: Vec<(String, i64)> = sqlx::query_as(
        "SELECT source, count(*) FROM groups WHERE status = 'open' AND source = ANY($1) \
         GROUP BY source",
    )
    .bind(&sources)
    .fetch_all(conn)
    .await?;
    for s in sources {
        let n = counts
            .iter()
            .find(|(source, _)| source == s)
            .map_or(0, |(_, n)| u64::try_from(*n).unwrap_or(0));
        open.insert(s, n);
    }
    Ok(open)
}

/// The batch's writes, gathered column by column for `wsr_apply_received`'s arrays.
#[derive(Default)]
struct Rows<'m> {
    /// Every group decided about, with the version of it the decision read (`None`: none
    /// was stored).
    decided_groups: DecidedGroups,
    discard: Triples,
    callbacks: CallbackRows,
    faults: FaultRows,
    new_groups: NewGroupRows,
    changed_groups: ChangedGroupRows,
    buffered: MessageRows<'m>,
    /// Delivered messages, with their offsets counted from 1 within the batch.
    delivered: MessageRows<'m>,
    /// Buffered messages released, and their offsets within the batch.
    released: Triples,
    released_offsets: Vec<i64>,
    /// Inbox offsets the batch takes: each delivered message, then what it released.
    appended: i64,
}

#[derive(Default)]
struct DecidedGroups {
    partner: Vec<String>,
    group_id: Vec<String>,
    version: Vec<Option<i64>>,
}

#[derive(Default)]
struct Triples {
    partner: Vec<String>,
    group_id: Vec<String>,
    number: Vec<i64>,
}

impl Triples {
    fn push(&mut self, partner: &str, group_id: &str, number: u64) {
        self.partner.push(partner.to_owned());
        self.group_id.push(group_id.to_owned());
        self.number.push(number as i64);
    }
}

#[derive(Default)]
struct CallbackRows {
    partner: Vec<String>,
    endpoint: Vec<String>,
    soap12: Vec<bool>,
    group_id: Vec<String>,
    number: Vec<Option<i64>>,
    fault: Vec<Option<&'static str>>,
    expiry: Vec<i64>,
    next_attempt: Vec<i64>,
}

#[derive(Default)]
struct FaultRows {
    partner: Vec<String>,
    group_id: Vec<String>,
    singleton: Vec<bool>,
    number: Vec<i64>,
    fault: Vec<&'static str>,
    expiry: Vec<i64>,
}

#[derive(Default)]
struct NewGroupRows {
    partner: Vec<String>,
    group_id: Vec<String>,
    channel: Vec<String>,
    status: Vec<&'static str>,
    deadline: Vec<Option<i64>>,
    updated_at: Vec<i64>,
    source: Vec<String>,
    state: Vec<Vec<u8>>,
}

#[derive(Default)]
struct ChangedGroupRows {
    id: Vec<i64>,
    status: Vec<&'static str>,
    deadline: Vec<Option<i64>>,
    updated_at: Vec<i64>,
    state: Vec<Vec<u8>>,
}

/// Messages to insert into `buffered` or `inbox` (the inbox rows also carry offsets).
#[derive(Default)]
struct MessageRows<'m> {
    offset: Vec<i64>,
    partner: Vec<&'m str>,
    group_id: Vec<String>,
    number: Vec<Option<i64>>,
    channel: Vec<&'m str>,
    topic: Vec<&'m str>,
    namespaces: Vec<&'m str>,
    received_at: Vec<i64>,
    expiry: Vec<i64>,
    payload: Vec<&'m [u8]>,
}

impl<'m> MessageRows<'m> {
    fn push(&mut self, m: &'m ReceivedMessage, offset: Option<i64>) {
        let key = m.request.key();
        if let Some(offset) = offset {
            self.offset.push(offset);
        }
        self.partner.push(&m.partner);
        self.group_id.push(key.group_id.as_str().to_owned());
        self.number.push(key.number.map(|n| n as i64));
        self.channel.push(&m.channel);
        self.topic.push(&m.topic);
        self.namespaces.push(&m.namespaces);
        self.received_at.push(millis(m.now));
        self.expiry.push(millis(m.request.expiry_time));
        self.payload.push(m.payload.as_bytes());
    }
}

impl<'m> Rows<'m> {
    fn add(&mut self, d: &Decided<'m>, announcement: &mut Announcement) {
        let m = d.message;
        let partner = m.partner.as_str();
        let group_id = d.group_id();
        let now = millis(m.now);
        let groups = &mut self.decided_groups;
        groups.partner.push(partner.to_owned());
        groups.group_id.push(group_id.clone());
        groups.version.push(d.group_version);
        for n in &d.plan.discard {
            self.discard.push(partner, &group_id, *n);
        }
        for c in &d.plan.callbacks {
            let rows = &mut self.callbacks;
            rows.partner.push(partner.to_owned());
            rows.endpoint.push(c.endpoint.clone());
            rows.soap12.push(m.soap12);
            rows.group_id.push(group_id.clone());
            rows.number.push(c.number.map(|n| n as i64));
            rows.fault.push(c.fault.map(|f| f.local_name()));
            rows.expiry.push(millis(c.keep_until));
            rows.next_attempt.push(now);
            announcement.wakes.callbacks = true;
        }
        if let Some(f) = &d.plan.poll_fault {
            let rows = &mut self.faults;
            rows.partner.push(partner.to_owned());
            rows.group_id.push(group_id.clone());
            rows.singleton.push(f.number.is_none());
            rows.number.push(slot(f.number) as i64);
            rows.fault.push(f.code.local_name());
            rows.expiry.push(millis(f.keep_until));
        }
        if let Some(write) = &d.plan.group {
            let deadline = write.deadline.map(millis);
            announcement.deadline(deadline);
            let mut encoded = Vec::new();
            encode(&write.state, &mut encoded);
            match d.group_row {
                Some(id) => {
                    let rows = &mut self.changed_groups;
                    rows.id.push(id);
                    rows.status.push(write.state.status.as_str());
                    rows.deadline.push(deadline);
                    rows.updated_at.push(now);
                    rows.state.push(encoded);
                }
                None => {
                    let rows = &mut self.new_groups;
                    rows.partner.push(partner.to_owned());
                    rows.group_id.push(write.state.group_id.as_str().to_owned());
                    rows.channel.push(write.state.params.channel.clone());
                    rows.status.push(write.state.status.as_str());
                    rows.deadline.push(deadline);
                    rows.updated_at.push(now);
                    rows.source.push(m.source.clone());
                    rows.state.push(encoded);
                }
            }
        }
        if d.plan.action == Action::Buffer {
            self.buffered.push(m, None);
        }
        if d.delivers() {
            self.appended += 1;
            self.delivered.push(m, Some(self.appended));
        }
        let key = m.request.key();
        for n in &d.plan.release {
            self.appended += 1;
            self.released.push(partner, &group_id, *n);
            self.released_offsets.push(self.appended);
            announcement.delivered.push((
                m.partner.clone(),
                MessageKey {
                    group_id: key.group_id.clone(),
                    number: Some(*n),
                },
            ));
        }
    }

    /// Writes the batch and sends `announcement` in one call (see migration 0002): `false`,
    /// with nothing written, when a decided group is no longer the version its decision read.
    async fn apply(
        &self,
        conn: &mut PgConnection,
        announcement: &Announcement,
    ) -> Result<bool, Failure> {
        let (channel, payloads) = notifications(announcement);
        let (k, d, c, f) = (
            &self.decided_groups,
            &self.discard,
            &self.callbacks,
            &self.faults,
        );
        let (u, n, b, i) = (
            &self.changed_groups,
            &self.new_groups,
            &self.buffered,
            &self.delivered,
        );
        let r = &self.released;
        let applied = sqlx::query_scalar::<_, bool>(
            "SELECT wsr_apply_received($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, \
             $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, \
             $30, $31, $32, $33, $34, $35, $36, $37, $38, $39, $40, $41, $42, $43, $44, $45, \
             $46, $47, $48, $49, $50, $51, $52, $53, $54, $55, $56, $57, $58, $59)",
        )
        .bind(&k.partner)
        .bind(&k.group_id)
        .bind(&k.version)
        .bind(&d.partner)
        .bind(&d.group_id)
        .bind(&d.number)
        .bind(&c.partner)
        .bind(&c.endpoint)
        .bind(&c.soap12)
        .bind(&c.group_id)
        .bind(&c.number)
        .bind(&c.fault)
        .bind(&c.expiry)
        .bind(&c.next_attempt)
        .bind(&f.partner)
        .bind(&f.group_id)
        .bind(&f.singleton)
        .bind(&f.number)
        .bind(&f.fault)
        .bind(&f.expiry)
        .bind(&u.id)
        .bind(&u.status)
        .bind(&u.deadline)
        .bind(&u.updated_at)
        .bind(&u.state)
        .bind(&n.partner)
        .bind(&n.group_id)
        .bind(&n.channel)
        .bind(&n.status)
        .bind(&n.deadline)
        .bind(&n.updated_at)
        .bind(&n.source)
        .bind(&n.state)
        .bind(&b.partner)
        .bind(&b.group_id)
        .bind(&b.number)
        .bind(&b.channel)
        .bind(&b.topic)
        .bind(&b.namespaces)
        .bind(&b.received_at)
        .bind(&b.expiry)
        .bind(&b.payload)
        .bind(&i.offset)
        .bind(&i.partner)
        .bind(&i.group_id)
        .bind(&i.number)
        .bind(&i.channel)
        .bind(&i.topic)
        .bind(&i.namespaces)
        .bind(&i.received_at)
        .bind(&i.expiry)
        .bind(&i.payload)
        .bind(&self.released_offsets)
        .bind(&r.partner)
        .bind(&r.group_id)
        .bind(&r.number)
        .bind(self.appended)
        .bind(channel)
        .bind(&payloads)
        .fetch_one(conn)
        .await;
        let e = match applied {
            Ok(applied) => return Ok(applied),
            Err(e) => e,
        };
        let Some(db) = e.as_database_error() else {
            return Err(e.into());
        };
        if db.constraint() == Some(ONE_ROW_PER_GROUP) {
            return Ok(false);
        }
        if db.code().as_deref() == Some(RELEASE_MISSING) {
            let why = db.message().to_owned();
            tracing::error!(reason = %why, "messages refused; their transaction rolled back");
            return Err(StoreError::Corrupt(why).into());
        }
        Err(e.into())
    }
}
