//! `wsr-gateway bench` against a test gateway: every mode gets its messages acknowledged,
//! with no errors, in both SOAP versions. (What the figures are is for the benchmark runs,
//! not for tests.)

use clap::Parser;
use wsr_gateway::config::{ApiToken, Scope};
#[allow(unused_imports)]
use wsr_gateway::store::{Backend as _, Prefill as _, ReceiverStore as _};

use self::tool::{BenchArgs, BenchReport, Mode, run_until};
use super::support::spawn_app_with;

/// The load generator is the binary's module, not the library's (src/main.rs): the test
/// compiles the same source, which reaches the gateway only over HTTP and the library's public
/// API.
#[path = "../../src/bench/mod.rs"]
mod tool;

/// A whole run, to its duration.
async fn run(args: &BenchArgs) -> anyhow::Result<BenchReport> {
    run_until(args, std::future::pending()).await
}

const TOKEN: &str = "bench-operator-token-0001";

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

#[tokio::test]
async fn every_bench_mode_gets_acks_and_no_errors() {
    let app = spawn_app_with(|c| {
        c.tokens = vec![ApiToken {
            secret: wsr_gateway::secrets::Stored::Plain(wsr_gateway::secrets::Secret::new(TOKEN)),
            principal: "bench".into(),
            scopes: vec![Scope::Admin, Scope::Consume],
            topics: wsr_gateway::config::all_topics(),
        }];
        super::support::without_source_quota(c);
    })
    .await;
    let url = app.url("/wsr/default");
    for (mode, soap) in [
        ("response", "1.1"),
        ("response", "1.2"),
        ("ordered", "1.2"),
        ("callback", "1.1"),
        ("poll", "1.1"),
        ("e2e", "1.1"),
    ] {
        let args = Cli::parse_from([
            "bench",
            "--url",
            &url,
            "-c",
            "4",
            "-d",
            "1",
            "--body-bytes",
            "256",
            "--mode",
            mode,
            "--soap",
            soap,
            "--token",
            TOKEN,
            "--consumers",
            "2",
        ])
        .bench;
        let report = run(&args).await.expect("bench runs");
        assert!(report.acked > 0, "{mode} {soap}: {report}");
        assert!(report.errors.is_empty(), "{mode} {soap}: {report}");
        if args.mode == Mode::E2e {
            let consumed = report.consumed.as_ref().expect("e2e figures");
            assert!(consumed.accepted > 0, "{report}");
            assert_eq!(consumed.errors, 0, "{report}");
        }
        let json = report.to_json();
        assert_eq!(json["acked"], report.acked, "{json}");
    }
}

/// The growth fixture writes what the receiver would have: a resent prefilled message is a
/// duplicate (acked, not delivered again), and the next number is delivered in order.
#[tokio::test]
async fn prefilled_groups_behave_like_delivered_ones() {
    use wsr_gateway::wsr::{
        GroupId, Headers, MessageId, ReplyPattern, Request, SequenceNum, SoapVersion,
        write_envelope,
    };
    let app = spawn_app_with(|_| {}).await;
    let now = chrono::Utc::now();
    let added = app
        .store
        .prefill_delivered("default", 3, 4, 100, now)
        .await
        .expect("prefill");
    assert_eq!(added, 12);
    let inbox = app.inbox().await;
    assert_eq!(inbox.len(), 12);
    let group = inbox[0].group_id.clone();
    let send = |n: u64| {
        let request = Request {
            message_id: MessageId {
                group_id: GroupId::parse(&group).expect("group"),
                sequence: Some(SequenceNum {
                    number: n,
                    last: false,
                    group_limit: None,
                }),
            },
            expiry_time: now + chrono::Duration::hours(1),
            reply_pattern: ReplyPattern::Response,
            ack_requested: true,
            duplicate_elimination: true,
            message_order: true,
        };
        write_envelope(
            SoapVersion::Soap11,
            Headers {
                request: Some(&request),
                ..Headers::default()
            },
            "<b:Load xmlns:b=\"urn:b\">again</b:Load>",
        )
    };
    let dup = app.send(SoapVersion::Soap11, send(2)).await;
    assert_eq!(dup.status, 200, "{}", dup.body);
    assert!(!dup.body.contains("fault="), "{}", dup.body);
    assert_eq!(
        app.inbox().await.len(),
        12,
        "a duplicate is not delivered again"
    );
    let next = app.send(SoapVersion::Soap11, send(4)).await;
    assert_eq!(next.status, 200, "{}", next.body);
    assert_eq!(app.inbox().await.len(), 13);
}

/// An interrupt (Ctrl-C in `wsr-gateway bench`) stops the load long before its duration and
/// still reports what was measured, marked as partial.
#[tokio::test]
async fn an_interrupted_bench_reports_what_it_measured() {
    let app = spawn_app_with(|_| {}).await;
    let url = app.url("/wsr/default");
    let args = Cli::parse_from(["bench", "--url", &url, "-c", "2", "-d", "3600"]).bench;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let bench = tokio::spawn(async move {
        run_until(&args, async {
            let _ = stopped.await;
        })
        .await
    });
    let inbox = |app: &super::support::TestApp| {
        let store = app.store.clone();
        async move {
            let n = store.inbox(0, 10).await.expect("inbox").len();
            (n >= 5).then_some(n)
        }
    };
    super::support::eventually("some messages acked", || inbox(&app)).await;
    let _ = stop.send(());
    let report = bench
        .await
        .expect("the bench task")
        .expect("a report, not an error");
    assert!(report.interrupted);
    assert!(report.acked >= 5, "{report}");
    assert!(
        report
            .to_string()
            .starts_with("interrupted: partial results")
    );
    assert_eq!(report.to_json()["interrupted"], true);
    app.stop().await;
}
