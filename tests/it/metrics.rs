//! `/metrics` over real HTTP: real WS-R messages move the counters, the writer's histograms and
//! the store's gauges; `metrics_token` guards the scrape; every answer carries a request id.
//!
//! Every test of this binary records into one process-wide recorder, so the counters asserted
//! here carry this file's own channel; the store's gauges are this gateway's own store.

use chrono::Duration;
use wsr_gateway::rmp::agreement::Agreement;
use wsr_gateway::wsr::{GroupId, MessageId, ReplyPattern, Request, SequenceNum, SoapVersion};

use super::support::{ClockExt, TestApp, request_envelope, spawn_app_with};

const CHANNEL: &str = "metrics-probe";

async fn spawn(adjust: impl FnOnce(&mut wsr_gateway::Config)) -> TestApp {
    spawn_app_with(|c| {
        c.channels.insert(CHANNEL.into(), Agreement::everything());
        c.anonymous_channels.insert(CHANNEL.into());
        // A buffered Response-pattern message is answered at once, not after `hold`.
        c.hold = std::time::Duration::ZERO;
        adjust(c);
    })
    .await
}

fn request(app: &TestApp, group: &str, number: Option<u64>, expiry: Duration) -> Request {
    Request {
        message_id: MessageId {
            group_id: GroupId::parse(group).expect("group id"),
            sequence: number.map(|number| SequenceNum {
                number,
                last: false,
                group_limit: None,
            }),
        },
        expiry_time: app.clock.now_utc() + expiry,
        reply_pattern: ReplyPattern::Response,
        ack_requested: true,
        duplicate_elimination: true,
        message_order: number.is_some(),
    }
}

async fn send(app: &TestApp, request: &Request) -> u16 {
    let xml = request_envelope(request, "<p:Order xmlns:p=\"urn:p\">metrics</p:Order>");
    let path = format!("/wsr/{CHANNEL}");
    app.post(&path, SoapVersion::Soap11.content_type(), xml)
        .await
        .status
}

async fn scrape(app: &TestApp, token: Option<&str>) -> reqwest::Response {
    let mut get = app.client.get(app.url("/metrics"));
    if let Some(t) = token {
        get = get.bearer_auth(t);
    }
    get.send().await.expect("scrape")
}

pub(crate) async fn text(app: &TestApp) -> String {
    let r = scrape(app, None).await;
    assert_eq!(r.status(), 200);
    r.text().await.expect("metrics text")
}

/// The sum of the samples of `name` whose labels include every one of `labels` (0 when none).
pub(crate) fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (series_name, rest) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let has = |(k, v): &(&str, &str)| rest.split(',').any(|p| p == format!("{k}=\"{v}\""));
            (series_name == name && labels.iter().all(has)).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

#[tokio::test]
async fn real_messages_move_the_counters_histograms_and_gauges() {
    let app = spawn(|_| {}).await;
    let received = |text: &str, verdict: &str| {
        let labels = [
            ("channel", CHANNEL),
            ("partner", "anonymous"),
            ("verdict", verdict),
        ];
        sample(text, "wsr_received_messages_total", &labels)
    };
    let before = text(&app).await;

    let single = request(&app, "mid:metrics-single@test", None, Duration::hours(1));
    assert_eq!(send(&app, &single).await, 200, "delivered and acked");
    assert_eq!(send(&app, &single).await, 200, "a duplicate, acked again");
    let expired = request(&app, "mid:metrics-expired@test", None, Duration::hours(-1));
    let status = send(&app, &expired).await;
    assert!(status >= 400, "expired on arrival: a fault ({status})");
    let ahead = request(
        &app,
        "mid:metrics-ordered@test",
        Some(1),
        Duration::hours(1),
    );
    assert_eq!(send(&app, &ahead).await, 202, "buffered for its gap");

    let after = text(&app).await;
    for (verdict, n) in [
        ("delivered", 1.0),
        ("duplicate", 1.0),
        ("fault", 1.0),
        ("buffered", 1.0),
    ] {
        assert_eq!(
            received(&after, verdict) - received(&before, verdict),
            n,
            "{verdict}\n{after}"
        );
    }
    let fault = |text: &str| {
        let labels = [("channel", CHANNEL), ("code", "InvalidExpiryTime")];
        sample(text, "wsr_faults_total", &labels)
    };
    assert_eq!(fault(&after) - fault(&before), 1.0, "{after}");
    assert!(
        sample(&after, "wsr_acks_sent_total", &[("pattern", "response")]) >= 2.0,
        "{after}"
    );
    assert!(
        sample(&after, "wsr_writer_commit_seconds_count", &[]) > 0.0,
        "{after}"
    );
    assert!(sample(&after, "wsr_writer_batch_size_count", &[]) > 0.0);
    // On SQLite with durability = "full" the acks waited for the syncer's syncs of the WAL.
    if crate::BACKEND == super::test_database::TestBackend::Sqlite {
        let syncs = sample(&after, "wsr_wal_sync_seconds_count", &[]);
        assert!(syncs > 0.0, "{after}");
    }
    assert!(
        sample(&after, "wsr_writer_batch_size_sum", &[]) > 0.0,
        "batches hold jobs"
    );
    let route = [("route", "/wsr/{channel}"), ("method", "POST")];
    assert!(sample(&after, "wsr_http_request_duration_seconds_count", &route) >= 4.0);
    // The store's gauges are this gateway's store: exactly what it holds.
    assert_eq!(sample(&after, "wsr_store_up", &[]), 1.0);
    assert_eq!(
        sample(&after, "wsr_store_buffered_messages", &[]),
        1.0,
        "{after}"
    );
    assert!(sample(&after, "wsr_store_groups", &[("state", "open")]) >= 1.0);
    assert!(
        !after.contains("mid:metrics"),
        "no group id in any label:\n{after}"
    );
}

