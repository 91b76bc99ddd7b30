//! A benchmark fixture: fills a store with delivered messages as if partners had sent them —
//! group states made by the receiver's own decisions, inbox rows — in bulk, so that the
//! growth benchmark (`wsr-gateway prefill`, then `bench`) and the restart time can be measured
//! on a big store without sending a million messages first.

use chrono::{DateTime, Duration, Utc};
use rusqlite::params;

use super::group_rows::{self, GroupRow};
use super::{SqliteStore, Wakes, group_state};
use crate::rmp::receive_plan::group_deadline;
use crate::rmp::receiver::{Incoming, receive};
use crate::store::backend::Backend as _;
use crate::store::error::StoreError;
use crate::store::future::StoreFuture;
use crate::store::prefill::Prefill;
use crate::store::time::millis;
use crate::wsr::{GroupId, MessageId, ReplyPattern, Request, SequenceNum};

/// The source prefilled groups are counted against.
const PREFILL_SOURCE: &str = "prefill";

/// Messages per transaction.
const CHUNK: u64 = 2_000;

/// One prefilled group: its id, encoded state, channel, status, deadline, and message count.
struct Group {
    id: String,
    state: Vec<u8>,
    status: &'static str,
    deadline: Option<i64>,
    messages: u64,
}

impl Prefill for SqliteStore {
    fn prefill_delivered<'a>(
        &'a self,
        channel: &'a str,
        groups: u64,
        per_group: u64,
        payload_bytes: usize,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, StoreError>> {
        Box::pin(self.fill_delivered(channel, groups, per_group, payload_bytes, now))
    }
}

impl SqliteStore {
    /// Adds `groups` ordered groups of `per_group` delivered messages each (payload of
    /// `payload_bytes`), expiring a day after `now`. Returns how many messages were added.
    async fn fill_delivered(
        &self,
        channel: &str,
        groups: u64,
        per_group: u64,
        payload_bytes: usize,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        let policy = self.policy().clone();
        let payload: std::sync::Arc<str> = format!(
            "<b:Load xmlns:b=\"urn:wsr-gateway:bench\">{}</b:Load>",
            "x".repeat(payload_bytes.saturating_sub(50))
        )
        .into();
        let expiry = now + Duration::days(1);
        let run = millis(now);
        let mut added = 0;
        let mut chunk = Vec::new();
        let mut pending = 0;
        for g in 0..groups {
            let group_id = GroupId::parse(&format!("mid:prefill-{run}-{g}@wsr-gateway"))
                .map_err(|e| StoreError::Failed(format!("prefill group id: {e}")))?;
            let mut state = None;
            for n in 0..per_group {
                let request = Request {
                    message_id: MessageId {
                        group_id: group_id.clone(),
                        sequence: Some(SequenceNum {
                            number: n,
                            last: false,
                            group_limit: None,
                        }),
                    },
                    expiry_time: expiry,
                    reply_pattern: ReplyPattern::Response,
                    ack_requested: true,
                    duplicate_elimination: true,
                    message_order: true,
                };
                let incoming = Incoming {
                    request: &request,
                    channel,
                    body_bytes: payload.len() as u64,
                    // The fixture is the operator's own filling, not a partner's.
                    open_groups_of_source: 0,
                    room: crate::rmp::quota::SourceRoom::UNLIMITED,
                };
                state = receive(state.as_ref(), incoming, now, &policy).state;
            }
            if let Some(state) = state {
                let mut encoded = Vec::new();
                group_state::encode(&state, &mut encoded);
                chunk.push(Group {
                    id: group_id.as_str().to_owned(),
                    state: encoded,
                    status: state.status.as_str(),
                    deadline: group_deadline(&state, &policy, now).map(millis),
                    messages: per_group,
                });
            }
            added += per_group;
            pending += per_group;
            if pending >= CHUNK {
                self.write_prefill(std::mem::take(&mut chunk), channel, &payload, now, expiry)
                    .await?;
                pending = 0;
            }
        }
        self.write_prefill(chunk, channel, &payload, now, expiry)
            .await?;
        Ok(added)
    }

    async fn write_prefill(
        &self,
        groups: Vec<Group>,
        channel: &str,
        payload: &std::sync::Arc<str>,
        now: DateTime<Utc>,
        expiry: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let (channel, payload) = (channel.to_owned(), payload.clone());
        let topic = format!("{channel}/Load");
        let shared = self.shared.clone();
        self.keep(move |conn| {
            let mut inbox = conn.prepare_cached(
                "INSERT INTO inbox (channel, topic, group_id, number, namespaces, received_at, \
                 expiry, partner, payload) VALUES (?1, ?2, ?3, ?4, '[]', ?5, ?6, '', ?7)",
            )?;
            for g in &groups {
                for n in 0..g.messages {
                    inbox.execute(params![
                        channel,
                        topic,
                        g.id,
                        n as i64,
                        millis(now),
                        millis(expiry),
                        &*payload
                    ])?;
                }
                let row = GroupRow {
                    status: g.status,
                    deadline: g.deadline,
                    updated_at: millis(now),
                    state_bin: &g.state,
                };
                let id = group_rows::insert(conn, ("", &g.id), &channel, PREFILL_SOURCE, &row)?;
                // Entered at once: should the transaction fail, an entry without its row is
                // harmless (group_index.rs).
                shared.groups.add(shared.groups.key("", &g.id), id);
            }
            Ok(((), Wakes::NONE))
        })
        .await
    }
}
