//! Issue 33, acceptance 2: a partner that answers `200` with an envelope but no ack (a plain
//! SOAP service, a wrong path behind a proxy) — its message shows the cause after one attempt
//! in the API (the message and its attempts), the console (the list and the message page), the
//! operator CLI, the metrics and the log; and a message in doubt is a state of its own that
//! lists filter on.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::http::StatusCode;
use axum::response::IntoResponse as _;
use serde_json::{Value, json};
use wsr_gateway::config::{ApiToken, Scope};
use wsr_gateway::wsr::{Headers, SoapVersion, write_envelope};

use super::support::{TestApp, eventually, serve_local, spawn_app_with};

const ADMIN: &str = super::console_sign_out::ADMIN;

/// A partner that takes every request with `200` and an envelope holding no WS-R answer;
/// its URL and how many requests it took.
async fn plain_soap_service() -> (String, Arc<AtomicUsize>) {
    let seen = Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    let handler = move || {
        let count = count.clone();
        async move {
            count.fetch_add(1, Ordering::SeqCst);
            let envelope = write_envelope(SoapVersion::Soap11, Headers::default(), "<ok/>");
            (
                StatusCode::OK,
                [("content-type", "text/xml; charset=utf-8")],
                envelope,
            )
                .into_response()
        }
    };
    let router = axum::Router::new().route("/", axum::routing::post(handler));
    (format!("{}/", serve_local(router).await), seen)
}

/// The body of an unauthenticated GET of `path`.
async fn text_of(app: &TestApp, path: &str) -> String {
    app.client
        .get(app.url(path))
        .send()
        .await
        .expect("answers")
        .text()
        .await
        .expect("text")
}

/// The README's example purchase order, received at `/wsr/default` (expiring in an hour).
async fn receive_the_example(app: &TestApp) {
    use super::support::ClockExt as _;
    let in_an_hour = super::support::xs(app.clock.now_utc() + chrono::Duration::hours(1));
    let xml =
        std::fs::read_to_string(super::support::repo_root().join("examples/purchase-order.xml"))
            .expect("example envelope")
            .replace("2099-12-31T23:59:59Z", &in_an_hour);
    let answer = app
        .post("/wsr/default", "text/xml; charset=utf-8", xml)
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
}

/// Message `id` once its first attempt's cause is kept (bounded by `eventually`).
async fn with_cause(app: &TestApp, id: &str) -> Value {
    eventually("the attempt's cause is kept", || async {
        let m = api(app, &format!("/messages/{id}")).await;
        m["last_error"].is_string().then_some(m)
    })
    .await
}

/// A gateway with an admin token and partner `name`, a plain SOAP service (200, no ack);
/// how many requests that service took.
async fn gateway_with_plain_partner(name: &'static str) -> (TestApp, Arc<AtomicUsize>) {
    let (plain, served) = plain_soap_service().await;
    let app = spawn_app_with(|c| {
        c.tokens = vec![ApiToken::plain(ADMIN, "ops", vec![Scope::Admin])];
        c.partners.insert_address(name, plain.clone());
    })
    .await;
    (app, served)
}

