//! `check-store`'s invariants on both backends: a store with traffic of every kind (received
//! singletons, a group buffered for a gap, subscriptions with matched, fetched and acquired
//! messages) holds them all; each one, broken on purpose behind the gateway's back, is caught
//! naming the row.

use serde_json::json;
use wsr_gateway::store::{StoreCheck, check_store};

use super::delivery::{Api, OWNER, deliver_to, gateway, wsr_message};
use super::support::execute_with;

async fn checked(database: &wsr_gateway::store::Database) -> StoreCheck {
    check_store(database, chrono::Utc::now())
        .await
        .expect("the store can be checked")
}

/// Breaks the store with `sql` (for each backend, one text parameter `value`) and asserts
/// that `invariant`, sound before, is now broken with a named row containing `row`.
async fn break_and_find(
    database: &wsr_gateway::store::Database,
    invariant: &str,
    sql: (&'static str, &'static str),
    value: &str,
    row: &str,
) {
    assert_eq!(
        checked(database).await.broken(invariant),
        0,
        "{invariant} before"
    );
    execute_with(database, sql, value).await;
    let report = checked(database).await;
    assert!(
        report.broken(invariant) > 0,
        "{invariant} not caught:\n{report}"
    );
    assert!(
        report
            .findings
            .iter()
            .any(|f| f.invariant == invariant && f.row.contains(row)),
        "{invariant} does not name {row}:\n{report}"
    );
    assert!(!report.is_sound());
    assert!(report.to_string().contains("BROKEN"), "{report}");
}

#[tokio::test]
async fn a_store_in_use_holds_every_invariant_and_each_broken_one_is_named() {
    let app = gateway().await;
    let api = Api::of(&app, OWNER);
    let mut subs = Vec::new();
    for name in ["leased", "behind", "ahead", "gone"] {
        subs.push(
            api.create(json!({ "name": name, "filter": "default/Order" }))
                .await,
        );
    }
    for i in 0..6 {
        deliver_to(
            &app,
            wsr_message("Order", &format!("urn:check:{i}"), None, false),
        )
        .await;
    }
    // Number 2 of an ordered group without its 1: buffered for the gap.
    let answer = app
        .post(
            "/wsr/default",
            "text/xml; charset=utf-8",
            wsr_message("Order", "urn:check:gap", Some(2), true),
        )
        .await;
    assert!(!answer.body.contains("Fault"), "{}", answer.body);
    for sub in &subs {
        let member = api.join(*sub, 3_600_000).await;
        assert!(!api.fetch(&member, 2).await.is_empty());
    }
    let database = app.config.database.clone();
    let (_config, _clock, kept) = app.stop().await;

    let report = checked(&database).await;
    assert!(report.is_sound(), "{report}");
    assert!(report.to_string().contains("every invariant holds"));

    let (leased, behind, ahead, gone) = (subs[0], subs[1], subs[2], subs[3]);
    break_and_find(
        &database,
        "lease_holder",
        (
            "UPDATE deliveries SET consumer = NULL WHERE state = 'acquired' AND \
             subscription_id = (SELECT id FROM subscriptions WHERE name = ?1)",
            "UPDATE deliveries SET consumer = NULL WHERE state = 'acquired' AND \
             subscription_id = (SELECT id FROM subscriptions WHERE name = $1)",
        ),
        "leased",
        &format!("deliveries (subscription {leased}, offset"),
    )
    .await;
    break_and_find(
        &database,
        "delivery_cursor",
        (
            "UPDATE subscriptions SET cursor = 0 WHERE name = ?1",
            "UPDATE subscriptions SET cursor = 0 WHERE name = $1",
        ),
        "behind",
        &format!("deliveries (subscription {behind}, offset"),
    )
    .await;
    break_and_find(
        &database,
        "cursor_counter",
        (
            "UPDATE subscriptions SET cursor = 1000000 WHERE name = ?1",
            "UPDATE subscriptions SET cursor = 1000000 WHERE name = $1",
        ),
        "ahead",
        &format!("subscriptions id {ahead} (ahead)"),
    )
    .await;
    break_and_find(
        &database,
        "delivery_subscription",
        (
            "DELETE FROM subscriptions WHERE name = ?1",
            "DELETE FROM subscriptions WHERE name = $1",
        ),
        "gone",
        &format!("deliveries (subscription {gone}, offset"),
    )
    .await;
    break_and_find(
        &database,
        "delivery_message",
        (
            "DELETE FROM inbox WHERE group_id = ?1",
            "DELETE FROM inbox WHERE group_id = $1",
        ),
        "urn:check:0",
        &format!("deliveries (subscription {leased}, offset"),
    )
    .await;
    break_and_find(
        &database,
        "inbox_group",
        (
            "DELETE FROM groups WHERE group_id = ?1",
            "DELETE FROM groups WHERE group_id = $1",
        ),
        "urn:check:1",
        "group urn:check:1",
    )
    .await;
    break_and_find(
        &database,
        "buffered_group",
        (
            "DELETE FROM groups WHERE group_id = ?1",
            "DELETE FROM groups WHERE group_id = $1",
        ),
        "urn:check:gap",
        "buffered (partner '', group urn:check:gap, number 2)",
    )
    .await;
    break_and_find(
        &database,
        "group_state",
        (
            "UPDATE groups SET state = '', state_bin = X'00' WHERE group_id = ?1",
            "UPDATE groups SET state_bin = '\\x00'::bytea WHERE group_id = $1",
        ),
        "urn:check:3",
        "group urn:check:3",
    )
    .await;
    break_and_find(
        &database,
        "offset_counter",
        (
            "UPDATE sqlite_sequence SET seq = 1 WHERE name = 'inbox' AND ?1 <> ''",
            "UPDATE sequences SET last = 1 WHERE name = 'inbox' AND $1::text <> ''",
        ),
        "inbox",
        "inbox offset",
    )
    .await;
    // (On PostgreSQL this row's offset is also past the counter, broken just before.)
    // A second message of a singleton's group that its group never received.
    break_and_find(
        &database,
        "inbox_received",
        (
            "INSERT INTO inbox (channel, topic, partner, group_id, number, namespaces, \
             received_at, expiry, payload) SELECT channel, topic, partner, group_id, 7, \
             namespaces, received_at, expiry, payload FROM inbox WHERE group_id = ?1",
            "INSERT INTO inbox (\"offset\", channel, topic, partner, group_id, number, \
             namespaces, received_at, expiry, payload) SELECT (SELECT MAX(\"offset\") + 1 \
             FROM inbox), channel, topic, partner, group_id, 7, namespaces, received_at, \
             expiry, payload FROM inbox WHERE group_id = $1",
        ),
        "urn:check:2",
        "group urn:check:2",
    )
    .await;
    drop(kept);
}
