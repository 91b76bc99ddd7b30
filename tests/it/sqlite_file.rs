//! What only a SQLite file has: a store that cannot grow (a full disk), the lock that keeps a
//! second gateway off one file (by any name), a file of someone else's, an unwritable path,
//! and the migration of rows written by earlier versions. Run in `it` only; PostgreSQL's own
//! counterparts are in `postgres.rs` and `cluster.rs`.

use chrono::{Duration, Utc};
use serde_json::json;
#[allow(unused_imports)]
use wsr_gateway::store::{Backend as _, ReceiverStore as _, TestHooks as _};
use wsr_gateway::wsr::{FaultCode, GroupId, RefToMessageIds, ReplyPattern, SeqRange, SoapVersion};

use super::hostile::{acked, fault_of, message, readyz};
use super::scoping::{GROUP, message as partner_message};
use super::support::{ClockExt, spawn_app, spawn_app_with};

const V: SoapVersion = SoapVersion::Soap11;

/// Item 10: while the store cannot commit (here: the database may not grow, as on a full
/// disk) `/readyz` says so with the reason, and says ready again once commits work.
#[tokio::test]
async fn readyz_is_503_with_the_reason_while_the_store_cannot_commit() {
    let app = spawn_app().await;
    assert_eq!(readyz(&app).await.0, 200);
    app.store.cap_database_size(true).await.expect("cap");
    let expiry = app.clock.now_utc() + Duration::hours(1);
    let big = format!(
        "<p:Blob xmlns:p=\"urn:p\">{}</p:Blob>",
        "x".repeat(256 * 1024)
    );
    let mut refused = 0;
    for i in 0..8 {
        let xml = message(&format!("mid:full-{i}@test"), None, expiry, None)
            .replace("<p:Order xmlns:p=\"urn:p\">hostile</p:Order>", &big);
        let answer = app.send(V, xml).await;
        if fault_of(&answer) == Some(FaultCode::MessageProcessingFailure) {
            refused += 1;
        }
    }
    assert!(refused > 0, "a full database refuses messages");
    let (status, reason) = readyz(&app).await;
    assert_eq!(status, 503, "{reason}");
    assert!(reason.contains("full"), "{reason}");
    // The same for the alert rule WsrGatewayNotReady.
    let metrics = |app: &super::support::TestApp| {
        let (client, url) = (app.client.clone(), app.url("/metrics"));
        async move {
            let r = client.get(url).send().await.expect("scrape");
            r.text().await.expect("text")
        }
    };
    assert!(metrics(&app).await.contains("\nwsr_ready 0\n"));
    app.store.cap_database_size(false).await.expect("uncap");
    acked(&app, "mid:room-again@test").await;
    assert_eq!(readyz(&app).await.0, 200);
    assert!(metrics(&app).await.contains("\nwsr_ready 1\n"));
    app.stop().await;
}

/// Issue 35: an ack follows the sync of the WAL by the store's syncer thread, not by SQLite's
/// commit. A WAL the syncer cannot sync (here: gone from under it) acknowledges nothing
/// more — not the message whose commit it was, not a read of what that commit wrote — and
/// `/readyz` says why, until a restart.
#[tokio::test]
async fn a_wal_that_cannot_be_synced_acknowledges_nothing_more() {
    let app = spawn_app().await;
    acked(&app, "mid:before-the-failed-sync@test").await;
    let mut wal = app
        .config
        .database
        .sqlite_path()
        .expect("a SQLite store")
        .as_os_str()
        .to_owned();
    wal.push("-wal");
    std::fs::remove_file(&wal).expect("remove the WAL");
    let expiry = app.clock.now_utc() + Duration::hours(1);
    let group = "mid:after-the-failed-sync@test";
    let answer = app.send(V, message(group, None, expiry, None)).await;
    assert_eq!(
        fault_of(&answer),
        Some(FaultCode::MessageProcessingFailure),
        "{}",
        answer.body
    );
    let (status, reason) = readyz(&app).await;
    assert_eq!(status, 503, "{reason}");
    assert!(reason.contains("restart the gateway"), "{reason}");
    let read = app
        .store
        .inbox(0, 10)
        .await
        .expect_err("a read passed a failed sync");
    assert!(read.to_string().contains("restart the gateway"), "{read}");
    // Still nothing acknowledged, though the file is back.
    std::fs::write(&wal, b"").expect("a WAL file again");
    let again = app.send(V, message(group, None, expiry, None)).await;
    assert_eq!(fault_of(&again), Some(FaultCode::MessageProcessingFailure));
    app.stop().await;
}

