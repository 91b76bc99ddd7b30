//! A benchmark fixture: fills a store with delivered messages as if partners had sent them —
//! group states made by the receiver's own decisions, inbox rows — in bulk, so that the
//! growth benchmark (`wsr-gateway prefill`, then `bench`) and the restart time can be measured
//! on a big store without sending a million messages first.

use chrono::{DateTime, Duration, Utc};
use serde_json::{Value, json};

use super::group_json::{encode, millis};
use super::{Store, StoreError};
use crate::rmp::receiver::{Incoming, receive};
use crate::wsr::{GroupId, MessageId, ReplyPattern, Request, SequenceNum};

/// Rows per statement.
const CHUNK: usize = 2_000;

impl Store {
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
        let mut group_rows = Vec::new();
        let mut inbox_rows = Vec::new();
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
                };
                let outcome = receive(state.as_ref(), incoming, now, &policy);
                state = outcome.state;
                inbox_rows.push(json!([
                    channel,
                    format!("{channel}/Load"),
                    group_id.as_str(),
                    n,
                    payload,
                    "[]",
                    millis(now),
                    millis(expiry)
                ]));
                added += 1;
            }
            if let Some(state) = state {
                group_rows.push(json!([
                    state.group_id.as_str(),
                    channel,
                    state.status.as_str(),
                    state.next_deadline(&policy).map(millis),
                    millis(now),
                    encode(&state)
                ]));
            }
            if inbox_rows.len() >= CHUNK {
                self.write_prefill(&mut group_rows, &mut inbox_rows).await?;
            }
        }
        self.write_prefill(&mut group_rows, &mut inbox_rows).await?;
        Ok(added)
    }

    async fn write_prefill(
        &self,
        groups: &mut Vec<Value>,
        inbox: &mut Vec<Value>,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(
            "INSERT INTO inbox (channel, topic, group_id, number, payload, namespaces, \
             received_at, expiry) SELECT value->>0, value->>1, value->>2, value->>3, \
             value->>4, value->>5, value->>6, value->>7 FROM json_each(?) ORDER BY key",
        )
        .bind(Value::Array(std::mem::take(inbox)).to_string())
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO groups (group_id, channel, status, next_deadline, updated_at, state) \
             SELECT value->>0, value->>1, value->>2, value->>3, value->>4, value->>5 \
             FROM json_each(?) WHERE true",
        )
        .bind(Value::Array(std::mem::take(groups)).to_string())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }
}
