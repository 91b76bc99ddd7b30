//! One writer transaction's view of the receiver tables: each group the batch touches is read
//! once and written once (when the batch ends, or before a job that reads the tables itself),
//! and the receive and sweep plans (`rmp::receive_plan`) are applied with primitive statements
//! on the writer's own connection, all prepared once and cached.

use foldhash::{HashMap, HashMapExt as _};

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, params};

use super::group_index::{GroupIndex, IndexChanges};
use super::group_rows::{self, GroupRow};
use super::group_state;
use super::warm_groups::WarmGroups;
use crate::rmp::group::{GroupState, GroupStatus, Policy};
use crate::rmp::quota::{SourceRates, SourceRoom};
use crate::rmp::receive_plan::{
    GroupWrite, OwedCallback, ReceivePlan, SweepPlan, plan_abort, plan_receive, plan_sweep,
};
use crate::rmp::receiver::{Action, Incoming, starts_counted_group};
use crate::store::error::StoreError;
use crate::store::received::{Payload, Received, ReceivedMessage, SweepReport};
use crate::store::source_usage::{self, UsageChanges};
use crate::store::time::millis;
use crate::wsr::{GroupId, MessageKey};

/// Most groups one sweep pass handles; the rest are due again at once.
const SWEEP_BATCH: i64 = 500;

/// Payloads above this are written with incremental blob I/O in chunks of this size, so that
/// neither SQLite nor the driver holds a second full copy of a big message.
pub(super) const BLOB_CHUNK: usize = 256 * 1024;

/// A group as this batch sees it.
struct Slot {
    /// Its row, once stored (read, or inserted by this batch).
    id: Option<i64>,
    /// As read, or as written by an earlier job of the batch; an unreadable stored state is
    /// kept as its reason, to fail only the jobs that touch it.
    state: Result<Option<GroupState>, String>,
    /// The status its row holds (as read, or as last written by this batch): a write that
    /// keeps it leaves the row's status, and so the index of open groups, alone.
    stored_status: Option<GroupStatus>,
    /// Staged write: (next deadline, updated at, source), when the batch changed the group.
    write: Option<(Option<i64>, i64, String)>,
}

/// What the batch's commit makes possible, announced only after it.
#[derive(Default)]
pub(super) struct Effects {
    /// Buffered messages delivered, by (partner, key): their held requests may answer.
    pub(super) delivered: Vec<(String, MessageKey)>,
    pub(super) wakes: super::shared::Wakes,
    /// The earliest group deadline written (Unix ms).
    pub(super) earliest_deadline: Option<i64>,
    /// Group rows inserted and deleted, for the key index to settle after the commit.
    pub(super) index: IndexChanges,
}

impl Effects {
    fn deadline(&mut self, d: Option<i64>) {
        if let Some(d) = d {
            self.earliest_deadline = Some(self.earliest_deadline.map_or(d, |e| e.min(d)));
        }
    }
}

pub(super) struct Batch<'c> {
    conn: &'c Connection,
    index: &'c GroupIndex,
    /// Open sequenced groups as the writer's earlier batches left them: taken out when read
    /// here, put back by `flush`.
    warm: &'c mut WarmGroups,
    /// By partner, then group id (two partners' groups of one id are two groups): looked up
    /// by `&str` without building a key. This batch's maps hash with foldhash, not SipHash:
    /// they hold at most one batch's groups, so keys chosen to collide could only slow one
    /// batch, and a group is looked up several times per message.
    groups: HashMap<String, HashMap<String, Slot>>,
    /// Groups this batch opened and has not written yet, per source (the quota's count).
    opened_unwritten: HashMap<String, u64>,
    /// Bytes stored per source as this batch changes them, written by `flush`.
    usage: UsageChanges,
    pub(super) effects: Effects,
}