/// Item 11: one SQLite database serves one gateway.
#[tokio::test]
async fn a_second_gateway_on_the_same_database_is_refused() {
    let app = spawn_app().await;
    let second = wsr_gateway::App::build(app.config.clone()).await;
    let error = format!("{:#}", second.err().expect("the second gateway is refused"));
    assert!(error.contains("in use by another wsr-gateway"), "{error}");
    app.stop().await;
}

/// The lock is taken beside the real file: another name for the same database meets it.
#[tokio::test]
async fn a_second_gateway_through_a_symlink_is_refused_too() {
    let app = spawn_app().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let alias = dir.path().join("alias.db");
    std::os::unix::fs::symlink(
        app.config.database.sqlite_path().expect("a SQLite file"),
        &alias,
    )
    .expect("symlink");
    let second = wsr_gateway::App::build(wsr_gateway::Config::for_tests(alias)).await;
    let error = format!("{:#}", second.err().expect("the second gateway is refused"));
    assert!(error.contains("in use by another wsr-gateway"), "{error}");
    app.stop().await;
}

/// A database reached through a link is synced where SQLite keeps its WAL — beside the file
/// the link names, not beside the link: a gateway configured through one acknowledges.
#[tokio::test]
async fn a_database_through_a_symlink_is_synced_and_acknowledges() {
    let dir = tempfile::tempdir().expect("temp dir");
    let real = dir.path().join("real");
    std::fs::create_dir(&real).expect("dir");
    std::fs::write(real.join("gw.db"), b"").expect("an empty database file");
    let alias = dir.path().join("alias.db");
    std::os::unix::fs::symlink(real.join("gw.db"), &alias).expect("symlink");
    let app = spawn_app_with(|c| c.database = wsr_gateway::store::Database::Sqlite(alias)).await;
    acked(&app, "mid:through-a-link@test").await;
    acked(&app, "mid:through-a-link-again@test").await;
    assert_eq!(readyz(&app).await.0, 200);
    assert!(
        real.join("gw.db-wal").exists(),
        "the WAL is beside the real file"
    );
    app.stop().await;
}

#[test]
fn a_second_gateway_process_exits_1_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("gw.toml");
    let port = super::support::free_port();
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndatabase = \"{}\"\n",
            dir.path().join("gw.db").display()
        ),
    )
    .expect("config");
    let mut first = super::support::start_gateway(&config);
    let other_port = super::support::free_port();
    let second = std::process::Command::new(env!("CARGO_BIN_EXE_wsr-gateway"))
        .args(["serve", "--config"])
        .arg(&config)
        .env("WSR_LISTEN", format!("127.0.0.1:{other_port}"))
        .env_remove("WSR_CONFIG")
        .output()
        .expect("second gateway runs");
    let _ = first.kill();
    let _ = first.wait();
    assert_eq!(second.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("in use by another wsr-gateway"), "{stderr}");
}

