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
//! the next one. The groups are read without a lock; the write locks the stored ones, in hash
//! order so that two gateways' batches wait for each other instead of deadlocking, and writes
//! only if each is still the version that was read (a group that was not stored needs no lock:
//! its insert is its check; migration 0018); if one is not, the batch is decided again in a
//! transaction holding the locks from before the read. A message whose decision fails (an
//! unreadable group, a panic) fails alone; a write that fails takes the batch back, and then
//! each message is tried in a batch of its own, so that only the one at fault fails.
//!
//! Here: the writer's task, its connection and the transactions of one batch. The batch's
//! decision is `batch.rs` (one message's, `decided.rs`), its reads and locks `reads.rs`, its one
//! statement `rows.rs`; none of them imports this file, nor one that imports it back.

mod batch;
mod decided;
mod reads;
mod rows;

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::{Connection as _, PgConnection};
use tokio::sync::mpsc;

use self::batch::{Basis, decide_and_apply};
use self::reads::{BatchKeys, lock_groups, read_groups};
use crate::store::StoreError;
use crate::store::postgres::failure::{Failure, worth_again};
use crate::store::postgres::job::Job;
use crate::store::postgres::shared::Shared;
use crate::store::received::{Received, ReceivedMessage};

/// Most messages one transaction decides.
const MAX_BATCH: usize = 256;

/// Most payload bytes one transaction carries; a larger message goes in a batch of its own.
const MAX_BATCH_BYTES: usize = 16 << 20;

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
        #[cfg(feature = "test-hooks")]
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
/// rule `failure::retrying` applies to the pool's transactions; that one cannot lend
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
    // Under the locks no stored group changes or goes, but a group that was not stored can
    // still be stored meanwhile, by another gateway's batch: a new group's insert takes no
    // lock (migration 0018). Then the batch is decided again, with one more group stored
    // each time; a batch refused without one more stored group is a store that contradicts
    // its own locks.
    let mut stored_before: Option<usize> = None;
    loop {
        let mut tx = conn.begin().await?;
        lock_groups(&mut tx, &keys).await?;
        let stored = read_groups(&mut tx, &keys).await?;
        if stored_before.is_some_and(|before| stored.len() <= before) {
            let why = "a group changed while this gateway held its lock".to_owned();
            tracing::error!(reason = %why, "messages refused; their transaction rolled back");
            return Err(StoreError::Corrupt(why).into());
        }
        stored_before = Some(stored.len());
        match decide_and_apply(&mut tx, shared, messages, Basis::Read(stored)).await? {
            Some(written) => {
                tx.commit().await?;
                return Ok(written.committed(shared));
            }
            None => tx.rollback().await?,
        }
    }
}
