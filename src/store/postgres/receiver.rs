//! `ReceiverStore` for PostgreSQL. Decisions about one group are serialised across gateways by
//! a transaction-scoped advisory lock on (partner, group id), taken before the group is read
//! and held to the commit; inbox offsets come from the `sequences` row, taken last and also
//! held to the commit, so that offsets become visible in commit order with no gap. Received
//! messages are decided and stored by the group-commit writer (`writer.rs`); the sweep and
//! the rest are here. Callback
//! acks are claimed with a lease, so that one gateway POSTs each and another takes over when
//! it dies.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use tokio::sync::{Notify, oneshot};

use super::PostgresStore;
use super::failure::{Failure, retrying};
use super::group_state::{decode, encode};
use super::notify::Announcement;
use crate::rmp::group::{GroupState, slot};
use crate::rmp::receive_plan::{OwedCallback, SweepPlan, plan_sweep};
use crate::rmp::replies::{Asked, RecordedFault, ReplyItem, answer_poll};
use crate::store::received::{
    Endpoints, InboxEntry, PendingCallback, Received, ReceivedMessage, SweepReport,
};
use crate::store::receiver::ReceiverStore;
use crate::store::time::{from_millis, millis};
use crate::store::wakes::Wakes;
use crate::store::{StoreError, StoreFuture};
use crate::wsr::{FaultCode, GroupId, MessageKey, RefToMessageIds, Response, SeqRange};

/// Most groups one sweep pass handles; the rest are due again at once.
const SWEEP_BATCH: i64 = 500;

/// How long a gateway holds the callback acks it took before another may take them: longer
/// than one POST may last (the callback client's timeouts), short enough that acks of a
/// gateway that died go out soon after.
const CALLBACK_LEASE_MS: i64 = 60_000;

/// The SELECT list `inbox_entry` reads; callers add `FROM inbox WHERE …`.
pub(in crate::store) const SELECT_INBOX: &str = "SELECT \"offset\", channel, topic, group_id, \
     number, payload, namespaces, received_at, expiry, partner ";

/// An inbox row read with `SELECT_INBOX`.
pub(in crate::store) fn inbox_entry(r: &PgRow) -> Result<InboxEntry, sqlx::Error> {
    Ok(InboxEntry {
        offset: r.try_get(0)?,
        partner: r.try_get(9)?,
        channel: r.try_get(1)?,
        topic: r.try_get(2)?,
        group_id: r.try_get(3)?,
        number: r.try_get::<Option<i64>, _>(4)?.map(|n| n as u64),
        payload: String::from_utf8_lossy(r.try_get::<&[u8], _>(5)?).into_owned(),
        namespaces: r.try_get(6)?,
        received_at: from_millis(r.try_get(7)?),
        expiry: from_millis(r.try_get(8)?),
    })
}

/// Takes the group's lock (the one the writer's batches take, `writer.rs`) without waiting:
/// `false` when another transaction holds the group.
async fn try_lock_group(
    conn: &mut PgConnection,
    partner: &str,
    group_id: &str,
) -> Result<bool, Failure> {
    Ok(sqlx::query_scalar(
        "SELECT pg_try_advisory_xact_lock(hashtextextended($1 || chr(31) || $2, 0))",
    )
    .bind(partner)
    .bind(group_id)
    .fetch_one(conn)
    .await?)
}

