//! The batching writer (DESIGN §7): a thread of its own owning a synchronous SQLite
//! connection. It takes every job waiting in its channel (up to `MAX_BATCH`), runs them in one
//! transaction and commits once; each job is answered, and whatever the commit made possible
//! woken, only once the commit is durable — after the syncer thread's sync of the WAL
//! (`syncer.rs`; in os mode at once). While the disk syncs one batch, the writer runs the next.

use super::exchange::keep_answer;
use crate::store::exchange::slot_of;
use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::mpsc;

use super::batch::Batch;
use super::checkpointer::Checkpoints;
use super::job::{Done, Job, MAX_BATCH, Ran, Reply};
use super::shared::Shared;
use super::syncer::{Finish, Syncer};
use super::warm_groups::WarmGroups;
use crate::rmp::quota::SourceRates;
use crate::store::config::Durability;
use crate::store::error::StoreError;
use crate::store::error::panic_message;

/// Where the writer (re)opens its connection.
pub(super) struct Opener {
    path: std::path::PathBuf,
    durability: Durability,
    /// `durability = "full"` without a syncer thread: SQLite syncs in each commit.
    sync_in_commit: bool,
}

impl Opener {
    pub(super) fn new(path: std::path::PathBuf, durability: Durability) -> Opener {
        Opener {
            path,
            durability,
            sync_in_commit: false,
        }
    }

    fn open(&self) -> Result<Connection, StoreError> {
        let conn = open_writer_connection(&self.path)?;
        if self.sync_in_commit {
            conn.execute_batch("PRAGMA synchronous = FULL")?;
        }
        Ok(conn)
    }