impl<'c> Batch<'c> {
    pub(super) fn new(
        conn: &'c Connection,
        index: &'c GroupIndex,
        warm: &'c mut WarmGroups,
    ) -> Batch<'c> {
        Batch {
            conn,
            index,
            warm,
            groups: HashMap::new(),
            opened_unwritten: HashMap::new(),
            usage: UsageChanges::default(),
            effects: Effects::default(),
        }
    }

    fn slot(&mut self, partner: &str, group_id: &str) -> Result<&mut Slot, StoreError> {
        let known = self
            .groups
            .get(partner)
            .is_some_and(|g| g.contains_key(group_id));
        if !known {
            let found = match self.warm.take(partner, group_id) {
                Some(kept) => Some(kept),
                None => group_rows::find(self.conn, self.index, (partner, group_id))?,
            };
            let slot = match found {
                Some(stored) => Slot {
                    id: Some(stored.id),
                    stored_status: stored.state.as_ref().ok().map(|s| s.status),
                    state: stored.state.map(Some),
                    write: None,
                },
                None => Slot {
                    id: None,
                    state: Ok(None),
                    stored_status: None,
                    write: None,
                },
            };
            self.groups
                .entry(partner.to_owned())
                .or_default()
                .insert(group_id.to_owned(), slot);
        }
        self.groups
            .get_mut(partner)
            .and_then(|g| g.get_mut(group_id))
            .ok_or_else(|| StoreError::Failed("group slot vanished".into()))
    }

    /// Plans one message against its group as of this point of the batch. `Ok(Err)`: the job
    /// fails alone before writing anything (unreadable state, a panic); the outer error fails
    /// the batch.
    pub(super) fn plan(
        &mut self,
        m: &ReceivedMessage,
        policy: &Policy,
        rates: &mut SourceRates,
        #[cfg(feature = "test-hooks")] doomed: bool,
    ) -> Result<Result<ReceivePlan, StoreError>, StoreError> {
        let request = &m.request;
        let group_id = request.message_id.group_id.as_str();
        let opens = match &self.slot(&m.partner, group_id)?.state {
            Ok(stored) => stored.is_none(),
            Err(why) => {
                tracing::error!(reason = %why, "message refused: its group's stored state is unreadable");
                return Ok(Err(StoreError::Corrupt(why.clone())));
            }
        };
        // Counted only when the message would open a group: one indexed count, not per message.
        let open_groups_of_source = if opens && starts_counted_group(request) {
            self.open_groups_of(&m.source)?
        } else {
            0
        };
        let room = self.room_of(m, rates)?;
        let stored = match &self.slot(&m.partner, group_id)?.state {
            Ok(stored) => stored.as_ref(),
            Err(_) => None,
        };
        let planned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            #[cfg(feature = "test-hooks")]
            if doomed {
                panic!("injected panic (test hook)");
            }
            plan_receive(
                stored,
                Incoming {
                    request,
                    channel: &m.channel,
                    body_bytes: m.payload.len() as u64,
                    open_groups_of_source,
                    room,
                },
                m.now,
                policy,
            )
        }));
        if let Ok(plan) = &planned
            && plan.action != Action::Drop
        {
            rates.take(&m.source, m.quota.max_messages_per_second, m.now, 1);
        }
        Ok(planned.map_err(|p| StoreError::Panicked(crate::store::error::panic_message(&*p))))
    }

    /// What `m`'s source may still store, as of this point of the batch.
    fn room_of(&self, m: &ReceivedMessage, rates: &SourceRates) -> Result<SourceRoom, StoreError> {
        let quota = m.source_quota();
        let stored_bytes = if quota.max_stored_bytes > 0 {
            let stored: i64 = self
                .conn
                .prepare_cached("SELECT bytes FROM source_usage WHERE source = ?1")?
                .query_row([&m.source], |r| r.get(0))
                .optional()?
                .unwrap_or(0);
            source_usage::after(stored, self.usage.of(&m.source))
        } else {
            0
        };
        Ok(SourceRoom {
            quota,
            stored_bytes,
            rate_allows: rates.allows(&m.source, quota.max_messages_per_second, m.now, 0),
        })
    }

    /// Applies a message's plan. A `Corrupt` error (a buffered message the state names is
    /// missing) leaves the transaction usable; the caller undoes the job with a savepoint.
    pub(super) fn apply(
        &mut self,
        m: &ReceivedMessage,
        plan: ReceivePlan,
    ) -> Result<Received, StoreError> {
        let conn = self.conn;
        let key = m.request.key();
        let partner = m.partner.as_str();
        let group_id = key.group_id.as_str();
        let number = key.number.map(|n| n as i64);
        let expiry = millis(m.request.expiry_time);
        let now = millis(m.now);
        match plan.action {
            Action::Deliver if m.inbox => {
                insert_message(conn, Held::Delivered, m, number, now, expiry)?;
                self.usage.stored(&m.source, m.payload.len() as u64);
                self.effects.wakes.appended = true;
            }
            Action::Deliver => {}
            Action::Buffer => {
                insert_message(conn, Held::Buffered, m, number, now, expiry)?;
                self.usage.stored(&m.source, m.payload.len() as u64);
            }
            Action::Drop => {}
        }
        for n in &plan.release {
            release_buffered(conn, partner, &key.group_id, *n)?;
            self.effects.wakes.appended = true;
            self.effects.delivered.push((
                partner.to_owned(),
                MessageKey {
                    group_id: key.group_id.clone(),
                    number: Some(*n),
                },
            ));
        }
        discard_buffered(conn, partner, group_id, &plan.discard, &mut self.usage)?;
        for c in &plan.callbacks {
            owe_callback(conn, partner, group_id, c, m.soap12, now)?;
            self.effects.wakes.callbacks = true;
        }
        if let Some(f) = &plan.poll_fault {
            insert_fault(conn, partner, &key.group_id, f.number, f.code, f.keep_until)?;
        }
        if let Some(write) = plan.group {
            self.stage(partner, write, &m.source, now)?;
        }
        Ok(Received {
            verdict: plan.verdict,
            action: plan.action,
            held_back: plan.held_back,
        })
    }

    fn stage(
        &mut self,
        partner: &str,
        write: GroupWrite,
        source: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        let deadline = write.deadline.map(millis);
        let opened_here = write.state.status == GroupStatus::Open;
        let slot = self.slot(partner, write.state.group_id.as_str())?;
        let was_new = matches!(slot.state, Ok(None)) && slot.write.is_none();
        slot.state = Ok(Some(write.state));
        slot.write = Some((deadline, now, source.to_owned()));
        if was_new && opened_here {
            *self.opened_unwritten.entry(source.to_owned()).or_default() += 1;
        }
        self.effects.deadline(deadline);
        Ok(())
    }

    /// How many groups `source` has open as of this point of the batch.
    fn open_groups_of(&self, source: &str) -> Result<u64, StoreError> {
        let stored: i64 = self
            .conn
            .prepare_cached("SELECT count(*) FROM groups WHERE source = ?1 AND status = 'open'")?
            .query_row([source], |r| r.get(0))?;
        let unwritten = self.opened_unwritten.get(source).copied().unwrap_or(0);
        Ok(u64::try_from(stored).unwrap_or(0).saturating_add(unwritten))
    }

    /// Writes the staged group states and lets go of what was read (the next job may change
    /// groups behind the batch's back): the open sequenced groups go to the warm map, as this
    /// transaction leaves them.
    pub(super) fn flush(&mut self) -> Result<(), StoreError> {
        let (conn, index) = (self.conn, self.index);
        let mut encoded = Vec::new();
        let slots = self
            .groups
            .iter_mut()
            .flat_map(|(p, g)| g.iter_mut().map(move |(id, slot)| (p, id, slot)));
        for (partner, group_id, slot) in slots {
            let (Some((deadline, updated_at, source)), Ok(Some(state))) =
                (slot.write.take(), &slot.state)
            else {
                continue;
            };
            encoded.clear();
            group_state::encode(state, &mut encoded);
            let row = GroupRow {
                status: state.status.as_str(),
                deadline,
                updated_at,
                state_bin: &encoded,
            };
            match slot.id {
                Some(id) => {
                    let stored = slot.stored_status.map(GroupStatus::as_str);
                    group_rows::update(conn, id, &row, stored)?;
                }
                None => {
                    let pair = (partner.as_str(), group_id.as_str());
                    let id = group_rows::insert(conn, pair, &state.params.channel, &source, &row)?;
                    let key = index.key(pair.0, pair.1);
                    self.effects.index.inserted(index, key, id);
                    slot.id = Some(id);
                }
            }
            slot.stored_status = Some(state.status);
        }
        self.opened_unwritten.clear();
        write_usage(conn, &self.usage)?;
        self.usage.clear();
        for (partner, groups) in self.groups.drain() {
            for (group_id, slot) in groups {
                if let (Some(id), Ok(Some(state))) = (slot.id, slot.state) {
                    self.warm.keep(&partner, &group_id, id, state);
                }
            }
        }
        Ok(())
    }

    /// Before a job that may write groups by statements of its own (a sweep, a change): what
    /// the warm map holds may no longer be what is stored.
    pub(super) fn forget_warm_groups(&mut self) {
        self.warm.forget_all();
    }

    /// Applies every group deadline due at `now` and drops callback acks and fault notices
    /// that expired. Runs with nothing staged.
    pub(super) fn sweep(
        &mut self,
        now: DateTime<Utc>,
        policy: &Policy,
    ) -> Result<SweepReport, StoreError> {
        let conn = self.conn;
        let now_ms = millis(now);
        let due: Vec<(i64, String, String, Result<GroupState, String>)> = {
            let mut select = conn.prepare_cached(
                "SELECT id, partner, group_id, state, state_bin FROM groups \
                 WHERE next_deadline <= ?1 ORDER BY next_deadline LIMIT ?2",
            )?;
            let rows = select.query_map(params![now_ms, SWEEP_BATCH], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    group_state::decode_row(r.get_ref(3)?, r.get_ref(4)?),
                ))
            })?;
            rows.collect::<Result<_, _>>()?
        };
        let mut report = SweepReport::default();
        let mut freed = UsageChanges::default();
        for (id, partner, group_id, state) in due {
            let state = match state {
                Ok(state) => state,
                Err(why) => {
                    // One unreadable row must not stop every other group's deadlines: take it
                    // out of the sweep (kept for an operator to inspect) and go on.
                    tracing::error!(%partner, %group_id, reason = %why, "unreadable group state; no longer swept");
                    group_rows::stop_sweeping(conn, id)?;
                    continue;
                }
            };
            match plan_sweep(state, now, policy) {
                SweepPlan::Rearm(write) => write_now(conn, id, &write, now_ms)?,
                SweepPlan::Changed {
                    group,
                    discard,
                    callbacks,
                } => {
                    let ended = Ended {
                        id,
                        partner: &partner,
                        group_id: &group_id,
                    };
                    let wakes = &mut self.effects.wakes;
                    ended.apply(
                        conn, &group, &discard, &callbacks, now_ms, &mut freed, wakes,
                    )?;
                    report.changed += 1;
                    report.discarded += discard.len();
                }
                SweepPlan::Purge => {
                    group_rows::delete(conn, id)?;
                    let key = self.index.key(&partner, &group_id);
                    self.effects.index.deleted(key, id);
                    let mut purge = conn.prepare_cached(
                        "DELETE FROM buffered WHERE partner = ?1 AND group_id = ?2 \
                         RETURNING source, size",
                    )?;
                    let mut gone = purge.query(params![partner, group_id])?;
                    while let Some(row) = gone.next()? {
                        let (source, size): (String, i64) = (row.get(0)?, row.get(1)?);
                        freed.freed(&source, u64::try_from(size).unwrap_or(0));
                    }
                    report.purged += 1;
                }
            }
        }
        write_usage(conn, &freed)?;
        conn.prepare_cached("DELETE FROM pending_callbacks WHERE expiry < ?1")?
            .execute([now_ms])?;
        conn.prepare_cached("DELETE FROM message_faults WHERE expiry < ?1")?
            .execute([now_ms])?;
        conn.prepare_cached("DELETE FROM minute_counts WHERE minute < ?1")?
            .execute([now_ms - crate::store::overview::MINUTE_COUNTS_KEPT_MS])?;
        Ok(report)
    }
}

