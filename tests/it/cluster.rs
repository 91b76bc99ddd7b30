//! Several gateways on one PostgreSQL database (DESIGN §7): the rules that held because one
//! process owned a SQLite file, checked with two stores opened on one database — two pools,
//! two listeners, nothing shared in memory, as two gateway processes would have.

use std::collections::BTreeSet;

use chrono::Duration;
use wsr_gateway::rmp::receiver::Verdict;
use wsr_gateway::store::{Store, StoreConfig, TestHooks as _};
use wsr_gateway::wsr::{ReplyPattern, ReplyTo};

use crate::contract::receiver::{message, now, text};
use crate::support::ClockExt as _;
use crate::test_database::TestDatabase;

/// Two gateways' stores on one new database.
async fn two_gateways() -> (TestDatabase, Store, Store) {
    let db = TestDatabase::create().await;
    let config: StoreConfig = db.config();
    let g1 = Store::open(&config).await.expect("gateway 1");
    let g2 = Store::open(&config).await.expect("gateway 2");
    (db, g1, g2)
}

/// Every inbox entry, oldest first.
async fn whole_inbox(store: &Store) -> Vec<wsr_gateway::store::InboxEntry> {
    store.inbox(0, 100_000).await.expect("inbox")
}

#[tokio::test]
async fn resends_of_one_message_through_two_gateways_at_once_are_delivered_once() {
    let (_db, g1, g2) = two_gateways().await;
    for round in 0..10 {
        let m = message(
            &format!("mid:resent-{round}@cluster"),
            None,
            ReplyPattern::Response,
            text("<a/>"),
        );
        let sends: Vec<_> = (0..8)
            .map(|i| {
                let store = if i % 2 == 0 { g1.clone() } else { g2.clone() };
                let m = m.clone();
                tokio::spawn(async move { store.receive(m).await })
            })
            .collect();
        for send in sends {
            let received = send.await.expect("task").expect("stored");
            assert_eq!(received.verdict, Verdict::Ack, "every copy is acked");
        }
    }
    let inbox = whole_inbox(&g1).await;
    let groups: BTreeSet<&str> = inbox.iter().map(|e| e.group_id.as_str()).collect();
    assert_eq!(inbox.len(), 10, "one delivery per message: {inbox:?}");
    assert_eq!(groups.len(), 10);
}

#[tokio::test]
async fn an_ordered_group_split_over_two_gateways_is_delivered_in_order_without_gaps() {
    let (_db, g1, g2) = two_gateways().await;
    const N: u64 = 60;
    // Highest numbers first, alternating gateways, all at once: most wait in the buffer of
    // a group whose state the two gateways take turns deciding on.
    let sends: Vec<_> = (0..N)
        .rev()
        .map(|n| {
            let store = if n % 2 == 0 { g1.clone() } else { g2.clone() };
            let m = message(
                "mid:ordered@cluster",
                Some(n),
                ReplyPattern::Response,
                text(&format!("<n>{n}</n>")),
            );
            tokio::spawn(async move { store.receive(m).await })
        })
        .collect();
    for send in sends {
        send.await.expect("task").expect("stored");
    }
    let numbers: Vec<Option<u64>> = whole_inbox(&g2).await.iter().map(|e| e.number).collect();
    assert_eq!(numbers, (0..N).map(Some).collect::<Vec<_>>());
    let group = g1
        .group("", "mid:ordered@cluster")
        .await
        .expect("read")
        .expect("group");
    assert!(group.buffered.is_empty(), "nothing left waiting");
}

/// Polls the server until some backend of `db` is in the state `condition` (a WHERE clause on
/// pg_stat_activity) names: the event a test waits for, not a guess at a duration.
async fn until_a_backend(db: &TestDatabase, condition: &'static str) {
    let mut conn = db.connect().await;
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND {condition})"
    );
    for _ in 0..1_000 {
        let found: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.clone()))
            .fetch_one(&mut conn)
            .await
            .expect("pg_stat_activity");
        if found {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("no backend came to {condition}");
}