async fn api(app: &TestApp, path: &str) -> Value {
    let r = app
        .client
        .get(app.url(&format!("/api/v1{path}")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("API answers");
    assert_eq!(r.status(), 200, "{path}");
    r.json().await.expect("JSON")
}

/// A Response-pattern message to `partner`, one attempt allowed; its id.
async fn submitted(app: &TestApp, partner: &str) -> String {
    let (status, answer) = super::support::submit_as(
        app,
        ADMIN,
        json!({
            "destination": partner,
            "agreement": { "reply_pattern": "Response", "max_attempts": 1, "interval_ms": 100,
                           "backoff": 1, "expiry_seconds": 3600 },
            "body": "<t:Order xmlns:t=\"urn:t\"/>",
        }),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    answer["id"].as_str().expect("id").to_owned()
}

#[tokio::test]
async fn a_partner_answering_200_without_acks_shows_its_cause_everywhere_after_one_attempt() {
    let (app, served) = gateway_with_plain_partner("plainsoap").await;
    let id = submitted(&app, "plainsoap").await;
    let m = with_cause(&app, &id).await;
    // One send was enough (what follows it are polls: the message is in doubt).
    assert!(served.load(Ordering::SeqCst) >= 1);
    let cause = m["last_error"].as_str().expect("text");
    assert!(cause.contains("HTTP 200 without an ack"), "{cause}");
    // One attempt, no verdict, nothing more to send: in doubt, said as such.
    assert_eq!(m["in_doubt"], true, "{m}");
    assert_eq!(m["next_attempt"], Value::Null, "no send is due: {m}");
    assert!(m["doubt_ends_at"].is_string(), "{m}");
    assert!(m["submitted_at"].is_string(), "{m}");
    assert_eq!(m["finished_at"], Value::Null, "{m}");

    // The API: the attempt with the partner's status, its verdict and the cause.
    let story = api(&app, &format!("/messages/{id}/attempts")).await;
    assert!(story["total"].as_u64().is_some_and(|n| n >= 1), "{story}");
    let first = &story["attempts"][0];
    assert_eq!(
        (
            first["kind"].as_str(),
            first["status"].as_u64(),
            first["verdict"].as_str()
        ),
        (Some("send"), Some(200), Some("none")),
        "{story}"
    );
    assert_eq!(first["cause"].as_str(), Some(cause), "{story}");
    // The in-doubt filter finds it; `sent` still does (its stored state).
    let doubted = api(&app, "/messages?state=in_doubt&partner=plainsoap").await;
    assert_eq!(
        doubted["messages"][0]["id"].as_str(),
        Some(id.as_str()),
        "{doubted}"
    );
    let acked = api(&app, "/messages?state=acked&partner=plainsoap").await;
    assert_eq!(acked["messages"], json!([]), "{acked}");

    // The metrics: the attempt counted by its result.
    let metrics = text_of(&app, "/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("wsr_outbound_attempts_total{")
                && l.contains("partner=\"plainsoap\"")
                && l.contains("result=\"no_verdict\"")),
        "{metrics}"
    );

    // The console: the list's last-error column, the message page's attempts.
    let cookie = super::console_sign_out::sign_in(&app).await;
    let (status, page) = super::console_sign_out::get(
        &app,
        &cookie,
        "/console/messages?state=in_doubt&partner=plainsoap",
    )
    .await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains(&id) && page.contains("HTTP 200 without an ack"),
        "{page}"
    );
    assert!(page.contains("in doubt"), "{page}");
    let (_, page) =
        super::console_sign_out::get(&app, &cookie, &format!("/console/message?id={id}")).await;
    assert!(page.contains("Attempts and polls ("), "{page}");
    assert!(page.contains("<td>200</td>"), "{page}");

    // The CLI: `messages show` prints the message and its attempts.
    let (code, out, err) = super::support::operator(&app, ADMIN, &["messages", "show", &id]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("in_doubt") && out.contains("HTTP 200 without an ack"),
        "{out}"
    );
    let attempt_line = out
        .lines()
        .find(|l| l.starts_with("1 ") && l.contains("send"))
        .unwrap_or_else(|| panic!("an attempt line: {out}"));
    assert!(
        attempt_line.contains("200") && attempt_line.contains("none"),
        "{out}"
    );
    let (code, out, err) = super::support::operator(
        &app,
        ADMIN,
        &[
            "messages",
            "list",
            "--state",
            "in_doubt",
            "--partner",
            "plainsoap",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&id) && !out.contains("next page"), "{out}");
    app.stop().await;
}

/// The log tells the operator too — and one partner that is down does not flood it: three
/// messages failing alike within a few seconds are one WARN line naming the partner and the
/// cause (the rest are counted in the next line's `repeated`).
#[tokio::test]
async fn failed_attempts_are_one_warn_line_per_partner_and_cause_not_one_per_message() {
    let (plain, served) = plain_soap_service().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let port = super::support::free_port();
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndatabase = {:?}\nlog_format = \"json\"\n\n\
             [[tokens]]\ntoken = \"{ADMIN}\"\nprincipal = \"ops\"\nscopes = [\"admin\"]\n\n\
             [partners.plainsoap]\naddress = \"{plain}\"\n",
            dir.path().join("gw.db").display().to_string(),
        ),
    )
    .expect("config");
    let (mut child, logged) = super::support::start_gateway_logged(&config);
    let client = reqwest::Client::new();
    for _ in 0..3 {
        let r = client
            .post(format!("http://127.0.0.1:{port}/api/v1/messages"))
            .bearer_auth(ADMIN)
            .json(&json!({
                "destination": "plainsoap",
                "agreement": { "reply_pattern": "Response", "max_attempts": 1,
                               "expiry_seconds": 3600 },
                "body": "<t:Order xmlns:t=\"urn:t\"/>",
            }))
            .send()
            .await
            .expect("API answers");
        assert_eq!(r.status(), 202);
    }
    let api = format!("http://127.0.0.1:{port}/api/v1/messages?state=in_doubt");
    eventually("all three attempts are noted", || async {
        let listed: Value = client
            .get(&api)
            .bearer_auth(ADMIN)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        let noted = listed["messages"]
            .as_array()?
            .iter()
            .filter(|m| m["last_error"].is_string())
            .count();
        (noted == 3).then_some(())
    })
    .await;
    assert_eq!(served.load(Ordering::SeqCst), 3);
    // A marker after them: once its access line is read, every earlier line was.
    let marker = client
        .post(format!("http://127.0.0.1:{port}/wsr/default"))
        .header("content-type", "text/xml; charset=utf-8")
        .body("not xml")
        .send()
        .await
        .expect("answers");
    assert!(marker.status().is_client_error() || marker.status().is_server_error());
    let read_all = || async {
        let lines = logged.lock().unwrap_or_else(|p| p.into_inner()).clone();
        lines
            .iter()
            .any(|l| l.contains("wsr request"))
            .then_some(lines)
    };
    let lines = eventually("the marker's access line", read_all).await;
    let warned: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("send attempt failed"))
        .collect();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        warned.len(),
        1,
        "one line for the partner and cause: {warned:?}"
    );
    let line: Value = serde_json::from_str(warned[0]).expect("a JSON line");
    assert_eq!(line["level"], "WARN", "{line}");
    let fields = &line["fields"];
    assert_eq!(fields["partner"], "plainsoap", "{line}");
    assert!(
        fields["error"]
            .as_str()
            .is_some_and(|e| e.contains("HTTP 200 without an ack")),
        "{line}"
    );
}

