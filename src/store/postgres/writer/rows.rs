//! The writer's one statement: a batch's decisions gathered column by column and written, with
//! their announcement, in one call of `wsr_apply_received` (migration 0002). It decides
//! nothing and must never import the batch that calls it.

use sqlx::postgres::PgArguments;
use sqlx::query::QueryScalar;
use sqlx::{PgConnection, Postgres};

use super::decided::Decided;
use crate::rmp::group::slot;
use crate::rmp::receive_plan::{GroupWrite, OwedCallback, PollFault};
use crate::rmp::receiver::Action;
use crate::store::StoreError;
use crate::store::postgres::failure::Failure;
use crate::store::postgres::group_state::encode;
use crate::store::postgres::notify::{Announcement, notifications};
use crate::store::received::ReceivedMessage;
use crate::store::time::millis;
use crate::wsr::MessageKey;

/// The SQLSTATE `wsr_apply_received` raises when buffered messages its batch releases are not
/// there (a group and its buffer disagree: the store is corrupt).
const RELEASE_MISSING: &str = "WR001";

/// The constraint `wsr_apply_received` violates when a group its batch found unstored was
/// stored meanwhile (the batch is then decided again, as when a stored group changed).
const ONE_ROW_PER_GROUP: &str = "groups_partner_group_id_key";

/// The batch's writes, gathered column by column for `wsr_apply_received`'s arrays. Each set
/// of rows pushes all its columns together, so a set's arrays are of one length: the function
/// (migration 0017) looks only at a set's first array to skip a statement with no rows.
#[derive(Default)]
pub(super) struct Rows<'m> {
    /// Every group decided about, with the version of it the decision read (`None`: none
    /// was stored).
    decided_groups: DecidedGroups,
    discard: Triples,
    callbacks: CallbackRows,
    faults: FaultRows,
    new_groups: NewGroupRows,
    changed_groups: ChangedGroupRows,
    buffered: MessageRows<'m>,
    /// Delivered messages, with their offsets counted from 1 within the batch.
    delivered: MessageRows<'m>,
    /// Buffered messages released, and their offsets within the batch.
    released: Triples,
    released_offsets: Vec<i64>,
    /// Inbox offsets the batch takes: each delivered message, then what it released.
    pub(super) appended: i64,
}

#[derive(Default)]
struct DecidedGroups {
    partner: Vec<String>,
    group_id: Vec<String>,
    version: Vec<Option<i64>>,
}

#[derive(Default)]
struct Triples {
    partner: Vec<String>,
    group_id: Vec<String>,
    number: Vec<i64>,
}

impl Triples {
    fn push(&mut self, partner: &str, group_id: &str, number: u64) {
        self.partner.push(partner.to_owned());
        self.group_id.push(group_id.to_owned());
        self.number.push(number as i64);
    }
}

#[derive(Default)]
struct CallbackRows {
    partner: Vec<String>,
    endpoint: Vec<String>,
    soap12: Vec<bool>,
    group_id: Vec<String>,
    number: Vec<Option<i64>>,
    fault: Vec<Option<&'static str>>,
    expiry: Vec<i64>,
    next_attempt: Vec<i64>,
}

#[derive(Default)]
struct FaultRows {
    partner: Vec<String>,
    group_id: Vec<String>,
    singleton: Vec<bool>,
    number: Vec<i64>,
    fault: Vec<&'static str>,
    expiry: Vec<i64>,
}

#[derive(Default)]
struct NewGroupRows {
    partner: Vec<String>,
    group_id: Vec<String>,
    channel: Vec<String>,
    status: Vec<&'static str>,
    deadline: Vec<Option<i64>>,
    updated_at: Vec<i64>,
    source: Vec<String>,
    state: Vec<Vec<u8>>,
}

#[derive(Default)]
struct ChangedGroupRows {
    id: Vec<i64>,
    status: Vec<&'static str>,
    deadline: Vec<Option<i64>>,
    updated_at: Vec<i64>,
    state: Vec<Vec<u8>>,
}

/// Messages to insert into `buffered` or `inbox` (the inbox rows also carry offsets).
#[derive(Default)]
struct MessageRows<'m> {
    offset: Vec<i64>,
    partner: Vec<&'m str>,
    group_id: Vec<String>,
    number: Vec<Option<i64>>,
    channel: Vec<&'m str>,
    topic: Vec<&'m str>,
    namespaces: Vec<&'m str>,
    received_at: Vec<i64>,
    expiry: Vec<i64>,
    payload: Vec<&'m [u8]>,
    /// Who sent each (its bytes count against that source's quota, D13).
    source: Vec<&'m str>,
}

