//! The SQLite store handle: opening (WAL, migrations), the writer task's front door, and the
//! reads and small writes that do not decide acks (inbox, groups, callback queue, poll
//! answers). The group-commit writer is in `writer.rs`, what it does per job in `decide.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use tokio::sync::{Notify, mpsc, oneshot, watch};

mod batch;
mod change;
pub mod group_json;
pub mod group_state;
mod prefill;
mod writer;

#[allow(unused_imports, reason = "the delivery and outbound changes name it")]
pub(crate) use self::change::Change;
pub(crate) use self::change::Wakes;
use self::group_json::{from_millis, millis};
use self::group_state::decode_stored;
use self::writer::{Job, MAX_BATCH};
use crate::rmp::group::{GroupState, Policy};
use crate::rmp::replies::{Asked, RecordedFault, ReplyItem, answer_poll};
use crate::store::delivery::DeliveryError;
use crate::store::health::Health;
use crate::store::{
    Durability, Endpoints, InboxEntry, PendingCallback, Received, ReceivedMessage, StoreConfig,
    StoreError, SweepReport,
};
use crate::wsr::{FaultCode, GroupId, MessageKey, RefToMessageIds, Response, SeqRange};

/// A handle to the store; cheap to clone. Write transactions outside the writer task start
/// with `BEGIN IMMEDIATE`: a deferred one that later wants to write fails at once with "database
/// is locked" when another writer got there first, whatever the busy timeout.
#[derive(Clone)]
pub struct SqliteStore {
    pub(in crate::store) pool: SqlitePool,
    jobs: mpsc::Sender<Job>,
    pub(in crate::store) shared: Arc<Shared>,
}

/// Held Response-pattern requests by (partner, message key), each told when its message is
/// delivered.
pub(in crate::store) type Waiters = HashMap<(String, MessageKey), Vec<oneshot::Sender<()>>>;

/// State shared between handles and the writer task.
pub(in crate::store) struct Shared {
    pub(in crate::store) policy: Policy,
    /// Requests waiting for a buffered message of theirs to be delivered (Response pattern),
    /// by (partner, key): another partner's message of the same key is not theirs.
    pub(in crate::store) waiters: Mutex<Waiters>,
    /// Woken after a commit that queued callback acks.
    pub(in crate::store) callbacks_due: Notify,
    /// Woken when an outbound message was submitted or its schedule moved earlier.
    pub(in crate::store) outbound_due: Notify,
    /// Woken after a commit that moved a group deadline before the sweeper's next wake-up.
    pub(in crate::store) deadlines_changed: Notify,
    /// When the sweeper plans to wake next (Unix ms).
    pub(in crate::store) sweeper_wakeup: AtomicI64,
    /// Test hook: the next N commits fail as if the disk refused them.
    pub(in crate::store) failing_commits: AtomicUsize,
    /// Test hook: messages of this group panic inside the writer (a bug, simulated).
    pub(in crate::store) panicking_group: Mutex<Option<String>>,
    /// Whether the writer's last commit attempt worked (readiness).
    pub(in crate::store) health: Health,
    /// One readiness probe at a time, and when the last one ran.
    probe: tokio::sync::Mutex<Option<std::time::Instant>>,
    /// This process's exclusive hold on the database (`{file}.lock`), released when the last
    /// handle and the writer are gone.
    _lock: std::fs::File,
    /// Bumped whenever subscriptions may have something new to hand out (inbox appends,
    /// releases, lapsed leases); long-polling fetches wait on it.
    pub(in crate::store) deliveries_changed: watch::Sender<u64>,
}

impl Shared {
    /// Wakes whoever waits for what a commit made possible.
    pub(in crate::store) fn wake(&self, wakes: Wakes) {
        if wakes.deliveries {
            self.announce_deliveries();
        }
        if wakes.outbound {
            self.outbound_due.notify_one();
        }
        if wakes.callbacks {
            self.callbacks_due.notify_one();
        }
    }