/// A message whose commit is slow (a trigger sleeps in its transaction, after its offset was
/// taken) and one received meanwhile through the other gateway: a cursor that reads while the
/// first is still uncommitted must not see the second yet, or it would move past the first
/// and never see it.
#[tokio::test]
async fn a_message_that_commits_late_is_not_skipped_by_a_cursor() {
    let (db, g1, g2) = two_gateways().await;
    db.execute(
        "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_sleep(2); RETURN NEW; END $$",
    )
    .await;
    db.execute(
        "CREATE TRIGGER slow_commit AFTER INSERT ON inbox FOR EACH ROW \
         WHEN (NEW.group_id LIKE 'mid:slow%') EXECUTE FUNCTION slow_commit()",
    )
    .await;
    let slow = {
        let g1 = g1.clone();
        tokio::spawn(async move {
            g1.receive(message(
                "mid:slow@cluster",
                None,
                ReplyPattern::Response,
                text("<a/>"),
            ))
            .await
        })
    };
    until_a_backend(&db, "wait_event = 'PgSleep'").await;
    let fast = {
        let g2 = g2.clone();
        tokio::spawn(async move {
            g2.receive(message(
                "mid:fast@cluster",
                None,
                ReplyPattern::Response,
                text("<b/>"),
            ))
            .await
        })
    };
    // The fast one either waits for the slow one's offsets or (wrongly) commits past them.
    let mut fast = Some(fast);
    while fast.as_ref().is_some_and(|f| !f.is_finished()) {
        let waiting: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock')",
        )
        .fetch_one(&mut db.connect().await)
        .await
        .expect("pg_stat_activity");
        if waiting {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let mut cursor = 0;
    let mut seen = Vec::new();
    for e in g1.inbox(cursor, 10).await.expect("page") {
        cursor = e.offset;
        seen.push(e.group_id);
    }
    slow.await.expect("task").expect("stored");
    if let Some(fast) = fast.take() {
        fast.await.expect("task").expect("stored");
    }
    for e in g1.inbox(cursor, 10).await.expect("page") {
        seen.push(e.group_id);
    }
    seen.sort();
    assert_eq!(
        seen,
        ["mid:fast@cluster", "mid:slow@cluster"],
        "the cursor skipped one"
    );
}

#[tokio::test]
async fn a_message_received_by_one_gateway_wakes_the_other_ones_fetchers() {
    let (_db, g1, g2) = two_gateways().await;
    let mut appended = g1.inbox_appends();
    appended.borrow_and_update();
    g2.receive(message(
        "mid:wake@cluster",
        None,
        ReplyPattern::Response,
        text("<a/>"),
    ))
    .await
    .expect("stored");
    tokio::time::timeout(std::time::Duration::from_secs(10), appended.changed())
        .await
        .expect("gateway 1 heard of gateway 2's commit")
        .expect("store alive");
}

#[tokio::test]
async fn a_held_response_completes_when_the_gap_is_filled_through_the_other_gateway() {
    let (_db, g1, g2) = two_gateways().await;
    let second = message(
        "mid:gap@cluster",
        Some(1),
        ReplyPattern::Response,
        text("<n>1</n>"),
    );
    let key = second.request.key();
    let held = g1.watch_delivery("", &key);
    // Buffered ahead of the gap: not acked yet (the HTTP layer holds its answer).
    assert_eq!(
        g1.receive(second).await.expect("buffered").verdict,
        Verdict::NoAck
    );
    g2.receive(message(
        "mid:gap@cluster",
        Some(0),
        ReplyPattern::Response,
        text("<n>0</n>"),
    ))
    .await
    .expect("stored");
    tokio::time::timeout(std::time::Duration::from_secs(10), held)
        .await
        .expect("gateway 1's held request was told")
        .expect("told, not dropped");
}

#[tokio::test]
async fn a_callback_ack_is_sent_by_one_gateway_and_taken_over_when_its_lease_runs_out() {
    let (_db, g1, g2) = two_gateways().await;
    let mut m = message(
        "mid:callback@cluster",
        None,
        ReplyPattern::Callback(ReplyTo {
            uri: "http://127.0.0.1:9/acks".into(),
            reference_scheme: None,
        }),
        text("<a/>"),
    );
    m.now = now();
    g1.receive(m.clone()).await.expect("stored");
    let t = m.now + Duration::seconds(1);
    let taken = g1.due_callbacks(t, 10).await.expect("due");
    assert_eq!(taken.len(), 1);
    assert!(
        g2.due_callbacks(t, 10).await.expect("due").is_empty(),
        "the other gateway does not send it too"
    );
    // Gateway 1 dies before it sent it: once its lease runs out the other one takes it.
    let next = g2
        .next_callback_due()
        .await
        .expect("next")
        .expect("still owed");
    assert!(next > t, "due again only after the lease");
    let taken_over = g2.due_callbacks(next, 10).await.expect("due");
    assert_eq!(taken_over.len(), 1);
    assert_eq!(taken_over[0].id, taken[0].id);
    g2.callbacks_sent(&[taken_over[0].id]).await.expect("sent");
    assert_eq!(g1.next_callback_due().await.expect("next"), None);
}

/// A gateway's configuration on `db`, and the test clock the gateways of a test share (a
/// lease written by one is judged by the other on the same clock).
fn gateway_config(db: &TestDatabase) -> (wsr_gateway::Config, wsr_gateway::clock::ManualClock) {
    let mut config = wsr_gateway::Config::for_tests("unused.db".into());
    config.database = db.config().database;
    (
        config,
        wsr_gateway::clock::ManualClock::new(chrono::Utc::now()),
    )
}

/// Two gateways (one process each, as far as the database can tell) on one new database,
/// sharing one test clock.
async fn two_running_gateways(
    db: &TestDatabase,
) -> (crate::support::TestApp, crate::support::TestApp) {
    let (mut config, clock) = gateway_config(db);
    config.callback_retry_initial = std::time::Duration::from_millis(20);
    config.callback_retry_max = std::time::Duration::from_millis(200);
    let g1 = crate::support::start(config.clone(), clock.clone()).await;
    let g2 = crate::support::start(config, clock).await;
    (g1, g2)
}

/// A callback endpoint whose first POST never gets an answer (its gateway dies holding it);
/// every later one is recorded and answered 200.
async fn endpoint_that_hangs_once() -> (
    String,
    tokio::sync::mpsc::UnboundedReceiver<String>,
    tokio::sync::oneshot::Receiver<()>,
) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (posts, received) = tokio::sync::mpsc::unbounded_channel();
    let (hung, first_arrived) = tokio::sync::oneshot::channel();
    let hung = std::sync::Arc::new(std::sync::Mutex::new(Some(hung)));
    let answered_once = std::sync::Arc::new(AtomicBool::new(false));
    let handler = move |body: axum::body::Bytes| {
        let (posts, hung, answered_once) = (posts.clone(), hung.clone(), answered_once.clone());
        async move {
            if !answered_once.swap(true, Ordering::SeqCst) {
                if let Some(told) = hung.lock().expect("lock").take() {
                    let _ = told.send(());
                }
                std::future::pending::<()>().await;
            }
            let _ = posts.send(String::from_utf8_lossy(&body).into_owned());
            axum::http::StatusCode::OK
        }
    };
    let router = axum::Router::new().route("/acks", axum::routing::post(handler));
    let url = format!("{}/acks", crate::support::serve_local(router).await);
    (url, received, first_arrived)
}

