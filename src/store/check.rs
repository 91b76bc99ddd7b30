//! `wsr-gateway check-store`: the invariants a store must hold for the gateway's promises to
//! stand — duplicates recognised, nothing buffered forgotten, nothing delivered twice — checked
//! row by row over a consistent snapshot (one read transaction), on a running gateway's store
//! or on a backup. This module holds the rules and the report; each backend's reads are in its
//! own `check.rs`, which feeds rows to a `Checker` and adds the findings of its SQL checks.

use std::collections::{BTreeSet, HashMap};

use crate::rmp::group::{GroupState, GroupStatus, slot};
use crate::rmp::ranges::RangeSet;

/// At most this many broken rows of one invariant are named; the count goes on.
pub const NAMED_PER_INVARIANT: usize = 20;

/// What each invariant means, in the order the report lists them.
pub const INVARIANTS: &[(&str, &str)] = &[
    (
        "integrity",
        "the database's own structure (SQLite: PRAGMA integrity_check)",
    ),
    (
        "group_state",
        "every group row's state can be read (else its duplicates and order are unknown)",
    ),
    (
        "inbox_group",
        "every inbox message that has not expired has its group row (a duplicate of it must \
         still be recognised)",
    ),
    (
        "inbox_received",
        "every inbox message that has not expired is recorded as received in its group's \
         state (else a duplicate of it would be stored again)",
    ),
    (
        "buffered_group",
        "every message buffered for a gap belongs to an open group that lists it (else it is \
         never delivered)",
    ),
    (
        "delivery_message",
        "every delivery (lease) row has its inbox message",
    ),
    (
        "delivery_subscription",
        "every delivery (lease) row has its subscription",
    ),
    (
        "delivery_cursor",
        "no delivery lies past its subscription's cursor (the message would be matched, and \
         delivered, again)",
    ),
    ("lease_holder", "every acquired lease names its consumer"),
    (
        "offset_counter",
        "the inbox's offset counter is at or past every stored offset (else an offset would be \
         handed out twice)",
    ),
    (
        "cursor_counter",
        "no subscription's cursor is past the inbox's offset counter (else new messages would \
         be skipped)",
    ),
];

/// One broken row: which invariant, the row (table and key) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub invariant: &'static str,
    pub row: String,
    pub why: String,
}

/// The outcome of a check: rows looked at and broken rows per invariant, and the broken rows
/// named (the first `NAMED_PER_INVARIANT` of each).
#[derive(Debug, Default)]
pub struct StoreCheck {
    /// The store, as it may be printed (a PostgreSQL URL without its password).
    pub store: String,
    checked: HashMap<&'static str, u64>,
    broken: HashMap<&'static str, u64>,
    pub findings: Vec<Finding>,
}

impl StoreCheck {
    pub fn new(store: String) -> StoreCheck {
        StoreCheck {
            store,
            ..StoreCheck::default()
        }
    }

    /// True when no invariant is broken.
    pub fn is_sound(&self) -> bool {
        self.broken.values().all(|n| *n == 0)
    }

    /// Broken rows of `invariant` (0 when none, or when it was not checked).
    pub fn broken(&self, invariant: &str) -> u64 {
        self.broken.get(invariant).copied().unwrap_or(0)
    }

    /// `rows` more rows were looked at for `invariant`.
    pub fn checked(&mut self, invariant: &'static str, rows: u64) {
        *self.checked.entry(invariant).or_default() += rows;
    }

    /// A broken row; named while fewer than `NAMED_PER_INVARIANT` of its kind were.
    pub fn found(&mut self, invariant: &'static str, row: String, why: String) {
        let broken = self.broken.entry(invariant).or_default();
        *broken += 1;
        if *broken as usize <= NAMED_PER_INVARIANT {
            self.findings.push(Finding {
                invariant,
                row,
                why,
            });
        }
    }
}