    pub(in crate::store) fn announce_deliveries(&self) {
        self.deliveries_changed
            .send_modify(|n| *n = n.wrapping_add(1));
    }
}

impl SqliteStore {
    pub async fn open(config: &StoreConfig) -> Result<SqliteStore, StoreError> {
        if let Some(dir) = config.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::Failed(format!("cannot create {}: {e}", dir.display())))?;
        }
        let lock = lock_database(&config.path).await?;
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
        claim_database(&pool, &config.path).await?;
        sqlx::migrate!("./migrations/sqlite").run(&pool).await?;
        let writer = change::open_writer_connection(&config.path, config.durability)?;
        let shared = Arc::new(Shared {
            policy: config.policy.clone(),
            waiters: Mutex::new(HashMap::new()),
            callbacks_due: Notify::new(),
            outbound_due: Notify::new(),
            deadlines_changed: Notify::new(),
            sweeper_wakeup: AtomicI64::new(i64::MIN),
            failing_commits: AtomicUsize::new(0),
            panicking_group: Mutex::new(None),
            health: Health::default(),
            probe: tokio::sync::Mutex::new(None),
            deliveries_changed: watch::channel(0).0,
            _lock: lock,
        });
        let (jobs, rx) = mpsc::channel(4 * MAX_BATCH);
        let opener = writer::Opener {
            path: config.path.clone(),
            durability: config.durability,
        };
        writer::spawn(writer, opener, rx, shared.clone())?;
        Ok(SqliteStore { pool, jobs, shared })
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

    /// Transitional (the delivery changes move onto `change`): runs a sqlx `change` in a
    /// `BEGIN IMMEDIATE` transaction of its own on the pool, serialised against the writer by
    /// SQLite's lock, and answers after its commit. A refusal (`DeliveryError` other than a
    /// store failure) rolls back what it did and is answered as it is. The change says whether
    /// it may have made messages available (`true` wakes waiting fetches).
    pub(in crate::store) async fn in_writer<T, F>(&self, change: F) -> Result<T, DeliveryError>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(
                &'c mut SqliteConnection,
            )
                -> futures_util::future::BoxFuture<'c, Result<(T, bool), DeliveryError>>
            + Send
            + 'static,
    {
        let mut conn = self.pool.acquire().await.map_err(StoreError::from)?;
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *conn)
            .await
            .map_err(StoreError::from)?;
        match change(&mut conn).await {
            Ok((value, wakes_fetches)) => {
                sqlx::query("COMMIT")
                    .execute(&mut *conn)
                    .await
                    .map_err(StoreError::from)?;
                if wakes_fetches {
                    self.shared.announce_deliveries();
                }
                Ok(value)
            }
            Err(e) => {
                let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
                Err(e)
            }
        }
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

    /// A receiver that fires when `partner`'s buffered message `key` is delivered. Register
    /// before submitting the message, so that a delivery in the very next commit is not
    /// missed.
    pub fn watch_delivery(&self, partner: &str, key: &MessageKey) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let mut waiters = self
            .shared
            .waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let list = waiters
            .entry((partner.to_owned(), key.clone()))
            .or_default();
        list.retain(|w| !w.is_closed());
        list.push(tx);
        rx
    }

    /// Forgets watchers that gave up (their receivers were dropped).
    pub fn forget_watchers(&self, partner: &str, key: &MessageKey) {
        let mut waiters = self
            .shared
            .waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let watched = (partner.to_owned(), key.clone());
        if let Some(list) = waiters.get_mut(&watched) {
            list.retain(|w| !w.is_closed());
            if list.is_empty() {
                waiters.remove(&watched);
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
    /// Test hook: every message of `group` panics inside the writer, as a bug would.
    pub fn panic_on_group(&self, group: Option<&str>) {
        *self
            .shared
            .panicking_group
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = group.map(str::to_owned);
    }

    /// Test hook: caps the database at its current size (`None`: lifts the cap), so that
    /// writes fail as on a full disk ("database or disk is full").
    pub async fn cap_database_size(&self, capped: bool) -> Result<(), StoreError> {
        self.keep(move |conn| {
            // SQLite raises a cap below the current size to the current size.
            let pages: i64 = if capped { 1 } else { 1_073_741_823 };
            conn.pragma_update(None, "max_page_count", pages)?;
            Ok(((), Wakes::NONE))
        })
        .await
    }

    /// Whether the store can commit now (`/readyz`): `Err(reason)` while the writer is gone
    /// or its commits fail. Without a recent successful commit, a small write goes through the
    /// writer to find out, at most once per `PROBE_EVERY` however often this is asked.
    pub async fn readiness(&self) -> Result<(), String> {
        const PROBE_EVERY: Duration = Duration::from_secs(1);
        const PROBE_WAIT: Duration = Duration::from_secs(2);
        if self.jobs.is_closed() {
            return Err("the store writer has stopped".into());
        }
        let health = &self.shared.health;
        if health.committed_within(PROBE_EVERY) {
            return Ok(());
        }
        let mut last_probe = self.shared.probe.lock().await;
        if health.committed_within(PROBE_EVERY)
            || last_probe.is_some_and(|t| t.elapsed() < PROBE_EVERY)
        {
            return health.state();
        }
        *last_probe = Some(std::time::Instant::now());
        // A writer stuck reconnecting must not hang the probe: that is an answer too.
        let probe = tokio::time::timeout(
            PROBE_WAIT,
            self.keep(|conn| {
                conn.prepare_cached(
                    "INSERT INTO settings (key, value) VALUES ('ready_probe', randomblob(8)) \
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                )?
                .execute([])?;
                Ok(((), Wakes::NONE))
            }),
        )
        .await;
        match probe {
            Ok(Ok(())) => health.state(),
            Ok(Err(e)) => Err(health.state().err().unwrap_or_else(|| e.to_string())),
            Err(_) => Err(format!(
                "the store writer did not answer within {} s",
                PROBE_WAIT.as_secs()
            )),
        }
    }

    pub fn fail_next_commits(&self, n: usize) {
        self.shared.failing_commits.store(n, Ordering::SeqCst);
    }

    /// `partner`'s group `group_id` ("" for an anonymous caller's).
    pub async fn group(
        &self,
        partner: &str,
        group_id: &str,
    ) -> Result<Option<GroupState>, StoreError> {
        let row =
            sqlx::query("SELECT state, state_bin FROM groups WHERE partner = ? AND group_id = ?")
                .bind(partner)
                .bind(group_id)
                .fetch_optional(&self.pool)
                .await?;
        row.map(|r| decode_group(&r, 0)).transpose()
    }

    /// Groups with their partners, ordered by (partner, group id), after `after` (a
    /// (partner, group id) pair), at most `limit`.
    pub async fn groups(
        &self,
        after: Option<(&str, &str)>,
        limit: i64,
    ) -> Result<Vec<(String, GroupState)>, StoreError> {
        let (after_partner, after_group) = after.unwrap_or(("", ""));
        let rows = sqlx::query(
            "SELECT partner, state, state_bin FROM groups WHERE (partner, group_id) > (?, ?) \
             ORDER BY partner, group_id LIMIT ?",
        )
        .bind(after_partner)
        .bind(after_group)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.get(0), decode_group(r, 1)?)))
            .collect()
    }

    /// Delivered messages with offsets above `after`, oldest first.
    pub async fn inbox(&self, after: i64, limit: i64) -> Result<Vec<InboxEntry>, StoreError> {
        let rows = sqlx::query(
            "SELECT offset, channel, topic, group_id, number, payload, namespaces, received_at, \
             expiry, partner FROM inbox WHERE offset > ? ORDER BY offset LIMIT ?",
        )
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(inbox_from_row).collect())
    }

    /// The earliest group deadline, for the sweeper.
    pub async fn next_deadline(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let ms: Option<i64> = sqlx::query_scalar(
            // The condition lets SQLite answer from the partial index, not a table scan.
            "SELECT MIN(next_deadline) FROM groups WHERE next_deadline IS NOT NULL",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(ms.map(from_millis))
    }

    /// The registered endpoints of one kind.
    pub async fn endpoints(&self, kind: Endpoints) -> Result<Vec<String>, StoreError> {
        let sql = match kind {
            // Every partner's, each URL once.
            Endpoints::Callback => "SELECT DISTINCT url FROM callback_endpoints ORDER BY url",
            Endpoints::Push => "SELECT url FROM push_endpoints ORDER BY url",
        };
        Ok(sqlx::query_scalar(sql).fetch_all(&self.pool).await?)
    }

    /// Whether `url` is registered. A callback endpoint here is one registered for anonymous
    /// callers; a partner's are asked with `is_callback_endpoint`.
    pub async fn is_endpoint(&self, kind: Endpoints, url: &str) -> Result<bool, StoreError> {
        match kind {
            Endpoints::Callback => self.is_callback_endpoint("", url).await,
            Endpoints::Push => {
                let found: Option<i64> =
                    sqlx::query_scalar("SELECT 1 FROM push_endpoints WHERE url = ?")
                        .bind(url)
                        .fetch_optional(&self.pool)
                        .await?;
                Ok(found.is_some())
            }
        }
    }

    /// Whether `partner` ("" for an anonymous caller) may name `url` as a callback ReplyTo:
    /// a partner may name only the endpoints registered for it (D10, D14).
    pub async fn is_callback_endpoint(&self, partner: &str, url: &str) -> Result<bool, StoreError> {
        let found: Option<i64> =
            sqlx::query_scalar("SELECT 1 FROM callback_endpoints WHERE partner = ? AND url = ?")
                .bind(partner)
                .bind(url)
                .fetch_optional(&self.pool)
                .await?;
        Ok(found.is_some())
    }

    /// Registers an endpoint (a callback one for `partner`, `None`: for anonymous callers;
    /// push endpoints have no partner); returns false if it was already registered.
    pub async fn add_endpoint(
        &self,
        kind: Endpoints,
        partner: Option<&str>,
        url: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let (partner, url) = (partner.unwrap_or("").to_owned(), url.to_owned());
        self.keep(move |conn| {
            let added = match kind {
                Endpoints::Callback => conn
                    .prepare_cached(
                        "INSERT INTO callback_endpoints (partner, url, created_at) \
                         VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                    )?
                    .execute(rusqlite::params![partner, url, millis(now)])?,
                Endpoints::Push => conn
                    .prepare_cached(
                        "INSERT INTO push_endpoints (url, created_at) VALUES (?1, ?2) \
                         ON CONFLICT DO NOTHING",
                    )?
                    .execute(rusqlite::params![url, millis(now)])?,
            };
            Ok((added == 1, Wakes::NONE))
        })
        .await
    }

    /// Unregisters an endpoint (a callback one of `partner`, `None`: of anonymous callers).
    pub async fn remove_endpoint(
        &self,
        kind: Endpoints,
        partner: Option<&str>,
        url: &str,
    ) -> Result<bool, StoreError> {
        let (partner, url) = (partner.unwrap_or("").to_owned(), url.to_owned());
        self.keep(move |conn| {
            let removed = match kind {
                Endpoints::Callback => conn
                    .prepare_cached(
                        "DELETE FROM callback_endpoints WHERE partner = ?1 AND url = ?2",
                    )?
                    .execute(rusqlite::params![partner, url])?,
                Endpoints::Push => conn
                    .prepare_cached("DELETE FROM push_endpoints WHERE url = ?1")?
                    .execute([url])?,
            };
            Ok((removed == 1, Wakes::NONE))
        })
        .await
    }

    /// The registered callback endpoints as (partner, url), "" for anonymous callers'.
    pub async fn callback_endpoints(&self) -> Result<Vec<(String, String)>, StoreError> {
        let rows = sqlx::query("SELECT partner, url FROM callback_endpoints ORDER BY partner, url")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Callback acks due at `now`, oldest first.
    pub async fn due_callbacks(
        &self,
        now: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<PendingCallback>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, endpoint, soap12, group_id, number, fault, expiry, attempts, number_to, \
             partner FROM pending_callbacks WHERE next_attempt <= ? ORDER BY id LIMIT ?",
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
                    partner: r.get(9),
                    endpoint: r.get(1),
                    soap12: r.get::<i64, _>(2) != 0,
                    reply: ReplyItem {
                        group_id: GroupId::parse(&group).map_err(StoreError::Corrupt)?,
                        range: match (r.get::<Option<i64>, _>(4), r.get::<Option<i64>, _>(8)) {
                            (None, _) => None,
                            (Some(from), to) => {
                                let (from, to) =
                                    (from as u64, to.map_or(from as u64, |t| t as u64));
                                Some(SeqRange::new(from, to).ok_or_else(|| {
                                    StoreError::Corrupt(format!("callback range {from}-{to}"))
                                })?)
                            }
                        },
                        fault: match fault {
                            None => None,
                            Some(name) => {
                                Some(FaultCode::from_local_name(&name).ok_or_else(|| {
                                    StoreError::Corrupt(format!("unknown fault code {name}"))
                                })?)
                            }
                        },
                    },
                    expiry: from_millis(r.get(6)),
                    attempts: r.get::<i64, _>(7).try_into().unwrap_or(u32::MAX),
                })
            })
            .collect()
    }

    /// Queues replies about `partner`'s messages for a callback endpoint outside the receive
    /// path (faults of messages refused on arrival, poll answers sent by callback).
    pub async fn owe_callbacks(
        &self,
        partner: &str,
        endpoint: &str,
        soap12: bool,
        replies: &[ReplyItem],
        expiry: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let (partner, endpoint, replies) =
            (partner.to_owned(), endpoint.to_owned(), replies.to_vec());
        self.keep(move |conn| {
            let mut insert = conn.prepare_cached(
                "INSERT INTO pending_callbacks (partner, endpoint, soap12, group_id, number, \
                 number_to, fault, expiry, next_attempt) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?;
            for r in &replies {
                insert.execute(rusqlite::params![
                    partner,
                    endpoint,
                    i64::from(soap12),
                    r.group_id.as_str(),
                    r.range.map(|x| x.from() as i64),
                    r.range.map(|x| x.to() as i64),
                    r.fault.map(|f| f.local_name()),
                    millis(expiry),
                    millis(now)
                ])?;
            }
            Ok((
                (),
                Wakes {
                    callbacks: true,
                    ..Wakes::NONE
                },
            ))
        })
        .await
    }

    /// Remembers the fault of `partner`'s message that left no group state, for its sender's
    /// polls.
    pub async fn record_fault(
        &self,
        partner: &str,
        key: &MessageKey,
        code: FaultCode,
        expiry: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let (partner, key) = (partner.to_owned(), key.clone());
        let keep_until = crate::rmp::receive_plan::fault_notice_until(expiry, now);
        self.keep(move |conn| {
            batch::insert_fault(conn, &partner, &key.group_id, key.number, code, keep_until)?;
            Ok(((), Wakes::NONE))
        })
        .await
    }

    /// A barrier through the writer's queue: returns once everything queued before it has
    /// been committed (or failed). Shutdown flushes the writer with it.
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.keep(|_| Ok(((), Wakes::NONE))).await
    }

    /// The answer to `partner`'s PollRequest from stored state (D11); `None` when there is
    /// nothing to say. Only that partner's groups are read: a poll naming another partner's
    /// group is answered as for an unknown group (D14).
    ///
    /// Read after a barrier through the writer's queue: every message whose decision was
    /// queued before the poll arrived is committed first, so a sender polling after its
    /// message's ExpiryTime can take "nothing" as "not delivered". The reading itself stays
    /// outside the writer, so a large poll does not hold up deliveries.
    pub async fn poll_answer(
        &self,
        partner: &str,
        refs: &[RefToMessageIds],
    ) -> Result<Option<Response>, StoreError> {
        self.flush().await?;
        // Each group once, however many references name it; two reads in all, not two per
        // reference.
        let asked = Asked::new(refs);
        let ids = serde_json::json!(asked.group_ids().map(GroupId::as_str).collect::<Vec<_>>())
            .to_string();
        let mut states = HashMap::new();
        let rows = sqlx::query(
            "SELECT group_id, state, state_bin FROM groups \
             WHERE partner = ? AND group_id IN (SELECT value FROM json_each(?))",
        )
        .bind(partner)
        .bind(&ids)
        .fetch_all(&self.pool)
        .await?;
        for row in rows {
            let state = decode_group(&row, 1)?;
            states.insert(state.group_id.clone(), state);
        }
        let mut recorded: HashMap<GroupId, Vec<RecordedFault>> = HashMap::new();
        let rows = sqlx::query(
            "SELECT group_id, singleton, number, fault FROM message_faults \
             WHERE partner = ? AND group_id IN (SELECT value FROM json_each(?))",
        )
        .bind(partner)
        .bind(&ids)
        .fetch_all(&self.pool)
        .await?;
        for row in rows {
            let Ok(group_id) = GroupId::parse(row.get::<&str, _>(0)) else {
                continue;
            };
            let Some(code) = FaultCode::from_local_name(row.get::<&str, _>(3)) else {
                continue;
            };
            let number = (row.get::<i64, _>(1) == 0).then(|| row.get::<i64, _>(2) as u64);
            recorded
                .entry(group_id)
                .or_default()
                .push(RecordedFault { number, code });
        }
        let replies = answer_poll(
            &asked,
            |g| states.get(g),
            |g| recorded.get(g).map_or(&[][..], Vec::as_slice),
        );
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
        let ids = ids.to_vec();
        self.keep(move |conn| {
            let mut delete = conn.prepare_cached("DELETE FROM pending_callbacks WHERE id = ?1")?;
            for id in &ids {
                delete.execute([id])?;
            }
            Ok(((), Wakes::NONE))
        })
        .await
    }

    /// The POST failed: try again at `next`, or drop those whose messages expired before then.
    pub async fn callbacks_failed(
        &self,
        ids: &[i64],
        next: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let (ids, next) = (ids.to_vec(), millis(next));
        self.keep(move |conn| {
            let mut retry = conn.prepare_cached(
                "UPDATE pending_callbacks SET attempts = attempts + 1, next_attempt = ?1 \
                 WHERE id = ?2",
            )?;
            for id in &ids {
                retry.execute([next, *id])?;
            }
            conn.prepare_cached("DELETE FROM pending_callbacks WHERE expiry < ?1")?
                .execute([next])?;
            Ok(((), Wakes::NONE))
        })
        .await
    }
}