/// Item 11: another application's SQLite file is refused, and nothing is added to it.
#[tokio::test]
async fn a_database_that_is_not_ours_is_refused_untouched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("theirs.db");
    {
        use sqlx::Connection as _;
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true);
        let mut conn = sqlx::SqliteConnection::connect_with(&options)
            .await
            .expect("their database");
        sqlx::query("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
            .execute(&mut conn)
            .await
            .expect("their table");
        conn.close().await.expect("close");
    }
    let refused = wsr_gateway::App::build(wsr_gateway::Config::for_tests(path.clone())).await;
    let error = format!("{:#}", refused.err().expect("refused"));
    assert!(error.contains("not a wsr-gateway database"), "{error}");
    assert!(error.contains("invoices"), "{error}");
    let options = sqlx::sqlite::SqliteConnectOptions::new().filename(&path);
    let pool = sqlx::SqlitePool::connect_with(options).await.expect("open");
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table'")
            .fetch_all(&pool)
            .await
            .expect("tables");
    assert_eq!(tables, vec!["invoices".to_owned()]);
}

/// Item 11: a place the gateway cannot write names the operating system's reason.
#[tokio::test]
async fn an_unwritable_database_path_names_the_os_cause() {
    let dir = tempfile::tempdir().expect("temp dir");
    // A regular file where a directory would have to be: refused whoever we run as.
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, "x").expect("file");
    for path in [blocker.join("gw.db"), "/proc/wsr-gateway-test/gw.db".into()] {
        let refused = wsr_gateway::App::build(wsr_gateway::Config::for_tests(path.clone())).await;
        let error = format!("{:#}", refused.err().expect("refused"));
        assert!(error.contains("os error"), "{}: {error}", path.display());
        assert!(!error.contains("unable to open database file"), "{error}");
    }
}

#[tokio::test]
async fn the_migration_keeps_earlier_rows_as_the_anonymous_callers() {
    use sqlx::Row as _;
    // A database at the previous migration level (0001–0009), with rows in it.
    let dir = tempfile::tempdir().expect("temp dir");
    let earlier = dir.path().join("migrations");
    std::fs::create_dir(&earlier).expect("dir");
    let all = super::support::repo_root().join("migrations/sqlite");
    for entry in std::fs::read_dir(&all).expect("migrations") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_owned();
        if name.as_str() < "0010" {
            std::fs::copy(&path, earlier.join(&name)).expect("copy");
        }
    }
    let db = dir.path().join("gw.db");
    let now = Utc::now().timestamp_millis();
    {
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&db)
            .create_if_missing(true);
        let pool = sqlx::SqlitePool::connect_with(options).await.expect("open");
        sqlx::migrate::Migrator::new(earlier.as_path())
            .await
            .expect("migrations")
            .run(&pool)
            .await
            .expect("migrate to 0009");
        // A group state as the gateway writes it: taken from a store that received one.
        let state = scratch_group_state().await;
        for sql in [
            "INSERT INTO groups (group_id, channel, status, next_deadline, updated_at, state, \
             source) VALUES (?3, 'default', 'open', NULL, ?1, ?2, '192.0.2.1')",
            "INSERT INTO inbox (channel, topic, group_id, number, payload, namespaces, \
             received_at, expiry) VALUES ('default', 'default/Order', ?3, NULL, \
             '<x/>', '[]', ?1, ?1)",
            "INSERT INTO callback_endpoints (url, created_at) VALUES ('http://127.0.0.1:9/old', ?1)",
            "INSERT INTO message_faults (group_id, singleton, number, fault, expiry) \
             VALUES (?3, 1, 0, 'InvalidRequest', ?1)",
            "INSERT INTO subscriptions (name, filter, owner, rules, cursor, created_at) \
             VALUES ('old', 'default/#', 'reader', '{}', 1, ?1)",
            "INSERT INTO deliveries (subscription_id, offset, group_id, state, attempt, failures, \
             due, avoid) VALUES (1, 1, ?3, 'available', 0, 0, ?1, '[]')",
            "INSERT INTO group_heads (subscription_id, group_id, head) VALUES (1, ?3, 1)",
        ] {
            sqlx::query(sql)
                .bind(now)
                .bind(&state)
                .bind(GROUP)
                .execute(&pool)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        pool.close().await;
    }
    let store = wsr_gateway::store::Store::open(&wsr_gateway::store::StoreConfig {
        database: wsr_gateway::store::Database::Sqlite(db.clone()),
        durability: wsr_gateway::store::Durability::Full,
        policy: wsr_gateway::rmp::group::Policy::default(),
    })
    .await
    .expect("the store opens and migrates");
    assert!(
        store.group("", GROUP).await.expect("read").is_some(),
        "the group is the anonymous caller's"
    );
    assert!(store.group("alpha", GROUP).await.expect("read").is_none());
    let inbox = store.inbox(0, 10).await.expect("inbox");
    assert_eq!(inbox.len(), 1);
    assert_eq!(inbox[0].partner, "");
    assert!(
        store
            .is_callback_endpoint("", "http://127.0.0.1:9/old")
            .await
            .expect("read")
    );
    let old = || RefToMessageIds {
        group_id: GroupId::parse(GROUP).expect("group"),
        ranges: Vec::<SeqRange>::new(),
    };
    assert!(
        store
            .poll_answer("", &[old()])
            .await
            .expect("poll")
            .is_some()
    );
    assert!(
        store
            .poll_answer("alpha", &[old()])
            .await
            .expect("poll")
            .is_none()
    );
    drop(store);
    // The ordering groups of subscriptions became (partner "", group) keys.
    let pool =
        sqlx::SqlitePool::connect_with(sqlx::sqlite::SqliteConnectOptions::new().filename(&db))
            .await
            .expect("open");
    let key: String = sqlx::query("SELECT group_key FROM deliveries")
        .fetch_one(&pool)
        .await
        .expect("read")
        .get(0);
    assert_eq!(key, json!(["", GROUP]).to_string());
    let head: String = sqlx::query("SELECT group_key FROM group_heads")
        .fetch_one(&pool)
        .await
        .expect("read")
        .get(0);
    assert_eq!(head, key);
    let groups: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM groups WHERE partner = '' AND source = '192.0.2.1'",
    )
    .fetch_one(&pool)
    .await
    .expect("read");
    assert_eq!(groups, 1, "the source is kept");
    pool.close().await;
}

