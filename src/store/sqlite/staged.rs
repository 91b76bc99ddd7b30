//! Group state and inbox rows of one writer batch, read and written in bulk: the group states
//! of all the batch's messages are read with one statement, and the inbox rows and group
//! states the batch produces are written with one statement each when the batch ends (or
//! before a job that reads those tables itself). Each statement costs a round trip to
//! SQLite's worker thread, so this is what lets one commit carry many messages cheaply.
//!
//! Rows go to SQLite as one JSON array bound to one parameter and unpacked with `json_each`:
//! one prepared statement whatever the batch size.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::Row;
use sqlx::sqlite::SqliteConnection;

use super::group_json::{decode, encode, millis};
use super::writer::Effects;
use crate::rmp::group::GroupState;
use crate::store::StoreError;

/// One inbox row to append.
pub(super) struct InboxRow {
    pub partner: String,
    pub channel: String,
    pub topic: String,
    pub group_id: String,
    pub number: Option<i64>,
    pub payload: crate::store::Payload,
    pub namespaces: String,
    pub received_at: i64,
    pub expiry: i64,
}

/// A receiver group: (partner, group id). Two partners' groups of one id are two groups.
pub(super) type GroupKey = (String, String);

/// Payloads above this go into the inbox one by one, bound as they are.
const BIG_PAYLOAD: usize = 64 * 1024;

/// Appends staged small inbox rows (JSON rows) with one statement.
async fn insert_small(
    conn: &mut SqliteConnection,
    rows: &mut Vec<Value>,
) -> Result<(), StoreError> {
    if rows.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO inbox (channel, topic, group_id, number, payload, namespaces, received_at, \
         expiry, partner) SELECT value->>0, value->>1, value->>2, value->>3, value->>4, \
         value->>5, value->>6, value->>7, value->>8 FROM json_each(?) ORDER BY key",
    )
    .bind(Value::Array(std::mem::take(rows)).to_string())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

#[derive(Default)]
pub(super) struct Staged {
    /// Group states as this batch sees them: read ahead, or written by an earlier job. An
    /// unreadable stored state is kept as its reason, to fail only the jobs that touch it.
    groups: HashMap<GroupKey, Result<Option<GroupState>, String>>,
    /// Group rows to write, latest state per group, in first-written order.
    group_rows: Vec<GroupKey>,
    group_values: HashMap<GroupKey, Value>,
    inbox: Vec<InboxRow>,
    /// Groups this batch opened and has not written yet, per source (the quota's count).
    opened_unwritten: HashMap<String, u64>,
}

impl Staged {
    /// Reads the stored state of every group in `ids` (partner, group id) with one
    /// statement.
    pub(super) async fn read_ahead(
        &mut self,
        conn: &mut SqliteConnection,
        ids: &[(&str, &str)],
    ) -> Result<(), StoreError> {
        let wanted: Vec<GroupKey> = ids
            .iter()
            .map(|&(p, g)| (p.to_owned(), g.to_owned()))
            .filter(|key| !self.groups.contains_key(key))
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        // CROSS JOIN keeps the wanted keys as the outer loop: one primary-key probe each.
        let rows = sqlx::query(
            "SELECT g.partner, g.group_id, g.state FROM json_each(?) AS j CROSS JOIN groups AS g \
             ON g.partner = j.value->>0 AND g.group_id = j.value->>1",
        )
        .bind(json!(wanted).to_string())
        .fetch_all(&mut *conn)
        .await?;
        for key in wanted {
            self.groups.insert(key, Ok(None));
        }
        for row in rows {
            let key: GroupKey = (row.get(0), row.get(1));
            let state = decode(row.get::<&str, _>(2)).map(Some);
            self.groups.insert(key, state);
        }
        Ok(())
    }

    /// The state of `partner`'s group as of this point of the batch.
    pub(super) async fn load_group(
        &mut self,
        conn: &mut SqliteConnection,
        partner: &str,
        group_id: &str,
    ) -> Result<Option<GroupState>, StoreError> {
        let key: GroupKey = (partner.to_owned(), group_id.to_owned());
        if !self.groups.contains_key(&key) {
            self.read_ahead(conn, &[(partner, group_id)]).await?;
        }
        match self.groups.get(&key) {
            Some(Ok(state)) => Ok(state.clone()),
            Some(Err(why)) => Err(StoreError::Corrupt(why.clone())),
            None => Ok(None),
        }
    }

