//! The short chaos run (README "Chaos run"): two gateways talking as partners over mutual TLS
//! with credentials, a lossy (TLS-terminating) proxy each way, consumers on a shared
//! subscription, six kill -9s, 2 000 messages over 100 groups, a fifth of them to B's
//! request-response channels (a recording SOAP backend) — and the checker finds nothing
//! lost, doubled or out of order, every copy of a request answered with the same bytes, and
//! the backend called once per message (again only after a kill, under `retry`). The seed is new on every run and printed, so
//! a failure can be repeated with `wsr-chaos run --short --seed N`.

use std::process::Command;

#[test]
fn short_chaos_run_loses_doubles_and_reorders_nothing() {
    // The run keeps the test environment's WSR_* settings from the gateways it starts.
    let output = Command::new(env!("CARGO_BIN_EXE_wsr-chaos"))
        .args([
            "run",
            "--short",
            "--gateway-bin",
            env!("CARGO_BIN_EXE_wsr-gateway"),
        ])
        .output()
        .expect("wsr-chaos runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "the run failed:\n{stdout}\n{stderr}"
    );
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("messages="))
        .expect("a summary line");
    let field = |name: &str| -> u64 {
        summary
            .split(' ')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {summary}"))
    };
    assert!(field("messages") >= 2000, "{summary}");
    assert!(field("kills") >= 5, "{summary}");
    for zero in [
        "lost",
        "duplicated",
        "out_of_order",
        "unresolved",
        "failed_processed",
        "rr_mismatched",
        "rr_extra_calls",
        "rr_empty",
    ] {
        assert_eq!(field(zero), 0, "{summary}");
    }
    // Request-response traffic (D16): answered, and every copy's answer counted.
    assert!(field("rr_messages") >= 100, "{summary}");
    assert!(field("rr_acked") > 0, "{summary}");
    assert!(field("rr_answers") >= field("rr_acked") / 2, "{summary}");
    assert!(
        field("rr_calls") <= field("rr_messages") + field("rr_recalls"),
        "{summary}"
    );
    assert_eq!(
        field("acked") + field("failed"),
        field("messages"),
        "{summary}"
    );
}