/// The partners view (API, CLI, console): a partner's configuration without secrets, its
/// health after a failed attempt, our messages to it by state; a refused sign-in counted for
/// the partner whose username it was (with the username tried), one with a username nobody
/// has counted apart — and never a username as a metric label.
#[tokio::test]
async fn the_partners_view_tells_each_partners_health_and_refused_sign_ins() {
    use std::collections::BTreeSet;
    use wsr_gateway::partners::{PartnerConfig, base64_encode};
    const PASSWORD: &str = "refusee-password-0123";
    let (plain, _) = plain_soap_service().await;
    let hash = wsr_gateway::secrets::hash_secret(PASSWORD).expect("hash");
    let app = spawn_app_with(move |c| {
        c.tokens = vec![ApiToken::plain(ADMIN, "ops", vec![Scope::Admin])];
        c.partners.insert_address("viewed", plain.clone());
        let names: BTreeSet<String> = c.channels.keys().cloned().collect();
        let refusee = PartnerConfig {
            channels: vec!["default".into()],
            password_hash: Some(hash),
            ..PartnerConfig::default()
        };
        c.partners
            .insert(refusee.check("refusee", None, &names).expect("refusee"));
    })
    .await;
    let id = submitted(&app, "viewed").await;
    with_cause(&app, &id).await;
    let basic = |user: &str, password: &str| {
        format!(
            "Basic {}",
            base64_encode(format!("{user}:{password}").as_bytes())
        )
    };
    for (user, password) in [("refusee", "wrong-password"), ("nobody-at-all\u{7}", "x")] {
        let r = app
            .client
            .post(app.url("/wsr/default"))
            .header("authorization", basic(user, password))
            .header("content-type", "text/xml; charset=utf-8")
            .body("<x/>")
            .send()
            .await
            .expect("answers");
        assert_eq!(r.status(), 401);
    }

    let listed = api(&app, "/partners").await;
    let partner = |name: &str| {
        listed["partners"]
            .as_array()
            .and_then(|all| all.iter().find(|p| p["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("{name} listed: {listed}"))
    };
    let viewed = partner("viewed");
    // The attempt failed; the polls that follow it (every 100 ms, to the same service) fail as
    // well, so under load the count may already be past one when it is read.
    assert!(
        viewed["failures_in_row"].as_u64().is_some_and(|n| n >= 1),
        "{viewed}"
    );
    assert!(
        viewed["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("HTTP 200 without an ack")),
        "{viewed}"
    );
    assert_eq!(viewed["last_success_at"], Value::Null, "{viewed}");
    assert_eq!(viewed["messages"]["in_doubt"], 1, "{viewed}");
    assert_eq!(viewed["messages"]["sent"], 1, "{viewed}");
    assert!(viewed["configured"]["address"].is_string(), "{viewed}");
    let refusee = partner("refusee");
    assert_eq!(
        refusee["configured"]["credentials"],
        json!(["basic"]),
        "{refusee}"
    );
    assert!(
        !refusee.to_string().contains("argon2"),
        "no secret: {refusee}"
    );
    assert_eq!(refusee["refused_sign_ins"]["count"], 1, "{refusee}");
    assert_eq!(
        refusee["refused_sign_ins"]["last_username"], "refusee",
        "{refusee}"
    );
    let anonymous = partner("anonymous");
    let unknown = &anonymous["refused_unknown_usernames"];
    assert!(
        unknown["count"].as_u64().is_some_and(|n| n >= 1),
        "{anonymous}"
    );
    assert_eq!(
        unknown["last_username"], "nobody-at-all",
        "control characters removed: {anonymous}"
    );

    let metrics = text_of(&app, "/metrics").await;
    assert!(
        metrics.lines().any(|l| l.starts_with("wsr_auth_refusals_total{")
            && l.contains("partner=\"refusee\"")),
        "{metrics}"
    );
    assert!(!metrics.contains("nobody-at-all"), "no username as a label");

    let (code, out, err) = super::support::operator(&app, ADMIN, &["partners"]).await;
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("viewed "))
        .unwrap_or_else(|| panic!("a line for viewed: {out}"));
    assert!(line.contains("HTTP 200 without an ack"), "{out}");

    let cookie = super::console_sign_out::sign_in(&app).await;
    let (status, page) = super::console_sign_out::get(&app, &cookie, "/console/partners").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("HTTP 200 without an ack"), "{page}");
    assert!(page.contains("as &quot;refusee&quot;"), "{page}");
    assert!(
        page.contains("/console/messages?partner=viewed&amp;state=in_doubt"),
        "{page}"
    );
    app.stop().await;
}

/// Send again: a failed message is sent again as a new message with its body and terms, to
/// the same partner; both histories name the other; a message still on its way is refused
/// (resend it instead), through the API, the console and the CLI alike.
#[tokio::test]
async fn a_failed_message_is_sent_again_as_a_new_one_linked_to_it() {
    let (app, served) = gateway_with_plain_partner("again").await;
    let id = submitted(&app, "again").await;
    with_cause(&app, &id).await;
    let post = |path: String, body: Value| {
        let request = app
            .client
            .post(app.url(&format!("/api/v1{path}")))
            .bearer_auth(ADMIN)
            .json(&body);
        async move {
            let r = request.send().await.expect("answers");
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    // Still on its way (in doubt): sent again it is not.
    let (status, problem) = post(format!("/messages/{id}/send-again"), json!({})).await;
    assert_eq!(status, 409, "{problem}");
    assert!(
        problem["reason"]
            .as_str()
            .is_some_and(|r| r.contains("resend")),
        "{problem}"
    );
    let (status, _) = post(
        format!("/messages/{id}/fail"),
        json!({"reason": "wrong path"}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, answer) = post(format!("/messages/{id}/send-again"), json!({})).await;
    assert_eq!(status, 202, "{answer}");
    let new_id = answer["id"].as_str().expect("a new id").to_owned();
    assert_ne!(new_id, id);
    eventually("the new message is sent", || async {
        (served.load(Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    let old = app
        .store
        .out_message(&id)
        .await
        .expect("read")
        .expect("old");
    let new = app
        .store
        .out_message(&new_id)
        .await
        .expect("read")
        .expect("new");
    assert_eq!(new.partner, "again");
    assert_eq!(new.reply, "Response");
    assert_ne!(new.group_id, old.group_id, "a new identity");
    assert!(
        new.envelope.contains("<t:Order xmlns:t=\"urn:t\"/>"),
        "{}",
        new.envelope
    );
    assert_eq!(
        old.outbound.state.name(),
        "failed",
        "the old one stays as it was"
    );
    let events = |id: String| {
        let store = app.store.clone();
        async move { store.out_message_events(&id, 50).await.expect("events") }
    };
    let old_events = events(id.clone()).await;
    assert!(
        old_events.iter().any(|e| e.state == "sent_again"
            && e.detail.as_deref() == Some(&format!("sent again as {new_id} by operator ops"))),
        "{old_events:?}"
    );
    let new_events = events(new_id.clone()).await;
    assert_eq!(
        new_events[0].detail.as_deref(),
        Some(format!("sent again from {id} by operator ops").as_str()),
        "{new_events:?}"
    );

    // The console offers it on an ended message and lands on the new one.
    let cookie = super::console_sign_out::sign_in(&app).await;
    let (_, page) =
        super::console_sign_out::get(&app, &cookie, &format!("/console/message?id={id}")).await;
    assert!(
        page.contains("Send again") && !page.contains("Resend now"),
        "{page}"
    );
    let (code, out, err) =
        super::support::operator(&app, ADMIN, &["messages", "send-again", &id]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().any(|l| l.starts_with("id ")), "{out}");
    let (code, _, err) =
        super::support::operator(&app, ADMIN, &["messages", "send-again", &new_id]).await;
    assert_eq!(code, 1, "not ended: refused");
    assert!(err.contains("409"), "{err}");

    // Issue 34's audit trail: who failed, signed in and sent again what, newest first; a
    // refused action left nothing.
    let trail = api(&app, "/audit").await;
    let entries = trail["entries"].as_array().expect("entries");
    let actions: Vec<(&str, &str, &str)> = entries
        .iter()
        .map(|e| {
            (
                e["principal"].as_str().unwrap_or_default(),
                e["action"].as_str().unwrap_or_default(),
                e["target"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        vec![
            ("ops", "send_again", id.as_str()),
            ("ops", "console_sign_in", "console"),
            ("ops", "send_again", id.as_str()),
            ("ops", "fail", id.as_str()),
        ],
        "{trail}"
    );
    assert_eq!(entries[3]["detail"], "wrong path", "{trail}");
    assert_eq!(entries[2]["detail"], format!("as {new_id}"), "{trail}");
    assert!(entries.iter().all(|e| e["result"] == "done"), "{trail}");
    let (_, page) = super::console_sign_out::get(&app, &cookie, "/console/audit").await;
    assert!(
        page.contains("<td>send_again</td>") && page.contains(&id),
        "{page}"
    );
    app.stop().await;
}

/// A plain `serve` has no admin token: the console's sign-in page says nobody can sign in
/// and how to change that, instead of refusing every token it is given.
#[tokio::test]
async fn the_sign_in_page_says_when_no_admin_token_is_configured() {
    let app = spawn_app_with(|c| c.tokens.clear()).await;
    let page = text_of(&app, "/console").await;
    assert!(
        page.contains("No admin token is configured") && page.contains("WSR_ADMIN_TOKEN"),
        "{page}"
    );
    app.stop().await;
    let app = spawn_app_with(|c| {
        c.tokens = vec![ApiToken::plain(ADMIN, "ops", vec![Scope::Admin])];
    })
    .await;
    let page = text_of(&app, "/console").await;
    assert!(!page.contains("No admin token is configured"), "{page}");
    app.stop().await;
}

/// Rates over time, from the store: the overview charts the last hour per minute (an SVG, no
/// script) with this minute's counts — a message received and one sent show — and reloads
/// itself unless the operator stops it.
#[tokio::test]
async fn the_overview_charts_the_last_hours_rates_and_reloads_itself() {
    let (app, _) = gateway_with_plain_partner("charted").await;
    receive_the_example(&app).await;
    // A message an application accepts: delivered.
    let call = |path: &str, body: Value| {
        let request = app
            .client
            .post(app.url(&format!("/api/v1{path}")))
            .bearer_auth(ADMIN)
            .json(&body);
        async move {
            let r = request.send().await.expect("answers");
            assert!(r.status().is_success(), "{}", r.status());
            r.json::<Value>().await.expect("JSON")
        }
    };
    let sub = call(
        "/subscriptions",
        json!({ "name": "rated", "filter": "default/#", "start": "oldest" }),
    )
    .await;
    let session = call(&format!("/subscriptions/{}/sessions", sub["id"]), json!({})).await;
    let session = session["session"].as_str().expect("session").to_owned();
    let fetched = call(
        &format!("/sessions/{session}/fetch"),
        json!({ "max": 1, "wait_ms": 5000 }),
    )
    .await;
    let receipt = fetched["messages"][0]["receipt"].clone();
    call(
        "/settle",
        json!({ "receipt": receipt, "outcome": "accepted" }),
    )
    .await;
    let id = submitted(&app, "charted").await;
    with_cause(&app, &id).await;
    let cookie = super::console_sign_out::sign_in(&app).await;
    let (status, page) = super::console_sign_out::get(&app, &cookie, "/console").await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("<meta http-equiv=\"refresh\" content=\"30\">"),
        "{page}"
    );
    assert!(page.contains("<svg class=\"chart\""), "{page}");
    assert_eq!(page.matches("<polyline").count(), 6, "{page}");
    let this_minute = |name: &str| -> u64 {
        let row = page
            .split("<tr>")
            .find(|r| r.contains(&format!("<th scope=\"row\">{name}</th>")))
            .unwrap_or_else(|| panic!("a row for {name}: {page}"));
        row.split("<td>")
            .nth(1)
            .and_then(|c| c.split('<').next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("a count for {name}: {row}"))
    };
    assert!(this_minute("received") >= 1, "{page}");
    assert_eq!(this_minute("delivered"), 1, "{page}");
    assert!(this_minute("sent") >= 1, "{page}");
    let (_, still) = super::console_sign_out::get(&app, &cookie, "/console?refresh=off").await;
    assert!(!still.contains("http-equiv=\"refresh\""), "{still}");
    app.stop().await;
}

/// An inbound ordered group with a gap: the overview's "Buffered for a gap" count links to
/// the groups that have one; the group says when it aborts unless the gap fills (console and
/// API); the groups list filters by status.
#[tokio::test]
async fn a_stuck_ordered_group_says_when_it_aborts() {
    use wsr_gateway::wsr::{GroupId, MessageId, ReplyPattern, Request, SequenceNum};
    let app = spawn_app_with(|c| {
        c.tokens = vec![ApiToken::plain(ADMIN, "ops", vec![Scope::Admin])];
    })
    .await;
    let group = "mid:gap@why-stuck";
    for number in [0, 2] {
        let request = Request {
            message_id: MessageId {
                group_id: GroupId::parse(group).expect("group"),
                sequence: Some(SequenceNum {
                    number,
                    last: false,
                    group_limit: None,
                }),
            },
            expiry_time: chrono::Utc::now() + chrono::Duration::hours(2),
            reply_pattern: ReplyPattern::Response,
            ack_requested: true,
            duplicate_elimination: true,
            message_order: true,
        };
        let xml = super::support::request_envelope(&request, "<o:Line xmlns:o=\"urn:o\"/>");
        let answer = app
            .post("/wsr/default", "text/xml; charset=utf-8", xml)
            .await;
        assert!(answer.status < 300, "{}", answer.body);
    }
    let shown = api(&app, &format!("/groups/{}", "mid%3Agap%40why-stuck")).await;
    assert_eq!(shown["buffered"], json!([2]), "{shown}");
    assert!(shown["aborts_at"].is_string(), "{shown}");
    assert!(shown["ends_at"].is_string(), "{shown}");

    let cookie = super::console_sign_out::sign_in(&app).await;
    let (_, overview) = super::console_sign_out::get(&app, &cookie, "/console").await;
    assert!(
        overview.contains("href=\"/console/groups?buffered=yes&amp;partner=anonymous\">1</a>"),
        "{overview}"
    );
    let (status, list) = super::console_sign_out::get(
        &app,
        &cookie,
        "/console/groups?buffered=yes&partner=anonymous",
    )
    .await;
    assert_eq!(status, 200, "{list}");
    assert!(list.contains("mid:gap@why-stuck"), "{list}");
    let (_, none) =
        super::console_sign_out::get(&app, &cookie, "/console/groups?status=aborted").await;
    assert!(!none.contains("mid:gap@why-stuck"), "{none}");
    let (_, page) = super::console_sign_out::get(
        &app,
        &cookie,
        "/console/group?partner=&id=mid%3Agap%40why-stuck",
    )
    .await;
    let aborts = page
        .split("<tr>")
        .find(|r| r.contains("Aborts at"))
        .unwrap_or_else(|| panic!("{page}"));
    assert!(!aborts.contains("—"), "a time: {aborts}");
    assert!(page.contains("Abort the group"), "{page}");

    // Aborted from the console (confirmed): the buffered message is discarded, the group is
    // aborted, and a later message of it is refused with GroupAborted.
    let form = "id=mid%3Agap%40why-stuck&partner=";
    let abort = |body: String| {
        app.client
            .post(app.url("/console/group/abort"))
            .header("cookie", &cookie)
            .header("origin", format!("http://{}", app.addr))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
    };
    let r = abort(form.to_owned()).await.expect("answers");
    assert!(
        r.url().as_str().contains("refused="),
        "not without the confirmation: {}",
        r.url()
    );
    let r = abort(format!("{form}&confirm=yes")).await.expect("answers");
    assert!(r.url().as_str().contains("done=aborted"), "{}", r.url());
    let shown = api(&app, "/groups/mid%3Agap%40why-stuck").await;
    assert_eq!(shown["status"], "aborted", "{shown}");
    assert_eq!(shown["buffered"], json!([]), "{shown}");
    assert_eq!(shown["aborts_at"], Value::Null, "{shown}");
    // The API refuses a second abort: there is nothing left to abort.
    let r = app
        .client
        .post(app.url("/api/v1/groups/mid%3Agap%40why-stuck/abort"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 409);
    app.stop().await;
}

/// A subscription nobody has joined yet: matching is lazy, so its messages are not "waiting"
/// yet — the subscriptions page, the overview and `/metrics` say how many are not matched yet.
#[tokio::test]
async fn a_subscription_nobody_joined_shows_its_unmatched_messages() {
    let app = spawn_app_with(|c| {
        c.tokens = vec![ApiToken::plain(ADMIN, "ops", vec![Scope::Admin])];
    })
    .await;
    let r = app
        .client
        .post(app.url("/api/v1/subscriptions"))
        .bearer_auth(ADMIN)
        .json(&json!({ "name": "lazy-audit", "filter": "default/#" }))
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 201);
    receive_the_example(&app).await;
    let metrics = text_of(&app, "/metrics").await;
    assert!(
        metrics.contains(
            "wsr_store_subscription_messages{subscription=\"lazy-audit\",state=\"unmatched\"} 1\n"
        ),
        "{metrics}"
    );
    let cookie = super::console_sign_out::sign_in(&app).await;
    let (_, page) = super::console_sign_out::get(&app, &cookie, "/console/subscriptions").await;
    let row = page
        .split("<tr>")
        .find(|r| r.contains("lazy-audit"))
        .unwrap_or_else(|| panic!("{page}"));
    let cells: Vec<&str> = row.split("<td>").skip(1).collect();
    assert!(
        cells[3].starts_with("0<") && cells[4].starts_with("1<"),
        "waiting 0, not matched yet 1: {row}"
    );
    app.stop().await;
}

/// `send --to NAME` with a partner that is not configured, where URL destinations are
/// allowed: the refusal says it is not a configured partner, not that it "is not a URL".
#[tokio::test]
async fn an_unknown_partner_name_is_refused_as_such() {
    let app = spawn_app_with(|c| {
        c.tokens = vec![ApiToken::plain(ADMIN, "ops", vec![Scope::Admin])];
        super::support::allow_loopback_urls(c);
    })
    .await;
    let (status, problem) = super::support::submit_as(
        &app,
        ADMIN,
        json!({ "destination": "acmee", "body": "<t:Order xmlns:t=\"urn:t\"/>" }),
    )
    .await;
    assert_eq!(status, 400, "{problem}");
    let reason = problem["reason"].as_str().expect("a reason");
    assert!(
        reason.contains("\"acmee\" is not a configured partner")
            && !reason.contains("is not a URL"),
        "{reason}"
    );
    app.stop().await;
}
