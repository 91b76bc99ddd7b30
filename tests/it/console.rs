//! The web console (`/console`): its door (admin token in a cookie, checked on every request;
//! POSTs only from its own pages), its pages over real traffic, and the operator's actions
//! through it.

use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, COOKIE, LOCATION, ORIGIN, SET_COOKIE};
use serde_json::json;
use wsr_gateway::config::{ApiToken, Scope};

use super::support::{TestApp, allow_loopback_urls, eventually, mock_partner, spawn_app_with};

const ADMIN: &str = "console-admin-token-0123456789";
const CONSUMER: &str = "console-consume-token-0123456789";
const PRODUCER: &str = "console-produce-token-0123456789";

async fn console_app() -> TestApp {
    spawn_app_with(|c| {
        c.tokens = vec![
            ApiToken::plain(ADMIN, "ops", vec![Scope::Admin]),
            ApiToken::plain(CONSUMER, "reader", vec![Scope::Consume]),
            ApiToken::plain(PRODUCER, "app", vec![Scope::Produce]),
        ];
        allow_loopback_urls(c);
    })
    .await
}

const FORM: &str = "application/x-www-form-urlencoded";

/// A form body as a browser encodes it.
fn form_body(fields: &[(&str, &str)]) -> String {
    let encode = |text: &str| -> String {
        text.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                b' ' => "+".to_owned(),
                b => format!("%{b:02X}"),
            })
            .collect()
    };
    fields
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// A client that shows redirects instead of following them.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

fn origin(app: &TestApp) -> String {
    format!("http://{}", app.addr)
}

async fn login(app: &TestApp, token: &str) -> reqwest::Response {
    client()
        .post(app.url("/console/login"))
        .header(ORIGIN, origin(app))
        .header(CONTENT_TYPE, FORM)
        .body(form_body(&[("token", token)]))
        .send()
        .await
        .expect("answers")
}

/// Signs in with the admin token; the cookie to send.
async fn signed_in(app: &TestApp) -> String {
    let r = login(app, ADMIN).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let set = r
        .headers()
        .get(SET_COOKIE)
        .expect("a cookie")
        .to_str()
        .expect("text")
        .to_owned();
    set.split(';').next().expect("name=value").to_owned()
}

async fn get(app: &TestApp, cookie: &str, path: &str) -> (StatusCode, String) {
    let r = client()
        .get(app.url(path))
        .header(COOKIE, cookie)
        .send()
        .await
        .expect("answers");
    (r.status(), r.text().await.expect("body"))
}

async fn post(app: &TestApp, cookie: &str, path: &str, form: &[(&str, &str)]) -> reqwest::Response {
    client()
        .post(app.url(path))
        .header(COOKIE, cookie)
        .header(ORIGIN, origin(app))
        .header(CONTENT_TYPE, FORM)
        .body(form_body(form))
        .send()
        .await
        .expect("answers")
}

/// What `held_by_a_member` left: the subscription, the member's session and the receipt of
/// the one message it holds.
struct Held {
    subscription: i64,
    session: String,
    receipt: String,
}

/// The consumer creates subscription `name` over `default/#` (one delivery allowed, from the
/// oldest), joins it and fetches one message.
async fn held_by_a_member(app: &TestApp, name: &str) -> Held {
    let api = |method: reqwest::Method, path: &str, body: serde_json::Value| {
        let request = app
            .client
            .request(method, app.url(path))
            .bearer_auth(CONSUMER)
            .json(&body);
        async move {
            let answer: serde_json::Value = request
                .send()
                .await
                .expect("answers")
                .json()
                .await
                .expect("JSON");
            answer
        }
    };
    let post = reqwest::Method::POST;
    let sub = api(
        post.clone(),
        "/api/v1/subscriptions",
        json!({"name": name, "filter": "default/#", "max_deliveries": 1, "start": "oldest"}),
    )
    .await;
    let subscription = sub["id"].as_i64().expect("id");
    let path = format!("/api/v1/subscriptions/{subscription}/sessions");
    let session = api(post.clone(), &path, json!({})).await;
    let session = session["session"].as_str().expect("session").to_owned();
    let path = format!("/api/v1/sessions/{session}/fetch");
    let fetched = api(post, &path, json!({"max": 1, "wait_ms": 0})).await;
    let receipt = fetched["messages"][0]["receipt"]
        .as_str()
        .unwrap_or_else(|| panic!("a message: {fetched}"))
        .to_owned();
    Held {
        subscription,
        session,
        receipt,
    }
}