/// A gateway dies while its callback POST is in flight: the other one sends the ack once the
/// lease of the dead one has run out (60 s of clock: taken over within 2× the lease).
#[tokio::test]
async fn a_callback_ack_held_by_a_gateway_killed_mid_post_is_sent_by_the_other() {
    let db = TestDatabase::create().await;
    let (g1, g2) = two_running_gateways(&db).await;
    let (url, mut posts, first_arrived) = endpoint_that_hangs_once().await;
    g1.register_callback(&url).await;
    let request = wsr_gateway::wsr::Request {
        reply_pattern: ReplyPattern::Callback(ReplyTo::bare(&url)),
        expiry_time: g1.clock.now_utc() + Duration::hours(1),
        ..message("mid:orphan@cluster", None, ReplyPattern::Response, text("")).request
    };
    let xml = crate::support::request_envelope(&request, "<p:Order xmlns:p=\"urn:p\"/>");
    let answer = g1.send(wsr_gateway::wsr::SoapVersion::Soap11, xml).await;
    assert_eq!(answer.status, 202, "{}", answer.body);
    tokio::time::timeout(std::time::Duration::from_secs(10), first_arrived)
        .await
        .expect("one gateway POSTed the ack")
        .expect("told");
    // Kill whichever gateway holds it.
    let holder: String = sqlx::query_scalar("SELECT lease_owner FROM pending_callbacks")
        .fetch_one(&mut db.connect().await)
        .await
        .expect("the ack is leased");
    let (dead, survivor) = if g1.store.gateway_id() == holder {
        (g1, g2)
    } else {
        (g2, g1)
    };
    assert_eq!(dead.store.gateway_id(), holder);
    dead.kill();
    assert!(posts.try_recv().is_err(), "nobody sent it yet");
    survivor.clock.advance(Duration::seconds(61));
    let body = tokio::time::timeout(std::time::Duration::from_secs(10), posts.recv())
        .await
        .expect("the surviving gateway sent the ack after the lease")
        .expect("posted");
    assert!(body.contains("mid:orphan@cluster"), "{body}");
    // The endpoint hands the body over before its 200 reaches the gateway, which forgets the
    // ack only then: wait (bounded) for that.
    crate::support::eventually("sent once, forgotten", || async {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pending_callbacks")
            .fetch_one(&mut db.connect().await)
            .await
            .expect("count");
        (left == 0).then_some(())
    })
    .await;
    assert!(posts.try_recv().is_err(), "sent once");
}