/// Writes a group's state (a new row when `id` is `None`).
async fn write_group(
    conn: &mut PgConnection,
    id: Option<i64>,
    partner: &str,
    source: &str,
    state: &GroupState,
    deadline: Option<i64>,
    now: i64,
) -> Result<(), Failure> {
    let mut encoded = Vec::new();
    encode(state, &mut encoded);
    match id {
        Some(id) => {
            sqlx::query(
                "UPDATE groups SET status = $2, next_deadline = $3, updated_at = $4, \
                 state_bin = $5 WHERE id = $1",
            )
            .bind(id)
            .bind(state.status.as_str())
            .bind(deadline)
            .bind(now)
            .bind(&encoded)
            .execute(conn)
            .await?;
        }
        None => {
            sqlx::query(
                "INSERT INTO groups (partner, group_id, channel, status, next_deadline, \
                 updated_at, source, state_bin) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(partner)
            .bind(state.group_id.as_str())
            .bind(&state.params.channel)
            .bind(state.status.as_str())
            .bind(deadline)
            .bind(now)
            .bind(source)
            .bind(&encoded)
            .execute(conn)
            .await?;
        }
    }
    Ok(())
}

async fn delete_buffered(
    conn: &mut PgConnection,
    partner: &str,
    group_id: &str,
    numbers: &[u64],
) -> Result<(), Failure> {
    if numbers.is_empty() {
        return Ok(());
    }
    let numbers: Vec<i64> = numbers.iter().map(|n| *n as i64).collect();
    sqlx::query("DELETE FROM buffered WHERE partner = $1 AND group_id = $2 AND number = ANY($3)")
        .bind(partner)
        .bind(group_id)
        .bind(&numbers)
        .execute(conn)
        .await?;
    Ok(())
}

/// The message(s) a queued callback answers: a singleton (`from` and `to` `None`), one number
/// (`from`), or a range (`from` to `to`).
struct CallbackRow<'a> {
    group_id: &'a str,
    from: Option<i64>,
    to: Option<i64>,
    fault: Option<FaultCode>,
}