#[tokio::test]
async fn a_metrics_token_guards_the_scrape() {
    let token = "metrics-0123456789";
    let app = spawn(|c| c.metrics_token = Some(wsr_gateway::secrets::Secret::new(token))).await;
    assert_eq!(scrape(&app, None).await.status(), 401);
    assert_eq!(scrape(&app, Some("metrics-wrong-0000")).await.status(), 401);
    let ok = scrape(&app, Some(token)).await;
    assert_eq!(ok.status(), 200);
    assert!(ok.text().await.expect("text").contains("wsr_store_up 1"));
}

#[tokio::test]
async fn every_answer_carries_a_request_id() {
    let app = spawn(|_| {}).await;
    let made = app
        .client
        .get(app.url("/healthz"))
        .send()
        .await
        .expect("get");
    let made = id(&made).expect("an id is made");
    assert!(uuid_like(&made), "{made}");
    let kept = app
        .client
        .get(app.url("/healthz"))
        .header("X-Request-Id", "trace-42")
        .send()
        .await
        .expect("get");
    assert_eq!(id(&kept).as_deref(), Some("trace-42"), "a sane id is kept");
    let long = "x".repeat(500);
    let replaced = app
        .client
        .get(app.url("/api/v1/inbox"))
        .header("X-Request-Id", &long)
        .send()
        .await
        .expect("get");
    assert_eq!(replaced.status(), 401, "refused, and still with an id");
    let replaced = id(&replaced).expect("an id");
    assert!(
        uuid_like(&replaced),
        "an oversized id is replaced: {replaced}"
    );
}

/// The request id an answer carries.
fn id(answer: &reqwest::Response) -> Option<String> {
    answer
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn uuid_like(s: &str) -> bool {
    s.len() == 36 && s.chars().filter(|c| *c == '-').count() == 4
}

/// A partner's POST to `/wsr/…` is served past the router (`http::Gateway`), everything else
/// through it: both ways frame the answer (request id, latency by route pattern), and what the
/// fast way does not take is answered as the router's routes answer it.
#[tokio::test]
async fn partners_routes_are_framed_alike_whichever_way_a_request_goes() {
    // A channel of its own: the received-messages counter is the process's, and another test
    // counts exactly what reaches `CHANNEL`.
    const FRAMED: &str = "framed-probe";
    let app = spawn(|c| {
        c.channels.insert(FRAMED.into(), Agreement::everything());
        c.anonymous_channels.insert(FRAMED.into());
    })
    .await;
    let xml = request_envelope(
        &request(&app, "mid:framed@test", None, Duration::hours(1)),
        "<p:Order xmlns:p=\"urn:p\">framed</p:Order>",
    );
    let post = |path: &str, body: String| {
        app.client
            .post(app.url(path))
            .header("Content-Type", SoapVersion::Soap11.content_type())
            .header("X-Request-Id", "partner-7")
            .body(body)
            .send()
    };
    let route = |text: &str, route: &str, status: &str| {
        sample(
            text,
            "wsr_http_request_duration_seconds_count",
            &[("route", route), ("method", "POST"), ("status", status)],
        )
    };
    let before = text(&app).await;
    let taken = post(&format!("/wsr/{FRAMED}"), xml.clone())
        .await
        .expect("post");
    assert_eq!(taken.status(), 200);
    assert_eq!(id(&taken).as_deref(), Some("partner-7"));
    let callback = post("/wsr/_callback", "not xml".into())
        .await
        .expect("post");
    assert_eq!(callback.status(), 500, "a SOAP fault for an unreadable ack");
    assert_eq!(id(&callback).as_deref(), Some("partner-7"));
    // Left to the router: another method, another path, an escaped channel.
    let get = app
        .client
        .get(app.url(&format!("/wsr/{FRAMED}")))
        .send()
        .await
        .expect("get");
    assert_eq!(get.status(), 405);
    assert_eq!(
        get.headers().get("allow").map(|v| v.as_bytes()),
        Some(&b"POST"[..])
    );
    assert!(id(&get).is_some());
    for path in [
        format!("/wsr/{FRAMED}/more"),
        "/wsr/".to_owned(),
        "/wsr/framed%2Dprobe".to_owned(),
        "/wsr/no-such-channel".to_owned(),
    ] {
        let answer = post(&path, xml.clone()).await.expect("post");
        assert_eq!(answer.status(), 404, "{path}");
        assert_eq!(id(&answer).as_deref(), Some("partner-7"), "{path}");
    }
    // Counted by route pattern both ways (the recorder is the process's: other tests count
    // too, hence at least). The escaped channel and the unknown one are the router's and the
    // fast way's 404s.
    let after = text(&app).await;
    for (pattern, status, count) in [
        ("/wsr/{channel}", "2xx", 1.0),
        ("/wsr/_callback", "5xx", 1.0),
        ("/wsr/{channel}", "4xx", 2.0),
    ] {
        let counted = route(&after, pattern, status) - route(&before, pattern, status);
        assert!(counted >= count, "{pattern} {status}: {counted}\n{after}");
    }
}
