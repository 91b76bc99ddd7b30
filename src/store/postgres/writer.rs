//! The group-commit writer (DESIGN §7): one task per gateway takes every received message
//! waiting for it, decides them all in one transaction with multi-row statements and commits
//! once. A commit is what a durable ack waits for (the WAL flush), and the `sequences` row that
//! hands out inbox offsets is held from the moment offsets are taken to the end of that flush,
//! so one commit per message would serialise every gateway on one flush each; one commit per
//! batch shares each flush among everything that arrived meanwhile.
//!
//! A batch holds at most one message per group: the decisions about a group then never depend
//! on another message of the same batch, and a message of a group already in the batch starts
//! the next one. Its groups are locked in one statement, in hash order, so that two gateways'
//! batches wait for each other instead of deadlocking. A message whose decision fails (an
//! unreadable group, a panic) fails alone; a statement that fails takes the batch back, and
//! then each message is tried in a batch of its own, so that only the one at fault fails.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use sqlx::postgres::PgPool;
use sqlx::{PgConnection, Row};
use tokio::sync::{mpsc, oneshot};

use super::receiver::{Failure, decode, take_offsets};
use super::shared::{Shared, Tasks};
use super::{Announcement, PostgresStore};
use crate::rmp::group::{GroupState, slot};
use crate::rmp::receive_plan::{ReceivePlan, plan_receive};
use crate::rmp::receiver::{Action, Incoming, starts_counted_group};
use crate::store::error::panic_message;
use crate::store::group_state;
use crate::store::received::{Received, ReceivedMessage};
use crate::store::time::millis;
use crate::store::{StoreError, StoreFuture};
use crate::wsr::MessageKey;

/// Most messages one transaction decides.
const MAX_BATCH: usize = 256;

/// Most payload bytes one transaction carries; a larger message goes in a batch of its own.
const MAX_BATCH_BYTES: usize = 16 << 20;

/// Messages waiting for the writer; a receive waits here when the writer falls behind.
const QUEUE: usize = 1024;

/// One received message and where its decision goes.
pub(super) struct Job {
    message: ReceivedMessage,
    answer: oneshot::Sender<Result<Received, StoreError>>,
}

/// Where receives hand their messages to this gateway's writer, and the writer's task.
pub(super) struct Writer {
    queue: mpsc::Sender<Job>,
    tasks: Tasks,
}

impl Writer {
    /// The writer's end for receives, and the jobs its task (`spawn`) will take.
    pub(super) fn new() -> (Writer, mpsc::Receiver<Job>) {
        let (queue, jobs) = mpsc::channel(QUEUE);
        let writer = Writer {
            queue,
            tasks: Tasks::default(),
        };
        (writer, jobs)
    }
}

/// Starts the writer; it stops with the last handle to `shared` (which holds its queue).
pub(super) fn spawn(pool: &PgPool, shared: &Arc<Shared>, jobs: mpsc::Receiver<Job>) {
    let task = tokio::spawn(run(pool.clone(), Arc::downgrade(shared), jobs));
    shared.writer.tasks.add(task);
}

