//! Replay of the request-response recordings (`tests/fixtures/holodeck-rr/h2g-inout-*.json`):
//! the independent Holodeck 1.x peer calling an in-out operation (`e:echo`) on the gateway.
//! The requests are replayed as recorded, to a gateway whose channel is answered by a scripted
//! SOAP service; what is asserted is the new behaviour (README of the recordings): a business
//! response with the ack on it (Response) or by poll / callback, the same bytes for every copy,
//! the service called once. The recorded answers are what the gateway said before D16.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::interop::header;
use super::request_response::{Script, by_backend, soap_service};
use super::support::{Answer, TestApp, repo_root, spawn_app_at_with};

/// One request the peer sent, as recorded.
struct Sent {
    content_type: String,
    soap_action: Option<String>,
    body: String,
    time: DateTime<Utc>,
}

/// The requests the peer sent to the gateway in recording `name`, in order.
fn sent(name: &str) -> Vec<Sent> {
    let path = repo_root().join(format!("tests/fixtures/holodeck-rr/{name}.json"));
    let doc: Value = serde_json::from_slice(&std::fs::read(&path).expect("recording"))
        .expect("recording is JSON");
    doc["exchanges"]
        .as_array()
        .expect("exchanges")
        .iter()
        .filter(|ex| ex["from"] == "peer")
        .map(|ex| {
            let req = &ex["request"];
            Sent {
                content_type: header(&req["headers"], "content-type").expect("content type"),
                soap_action: header(&req["headers"], "soapaction"),
                body: req["body"].as_str().expect("body").to_owned(),
                time: req["time"]
                    .as_str()
                    .and_then(|t| t.parse().ok())
                    .expect("request time"),
            }
        })
        .collect()
}

async fn replay(app: &TestApp, s: &Sent) -> Answer {
    let mut r = app
        .client
        .post(app.url("/wsr/default"))
        .header("content-type", &s.content_type)
        .body(s.body.clone());
    if let Some(action) = &s.soap_action {
        r = r.header("SOAPAction", action);
    }
    Answer::read(r.send().await.expect("reaches the gateway")).await
}

/// A gateway at the recording's time whose `default` channel the scripted service answers.
async fn gateway(script: &Script, at: DateTime<Utc>) -> TestApp {
    let url = soap_service(script).await;
    let app = spawn_app_at_with(at, |c| {
        c.operations.insert("default".into(), by_backend(&url));
    })
    .await;
    // The ReplyTo Holodeck names for its callbacks (nothing listens there in this test).
    app.register_callback("http://127.0.0.1:49081/axis2/services/wsrm")
        .await;
    app
}

#[tokio::test]
async fn holodeck_calling_an_in_out_operation_gets_the_business_response_with_the_ack() {
    let requests = sent("h2g-inout-response-soap12");
    let script = Script::default();
    let app = gateway(&script, requests[0].time).await;
    let answer = replay(&app, &requests[0]).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let env = answer.envelope();
    assert_eq!(env.version, wsr_gateway::wsr::SoapVersion::Soap12);
    let ack = env
        .response
        .expect("the ack rides on the business response");
    assert_eq!(ack.replies.len(), 1);
    assert!(env.body.content.contains("echoResponse"), "{}", answer.body);
    let again = replay(&app, &requests[0]).await;
    assert_eq!(again.body, answer.body, "a resend gets the same bytes");
    let calls = script.calls();
    assert_eq!(calls.len(), 1);
    let ct = calls[0].headers["content-type"].to_str().expect("ascii");
    assert!(
        ct.contains("action=\"urn:echo\""),
        "the action passed through: {ct}"
    );
    assert!(
        calls[0].body.contains("<wsa:Action>urn:echo</wsa:Action>"),
        "other blocks stay"
    );
    assert!(!calls[0].body.contains("wsrm:Request"));
}

#[tokio::test]
async fn holodeck_under_poll_gets_the_business_response_now_and_the_ack_by_poll() {
    let requests = sent("h2g-inout-poll");
    assert_eq!(requests.len(), 3, "request, poll, resend");
    let script = Script::default();
    let app = gateway(&script, requests[0].time).await;
    let answer = replay(&app, &requests[0]).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let env = answer.envelope();
    assert!(env.response.is_none(), "the ack goes by poll");
    assert!(env.body.content.contains("echoResponse"));
    let polled = replay(&app, &requests[1]).await;
    let acked = polled.envelope().response.expect("the poll is answered");
    assert_eq!(acked.replies.len(), 1, "{}", polled.body);
    let resend = replay(&app, &requests[2]).await;
    assert_eq!(resend.body, answer.body);
    assert_eq!(script.calls().len(), 1);
}

#[tokio::test]
async fn holodeck_resending_a_lost_callback_answer_gets_the_same_business_response() {
    let requests = sent("h2g-inout-callback-lost-answer");
    assert_eq!(requests.len(), 2, "the request and its resend 12 ms later");
    let script = Script::default();
    let app = gateway(&script, requests[0].time).await;
    let first = replay(&app, &requests[0]).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert!(first.envelope().body.content.contains("echoResponse"));
    let second = replay(&app, &requests[1]).await;
    assert_eq!(second.body, first.body);
    assert_eq!(script.calls().len(), 1);
}