/// A group row's state from its `state` (JSON of old rows) and `state_bin` columns, at
/// `first` and `first + 1`.
fn decode_group(r: &sqlx::sqlite::SqliteRow, first: usize) -> Result<GroupState, StoreError> {
    let json: &str = r.try_get(first)?;
    let bin: Option<&[u8]> = r.try_get(first + 1)?;
    decode_stored(json, bin).map_err(StoreError::Corrupt)
}

/// An inbox row: offset, channel, topic, group_id, number, payload, namespaces, received_at,
/// expiry, partner.
pub(in crate::store) fn inbox_from_row(r: &sqlx::sqlite::SqliteRow) -> InboxEntry {
    InboxEntry {
        offset: r.get(0),
        partner: r.get(9),
        channel: r.get(1),
        topic: r.get(2),
        group_id: r.get(3),
        number: r.get::<Option<i64>, _>(4).map(|n| n as u64),
        // Bytes: big payloads are stored as BLOBs (incremental blob I/O), small ones as TEXT.
        payload: match String::from_utf8(r.get::<Vec<u8>, _>(5)) {
            Ok(text) => text,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        },
        namespaces: r.get(6),
        received_at: from_millis(r.get(7)),
        expiry: from_millis(r.get(8)),
    }
}

/// Ours: `PRAGMA application_id` of a wsr-gateway database ("WSRG").
const APPLICATION_ID: i64 = 0x5753_5247;
const _: () = assert!(
    APPLICATION_ID == 1_465_078_343,
    "the literal in claim_database"
);

