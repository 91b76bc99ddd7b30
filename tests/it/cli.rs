//! The command line as an operator meets it: `--version`, `check-config`, and how a failure
//! is told.

use std::process::Command;

fn gateway() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_wsr-gateway"));
    // The test's own environment must not change what the commands see.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("WSR_") {
            command.env_remove(&name);
        }
    }
    command
}

#[test]
fn version_names_the_commit() {
    let out = gateway().arg("--version").output().expect("runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.starts_with(&format!(
            "wsr-gateway {} (commit ",
            env!("CARGO_PKG_VERSION")
        )),
        "{text}"
    );
}

#[test]
fn check_config_says_what_it_would_serve_and_ignores_client_variables() {
    let example = super::support::repo_root().join("examples/gateway.toml");
    let out = gateway()
        .arg("check-config")
        .arg(&example)
        // The CLI's own settings, exported for `send`: not the gateway's.
        .env("WSR_TOKEN", "change-me-0123456789")
        .env("WSR_API", "http://127.0.0.1:8080")
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("valid") && text.contains("channels default, orders"),
        "{text}"
    );
    assert!(
        !text.contains("change-me"),
        "no secret in the summary: {text}"
    );
}

#[test]
fn a_failure_is_one_line_of_causes_without_a_backtrace() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "listen = \"127.0.0.1:8080\"\nno_such_key = 1\n").expect("write");
    let out = gateway()
        .arg("check-config")
        .arg(&bad)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with("error: invalid config file"), "{err}");
    assert!(err.contains("no_such_key"), "{err}");
    assert!(
        !err.contains("Stack backtrace") && !err.contains("Backtrace"),
        "{err}"
    );
    let out = gateway()
        .args(["check-config", "/no/such/file.toml"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read config file"));
}