impl<'m> MessageRows<'m> {
    fn push(&mut self, m: &'m ReceivedMessage, offset: Option<i64>) {
        let key = m.request.key();
        if let Some(offset) = offset {
            self.offset.push(offset);
        }
        self.partner.push(&m.partner);
        self.group_id.push(key.group_id.as_str().to_owned());
        self.number.push(key.number.map(|n| n as i64));
        self.channel.push(&m.channel);
        self.topic.push(&m.topic);
        self.namespaces.push(&m.namespaces);
        self.received_at.push(millis(m.now));
        self.expiry.push(millis(m.request.expiry_time));
        self.payload.push(m.payload.as_bytes());
        self.source.push(&m.source);
    }
}

impl<'m> Rows<'m> {
    pub(super) fn add(&mut self, d: &Decided<'m>, announcement: &mut Announcement) {
        let m = d.message;
        let partner = m.partner.as_str();
        let group_id = d.group_id();
        let groups = &mut self.decided_groups;
        groups.partner.push(partner.to_owned());
        groups.group_id.push(group_id.clone());
        groups.version.push(d.group_version);
        for n in &d.plan.discard {
            self.discard.push(partner, &group_id, *n);
        }
        for c in &d.plan.callbacks {
            self.callbacks.push(m, &group_id, c);
            announcement.wakes.callbacks = true;
        }
        if let Some(f) = &d.plan.poll_fault {
            self.faults.push(partner, &group_id, f);
        }
        if let Some(write) = &d.plan.group {
            let deadline = write.deadline.map(millis);
            announcement.deadline(deadline);
            self.add_group(d, write, deadline);
        }
        if d.plan.action == Action::Buffer {
            self.buffered.push(m, None);
        }
        if d.delivers() && m.inbox {
            self.appended += 1;
            self.delivered.push(m, Some(self.appended));
        }
        let key = m.request.key();
        for n in &d.plan.release {
            self.appended += 1;
            self.released.push(partner, &group_id, *n);
            self.released_offsets.push(self.appended);
            announcement.delivered.push((
                m.partner.clone(),
                MessageKey {
                    group_id: key.group_id.clone(),
                    number: Some(*n),
                },
            ));
        }
    }

    /// The group `d` writes: a changed row when its group was stored, else a new one.
    fn add_group(&mut self, d: &Decided<'m>, write: &GroupWrite, deadline: Option<i64>) {
        let m = d.message;
        let now = millis(m.now);
        let mut encoded = Vec::new();
        encode(&write.state, &mut encoded);
        match d.group_row {
            Some(id) => {
                let rows = &mut self.changed_groups;
                rows.id.push(id);
                rows.status.push(write.state.status.as_str());
                rows.deadline.push(deadline);
                rows.updated_at.push(now);
                rows.state.push(encoded);
            }
            None => {
                let rows = &mut self.new_groups;
                rows.partner.push(m.partner.clone());
                rows.group_id.push(write.state.group_id.as_str().to_owned());
                rows.channel.push(write.state.params.channel.clone());
                rows.status.push(write.state.status.as_str());
                rows.deadline.push(deadline);
                rows.updated_at.push(now);
                rows.source.push(m.source.clone());
                rows.state.push(encoded);
            }
        }
    }

    /// Writes the batch and sends `announcement` in one call (see migration 0002): `false`,
    /// with nothing written, when a decided group is no longer the version its decision read.
    pub(super) async fn apply(
        &self,
        conn: &mut PgConnection,
        announcement: &Announcement,
    ) -> Result<bool, Failure> {
        let (channel, payloads) = notifications(announcement);
        // The arguments in the function's order: each set of rows binds its own columns.
        let query = sqlx::query_scalar::<_, bool>(
            "SELECT wsr_apply_received($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, \
             $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, \
             $30, $31, $32, $33, $34, $35, $36, $37, $38, $39, $40, $41, $42, $43, $44, $45, \
             $46, $47, $48, $49, $50, $51, $52, $53, $54, $55, $56, $57, $58, $59, $60, $61)",
        );
        let query = self.decided_groups.bind(query);
        let query = self.discard.bind(query);
        let query = self.callbacks.bind(query);
        let query = self.faults.bind(query);
        let query = self.changed_groups.bind(query);
        let query = self.new_groups.bind(query);
        let query = self.buffered.bind(query);
        let query = self.delivered.bind(query.bind(&self.delivered.offset));
        let query = self.released.bind(query.bind(&self.released_offsets));
        let applied = query
            .bind(self.appended)
            .bind(channel)
            .bind(&payloads)
            .fetch_one(conn)
            .await;
        match applied {
            Ok(applied) => Ok(applied),
            Err(e) => refused(e),
        }
    }
}

