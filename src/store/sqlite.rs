//! The SQLite store: WAL mode, one writer connection behind a group-commit task, a small read
//! pool beside it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{Connection, Row};
use tokio::sync::{Notify, mpsc, oneshot};

use super::group_json::{decode, encode, from_millis, millis};
use super::{
    Durability, InboxEntry, PendingCallback, Received, ReceivedMessage, StoreConfig, StoreError,
    SweepReport,
};
use crate::rmp::group::{Buffered, GroupState, Policy, Swept, slot, sweep};
use crate::rmp::receiver::{Action, Incoming, Verdict, receive};
use crate::rmp::replies::{Replies, ReplyItem, answer_poll};
use crate::wsr::{FaultCode, GroupId, MessageKey, RefToMessageIds, ReplyPattern, Response};

/// Most requests one commit takes; more wait for the next one.
const MAX_BATCH: usize = 256;
/// Most groups one sweep pass handles; the rest are due again at once.
const SWEEP_BATCH: i64 = 500;
/// A fault notice is kept at least this long, even for a message that had already expired
/// (that is often why it was refused), so its sender can still learn of it.
const FAULT_NOTICE_RETENTION: chrono::Duration = chrono::Duration::hours(1);

/// A handle to the store; cheap to clone. Write transactions outside the writer task start
/// with `BEGIN IMMEDIATE`: a deferred one that later wants to write fails at once with "database
/// is locked" when another writer got there first, whatever the busy timeout.
#[derive(Clone)]
pub struct Store {
    pub(super) pool: SqlitePool,
    jobs: mpsc::Sender<Job>,
    pub(super) shared: Arc<Shared>,
}

/// State shared between handles and the writer task.
pub(super) struct Shared {
    policy: Policy,
    /// Requests waiting for a buffered message of theirs to be delivered (Response pattern).
    waiters: Mutex<HashMap<MessageKey, Vec<oneshot::Sender<()>>>>,
    /// Woken after a commit that queued callback acks.
    pub callbacks_due: Notify,
    /// Woken when an outbound message was submitted or its schedule moved earlier.
    pub(super) outbound_due: Notify,
    /// Woken after a commit that moved a group deadline before the sweeper's next wake-up.
    pub deadlines_changed: Notify,
    /// When the sweeper plans to wake next (Unix ms).
    sweeper_wakeup: AtomicI64,
    /// Test hook: the next N commits fail as if the disk refused them.
    failing_commits: AtomicUsize,
}

enum Job {
    Receive(
        Box<ReceivedMessage>,
        oneshot::Sender<Result<Received, StoreError>>,
    ),
    Sweep(
        DateTime<Utc>,
        oneshot::Sender<Result<SweepReport, StoreError>>,
    ),
}

/// What one job did inside the transaction, announced only after the commit.
#[derive(Default)]
struct Effects {
    delivered: Vec<MessageKey>,
    callbacks: bool,
    /// The earliest group deadline written.
    earliest_deadline: Option<i64>,
}