/// A group that ended abnormally (swept or aborted by an operator), as its row names it.
struct Ended<'a> {
    id: i64,
    partner: &'a str,
    group_id: &'a str,
}

impl Ended<'_> {
    /// Writes a `SweepPlan::Changed`: the buffered messages discarded, their callbacks owed,
    /// the group's new state.
    #[allow(clippy::too_many_arguments)]
    fn apply(
        &self,
        conn: &Connection,
        group: &GroupWrite,
        discard: &[u64],
        callbacks: &[OwedCallback],
        now_ms: i64,
        freed: &mut UsageChanges,
        wakes: &mut super::shared::Wakes,
    ) -> Result<(), StoreError> {
        discard_buffered(conn, self.partner, self.group_id, discard, freed)?;
        // Senders of discarded messages learn by callback in SOAP 1.1, the version every
        // peer accepts; their own version is not kept for buffered messages.
        for c in callbacks {
            owe_callback(conn, self.partner, self.group_id, c, false, now_ms)?;
            wakes.callbacks = true;
        }
        // The sweeper reads the next deadline itself after its pass (and after an abort,
        // `deadlines_changed` wakes it).
        write_now(conn, self.id, group, now_ms)
    }
}

/// An operator's abort of `partner`'s open sequenced group `group_id` (`plan_abort`), on the
/// writer's connection with nothing staged: whether there was such a group to abort, and
/// whom the commit wakes.
pub(super) fn abort_group(
    conn: &Connection,
    partner: &str,
    group_id: &str,
    now: DateTime<Utc>,
    policy: &Policy,
) -> Result<(bool, super::shared::Wakes), StoreError> {
    let mut wakes = super::shared::Wakes::NONE;
    let row = conn
        .prepare_cached(
            "SELECT id, state, state_bin FROM groups WHERE partner = ?1 AND group_id = ?2",
        )?
        .query_row(params![partner, group_id], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                group_state::decode_row(r.get_ref(1)?, r.get_ref(2)?),
            ))
        })
        .optional()?;
    let Some((id, state)) = row else {
        return Ok((false, wakes));
    };
    let state = state.map_err(StoreError::Corrupt)?;
    let Some(SweepPlan::Changed {
        group,
        discard,
        callbacks,
    }) = plan_abort(state, now, policy)
    else {
        return Ok((false, wakes));
    };
    let mut freed = UsageChanges::default();
    let ended = Ended {
        id,
        partner,
        group_id,
    };
    let now_ms = millis(now);
    ended.apply(
        conn, &group, &discard, &callbacks, now_ms, &mut freed, &mut wakes,
    )?;
    write_usage(conn, &freed)?;
    Ok((true, wakes))
}

