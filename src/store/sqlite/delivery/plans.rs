//! The delivery statements' plans on a migrated store: each state of a lease has its own index
//! (migration 0031), and the statements that look leases up by subscription and state must use
//! it. If the planner fell back to the primary key's `subscription_id` prefix instead, it
//! would walk every settled row the inbox still keeps — correct answers, unbounded work — so
//! no behaviour test would notice.

use rusqlite::Connection;

use super::{fetch, reads, rows, sessions};
use crate::store::sqlite::MIGRATIONS;
use crate::store::sqlite::writer::open_writer_connection;

/// A store with every migration applied — the set `SqliteStore::open` runs —
/// on the writer's connection settings.
fn migrated() -> (tempfile::TempDir, Connection) {
    let dir = tempfile::tempdir().expect("dir");
    let conn = open_writer_connection(&dir.path().join("plans.db")).expect("open");
    for migration in MIGRATIONS.iter() {
        conn.execute_batch(migration.sql.as_str())
            .unwrap_or_else(|e| panic!("{}: {e}", migration.description));
    }
    (dir, conn)
}

/// The plan's lines, as `EXPLAIN QUERY PLAN` words them.
fn plan(conn: &Connection, sql: &str) -> String {
    let mut stmt = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let mut rows = stmt.raw_query();
    let mut lines = Vec::new();
    while let Some(row) = rows.next().expect("row") {
        lines.push(row.get::<_, String>(3).expect("detail"));
    }
    lines.join("\n")
}

fn assert_uses(conn: &Connection, sql: &str, index: &str) {
    let plan = plan(conn, sql);
    assert!(
        plan.contains(&format!("INDEX {index} ")),
        "{sql}\nshould use {index}, but the plan is:\n{plan}"
    );
    assert!(
        !plan.contains("SCAN d ") && !plan.contains("SCAN deliveries"),
        "{sql}\nwalks deliveries:\n{plan}"
    );
}

#[test]
fn a_fetch_reads_waiting_messages_and_group_heads_by_their_indexes() {
    let (_dir, conn) = migrated();
    assert_uses(&conn, fetch::WAITING_CANDIDATES, "deliveries_waiting");
    // The group's "is another of its messages leased?" by its own index, not by walking the
    // subscription's leases.
    assert_uses(
        &conn,
        fetch::GROUP_HEAD_CANDIDATES,
        "deliveries_group_acquired",
    );
}

#[test]
fn overdue_leases_and_the_earliest_deadline_are_found_by_subscription_and_deadline() {
    let (_dir, conn) = migrated();
    assert_uses(&conn, sessions::OVERDUE_OF_ONE, "deliveries_acquired");
    assert_uses(&conn, sessions::OVERDUE_OF_ALL, "deliveries_acquired");
    assert_uses(&conn, reads::EARLIEST_OF_ALL, "deliveries_acquired");
}

#[test]
fn a_subscriptions_leases_are_looked_up_by_the_index_of_their_state() {
    let (_dir, conn) = migrated();
    let count = |state: &str| {
        format!("SELECT COUNT(*) FROM deliveries WHERE subscription_id = ?1 AND state = '{state}'")
    };
    // The shapes of the statements that read one subscription's leases in one state: counts
    // (backlog, stats), the next backoff and deadline (wakes), a member's leases, dead letters.
    let shapes = [
        (count("available"), "deliveries_waiting"),
        (
            "SELECT MIN(due) FROM deliveries WHERE subscription_id = ?1 AND state = 'available' \
             AND due > ?2"
                .to_owned(),
            "deliveries_waiting",
        ),
        (count("acquired"), "deliveries_acquired"),
        (
            "SELECT MIN(due) FROM deliveries WHERE subscription_id = ?1 AND state = 'acquired'"
                .to_owned(),
            "deliveries_acquired",
        ),
        (
            "SELECT offset FROM deliveries WHERE subscription_id = ?1 AND state = 'acquired' \
             AND consumer = ?2"
                .to_owned(),
            "deliveries_acquired",
        ),
        (count("dead"), "deliveries_dead"),
        (
            "SELECT offset, reason, attempt FROM deliveries WHERE subscription_id = ?1 \
             AND state = 'dead' AND offset > ?2 ORDER BY offset LIMIT ?3"
                .to_owned(),
            "deliveries_dead",
        ),
        (
            "SELECT offset, reason FROM deliveries WHERE subscription_id = ?1 AND state = 'dead' \
             ORDER BY offset"
                .to_owned(),
            "deliveries_dead",
        ),
    ];
    for (sql, index) in shapes {
        assert_uses(&conn, &sql, index);
    }
}

#[test]
fn a_batch_of_leases_is_saved_by_key_one_lookup_per_row() {
    let (_dir, conn) = migrated();
    for sql in rows::SAVE_LEASES.iter() {
        // The planner could as well walk the subscription's every lease and probe the values
        // for each: the values must drive, each row finding its lease by the primary key.
        let plan = plan(&conn, sql);
        let search = plan.find("SEARCH deliveries USING");
        let values = plan.find("SCAN ");
        assert!(
            plan.contains("(subscription_id=? AND offset=?)")
                && !plan.contains("SCAN deliveries")
                && matches!((values, search), (Some(v), Some(s)) if v < s),
            "{sql}\nshould walk the values and find each lease by its key:\n{plan}"
        );
    }
}