/// Messages arriving together are decided in one transaction (the group-commit writer); a
/// message whose decision fails — its group's stored state unreadable, or the rules panicking
/// on it — fails alone, and the rest are stored with offsets that leave no gap.
#[tokio::test]
async fn a_message_that_fails_in_a_batch_fails_alone() {
    let (db, g1, _g2) = two_gateways().await;
    let broken = "mid:broken@batch";
    g1.receive(message(
        broken,
        Some(0),
        ReplyPattern::Response,
        text("<n>0</n>"),
    ))
    .await
    .expect("first of the group");
    db.execute("UPDATE groups SET state_bin = '\\x00'::bytea WHERE group_id = 'mid:broken@batch'")
        .await;
    g1.panic_on_group(Some("mid:doomed@batch"));
    let mut sends: Vec<_> = (0..40)
        .map(|i| {
            let store = g1.clone();
            let m = message(
                &format!("mid:single-{i}@batch"),
                None,
                ReplyPattern::Response,
                text("<a/>"),
            );
            tokio::spawn(async move { store.receive(m).await })
        })
        .collect();
    for (group, number) in [(broken, Some(1)), ("mid:doomed@batch", None)] {
        let store = g1.clone();
        let m = message(group, number, ReplyPattern::Response, text("<b/>"));
        sends.insert(20, tokio::spawn(async move { store.receive(m).await }));
    }
    let mut failures = Vec::new();
    for send in sends {
        match send.await.expect("task") {
            Ok(received) => assert_eq!(received.verdict, Verdict::Ack),
            Err(e) => failures.push(e.to_string()),
        }
    }
    failures.sort();
    assert_eq!(failures.len(), 2, "{failures:?}");
    assert!(failures[0].contains("corrupt"), "{failures:?}");
    assert!(failures[1].contains("injected panic"), "{failures:?}");
    let offsets: Vec<i64> = whole_inbox(&g1).await.iter().map(|e| e.offset).collect();
    assert_eq!(
        offsets,
        (1..=41).collect::<Vec<_>>(),
        "the first message and the 40 singletons"
    );
}

