//! The group-commit writer: one task, one connection, applying concurrent requests' decisions
//! in one transaction and answering each only after the commit that made it durable.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::FutureExt as _;
use sqlx::Connection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use tokio::sync::{mpsc, oneshot};

use super::Shared;
use super::decide::{apply_receive, apply_sweep};
use super::staged::Staged;
use crate::store::{Received, ReceivedMessage, StoreError, SweepReport};
use crate::wsr::MessageKey;

/// Most requests one commit takes; more wait for the next one.
pub(super) const MAX_BATCH: usize = 256;

pub(super) enum Job {
    Receive(
        Box<ReceivedMessage>,
        oneshot::Sender<Result<Received, StoreError>>,
    ),
    Sweep(
        DateTime<Utc>,
        oneshot::Sender<Result<SweepReport, StoreError>>,
    ),
    /// Any other change (delivery to applications): runs in the batch's transaction like the
    /// others; taken out when it runs.
    Run(Option<WriterFn>),
}

/// What runs after the commit: answers the caller (and announces what the change made
/// possible).
pub(super) type Completion = Box<dyn FnOnce() + Send>;

/// How a `Job::Run` ended.
pub(super) enum Ran {
    /// Keep its changes; answer after the commit.
    Keep(Completion),
    /// Refused (a stale receipt, say): roll its changes back, answer with the refusal.
    Undo(Completion),
}

/// A change to run inside the writer's transaction. An error is a store failure: a corrupt
/// state fails the job alone, anything else the whole batch.
pub(super) type WriterFn = Box<
    dyn for<'c> FnOnce(
            &'c mut SqliteConnection,
        ) -> futures_util::future::BoxFuture<'c, Result<Ran, StoreError>>
        + Send,
>;

/// What one job did inside the transaction, announced only after the commit.
#[derive(Default)]
pub(super) struct Effects {
    /// Buffered messages delivered, by (partner, key): their held requests may answer.
    pub(super) delivered: Vec<(String, MessageKey)>,
    pub(super) callbacks: bool,
    /// Messages were appended to the inbox (subscriptions have news).
    pub(super) appended: bool,
    /// The earliest group deadline written.
    pub(super) earliest_deadline: Option<i64>,
}