/// Takes this process's exclusive hold on the database, beside it in `{file}.lock`, so that a
/// second gateway on the same file stops at once with a clear error instead of sharing the
/// writer's work. The OS releases the hold when the process dies, so a crash leaves nothing to
/// clean up. Opening the lock file first also names the OS's reason when the place is not
/// writable (SQLite only says "unable to open database file").
async fn lock_database(path: &std::path::Path) -> Result<std::fs::File, StoreError> {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
    {
        return Err(StoreError::Refused(format!(
            "cannot open {} for reading and writing: {e}",
            path.display()
        )));
    }
    // The lock sits beside the real file, so two gateways reaching one database by other
    // names (a symlink, a bind mount) still meet at one lock.
    let real = std::fs::canonicalize(path)
        .map_err(|e| StoreError::Refused(format!("cannot resolve {}: {e}", path.display())))?;
    let mut name = real.into_os_string();
    name.push(".lock");
    let lock_path = std::path::PathBuf::from(name);
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(|e| StoreError::Refused(format!("cannot open {}: {e}", lock_path.display())))?;
    // A store of this process that is shutting down lets go within moments; anyone else
    // keeps it.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        match lock.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Locked(format!(
                    "{} is in use by another wsr-gateway (it holds {}); one database serves one \
                     gateway — give this one its own `database`",
                    path.display(),
                    lock_path.display()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(StoreError::Refused(format!(
                    "cannot lock {}: {e}",
                    lock_path.display()
                )));
            }
        }
    }
    Ok(lock)
}

