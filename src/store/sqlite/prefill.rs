//! A benchmark fixture: fills a store with delivered messages as if partners had sent them —
//! group states made by the receiver's own decisions, inbox rows — in bulk, so that the
//! growth benchmark (`wsr-gateway prefill`, then `bench`) and the restart time can be measured
//! on a big store without sending a million messages first.

use chrono::{DateTime, Duration, Utc};

use super::SqliteStore;
use super::decide::group_deadline;
use super::group_json::millis;
use super::staged::{InboxRow, Staged};
use super::writer::Effects;
use crate::rmp::receiver::{Incoming, receive};
use crate::store::{Payload, StoreError};
use crate::wsr::{GroupId, MessageId, ReplyPattern, Request, SequenceNum};

/// The source prefilled groups are counted against.
const PREFILL_SOURCE: &str = "prefill";

/// Rows per statement.
const CHUNK: usize = 2_000;

impl SqliteStore {
    /// Adds `groups` ordered groups of `per_group` delivered messages each (payload of
    /// `payload_bytes`), expiring a day after `now`. Returns how many messages were added.
    pub async fn prefill_delivered(
        &self,
        channel: &str,
        groups: u64,
        per_group: u64,
        payload_bytes: usize,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        let policy = self.policy().clone();
        let payload = format!(
            "<b:Load xmlns:b=\"urn:wsr-gateway:bench\">{}</b:Load>",
            "x".repeat(payload_bytes.saturating_sub(50))
        );
        let expiry = now + Duration::days(1);
        let run = now.timestamp_millis();
        let mut added = 0;
        let payload = Payload::from(payload);
        // The writer's own staging: the same rows and statements as real deliveries.
        let mut staged = Staged::default();
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
                };
                let outcome = receive(state.as_ref(), incoming, now, &policy);
                state = outcome.state;
                staged.append_inbox(InboxRow {
                    // Filled as if from anonymous callers.
                    partner: String::new(),
                    channel: channel.to_owned(),
                    topic: format!("{channel}/Load"),
                    group_id: group_id.as_str().to_owned(),
                    number: Some(n as i64),
                    payload: payload.clone(),
                    namespaces: "[]".into(),
                    received_at: millis(now),
                    expiry: millis(expiry),
                });
                added += 1;
                pending += 1;
            }
            if let Some(state) = state {
                let deadline = group_deadline(&state, &policy, now);
                staged.save_group(
                    "",
                    &state,
                    PREFILL_SOURCE,
                    deadline,
                    now,
                    &mut Effects::default(),
                );
            }
            if pending >= CHUNK {
                self.write_prefill(&mut staged).await?;
                pending = 0;
            }
        }
        self.write_prefill(&mut staged).await?;
        Ok(added)
    }

    async fn write_prefill(&self, staged: &mut Staged) -> Result<(), StoreError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        staged.flush(&mut tx).await?;
        tx.commit().await?;
        // Nothing reads these states again; do not keep a million of them.
        staged.forget();
        Ok(())
    }
}