impl Effects {
    /// Takes in what one more job of the transaction did.
    fn absorb(&mut self, mut job: Effects) {
        self.delivered.append(&mut job.delivered);
        self.callbacks |= job.callbacks;
        self.appended |= job.appended;
        self.earliest_deadline = match (self.earliest_deadline, job.earliest_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

pub(super) async fn run_writer(
    mut conn: SqliteConnection,
    options: SqliteConnectOptions,
    mut jobs: mpsc::Receiver<Job>,
    shared: Arc<Shared>,
) {
    while let Some(first) = jobs.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let outcome = AssertUnwindSafe(commit_batch(&mut conn, batch, &shared))
            .catch_unwind()
            .await;
        let broken = match outcome {
            Ok(connection) => connection == WriterConnection::Broken,
            Err(panic) => {
                // Outside any one job (jobs catch their own): the batch's callers were answered
                // "not stored" when their jobs were dropped; its transaction dies with the
                // connection.
                batch_failed(
                    &shared,
                    &format!("a commit panicked: {}", panic_message(&panic)),
                );
                true
            }
        };
        if broken {
            // The transaction could not even be rolled back: start over on a fresh connection
            // rather than leave every later request failing on a stuck one.
            conn = reconnect(&options).await;
        }
    }
}

/// A batch that was not committed: logged once per burst of identical failures (a full disk
/// fails every batch), and the store is not ready until commits work again.
fn batch_failed(shared: &Shared, why: &str) {
    crate::store::health::log_store_failure("no request of the batch is acknowledged", &why);
    shared.health.failed(why);
}

/// The text a panic carried, for the log.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

async fn reconnect(options: &SqliteConnectOptions) -> SqliteConnection {
    let mut wait = Duration::from_millis(50);
    loop {
        match SqliteConnection::connect_with(options).await {
            Ok(conn) => return conn,
            Err(e) => {
                tracing::error!(error = %e, "cannot reopen the store; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum WriterConnection {
    Usable,
    Broken,
}

/// Runs every job of the batch in one transaction, commits once, then answers every job.
///
/// A job whose stored state cannot be decoded fails alone. To keep that possible without
/// paying two extra statements per message, the batch first runs without savepoints; only if a
/// message job then fails on corrupt state is the transaction rolled back and the batch run
/// again with a savepoint per job (a change job already consumed by the first pass is then
/// answered "not committed"; its caller retries). Any database error, or a savepoint that
/// cannot be released or rolled back, makes the whole transaction untrustworthy: it is rolled
/// back and every job of the batch fails, so nothing half-done is ever committed and nobody is
/// acked.
async fn commit_batch(
    conn: &mut SqliteConnection,
    mut batch: Vec<Job>,
    shared: &Shared,
) -> WriterConnection {
    let mut savepoints = Savepoints::ForChangesOnly;
    let (results, effects, poisoned) = loop {
        if let Err(e) = sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await {
            let why = format!("cannot begin a transaction: {e}");
            batch_failed(shared, &why);
            fail_all(batch, &why);
            return WriterConnection::Usable;
        }
        let mut results = Vec::with_capacity(batch.len());
        let mut effects = Effects::default();
        let mut poisoned = None;
        let mut retry = false;
        // One read of every group the batch's messages touch; their writes wait for the end.
        let mut staged = Staged::default();
        if savepoints == Savepoints::ForChangesOnly {
            // Two jobs touch the same group only when partner and group id are both the same.
            let ids: Vec<(&str, &str)> = batch
                .iter()
                .filter_map(|j| match j {
                    Job::Receive(m, _) => {
                        Some((m.partner.as_str(), m.request.message_id.group_id.as_str()))
                    }
                    _ => None,
                })
                .collect();
            if let Err(e) = staged.read_ahead(conn, &ids).await {
                poisoned = Some(e);
            }
        }
        for job in batch.iter_mut().take_while(|_| poisoned.is_none()) {
            match run_job(conn, job, shared, &mut staged, &mut effects, savepoints).await {
                Ok(JobRun::Done(result)) => results.push(result),
                Ok(JobRun::NeedsSavepoint) => {
                    retry = true;
                    break;
                }
                Err(e) => {
                    poisoned = Some(e);
                    break;
                }
            }
        }
        if !retry {
            if poisoned.is_none() {
                poisoned = staged.flush(conn).await.err();
            }
            break (results, effects, poisoned);
        }
        tracing::warn!("a job failed on corrupt state; running its batch again job by job");
        if let Err(e) = sqlx::query("ROLLBACK").execute(&mut *conn).await {
            tracing::error!(error = %e, "rollback failed; reopening the writer connection");
            fail_all(batch, &format!("rollback failed: {e}"));
            return WriterConnection::Broken;
        }
        savepoints = Savepoints::EveryJob;
    };
    // The test hook fails commits that decide messages, not background sweeps.
    let carries_message = batch.iter().any(|j| matches!(j, Job::Receive(..)));
    let injected = poisoned.is_none()
        && carries_message
        && shared
            .failing_commits
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
    let committed = match (poisoned, injected) {
        (Some(e), _) => Err(e),
        (None, true) => Err(StoreError::Injected),
        (None, false) => sqlx::query("COMMIT")
            .execute(&mut *conn)
            .await
            .map(|_| ())
            .map_err(StoreError::from),
    };
    if let Err(e) = committed {
        batch_failed(shared, &format!("transaction failed: {e}"));
        let rolled_back = sqlx::query("ROLLBACK").execute(&mut *conn).await;
        fail_all(batch, &e.to_string());
        return match rolled_back {
            Ok(_) => WriterConnection::Usable,
            // "no transaction is active": SQLite already rolled it back itself.
            Err(r) if r.to_string().contains("no transaction") => WriterConnection::Usable,
            Err(r) => {
                tracing::error!(error = %r, "rollback failed; reopening the writer connection");
                WriterConnection::Broken
            }
        };
    }
    shared.health.committed(carries_message);
    // Durable now: announce, then answer.
    if !effects.delivered.is_empty() {
        let mut waiters = shared.waiters.lock().unwrap_or_else(|p| p.into_inner());
        for delivered in &effects.delivered {
            for waiter in waiters.remove(delivered).unwrap_or_default() {
                let _ = waiter.send(());
            }
        }
    }
    if effects.callbacks {
        shared.callbacks_due.notify_one();
    }
    if effects.appended {
        shared.announce_deliveries();
    }
    if effects
        .earliest_deadline
        .is_some_and(|d| d <= shared.sweeper_wakeup.load(Ordering::SeqCst))
    {
        shared.deadlines_changed.notify_one();
    }
    for (job, result) in batch.into_iter().zip(results) {
        match (job, result) {
            (Job::Receive(_, tx), Ok(JobResult::Received(r))) => {
                let _ = tx.send(Ok(r));
            }
            (Job::Sweep(_, tx), Ok(JobResult::Swept(r))) => {
                let _ = tx.send(Ok(r));
            }
            (Job::Run(_), Ok(JobResult::Ran(done))) => done(),
            (job, Err(e)) => reply_err(job, e),
            (job, Ok(_)) => reply_err(job, StoreError::Failed("mismatched job result".into())),
        }
    }
    WriterConnection::Usable
}

enum JobResult {
    Received(Received),
    Swept(SweepReport),
    Ran(Completion),
}

fn fail_all(batch: Vec<Job>, why: &str) {
    for job in batch {
        reply_err(job, StoreError::Failed(why.to_owned()));
    }
}

fn reply_err(job: Job, err: StoreError) {
    match job {
        Job::Receive(_, tx) => {
            let _ = tx.send(Err(err));
        }
        Job::Sweep(_, tx) => {
            let _ = tx.send(Err(err));
        }
        // Its caller learns of the failure when its answer is dropped unsent.
        Job::Run(_) => tracing::warn!(error = %err, "a store change was not committed"),
    }
}

/// Whether jobs run in savepoints of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Savepoints {
    /// Only change jobs (`Job::Run`), which may be refused and undone.
    ForChangesOnly,
    EveryJob,
}

/// How one job went, when the transaction is still trustworthy.
enum JobRun {
    /// Its own outcome (an error here fails that job alone).
    Done(Result<JobResult, StoreError>),
    /// It failed on corrupt state outside a savepoint: the batch must run again, carefully.
    NeedsSavepoint,
}

/// Runs one job, in a savepoint where `savepoints` says so. The outer error means the
/// transaction is no longer trustworthy.
async fn run_job(
    conn: &mut SqliteConnection,
    job: &mut Job,
    shared: &Shared,
    staged: &mut Staged,
    effects: &mut Effects,
    savepoints: Savepoints,
) -> Result<JobRun, StoreError> {
    let in_savepoint = savepoints == Savepoints::EveryJob || matches!(job, Job::Run(_));
    if !matches!(job, Job::Receive(..)) {
        // It reads and writes the tables itself: let it see what the batch staged.
        staged.flush(conn).await?;
        staged.forget();
    }
    if let (Job::Receive(message, _), Savepoints::ForChangesOnly) = (&*job, savepoints) {
        // An unreadable group state is found before the job writes anything: it fails alone,
        // and the rest of the batch (delivery changes already applied included) stands.
        let group = message.request.message_id.group_id.as_str();
        if let Err(StoreError::Corrupt(why)) =
            staged.load_group(conn, &message.partner, group).await
        {
            tracing::error!(reason = %why, "message refused: its group's stored state is unreadable");
            return Ok(JobRun::Done(Err(StoreError::Corrupt(why))));
        }
    }
    if in_savepoint {
        // Whatever a savepoint might undo must not include earlier jobs' staged writes.
        debug_assert!(
            staged.is_clear(),
            "staged writes would fall inside a job's savepoint"
        );
        sqlx::query("SAVEPOINT job").execute(&mut *conn).await?;
    }
    let mut job_effects = Effects::default();
    // A panic is a bug, but one job's bug must not take the writer (and with it every later
    // request) down: it becomes that job's failure, handled like corrupt state below.
    let result = AssertUnwindSafe(job_outcome(
        conn,
        job,
        shared,
        staged,
        &mut job_effects,
        in_savepoint,
    ))
    .catch_unwind()
    .await
    .unwrap_or_else(|panic| Err(StoreError::Panicked(panic_message(&panic))));
    let result = match result {
        Ok(JobStep::Result(result)) => result,
        Ok(JobStep::Finished(run)) => return Ok(run),
        Err(e) => Err(e),
    };
    if !in_savepoint {
        return match result {
            Ok(done) => {
                effects.absorb(job_effects);
                Ok(JobRun::Done(Ok(done)))
            }
            Err(StoreError::Corrupt(_) | StoreError::Panicked(_)) => Ok(JobRun::NeedsSavepoint),
            Err(e) => Err(e),
        };
    }
    match result {
        Ok(done) => {
            sqlx::query("RELEASE job").execute(&mut *conn).await?;
            effects.absorb(job_effects);
            Ok(JobRun::Done(Ok(done)))
        }
        Err(failure @ (StoreError::Corrupt(_) | StoreError::Panicked(_))) => {
            tracing::error!(reason = %failure, "store job failed alone; rolled back to its savepoint");
            // Nothing it staged may outlive it.
            *staged = Staged::default();
            sqlx::query("ROLLBACK TO job").execute(&mut *conn).await?;
            sqlx::query("RELEASE job").execute(&mut *conn).await?;
            Ok(JobRun::Done(Err(failure)))
        }
        Err(e) => Err(e),
    }
}

/// What running a job's own work gave: a result to finish in `run_job`, or a run already
/// finished (its savepoint handled).
enum JobStep {
    Result(Result<JobResult, StoreError>),
    Finished(JobRun),
}

/// The job's own work, inside whatever savepoint `run_job` opened.
async fn job_outcome(
    conn: &mut SqliteConnection,
    job: &mut Job,
    shared: &Shared,
    staged: &mut Staged,
    job_effects: &mut Effects,
    in_savepoint: bool,
) -> Result<JobStep, StoreError> {
    let result = match job {
        Job::Receive(message, _) => {
            let doomed = shared
                .panicking_group
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_deref()
                == Some(message.request.message_id.group_id.as_str());
            if doomed {
                panic!("injected panic (test hook)");
            }
            let applied = apply_receive(conn, staged, message, &shared.policy, job_effects).await;
            match applied {
                // In a savepoint, its writes must land before the savepoint ends.
                Ok(r) if in_savepoint => staged.flush(conn).await.map(|()| r),
                other => other,
            }
        }
        .map(JobResult::Received),
        Job::Sweep(now, _) => apply_sweep(conn, *now, &shared.policy, job_effects)
            .await
            .map(JobResult::Swept),
        Job::Run(change) => match change.take() {
            // Consumed by a first pass that was rolled back.
            None => {
                sqlx::query("RELEASE job").execute(&mut *conn).await?;
                return Ok(JobStep::Finished(JobRun::Done(Err(StoreError::Failed(
                    "rolled back with its batch; try again".into(),
                )))));
            }
            Some(change) => match change(&mut *conn).await {
                Ok(Ran::Keep(done)) => Ok(JobResult::Ran(done)),
                Ok(Ran::Undo(done)) => {
                    sqlx::query("ROLLBACK TO job").execute(&mut *conn).await?;
                    sqlx::query("RELEASE job").execute(&mut *conn).await?;
                    return Ok(JobStep::Finished(JobRun::Done(Ok(JobResult::Ran(done)))));
                }
                Err(e) => Err(e),
            },
        },
    };
    Ok(JobStep::Result(result))
}
