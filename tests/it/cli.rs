//! The command line as an operator meets it: `--version`, `check-config`, and how a failure
//! is told.

use std::process::Command;

use super::support::operator;

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

#[tokio::test]
async fn operator_commands_list_show_and_change_over_the_admin_api() {
    use super::support::ClockExt as _;
    use wsr_gateway::config::{ApiToken, Scope};
    const ADMIN: &str = "operator-token-0123456789";
    let app = super::support::spawn_app_with(|c| {
        c.tokens = vec![ApiToken::plain(ADMIN, "ops", vec![Scope::Admin])];
    })
    .await;
    let in_an_hour = super::support::xs(app.clock.now_utc() + chrono::Duration::hours(1));
    let xml =
        std::fs::read_to_string(super::support::repo_root().join("examples/purchase-order.xml"))
            .expect("example envelope")
            .replace("2099-12-31T23:59:59Z", &in_an_hour);
    let answer = app
        .post("/wsr/default", "text/xml; charset=utf-8", xml)
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);

    let (code, out, err) = operator(&app, ADMIN, &["groups", "list"]).await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("PARTNER  GROUP"), "{out}");
    assert!(
        lines[1].contains("mid:example-po-0001@partner.example.org"),
        "{out}"
    );
    let (code, out, err) = operator(
        &app,
        ADMIN,
        &[
            "groups",
            "show",
            "mid:example-po-0001@partner.example.org",
            "-o",
            "json",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let group: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(group["channel"], "default");

    let url = "https://partner.example.org/acks";
    let (code, _, err) = operator(&app, ADMIN, &["endpoints", "add", url]).await;
    assert_eq!(code, 0, "{err}");
    let (_, out, _) = operator(&app, ADMIN, &["endpoints", "list", "--output", "json"]).await;
    assert!(out.contains(url), "{out}");
    let (code, _, err) = operator(&app, ADMIN, &["endpoints", "rm", url]).await;
    assert_eq!(code, 0, "{err}");
    let (_, out, _) = operator(&app, ADMIN, &["endpoints", "list"]).await;
    assert!(!out.contains(url), "{out}");

    let (code, out, err) = operator(&app, ADMIN, &["messages", "list"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 1, "the headings, no message: {out}");
    let (code, out, err) = operator(&app, ADMIN, &["subs", "list", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"subscriptions\": []"), "{out}");

    // A failure: one line with the API's status and reason, exit 1.
    let (code, _, err) = operator(&app, ADMIN, &["messages", "show", "no/such?id"]).await;
    assert_eq!(code, 1);
    assert!(
        err.starts_with("error: 404 Not Found: no message no/such?id"),
        "{err}"
    );
    let (code, _, err) = operator(&app, "not-a-token-0123456789", &["groups", "list"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("401"), "{err}");
    app.stop().await;
}

#[test]
fn completions_are_printed_for_a_shell() {
    let out = gateway()
        .args(["completions", "bash"])
        .output()
        .expect("runs");
    assert!(out.status.success());
    let script = String::from_utf8_lossy(&out.stdout);
    assert!(
        script.contains("wsr-gateway") && script.contains("messages"),
        "{script}"
    );
}

#[test]
fn help_never_shows_a_secret_taken_from_the_environment() {
    const SECRET: &str = "help-secret-0123456789";
    for command in [
        &["send", "--help"][..],
        &["status", "--help"],
        &["bench", "--help"],
        &["messages", "--help"],
    ] {
        let out = gateway()
            .args(command)
            .env("WSR_TOKEN", SECRET)
            .env("WSR_BENCH_TOKEN", SECRET)
            .env("WSR_BENCH_AUTHORIZATION", SECRET)
            .output()
            .expect("runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{command:?}: {text}");
        assert!(
            text.contains("WSR_"),
            "{command:?} names its variables: {text}"
        );
        assert!(!text.contains(SECRET), "{command:?}: {text}");
    }
}

/// Issue 32 item 2: `check-config` loads every file the configuration names as `serve` does,
/// so what `serve` would refuse is refused here, naming the file.
#[test]
fn check_config_refuses_the_files_serve_would_refuse() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = [
        (
            "[tls]\ncert_file = \"missing.pem\"\nkey_file = \"missing.key\"\n",
            "missing.pem",
        ),
        (
            "[partners.acme]\naddress = \"https://acme.example/wsr\"\nca_file = \"no-ca.pem\"\n",
            "no-ca.pem",
        ),
    ];
    for (i, (section, named)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("case-{i}.toml"));
        std::fs::write(
            &path,
            format!("listen = \"127.0.0.1:9999\"\ndatabase = \"x.db\"\n{section}"),
        )
        .expect("write");
        let out = gateway()
            .arg("check-config")
            .arg(&path)
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "case {i} passed: {stderr}");
        assert!(stderr.contains(named), "case {i}: {stderr}");
    }
}