#[allow(clippy::too_many_arguments, reason = "one column each")]
async fn insert_callback(
    conn: &mut PgConnection,
    partner: &str,
    endpoint: &str,
    soap12: bool,
    reply: &CallbackRow<'_>,
    keep_until: i64,
    now: i64,
) -> Result<(), Failure> {
    sqlx::query(
        "INSERT INTO pending_callbacks (partner, endpoint, soap12, group_id, number, \
         number_to, fault, expiry, next_attempt) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(partner)
    .bind(endpoint)
    .bind(soap12)
    .bind(reply.group_id)
    .bind(reply.from)
    .bind(reply.to)
    .bind(reply.fault.map(|f| f.local_name()))
    .bind(keep_until)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

async fn owe_callback(
    conn: &mut PgConnection,
    partner: &str,
    group_id: &str,
    c: &OwedCallback,
    soap12: bool,
    now: i64,
) -> Result<(), Failure> {
    let reply = CallbackRow {
        group_id,
        from: c.number.map(|n| n as i64),
        to: None,
        fault: c.fault,
    };
    insert_callback(
        conn,
        partner,
        &c.endpoint,
        soap12,
        &reply,
        millis(c.keep_until),
        now,
    )
    .await
}

async fn insert_fault(
    conn: &mut PgConnection,
    partner: &str,
    group_id: &GroupId,
    number: Option<u64>,
    code: FaultCode,
    keep_until: DateTime<Utc>,
) -> Result<(), Failure> {
    sqlx::query(
        "INSERT INTO message_faults (partner, group_id, singleton, number, fault, expiry) \
         VALUES ($1, $2, $3, $4, $5, $6) \
         ON CONFLICT (partner, group_id, singleton, number) DO NOTHING",
    )
    .bind(partner)
    .bind(group_id.as_str())
    .bind(number.is_none())
    .bind(slot(number) as i64)
    .bind(code.local_name())
    .bind(millis(keep_until))
    .execute(conn)
    .await?;
    Ok(())
}

impl PostgresStore {
    /// One sweep pass in one transaction. Groups another gateway is deciding about right now
    /// are left for the next pass (their deadline stays due).
    async fn sweep_once(&self, now: DateTime<Utc>) -> Result<SweepReport, Failure> {
        let now_ms = millis(now);
        let policy = &self.shared.policy;
        let mut tx = self.begin().await?;
        let due: Vec<(i64, String, String)> = sqlx::query_as(
            "SELECT id, partner, group_id FROM groups WHERE next_deadline <= $1 \
             ORDER BY next_deadline LIMIT $2",
        )
        .bind(now_ms)
        .bind(SWEEP_BATCH)
        .fetch_all(&mut *tx)
        .await?;
        let mut report = SweepReport::default();
        let mut announcement = Announcement::default();
        for (id, partner, group_id) in due {
            if !try_lock_group(&mut tx, &partner, &group_id).await? {
                continue;
            }
            // Read again under the lock: a receive may have moved it since.
            let row =
                sqlx::query("SELECT state_bin FROM groups WHERE id = $1 AND next_deadline <= $2")
                    .bind(id)
                    .bind(now_ms)
                    .fetch_optional(&mut *tx)
                    .await?;
            let Some(row) = row else { continue };
            let state = match decode(row.try_get::<&[u8], _>(0)?) {
                Ok(state) => state,
                Err(why) => {
                    // One unreadable row must not stop every other group's deadlines: take it
                    // out of the sweep (kept for an operator to inspect) and go on.
                    tracing::error!(%partner, %group_id, reason = %why, "unreadable group state; no longer swept");
                    sqlx::query("UPDATE groups SET next_deadline = NULL WHERE id = $1")
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                    continue;
                }
            };
            match plan_sweep(state, now, policy) {
                SweepPlan::Rearm(write) => {
                    let deadline = write.deadline.map(millis);
                    write_group(
                        &mut tx,
                        Some(id),
                        &partner,
                        "",
                        &write.state,
                        deadline,
                        now_ms,
                    )
                    .await?;
                }
                SweepPlan::Changed {
                    group,
                    discard,
                    callbacks,
                } => {
                    delete_buffered(&mut tx, &partner, &group_id, &discard).await?;
                    // Senders of discarded messages learn by callback in SOAP 1.1, the version
                    // every peer accepts; their own version is not kept for buffered messages.
                    for c in &callbacks {
                        owe_callback(&mut tx, &partner, &group_id, c, false, now_ms).await?;
                        announcement.wakes.callbacks = true;
                    }
                    let deadline = group.deadline.map(millis);
                    write_group(
                        &mut tx,
                        Some(id),
                        &partner,
                        "",
                        &group.state,
                        deadline,
                        now_ms,
                    )
                    .await?;
                    report.changed += 1;
                    report.discarded += discard.len();
                }
                SweepPlan::Purge => {
                    sqlx::query("DELETE FROM groups WHERE id = $1")
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query("DELETE FROM buffered WHERE partner = $1 AND group_id = $2")
                        .bind(&partner)
                        .bind(&group_id)
                        .execute(&mut *tx)
                        .await?;
                    report.purged += 1;
                }
            }
        }
        sqlx::query("DELETE FROM pending_callbacks WHERE expiry < $1")
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM message_faults WHERE expiry < $1")
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
        self.commit(tx, announcement).await?;
        Ok(report)
    }

    pub(in crate::store) async fn fill_delivered(
        &self,
        _channel: &str,
        _groups: u64,
        _per_group: u64,
        _payload_bytes: usize,
        _now: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        Err(StoreError::Refused(
            "prefill fills SQLite stores only (a benchmark fixture)".into(),
        ))
    }
}

/// A callback row as `due_callbacks` selects it.
fn pending_callback(r: &PgRow) -> Result<PendingCallback, Failure> {
    let group: String = r.try_get(3)?;
    let fault: Option<String> = r.try_get(5)?;
    let from: Option<i64> = r.try_get(4)?;
    let to: Option<i64> = r.try_get(8)?;
    Ok(PendingCallback {
        id: r.try_get(0)?,
        partner: r.try_get(9)?,
        endpoint: r.try_get(1)?,
        soap12: r.try_get(2)?,
        reply: ReplyItem {
            group_id: GroupId::parse(&group).map_err(StoreError::Corrupt)?,
            range: match from {
                None => None,
                Some(from) => {
                    let (from, to) = (from as u64, to.map_or(from as u64, |t| t as u64));
                    Some(SeqRange::new(from, to).ok_or_else(|| {
                        StoreError::Corrupt(format!("callback range {from}-{to}"))
                    })?)
                }
            },
            fault: match fault {
                None => None,
                Some(name) => Some(
                    FaultCode::from_local_name(&name)
                        .ok_or_else(|| StoreError::Corrupt(format!("unknown fault code {name}")))?,
                ),
            },
        },
        expiry: from_millis(r.try_get(6)?),
        attempts: r.try_get::<i32, _>(7)?.try_into().unwrap_or(u32::MAX),
    })
}

impl ReceiverStore for PostgresStore {
    fn receive<'a>(
        &'a self,
        message: ReceivedMessage,
    ) -> StoreFuture<'a, Result<Received, StoreError>> {
        Box::pin(async move {
            let received = self.shared.writer.enqueue(message).await;
            if let Err(e) = &received {
                // Refusals of this message alone say nothing about the database's health.
                if matches!(
                    e,
                    StoreError::Backend(_) | StoreError::Failed(_) | StoreError::Injected
                ) {
                    self.shared.health.failed(&e.to_string());
                }
            }
            received
        })
    }

    fn sweep<'a>(&'a self, now: DateTime<Utc>) -> StoreFuture<'a, Result<SweepReport, StoreError>> {
        Box::pin(async move { retrying(|| self.sweep_once(now)).await })
    }

    fn watch_delivery(&self, partner: &str, key: &MessageKey) -> oneshot::Receiver<()> {
        self.shared.watch(partner, key)
    }

    fn forget_watchers(&self, partner: &str, key: &MessageKey) {
        self.shared.forget(partner, key)
    }

    fn callbacks_due(&self) -> &Notify {
        &self.shared.callbacks_due
    }

    fn deadlines_changed(&self) -> &Notify {
        &self.shared.deadlines_changed
    }

    fn sweeper_sleeps_until(&self, wakeup: DateTime<Utc>) {
        self.shared
            .sweeper_wakeup
            .store(millis(wakeup), Ordering::SeqCst);
    }

    fn group<'a>(
        &'a self,
        partner: &'a str,
        group_id: &'a str,
    ) -> StoreFuture<'a, Result<Option<GroupState>, StoreError>> {
        Box::pin(async move {
            let bin: Option<Vec<u8>> = sqlx::query_scalar(
                "SELECT state_bin FROM groups WHERE partner = $1 AND group_id = $2",
            )
            .bind(partner)
            .bind(group_id)
            .fetch_optional(&self.pool)
            .await?;
            bin.map(|b| decode(&b)).transpose()
        })
    }

    fn groups<'a>(
        &'a self,
        after: Option<(&'a str, &'a str)>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<(String, GroupState)>, StoreError>> {
        Box::pin(async move {
            let (after_partner, after_group) = after.unwrap_or(("", ""));
            // COLLATE "C": pages in byte order, as SQLite's, whatever the database's locale.
            let rows = sqlx::query(
                "SELECT partner, state_bin FROM groups \
                 WHERE (partner COLLATE \"C\", group_id COLLATE \"C\") > ($1, $2) \
                 ORDER BY partner COLLATE \"C\", group_id COLLATE \"C\" LIMIT $3",
            )
            .bind(after_partner)
            .bind(after_group)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
            rows.iter()
                .map(|r| Ok((r.try_get(0)?, decode(r.try_get::<&[u8], _>(1)?)?)))
                .collect()
        })
    }

    fn inbox<'a>(
        &'a self,
        after: i64,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<InboxEntry>, StoreError>> {
        Box::pin(async move {
            let sql = format!(
                "{SELECT_INBOX} FROM inbox WHERE \"offset\" > $1 ORDER BY \"offset\" LIMIT $2"
            );
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(after)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?;
            Ok(rows.iter().map(inbox_entry).collect::<Result<_, _>>()?)
        })
    }

    fn next_deadline<'a>(&'a self) -> StoreFuture<'a, Result<Option<DateTime<Utc>>, StoreError>> {
        Box::pin(async move {
            let ms: Option<i64> = sqlx::query_scalar(
                "SELECT MIN(next_deadline) FROM groups WHERE next_deadline IS NOT NULL",
            )
            .fetch_one(&self.pool)
            .await?;
            Ok(ms.map(from_millis))
        })
    }

    fn endpoints<'a>(
        &'a self,
        kind: Endpoints,
    ) -> StoreFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(async move {
            let sql = match kind {
                // Every partner's, each URL once.
                Endpoints::Callback => {
                    "SELECT DISTINCT url COLLATE \"C\" FROM callback_endpoints ORDER BY 1"
                }
                Endpoints::Push => "SELECT url FROM push_endpoints ORDER BY url COLLATE \"C\"",
            };
            Ok(sqlx::query_scalar(sql).fetch_all(&self.pool).await?)
        })
    }

    fn is_push_endpoint<'a>(&'a self, url: &'a str) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            Ok(
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM push_endpoints WHERE url = $1)")
                    .bind(url)
                    .fetch_one(&self.pool)
                    .await?,
            )
        })
    }

    fn is_callback_endpoint<'a>(
        &'a self,
        partner: &'a str,
        url: &'a str,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            Ok(sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM callback_endpoints WHERE partner = $1 AND url = $2)",
            )
            .bind(partner)
            .bind(url)
            .fetch_one(&self.pool)
            .await?)
        })
    }

    fn add_endpoint<'a>(
        &'a self,
        kind: Endpoints,
        partner: Option<&'a str>,
        url: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let added = match kind {
                Endpoints::Callback => sqlx::query(
                    "INSERT INTO callback_endpoints (partner, url, created_at) \
                     VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                )
                .bind(partner.unwrap_or(""))
                .bind(url)
                .bind(millis(now)),
                Endpoints::Push => sqlx::query(
                    "INSERT INTO push_endpoints (url, created_at) VALUES ($1, $2) \
                     ON CONFLICT DO NOTHING",
                )
                .bind(url)
                .bind(millis(now)),
            }
            .execute(&self.pool)
            .await?
            .rows_affected();
            Ok(added == 1)
        })
    }

    fn remove_endpoint<'a>(
        &'a self,
        kind: Endpoints,
        partner: Option<&'a str>,
        url: &'a str,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let removed = match kind {
                Endpoints::Callback => {
                    sqlx::query("DELETE FROM callback_endpoints WHERE partner = $1 AND url = $2")
                        .bind(partner.unwrap_or(""))
                        .bind(url)
                }
                Endpoints::Push => {
                    sqlx::query("DELETE FROM push_endpoints WHERE url = $1").bind(url)
                }
            }
            .execute(&self.pool)
            .await?
            .rows_affected();
            Ok(removed == 1)
        })
    }

    fn callback_endpoints<'a>(
        &'a self,
    ) -> StoreFuture<'a, Result<Vec<(String, String)>, StoreError>> {
        Box::pin(async move {
            Ok(sqlx::query_as(
                "SELECT partner, url FROM callback_endpoints \
                 ORDER BY partner COLLATE \"C\", url COLLATE \"C\"",
            )
            .fetch_all(&self.pool)
            .await?)
        })
    }

    /// Claims the due acks for this gateway for `CALLBACK_LEASE_MS`: another gateway asking
    /// meanwhile gets others (`SKIP LOCKED`, then the lease), and takes these over only once
    /// the lease ran out without them being sent or rescheduled.
    fn due_callbacks<'a>(
        &'a self,
        now: DateTime<Utc>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<PendingCallback>, StoreError>> {
        Box::pin(async move {
            let now_ms = millis(now);
            let rows = sqlx::query(
                "UPDATE pending_callbacks SET lease_owner = $1, lease_until = $2 \
                 WHERE id IN (SELECT id FROM pending_callbacks \
                   WHERE next_attempt <= $3 AND (lease_until IS NULL OR lease_until <= $3) \
                   ORDER BY id LIMIT $4 FOR UPDATE SKIP LOCKED) \
                 RETURNING id, endpoint, soap12, group_id, number, fault, expiry, attempts, \
                 number_to, partner",
            )
            .bind(self.gateway())
            .bind(now_ms.saturating_add(CALLBACK_LEASE_MS))
            .bind(now_ms)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
            let mut due = rows
                .iter()
                .map(pending_callback)
                .collect::<Result<Vec<_>, Failure>>()?;
            due.sort_by_key(|c| c.id);
            Ok(due)
        })
    }

    fn owe_callbacks<'a>(
        &'a self,
        partner: &'a str,
        endpoint: &'a str,
        soap12: bool,
        replies: &'a [ReplyItem],
        expiry: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            retrying(|| async {
                let mut tx = self.begin().await?;
                for r in replies {
                    let reply = CallbackRow {
                        group_id: r.group_id.as_str(),
                        from: r.range.map(|x| x.from() as i64),
                        to: r.range.map(|x| x.to() as i64),
                        fault: r.fault,
                    };
                    insert_callback(
                        &mut tx,
                        partner,
                        endpoint,
                        soap12,
                        &reply,
                        millis(expiry),
                        millis(now),
                    )
                    .await?;
                }
                let wakes = Wakes {
                    callbacks: true,
                    ..Wakes::NONE
                };
                self.commit(tx, Announcement::wakes(wakes)).await?;
                Ok(())
            })
            .await
        })
    }

    fn record_fault<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
        code: FaultCode,
        expiry: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let keep_until = crate::rmp::receive_plan::fault_notice_until(expiry, now);
            let mut conn = self.pool.acquire().await?;
            insert_fault(
                &mut conn,
                partner,
                &key.group_id,
                key.number,
                code,
                keep_until,
            )
            .await?;
            Ok(())
        })
    }

    /// Every receive commits before it answers, so whatever a sender was told before it
    /// polled is in what this reads.
    fn poll_answer<'a>(
        &'a self,
        partner: &'a str,
        refs: &'a [RefToMessageIds],
    ) -> StoreFuture<'a, Result<Option<Response>, StoreError>> {
        Box::pin(async move {
            let asked = Asked::new(refs);
            let ids: Vec<&str> = asked.group_ids().map(GroupId::as_str).collect();
            let mut states = HashMap::new();
            let rows = sqlx::query(
                "SELECT state_bin FROM groups WHERE partner = $1 AND group_id = ANY($2)",
            )
            .bind(partner)
            .bind(&ids)
            .fetch_all(&self.pool)
            .await?;
            for row in rows {
                let state = decode(row.try_get::<&[u8], _>(0)?)?;
                states.insert(state.group_id.clone(), state);
            }
            let mut recorded: HashMap<GroupId, Vec<RecordedFault>> = HashMap::new();
            let rows: Vec<(String, bool, i64, String)> = sqlx::query_as(
                "SELECT group_id, singleton, number, fault FROM message_faults \
                 WHERE partner = $1 AND group_id = ANY($2)",
            )
            .bind(partner)
            .bind(&ids)
            .fetch_all(&self.pool)
            .await?;
            for (group_id, singleton, number, fault) in rows {
                let Ok(group_id) = GroupId::parse(&group_id) else {
                    continue;
                };
                let Some(code) = FaultCode::from_local_name(&fault) else {
                    continue;
                };
                let number = (!singleton).then_some(number as u64);
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
        })
    }

    fn next_callback_due<'a>(
        &'a self,
    ) -> StoreFuture<'a, Result<Option<DateTime<Utc>>, StoreError>> {
        Box::pin(async move {
            // A leased ack is due again when its lease runs out (its gateway may have died).
            let ms: Option<i64> = sqlx::query_scalar(
                "SELECT MIN(GREATEST(next_attempt, COALESCE(lease_until, next_attempt))) \
                 FROM pending_callbacks",
            )
            .fetch_one(&self.pool)
            .await?;
            Ok(ms.map(from_millis))
        })
    }

    fn callbacks_sent<'a>(&'a self, ids: &'a [i64]) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query("DELETE FROM pending_callbacks WHERE id = ANY($1)")
                .bind(ids)
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }

    fn callbacks_failed<'a>(
        &'a self,
        ids: &'a [i64],
        next: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let next = millis(next);
            retrying(|| async {
                let mut tx = self.begin().await?;
                sqlx::query(
                    "UPDATE pending_callbacks SET attempts = attempts + 1, next_attempt = $1, \
                     lease_owner = NULL, lease_until = NULL WHERE id = ANY($2)",
                )
                .bind(next)
                .bind(ids)
                .execute(&mut *tx)
                .await?;
                sqlx::query("DELETE FROM pending_callbacks WHERE expiry < $1")
                    .bind(next)
                    .execute(&mut *tx)
                    .await?;
                self.commit(tx, Announcement::default()).await?;
                Ok(())
            })
            .await
        })
    }
}