/// A gateway dies while its POST of an outbound message is in flight: another gateway of the
/// database resends it, same message, once the attempt's wait has run out on the clock (the
/// wait is the attempt's lease: taken over within it, however long the dead POST hangs).
#[tokio::test]
async fn an_outbound_message_whose_gateway_died_mid_post_is_resent_by_another() {
    const TOKEN: &str = "producer-token-cluster-01";
    let db = TestDatabase::create().await;
    let (mut config, clock) = gateway_config(&db);
    config.tokens = vec![crate::support::producer_token(TOKEN)];
    crate::support::allow_loopback_urls(&mut config);
    let g1 = crate::support::start(config.clone(), clock.clone()).await;
    let (url, mut posts, first_arrived) = endpoint_that_hangs_once().await;
    let (status, answer) = crate::support::submit_as(
        &g1,
        TOKEN,
        serde_json::json!({
            "destination": url,
            "agreement": { "waits_ms": [30_000, 30_000], "expiry_seconds": 3600 },
            "body": "<r:Once xmlns:r=\"urn:r\"/>",
        }),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    let group_id = answer["group_id"].as_str().expect("group id").to_owned();
    tokio::time::timeout(std::time::Duration::from_secs(10), first_arrived)
        .await
        .expect("gateway 1 POSTed the message")
        .expect("told");
    g1.kill();
    let g2 = crate::support::start(config, clock.clone()).await;
    assert!(posts.try_recv().is_err(), "nobody resent it yet");
    clock.advance(Duration::seconds(31));
    let body = tokio::time::timeout(std::time::Duration::from_secs(10), posts.recv())
        .await
        .expect("gateway 2 resent the message after the attempt's wait")
        .expect("posted");
    assert!(body.contains(&group_id), "the same message: {body}");
    let m = g2
        .store
        .out_message(answer["id"].as_str().expect("id"))
        .await
        .expect("read")
        .expect("stored");
    assert_eq!(m.outbound.attempts, 2, "one attempt each");
}

/// A gateway dies while its push worker's POST is in flight: the message's lease runs out (its
/// ack wait, on the clock) and the other gateway's push worker — a push session of its own —
/// delivers it again.
#[tokio::test]
async fn a_push_held_by_a_gateway_killed_mid_post_is_pushed_by_the_other() {
    use crate::delivery::{ADMIN, Api, OWNER, deliver_singletons, tokens, webhook};
    let db = TestDatabase::create().await;
    let (mut config, clock) = gateway_config(&db);
    config.tokens = tokens();
    let g1 = crate::support::start(config.clone(), clock.clone()).await;
    // The first push hangs (past the gateway's death); every later one is accepted.
    let mut hook = webhook(vec![0], 0).await;
    let (status, _) = Api::of(&g1, ADMIN)
        .post(
            "/api/v1/push-endpoints",
            serde_json::json!({ "url": hook.url, "principal": "*" }),
        )
        .await;
    assert_eq!(status, 201);
    let sub = Api::of(&g1, OWNER)
        .create(serde_json::json!({
            "name": "hooked", "filter": "default/#", "mode": "push", "push_url": hook.url,
            "ack_wait_ms": 10_000,
        }))
        .await;
    deliver_singletons(&g1, "Order", 1).await;
    let first = hook.next().await;
    assert_eq!(first["attempt"], 1);
    g1.kill();
    let g2 = crate::support::start(config, clock.clone()).await;
    clock.advance(Duration::seconds(11));
    let second = hook.next().await;
    assert_eq!(second["offset"], first["offset"], "the same message");
    assert_eq!(second["attempt"], 2);
    let (_, s) = Api::of(&g2, OWNER)
        .get(&format!("/api/v1/subscriptions/{sub}"))
        .await;
    assert_eq!(s["mode"], "push", "{s}");
}

/// An operator signed in to the console through one gateway is signed in at every gateway of
/// the cluster: the cookie is signed with the store's key, not kept in a gateway's memory.
#[tokio::test]
async fn a_console_sign_in_at_one_gateway_holds_at_the_other() {
    use crate::delivery::{ADMIN, tokens};
    let db = TestDatabase::create().await;
    let (mut config, clock) = gateway_config(&db);
    config.tokens = tokens();
    let g1 = crate::support::start(config.clone(), clock.clone()).await;
    let g2 = crate::support::start(config, clock).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let signed_in = client
        .post(g1.url("/console/login"))
        .header(reqwest::header::ORIGIN, format!("http://{}", g1.addr))
        .header(
            reqwest::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .body(format!("token={ADMIN}"))
        .send()
        .await
        .expect("answers");
    assert_eq!(signed_in.status(), 303);
    let cookie = signed_in.headers()[reqwest::header::SET_COOKIE]
        .to_str()
        .expect("text")
        .split(';')
        .next()
        .expect("pair")
        .to_owned();
    for gateway in [&g1, &g2] {
        let page = client
            .get(gateway.url("/console"))
            .header(reqwest::header::COOKIE, &cookie)
            .send()
            .await
            .expect("answers");
        assert_eq!(page.status(), 200, "{}", gateway.addr);
    }
    g1.stop().await;
    g2.stop().await;
}

/// Log out at one gateway ends the sign-in at every gateway of the cluster: a copy of the
/// cookie, good at both before, is refused at the other one on a page and on an action.
#[tokio::test]
async fn a_console_sign_out_at_one_gateway_holds_at_the_other() {
    use crate::console_sign_out::{ADMIN, assert_signed_out, sign_in};
    use wsr_gateway::config::{ApiToken, Scope};
    let db = TestDatabase::create().await;
    let (mut config, clock) = gateway_config(&db);
    config.tokens = vec![ApiToken::plain(ADMIN, "ops", vec![Scope::Admin])];
    let g1 = crate::support::start(config.clone(), clock.clone()).await;
    let g2 = crate::support::start(config, clock).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let cookie = sign_in(&g1).await;
    let copy = cookie.clone();
    for gateway in [&g1, &g2] {
        let page = client
            .get(gateway.url("/console"))
            .header(reqwest::header::COOKIE, &copy)
            .send()
            .await
            .expect("answers");
        assert_eq!(page.status(), 200, "{}", gateway.addr);
    }
    let out = client
        .post(g1.url("/console/logout"))
        .header(reqwest::header::COOKIE, &cookie)
        .header(reqwest::header::ORIGIN, format!("http://{}", g1.addr))
        .send()
        .await
        .expect("answers");
    assert_eq!(out.status(), 200);
    assert_signed_out(&g2, &copy).await;
    assert_signed_out(&g1, &copy).await;
    // A sign-in made at the other gateway is a new one, and holds at both.
    let fresh = sign_in(&g2).await;
    for gateway in [&g1, &g2] {
        let page = client
            .get(gateway.url("/console"))
            .header(reqwest::header::COOKIE, &fresh)
            .send()
            .await
            .expect("answers");
        assert_eq!(page.status(), 200, "{}", gateway.addr);
    }
    g1.stop().await;
    g2.stop().await;
}

/// A request-response request (D16) sent to one gateway while its copy arrives at the other:
/// the copy waits for the call the first gateway made, then gets the same bytes; the service
/// is called once.
#[tokio::test]
async fn a_request_response_copy_at_the_other_gateway_waits_for_the_call_and_gets_its_bytes() {
    use std::sync::Arc;

    use crate::request_response::{Reply, Script, by_backend, call, request, soap_service};
    use wsr_gateway::wsr::SoapVersion;

    let db = TestDatabase::create().await;
    let script = Script::default();
    let release = Arc::new(tokio::sync::Notify::new());
    script.then(Reply::After(release.clone()));
    let url = soap_service(&script).await;
    let (mut config, clock) = gateway_config(&db);
    config.channels.insert(
        "echo".into(),
        wsr_gateway::rmp::agreement::Agreement::everything(),
    );
    config.anonymous_channels.insert("echo".into());
    config.hold = std::time::Duration::from_secs(10);
    let mut op = by_backend(&url);
    if let wsr_gateway::outbound::backend::Responder::Backend(b) = &mut op.responder {
        b.timeout = std::time::Duration::from_secs(10);
    }
    config.operations.insert("echo".into(), op);
    let g1 = Arc::new(crate::support::start(config.clone(), clock.clone()).await);
    let g2 = Arc::new(crate::support::start(config, clock).await);
    let r = request(&g1, "mid:rr-cluster", None, ReplyPattern::Response);
    let (a, r1) = (g1.clone(), r.clone());
    let original = tokio::spawn(async move { call(&a, SoapVersion::Soap11, &r1).await });
    crate::support::eventually("the call is out", || async {
        (!script.calls().is_empty()).then_some(())
    })
    .await;
    let (b, r2) = (g2.clone(), r.clone());
    let copy = tokio::spawn(async move { call(&b, SoapVersion::Soap11, &r2).await });
    release.notify_one();
    let original = original.await.expect("original");
    let copy = copy.await.expect("copy");
    assert_eq!(original.status, 200, "{}", original.body);
    assert_eq!(
        copy.body, original.body,
        "the same bytes through the other gateway"
    );
    assert_eq!(script.calls().len(), 1);
}

/// Issue 32: a UsernameToken's nonce is used once on the whole cluster.
#[tokio::test]
async fn a_token_nonce_used_at_one_gateway_is_a_replay_at_the_other() {
    use crate::username_token::{PASSWORD, post, secured, token, token_partners};
    let db = TestDatabase::create().await;
    let (mut config, clock) = gateway_config(&db);
    token_partners(&mut config);
    let g1 = crate::support::start(config.clone(), clock.clone()).await;
    let g2 = crate::support::start(config, clock.clone()).await;
    let once = token(PASSWORD, true, chrono::Utc::now());
    let first = post(&g1, "orders", secured("mid:cluster-1@wss", &once)).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let replay = post(&g2, "orders", secured("mid:cluster-2@wss", &once)).await;
    assert_eq!(replay.status, 401, "{}", replay.body);
    g1.stop().await;
    g2.stop().await;
}