/// The writer's loop: a batch of whatever is waiting, decided and committed, then the next.
/// One batch at a time: a second writer overlapping the first's flush was measured to cost
/// more CPU per message (smaller batches) for no more throughput on two cores.
async fn run(pool: PgPool, shared: Weak<Shared>, mut queue: mpsc::Receiver<Job>) {
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
        let store = PostgresStore {
            pool: pool.clone(),
            shared,
        };
        let results = store.write(&batch).await;
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

impl PostgresStore {
    /// Hands `message` to the writer and waits for its committed decision.
    pub(super) fn enqueue(
        &self,
        message: ReceivedMessage,
    ) -> StoreFuture<'_, Result<Received, StoreError>> {
        Box::pin(async move {
            let (answer, decided) = oneshot::channel();
            self.shared
                .writer
                .queue
                .send(Job { message, answer })
                .await
                .map_err(|_| StoreError::Closed)?;
            decided.await.map_err(|_| StoreError::Closed)?
        })
    }

    /// Decides and commits `batch`, one result per job in its order.
    async fn write(&self, batch: &[Job]) -> Vec<Result<Received, StoreError>> {
        let messages: Vec<&ReceivedMessage> = batch.iter().map(|j| &j.message).collect();
        match self.retrying(|| self.write_once(&messages)).await {
            Ok(results) => results,
            Err(StoreError::Injected) => {
                messages.iter().map(|_| Err(StoreError::Injected)).collect()
            }
            Err(e) if messages.len() == 1 => vec![Err(e)],
            Err(e) => {
                tracing::debug!(error = %e, messages = messages.len(), "batch failed; each message again on its own");
                let mut results = Vec::with_capacity(messages.len());
                for m in &messages {
                    let one = [*m];
                    let alone = self.retrying(|| self.write_once(&one)).await;
                    results
                        .push(alone.and_then(|mut r| r.pop().unwrap_or(Err(StoreError::Closed))));
                }
                results
            }
        }
    }

    /// One transaction for `messages` (at most one per group; see the module's comment).
    async fn write_once(
        &self,
        messages: &[&ReceivedMessage],
    ) -> Result<Vec<Result<Received, StoreError>>, Failure> {
        let mut tx = self.begin().await?;
        let partners: Vec<&str> = messages.iter().map(|m| m.partner.as_str()).collect();
        let group_ids: Vec<String> = messages
            .iter()
            .map(|m| m.request.key().group_id.as_str().to_owned())
            .collect();
        lock_groups(&mut tx, &partners, &group_ids).await?;
        let mut stored = read_groups(&mut tx, &partners, &group_ids).await?;
        let mut open_by_source = open_groups_by_source(&mut tx, messages, &stored).await?;

        let mut decided: Vec<Result<Decided<'_>, StoreError>> = Vec::with_capacity(messages.len());
        for (m, group_id) in messages.iter().zip(&group_ids) {
            let stored_group = stored.remove(&(m.partner.clone(), group_id.clone()));
            let outcome = match stored_group {
                Some(Err(e)) => Err(e),
                Some(Ok((id, state))) => self.decide(m, Some((id, &state)), 0),
                None => {
                    let open = open_by_source.get(m.source.as_str()).copied().unwrap_or(0);
                    let d = self.decide(m, None, open);
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

        let mut announcement = Announcement::default();
        let mut rows = Rows::default();
        for d in decided.iter().flatten() {
            rows.add(d, &mut announcement);
        }
        rows.write_before_offsets(&mut tx).await?;
        let appended = appended(&decided);
        if appended > 0 {
            let last = take_offsets(&mut tx, appended).await?;
            rows.write_inbox(&mut tx, &decided, last - appended, &mut announcement)
                .await?;
            announcement.wakes.appended = true;
        }
        let injected = self
            .shared
            .failing_commits
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if injected {
            tx.rollback().await?;
            return Err(StoreError::Injected.into());
        }
        self.commit(tx, announcement).await?;
        self.shared.health.committed(true);
        Ok(decided
            .into_iter()
            .map(|d| {
                d.map(|d| Received {
                    verdict: d.plan.verdict,
                })
            })
            .collect())
    }

    /// The pure rules' decision for one message, a panic in them caught as its failure.
    fn decide<'m>(
        &self,
        m: &'m ReceivedMessage,
        stored: Option<(i64, &GroupState)>,
        open_groups_of_source: u64,
    ) -> Result<Decided<'m>, StoreError> {
        let doomed = self
            .shared
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
                stored.map(|(_, s)| s),
                Incoming {
                    request: &m.request,
                    channel: &m.channel,
                    body_bytes: m.payload.len() as u64,
                    open_groups_of_source,
                },
                m.now,
                &self.shared.policy,
            )
        }));
        let plan = planned.map_err(|p| StoreError::Panicked(panic_message(&*p)))?;
        Ok(Decided {
            message: m,
            group_row: stored.map(|(id, _)| id),
            plan,
        })
    }
}

/// One message's decision, with the row id of its group when the group was stored.
struct Decided<'m> {
    message: &'m ReceivedMessage,
    group_row: Option<i64>,
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

// The statements that join the batch's arrays to a table run unprepared (`persistent(false)`):
// a prepared statement's generic plan, made once per connection while a table was small, keeps
// scanning the whole table after it has grown (measured: the read of the batch's groups fell
// from 5,400 to 2,900 msgs/s within 70,000 groups). Planned with the batch's own arrays and the
// table as it is, they look rows up by index; the cost is one plan per batch, not per message.

/// Locks every group of the batch until the transaction ends, in hash order: PostgreSQL
/// evaluates a volatile function of the SELECT list after the ORDER BY, so the locks are taken
/// in that order and two batches sharing groups cannot each hold one the other waits for.
async fn lock_groups(
    conn: &mut PgConnection,
    partners: &[&str],
    group_ids: &[String],
) -> Result<(), Failure> {
    sqlx::query(
        "SELECT pg_advisory_xact_lock(k) FROM (SELECT DISTINCT \
         hashtextextended(p || chr(31) || g, 0) AS k FROM unnest($1::text[], $2::text[]) \
         AS t(p, g)) AS keys ORDER BY k",
    )
    .bind(partners)
    .bind(group_ids)
    .execute(conn)
    .await?;
    Ok(())
}