impl std::fmt::Display for StoreCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "store {}", self.store)?;
        for (name, meaning) in INVARIANTS {
            let Some(checked) = self.checked.get(name) else {
                continue;
            };
            let broken = self.broken(name);
            let verdict = if broken == 0 { "ok" } else { "BROKEN" };
            writeln!(
                f,
                "  {verdict:<6} {name:<22} {checked} checked, {broken} broken — {meaning}"
            )?;
            for finding in self.findings.iter().filter(|x| x.invariant == *name) {
                writeln!(f, "           {}: {}", finding.row, finding.why)?;
            }
            if broken as usize > NAMED_PER_INVARIANT {
                writeln!(
                    f,
                    "           … and {} more",
                    broken as usize - NAMED_PER_INVARIANT
                )?;
            }
        }
        if self.is_sound() {
            writeln!(f, "every invariant holds")
        } else {
            let broken: u64 = self.broken.values().sum();
            writeln!(f, "{broken} broken rows: this store is not sound")
        }
    }
}

/// The invariants SQL decides alone: (invariant, the rows looked at, the broken rows as
/// (row, why)). The text serves both backends (`"offset"` quoted, `||` on a text literal
/// first); `{counter}` is the backend's inbox offset counter as a scalar subquery.
pub const SQL_CHECKS: &[(&str, &str, &str)] = &[
    (
        "delivery_message",
        "SELECT COUNT(*) FROM deliveries",
        "SELECT 'deliveries (subscription ' || d.subscription_id || ', offset ' || d.\"offset\" \
         || ')', 'its inbox message is gone' FROM deliveries d WHERE NOT EXISTS \
         (SELECT 1 FROM inbox i WHERE i.\"offset\" = d.\"offset\") \
         ORDER BY d.subscription_id, d.\"offset\"",
    ),
    (
        "delivery_subscription",
        "SELECT COUNT(*) FROM deliveries",
        "SELECT 'deliveries (subscription ' || d.subscription_id || ', offset ' || d.\"offset\" \
         || ')', 'its subscription is gone' FROM deliveries d WHERE NOT EXISTS \
         (SELECT 1 FROM subscriptions s WHERE s.id = d.subscription_id) \
         ORDER BY d.subscription_id, d.\"offset\"",
    ),
    (
        "delivery_cursor",
        "SELECT COUNT(*) FROM deliveries",
        "SELECT 'deliveries (subscription ' || d.subscription_id || ', offset ' || d.\"offset\" \
         || ')', 'past its subscription''s cursor ' || s.cursor FROM deliveries d \
         JOIN subscriptions s ON s.id = d.subscription_id WHERE d.\"offset\" > s.cursor \
         ORDER BY d.subscription_id, d.\"offset\"",
    ),
    (
        "lease_holder",
        "SELECT COUNT(*) FROM deliveries WHERE state = 'acquired'",
        "SELECT 'deliveries (subscription ' || subscription_id || ', offset ' || \"offset\" \
         || ')', 'acquired by no consumer' FROM deliveries WHERE state = 'acquired' \
         AND (consumer IS NULL OR consumer = '') ORDER BY subscription_id, \"offset\"",
    ),
    (
        "offset_counter",
        "SELECT COUNT(*) FROM inbox",
        "SELECT 'inbox offset ' || i.\"offset\", 'beyond the offset counter ' || \
         COALESCE({counter}, 0) FROM inbox i WHERE i.\"offset\" > COALESCE({counter}, 0) \
         ORDER BY i.\"offset\"",
    ),
    (
        "cursor_counter",
        "SELECT COUNT(*) FROM subscriptions",
        "SELECT 'subscriptions id ' || s.id || ' (' || s.name || ')', 'cursor ' || s.cursor || \
         ' is past the offset counter ' || COALESCE({counter}, 0) FROM subscriptions s \
         WHERE s.cursor > COALESCE({counter}, 0) ORDER BY s.id",
    ),
];

