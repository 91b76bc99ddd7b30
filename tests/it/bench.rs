//! `wsr-gateway bench` against a test gateway: every mode gets its messages acknowledged,
//! with no errors, in both SOAP versions. (What the figures are is for the benchmark runs,
//! not for tests.)

use clap::Parser;
use wsr_gateway::bench::{BenchArgs, Mode, run};
use wsr_gateway::config::{Scope, TokenConfig};

use super::support::spawn_app_with;

const TOKEN: &str = "bench-operator-token-0001";

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

#[tokio::test]
async fn every_bench_mode_gets_acks_and_no_errors() {
    let app = spawn_app_with(|c| {
        c.tokens = vec![TokenConfig {
            token: TOKEN.into(),
            principal: "bench".into(),
            scopes: vec![Scope::Admin, Scope::Consume],
        }];
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
