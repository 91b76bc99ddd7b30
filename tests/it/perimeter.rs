//! The perimeter (issue 12 items 3 and 9): header, body and idle timeouts, the connection and
//! in-flight caps, body memory that follows the bytes received (a child process's RSS), and
//! the signals: SIGTERM drains, SIGHUP does not stop the gateway (without TLS it has nothing to
//! reload).

use std::time::{Duration, Instant};

use chrono::Utc;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use wsr_gateway::wsr::{GroupId, MessageId, ReplyPattern, Request, SequenceNum};

use super::support::{free_port, spawn_app_with, start_gateway};

/// The longest any test here waits for the gateway to do what it must.
const BOUND: Duration = Duration::from_secs(10);

/// Reads until the gateway closes the connection (EOF or reset); fails after `BOUND`.
async fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 8192];
    let closed = tokio::time::timeout(BOUND, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the gateway kept the connection open for {BOUND:?}; it answered {:?}",
        String::from_utf8_lossy(&seen)
    );
    String::from_utf8_lossy(&seen).into_owned()
}

/// Reads one whole `/healthz` answer ("ok\n") from a keep-alive connection.
async fn read_health(stream: &mut TcpStream) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    tokio::time::timeout(BOUND, async {
        while !seen.ends_with(b"ok\n") {
            let n = stream.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed before answering");
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("answered in time");
    String::from_utf8_lossy(&seen).into_owned()
}

const HEALTH: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n";

fn post_head(length: usize) -> String {
    format!(
        "POST /wsr/default HTTP/1.1\r\nHost: t\r\nContent-Type: text/xml\r\nContent-Length: {length}\r\n\r\n"
    )
}

#[tokio::test]
async fn partial_header_is_closed_after_the_header_timeout() {
    let app = spawn_app_with(|c| c.perimeter.header_timeout = Duration::from_millis(300)).await;
    let mut slow = TcpStream::connect(app.addr).await.expect("connect");
    slow.write_all(b"POST /wsr/default HTTP/1.1\r\nHost: t\r\n")
        .await
        .expect("write");
    let started = Instant::now();
    read_until_closed(&mut slow).await;
    assert!(started.elapsed() >= Duration::from_millis(250));
    // A connection that says nothing at all is cut the same way.
    let mut silent = TcpStream::connect(app.addr).await.expect("connect");
    read_until_closed(&mut silent).await;
    app.stop().await;
}

#[tokio::test]
async fn stalled_body_is_cut_with_408() {
    let app = spawn_app_with(|c| c.perimeter.body_timeout = Duration::from_millis(300)).await;
    let mut stalled = TcpStream::connect(app.addr).await.expect("connect");
    stalled
        .write_all(format!("{}<soap:Envelope", post_head(1000)).as_bytes())
        .await
        .expect("write");
    let answer = read_until_closed(&mut stalled).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    app.stop().await;
}

/// Sends `start` at once, then a byte every 100 ms (never a 300 ms pause, but 10 B/s) to a
/// gateway whose bodies must come at 1 000 B/s in every 300 ms window; returns what it
/// answered and how long after `start` it cut the body.
async fn trickle_after(start: String) -> (String, Duration) {
    let app = spawn_app_with(|c| {
        c.perimeter.body_timeout = Duration::from_millis(300);
        c.perimeter.body_min_bytes_per_second = 1000;
    })
    .await;
    let stream = TcpStream::connect(app.addr).await.expect("connect");
    let (mut reader, mut writer) = stream.into_split();
    writer.write_all(start.as_bytes()).await.expect("write");
    let started = Instant::now();
    let trickling = tokio::spawn(async move {
        for _ in 0..200 {
            if writer.write_all(b" ").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut seen = String::new();
    tokio::time::timeout(BOUND, reader.read_to_string(&mut seen))
        .await
        .expect("the gateway cut the trickle in time")
        .ok();
    let took = started.elapsed();
    trickling.abort();
    app.stop().await;
    (seen, took)
}

#[tokio::test]
async fn slow_drip_body_is_cut_by_the_minimum_rate() {
    let (seen, _) = trickle_after(post_head(10_000)).await;
    assert!(seen.starts_with("HTTP/1.1 408"), "{seen}");
}

/// The minimum rate holds in every window, not on average since the start: a fast start does
/// not buy a long trickle (64 KiB at once, then a byte every 100 ms, was allowed ~64 s while
/// holding its share of the body budget).
#[tokio::test]
async fn a_fast_start_does_not_buy_a_slow_trickle() {
    let start = format!("{}{}", post_head(200_000), " ".repeat(64 * 1024));
    let (seen, took) = trickle_after(start).await;
    assert!(seen.starts_with("HTTP/1.1 408"), "{seen}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[tokio::test]
async fn idle_keep_alive_connection_is_closed() {
    let app = spawn_app_with(|c| {
        c.perimeter.idle_timeout = Duration::from_millis(300);
        c.perimeter.header_timeout = Duration::from_secs(60);
    })
    .await;
    let mut idle = TcpStream::connect(app.addr).await.expect("connect");
    idle.write_all(HEALTH).await.expect("write");
    assert!(read_health(&mut idle).await.starts_with("HTTP/1.1 200"));
    let started = Instant::now();
    read_until_closed(&mut idle).await;
    assert!(started.elapsed() >= Duration::from_millis(250));
    app.stop().await;
}

/// A Response-pattern answer that waits for a gap (hold) is a long request: the idle timeout,
/// shorter than the hold, does not cut it.
#[tokio::test]
async fn a_held_answer_outlives_the_idle_timeout() {
    let app = spawn_app_with(|c| {
        c.perimeter.idle_timeout = Duration::from_millis(100);
        c.hold = Duration::from_millis(600);
    })
    .await;
    let answer = app
        .client
        .post(app.url("/wsr/default"))
        .header("content-type", "text/xml; charset=utf-8")
        .body(held_message("mid:perimeter-idle@test"))
        .send()
        .await
        .expect("the held request is answered");
    assert!(answer.status().is_success(), "{}", answer.status());
    app.stop().await;
}

#[tokio::test]
async fn requests_beyond_the_in_flight_cap_get_503_with_retry_after() {
    let app = spawn_app_with(|c| c.perimeter.max_requests_in_flight = 1).await;
    // One request in flight: its body is still coming.
    let mut busy = TcpStream::connect(app.addr).await.expect("connect");
    busy.write_all(format!("{}<soap:", post_head(100)).as_bytes())
        .await
        .expect("write");
    // The same class (partners'): other classes have budgets of their own (`fair_shares.rs`).
    let url = app.url("/wsr/default");
    let refused = tokio::time::timeout(BOUND, async {
        loop {
            let r = app
                .client
                .post(&url)
                .body("x")
                .send()
                .await
                .expect("answer");
            if r.status() == 503 {
                break r;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a second request is refused while the first is in flight");
    assert_eq!(
        refused
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    // Health checks still answer.
    let health = app
        .client
        .get(app.url("/healthz"))
        .send()
        .await
        .expect("ok");
    assert_eq!(health.status(), 200);
    // The first request finishes; the next one is served again.
    busy.write_all(&[b' '; 95]).await.expect("write");
    let mut answer = [0u8; 16];
    tokio::time::timeout(BOUND, busy.read_exact(&mut answer))
        .await
        .expect("answered")
        .expect("read");
    assert!(answer.starts_with(b"HTTP/1.1 "));
    let again = app
        .client
        .post(&url)
        .body("x")
        .send()
        .await
        .expect("answer");
    assert_ne!(again.status(), 503, "served again");
    app.stop().await;
}

#[tokio::test]
async fn beyond_max_connections_accepting_waits_for_a_free_slot() {
    let app = spawn_app_with(|c| c.perimeter.max_connections = 2).await;
    let mut first = TcpStream::connect(app.addr).await.expect("connect");
    let mut second = TcpStream::connect(app.addr).await.expect("connect");
    for c in [&mut first, &mut second] {
        c.write_all(HEALTH).await.expect("write");
        read_health(c).await;
    }
    let mut third = TcpStream::connect(app.addr).await.expect("kernel backlog");
    third.write_all(HEALTH).await.expect("write");
    let mut byte = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), third.read(&mut byte))
            .await
            .is_err(),
        "a third connection is not served while two are open"
    );
    drop(first);
    assert!(read_health(&mut third).await.starts_with("HTTP/1.1 200"));
    app.stop().await;
}

/// Security review (second round), item 4: nearly complete bodies stalled by one address
/// hold only that address's share of the body budget; another address is served meanwhile.
#[tokio::test]
async fn one_sources_stalled_bodies_hold_only_its_share_of_the_body_budget() {
    let app = spawn_app_with(|c| {
        c.limits.max_bytes = 10_000;
        c.perimeter.max_body_bytes_in_flight = 40_000;
        c.perimeter.max_body_bytes_in_flight_per_source = 15_000;
    })
    .await;
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let mut c = TcpStream::connect(app.addr).await.expect("connect");
        c.write_all(post_head(10_000).as_bytes())
            .await
            .expect("head");
        c.write_all(&[b' '; 9_000]).await.expect("most of the body");
        stalled.push(c);
    }
    // 18 000 bytes would exceed the address's 15 000: one of the two is refused at once (the
    // other waits for the rest of its body).
    let (mut a, mut b) = (stalled.remove(0), stalled.remove(0));
    let (mut head_a, mut head_b) = ([0u8; 12], [0u8; 12]);
    let refused = tokio::time::timeout(BOUND, async {
        tokio::select! {
            r = a.read_exact(&mut head_a) => r.map(|_| head_a),
            r = b.read_exact(&mut head_b) => r.map(|_| head_b),
        }
    })
    .await
    .expect("one body is refused")
    .expect("an answer");
    assert_eq!(&refused, b"HTTP/1.1 503");

    // Another address (127.0.0.2 is loopback too) gets its message acked meanwhile.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.2:0".parse().expect("address"))
        .expect("bind 127.0.0.2");
    let mut other = socket.connect(app.addr).await.expect("connect");
    let request = Request {
        message_id: MessageId {
            group_id: GroupId::parse("mid:share-other@test").expect("group"),
            sequence: None,
        },
        expiry_time: Utc::now() + chrono::Duration::hours(1),
        reply_pattern: ReplyPattern::Response,
        ack_requested: true,
        duplicate_elimination: true,
        message_order: false,
    };
    let body = super::support::request_envelope(&request, "<p:Item xmlns:p=\"urn:p\">1</p:Item>");
    other
        .write_all(format!("{}{body}", post_head(body.len())).as_bytes())
        .await
        .expect("write");
    let mut head = [0u8; 12];
    tokio::time::timeout(BOUND, other.read_exact(&mut head))
        .await
        .expect("answered while the other address's bodies stall")
        .expect("read");
    assert_eq!(&head, b"HTTP/1.1 200");
    drop((a, b));
    app.stop().await;
}

/// An ordered Response-pattern message whose predecessor never came: the gateway holds the
/// answer for `hold_ms`.
fn held_message(group: &str) -> String {
    let request = Request {
        message_id: MessageId {
            group_id: GroupId::parse(group).expect("group"),
            sequence: Some(SequenceNum {
                number: 1,
                last: false,
                group_limit: None,
            }),
        },
        expiry_time: Utc::now() + chrono::Duration::hours(1),
        reply_pattern: ReplyPattern::Response,
        ack_requested: true,
        duplicate_elimination: true,
        message_order: true,
    };
    super::support::request_envelope(&request, "<p:Item xmlns:p=\"urn:perimeter\">1</p:Item>")
}

const ADMIN: &str = "perimeter-admin-0123456789";

/// A child gateway with `extra` TOML lines; its port and the process.
fn child(dir: &std::path::Path, extra: &str) -> (u16, std::process::Child) {
    let port = free_port();
    let config = dir.join("gw.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndatabase = {:?}\n{extra}\n[[tokens]]\ntoken = \"{ADMIN}\"\nprincipal = \"ops\"\nscopes = [\"admin\"]\n",
            dir.join("gw.db").display().to_string()
        ),
    )
    .expect("config");
    (port, start_gateway(&config))
}

fn signal(child: &std::process::Child, name: &str) {
    let status = std::process::Command::new("kill")
        .args([format!("-{name}"), child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

/// Waits (bounded) for the child to exit and gives its status.
async fn exited(mut child: std::process::Child, within: Duration) -> std::process::ExitStatus {
    let waited = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if started.elapsed() > within {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    waited
        .await
        .expect("waiter")
        .unwrap_or_else(|| panic!("the gateway did not exit within {within:?}"))
}

#[tokio::test]
async fn sigterm_answers_the_request_in_flight_and_exits_0() {
    let dir = tempfile::tempdir().expect("dir");
    let (port, child) = child(dir.path(), "hold_ms = 3000");
    let client = reqwest::Client::new();
    let group = "mid:perimeter-term@test";
    let held = tokio::spawn({
        let client = client.clone();
        let body = held_message(group);
        async move {
            client
                .post(format!("http://127.0.0.1:{port}/wsr/default"))
                .header("content-type", "text/xml; charset=utf-8")
                .body(body)
                .send()
                .await
        }
    });
    // The message is buffered (so its answer is being held) before the signal goes.
    tokio::time::timeout(BOUND, async {
        loop {
            let g = client
                .get(format!("http://127.0.0.1:{port}/api/v1/groups/{group}"))
                .bearer_auth(ADMIN)
                .send()
                .await
                .expect("admin answers");
            if g.status() == 200 {
                let v: serde_json::Value = g.json().await.expect("json");
                if v["buffered"].as_array().is_some_and(|b| !b.is_empty()) {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the message is buffered");
    signal(&child, "TERM");
    let answer = tokio::time::timeout(BOUND, held)
        .await
        .expect("answered in time")
        .expect("task")
        .expect("the request in flight gets its answer");
    assert!(answer.status().is_success(), "{}", answer.status());
    let status = exited(child, Duration::from_secs(8)).await;
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[tokio::test]
async fn sighup_is_ignored() {
    let dir = tempfile::tempdir().expect("dir");
    let (port, mut child) = child(dir.path(), "");
    signal(&child, "HUP");
    let health = reqwest::get(format!("http://127.0.0.1:{port}/healthz"))
        .await
        .expect("still serving after SIGHUP");
    assert_eq!(health.status(), 200);
    assert!(child.try_wait().expect("try_wait").is_none());
    signal(&child, "INT");
    let status = exited(child, Duration::from_secs(8)).await;
    assert_eq!(status.code(), Some(0), "{status:?}");
}

/// 64 connections announce 16 MiB each, send 2 MiB and stall: the gateway's peak RSS grows
/// by less than 64 MiB (before the fix: the bodies stayed, well over 64 MiB, and the
/// connections were never cut).
#[tokio::test]
async fn unfinished_bodies_do_not_pin_memory() {
    const CONNECTIONS: usize = 64;
    const SENT: usize = 2 * 1024 * 1024;
    let dir = tempfile::tempdir().expect("dir");
    // The default byte budget (twice max_message_bytes); a short body timeout ends the test.
    let (port, child) = child(dir.path(), "body_timeout_ms = 1000");
    let pid = child.id();
    let warm = reqwest::get(format!("http://127.0.0.1:{port}/healthz"))
        .await
        .expect("healthz");
    assert_eq!(warm.status(), 200);
    let rss_before = super::support::proc_status_kib(pid, "VmRSS");
    let peak_before = super::support::proc_status_kib(pid, "VmHWM");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CONNECTIONS {
        tasks.spawn(async move {
            let mut c = TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("connect");
            let mut bytes = post_head(16 * 1024 * 1024).into_bytes();
            bytes.resize(bytes.len() + SENT, b' ');
            // Refused connections are closed while we still write; that is fine.
            let _ = c.write_all(&bytes).await;
            let answer = read_until_closed(&mut c).await;
            answer.split(' ').nth(1).unwrap_or("-").to_owned()
        });
    }
    let mut statuses = std::collections::BTreeMap::<String, usize>::new();
    while let Some(status) = tasks.join_next().await {
        *statuses
            .entry(status.expect("connection task"))
            .or_default() += 1;
    }
    let rss_after = super::support::proc_status_kib(pid, "VmRSS");
    let peak_after = super::support::proc_status_kib(pid, "VmHWM");
    let growth_mib = peak_after.saturating_sub(peak_before) as f64 / 1024.0;
    println!(
        "unfinished bodies: {CONNECTIONS} x {SENT} B sent of 16 MiB announced; answers {statuses:?}; \
         VmRSS {rss_before} -> {rss_after} kB, VmHWM {peak_before} -> {peak_after} kB \
         (peak growth {growth_mib:.1} MiB)"
    );
    assert!(growth_mib < 64.0, "peak RSS grew by {growth_mib:.1} MiB");
    signal(&child, "TERM");
    assert_eq!(exited(child, Duration::from_secs(8)).await.code(), Some(0));
}