/// The consumer settles a receipt `rejected`: with one delivery allowed, a dead letter.
async fn reject(app: &TestApp, receipt: &str) {
    let settled = app
        .client
        .post(app.url("/api/v1/settle"))
        .bearer_auth(CONSUMER)
        .json(&json!({"receipt": receipt, "outcome": "rejected"}))
        .send()
        .await
        .expect("answers");
    assert!(
        settled.status().is_success(),
        "{}",
        settled.text().await.unwrap_or_default()
    );
}

/// The producer submits one message allowed one attempt to a partner that answers 503 to
/// everything; answers its id once that attempt reached the partner.
async fn sent_to_a_partner_that_answers_503(
    app: &TestApp,
) -> (String, super::support::MockPartner) {
    let mut partner = mock_partner(vec![503; 10]).await;
    let (status, answer) = super::support::submit_as(
        app,
        PRODUCER,
        json!({
            "destination": partner.url,
            "agreement": { "max_attempts": 1, "interval_ms": 100, "backoff": 1, "expiry_seconds": 3600 },
            "body": "<t:Order xmlns:t=\"urn:t\">1</t:Order>",
        }),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    let id = answer["id"].as_str().expect("id").to_owned();
    partner.next_post().await;
    (id, partner)
}

#[tokio::test]
async fn only_an_admin_token_signs_in_and_every_page_checks_it() {
    let app = console_app().await;
    let (status, page) = get(&app, "", "/console").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(page.contains("<label for=\"token\">"), "{page}");
    assert!(page.contains("<html lang=\"en\">"), "{page}");

    for (token, why) in [
        ("not-a-token-0123456789", "unknown token"),
        (CONSUMER, "may not do this"),
    ] {
        let r = login(&app, token).await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{token}");
        assert!(r.headers().get(SET_COOKIE).is_none(), "{token}");
        let page = r.text().await.expect("body");
        assert!(page.contains(why), "{page}");
        assert!(!page.contains(token), "the token is never shown: {page}");
    }
    // A token in a hand-made cookie signs nobody in, not even the admin's: the cookie is a
    // signed sign-in, not a token.
    for token in [CONSUMER, ADMIN] {
        for value in [hex(token), token.to_owned()] {
            let forged = format!("wsr_console={value}");
            let (status, page) = get(&app, &forged, "/console").await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{forged}");
            assert!(page.contains("sign in again"), "{page}");
        }
    }

    let r = login(&app, ADMIN).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()[LOCATION], "/console");
    let set = r.headers()[SET_COOKIE].to_str().expect("text").to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/console"] {
        assert!(set.contains(attribute), "{set}");
    }
    assert!(!set.contains("Secure"), "plain HTTP listener: {set}");
    assert!(
        set.contains("Max-Age=43200"),
        "ends with the sign-in: {set}"
    );
    assert!(
        !set.contains(ADMIN) && !set.contains(&hex(ADMIN)),
        "the token is not in the cookie: {set}"
    );
    let cookie = set.split(';').next().expect("pair").to_owned();
    // Every gateway on the same store accepts it (the key is the store's); one on another
    // store does not.
    let elsewhere = console_app().await;
    let (status, page) = get(&elsewhere, &cookie, "/console").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{page}");
    elsewhere.stop().await;
    let (status, page) = get(&app, &cookie, "/console").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("<h1>Overview</h1>"), "{page}");
    assert!(page.contains("Sending, by partner"), "{page}");
    for path in [
        "/console/messages",
        "/console/groups",
        "/console/inbox",
        "/console/subscriptions",
        "/console/endpoints",
    ] {
        let (status, page) = get(&app, &cookie, path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {page}");
    }

    // No Origin and no Referer, or another site's: refused before anything happens.
    let bare = client()
        .post(app.url("/console/message/resend"))
        .header(COOKIE, &cookie)
        .header(CONTENT_TYPE, FORM)
        .body(form_body(&[("id", "x")]))
        .send()
        .await
        .expect("answers");
    assert_eq!(bare.status(), StatusCode::FORBIDDEN);
    let elsewhere = client()
        .post(app.url("/console/logout"))
        .header(COOKIE, &cookie)
        .header(ORIGIN, "https://evil.example")
        .send()
        .await
        .expect("answers");
    assert_eq!(elsewhere.status(), StatusCode::FORBIDDEN);

    // Hostile parameters: a clear 400 or 404, never a panic.
    for path in [
        "/console/inbox/message?offset=99999999999999999999999",
        "/console/inbox/message?offset=-1",
        "/console/subscription?id=abc",
        "/console/messages?state=nonsense",
    ] {
        assert_eq!(
            get(&app, &cookie, path).await.0,
            StatusCode::BAD_REQUEST,
            "{path}"
        );
    }
    let long = format!("/console/message?id={}", "x".repeat(5000));
    assert_eq!(get(&app, &cookie, &long).await.0, StatusCode::BAD_REQUEST);
    assert_eq!(
        get(&app, &cookie, "/console/message?id=no-such").await.0,
        StatusCode::NOT_FOUND
    );

    let out = post(&app, &cookie, "/console/logout", &[]).await;
    assert_eq!(out.status(), StatusCode::OK);
    assert!(
        out.headers()[SET_COOKIE]
            .to_str()
            .expect("text")
            .contains("Max-Age=0")
    );
    app.stop().await;
}

fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn resend_and_fail_through_the_console_change_the_message() {
    let app = console_app().await;
    let (id, mut partner) = sent_to_a_partner_that_answers_503(&app).await;
    let attempts_now = || {
        let store = app.store.clone();
        let id = id.clone();
        async move {
            let m = store.out_message(&id).await.expect("read")?;
            Some(m.outbound.attempts)
        }
    };
    let first = eventually("the first attempt is counted", || async {
        attempts_now().await.filter(|a| *a >= 1)
    })
    .await;

    let cookie = signed_in(&app).await;
    let (status, page) = get(&app, &cookie, &format!("/console/message?id={id}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("Resend now"), "{page}");
    assert!(
        page.contains("&lt;t:Order"),
        "the envelope, escaped: {page}"
    );
    assert!(page.contains("<td>queued</td>"), "its history: {page}");

    let r = post(&app, &cookie, "/console/message/resend", &[("id", &id)]).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(
        r.headers()[LOCATION]
            .to_str()
            .expect("text")
            .ends_with("&done=resent")
    );
    partner.next_post().await;
    eventually("the resend is counted", || async {
        attempts_now().await.filter(|a| *a > first)
    })
    .await;

    // A fail needs a reason and the confirmation; without, nothing happens and the page
    // says why.
    for form in [
        vec![("id", id.as_str()), ("confirm", "yes")],
        vec![("id", id.as_str()), ("reason", "partner <gone>")],
    ] {
        let r = post(&app, &cookie, "/console/message/fail", &form).await;
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
        let back = r.headers()[LOCATION].to_str().expect("text").to_owned();
        assert!(
            back.starts_with(&format!("/console/message?id={id}&refused=")),
            "{back}"
        );
        let (_, page) = get(&app, &cookie, &back).await;
        assert!(page.contains("Not done: "), "{page}");
        let m = app
            .store
            .out_message(&id)
            .await
            .expect("read")
            .expect("there");
        assert_eq!(m.outbound.state.name(), "sent", "not failed without both");
    }
    let r = post(
        &app,
        &cookie,
        "/console/message/fail",
        &[
            ("id", &id),
            ("reason", "partner <gone>"),
            ("confirm", "yes"),
        ],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let m = app
        .store
        .out_message(&id)
        .await
        .expect("read")
        .expect("there");
    assert_eq!(m.outbound.state.name(), "failed");
    let (_, page) = get(
        &app,
        &cookie,
        &format!("/console/message?id={id}&done=failed"),
    )
    .await;
    assert!(
        page.contains("failed by operator ops: partner &lt;gone&gt;"),
        "{page}"
    );
    assert!(
        !page.contains("Resend now"),
        "no actions on a final message: {page}"
    );
    // A second fail is refused: back on the message's page, which says why.
    let again = post(
        &app,
        &cookie,
        "/console/message/fail",
        &[("id", &id), ("reason", "again"), ("confirm", "yes")],
    )
    .await;
    assert_eq!(again.status(), StatusCode::SEE_OTHER);
    let back = again.headers()[LOCATION].to_str().expect("text").to_owned();
    let (_, page) = get(&app, &cookie, &back).await;
    assert!(
        page.contains("Not done: the message is already failed"),
        "{page}"
    );
    app.stop().await;
}

#[tokio::test]
async fn received_payloads_are_shown_escaped_and_dead_letters_replayed() {
    let app = console_app().await;
    let in_an_hour = super::support::xs(app.clock.now_utc() + chrono::Duration::hours(1));
    use super::support::ClockExt as _;
    let xml =
        std::fs::read_to_string(super::support::repo_root().join("examples/purchase-order.xml"))
            .expect("example envelope")
            .replace("2099-12-31T23:59:59Z", &in_an_hour);
    // A payload that would run as script if it were not escaped.
    let xml = xml.replacen(
        "<po:Line",
        "<po:Note>&lt;script&gt;alert(1)&lt;/script&gt;</po:Note><po:Line",
        1,
    );
    let answer = app
        .post("/wsr/default", "text/xml; charset=utf-8", xml)
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);

    // A subscription with a dead letter: fetched once and rejected.
    let Held {
        subscription: sub_id,
        receipt,
        ..
    } = held_by_a_member(&app, "audit").await;
    reject(&app, &receipt).await;

    let cookie = signed_in(&app).await;
    let (status, page) = get(&app, &cookie, "/console/inbox").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("default/PurchaseOrder"), "{page}");
    let (status, page) = get(&app, &cookie, "/console/inbox/message?offset=1").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("&amp;lt;script&amp;gt;"), "escaped: {page}");
    assert!(!page.contains("<script"), "{page}");
    let (status, page) = get(
        &app,
        &cookie,
        "/console/group?id=mid%3Aexample-po-0001%40partner.example.org",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("complete") || page.contains("open"), "{page}");

    let (_, page) = get(&app, &cookie, &format!("/console/subscription?id={sub_id}")).await;
    assert!(page.contains("Replay all dead letters"), "{page}");
    let r = post(
        &app,
        &cookie,
        "/console/subscription/dead-letters",
        &[("id", &sub_id.to_string()), ("change", "replay")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let back = r.headers()[LOCATION].to_str().expect("text").to_owned();
    assert!(back.ends_with("&done=replay&count=1"), "{back}");
    let (_, page) = get(&app, &cookie, &back).await;
    assert!(page.contains("1 dead letter(s) replayed."), "{page}");
    let backlog = app.store.backlog(sub_id).await.expect("backlog");
    assert_eq!(backlog.dead_letters, 0);
    app.stop().await;
}

/// The cells of the table row whose heading cell holds `heading` (its text or a link to it).
fn row_of(page: &str, caption: &str, heading: &str) -> Vec<String> {
    let table = page
        .split("<caption>")
        .find(|t| t.starts_with(caption))
        .unwrap_or_else(|| panic!("no table {caption:?}: {page}"));
    let table = table.split("</table>").next().unwrap_or(table);
    let row = table
        .split("<tr>")
        .find(|r| {
            r.split("</th>").next().is_some_and(|th| {
                th.ends_with(&format!(">{heading}</a>")) || th.ends_with(&format!(">{heading}"))
            })
        })
        .unwrap_or_else(|| panic!("no row {heading:?} in {caption:?}: {table}"));
    row.split("<td>")
        .skip(1)
        .map(|c| c.split("</td>").next().unwrap_or("").to_owned())
        .collect()
}

#[tokio::test]
async fn the_overview_counts_by_channel_and_partner_the_inbox_is_searched_and_members_shown() {
    use super::support::ClockExt as _;
    let app = console_app().await;
    let now = app.clock.now_utc();
    let example = |expiry: chrono::DateTime<chrono::Utc>| {
        std::fs::read_to_string(super::support::repo_root().join("examples/purchase-order.xml"))
            .expect("example envelope")
            .replace("2099-12-31T23:59:59Z", &super::support::xs(expiry))
    };
    let answer = app
        .post(
            "/wsr/default",
            "text/xml; charset=utf-8",
            example(now + chrono::Duration::hours(1)),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    // Expired on arrival: a fault, counted for this gateway.
    let expired =
        example(now - chrono::Duration::hours(1)).replace("example-po-0001", "example-po-expired");
    let answer = app
        .post("/wsr/default", "text/xml; charset=utf-8", expired)
        .await;
    assert!(answer.status >= 400, "{}", answer.body);

    // An outbound message whose one attempt got a 503: in doubt.
    let (id, _partner) = sent_to_a_partner_that_answers_503(&app).await;
    eventually("the message is in doubt", || async {
        let m = app.store.out_message(&id).await.expect("read")?;
        m.outbound.in_doubt().then_some(())
    })
    .await;

    let cookie = signed_in(&app).await;
    let (status, page) = get(&app, &cookie, "/console").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let received = row_of(&page, "Receiving, by channel and partner", "default");
    assert_eq!(
        received[0], "anonymous",
        "one name for no partner: {received:?}"
    );
    assert_eq!(
        received[1], "1",
        "one received in the last minute: {received:?}"
    );
    let faults: u64 = received[5].parse().expect("a count");
    assert!(faults >= 1, "the expired one: {received:?}");
    let sending = row_of(&page, "Sending, by partner", "anonymous");
    assert!(
        sending[1].contains(">1</a>"),
        "sent, no verdict: {sending:?}"
    );
    assert!(
        sending[2].contains("state=in_doubt") && sending[2].contains(">1</a>"),
        "in doubt, a link to them: {sending:?}"
    );
    assert!(page.contains("InvalidExpiryTime"), "{page}");

    // Outbound by partner: "anonymous" is a URL destination.
    let (_, page) = get(&app, &cookie, "/console/messages?partner=anonymous").await;
    assert!(page.contains(&id), "{page}");
    let (_, page) = get(&app, &cookie, "/console/messages?partner=acme").await;
    assert!(page.contains("Outbound messages: none."), "{page}");

    // The inbox searched by channel, partner, group id and time.
    for (query, found) in [
        ("channel=default&partner=anonymous", true),
        ("channel=elsewhere", false),
        ("partner=acme", false),
        ("group=mid%3Aexample-po-0001%40partner.example.org", true),
        ("group=mid%3Aother%40partner.example.org", false),
        ("since=2000-01-01T00%3A00", true),
        ("since=2999-01-01T00%3A00%3A00%2B01%3A00", false),
    ] {
        let (status, page) = get(&app, &cookie, &format!("/console/inbox?{query}")).await;
        assert_eq!(status, StatusCode::OK, "{query}: {page}");
        assert_eq!(
            page.contains("href=\"/console/inbox/message?offset=1\""),
            found,
            "{query}: {page}"
        );
    }
    let (status, page) = get(&app, &cookie, "/console/inbox?since=yesterday").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");

    // A member holding a message, then a dead letter purged alone.
    let Held {
        subscription: sub_id,
        session: session_id,
        receipt,
    } = held_by_a_member(&app, "members").await;
    let (_, page) = get(&app, &cookie, &format!("/console/subscription?id={sub_id}")).await;
    let member = row_of(&page, "Members", "reader");
    assert_eq!(member[0], session_id, "{member:?}");
    assert_eq!(member[2], "1", "in flight: {member:?}");

    reject(&app, &receipt).await;
    let (_, page) = get(&app, &cookie, &format!("/console/subscription?id={sub_id}")).await;
    assert!(page.contains(">Purge 1</button>"), "{page}");
    let sid = sub_id.to_string();
    let purge = [("id", sid.as_str()), ("change", "purge"), ("offset", "1")];
    // Without its confirmation a purge is not done; the page says why.
    let r = post(&app, &cookie, "/console/subscription/dead-letters", &purge).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let back = r.headers()[LOCATION].to_str().expect("text").to_owned();
    assert!(back.contains("&refused="), "{back}");
    let (_, page) = get(&app, &cookie, &back).await;
    assert!(page.contains("Not done: tick the confirmation"), "{page}");
    assert_eq!(
        app.store
            .backlog(sub_id)
            .await
            .expect("backlog")
            .dead_letters,
        1
    );
    let mut confirmed = purge.to_vec();
    confirmed.push(("confirm", "yes"));
    let r = post(
        &app,
        &cookie,
        "/console/subscription/dead-letters",
        &confirmed,
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let back = r.headers()[LOCATION].to_str().expect("text").to_owned();
    assert!(back.ends_with("&done=purge&count=1"), "{back}");
    let backlog = app.store.backlog(sub_id).await.expect("backlog");
    assert_eq!(backlog.dead_letters, 0);
    app.stop().await;
}

/// Behind a proxy that rewrites `Host` (nginx's default `proxy_pass`), the browser's Origin
/// names the public host: the console takes it from the trusted proxy's `host_header`, and
/// from nobody else.
#[tokio::test]
async fn behind_a_host_rewriting_proxy_the_forwarded_host_is_the_origin_to_match() {
    use wsr_gateway::config::TrustedProxy;
    let login_via = |app: &TestApp, forwarded: Option<&'static str>| {
        let mut request = client()
            .post(app.url("/console/login"))
            .header(ORIGIN, "https://gw.example")
            .header(CONTENT_TYPE, FORM)
            .body(form_body(&[("token", ADMIN)]));
        if let Some(host) = forwarded {
            request = request.header("X-Forwarded-Host", host);
        }
        async move {
            let r = request.send().await.expect("answers");
            if r.status() == StatusCode::SEE_OTHER {
                let set = r.headers()[SET_COOKIE].to_str().expect("text");
                assert!(set.contains("; Secure"), "the browser is on https: {set}");
            }
            r.status()
        }
    };
    let behind = |network: &'static str| {
        spawn_app_with(move |c| {
            c.tokens = vec![ApiToken::plain(ADMIN, "ops", vec![Scope::Admin])];
            c.trusted_proxy = Some(TrustedProxy {
                networks: vec![(network.parse().expect("ip"), 8)],
                client_cert_header: None,
                peer_address_header: None,
                host_header: Some("x-forwarded-host".parse().expect("name")),
            });
        })
    };
    // The test client is the proxy (127.0.0.1).
    let app = behind("127.0.0.0").await;
    assert_eq!(
        login_via(&app, Some("gw.example")).await,
        StatusCode::SEE_OTHER
    );
    assert_eq!(
        login_via(&app, Some("evil.example")).await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        login_via(&app, None).await,
        StatusCode::FORBIDDEN,
        "Host is 127.0.0.1"
    );
    app.stop().await;
    // A peer that is not the proxy cannot name the host.
    let app = behind("10.0.0.0").await;
    assert_eq!(
        login_via(&app, Some("gw.example")).await,
        StatusCode::FORBIDDEN
    );
    app.stop().await;
}

/// Request-response channels (D16) on the overview, with the requests in doubt toward their
/// service (a call whose outcome stayed unknown under `on_unknown = "fail"`).
#[tokio::test]
async fn the_overview_shows_request_response_channels_and_requests_in_doubt() {
    use wsr_gateway::outbound::backend::{BackendSpec, RequestResponse, Responder};
    use wsr_gateway::rmp::exchange::OnUnknown;
    let app = spawn_app_with(|c| {
        c.tokens = vec![ApiToken::plain(ADMIN, "ops", vec![Scope::Admin])];
        c.operations.insert(
            "default".into(),
            RequestResponse {
                responder: Responder::Backend(BackendSpec {
                    url: "http://user:secret@127.0.0.1:9/echo?key=1".into(),
                    timeout: std::time::Duration::from_millis(100),
                    max_concurrency: 1,
                    tls: Default::default(),
                    credentials: None,
                }),
                on_unknown: OnUnknown::Fail,
            },
        );
    })
    .await;
    let key = wsr_gateway::wsr::MessageKey {
        group_id: wsr_gateway::wsr::GroupId::parse("mid:doubt@console").expect("id"),
        number: Some(3),
    };
    let now = chrono::Utc::now();
    let call = wsr_gateway::store::NewCall {
        partner: "",
        key: &key,
        channel: "default",
        source: "127.0.0.1",
        now,
        keep_until: now + chrono::Duration::hours(1),
    };
    let how = wsr_gateway::store::BeginCall::Fresh { quota: u64::MAX };
    let (wsr_gateway::store::Began::Call(attempt), _) =
        app.store.begin_call(call, how).await.expect("call out")
    else {
        panic!("the call was not begun");
    };
    app.store
        .call_unknown("", &key, attempt, true)
        .await
        .expect("in doubt");
    let cookie = signed_in(&app).await;
    let (status, page) = get(&app, &cookie, "/console").await;
    assert_eq!(status, StatusCode::OK);
    let channel = row_of(&page, "Request-response channels", "default");
    assert!(
        channel[0].contains("http://127.0.0.1:9/echo"),
        "{channel:?}"
    );
    assert!(
        !page.contains("secret"),
        "no credential of the URL on the page"
    );
    let doubt = row_of(&page, "Requests in doubt toward a service", "default");
    assert_eq!(doubt[1], "mid:doubt@console");
    assert_eq!(doubt[2], "3");
}

/// The `href` of the link whose text is `text` (unescaped as a browser reads it).
fn href_of(page: &str, text: &str) -> String {
    let before = page
        .split(&format!("\">{text}</a>"))
        .next()
        .filter(|b| b.len() < page.len())
        .unwrap_or_else(|| panic!("no link {text:?}: {page}"));
    let href = before.rsplit("<a href=\"").next().expect("a link");
    href.replace("&amp;", "&")
}

/// "Showing the first N of M bytes": (N, M).
fn shown_of(page: &str) -> (usize, usize) {
    let rest = page
        .split("Showing the first ")
        .nth(1)
        .unwrap_or_else(|| panic!("no excerpt note: {page}"));
    let mut numbers = rest.split(' ');
    let shown = numbers.next().and_then(|n| n.parse().ok()).expect("N");
    let total = numbers.nth(1).and_then(|n| n.parse().ok()).expect("M");
    (shown, total)
}

/// GETs a download link: it must be an attachment, never sniffed as a page; its bytes and
/// Content-Type.
async fn download(app: &TestApp, cookie: &str, href: &str) -> (Vec<u8>, String) {
    let r = client()
        .get(app.url(href))
        .header(COOKIE, cookie)
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), StatusCode::OK, "{href}");
    let headers = r.headers().clone();
    let disposition = headers["content-disposition"].to_str().expect("text");
    assert!(disposition.starts_with("attachment"), "{disposition}");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    let content_type = headers[CONTENT_TYPE].to_str().expect("text").to_owned();
    (r.bytes().await.expect("body").to_vec(), content_type)
}