    /// Stages the new state of `partner`'s group; `deadline` is when the sweeper must look at
    /// it next. `source` is recorded when the group is new (who opened it, for the quota).
    pub(super) fn save_group(
        &mut self,
        partner: &str,
        state: &GroupState,
        source: &str,
        deadline: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
        effects: &mut Effects,
    ) {
        let id: GroupKey = (partner.to_owned(), state.group_id.as_str().to_owned());
        let opened = matches!(self.groups.get(&id), Some(Ok(None)) | None)
            && state.status == crate::rmp::group::GroupStatus::Open;
        if opened {
            *self.opened_unwritten.entry(source.to_owned()).or_default() += 1;
        }
        let row = json!([
            partner,
            state.group_id.as_str(),
            state.params.channel,
            state.status.as_str(),
            deadline.map(millis),
            millis(now),
            encode(state),
            source,
        ]);
        if self.group_values.insert(id.clone(), row).is_none() {
            self.group_rows.push(id.clone());
        }
        self.groups.insert(id, Ok(Some(state.clone())));
        if let Some(d) = deadline.map(millis) {
            effects.earliest_deadline = Some(effects.earliest_deadline.map_or(d, |e| e.min(d)));
        }
    }

    pub(super) fn append_inbox(&mut self, row: InboxRow) {
        self.inbox.push(row);
    }

    /// Writes what is staged: inbox rows in the order they were staged (offsets follow it),
    /// then group states. The read-ahead stays valid (it now matches the tables).
    pub(super) async fn flush(&mut self, conn: &mut SqliteConnection) -> Result<(), StoreError> {
        // Offsets follow the staging order: a run of small rows goes as one statement, a big
        // row alone (bound as it is, not copied into JSON and out again).
        let mut small: Vec<Value> = Vec::new();
        for r in std::mem::take(&mut self.inbox) {
            if r.payload.len() <= BIG_PAYLOAD {
                small.push(json!([
                    r.channel,
                    r.topic,
                    r.group_id,
                    r.number,
                    r.payload.as_str(),
                    r.namespaces,
                    r.received_at,
                    r.expiry,
                    r.partner
                ]));
                continue;
            }
            insert_small(conn, &mut small).await?;
            sqlx::query(
                "INSERT INTO inbox (channel, topic, group_id, number, payload, namespaces, \
                 received_at, expiry, partner) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(r.channel)
            .bind(r.topic)
            .bind(r.group_id)
            .bind(r.number)
            .bind(r.payload.as_str())
            .bind(r.namespaces)
            .bind(r.received_at)
            .bind(r.expiry)
            .bind(r.partner)
            .execute(&mut *conn)
            .await?;
        }
        insert_small(conn, &mut small).await?;
        if !self.group_rows.is_empty() {
            let rows: Vec<Value> = self
                .group_rows
                .drain(..)
                .filter_map(|id| self.group_values.remove(&id))
                .collect();
            // `WHERE true`: SQLite needs it to tell the upsert's ON from a join's.
            sqlx::query(
                "INSERT INTO groups (partner, group_id, channel, status, next_deadline, updated_at, \
                 state, source) SELECT value->>0, value->>1, value->>2, value->>3, value->>4, \
                 value->>5, value->>6, value->>7 FROM json_each(?) WHERE true \
                 ON CONFLICT (partner, group_id) DO UPDATE SET \
                 status = excluded.status, next_deadline = excluded.next_deadline, \
                 updated_at = excluded.updated_at, state = excluded.state",
            )
            .bind(Value::Array(rows).to_string())
            .execute(&mut *conn)
            .await?;
        }
        self.opened_unwritten.clear();
        Ok(())
    }

    /// How many groups `source` has open as of this point of the batch: those stored, and
    /// those this batch opened but has not written yet.
    pub(super) async fn open_groups_of(
        &self,
        conn: &mut SqliteConnection,
        source: &str,
    ) -> Result<u64, StoreError> {
        let stored: i64 =
            sqlx::query_scalar("SELECT count(*) FROM groups WHERE source = ? AND status = 'open'")
                .bind(source)
                .fetch_one(&mut *conn)
                .await?;
        let unwritten = self.opened_unwritten.get(source).copied().unwrap_or(0);
        Ok(u64::try_from(stored).unwrap_or(0).saturating_add(unwritten))
    }

    /// Whether nothing is waiting to be written.
    pub(super) fn is_clear(&self) -> bool {
        self.inbox.is_empty() && self.group_rows.is_empty() && self.opened_unwritten.is_empty()
    }

    /// Forgets the read-ahead: the next job may change groups behind our back.
    pub(super) fn forget(&mut self) {
        self.groups.clear();
    }
}