/// Issue 33 (item 8): `completions zsh | head` closes the pipe early; the command ends
/// quietly instead of panicking.
#[test]
fn completions_into_a_closed_pipe_end_quietly() {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let out = gateway()
        .args(["completions", "zsh"])
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Issue 34 (a minimal container): without system CA certificates the gateway still starts
/// when nothing it is configured to reach needs them — and refuses to start, saying why, when
/// a partner is reached over https without a `ca_file` of its own.
#[test]
fn the_gateway_starts_without_system_ca_certificates_unless_a_partner_needs_them() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().expect("temp dir");
    let empty = dir.path().join("no-certs.pem");
    std::fs::write(&empty, "").expect("an empty bundle");
    let certs_dir = dir.path().join("no-certs");
    std::fs::create_dir(&certs_dir).expect("an empty folder");
    let gateway = |config: &str| {
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, config).expect("config");
        let mut command = Command::new(env!("CARGO_BIN_EXE_wsr-gateway"));
        for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("WSR_")) {
            command.env_remove(key);
        }
        command
            .args(["serve", "--config"])
            .arg(&path)
            // rustls-native-certs reads these instead of the system's bundle.
            .env("SSL_CERT_FILE", &empty)
            .env("SSL_CERT_DIR", &certs_dir)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starts")
    };
    let database = dir.path().join("gw.db");
    let port = super::support::free_port();
    let mut child = gateway(&format!(
        "listen = \"127.0.0.1:{port}\"\ndatabase = {:?}\n",
        database.display().to_string()
    ));
    let stdout = child.stdout.take().expect("stdout");
    let listening = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains("listening"));
    let _ = child.kill();
    let _ = child.wait();
    assert!(listening, "it started without system CA certificates");

    let child = gateway(&format!(
        "listen = \"127.0.0.1:{port}\"\ndatabase = {:?}\n\n[partners.acme]\n\
         address = \"https://acme.example.org/wsr\"\n",
        database.display().to_string()
    ));
    let out = child.wait_with_output().expect("ends");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "partner acme is reached over https (https://acme.example.org/wsr) without a ca_file"
        ) && err.contains("ca-certificates"),
        "{err}"
    );
}

/// `wsr-gateway health` (a container's HEALTHCHECK, no curl): exit 0 "ready" while the
/// gateway's `/readyz` says so, 1 with the reason when it cannot be reached.
#[tokio::test]
async fn health_asks_readyz() {
    let app = super::support::spawn_app_with(|_| {}).await;
    let run = |api: String| async move {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_wsr-gateway"));
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("WSR_") {
                command.env_remove(&name);
            }
        }
        let out = command
            .args(["health", "--api", &api])
            .output()
            .await
            .expect("runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = run(app.url("")).await;
    assert_eq!((code, out.as_str()), (Some(0), "ready\n"), "{err}");
    let closed = format!("http://127.0.0.1:{}", super::support::free_port());
    let (code, _, err) = run(closed).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("cannot reach"), "{err}");
    app.stop().await;
}
