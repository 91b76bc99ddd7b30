//! `ReceiverStore` for SQLite: writes go through the writer (`Job::Receive`, `Job::Sweep`,
//! changes), reads to the pool.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use chrono::{DateTime, Utc};
use sqlx::Row;
use tokio::sync::{Notify, oneshot};

use super::batch::{CallbackRow, insert_callback};
use super::job::Job;
use super::{SqliteStore, Wakes, batch, decode_group, inbox_from_row, select_inbox};
use crate::rmp::group::GroupState;
use crate::rmp::replies::{Asked, RecordedFault, ReplyItem, answer_poll};
use crate::store::backend::Backend;
use crate::store::error::StoreError;
use crate::store::future::StoreFuture;
use crate::store::received::{
    Endpoints, InboxEntry, InboxExcerpt, PendingCallback, Received, ReceivedMessage, SweepReport,
};
use crate::store::receiver::{Arriving, ReceiverStore};
use crate::store::time::{from_millis, millis};
use crate::wsr::{FaultCode, GroupId, MessageKey, RefToMessageIds, Response, SeqRange};

impl ReceiverStore for SqliteStore {
    fn arriving(&self) -> Arriving {
        Arriving::counted(&self.shared.arriving)
    }

    fn receive<'a>(
        &'a self,
        message: ReceivedMessage,
    ) -> StoreFuture<'a, Result<Received, StoreError>> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            self.jobs
                .send(Job::Receive(Box::new(message), tx))
                .await
                .map_err(|_| StoreError::Closed)?;
            rx.await.map_err(|_| StoreError::Closed)?
        })
    }

    fn sweep<'a>(&'a self, now: DateTime<Utc>) -> StoreFuture<'a, Result<SweepReport, StoreError>> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            self.jobs
                .send(Job::Sweep(now, tx))
                .await
                .map_err(|_| StoreError::Closed)?;
            rx.await.map_err(|_| StoreError::Closed)?
        })
    }

    fn abort_group<'a>(
        &'a self,
        partner: &'a str,
        group_id: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        let (partner, group_id) = (partner.to_owned(), group_id.to_owned());
        let policy = self.shared.policy.clone();
        Box::pin(
            self.keep(move |conn| {
                super::batch::abort_group(conn, &partner, &group_id, now, &policy)
            }),
        )
    }

    fn watch_delivery(&self, partner: &str, key: &MessageKey) -> oneshot::Receiver<()> {
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

    fn forget_watchers(&self, partner: &str, key: &MessageKey) {
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
        Box::pin(self.durable(async move {
            for id in self.shared.groups.rows(partner, group_id) {
                // The entry may be stale or another pair's (group_index.rs): the row decides.
                let row = sqlx::query(
                    "SELECT state, state_bin FROM groups WHERE id = ? AND partner = ? \
                     AND group_id = ?",
                )
                .bind(id)
                .bind(partner)
                .bind(group_id)
                .fetch_optional(&self.pool)
                .await?;
                if let Some(r) = row {
                    return decode_group(&r, 0).map(Some);
                }
            }
            Ok(None)
        }))
    }

    fn groups<'a>(
        &'a self,
        after: Option<(&'a str, &'a str)>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<(String, GroupState)>, StoreError>> {
        Box::pin(self.durable(async move {
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
        }))
    }

    fn inbox<'a>(
        &'a self,
        after: i64,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<InboxEntry>, StoreError>> {
        Box::pin(self.durable(async move {
            let rows = sqlx::query(concat!(
                select_inbox!(),
                "FROM inbox WHERE offset > ? ORDER BY offset LIMIT ?"
            ))
            .bind(after)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
            Ok(rows.iter().map(inbox_from_row).collect())
        }))
    }

    fn inbox_excerpt<'a>(
        &'a self,
        offset: i64,
        head: usize,
    ) -> StoreFuture<'a, Result<Option<InboxExcerpt>, StoreError>> {
        Box::pin(self.durable(async move {
            // The head is cut inside SQLite (which still loads a BLOB there for `substr`,
            // transiently), so only the head is handed to us; a small TEXT payload is cut by
            // characters (it is small).
            let row = sqlx::query(concat!(
                "SELECT offset, channel, topic, group_id, number, substr(payload, 1, ?2), \
                 namespaces, received_at, expiry, partner, ",
                super::payload_size!(),
                " FROM inbox WHERE offset = ?1"
            ))
            .bind(offset)
            .bind(i64::try_from(head).unwrap_or(i64::MAX))
            .fetch_optional(&self.pool)
            .await?;
            Ok(row.map(|r| {
                let mut head_bytes = r.get::<&[u8], _>(5).to_vec();
                head_bytes.truncate(head);
                let entry = super::inbox_from_row_without_payload(&r);
                InboxExcerpt {
                    entry,
                    head: head_bytes,
                    size: r.get::<i64, _>(10).max(0) as u64,
                }
            }))
        }))
    }

    fn next_deadline<'a>(&'a self) -> StoreFuture<'a, Result<Option<DateTime<Utc>>, StoreError>> {
        Box::pin(self.durable(async move {
            let ms: Option<i64> = sqlx::query_scalar(
                // The condition lets SQLite answer from the partial index, not a table scan.
                "SELECT MIN(next_deadline) FROM groups WHERE next_deadline IS NOT NULL",
            )
            .fetch_one(&self.pool)
            .await?;
            Ok(ms.map(from_millis))
        }))
    }

    fn endpoints<'a>(
        &'a self,
        kind: Endpoints,
    ) -> StoreFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(self.durable(async move {
            let sql = match kind {
                // Every partner's, each URL once.
                Endpoints::Callback => "SELECT DISTINCT url FROM callback_endpoints ORDER BY url",
                Endpoints::Push => "SELECT url FROM push_endpoints ORDER BY url",
            };
            Ok(sqlx::query_scalar(sql).fetch_all(&self.pool).await?)
        }))
    }

    fn is_push_endpoint<'a>(&'a self, url: &'a str) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(self.durable(async move {
            let found: Option<i64> =
                sqlx::query_scalar("SELECT 1 FROM push_endpoints WHERE url = ?")
                    .bind(url)
                    .fetch_optional(&self.pool)
                    .await?;
            Ok(found.is_some())
        }))
    }

    fn may_push_to<'a>(
        &'a self,
        principal: &'a str,
        url: &'a str,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(self.durable(async move {
            let found: Option<i64> = sqlx::query_scalar(
                "SELECT 1 FROM push_endpoint_grants g JOIN push_endpoints e ON e.url = g.url \
                 WHERE g.url = ? AND g.principal IN (?, '*')",
            )
            .bind(url)
            .bind(principal)
            .fetch_optional(&self.pool)
            .await?;
            Ok(found.is_some())
        }))
    }

    fn push_grants<'a>(&'a self) -> StoreFuture<'a, Result<Vec<(String, String)>, StoreError>> {
        Box::pin(self.durable(async move {
            let rows = sqlx::query(
                "SELECT principal, url FROM push_endpoint_grants ORDER BY url, principal",
            )
            .fetch_all(&self.pool)
            .await?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        }))
    }

    fn is_callback_endpoint<'a>(
        &'a self,
        partner: &'a str,
        url: &'a str,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(self.durable(async move {
            let found: Option<i64> = sqlx::query_scalar(
                "SELECT 1 FROM callback_endpoints WHERE partner = ? AND url = ?",
            )
            .bind(partner)
            .bind(url)
            .fetch_optional(&self.pool)
            .await?;
            Ok(found.is_some())
        }))
    }

    fn add_endpoint<'a>(
        &'a self,
        kind: Endpoints,
        partner: Option<&'a str>,
        url: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let (partner, url) = (partner.map(str::to_owned), url.to_owned());
            self.keep(move |conn| {
                let added = match kind {
                    Endpoints::Callback => conn
                        .prepare_cached(
                            "INSERT INTO callback_endpoints (partner, url, created_at) \
                         VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                        )?
                        .execute(rusqlite::params![
                            partner.as_deref().unwrap_or(""),
                            url,
                            millis(now)
                        ])?,
                    Endpoints::Push => {
                        conn.prepare_cached(
                            "INSERT INTO push_endpoints (url, created_at) VALUES (?1, ?2) \
                             ON CONFLICT DO NOTHING",
                        )?
                        .execute(rusqlite::params![url, millis(now)])?;
                        conn.prepare_cached(
                            "INSERT INTO push_endpoint_grants (url, principal) VALUES (?1, ?2) \
                             ON CONFLICT DO NOTHING",
                        )?
                        .execute(rusqlite::params![url, partner.as_deref().unwrap_or("*")])?
                    }
                };
                Ok((added == 1, Wakes::NONE))
            })
            .await
        })
    }

    fn remove_endpoint<'a>(
        &'a self,
        kind: Endpoints,
        partner: Option<&'a str>,
        url: &'a str,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let (partner, url) = (partner.map(str::to_owned), url.to_owned());
            self.keep(move |conn| {
                let removed = match (kind, partner) {
                    (Endpoints::Callback, partner) => conn
                        .prepare_cached(
                            "DELETE FROM callback_endpoints WHERE partner = ?1 AND url = ?2",
                        )?
                        .execute(rusqlite::params![partner.unwrap_or_default(), url])?,
                    (Endpoints::Push, Some(principal)) => {
                        let removed = conn
                            .prepare_cached(
                                "DELETE FROM push_endpoint_grants \
                                 WHERE url = ?1 AND principal = ?2",
                            )?
                            .execute(rusqlite::params![url, principal])?;
                        conn.prepare_cached(
                            "DELETE FROM push_endpoints WHERE url = ?1 AND NOT EXISTS \
                             (SELECT 1 FROM push_endpoint_grants WHERE url = ?1)",
                        )?
                        .execute([&url])?;
                        removed
                    }
                    (Endpoints::Push, None) => {
                        conn.prepare_cached("DELETE FROM push_endpoint_grants WHERE url = ?1")?
                            .execute([&url])?;
                        conn.prepare_cached("DELETE FROM push_endpoints WHERE url = ?1")?
                            .execute([&url])?
                    }
                };
                Ok((removed == 1, Wakes::NONE))
            })
            .await
        })
    }

    fn callback_endpoints<'a>(
        &'a self,
    ) -> StoreFuture<'a, Result<Vec<(String, String)>, StoreError>> {
        Box::pin(self.durable(async move {
            let rows =
                sqlx::query("SELECT partner, url FROM callback_endpoints ORDER BY partner, url")
                    .fetch_all(&self.pool)
                    .await?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        }))
    }

    fn due_callbacks<'a>(
        &'a self,
        now: DateTime<Utc>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<PendingCallback>, StoreError>> {
        Box::pin(self.durable(async move {
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
        }))
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
            let (partner, endpoint, replies) =
                (partner.to_owned(), endpoint.to_owned(), replies.to_vec());
            self.keep(move |conn| {
                for r in &replies {
                    let reply = CallbackRow {
                        group_id: r.group_id.as_str(),
                        from: r.range.map(|x| x.from() as i64),
                        to: r.range.map(|x| x.to() as i64),
                        fault: r.fault,
                    };
                    insert_callback(
                        conn,
                        &partner,
                        &endpoint,
                        soap12,
                        &reply,
                        millis(expiry),
                        millis(now),
                    )?;
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
            let (partner, key) = (partner.to_owned(), key.clone());
            let keep_until = crate::rmp::receive_plan::fault_notice_until(expiry, now);
            self.keep(move |conn| {
                batch::insert_fault(conn, &partner, &key.group_id, key.number, code, keep_until)?;
                Ok(((), Wakes::NONE))
            })
            .await
        })
    }

    fn poll_answer<'a>(
        &'a self,
        partner: &'a str,
        refs: &'a [RefToMessageIds],
    ) -> StoreFuture<'a, Result<Option<Response>, StoreError>> {
        Box::pin(self.durable(async move {
            self.flush().await?;
            // Each group once, however many references name it; two reads in all, not two per
            // reference.
            let asked = Asked::new(refs);
            let ids = serde_json::json!(asked.group_ids().map(GroupId::as_str).collect::<Vec<_>>())
                .to_string();
            let rows_of_groups: Vec<i64> = asked
                .group_ids()
                .flat_map(|g| self.shared.groups.rows(partner, g.as_str()))
                .collect();
            let mut states = HashMap::new();
            let rows = sqlx::query(
                "SELECT group_id, state, state_bin FROM groups \
             WHERE partner = ? AND id IN (SELECT value FROM json_each(?)) \
             AND group_id IN (SELECT value FROM json_each(?))",
            )
            .bind(partner)
            .bind(serde_json::json!(rows_of_groups).to_string())
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
        }))
    }

    fn next_callback_due<'a>(
        &'a self,
    ) -> StoreFuture<'a, Result<Option<DateTime<Utc>>, StoreError>> {
        Box::pin(self.durable(async move {
            let ms: Option<i64> =
                sqlx::query_scalar("SELECT MIN(next_attempt) FROM pending_callbacks")
                    .fetch_one(&self.pool)
                    .await?;
            Ok(ms.map(from_millis))
        }))
    }

    fn callbacks_sent<'a>(&'a self, ids: &'a [i64]) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let ids = ids.to_vec();
            self.keep(move |conn| {
                let mut delete =
                    conn.prepare_cached("DELETE FROM pending_callbacks WHERE id = ?1")?;
                for id in &ids {
                    delete.execute([id])?;
                }
                Ok(((), Wakes::NONE))
            })
            .await
        })
    }

    fn callbacks_failed<'a>(
        &'a self,
        ids: &'a [i64],
        next: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
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
        })
    }
}