/// Writes a swept group's state at once (the sweep runs alone, nothing staged).
fn write_now(conn: &Connection, id: i64, write: &GroupWrite, now: i64) -> Result<(), StoreError> {
    let mut encoded = Vec::new();
    group_state::encode(&write.state, &mut encoded);
    let row = GroupRow {
        status: write.state.status.as_str(),
        deadline: write.deadline.map(millis),
        updated_at: now,
        state_bin: &encoded,
    };
    group_rows::update(conn, id, &row, None)
}

/// Where a received message is written: the inbox (delivered), or the buffer of an ordered
/// group (waiting ahead of a gap). The two tables hold the same columns.
#[derive(Clone, Copy)]
enum Held {
    Delivered,
    Buffered,
}

/// Writes a received message to the inbox or the buffer. A big payload goes in as a zero blob
/// filled in chunks (incremental blob I/O); the payload column is the record's last, so SQLite
/// never builds the full value in memory.
fn insert_message(
    conn: &Connection,
    held: Held,
    m: &ReceivedMessage,
    number: Option<i64>,
    now: i64,
    expiry: i64,
) -> Result<(), StoreError> {
    let (table, sql) = match held {
        Held::Delivered => (
            "inbox",
            "INSERT INTO inbox (partner, group_id, number, channel, topic, namespaces, \
             received_at, expiry, source, size, payload) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        ),
        Held::Buffered => (
            "buffered",
            "INSERT INTO buffered (partner, group_id, number, channel, topic, namespaces, \
             received_at, expiry, source, size, payload) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        ),
    };
    conn.prepare_cached(sql)?.execute(params![
        m.partner,
        m.request.message_id.group_id.as_str(),
        number,
        m.channel,
        m.topic,
        m.namespaces,
        now,
        expiry,
        m.source,
        m.payload.len() as i64,
        PayloadParam::of(&m.payload)
    ])?;
    PayloadParam::finish(conn, table, &m.payload)
}

/// How a payload is bound: as text when small, as a zero blob of its length when big (filled
/// right after the insert by `finish`, in chunks, so that no second full copy is made).
enum PayloadParam<'a> {
    Text(&'a str),
    Big(rusqlite::blob::ZeroBlob),
}

impl PayloadParam<'_> {
    fn of(payload: &Payload) -> PayloadParam<'_> {
        if payload.len() > BLOB_CHUNK {
            PayloadParam::Big(rusqlite::blob::ZeroBlob(
                i32::try_from(payload.len()).unwrap_or(i32::MAX),
            ))
        } else {
            PayloadParam::Text(payload.as_str())
        }
    }

    /// After the insert of `table`'s row: writes a big payload into its zero blob.
    fn finish(conn: &Connection, table: &str, payload: &Payload) -> Result<(), StoreError> {
        if payload.len() > BLOB_CHUNK {
            write_blob(conn, table, conn.last_insert_rowid(), payload)?;
        }
        Ok(())
    }
}

