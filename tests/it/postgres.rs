//! The PostgreSQL backend's opening: migrations under an advisory lock, so that gateways
//! starting together do not race, and the refusal of a database that is not ours. Each test
//! gets a database of its own on the machine's PostgreSQL (`WSR_TEST_POSTGRES`, default
//! `postgres://postgres@127.0.0.1:5432/test`, the one `.ci/run` makes sure is up), dropped
//! afterwards.

use wsr_gateway::store::{Database, Durability, PostgresStore, StoreConfig};

use crate::test_database::TestDatabase;

/// A database of this test's own, with the gateway's tables (a gateway opened and closed it).
async fn migrated() -> TestDatabase {
    let db = TestDatabase::create().await;
    PostgresStore::open(&db.config())
        .await
        .expect("opens")
        .close()
        .await;
    db
}

/// Why `PostgresStore::open` refuses `config` (it must).
async fn refusal(config: &StoreConfig) -> String {
    match PostgresStore::open(config).await {
        Ok(_) => panic!("{} was opened", config.database),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn gateways_opening_one_new_database_together_migrate_it_once() {
    let db = TestDatabase::create().await;
    let config = db.config();
    let opens: Vec<_> = (0..4)
        .map(|_| {
            let config = config.clone();
            tokio::spawn(async move { PostgresStore::open(&config).await })
        })
        .collect();
    for open in opens {
        open.await
            .expect("open task")
            .expect("every gateway opens the database")
            .close()
            .await;
    }
    let mut conn = db.connect().await;
    let migrations: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(&mut conn)
        .await
        .expect("migrations table");
    let applied = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres"))
        .expect("migrations folder")
        .count();
    assert_eq!(migrations, applied as i64, "each migration recorded once");
    let identities: Vec<String> = sqlx::query_scalar("SELECT application FROM wsr_identity")
        .fetch_all(&mut conn)
        .await
        .expect("identity");
    assert_eq!(identities, ["wsr-gateway"]);
    let offsets: Vec<(String, i64)> =
        sqlx::query_as("SELECT name, last FROM sequences ORDER BY name")
            .fetch_all(&mut conn)
            .await
            .expect("sequences");
    assert_eq!(
        offsets,
        [("inbox".to_owned(), 0), ("out_events".to_owned(), 0)]
    );

    // And a gateway started later finds it done.
    PostgresStore::open(&config)
        .await
        .expect("reopens")
        .close()
        .await;
}

#[tokio::test]
async fn a_database_with_someone_elses_tables_is_refused_and_left_untouched() {
    let db = TestDatabase::create().await;
    db.execute("CREATE TABLE invoices (id BIGINT PRIMARY KEY)")
        .await;
    let error = refusal(&db.config()).await;
    assert!(error.contains("not a wsr-gateway database"), "{error}");
    assert!(error.contains("invoices"), "{error}");
    assert_eq!(db.tables().await, ["invoices"], "nothing of ours was added");
}

#[tokio::test]
async fn a_database_claimed_by_another_application_is_refused() {
    let db = migrated().await;
    db.execute("UPDATE wsr_identity SET application = 'other-app'")
        .await;
    let error = refusal(&db.config()).await;
    assert!(error.contains("belongs to other-app"), "{error}");
}

#[tokio::test]
async fn a_refused_connection_names_the_database_without_its_password() {
    let config = StoreConfig {
        // Port 1 on loopback: nothing listens there.
        database: Database::Postgres("postgres://wsr:s3cret@127.0.0.1:1/wsr".to_owned()),
        durability: Durability::Full,
        policy: Default::default(),
    };
    let error = refusal(&config).await;
    assert!(
        error.contains("cannot connect to postgres://wsr:***@127.0.0.1:1/wsr"),
        "{error}"
    );
    assert!(!error.contains("s3cret"), "{error}");
    // The driver's own words, not the pool's "timed out" after waiting for nothing.
    assert!(error.to_lowercase().contains("refused"), "{error}");
    assert!(!error.contains("timed out"), "{error}");
}

/// `migrate-store`: a SQLite store's rows move into a new PostgreSQL database, where a gateway
/// carries on: the same inbox offsets, groups that still know their messages (a resend is a
/// duplicate), a receipt key that still verifies, and the next offset after the copied ones.
#[tokio::test]
async fn a_sqlite_store_moves_into_postgres_and_carries_on() {
    use crate::contract::receiver::{message, text};
    use wsr_gateway::rmp::receiver::Verdict;
    use wsr_gateway::store::Store;
    use wsr_gateway::wsr::ReplyPattern;

    let dir = tempfile::tempdir().expect("temp dir");
    let sqlite = StoreConfig {
        database: Database::Sqlite(dir.path().join("old.db")),
        durability: Durability::Full,
        policy: Default::default(),
    };
    let ordered = |n| {
        message(
            "mid:moved@migrate",
            Some(n),
            ReplyPattern::Response,
            text("<o/>"),
        )
    };
    let (secret, before) = {
        let old = Store::open(&sqlite).await.expect("sqlite");
        for n in [0, 1, 3] {
            old.receive(ordered(n)).await.expect("stored");
        }
        old.receive(message(
            "mid:single@migrate",
            None,
            ReplyPattern::Response,
            text("<s/>"),
        ))
        .await
        .expect("stored");
        (
            old.receipt_secret().await.expect("secret"),
            old.inbox(0, 100).await.expect("inbox"),
        )
    };
    let db = TestDatabase::create().await;
    let migrated = wsr_gateway::store::migrate_store(&sqlite, &db.config())
        .await
        .expect("migrated");
    let rows: u64 = migrated.tables.iter().map(|(_, n)| n).sum();
    assert_eq!(
        rows, 8,
        "settings 1, groups 2, inbox 3, buffered 1, the source's stored bytes 1: {migrated}"
    );

    let new = Store::open(&db.config()).await.expect("postgres");
    assert_eq!(new.inbox(0, 100).await.expect("inbox"), before);
    assert_eq!(new.receipt_secret().await.expect("secret"), secret);
    let group = new
        .group("", "mid:moved@migrate")
        .await
        .expect("read")
        .expect("group");
    assert_eq!(group.buffered.len(), 1, "number 3 still waits for 2");
    let resent = new.receive(ordered(1)).await.expect("stored");
    assert_eq!(resent.verdict, Verdict::Ack);
    new.receive(ordered(2)).await.expect("stored");
    let after = new.inbox(0, 100).await.expect("inbox");
    let numbers: Vec<_> = after.iter().map(|e| (e.offset, e.number)).collect();
    assert_eq!(
        after.len(),
        5,
        "2 and the released 3 added, the resend not: {numbers:?}"
    );
    let last = before.last().expect("copied").offset;
    assert_eq!(
        (
            after[3].offset,
            after[3].number,
            after[4].offset,
            after[4].number
        ),
        (last + 1, Some(2), last + 2, Some(3))
    );

    // A database already in use is refused.
    let again = wsr_gateway::store::migrate_store(&sqlite, &db.config())
        .await
        .expect_err("refused");
    assert!(again.to_string().contains("already holds"), "{again}");
}

/// `migrate-store` copies the console's sign-outs: the cookies keep verifying after the move
/// (the store's key goes with `settings`), so one signed out before it stays refused after it.
#[tokio::test]
async fn a_console_sign_out_moves_into_postgres_with_the_store() {
    use wsr_gateway::store::Store;

    let dir = tempfile::tempdir().expect("temp dir");
    let sqlite = StoreConfig {
        database: Database::Sqlite(dir.path().join("old.db")),
        durability: Durability::Full,
        policy: Default::default(),
    };
    let until = chrono::Utc::now() + chrono::Duration::hours(1);
    let nonce = "00112233445566778899aabbccddeeff";
    {
        let old = Store::open(&sqlite).await.expect("sqlite");
        old.sign_out_console(nonce, until).await.expect("recorded");
        assert!(old.console_signed_out(nonce).await.expect("read"));
    }
    let db = TestDatabase::create().await;
    let migrated = wsr_gateway::store::migrate_store(&sqlite, &db.config())
        .await
        .expect("migrated");
    assert!(
        migrated.tables.contains(&("console_signouts", 1)),
        "{migrated}"
    );
    let new = Store::open(&db.config()).await.expect("postgres");
    assert!(new.console_signed_out(nonce).await.expect("read"));
    assert!(!new.console_signed_out("another").await.expect("read"));
}

/// `migrate-store` carries which inbox messages are consumed (SQLite keeps them beside the
/// inbox, PostgreSQL in its `consumed` column): a message every subscription settled stays
/// consumed, one still waiting does not, so the purge after the move frees neither twice.
#[tokio::test]
async fn consumed_messages_move_into_postgres_as_consumed() {
    use crate::contract::receiver::{message, text};
    use chrono::{Duration, Utc};
    use wsr_gateway::delivery::fetch::Take;
    use wsr_gateway::delivery::lease::Outcome;
    use wsr_gateway::delivery::subscription::CreateRequest;
    use wsr_gateway::store::Store;
    use wsr_gateway::wsr::ReplyPattern;

    let dir = tempfile::tempdir().expect("temp dir");
    let sqlite = StoreConfig {
        database: Database::Sqlite(dir.path().join("old.db")),
        durability: Durability::Full,
        policy: Default::default(),
    };
    let (settled, waiting) = {
        let old = Store::open(&sqlite).await.expect("sqlite");
        let request: CreateRequest = serde_json::from_value(
            serde_json::json!({ "name": "moving", "filter": "#", "start": "oldest" }),
        )
        .expect("create request");
        let now = Utc::now();
        let sub = old
            .create_subscription(&request.check().expect("valid"), "app", now)
            .await
            .expect("create")
            .0;
        for id in ["mid:first@consumed", "mid:second@consumed"] {
            old.receive(message(id, None, ReplyPattern::Response, text("<c/>")))
                .await
                .expect("stored");
        }
        let now = now + Duration::seconds(1);
        old.join(sub.id, "m", "app", Duration::hours(1), now)
            .await
            .expect("join");
        let got = old
            .fetch("m", Take::pull(1, usize::MAX), now)
            .await
            .expect("fetch");
        assert_eq!(got.len(), 1);
        old.settle(&got[0].receipt, Some(Outcome::Accepted), now)
            .await
            .expect("settle");
        let inbox = old.inbox(0, 10).await.expect("inbox");
        (inbox[0].offset, inbox[1].offset)
    };
    let db = TestDatabase::create().await;
    wsr_gateway::store::migrate_store(&sqlite, &db.config())
        .await
        .expect("migrated");
    let mut conn = db.connect().await;
    let consumed: Vec<(i64, bool)> =
        sqlx::query_as("SELECT \"offset\", consumed FROM inbox ORDER BY \"offset\"")
            .fetch_all(&mut conn)
            .await
            .expect("read");
    assert_eq!(consumed, vec![(settled, true), (waiting, false)]);
}

/// Polls `pg_stat_activity` until a backend of the watcher's database waits for a lock whose
/// kind (`wait_event`) is like `kind`; fails if `waiter`, the task that should wait (`who`),
/// ends first, or if none waits within 30 s.
async fn until_a_backend_waits<T>(
    watcher: &mut sqlx::PgConnection,
    kind: &str,
    waiter: &tokio::task::JoinHandle<T>,
    who: &str,
) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let waiting: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND wait_event LIKE $1)",
        )
        .bind(kind)
        .fetch_one(&mut *watcher)
        .await
        .expect("pg_stat_activity");
        if waiting {
            return;
        }
        assert!(!waiter.is_finished(), "{who}: did not wait");
        assert!(
            tokio::time::Instant::now() < deadline,
            "{who}: never waited"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Every transaction takes the `source_usage` rows it changes in byte order, whatever order its
/// caller sorted them in (migration 0017): the writer sorted by the database's collation and
/// the purges by bytes, which a locale's collation puts the other way round for these two.
#[tokio::test]
async fn usage_rows_are_locked_in_byte_order_whatever_order_the_caller_gives() {
    let db = migrated().await;
    db.execute(
        "INSERT INTO source_usage (source, bytes) \
         VALUES ('partner:Zeta', 10), ('partner:alpha', 10)",
    )
    .await;
    // A purge holds "partner:alpha" (second by bytes).
    let mut purge = db.connect().await;
    for sql in [
        "BEGIN",
        "SELECT bytes FROM source_usage WHERE source = 'partner:alpha' FOR UPDATE",
    ] {
        sqlx::query(sql).execute(&mut purge).await.expect(sql);
    }
    // A batch gives them in a locale's order ("alpha" first).
    let mut batch = db.connect().await;
    let change = tokio::spawn(async move {
        sqlx::query(
            "SELECT wsr_change_usage(ARRAY['partner:alpha', 'partner:Zeta'], \
             ARRAY[1, 1]::bigint[])",
        )
        .execute(&mut batch)
        .await
    });
    let mut watcher = db.connect().await;
    until_a_backend_waits(&mut watcher, "%", &change, "the batch, for the purge's row").await;
    // Waiting for "partner:alpha", it holds "partner:Zeta" already: byte order.
    let zeta = sqlx::query(
        "SELECT bytes FROM source_usage WHERE source = 'partner:Zeta' FOR UPDATE NOWAIT",
    )
    .execute(&mut watcher)
    .await;
    let refused = zeta.expect_err("the batch holds partner:Zeta while it waits");
    assert_eq!(
        refused
            .as_database_error()
            .and_then(|e| e.code())
            .as_deref(),
        Some("55P03"),
        "{refused}"
    );
    sqlx::query("COMMIT")
        .execute(&mut purge)
        .await
        .expect("commit");
    change.await.expect("task").expect("the batch goes on");
    let bytes: Vec<(String, i64)> =
        sqlx::query_as("SELECT source, bytes FROM source_usage ORDER BY source")
            .fetch_all(&mut watcher)
            .await
            .expect("usage");
    assert_eq!(
        bytes,
        [
            ("partner:Zeta".to_owned(), 11),
            ("partner:alpha".to_owned(), 11)
        ]
    );
}

/// The writer locks only the groups its batch found stored (migration 0018): a new group's
/// insert is its check, so a lock held on a new group's key (as a sweep or an abort would hold
/// it) does not hold the message back, while a stored group's lock still holds its resend
/// until the lock's holder commits.
#[tokio::test]
async fn a_batch_waits_for_the_locks_of_stored_groups_only() {
    use crate::contract::receiver::{message, text};
    use std::time::Duration;
    use wsr_gateway::store::Store;
    use wsr_gateway::wsr::ReplyPattern;

    let db = migrated().await;
    let store = Store::open(&db.config()).await.expect("postgres");
    let mut holder = db.connect().await;
    for sql in [
        "BEGIN",
        "SELECT pg_advisory_xact_lock(hashtextextended('' || chr(31) || 'mid:held@lock', 0))",
    ] {
        sqlx::query(sql).execute(&mut holder).await.expect(sql);
    }
    let single = message("mid:held@lock", None, ReplyPattern::Response, text("<a/>"));
    tokio::time::timeout(Duration::from_secs(20), store.receive(single.clone()))
        .await
        .expect("a new group's message is not held back by its key's lock")
        .expect("stored");

    let resend = tokio::spawn(async move {
        let received = store.receive(single).await;
        (store, received)
    });
    let mut watcher = db.connect().await;
    until_a_backend_waits(
        &mut watcher,
        "advisory",
        &resend,
        "the resend, for its group's lock",
    )
    .await;
    sqlx::query("COMMIT")
        .execute(&mut holder)
        .await
        .expect("commit");
    let (store, received) = resend.await.expect("resend task");
    assert_eq!(
        received.expect("stored").verdict,
        wsr_gateway::rmp::receiver::Verdict::Ack
    );
    let inbox = store.inbox(0, 10).await.expect("inbox");
    assert_eq!(inbox.len(), 1, "the resend is a duplicate");
}