type StoredGroups = HashMap<(String, String), Result<(i64, GroupState), StoreError>>;

/// The stored groups of the batch (read under their locks); an unreadable one fails only
/// its message.
async fn read_groups(
    conn: &mut PgConnection,
    partners: &[&str],
    group_ids: &[String],
) -> Result<StoredGroups, Failure> {
    let rows = sqlx::query(
        "SELECT g.partner, g.group_id, g.id, g.state_bin FROM groups g \
         JOIN unnest($1::text[], $2::text[]) AS t(p, gid) \
         ON g.partner = t.p AND g.group_id = t.gid",
    )
    .persistent(false)
    .bind(partners)
    .bind(group_ids)
    .fetch_all(conn)
    .await?;
    let mut stored = HashMap::with_capacity(rows.len());
    for r in rows {
        let key: (String, String) = (r.try_get(0)?, r.try_get(1)?);
        let state = decode(r.try_get::<&[u8], _>(3)?).map_err(|e| {
            tracing::error!(reason = %e, "message refused: its group's stored state is unreadable");
            e
        });
        let id: i64 = r.try_get(2)?;
        stored.insert(key, state.map(|s| (id, s)));
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

/// Inbox offsets the batch appends: each delivered message, then what it released.
fn appended(decided: &[Result<Decided<'_>, StoreError>]) -> i64 {
    decided
        .iter()
        .flatten()
        .map(|d| i64::from(d.delivers()) + d.plan.release.len() as i64)
        .sum()
}

/// The batch's writes, gathered column by column for multi-row statements.
#[derive(Default)]
struct Rows<'m> {
    discard: Triples,
    callbacks: CallbackRows,
    faults: FaultRows,
    new_groups: NewGroupRows,
    changed_groups: ChangedGroupRows,
    buffered: MessageRows<'m>,
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
            group_state::encode(&write.state, &mut encoded);
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
    }

    /// Everything but the inbox: written before the offsets are taken, so that the
    /// `sequences` row is held only for the inbox inserts and the commit.
    async fn write_before_offsets(&self, conn: &mut PgConnection) -> Result<(), Failure> {
        if !self.discard.number.is_empty() {
            sqlx::query(
                "DELETE FROM buffered b USING unnest($1::text[], $2::text[], $3::bigint[]) \
                 AS t(p, g, n) WHERE b.partner = t.p AND b.group_id = t.g AND b.number = t.n",
            )
            .persistent(false)
            .bind(&self.discard.partner)
            .bind(&self.discard.group_id)
            .bind(&self.discard.number)
            .execute(&mut *conn)
            .await?;
        }
        let c = &self.callbacks;
        if !c.partner.is_empty() {
            sqlx::query(
                "INSERT INTO pending_callbacks (partner, endpoint, soap12, group_id, number, \
                 fault, expiry, next_attempt) SELECT * FROM unnest($1::text[], $2::text[], \
                 $3::boolean[], $4::text[], $5::bigint[], $6::text[], $7::bigint[], $8::bigint[])",
            )
            .bind(&c.partner)
            .bind(&c.endpoint)
            .bind(&c.soap12)
            .bind(&c.group_id)
            .bind(&c.number)
            .bind(&c.fault)
            .bind(&c.expiry)
            .bind(&c.next_attempt)
            .execute(&mut *conn)
            .await?;
        }
        let f = &self.faults;
        if !f.partner.is_empty() {
            sqlx::query(
                "INSERT INTO message_faults (partner, group_id, singleton, number, fault, expiry) \
                 SELECT * FROM unnest($1::text[], $2::text[], $3::boolean[], $4::bigint[], \
                 $5::text[], $6::bigint[]) ON CONFLICT (partner, group_id, singleton, number) \
                 DO NOTHING",
            )
            .bind(&f.partner)
            .bind(&f.group_id)
            .bind(&f.singleton)
            .bind(&f.number)
            .bind(&f.fault)
            .bind(&f.expiry)
            .execute(&mut *conn)
            .await?;
        }
        let g = &self.changed_groups;
        if !g.id.is_empty() {
            sqlx::query(
                "UPDATE groups SET status = t.status, next_deadline = t.deadline, \
                 updated_at = t.updated_at, state_bin = t.state FROM unnest($1::bigint[], \
                 $2::text[], $3::bigint[], $4::bigint[], $5::bytea[]) \
                 AS t(id, status, deadline, updated_at, state) WHERE groups.id = t.id",
            )
            .persistent(false)
            .bind(&g.id)
            .bind(&g.status)
            .bind(&g.deadline)
            .bind(&g.updated_at)
            .bind(&g.state)
            .execute(&mut *conn)
            .await?;
        }
        let g = &self.new_groups;
        if !g.partner.is_empty() {
            sqlx::query(
                "INSERT INTO groups (partner, group_id, channel, status, next_deadline, \
                 updated_at, source, state_bin) SELECT * FROM unnest($1::text[], $2::text[], \
                 $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::text[], $8::bytea[])",
            )
            .bind(&g.partner)
            .bind(&g.group_id)
            .bind(&g.channel)
            .bind(&g.status)
            .bind(&g.deadline)
            .bind(&g.updated_at)
            .bind(&g.source)
            .bind(&g.state)
            .execute(&mut *conn)
            .await?;
        }
        let b = &self.buffered;
        if !b.partner.is_empty() {
            sqlx::query(
                "INSERT INTO buffered (partner, group_id, number, channel, topic, namespaces, \
                 received_at, expiry, payload) SELECT * FROM unnest($1::text[], $2::text[], \
                 $3::bigint[], $4::text[], $5::text[], $6::text[], $7::bigint[], $8::bigint[], \
                 $9::bytea[])",
            )
            .bind(&b.partner)
            .bind(&b.group_id)
            .bind(&b.number)
            .bind(&b.channel)
            .bind(&b.topic)
            .bind(&b.namespaces)
            .bind(&b.received_at)
            .bind(&b.expiry)
            .bind(&b.payload)
            .execute(&mut *conn)
            .await?;
        }
        Ok(())
    }

    /// Appends to the inbox from offset `before + 1` on, in the batch's order: each message
    /// delivered, then the buffered messages it released.
    async fn write_inbox(
        &self,
        conn: &mut PgConnection,
        decided: &[Result<Decided<'m>, StoreError>],
        before: i64,
        announcement: &mut Announcement,
    ) -> Result<(), Failure> {
        let mut offset = before;
        let mut delivered = MessageRows::default();
        let mut released = Triples::default();
        let mut released_offsets = Vec::new();
        for d in decided.iter().flatten() {
            let m = d.message;
            if d.delivers() {
                offset += 1;
                delivered.push(m, Some(offset));
            }
            let key = m.request.key();
            for n in &d.plan.release {
                offset += 1;
                released.push(&m.partner, key.group_id.as_str(), *n);
                released_offsets.push(offset);
                announcement.delivered.push((
                    m.partner.clone(),
                    MessageKey {
                        group_id: key.group_id.clone(),
                        number: Some(*n),
                    },
                ));
            }
        }
        if !delivered.offset.is_empty() {
            sqlx::query(
                "INSERT INTO inbox (\"offset\", partner, group_id, number, channel, topic, \
                 namespaces, received_at, expiry, payload) SELECT * FROM unnest($1::bigint[], \
                 $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[], \
                 $8::bigint[], $9::bigint[], $10::bytea[])",
            )
            .bind(&delivered.offset)
            .bind(&delivered.partner)
            .bind(&delivered.group_id)
            .bind(&delivered.number)
            .bind(&delivered.channel)
            .bind(&delivered.topic)
            .bind(&delivered.namespaces)
            .bind(&delivered.received_at)
            .bind(&delivered.expiry)
            .bind(&delivered.payload)
            .execute(&mut *conn)
            .await?;
        }
        if !released_offsets.is_empty() {
            let moved = sqlx::query(
                "WITH wanted AS (SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], \
                 $4::bigint[]) AS t(o, p, g, n)), \
                 released AS (DELETE FROM buffered b USING wanted w WHERE b.partner = w.p \
                 AND b.group_id = w.g AND b.number = w.n RETURNING b.*) \
                 INSERT INTO inbox (\"offset\", channel, topic, group_id, number, namespaces, \
                 received_at, expiry, partner, payload) SELECT w.o, r.channel, r.topic, \
                 r.group_id, r.number, r.namespaces, r.received_at, r.expiry, r.partner, \
                 r.payload FROM released r JOIN wanted w ON r.partner = w.p \
                 AND r.group_id = w.g AND r.number = w.n",
            )
            .persistent(false)
            .bind(&released_offsets)
            .bind(&released.partner)
            .bind(&released.group_id)
            .bind(&released.number)
            .execute(&mut *conn)
            .await?
            .rows_affected();
            if moved != released_offsets.len() as u64 {
                let why = format!(
                    "{} of {} buffered messages to release are missing",
                    released_offsets.len() as u64 - moved.min(released_offsets.len() as u64),
                    released_offsets.len()
                );
                tracing::error!(reason = %why, "messages refused; their transaction rolled back");
                return Err(StoreError::Corrupt(why).into());
            }
        }
        Ok(())
    }
}