/// Feeds `$checker` the inbox and buffered rows of one backend's transaction (`$tx`): the
/// same SQL on both (`"offset"` quoted); only the group rows are read by each backend itself,
/// since their state is stored differently.
macro_rules! feed_messages {
    ($tx:expr, $checker:expr) => {{
        use futures_util::TryStreamExt as _;
        {
            let mut inbox = sqlx::query_as::<_, (i64, String, String, Option<i64>, i64)>(
                "SELECT \"offset\", partner, group_id, number, expiry FROM inbox \
                 ORDER BY \"offset\"",
            )
            .fetch(&mut *$tx);
            while let Some((offset, partner, group_id, number, expiry)) = inbox.try_next().await? {
                $checker.inbox(offset, &partner, &group_id, number, expiry);
            }
        }
        let mut buffered = sqlx::query_as::<_, (String, String, i64)>(
            "SELECT partner, group_id, number FROM buffered ORDER BY partner, group_id, number",
        )
        .fetch(&mut *$tx);
        while let Some((partner, group_id, number)) = buffered.try_next().await? {
            $checker.buffered(&partner, &group_id, number);
        }
    }};
}
pub(in crate::store) use feed_messages;

/// Runs `SQL_CHECKS` on one backend's transaction (`$tx`, a `&mut` connection), with its
/// offset counter's subquery, into `$report`. A macro because the two drivers' row and
/// executor types differ while the code does not.
macro_rules! run_sql_checks {
    ($tx:expr, $counter:expr, $report:expr) => {{
        use futures_util::TryStreamExt as _;
        for (invariant, count, broken) in $crate::store::check::SQL_CHECKS {
            let counted: i64 = sqlx::query_scalar(*count).fetch_one(&mut *$tx).await?;
            $report.checked(invariant, u64::try_from(counted).unwrap_or(0));
            // Constant text with a constant subquery put in: nothing from outside.
            let sql = sqlx::AssertSqlSafe(broken.replace("{counter}", $counter));
            let mut rows = sqlx::query_as::<_, (String, String)>(sql).fetch(&mut *$tx);
            while let Some((row, why)) = rows.try_next().await? {
                $report.found(invariant, row, why);
            }
        }
    }};
}
pub(in crate::store) use run_sql_checks;

/// What the inbox and buffer rules need of a group.
struct KeptGroup {
    delivered: RangeSet,
    buffered: BTreeSet<u64>,
    open: bool,
}

/// The rules over rows that need the groups' decoded states: fed every group row first, then
/// the inbox and buffered rows (each backend reads them in its own snapshot).
pub struct Checker {
    now_ms: i64,
    groups: HashMap<(String, String), KeptGroup>,
    report: StoreCheck,
}

impl Checker {
    /// `now_ms`: the check's time (Unix ms); an inbox message whose ExpiryTime is before it
    /// may have outlived its group legitimately (D3: group state is kept until no duplicate
    /// can be accepted).
    pub fn new(report: StoreCheck, now_ms: i64) -> Checker {
        Checker {
            now_ms,
            groups: HashMap::new(),
            report,
        }
    }

    /// A group row with its decoded state (or why it cannot be decoded).
    pub fn group(
        &mut self,
        id: i64,
        partner: String,
        group_id: String,
        state: Result<GroupState, String>,
    ) {
        self.report.checked("group_state", 1);
        match state {
            Ok(state) => {
                let kept = KeptGroup {
                    delivered: state.delivered,
                    buffered: state.buffered.into_keys().collect(),
                    open: state.status == GroupStatus::Open,
                };
                self.groups.insert((partner, group_id), kept);
            }
            Err(e) => self.report.found(
                "group_state",
                format!("groups id {id} (partner '{partner}', group {group_id})"),
                format!("its state cannot be read: {e}"),
            ),
        }
    }