/// Refuses a database that is not ours before migrations add a single table to it: one with
/// another application id, or one with tables but no id and none of our migrations. A new,
/// empty file is marked as ours; one from before we marked them is recognised by its
/// migrations and marked.
async fn claim_database(pool: &SqlitePool, path: &std::path::Path) -> Result<(), StoreError> {
    let id: i64 = sqlx::query_scalar("PRAGMA application_id")
        .fetch_one(pool)
        .await?;
    if id == APPLICATION_ID {
        return Ok(());
    }
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' \
         ORDER BY name",
    )
    .fetch_all(pool)
    .await?;
    let ours_before_ids = tables.iter().any(|t| t == "_sqlx_migrations")
        && tables.iter().any(|t| t == "groups")
        && tables.iter().any(|t| t == "inbox");
    if id != 0 || !(tables.is_empty() || ours_before_ids) {
        let shown: Vec<&str> = tables.iter().take(5).map(String::as_str).collect();
        return Err(StoreError::Refused(format!(
            "{} is not a wsr-gateway database (application_id {id:#x}, tables: {}{}); \
             refusing to add ours to it — point `database` at a new file",
            path.display(),
            if shown.is_empty() {
                "none".to_owned()
            } else {
                shown.join(", ")
            },
            if tables.len() > shown.len() {
                ", …"
            } else {
                ""
            },
        )));
    }
    // 0x57535247: APPLICATION_ID (a pragma takes no parameters).
    sqlx::query("PRAGMA application_id = 1465078343")
        .execute(pool)
        .await?;
    Ok(())
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> StoreError {
        StoreError::Backend(e.to_string())
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(e: sqlx::migrate::MigrateError) -> StoreError {
        StoreError::Migrate(e.to_string())
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> StoreError {
        StoreError::Backend(e.to_string())
    }
}