impl rusqlite::ToSql for PayloadParam<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        match self {
            PayloadParam::Text(text) => text.to_sql(),
            PayloadParam::Big(zero) => zero.to_sql(),
        }
    }
}

/// Fills the zero blob of `table`'s row `rowid` with `payload`, one chunk at a time.
fn write_blob(
    conn: &Connection,
    table: &str,
    rowid: i64,
    payload: &Payload,
) -> Result<(), StoreError> {
    let mut blob = conn.blob_open(rusqlite::MAIN_DB, table, "payload", rowid, false)?;
    for (i, chunk) in payload.as_bytes().chunks(BLOB_CHUNK).enumerate() {
        blob.write_at(chunk, i * BLOB_CHUNK)?;
    }
    blob.close()?;
    Ok(())
}

/// Moves a buffered message into the inbox, keeping its original arrival data.
fn release_buffered(
    conn: &Connection,
    partner: &str,
    group_id: &GroupId,
    n: u64,
) -> Result<(), StoreError> {
    let moved = conn
        .prepare_cached(
            "INSERT INTO inbox (channel, topic, group_id, number, namespaces, received_at, \
             expiry, partner, source, size, payload) SELECT channel, topic, group_id, number, \
             namespaces, received_at, expiry, partner, source, size, payload FROM buffered \
             WHERE partner = ?1 AND group_id = ?2 AND number = ?3",
        )?
        .execute(params![partner, group_id.as_str(), n as i64])?;
    if moved != 1 {
        return Err(StoreError::Corrupt(format!(
            "buffered message {group_id}#{n} is missing"
        )));
    }
    // Still stored, in the inbox now: its source's bytes stay as they were.
    conn.prepare_cached(
        "DELETE FROM buffered WHERE partner = ?1 AND group_id = ?2 AND number = ?3",
    )?
    .execute(params![partner, group_id.as_str(), n as i64])?;
    Ok(())
}