impl Store {
    pub async fn open(config: &StoreConfig) -> Result<Store, StoreError> {
        if let Some(dir) = config.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                StoreError::Corrupt(format!("cannot create {}: {e}", dir.display()))
            })?;
        }
        let synchronous = match config.durability {
            Durability::Full => SqliteSynchronous::Full,
            Durability::Os => SqliteSynchronous::Normal,
        };
        let options = SqliteConnectOptions::new()
            .filename(&config.path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(synchronous)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options.clone())
            .await?;
        sqlx::migrate!("./migrations/sqlite").run(&pool).await?;
        let writer = SqliteConnection::connect_with(&options).await?;
        let shared = Arc::new(Shared {
            policy: config.policy.clone(),
            waiters: Mutex::new(HashMap::new()),
            callbacks_due: Notify::new(),
            outbound_due: Notify::new(),
            deadlines_changed: Notify::new(),
            sweeper_wakeup: AtomicI64::new(i64::MIN),
            failing_commits: AtomicUsize::new(0),
        });
        let (jobs, rx) = mpsc::channel(4 * MAX_BATCH);
        tokio::spawn(run_writer(writer, options, rx, shared.clone()));
        Ok(Store { pool, jobs, shared })
    }

    pub fn policy(&self) -> &Policy {
        &self.shared.policy
    }

    /// Decides, stores and commits one reliable message; the verdict is durable when this
    /// returns.
    pub async fn receive(&self, message: ReceivedMessage) -> Result<Received, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.jobs
            .send(Job::Receive(Box::new(message), tx))
            .await
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Applies every group deadline due at `now` (expiry, idle, abort, purge) and drops
    /// callback acks whose messages expired.
    pub async fn sweep(&self, now: DateTime<Utc>) -> Result<SweepReport, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.jobs
            .send(Job::Sweep(now, tx))
            .await
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// A receiver that fires when the buffered message `key` is delivered. Register before
    /// submitting the message, so that a delivery in the very next commit is not missed.
    pub fn watch_delivery(&self, key: &MessageKey) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let mut waiters = self
            .shared
            .waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let list = waiters.entry(key.clone()).or_default();
        list.retain(|w| !w.is_closed());
        list.push(tx);
        rx
    }

    /// Forgets watchers that gave up (their receivers were dropped).
    pub fn forget_watchers(&self, key: &MessageKey) {
        let mut waiters = self
            .shared
            .waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(list) = waiters.get_mut(key) {
            list.retain(|w| !w.is_closed());
            if list.is_empty() {
                waiters.remove(key);
            }
        }
    }

    pub fn callbacks_due(&self) -> &Notify {
        &self.shared.callbacks_due
    }

    pub fn deadlines_changed(&self) -> &Notify {
        &self.shared.deadlines_changed
    }

    /// The sweeper says when it will wake next; commits with an earlier deadline wake it.
    pub fn sweeper_sleeps_until(&self, wakeup: DateTime<Utc>) {
        self.shared
            .sweeper_wakeup
            .store(millis(wakeup), Ordering::SeqCst);
    }

    /// Test hook: make the next `n` commits fail.
    #[doc(hidden)]
    pub fn fail_next_commits(&self, n: usize) {
        self.shared.failing_commits.store(n, Ordering::SeqCst);
    }

    pub async fn group(&self, group_id: &str) -> Result<Option<GroupState>, StoreError> {
        let row = sqlx::query("SELECT state FROM groups WHERE group_id = ?")
            .bind(group_id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| decode(r.get::<&str, _>(0)).map_err(StoreError::Corrupt))
            .transpose()
    }

    /// Groups ordered by id, after `after`, at most `limit`.
    pub async fn groups(
        &self,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<GroupState>, StoreError> {
        let rows =
            sqlx::query("SELECT state FROM groups WHERE group_id > ? ORDER BY group_id LIMIT ?")
                .bind(after.unwrap_or(""))
                .bind(limit)
                .fetch_all(&self.pool)
                .await?;
        rows.iter()
            .map(|r| decode(r.get::<&str, _>(0)).map_err(StoreError::Corrupt))
            .collect()
    }

    /// Delivered messages with offsets above `after`, oldest first.
    pub async fn inbox(&self, after: i64, limit: i64) -> Result<Vec<InboxEntry>, StoreError> {
        let rows = sqlx::query(
            "SELECT offset, channel, topic, group_id, number, payload, namespaces, received_at, \
             expiry FROM inbox WHERE offset > ? ORDER BY offset LIMIT ?",
        )
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| InboxEntry {
                offset: r.get(0),
                channel: r.get(1),
                topic: r.get(2),
                group_id: r.get(3),
                number: r.get::<Option<i64>, _>(4).map(|n| n as u64),
                payload: r.get(5),
                namespaces: r.get(6),
                received_at: from_millis(r.get(7)),
                expiry: from_millis(r.get(8)),
            })
            .collect())
    }

    /// The earliest group deadline, for the sweeper.
    pub async fn next_deadline(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let ms: Option<i64> = sqlx::query_scalar("SELECT MIN(next_deadline) FROM groups")
            .fetch_one(&self.pool)
            .await?;
        Ok(ms.map(from_millis))
    }

    pub async fn callback_endpoints(&self) -> Result<Vec<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT url FROM callback_endpoints ORDER BY url")
                .fetch_all(&self.pool)
                .await?,
        )
    }

    pub async fn is_callback_endpoint(&self, url: &str) -> Result<bool, StoreError> {
        let found: Option<i64> =
            sqlx::query_scalar("SELECT 1 FROM callback_endpoints WHERE url = ?")
                .bind(url)
                .fetch_optional(&self.pool)
                .await?;
        Ok(found.is_some())
    }

    /// Registers an endpoint; returns false if it was already registered.
    pub async fn add_callback_endpoint(
        &self,
        url: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO callback_endpoints (url, created_at) VALUES (?, ?) ON CONFLICT DO NOTHING",
        )
        .bind(url)
        .bind(millis(now))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    pub async fn remove_callback_endpoint(&self, url: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM callback_endpoints WHERE url = ?")
            .bind(url)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Callback acks due at `now`, oldest first.
    pub async fn due_callbacks(
        &self,
        now: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<PendingCallback>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, endpoint, soap12, group_id, number, fault, expiry, attempts, number_to \
             FROM pending_callbacks WHERE next_attempt <= ? ORDER BY id LIMIT ?",
        )
        .bind(millis(now))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let group: String = r.get(3);
                let fault: Option<String> = r.get(5);
                Ok(PendingCallback {
                    id: r.get(0),
                    endpoint: r.get(1),
                    soap12: r.get::<i64, _>(2) != 0,
                    group_id: GroupId::parse(&group).map_err(StoreError::Corrupt)?,
                    number: r.get::<Option<i64>, _>(4).map(|n| n as u64),
                    number_to: r.get::<Option<i64>, _>(8).map(|n| n as u64),
                    fault: match fault {
                        None => None,
                        Some(name) => Some(FaultCode::from_local_name(&name).ok_or_else(|| {
                            StoreError::Corrupt(format!("unknown fault code {name}"))
                        })?),
                    },
                    expiry: from_millis(r.get(6)),
                    attempts: r.get::<i64, _>(7).try_into().unwrap_or(u32::MAX),
                })
            })
            .collect()
    }

    /// Queues replies for a callback endpoint outside the receive path (faults of messages
    /// refused on arrival, poll answers sent by callback).
    pub async fn owe_callbacks(
        &self,
        endpoint: &str,
        soap12: bool,
        replies: &[ReplyItem],
        expiry: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        for r in replies {
            sqlx::query(
                "INSERT INTO pending_callbacks (endpoint, soap12, group_id, number, number_to, \
                 fault, expiry, next_attempt) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(endpoint)
            .bind(i64::from(soap12))
            .bind(r.group_id.as_str())
            .bind(r.range.map(|x| x.from() as i64))
            .bind(r.range.map(|x| x.to() as i64))
            .bind(r.fault.map(|f| f.local_name()))
            .bind(millis(expiry))
            .bind(millis(now))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        self.shared.callbacks_due.notify_one();
        Ok(())
    }

    /// Remembers the fault of a message that left no group state, for its sender's polls.
    pub async fn record_fault(
        &self,
        key: &MessageKey,
        code: FaultCode,
        expiry: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let mut conn = self.pool.acquire().await?;
        insert_message_fault(&mut conn, key, code, expiry, now).await
    }

    /// The answer to a PollRequest from stored state (D11); `None` when there is nothing to
    /// say.
    pub async fn poll_answer(
        &self,
        refs: &[RefToMessageIds],
    ) -> Result<Option<Response>, StoreError> {
        let mut states = HashMap::new();
        for r in refs {
            if let Some(state) = self.group(r.group_id.as_str()).await? {
                states.insert(r.group_id.clone(), state);
            }
        }
        let mut replies = Replies::new();
        if let Some(response) = answer_poll(refs, |g| states.get(g)) {
            for reply in response.replies {
                match reply {
                    crate::wsr::Reply::NonSequence { group_id, fault } => {
                        replies.add(&group_id, None, fault);
                    }
                    crate::wsr::Reply::Sequence { group_id, ranges } => {
                        for r in ranges {
                            replies.add_range(&group_id, r.range, r.fault);
                        }
                    }
                }
            }
        }
        for r in refs {
            let rows = sqlx::query(
                "SELECT singleton, number, fault FROM message_faults WHERE group_id = ?",
            )
            .bind(r.group_id.as_str())
            .fetch_all(&self.pool)
            .await?;
            let state = states.get(&r.group_id);
            for row in rows {
                let singleton = row.get::<i64, _>(0) != 0;
                let number = row.get::<i64, _>(1) as u64;
                let Some(code) = FaultCode::from_local_name(row.get::<&str, _>(2)) else {
                    continue;
                };
                // What the group state says wins: a delivered message is acked.
                if state.is_some_and(|s| s.delivered.contains(number)) {
                    continue;
                }
                let asked = if singleton {
                    r.ranges.is_empty()
                } else {
                    r.ranges.is_empty() || r.ranges.iter().any(|q| q.contains(number))
                };
                if asked {
                    replies.add(&r.group_id, (!singleton).then_some(number), Some(code));
                }
            }
        }
        Ok(replies.into_response())
    }

    /// The earliest moment a callback is due.
    pub async fn next_callback_due(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let ms: Option<i64> = sqlx::query_scalar("SELECT MIN(next_attempt) FROM pending_callbacks")
            .fetch_one(&self.pool)
            .await?;
        Ok(ms.map(from_millis))
    }

    /// The acks were POSTed: forget them.
    pub async fn callbacks_sent(&self, ids: &[i64]) -> Result<(), StoreError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        for id in ids {
            sqlx::query("DELETE FROM pending_callbacks WHERE id = ?")
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The POST failed: try again at `next`, or drop those whose messages expired before then.
    pub async fn callbacks_failed(
        &self,
        ids: &[i64],
        next: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        for id in ids {
            sqlx::query(
                "UPDATE pending_callbacks SET attempts = attempts + 1, next_attempt = ? WHERE id = ?",
            )
            .bind(millis(next))
            .bind(id)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query("DELETE FROM pending_callbacks WHERE expiry < ?")
            .bind(millis(next))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
}

async fn run_writer(
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
        if commit_batch(&mut conn, batch, &shared).await == WriterConnection::Broken {
            // The transaction could not even be rolled back: start over on a fresh connection
            // rather than leave every later request failing on a stuck one.
            conn = reconnect(&options).await;
        }
    }
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
/// A job whose stored state cannot be decoded fails alone (rolled back to its savepoint). Any
/// database error, or a savepoint that cannot be released or rolled back, makes the whole
/// transaction untrustworthy: it is rolled back and every job of the batch fails, so nothing
/// half-done is ever committed and nobody is acked.
async fn commit_batch(
    conn: &mut SqliteConnection,
    batch: Vec<Job>,
    shared: &Shared,
) -> WriterConnection {
    if let Err(e) = sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await {
        tracing::error!(error = %e, "cannot begin a transaction");
        fail_all(batch, &format!("cannot begin: {e}"));
        return WriterConnection::Usable;
    }
    let mut results = Vec::with_capacity(batch.len());
    let mut effects = Effects::default();
    let mut poisoned = None;
    for job in &batch {
        match run_in_savepoint(conn, job, shared, &mut effects).await {
            Ok(result) => results.push(result),
            Err(e) => {
                poisoned = Some(e);
                break;
            }
        }
    }
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
        tracing::error!(error = %e, jobs = batch.len(), "transaction failed; no request of the batch is acknowledged");
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
    // Durable now: announce, then answer.
    if !effects.delivered.is_empty() {
        let mut waiters = shared.waiters.lock().unwrap_or_else(|p| p.into_inner());
        for key in &effects.delivered {
            for waiter in waiters.remove(key).unwrap_or_default() {
                let _ = waiter.send(());
            }
        }
    }
    if effects.callbacks {
        shared.callbacks_due.notify_one();
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
            (job, Err(e)) => reply_err(job, StoreError::Corrupt(e.to_string())),
            (job, Ok(_)) => reply_err(job, StoreError::Corrupt("mismatched job result".into())),
        }
    }
    WriterConnection::Usable
}

enum JobResult {
    Received(Received),
    Swept(SweepReport),
}

fn fail_all(batch: Vec<Job>, why: &str) {
    for job in batch {
        reply_err(job, StoreError::Corrupt(format!("not stored: {why}")));
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
    }
}

/// Runs one job inside a savepoint. The inner result is the job's own outcome (a corrupt
/// stored state fails that job alone); the outer error means the transaction is no longer
/// trustworthy.
async fn run_in_savepoint(
    conn: &mut SqliteConnection,
    job: &Job,
    shared: &Shared,
    effects: &mut Effects,
) -> Result<Result<JobResult, StoreError>, StoreError> {
    sqlx::query("SAVEPOINT job").execute(&mut *conn).await?;
    let mut job_effects = Effects::default();
    let result = match job {
        Job::Receive(message, _) => apply_receive(conn, message, &shared.policy, &mut job_effects)
            .await
            .map(JobResult::Received),
        Job::Sweep(now, _) => apply_sweep(conn, *now, &shared.policy, &mut job_effects)
            .await
            .map(JobResult::Swept),
    };
    match result {
        Ok(done) => {
            sqlx::query("RELEASE job").execute(&mut *conn).await?;
            effects.delivered.append(&mut job_effects.delivered);
            effects.callbacks |= job_effects.callbacks;
            effects.earliest_deadline =
                match (effects.earliest_deadline, job_effects.earliest_deadline) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            Ok(Ok(done))
        }
        Err(StoreError::Corrupt(why)) => {
            tracing::error!(reason = %why, "store job failed on corrupt state; rolled back to its savepoint");
            sqlx::query("ROLLBACK TO job").execute(&mut *conn).await?;
            sqlx::query("RELEASE job").execute(&mut *conn).await?;
            Ok(Err(StoreError::Corrupt(why)))
        }
        Err(e) => Err(e),
    }
}

async fn load_group(
    conn: &mut SqliteConnection,
    group_id: &GroupId,
) -> Result<Option<GroupState>, StoreError> {
    let row = sqlx::query("SELECT state FROM groups WHERE group_id = ?")
        .bind(group_id.as_str())
        .fetch_optional(&mut *conn)
        .await?;
    row.map(|r| decode(r.get::<&str, _>(0)).map_err(StoreError::Corrupt))
        .transpose()
}

async fn save_group(
    conn: &mut SqliteConnection,
    state: &GroupState,
    policy: &Policy,
    now: DateTime<Utc>,
    effects: &mut Effects,
) -> Result<(), StoreError> {
    // A deadline the sweep would not act on must not stay due, or the sweeper would spin.
    let deadline = state
        .next_deadline(policy)
        .filter(|d| *d > now || state_due(state, now, policy));
    sqlx::query(
        "INSERT INTO groups (group_id, channel, status, next_deadline, updated_at, state) \
         VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (group_id) DO UPDATE SET \
         status = excluded.status, next_deadline = excluded.next_deadline, \
         updated_at = excluded.updated_at, state = excluded.state",
    )
    .bind(state.group_id.as_str())
    .bind(&state.params.channel)
    .bind(state.status.as_str())
    .bind(deadline.map(millis))
    .bind(millis(now))
    .bind(encode(state))
    .execute(&mut *conn)
    .await?;
    if let Some(d) = deadline.map(millis) {
        effects.earliest_deadline = Some(effects.earliest_deadline.map_or(d, |e| e.min(d)));
    }
    Ok(())
}

/// Whether a sweep at `now` would change or purge the group.
fn state_due(state: &GroupState, now: DateTime<Utc>, policy: &Policy) -> bool {
    let mut probe = state.clone();
    sweep(&mut probe, now, policy) != Swept::Unchanged
}

async fn apply_receive(
    conn: &mut SqliteConnection,
    m: &ReceivedMessage,
    policy: &Policy,
    effects: &mut Effects,
) -> Result<Received, StoreError> {
    let request = &m.request;
    let key = request.key();
    let stored = load_group(conn, &key.group_id).await?;
    let outcome = receive(
        stored.as_ref(),
        Incoming {
            request,
            channel: &m.channel,
            body_bytes: m.payload.len() as u64,
        },
        m.now,
        policy,
    );
    let expiry = millis(request.expiry_time);
    let number = key.number.map(|n| n as i64);
    match outcome.action {
        Action::Deliver => {
            sqlx::query(
                "INSERT INTO inbox (channel, topic, group_id, number, payload, namespaces, \
                 received_at, expiry) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&m.channel)
            .bind(&m.topic)
            .bind(key.group_id.as_str())
            .bind(number)
            .bind(&m.payload)
            .bind(&m.namespaces)
            .bind(millis(m.now))
            .bind(expiry)
            .execute(&mut *conn)
            .await?;
        }
        Action::Buffer => {
            sqlx::query(
                "INSERT INTO buffered (group_id, number, channel, topic, payload, namespaces, \
                 received_at, expiry) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(key.group_id.as_str())
            .bind(number)
            .bind(&m.channel)
            .bind(&m.topic)
            .bind(&m.payload)
            .bind(&m.namespaces)
            .bind(millis(m.now))
            .bind(expiry)
            .execute(&mut *conn)
            .await?;
        }
        Action::Drop => {}
    }
    for (n, buffered) in &outcome.released {
        release_buffered(conn, &key.group_id, *n).await?;
        effects.delivered.push(MessageKey {
            group_id: key.group_id.clone(),
            number: Some(*n),
        });
        if request.ack_requested {
            owe_callback(
                conn,
                &key.group_id,
                Some(*n),
                None,
                buffered,
                m.soap12,
                m.now,
                effects,
            )
            .await?;
        }
    }
    discard_buffered(
        conn,
        &key.group_id,
        &outcome.discarded,
        m.soap12,
        m.now,
        effects,
    )
    .await?;
    if let Some(state) = &outcome.state {
        save_group(conn, state, policy, m.now, effects).await?;
    }
    // A Poll-pattern sender learns of a fault when it polls: keep it in this same
    // transaction when the group state does not (D4, D11).
    if let (ReplyPattern::Poll, Verdict::Fault(code, _)) =
        (&request.reply_pattern, &outcome.verdict)
    {
        let in_state = outcome
            .state
            .as_ref()
            .is_some_and(|s| s.faults.contains_key(&slot(key.number)));
        if !code.is_transient() && !in_state {
            insert_message_fault(conn, &key, *code, request.expiry_time, m.now).await?;
        }
    }
    // This message's own answer, when it travels by callback.
    if let ReplyPattern::Callback(_) = &request.reply_pattern {
        let fault = match &outcome.verdict {
            Verdict::Ack => Some(None),
            Verdict::Fault(code, _) if !code.is_transient() => Some(Some(*code)),
            _ => None,
        };
        if let Some(fault) = fault {
            let this = Buffered {
                expiry: request.expiry_time,
                bytes: 0,
                reply: request.reply_pattern.clone(),
            };
            owe_callback(
                conn,
                &key.group_id,
                key.number,
                fault,
                &this,
                m.soap12,
                m.now,
                effects,
            )
            .await?;
        }
    }
    Ok(Received {
        verdict: outcome.verdict,
    })
}

/// Remembers the fault of a message for its sender's polls, for at least an hour.
async fn insert_message_fault(
    conn: &mut SqliteConnection,
    key: &MessageKey,
    code: FaultCode,
    expiry: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO message_faults (group_id, singleton, number, fault, expiry) \
         VALUES (?, ?, ?, ?, ?) ON CONFLICT (group_id, singleton, number) DO NOTHING",
    )
    .bind(key.group_id.as_str())
    .bind(i64::from(key.number.is_none()))
    .bind(slot(key.number) as i64)
    .bind(code.local_name())
    .bind(millis(expiry.max(now + FAULT_NOTICE_RETENTION)))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Moves a buffered message into the inbox, keeping its original arrival data.
async fn release_buffered(
    conn: &mut SqliteConnection,
    group_id: &GroupId,
    n: u64,
) -> Result<(), StoreError> {
    let moved = sqlx::query(
        "INSERT INTO inbox (channel, topic, group_id, number, payload, namespaces, received_at, \
         expiry) SELECT channel, topic, group_id, number, payload, namespaces, received_at, expiry \
         FROM buffered WHERE group_id = ? AND number = ?",
    )
    .bind(group_id.as_str())
    .bind(n as i64)
    .execute(&mut *conn)
    .await?;
    if moved.rows_affected() != 1 {
        return Err(StoreError::Corrupt(format!(
            "buffered message {group_id}#{n} is missing"
        )));
    }
    sqlx::query("DELETE FROM buffered WHERE group_id = ? AND number = ?")
        .bind(group_id.as_str())
        .bind(n as i64)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Drops buffered messages of an aborted group and tells their senders, where a callback can.
async fn discard_buffered(
    conn: &mut SqliteConnection,
    group_id: &GroupId,
    discarded: &[(u64, Buffered)],
    soap12: bool,
    now: DateTime<Utc>,
    effects: &mut Effects,
) -> Result<(), StoreError> {
    for (n, buffered) in discarded {
        sqlx::query("DELETE FROM buffered WHERE group_id = ? AND number = ?")
            .bind(group_id.as_str())
            .bind(*n as i64)
            .execute(&mut *conn)
            .await?;
        let aborted = Some(FaultCode::GroupAborted);
        owe_callback(
            conn,
            group_id,
            Some(*n),
            aborted,
            buffered,
            soap12,
            now,
            effects,
        )
        .await?;
    }
    Ok(())
}

/// Queues an ack (`fault` `None`) or fault for a Callback-pattern message.
#[allow(clippy::too_many_arguments)]
async fn owe_callback(
    conn: &mut SqliteConnection,
    group_id: &GroupId,
    number: Option<u64>,
    fault: Option<FaultCode>,
    message: &Buffered,
    soap12: bool,
    now: DateTime<Utc>,
    effects: &mut Effects,
) -> Result<(), StoreError> {
    let ReplyPattern::Callback(to) = &message.reply else {
        return Ok(());
    };
    let keep_until = match fault {
        Some(_) => message.expiry.max(now + FAULT_NOTICE_RETENTION),
        None => message.expiry,
    };
    sqlx::query(
        "INSERT INTO pending_callbacks (endpoint, soap12, group_id, number, fault, expiry, \
         next_attempt) VALUES (?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&to.uri)
    .bind(i64::from(soap12))
    .bind(group_id.as_str())
    .bind(number.map(|n| n as i64))
    .bind(fault.map(|f| f.local_name()))
    .bind(millis(keep_until))
    .bind(millis(now))
    .execute(&mut *conn)
    .await?;
    effects.callbacks = true;
    Ok(())
}

async fn apply_sweep(
    conn: &mut SqliteConnection,
    now: DateTime<Utc>,
    policy: &Policy,
    effects: &mut Effects,
) -> Result<SweepReport, StoreError> {
    let rows = sqlx::query(
        "SELECT group_id, state FROM groups WHERE next_deadline <= ? ORDER BY next_deadline \
         LIMIT ?",
    )
    .bind(millis(now))
    .bind(SWEEP_BATCH)
    .fetch_all(&mut *conn)
    .await?;
    let mut report = SweepReport::default();
    for row in rows {
        let mut state = match decode(row.get::<&str, _>(1)) {
            Ok(state) => state,
            Err(why) => {
                // One unreadable row must not stop every other group's deadlines: take it out
                // of the sweep (kept for an operator to inspect) and go on.
                let group_id: String = row.get(0);
                tracing::error!(%group_id, reason = %why, "unreadable group state; no longer swept");
                sqlx::query("UPDATE groups SET next_deadline = NULL WHERE group_id = ?")
                    .bind(&group_id)
                    .execute(&mut *conn)
                    .await?;
                continue;
            }
        };
        match sweep(&mut state, now, policy) {
            Swept::Unchanged => {
                // Due but nothing to do (a deadline computed before a change): re-arm it.
                save_group(conn, &state, policy, now, &mut Effects::default()).await?;
            }
            Swept::Changed { discarded } => {
                // Senders of discarded messages learn by callback in SOAP 1.1, the version
                // every peer accepts; their own version is not kept for buffered messages.
                discard_buffered(conn, &state.group_id, &discarded, false, now, effects).await?;
                // The sweeper reads the next deadline itself after this pass.
                save_group(conn, &state, policy, now, &mut Effects::default()).await?;
                report.changed += 1;
                report.discarded += discarded.len();
            }
            Swept::Purge => {
                sqlx::query("DELETE FROM groups WHERE group_id = ?")
                    .bind(state.group_id.as_str())
                    .execute(&mut *conn)
                    .await?;
                sqlx::query("DELETE FROM buffered WHERE group_id = ?")
                    .bind(state.group_id.as_str())
                    .execute(&mut *conn)
                    .await?;
                report.purged += 1;
            }
        }
    }
    sqlx::query("DELETE FROM pending_callbacks WHERE expiry < ?")
        .bind(millis(now))
        .execute(&mut *conn)
        .await?;
    sqlx::query("DELETE FROM message_faults WHERE expiry < ?")
        .bind(millis(now))
        .execute(&mut *conn)
        .await?;
    Ok(report)
}