    /// An inbox row: kept while it can still be duplicated, it must be known to its group.
    pub fn inbox(
        &mut self,
        offset: i64,
        partner: &str,
        group_id: &str,
        number: Option<i64>,
        expiry_ms: i64,
    ) {
        if expiry_ms < self.now_ms {
            return;
        }
        self.report.checked("inbox_group", 1);
        self.report.checked("inbox_received", 1);
        let row = format!("inbox offset {offset} (partner '{partner}', group {group_id})");
        // Group rows that could not be decoded were reported as such; their messages are not
        // reported twice.
        let Some(group) = self.groups.get(&(partner.to_owned(), group_id.to_owned())) else {
            return self.report.found(
                "inbox_group",
                row,
                "no group row: a duplicate of this message would be accepted again".to_owned(),
            );
        };
        let number = number.map(|n| n as u64);
        if !group.delivered.contains(slot(number)) {
            let which = number.map_or("the singleton".to_owned(), |n| format!("number {n}"));
            self.report.found(
                "inbox_received",
                row,
                format!("{which} is not in its group's received numbers"),
            );
        }
    }

    /// A row of the gap buffer: its group must be open and hold it.
    pub fn buffered(&mut self, partner: &str, group_id: &str, number: i64) {
        self.report.checked("buffered_group", 1);
        let row = format!("buffered (partner '{partner}', group {group_id}, number {number})");
        let why = match self.groups.get(&(partner.to_owned(), group_id.to_owned())) {
            None => "no group row: it would never be delivered",
            Some(group) if !group.open => "its group has ended: it would never be delivered",
            Some(group) if !group.buffered.contains(&(number as u64)) => {
                "its group's state does not list it: it would never be delivered"
            }
            Some(_) => return,
        };
        self.report.found("buffered_group", row, why.to_owned());
    }

    pub fn finish(self) -> StoreCheck {
        self.report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rmp::group::GroupParams;
    use crate::wsr::GroupId;

    fn state(numbers: &[u64]) -> GroupState {
        let now = chrono::DateTime::from_timestamp(1_000, 0).expect("time");
        let params = GroupParams {
            channel: "default".to_owned(),
            sequenced: true,
            ack_requested: true,
            duplicate_elimination: true,
            message_order: false,
            limit: None,
        };
        let mut s = GroupState::new(GroupId::parse("urn:g").expect("id"), params, now);
        for n in numbers {
            s.delivered.insert(*n);
        }
        s
    }

    #[test]
    fn an_inbox_message_must_be_known_to_its_group_until_it_expires() {
        let mut c = Checker::new(StoreCheck::new("t".into()), 5_000);
        c.group(1, String::new(), "urn:g".into(), Ok(state(&[1, 2])));
        c.inbox(10, "", "urn:g", Some(1), 9_000);
        c.inbox(11, "", "urn:g", Some(3), 9_000);
        c.inbox(12, "", "urn:other", Some(1), 9_000);
        // Expired: its group may be gone.
        c.inbox(13, "", "urn:gone", Some(1), 4_000);
        let report = c.finish();
        assert_eq!(report.broken("inbox_received"), 1);
        assert_eq!(report.broken("inbox_group"), 1);
        assert!(report.findings.iter().any(|f| f.row.contains("offset 11")));
        assert!(report.findings.iter().any(|f| f.row.contains("offset 12")));
        assert!(!report.is_sound());
    }

    #[test]
    fn only_the_first_broken_rows_are_named_but_all_are_counted() {
        let mut report = StoreCheck::new("t".into());
        for i in 0..(NAMED_PER_INVARIANT + 5) {
            report.found("lease_holder", format!("row {i}"), "why".into());
        }
        report.checked("lease_holder", 30);
        assert_eq!(report.findings.len(), NAMED_PER_INVARIANT);
        assert_eq!(
            report.broken("lease_holder"),
            NAMED_PER_INVARIANT as u64 + 5
        );
        assert!(report.to_string().contains("… and 5 more"));
    }
}