/// The stored JSON of a real group state (a singleton's).
async fn scratch_group_state() -> String {
    let app = spawn_app_with(|_| {}).await;
    let xml = partner_message(&app, None, ReplyPattern::Response, "scratch");
    let answer = app.send(SoapVersion::Soap11, xml).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let state = app
        .store
        .group("", GROUP)
        .await
        .expect("read")
        .expect("group");
    app.stop().await;
    wsr_gateway::store::group_json::encode(&state)
}

/// The writer keeps the state of the open sequenced groups it wrote (`warm_groups.rs`) on the
/// rule that nothing else writes them. A group row deleted from under it anyway fails that
/// message's batch, so nothing is acknowledged on a state that is not stored, and the next
/// attempt is decided on what the file holds.
#[tokio::test]
async fn a_group_row_deleted_under_the_writer_is_not_acknowledged_on_a_kept_state() {
    let app = spawn_app().await;
    let expiry = app.clock.now_utc() + Duration::hours(1);
    let group = "mid:deleted-under@test";
    let first = app.send(V, message(group, Some(0), expiry, None)).await;
    assert_eq!(
        (first.status, fault_of(&first)),
        (200, None),
        "{}",
        first.body
    );
    super::support::execute_with(
        &app.config.database,
        (
            "DELETE FROM groups WHERE group_id = ?",
            "DELETE FROM groups WHERE group_id = $1",
        ),
        group,
    )
    .await;
    let second = app.send(V, message(group, Some(1), expiry, None)).await;
    assert_eq!(
        fault_of(&second),
        Some(FaultCode::MessageProcessingFailure),
        "{}",
        second.body
    );
    let again = app.send(V, message(group, Some(1), expiry, None)).await;
    assert_eq!(
        (again.status, fault_of(&again)),
        (200, None),
        "{}",
        again.body
    );
    let delivered = app.inbox().await;
    assert_eq!(delivered.len(), 2, "0 before the delete, 1 once");
}
