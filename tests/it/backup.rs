//! Online backup and restore of a SQLite store (`wsr-gateway backup` / `restore`): a backup
//! taken while partners' messages are being received and acked and a consumer settles holds
//! every message acked before it began exactly once, recognises their duplicates, and keeps
//! the subscription's cursor; a restore is refused beside a running gateway and for a backup
//! that fails the store check. SQLite only: PostgreSQL is backed up with its own tools.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::json;
use wsr_gateway::store::{Database, backup_store, check_store, restore_store};

use super::delivery::{Api, OWNER, deliver, deliver_to, gateway, wsr_message};
use super::support::start;

fn group_of(message: &serde_json::Value) -> String {
    // The test's bodies carry their group id before '#'.
    let payload = message["payload"].as_str().unwrap_or_default();
    let start = payload.find("urn:backup:").expect("a group in the payload");
    let rest = &payload[start..];
    rest[..rest.find('#').expect("#")].to_owned()
}

#[tokio::test]
async fn a_backup_under_load_restores_every_message_acked_before_it_exactly_once() {
    let app = gateway().await;
    let api = Api::of(&app, OWNER);
    let sub = api
        .create(json!({ "name": "orders", "filter": "default/Order" }))
        .await;
    let acked_before: Vec<String> = (0..40).map(|i| format!("urn:backup:before-{i}")).collect();
    for group in &acked_before {
        deliver_to(&app, wsr_message("Order", group, None, false)).await;
    }
    // A consumer has settled the first 15 before the backup: they must not come again.
    let member = api.join(sub, 3_600_000).await;
    let fetched = api.fetch(&member, 15).await;
    assert_eq!(fetched.len(), 15);
    let mut settled = BTreeSet::new();
    for message in &fetched {
        assert_eq!(api.accept(message).await.0, 200);
        settled.insert(group_of(message));
    }

    // Partners keep sending while the backup runs.
    let running = Arc::new(AtomicBool::new(true));
    let load = {
        let (base, client, running) = (app.url(""), app.client.clone(), running.clone());
        tokio::spawn(async move {
            let mut sent = 0;
            while running.load(Ordering::Relaxed) && sent < 2_000 {
                let group = format!("urn:backup:during-{sent}");
                deliver(&base, &client, wsr_message("Order", &group, None, false)).await;
                sent += 1;
            }
            sent
        })
    };
    // Some of the load is in before the copy starts.
    super::support::eventually("load under way", || async {
        (app.inbox().await.len() > 60).then_some(())
    })
    .await;
    let Database::Sqlite(path) = &app.config.database else {
        panic!("SQLite only");
    };
    let copy = path.with_file_name("backup.db");
    let copied = backup_store(&app.config.database, &copy)
        .await
        .expect("backup while running");
    running.store(false, Ordering::Relaxed);
    let sent_during = load.await.expect("load");
    assert!(copied.to_string().contains("inbox"), "{copied}");
    let again = backup_store(&app.config.database, &copy).await;
    assert!(
        format!("{}", again.expect_err("never overwrites")).contains("exists"),
        "a backup never overwrites a file"
    );

    // A restore beside the running gateway is refused.
    let refused = restore_store(&copy, &app.config.database, chrono::Utc::now())
        .await
        .expect_err("refused while the gateway runs");
    assert!(
        refused.to_string().contains("running wsr-gateway"),
        "{refused}"
    );

    let report = check_store(&Database::Sqlite(copy.clone()), chrono::Utc::now())
        .await
        .expect("check the backup");
    assert!(report.is_sound(), "{report}");

    let (config, clock, kept) = app.stop().await;
    let restored = restore_store(&copy, &config.database, chrono::Utc::now())
        .await
        .expect("restore");
    let aside = restored
        .moved_aside
        .clone()
        .expect("the old store moved aside");
    assert!(aside.exists(), "{restored}");

    let app = start(config, clock).await;
    let inbox = app.inbox().await;
    let mut stored = std::collections::BTreeMap::<String, usize>::new();
    for entry in &inbox {
        *stored.entry(entry.group_id.clone()).or_default() += 1;
    }
    for group in &acked_before {
        assert_eq!(stored.get(group), Some(&1), "{group} stored once");
    }
    assert!(stored.values().all(|n| *n == 1), "nothing stored twice");
    let during_kept = stored.len() - acked_before.len();
    assert!(during_kept <= sent_during, "{during_kept} of {sent_during}");

    // Duplicates of what the backup holds are still recognised: acked, not stored again.
    for group in acked_before.iter().take(5) {
        deliver_to(&app, wsr_message("Order", group, None, false)).await;
    }
    assert_eq!(
        app.inbox().await.len(),
        inbox.len(),
        "duplicates not stored"
    );

    // The cursor and the settles: every message acked before the backup and not settled
    // comes exactly once; the settled ones never.
    let api = Api::of(&app, OWNER);
    let member = api.join(sub, 3_600_000).await;
    let mut delivered = std::collections::BTreeMap::<String, usize>::new();
    loop {
        let batch = api.fetch(&member, 100).await;
        if batch.is_empty() {
            break;
        }
        for message in &batch {
            *delivered.entry(group_of(message)).or_default() += 1;
            assert_eq!(api.accept(message).await.0, 200);
        }
    }
    for group in &acked_before {
        let expected = usize::from(!settled.contains(group));
        assert_eq!(
            delivered.get(group).copied().unwrap_or(0),
            expected,
            "{group}"
        );
    }
    assert!(
        delivered.values().all(|n| *n == 1),
        "nothing delivered twice"
    );
    app.stop().await;
    drop(kept);
}