    /// Reopens until it works: a writer without a connection answers nobody.
    fn reopen(&self) -> Connection {
        let mut wait = Duration::from_millis(50);
        loop {
            match self.open() {
                Ok(conn) => return conn,
                Err(e) => {
                    tracing::error!(error = %e, "cannot reopen the store; retrying");
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

/// Starts the writer thread on `conn`; it ends when every sender of `jobs` is gone.
pub(super) fn spawn(
    conn: Connection,
    opener: Opener,
    jobs: mpsc::Receiver<Job>,
    shared: Arc<Shared>,
) -> Result<(), StoreError> {
    std::thread::Builder::new()
        .name("wsr-store-writer".into())
        .spawn(move || run(conn, opener, jobs, shared))
        .map(|_| ())
        .map_err(|e| StoreError::Failed(format!("cannot start the store writer: {e}")))
}

fn run(
    mut conn: Connection,
    mut opener: Opener,
    mut jobs: mpsc::Receiver<Job>,
    shared: Arc<Shared>,
) {
    let checkpoints = match opener.open().and_then(Checkpoints::start) {
        Ok(c) => Some(c),
        Err(e) => {
            // Without it the writer checkpoints inside its commits, as SQLite does by default.
            tracing::warn!(error = %e, "no checkpointer thread; the writer checkpoints itself");
            let _ = conn.execute_batch("PRAGMA wal_autocheckpoint = 1000");
            None
        }
    };
    let syncer = start_syncer(&conn, &mut opener, &shared);
    if opener.sync_in_commit {
        // A connection of the opener's, which syncs in each commit.
        conn = opener.reopen();
    }
    let mut batch = Vec::with_capacity(MAX_BATCH);
    // The sources' message rates: this writer stores every message of the database.
    let mut rates = SourceRates::default();
    let mut warm = WarmGroups::default();
    while let Some(first) = jobs.blocking_recv() {
        batch.push(first);
        take_waiting(&mut jobs, &mut batch);
        wait_for_arriving(&mut jobs, &mut batch, &shared);
        // Counted before the commit answers (and so takes) the batch's jobs.
        let jobs = batch.len();
        let started = std::time::Instant::now();
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            commit_batch(
                &conn,
                &mut batch,
                &shared,
                syncer.as_ref(),
                &mut rates,
                &mut warm,
            )
        }));
        // Failed batches too. (The WAL's sync is the syncer's: `metrics::wal_sync`.)
        crate::metrics::writer_batch("sqlite", jobs, started.elapsed());
        let broken = match outcome {
            Ok(connection) => connection == WriterConnection::Broken,
            Err(panic) => {
                // Outside any one job (jobs catch their own): the batch's callers are answered
                // "not stored" as their jobs are dropped; the transaction dies with the
                // connection.
                batch_failed(
                    &shared,
                    &format!("a commit panicked: {}", panic_message(&*panic)),
                );
                // It may have committed before it panicked: readers that saw that commit wait
                // for a sync, which must not depend on another batch coming.
                let latest = shared.durable.latest();
                after_sync(&shared, syncer.as_ref(), latest, Some(Box::new(|_| ())));
                // Whether what it kept was committed is not known.
                warm.forget_all();
                true
            }
        };
        // Jobs not answered (a panic) answer "not stored" by being dropped.
        batch.clear();
        if let Some(c) = &checkpoints {
            c.committed(WAL_PAGES.with(Cell::get));
        }
        if broken {
            // The transaction could not even be rolled back: start over on a fresh connection
            // rather than leave every later request failing on a stuck one.
            drop(conn);
            conn = opener.reopen();
        }
    }
}

/// Longest a commit waits for messages on their way (`wait_for_arriving`).
const ARRIVAL_WAIT: Duration = Duration::from_micros(500);

/// Adds the jobs waiting in the channel to `batch` (up to `MAX_BATCH`).
fn take_waiting(jobs: &mut mpsc::Receiver<Job>, batch: &mut Vec<Job>) {
    while batch.len() < MAX_BATCH {
        match jobs.try_recv() {
            Ok(job) => batch.push(job),
            Err(_) => break,
        }
    }
}

/// Group commit's wait: before committing, the writer lets the request threads run
/// (`yield_now`) and takes what they queued, again and again while that brings more jobs or
/// received requests are still being read and decided (`Arriving`) — for at most
/// `ARRIVAL_WAIT`. A commit costs an `fsync` and its WAL writes whatever it holds: under load
/// on a shared core that was about half of the writer's CPU, spent on batches half the size of
/// the requests in flight, because the writer started as soon as a few were queued while the
/// next ones sat unread or half-parsed. With nothing on its way (a lone request, a consumer's
/// settle) the first yield brings nothing and the commit starts at once.
fn wait_for_arriving(jobs: &mut mpsc::Receiver<Job>, batch: &mut Vec<Job>, shared: &Shared) {
    let started = std::time::Instant::now();
    while batch.len() < MAX_BATCH && started.elapsed() < ARRIVAL_WAIT {
        let before = batch.len();
        std::thread::yield_now();
        take_waiting(jobs, batch);
        if batch.len() == before && shared.arriving.load(Ordering::Relaxed) == 0 {
            break;
        }
    }
}

/// A batch that was not committed: logged once per burst of identical failures (a full disk
/// fails every batch), and the store is not ready until commits work again.
fn batch_failed(shared: &Shared, why: &str) {
    crate::store::health::log_store_failure("no request of the batch is acknowledged", &why);
    shared.health.failed(why);
}

#[derive(Debug, PartialEq, Eq)]
enum WriterConnection {
    Usable,
    Broken,
}

fn exec(conn: &Connection, sql: &str) -> Result<(), StoreError> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

/// Runs every job of the batch in one transaction, commits once, then answers every job.
///
/// A job whose group state cannot be decoded, or that panics, fails alone: a message job finds
/// out before it writes anything, a message job that may find a buffered row missing runs in a
/// savepoint, and a change always runs in one. Any database error fails the whole batch: the
/// transaction is rolled back and nobody is acked.
fn commit_batch(
    conn: &Connection,
    batch: &mut Vec<Job>,
    shared: &Arc<Shared>,
    syncer: Option<&Syncer>,
    rates: &mut SourceRates,
    warm: &mut WarmGroups,
) -> WriterConnection {
    if let Some(why) = shared.durable.failure() {
        batch_failed(shared, why);
        fail_all(batch, why);
        return WriterConnection::Usable;
    }
    if let Err(e) = exec(conn, "BEGIN IMMEDIATE") {
        let why = format!("cannot begin a transaction: {e}");
        batch_failed(shared, &why);
        fail_all(batch, &why);
        // A connection that cannot even begin may be the problem.
        return if conn.is_autocommit() {
            WriterConnection::Usable
        } else {
            WriterConnection::Broken
        };
    }
    let mut tx = Batch::new(conn, &shared.groups, warm);
    let mut done = Vec::with_capacity(batch.len());
    let mut poisoned = None;
    for job in batch.iter_mut() {
        match run_job(conn, &mut tx, job, shared, rates) {
            Ok(d) => done.push(d),
            Err(e) => {
                poisoned = Some(e);
                break;
            }
        }
    }
    if poisoned.is_none() {
        poisoned = tx.flush().err();
    }
    let carries_message = batch.iter().any(|j| matches!(j, Job::Receive(..)));
    // Before the commit is visible to any reader (`Durable::caught_up`).
    let seq = shared.durable.announce();
    let committed = match poisoned {
        Some(e) => Err(e),
        // The test hook fails commits that decide messages, not background sweeps.
        #[cfg(feature = "test-hooks")]
        None if carries_message && shared.hooks.commit_fails() => Err(StoreError::Injected),
        None => exec(conn, "COMMIT"),
    };
    let effects = std::mem::take(&mut tx.effects);
    drop(tx);
    if let Err(e) = committed {
        effects.index.rolled_back(&shared.groups);
        // What it kept was never committed.
        warm.forget_all();
        batch_failed(shared, &format!("transaction failed: {e}"));
        let rolled_back = if conn.is_autocommit() {
            // SQLite already rolled it back itself.
            Ok(())
        } else {
            exec(conn, "ROLLBACK")
        };
        fail_all(batch, &e.to_string());
        after_sync(shared, syncer, seq, None);
        return match rolled_back {
            Ok(()) => WriterConnection::Usable,
            Err(r) => {
                tracing::error!(error = %r, "rollback failed; reopening the writer connection");
                WriterConnection::Broken
            }
        };
    }
    let super::batch::Effects {
        delivered,
        wakes,
        earliest_deadline,
        index,
    } = effects;
    index.committed(&shared.groups);
    let answers = Answers {
        replies: batch.drain(..).map(Reply::from).zip(done).collect(),
        carries_message,
        delivered,
        wakes,
        earliest_deadline,
        shared: shared.clone(),
    };
    after_sync(
        shared,
        syncer,
        seq,
        Some(Box::new(move |synced| answers.give(synced))),
    );
    WriterConnection::Usable
}

/// A committed batch's answers, given once its commit is durable.
struct Answers {
    replies: Vec<(Reply, Done)>,
    /// Whether the batch decided received messages (readiness: `Health::committed`).
    carries_message: bool,
    /// The batch's `Effects` but the group index's, settled at the commit.
    delivered: Vec<(String, crate::wsr::MessageKey)>,
    wakes: super::shared::Wakes,
    earliest_deadline: Option<i64>,
    shared: Arc<Shared>,
}

impl Answers {
    /// Durable (`Ok`): wakes whoever waits for what the batch stored, then answers each job.
    /// Not durable (`Err`): every job is answered "not stored".
    fn give(self, synced: Result<(), &str>) {
        let Answers {
            replies,
            carries_message,
            delivered,
            wakes,
            earliest_deadline,
            shared,
        } = self;
        if let Err(why) = synced {
            batch_failed(&shared, why);
            for (reply, _) in replies {
                reply.fail(StoreError::Failed(why.to_owned()));
            }
            return;
        }
        shared.health.committed(carries_message);
        if !delivered.is_empty() {
            let mut waiters = shared.waiters.lock().unwrap_or_else(|p| p.into_inner());
            for delivered in &delivered {
                for waiter in waiters.remove(delivered).unwrap_or_default() {
                    let _ = waiter.send(());
                }
            }
        }
        shared.wake(wakes);
        if earliest_deadline.is_some_and(|d| d <= shared.sweeper_wakeup.load(Ordering::SeqCst)) {
            shared.deadlines_changed.notify_one();
        }
        for (reply, done) in replies {
            reply.give(done);
        }
    }
}

/// Commit `seq` is done: `finish` (its answers; `None` for a rolled-back one) runs once its
/// WAL frames are synced — by the syncer, or here when SQLite syncs in the commit itself
/// (os mode, or no syncer thread).
fn after_sync(shared: &Shared, syncer: Option<&Syncer>, seq: u64, finish: Option<Finish>) {
    match syncer {
        Some(syncer) => syncer.after_sync(seq, finish),
        None => {
            shared.durable.synced(seq);
            if let Some(finish) = finish {
                finish(Ok(()));
            }
        }
    }
}

/// `durability = "full"`: the syncer thread, the writer's connection committing without
/// syncing. Without the thread (it could not start), SQLite syncs inside each commit again.
fn start_syncer(conn: &Connection, opener: &mut Opener, shared: &Arc<Shared>) -> Option<Syncer> {
    if opener.durability != Durability::Full {
        return None;
    }
    let started = database_files(conn).and_then(|(_, wal)| {
        Syncer::start(wal, shared.durable.clone()).map_err(|e| StoreError::Failed(e.to_string()))
    });
    match started {
        Ok(syncer) => Some(syncer),
        Err(e) => {
            tracing::warn!(error = %e, "no syncer thread; commits sync the WAL themselves");
            opener.sync_in_commit = true;
            None
        }
    }
}

/// The database file SQLite opened for `conn` (its full path, links resolved) and its WAL
/// file as SQLite names it — beside that file, not beside a link in the configured path.
pub(super) fn database_files(
    conn: &Connection,
) -> Result<(std::path::PathBuf, std::path::PathBuf), StoreError> {
    let database = conn
        .path()
        .filter(|p| !p.is_empty())
        .ok_or_else(|| StoreError::Failed("the writer's database has no file name".into()))?;
    Ok((database.into(), format!("{database}-wal").into()))
}

fn fail_all(batch: &mut Vec<Job>, why: &str) {
    for job in batch.drain(..) {
        Reply::from(job).fail(StoreError::Failed(why.to_owned()));
    }
}

/// Runs one job inside the batch's transaction. The outer error means the transaction is no
/// longer trustworthy (the batch fails).
fn run_job(
    conn: &Connection,
    tx: &mut Batch<'_>,
    job: &mut Job,
    shared: &Shared,
    rates: &mut SourceRates,
) -> Result<Done, StoreError> {
    match job {
        Job::Receive(m, _) => {
            // A backend's answer first (D16): the delivery is stored with it, or not at all.
            if let Some(kept) = &m.answer {
                let key = m.request.key();
                let (group_id, number) = (key.group_id.as_str(), slot_of(&key));
                if !keep_answer(
                    conn,
                    &m.partner,
                    group_id,
                    number,
                    kept.attempt,
                    &kept.answer,
                )? {
                    return Ok(Done::Received(Err(StoreError::Superseded)));
                }
            }
            #[cfg(feature = "test-hooks")]
            let doomed = shared.hooks.doomed(m.request.message_id.group_id.as_str());
            #[cfg(feature = "test-hooks")]
            let planned = tx.plan(m, &shared.policy, rates, doomed);
            #[cfg(not(feature = "test-hooks"))]
            let planned = tx.plan(m, &shared.policy, rates);
            let plan = match planned? {
                Ok(plan) => plan,
                Err(alone) => {
                    tracing::error!(reason = %alone, "store job failed alone");
                    return Ok(Done::Received(Err(alone)));
                }
            };
            // Only a release can meet a missing buffered row after writing: that job alone
            // runs in a savepoint, so it can fail alone.
            let careful = !plan.release.is_empty();
            if careful {
                exec(conn, "SAVEPOINT job")?;
            }
            match tx.apply(m, plan) {
                Ok(received) => {
                    if careful {
                        exec(conn, "RELEASE job")?;
                    }
                    Ok(Done::Received(Ok(received)))
                }
                Err(StoreError::Corrupt(why)) if careful => {
                    tracing::error!(reason = %why, "store job failed alone; rolled back to its savepoint");
                    exec(conn, "ROLLBACK TO job")?;
                    exec(conn, "RELEASE job")?;
                    // Its group's slot is as before: the job stages its state only after every
                    // write succeeded, and earlier jobs' staged writes lie outside the savepoint.
                    Ok(Done::Received(Err(StoreError::Corrupt(why))))
                }
                Err(e) => Err(e),
            }
        }
        Job::Sweep(now, _) => {
            // It reads and writes the group table itself: let it see what the batch staged.
            tx.flush()?;
            tx.forget_warm_groups();
            let report = tx.sweep(*now, &shared.policy)?;
            Ok(Done::Swept(Ok(report)))
        }
        Job::Change(change) => {
            tx.flush()?;
            tx.forget_warm_groups();
            exec(conn, "SAVEPOINT job")?;
            let ran = std::panic::catch_unwind(AssertUnwindSafe(|| change.run(conn)))
                .unwrap_or_else(|p| Err(StoreError::Panicked(panic_message(&*p))));
            match ran {
                Ok(Ran::Keep(wakes)) => {
                    exec(conn, "RELEASE job")?;
                    tx.effects.wakes.absorb(wakes);
                    Ok(Done::Changed(Ok(())))
                }
                Ok(Ran::Undo) => {
                    exec(conn, "ROLLBACK TO job")?;
                    exec(conn, "RELEASE job")?;
                    Ok(Done::Changed(Ok(())))
                }
                Err(failure @ (StoreError::Corrupt(_) | StoreError::Panicked(_))) => {
                    tracing::error!(reason = %failure, "store change failed alone; rolled back to its savepoint");
                    exec(conn, "ROLLBACK TO job")?;
                    exec(conn, "RELEASE job")?;
                    Ok(Done::Changed(Err(failure)))
                }
                Err(e) => Err(e),
            }
        }
    }
}

thread_local! {
    /// Pages in the WAL after the last commit on this thread's connection, as SQLite's WAL
    /// hook reported it (the hook takes a plain `fn`, so it cannot capture a handle).
    static WAL_PAGES: Cell<i64> = const { Cell::new(0) };
}

fn note_wal_pages(_: &rusqlite::hooks::Wal, pages: std::ffi::c_int) -> rusqlite::Result<()> {
    WAL_PAGES.with(|p| p.set(i64::from(pages)));
    Ok(())
}

/// Opens the writer's own connection with the same settings as the pool's.
pub(super) fn open_writer_connection(
    path: &std::path::Path,
) -> Result<rusqlite::Connection, StoreError> {
    let conn = rusqlite::Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    // NORMAL in either mode: a commit writes its WAL frames without syncing them, and in
    // `durability = "full"` the syncer thread syncs them before anybody is answered
    // (`syncer.rs`). NORMAL still syncs the WAL before each checkpoint copies it into the
    // database, and the database after it.
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; \
         PRAGMA wal_autocheckpoint = 0; PRAGMA journal_size_limit = 67108864;",
    )?;
    // No checkpoint inside commits: the checkpointer thread does them (checkpointer.rs). A
    // WAL that grew under load is cut back to 64 MiB when it starts over.
    // Every statement of the receive path, the sweep and the other helpers' changes stays
    // prepared.
    conn.set_prepared_statement_cache_capacity(256);
    // The same plan whatever the parameters bound: without this guarantee SQLite re-plans a
    // statement whose `LIMIT ?` (or a parameter compared with a partial index's condition)
    // could change its plan every time that parameter is bound again — each fetch re-prepared
    // its candidate and matching queries, a tenth of a millisecond of CPU apiece (issue 35).
    // No plan here depends on a bound value (there are no statistics, no ANALYZE).
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    // After the pragma, which would replace it: commits report the WAL's size to the
    // checkpointer's trigger.
    conn.wal_hook(Some(note_wal_pages));
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_keep_their_plan_when_parameters_are_bound_again() {
        let dir = tempfile::tempdir().expect("dir");
        let conn = open_writer_connection(&dir.path().join("writer.db")).expect("open");
        conn.execute_batch(
            "CREATE TABLE t (n INTEGER PRIMARY KEY); INSERT INTO t VALUES (1), (2);",
        )
        .expect("table");
        // A bound LIMIT is what made SQLite re-plan a statement every time it ran.
        let mut page = conn
            .prepare_cached("SELECT n FROM t WHERE n > ?1 ORDER BY n LIMIT ?2")
            .expect("prepare");
        for (after, limit) in [(0, 1), (0, 2), (1, 5)] {
            let rows: Vec<i64> = page
                .query_map(rusqlite::params![after, limit], |r| r.get(0))
                .expect("query")
                .collect::<rusqlite::Result<_>>()
                .expect("rows");
            assert!(!rows.is_empty());
        }
        assert_eq!(
            page.get_status(rusqlite::StatementStatus::RePrepare),
            0,
            "re-prepared on binding"
        );
    }
}