/// What a failed `wsr_apply_received` means: a group stored meanwhile (decide again:
/// `Ok(false)`), a corrupt store, or the database's own failure.
fn refused(e: sqlx::Error) -> Result<bool, Failure> {
    let Some(db) = e.as_database_error() else {
        return Err(e.into());
    };
    if db.constraint() == Some(ONE_ROW_PER_GROUP) {
        return Ok(false);
    }
    if db.code().as_deref() == Some(RELEASE_MISSING) {
        let why = db.message().to_owned();
        tracing::error!(reason = %why, "messages refused; their transaction rolled back");
        return Err(StoreError::Corrupt(why).into());
    }
    Err(e.into())
}

/// The one statement, as its arguments are bound.
type Apply<'q> = QueryScalar<'q, Postgres, bool, PgArguments>;

impl DecidedGroups {
    fn bind<'q>(&'q self, q: Apply<'q>) -> Apply<'q> {
        q.bind(&self.partner)
            .bind(&self.group_id)
            .bind(&self.version)
    }
}

impl Triples {
    fn bind<'q>(&'q self, q: Apply<'q>) -> Apply<'q> {
        q.bind(&self.partner)
            .bind(&self.group_id)
            .bind(&self.number)
    }
}

impl CallbackRows {
    fn push(&mut self, m: &ReceivedMessage, group_id: &str, c: &OwedCallback) {
        self.partner.push(m.partner.clone());
        self.endpoint.push(c.endpoint.clone());
        self.soap12.push(m.soap12);
        self.group_id.push(group_id.to_owned());
        self.number.push(c.number.map(|n| n as i64));
        self.fault.push(c.fault.map(|f| f.local_name()));
        self.expiry.push(millis(c.keep_until));
        self.next_attempt.push(millis(m.now));
    }

    fn bind<'q>(&'q self, q: Apply<'q>) -> Apply<'q> {
        q.bind(&self.partner)
            .bind(&self.endpoint)
            .bind(&self.soap12)
            .bind(&self.group_id)
            .bind(&self.number)
            .bind(&self.fault)
            .bind(&self.expiry)
            .bind(&self.next_attempt)
    }
}

impl FaultRows {
    fn push(&mut self, partner: &str, group_id: &str, f: &PollFault) {
        self.partner.push(partner.to_owned());
        self.group_id.push(group_id.to_owned());
        self.singleton.push(f.number.is_none());
        self.number.push(slot(f.number) as i64);
        self.fault.push(f.code.local_name());
        self.expiry.push(millis(f.keep_until));
    }

    fn bind<'q>(&'q self, q: Apply<'q>) -> Apply<'q> {
        q.bind(&self.partner)
            .bind(&self.group_id)
            .bind(&self.singleton)
            .bind(&self.number)
            .bind(&self.fault)
            .bind(&self.expiry)
    }
}

impl ChangedGroupRows {
    fn bind<'q>(&'q self, q: Apply<'q>) -> Apply<'q> {
        q.bind(&self.id)
            .bind(&self.status)
            .bind(&self.deadline)
            .bind(&self.updated_at)
            .bind(&self.state)
    }
}

impl NewGroupRows {
    fn bind<'q>(&'q self, q: Apply<'q>) -> Apply<'q> {
        q.bind(&self.partner)
            .bind(&self.group_id)
            .bind(&self.channel)
            .bind(&self.status)
            .bind(&self.deadline)
            .bind(&self.updated_at)
            .bind(&self.source)
            .bind(&self.state)
    }
}

impl MessageRows<'_> {
    /// Every column but the offsets (which only inbox rows have; the caller binds them).
    fn bind<'q>(&'q self, q: Apply<'q>) -> Apply<'q> {
        q.bind(&self.partner)
            .bind(&self.group_id)
            .bind(&self.number)
            .bind(&self.channel)
            .bind(&self.topic)
            .bind(&self.namespaces)
            .bind(&self.received_at)
            .bind(&self.expiry)
            .bind(&self.payload)
            .bind(&self.source)
    }
}