/// Drops buffered messages of an aborted group; their bytes are freed for their sources.
fn discard_buffered(
    conn: &Connection,
    partner: &str,
    group_id: &str,
    numbers: &[u64],
    freed: &mut UsageChanges,
) -> Result<(), StoreError> {
    if numbers.is_empty() {
        return Ok(());
    }
    let mut delete = conn.prepare_cached(
        "DELETE FROM buffered WHERE partner = ?1 AND group_id = ?2 AND number = ?3 \
         RETURNING source, size",
    )?;
    for n in numbers {
        let gone: Option<(String, i64)> = delete
            .query_row(params![partner, group_id, *n as i64], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?;
        if let Some((source, size)) = gone {
            freed.freed(&source, u64::try_from(size).unwrap_or(0));
        }
    }
    Ok(())
}

/// Writes a transaction's changes of the bytes stored per source; a source left with
/// nothing stored loses its row.
pub(super) fn write_usage(conn: &Connection, changes: &UsageChanges) -> Result<(), StoreError> {
    for (source, delta) in changes.iter() {
        conn.prepare_cached(
            "INSERT INTO source_usage (source, bytes) VALUES (?1, max(?2, 0)) \
             ON CONFLICT (source) DO UPDATE SET bytes = max(bytes + ?2, 0)",
        )?
        .execute(params![source, delta])?;
        if delta < 0 {
            conn.prepare_cached("DELETE FROM source_usage WHERE source = ?1 AND bytes = 0")?
                .execute([source])?;
        }
    }
    Ok(())
}

/// Queues an ack or fault for `partner`'s Callback-pattern message.
fn owe_callback(
    conn: &Connection,
    partner: &str,
    group_id: &str,
    c: &OwedCallback,
    soap12: bool,
    now: i64,
) -> Result<(), StoreError> {
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
}

/// The message(s) a queued callback answers: a singleton (`from` and `to` `None`), one number
/// (`from`), or a range (`from` to `to`).
pub(super) struct CallbackRow<'a> {
    pub(super) group_id: &'a str,
    pub(super) from: Option<i64>,
    pub(super) to: Option<i64>,
    pub(super) fault: Option<crate::wsr::FaultCode>,
}