#[tokio::test]
async fn a_restore_refuses_a_backup_that_fails_the_check_and_check_store_runs_integrity_check() {
    let app = gateway().await;
    for i in 0..30 {
        deliver_to(
            &app,
            wsr_message("Order", &format!("urn:backup:{i}"), None, false),
        )
        .await;
    }
    let Database::Sqlite(path) = app.config.database.clone() else {
        panic!("SQLite only");
    };
    let copy = path.with_file_name("broken.db");
    backup_store(&app.config.database, &copy)
        .await
        .expect("backup");
    // An index that no longer matches its table: SQLite's own check finds it.
    {
        use sqlx::Connection as _;
        let mut db = sqlx::SqliteConnection::connect(&format!("sqlite://{}", copy.display()))
            .await
            .expect("open");
        for sql in [
            "PRAGMA writable_schema = ON",
            "UPDATE sqlite_schema SET sql = 'CREATE INDEX inbox_received_at ON inbox (expiry)' \
             WHERE name = 'inbox_received_at'",
        ] {
            sqlx::query(sql).execute(&mut db).await.expect(sql);
        }
    }
    let report = check_store(&Database::Sqlite(copy.clone()), chrono::Utc::now())
        .await
        .expect("check");
    assert!(report.broken("integrity") > 0, "{report}");
    assert!(report.to_string().contains("inbox_received_at"), "{report}");
    // The command says the same and fails.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_wsr-gateway"))
        .args(["check-store", "--database"])
        .arg(&copy)
        .env_remove("WSR_CONFIG")
        .output()
        .await
        .expect("run check-store");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("BROKEN integrity"), "{stdout}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("breaks the invariants"),
        "{out:?}"
    );

    let (config, clock, kept) = app.stop().await;
    let refused = restore_store(&copy, &config.database, chrono::Utc::now())
        .await
        .expect_err("a broken backup is not restored");
    assert!(
        refused.to_string().contains("fails the store check"),
        "{refused}"
    );
    // The store in place was left alone.
    let app = start(config, clock).await;
    assert_eq!(app.inbox().await.len(), 30);
    app.stop().await;
    drop(kept);
}