/// A page holding a large payload, envelope or business response shows its first 64 KiB
/// (cut on a character, escaped), says so, and links to all of it, downloaded byte for byte
/// as stored; without a sign-in the download is the login page.
#[tokio::test]
async fn a_large_payload_is_shown_in_part_and_downloaded_whole() {
    use super::support::ClockExt as _;
    use wsr_gateway::store::outbound::{KeptResponse, ResponseInfo};
    const SHOWN: usize = 64 * 1024;
    let app = console_app().await;
    // Two-byte characters and markup, about 4 MiB: a cut may fall inside a character.
    let text = "Ünïcödé &lt;b&gt; ".repeat(200_000);
    let in_an_hour = super::support::xs(app.clock.now_utc() + chrono::Duration::hours(1));
    let xml =
        std::fs::read_to_string(super::support::repo_root().join("examples/purchase-order.xml"))
            .expect("example envelope")
            .replace("2099-12-31T23:59:59Z", &in_an_hour)
            .replacen("<po:Line", &format!("<po:Note>{text}</po:Note><po:Line"), 1);
    let answer = app
        .post("/wsr/default", "text/xml; charset=utf-8", xml)
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let stored = app.inbox().await.remove(0).payload;
    assert!(stored.len() > 4_000_000);

    let cookie = signed_in(&app).await;
    let (status, page) = get(&app, &cookie, "/console/inbox/message?offset=1").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.len() < 8 * SHOWN, "bounded: {} bytes", page.len());
    let (shown, total) = shown_of(&page);
    assert!((SHOWN - 3..=SHOWN).contains(&shown), "{shown}");
    assert!(stored.is_char_boundary(shown), "cut on a character");
    assert_eq!(total, stored.len());
    assert!(page.contains("&amp;lt;b&amp;gt;"), "escaped");
    let href = href_of(&page, "Download the whole payload");
    assert_eq!(href, "/console/inbox/message/payload?offset=1");
    let (bytes, content_type) = download(&app, &cookie, &href).await;
    assert!(bytes == stored.as_bytes(), "the payload, byte for byte");
    assert_eq!(content_type, "application/xml; charset=utf-8");
    let (status, page) = get(&app, "", &href).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(page.contains("<label for=\"token\">"), "the login page");

    // Our message: a large envelope, and a large business response kept with it (bytes that
    // are not all UTF-8, with the Content-Type they came with).
    let (status, submitted) = super::support::submit_as(
        &app,
        PRODUCER,
        json!({
            "destination": "http://127.0.0.1:9/nobody",
            "body": format!("<t:Order xmlns:t=\"urn:t\">{text}</t:Order>"),
        }),
    )
    .await;
    assert_eq!(status, 202, "{submitted}");
    let id = submitted["id"].as_str().expect("id").to_owned();
    let mut response = b"<r>".to_vec();
    response.extend(std::iter::repeat_n(0xFFu8, 100_000));
    response.extend(text.as_bytes());
    let kept = KeptResponse {
        info: ResponseInfo {
            content_type: "application/x-partner; v=1".into(),
            size: response.len() as u64,
            soap_fault: false,
            received_at: chrono::Utc::now(),
        },
        body: response.clone(),
    };
    assert!(app.store.keep_response(&id, &kept).await.expect("kept"));
    let envelope = app
        .store
        .out_message(&id)
        .await
        .expect("read")
        .expect("there")
        .envelope;

    let (status, page) = get(&app, &cookie, &format!("/console/message?id={id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.len() < 16 * SHOWN, "bounded: {} bytes", page.len());
    let envelope_part = page
        .split("<h2>Business response</h2>")
        .next()
        .expect("part");
    assert_eq!(shown_of(envelope_part).1, envelope.len());
    let (bytes, content_type) = download(
        &app,
        &cookie,
        &href_of(&page, "Download the whole envelope"),
    )
    .await;
    assert!(bytes == envelope.as_bytes(), "the envelope, byte for byte");
    assert_eq!(content_type, "text/xml; charset=utf-8");
    let response_part = page
        .split("<h2>Business response</h2>")
        .nth(1)
        .expect("part");
    assert_eq!(shown_of(response_part), (SHOWN, response.len()));
    let (bytes, content_type) = download(
        &app,
        &cookie,
        &href_of(&page, "Download the whole response"),
    )
    .await;
    assert!(bytes == response, "the response, byte for byte");
    assert_eq!(content_type, "application/x-partner; v=1");
    app.stop().await;
}

/// Issue 31 item 5: the operator sees who the storage quota holds back.
#[tokio::test]
async fn the_overview_lists_the_sources_the_storage_quota_holds_back() {
    let app = spawn_app_with(|c| {
        c.tokens = vec![ApiToken::plain(ADMIN, "ops", vec![Scope::Admin])];
        let quota = wsr_gateway::rmp::quota::SourceQuota {
            max_stored_bytes: 0,
            max_messages_per_second: 1,
        };
        c.channels
            .get_mut("default")
            .expect("the default channel")
            .quota = quota;
    })
    .await;
    let send = |group: &str| {
        let request = wsr_gateway::wsr::Request {
            message_id: wsr_gateway::wsr::MessageId {
                group_id: wsr_gateway::wsr::GroupId::parse(group).expect("group id"),
                sequence: None,
            },
            expiry_time: chrono::Utc::now() + chrono::Duration::hours(1),
            reply_pattern: wsr_gateway::wsr::ReplyPattern::Response,
            ack_requested: true,
            duplicate_elimination: true,
            message_order: false,
        };
        let xml = super::support::request_envelope(&request, "<p:Order xmlns:p=\"urn:p\"/>");
        app.send(wsr_gateway::wsr::SoapVersion::Soap11, xml)
    };
    assert!(
        !send("mid:held-1@console")
            .await
            .body
            .contains("MessageProcessingFailure")
    );
    let refused = send("mid:held-2@console").await;
    assert!(
        refused.body.contains("MessageProcessingFailure"),
        "{}",
        refused.body
    );
    let cookie = signed_in(&app).await;
    let (status, page) = get(&app, &cookie, "/console").await;
    assert_eq!(status, StatusCode::OK);
    let section = page
        .split("Sources held back by their storage quota")
        .nth(1)
        .expect("the section");
    assert!(
        section.contains("127.0.0.1") && section.contains("messages_per_second"),
        "{section}"
    );
    app.stop().await;
}

/// Issue 33 (item 8): the gateway's root sends a browser to the console.
#[tokio::test]
async fn the_root_points_to_the_console() {
    let app = console_app().await;
    let r = client().get(app.url("/")).send().await.expect("answers");
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()[LOCATION], "/console");
    app.stop().await;
}