/// Queues one callback reply for `partner` at `endpoint`, kept until `keep_until` (Unix ms).
pub(super) fn insert_callback(
    conn: &Connection,
    partner: &str,
    endpoint: &str,
    soap12: bool,
    reply: &CallbackRow<'_>,
    keep_until: i64,
    now: i64,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO pending_callbacks (partner, endpoint, soap12, group_id, number, \
         number_to, fault, expiry, next_attempt) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?
    .execute(params![
        partner,
        endpoint,
        i64::from(soap12),
        reply.group_id,
        reply.from,
        reply.to,
        reply.fault.map(|f| f.local_name()),
        keep_until,
        now
    ])?;
    Ok(())
}

/// Remembers the fault of `partner`'s message for its sender's polls.
pub(super) fn insert_fault(
    conn: &Connection,
    partner: &str,
    group_id: &GroupId,
    number: Option<u64>,
    code: crate::wsr::FaultCode,
    keep_until: DateTime<Utc>,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO message_faults (partner, group_id, singleton, number, fault, expiry) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
         ON CONFLICT (partner, group_id, singleton, number) DO NOTHING",
    )?
    .execute(params![
        partner,
        group_id.as_str(),
        i64::from(number.is_none()),
        crate::rmp::group::slot(number) as i64,
        code.local_name(),
        millis(keep_until)
    ])?;
    Ok(())
}
