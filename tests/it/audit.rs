//! The audit trail on both backends (`it` and `it-postgres` run this file): grants, revokes,
//! subscription deletes, endpoint registrations and console sign-ins, sign-outs and refused
//! sign-ins are recorded with who, what, on what and the result — URLs without their
//! credentials — and a stranger's refused sign-ins cannot flood it.

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::console_sign_out::{ADMIN, app, post, sign_in};
use super::support::{ClockExt as _, TestApp};

async fn call(app: &TestApp, method: reqwest::Method, path: &str, body: Option<Value>) -> u16 {
    let mut r = app
        .client
        .request(method, app.url(&format!("/api/v1{path}")))
        .bearer_auth(ADMIN);
    if let Some(body) = body {
        r = r.json(&body);
    }
    let r = r.send().await.expect("answers");
    let status = r.status().as_u16();
    if status >= 400 {
        eprintln!("{path}: {}", r.text().await.unwrap_or_default());
    }
    status
}

async fn trail(app: &TestApp) -> Vec<Value> {
    let r = app
        .client
        .get(app.url("/api/v1/audit?limit=1000"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.expect("json");
    body["entries"].as_array().expect("entries").clone()
}

fn line(e: &Value) -> (String, String, String, String) {
    let text = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
    (
        text("principal"),
        text("action"),
        text("target"),
        text("result"),
    )
}

#[tokio::test]
async fn grants_deletes_endpoints_and_sign_ins_are_in_the_trail() {
    use reqwest::Method as M;
    let app = app().await;
    let refused = post(&app, "", "/console/login", "token=not-the-token").await;
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let cookie = sign_in(&app).await;

    let r = app
        .client
        .post(app.url("/api/v1/subscriptions"))
        .bearer_auth(ADMIN)
        .json(&json!({ "name": "audited", "filter": "default/#" }))
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), StatusCode::CREATED);
    let sub = r.json::<Value>().await.expect("json")["id"]
        .as_i64()
        .expect("id");
    let grant = format!("/subscriptions/{sub}/grants/shipping");
    assert_eq!(call(&app, M::PUT, &grant, None).await, 204);
    assert_eq!(call(&app, M::DELETE, &grant, None).await, 204);
    assert_eq!(
        call(&app, M::DELETE, &format!("/subscriptions/{sub}"), None).await,
        204
    );

    let secret_url = json!({ "url": "https://cb-user:cb-secret@partner.example/cb?key=k1" });
    assert_eq!(
        call(
            &app,
            M::POST,
            "/callback-endpoints",
            Some(secret_url.clone())
        )
        .await,
        201
    );
    assert_eq!(
        call(&app, M::DELETE, "/callback-endpoints", Some(secret_url)).await,
        204
    );
    let hook = json!({ "url": "https://erp.example/hook", "principal": "ops" });
    assert_eq!(
        call(&app, M::POST, "/push-endpoints", Some(hook.clone())).await,
        201
    );
    assert_eq!(
        call(&app, M::DELETE, "/push-endpoints", Some(hook)).await,
        204
    );
    let out = post(&app, &cookie, "/console/logout", "").await;
    assert_eq!(out.status(), StatusCode::OK);

    let entries = trail(&app).await;
    let mut lines: Vec<_> = entries.iter().map(line).collect();
    lines.reverse();
    let s = |x: &str| x.to_owned();
    let target = format!("subscription {sub}");
    let cb = s("https://partner.example/cb");
    assert_eq!(
        lines,
        vec![
            (
                s("(unknown)"),
                s("console_sign_in"),
                s("console"),
                s("refused: unknown token")
            ),
            (s("ops"), s("console_sign_in"), s("console"), s("done")),
            (s("ops"), s("grant"), target.clone(), s("done")),
            (s("ops"), s("revoke"), target.clone(), s("done")),
            (s("ops"), s("delete_subscription"), target, s("done")),
            (
                s("ops"),
                s("register_callback_endpoint"),
                cb.clone(),
                s("done")
            ),
            (s("ops"), s("unregister_callback_endpoint"), cb, s("done")),
            (
                s("ops"),
                s("register_push_endpoint"),
                s("https://erp.example/hook"),
                s("done")
            ),
            (
                s("ops"),
                s("unregister_push_endpoint"),
                s("https://erp.example/hook"),
                s("done")
            ),
            (s("ops"), s("console_sign_out"), s("console"), s("done")),
        ],
    );
    let all = serde_json::to_string(&entries).expect("json");
    assert!(!all.contains("cb-secret") && !all.contains("k1"), "{all}");
    let grant_entry = entries
        .iter()
        .find(|e| e["action"] == "grant")
        .expect("grant");
    assert_eq!(grant_entry["detail"], "to shipping");
    let deleted = entries
        .iter()
        .find(|e| e["action"] == "delete_subscription")
        .expect("delete");
    assert_eq!(deleted["detail"], "audited (default/#)");

    // The console lists them too.
    let cookie = sign_in(&app).await;
    let (_, page) = super::console_sign_out::get(&app, &cookie, "/console/audit").await;
    for shown in [
        "<td>grant</td>",
        "<td>register_callback_endpoint</td>",
        "refused: unknown token",
    ] {
        assert!(page.contains(shown), "{shown}: {page}");
    }
    app.stop().await;
}

#[tokio::test]
async fn a_flood_of_refused_sign_ins_is_written_a_bounded_number_of_times_and_counted() {
    let app = app().await;
    let limit = wsr_gateway::http::audit::REFUSALS_PER_MINUTE as usize;
    // Within one minute of the gateway's clock.
    let start = app.clock.now_utc();
    let aligned = start - chrono::Duration::seconds(start.timestamp().rem_euclid(60));
    app.clock.set(aligned);
    for _ in 0..(limit + 15) {
        let r = post(&app, "", "/console/login", "token=wrong").await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(trail(&app).await.len(), limit, "bounded per minute");
    app.clock.advance(chrono::Duration::minutes(1));
    post(&app, "", "/console/login", "token=wrong").await;
    let entries = trail(&app).await;
    assert_eq!(entries.len(), limit + 1);
    assert_eq!(
        entries[0]["detail"],
        "15 more refusals before this one were not recorded one by one"
    );
    app.stop().await;
}
