//! Request-response operations (D16) over real HTTP: a partner calls an in-out operation on a
//! channel whose SOAP backend is a scripted service on 127.0.0.1. The business response is the
//! delivery; every copy of the request gets the same bytes; failures are answered as the
//! design says, on SQLite and (through `it-postgres`) PostgreSQL.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use axum::http::{HeaderMap, StatusCode};
use bytes::Bytes;
use chrono::Duration;
use tokio::sync::Notify;
use wsr_gateway::outbound::backend::{BackendSpec, RequestResponse, Responder};
use wsr_gateway::rmp::agreement::Agreement;
use wsr_gateway::rmp::exchange::OnUnknown;
#[allow(unused_imports)]
use wsr_gateway::store::{Backend as _, Began, BeginCall, ExchangeStore as _, ReceiverStore as _};
use wsr_gateway::wsr::{
    FaultCode, GroupId, Headers, MessageId, PollRequest, RefToMessageIds, ReplyPattern, ReplyTo,
    Request, SequenceNum, SoapVersion, write_envelope,
};

use super::support::{Answer, ClockExt, TestApp, mock_partner, serve_local, spawn_app_with};

const ECHO_RESPONSE: &str = "<e:echoResponse xmlns:e=\"urn:echo\">hello</e:echoResponse>";

/// What the scripted service answers one call with.
#[derive(Clone)]
pub(crate) enum Reply {
    /// Status, media type, body.
    Says(u16, &'static str, String),
    /// Waits for the test to release it, then answers the echo.
    After(Arc<Notify>),
    /// Never answers in time (the gateway's timeout is shorter).
    Hangs,
}

/// One call the service received.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub(crate) headers: HeaderMap,
    pub(crate) body: String,
}

#[derive(Clone, Default)]
pub(crate) struct Script {
    replies: Arc<Mutex<VecDeque<Reply>>>,
    calls: Arc<Mutex<Vec<Received>>>,
}

impl Script {
    pub(crate) fn then(&self, reply: Reply) -> &Self {
        self.replies.lock().expect("lock").push_back(reply);
        self
    }

    pub(crate) fn calls(&self) -> Vec<Received> {
        self.calls.lock().expect("lock").clone()
    }
}

fn echo_envelope(version: SoapVersion) -> String {
    write_envelope(version, Headers::default(), ECHO_RESPONSE)
}

fn fault_envelope() -> String {
    "<s:Envelope xmlns:s=\"http://schemas.xmlsoap.org/soap/envelope/\"><s:Body><s:Fault>\
     <faultcode>s:Server</faultcode><faultstring>no such customer</faultstring></s:Fault>\
     </s:Body></s:Envelope>"
        .to_owned()
}

/// The scripted SOAP service: answers each call by the script (the echo, in the request's
/// SOAP version, once the script is used up).
pub(crate) async fn soap_service(script: &Script) -> String {
    let s = script.clone();
    let handler = move |headers: HeaderMap, body: Bytes| {
        let s = s.clone();
        async move {
            let body = String::from_utf8_lossy(&body).into_owned();
            let soap12 = headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|ct| ct.starts_with("application/soap+xml"));
            s.calls
                .lock()
                .expect("lock")
                .push(Received { headers, body });
            let version = if soap12 {
                SoapVersion::Soap12
            } else {
                SoapVersion::Soap11
            };
            let next = s.replies.lock().expect("lock").pop_front();
            let (status, ct, body) = match next {
                Some(Reply::Says(status, ct, body)) => (status, ct, body),
                Some(Reply::After(release)) => {
                    release.notified().await;
                    (200, version.content_type(), echo_envelope(version))
                }
                Some(Reply::Hangs) => {
                    tokio::time::sleep(StdDuration::from_secs(30)).await;
                    (200, version.content_type(), echo_envelope(version))
                }
                None => (200, version.content_type(), echo_envelope(version)),
            };
            (
                StatusCode::from_u16(status).expect("status"),
                [("content-type", ct)],
                body,
            )
        }
    };
    let router = axum::Router::new().route("/echo", axum::routing::post(handler));
    format!("{}/echo", serve_local(router).await)
}

/// What a channel answered by the service at `url` is configured as.
pub(crate) fn by_backend(url: &str) -> RequestResponse {
    RequestResponse {
        responder: Responder::Backend(BackendSpec {
            url: url.to_owned(),
            timeout: StdDuration::from_millis(500),
            max_concurrency: 4,
            tls: Default::default(),
            credentials: None,
        }),
        on_unknown: OnUnknown::Retry,
    }
}

/// A gateway whose channel `echo` is answered by the service at `url`.
async fn gateway(url: &str, adjust: impl FnOnce(&mut wsr_gateway::Config)) -> TestApp {
    let url = url.to_owned();
    spawn_app_with(move |c| {
        c.channels.insert("echo".into(), Agreement::everything());
        c.anonymous_channels.insert("echo".into());
        c.hold = StdDuration::from_secs(5);
        c.operations.insert("echo".into(), by_backend(&url));
        adjust(c);
    })
    .await
}

pub(crate) fn request(
    app: &TestApp,
    group: &str,
    number: Option<u64>,
    pattern: ReplyPattern,
) -> Request {
    Request {
        message_id: MessageId {
            group_id: GroupId::parse(group).expect("group id"),
            sequence: number.map(|number| SequenceNum {
                number,
                last: false,
                group_limit: None,
            }),
        },
        expiry_time: app.clock.now_utc() + Duration::hours(1),
        reply_pattern: pattern,
        ack_requested: true,
        duplicate_elimination: true,
        message_order: number.is_some(),
    }
}

/// The partner's envelope: the WS-R Request, another header block of its own, and `e:echo`.
fn envelope(version: SoapVersion, r: &Request) -> String {
    let plain = write_envelope(
        version,
        Headers {
            request: Some(r),
            ..Headers::default()
        },
        "<e:echo xmlns:e=\"urn:echo\">hello</e:echo>",
    );
    // A header block of the partner's own, which the service must still see.
    let close = match version {
        SoapVersion::Soap11 => "</soap:Header>",
        SoapVersion::Soap12 => "</env:Header>",
    };
    plain.replacen(
        close,
        &format!("<t:Trace xmlns:t=\"urn:trace\">42</t:Trace>{close}"),
        1,
    )
}

pub(crate) async fn call(app: &TestApp, version: SoapVersion, r: &Request) -> Answer {
    let body = envelope(version, r);
    let resp = app
        .client
        .post(app.url("/wsr/echo"))
        .header("content-type", version.content_type())
        .header("SOAPAction", "\"urn:echo\"")
        .body(body)
        .send()
        .await
        .expect("reaches the gateway");
    Answer::read(resp).await
}

/// Purges the exchanges kept until before the test clock's now; how many.
async fn purge(app: &TestApp) -> u64 {
    app.store
        .purge_exchanges(app.clock.now_utc())
        .await
        .expect("purge")
}

pub(crate) fn fault_of(answer: &Answer) -> Option<FaultCode> {
    answer.envelope().body.fault
}

#[tokio::test]
async fn the_business_response_carries_the_ack_and_a_duplicate_gets_the_same_bytes() {
    for version in [SoapVersion::Soap11, SoapVersion::Soap12] {
        let script = Script::default();
        let app = gateway(&soap_service(&script).await, |c| {
            if let Some(RequestResponse {
                responder: Responder::Backend(b),
                ..
            }) = c.operations.get_mut("echo")
            {
                b.credentials = Some(wsr_gateway::partners::OurCredentials::Bearer(
                    wsr_gateway::secrets::Secret::new("service-token-0123456789"),
                ));
            }
        })
        .await;
        let r = request(&app, "mid:rr-1", None, ReplyPattern::Response);
        let first = call(&app, version, &r).await;
        assert_eq!(first.status, 200, "{}", first.body);
        assert_eq!(first.content_type.as_deref(), Some(version.content_type()));
        let env = first.envelope();
        assert_eq!(env.version, version);
        assert!(env.body.content.contains("echoResponse"), "{}", first.body);
        let ack = env
            .response
            .expect("the ack rides on the business response");
        assert_eq!(ack.replies.len(), 1);
        let again = call(&app, version, &r).await;
        assert_eq!(again.status, 200);
        assert_eq!(again.body, first.body, "the same bytes, ack included");
        let calls = script.calls();
        assert_eq!(calls.len(), 1, "the service was called once");
        let sent = &calls[0];
        assert!(!sent.body.contains("wsrm:"), "no WS-R block: {}", sent.body);
        assert!(
            sent.body
                .contains("<t:Trace xmlns:t=\"urn:trace\">42</t:Trace>")
        );
        assert!(
            sent.body
                .contains("<e:echo xmlns:e=\"urn:echo\">hello</e:echo>")
        );
        assert_eq!(sent.headers["wsr-group-id"], "mid:rr-1");
        assert_eq!(
            sent.headers["authorization"], "Bearer service-token-0123456789",
            "our credentials towards the service"
        );
        assert!(sent.headers.get("wsr-sequence-number").is_none());
        if version == SoapVersion::Soap11 {
            assert_eq!(sent.headers["soapaction"], "\"urn:echo\"");
        }
        assert!(
            app.inbox().await.is_empty(),
            "the answer is the delivery, not the inbox"
        );
    }
}

#[tokio::test]
async fn a_soap_fault_from_the_service_is_its_answer_and_is_replayed() {
    let script = Script::default();
    script.then(Reply::Says(
        500,
        "text/xml; charset=utf-8",
        fault_envelope(),
    ));
    let app = gateway(&soap_service(&script).await, |_| {}).await;
    let r = request(&app, "mid:rr-fault", None, ReplyPattern::Response);
    let first = call(&app, SoapVersion::Soap11, &r).await;
    assert_eq!(first.status, 500);
    assert!(first.body.contains("no such customer"), "{}", first.body);
    let env = first.envelope();
    let ack = env
        .response
        .expect("acked: the fault is the business response");
    assert!(matches!(
        &ack.replies[0],
        wsr_gateway::wsr::Reply::NonSequence { fault: None, .. }
    ));
    let again = call(&app, SoapVersion::Soap11, &r).await;
    assert_eq!((again.status, &again.body), (500, &first.body));
    assert_eq!(script.calls().len(), 1);
}

#[tokio::test]
async fn an_unreachable_service_or_a_gateway_error_delivers_nothing_and_the_resend_calls_again() {
    let script = Script::default();
    script.then(Reply::Says(503, "text/html", "<html>down</html>".into()));
    let app = gateway(&soap_service(&script).await, |_| {}).await;
    let r = request(&app, "mid:rr-503", None, ReplyPattern::Response);
    let first = call(&app, SoapVersion::Soap11, &r).await;
    assert_eq!(
        fault_of(&first),
        Some(FaultCode::MessageProcessingFailure),
        "{}",
        first.body
    );
    let second = call(&app, SoapVersion::Soap11, &r).await;
    assert_eq!(second.status, 200, "{}", second.body);
    assert!(second.body.contains("echoResponse"));
    assert_eq!(script.calls().len(), 2);

    // Nothing listening at all.
    let closed = format!("http://127.0.0.1:{}/echo", super::support::free_port());
    let app = gateway(&closed, |_| {}).await;
    let r = request(&app, "mid:rr-closed", None, ReplyPattern::Response);
    let answer = call(&app, SoapVersion::Soap11, &r).await;
    assert_eq!(fault_of(&answer), Some(FaultCode::MessageProcessingFailure));
    let kept = app
        .store
        .exchange("", &r.key(), app.clock.now_utc())
        .await
        .expect("reads");
    assert!(kept.is_none(), "nothing cached: {kept:?}");
}

#[tokio::test]
async fn a_timeout_is_called_again_under_retry_and_failed_for_good_under_fail() {
    let script = Script::default();
    script.then(Reply::Hangs);
    let app = gateway(&soap_service(&script).await, |_| {}).await;
    let r = request(&app, "mid:rr-slow", Some(0), ReplyPattern::Response);
    let first = call(&app, SoapVersion::Soap11, &r).await;
    assert_eq!(fault_of(&first), Some(FaultCode::MessageProcessingFailure));
    let second = call(&app, SoapVersion::Soap11, &r).await;
    assert_eq!(second.status, 200, "{}", second.body);
    let calls = script.calls();
    assert_eq!(calls.len(), 2, "called again");
    for c in &calls {
        assert_eq!(c.headers["wsr-group-id"], "mid:rr-slow");
        assert_eq!(
            c.headers["wsr-sequence-number"], "0",
            "the same idempotency headers"
        );
    }

    let script = Script::default();
    script.then(Reply::Hangs);
    let app = gateway(&soap_service(&script).await, |c| {
        if let Some(op) = c.operations.get_mut("echo") {
            op.on_unknown = OnUnknown::Fail;
        }
    })
    .await;
    let r = request(&app, "mid:rr-doubt", None, ReplyPattern::Response);
    let first = call(&app, SoapVersion::Soap11, &r).await;
    assert_eq!(
        fault_of(&first),
        Some(FaultCode::PermanentProcessingFailure)
    );
    let again = call(&app, SoapVersion::Soap11, &r).await;
    assert_eq!(
        fault_of(&again),
        Some(FaultCode::PermanentProcessingFailure)
    );
    assert_eq!(script.calls().len(), 1, "never called again");
    let doubt = app.store.exchanges_in_doubt(10).await.expect("reads");
    assert_eq!(doubt.len(), 1);
    assert_eq!(doubt[0].key.group_id.as_str(), "mid:rr-doubt");
}

#[tokio::test]
async fn a_duplicate_during_the_call_waits_for_it_and_gets_the_same_bytes() {
    let script = Script::default();
    let release = Arc::new(Notify::new());
    script.then(Reply::After(release.clone()));
    let app = Arc::new(gateway(&soap_service(&script).await, |_| {}).await);
    let r = request(&app, "mid:rr-wait", None, ReplyPattern::Response);
    let (a, r1) = (app.clone(), r.clone());
    let original = tokio::spawn(async move { call(&a, SoapVersion::Soap11, &r1).await });
    super::support::eventually("the call is out", || async {
        (!script.calls().is_empty()).then_some(())
    })
    .await;
    let (a, r2) = (app.clone(), r.clone());
    let duplicate = tokio::spawn(async move { call(&a, SoapVersion::Soap11, &r2).await });
    release.notify_one();
    let (original, duplicate) = (
        original.await.expect("original"),
        duplicate.await.expect("dup"),
    );
    assert_eq!(original.status, 200, "{}", original.body);
    assert_eq!(duplicate.body, original.body);
    assert_eq!(script.calls().len(), 1);

    // Past the hold, a duplicate gets MessageProcessingFailure, never an empty answer.
    let script = Script::default();
    let release = Arc::new(Notify::new());
    script.then(Reply::After(release.clone()));
    let app = Arc::new(
        gateway(&soap_service(&script).await, |c| {
            c.hold = StdDuration::from_millis(100);
            if let Some(RequestResponse {
                responder: Responder::Backend(b),
                ..
            }) = c.operations.get_mut("echo")
            {
                b.timeout = StdDuration::from_secs(10);
            }
        })
        .await,
    );
    let r = request(&app, "mid:rr-busy", None, ReplyPattern::Response);
    let (a, r1) = (app.clone(), r.clone());
    let original = tokio::spawn(async move { call(&a, SoapVersion::Soap11, &r1).await });
    super::support::eventually("the call is out", || async {
        (!script.calls().is_empty()).then_some(())
    })
    .await;
    let duplicate = call(&app, SoapVersion::Soap11, &r).await;
    assert_eq!(
        fault_of(&duplicate),
        Some(FaultCode::MessageProcessingFailure)
    );
    release.notify_one();
    let original = original.await.expect("original");
    assert_eq!(original.status, 200);
    let later = call(&app, SoapVersion::Soap11, &r).await;
    assert_eq!(later.body, original.body);
}

#[tokio::test]
async fn ordered_requests_are_called_in_sequence_and_one_ahead_of_a_gap_is_not_stored() {
    let script = Script::default();
    let app = gateway(&soap_service(&script).await, |c| {
        c.hold = StdDuration::from_millis(100);
    })
    .await;
    let ahead = request(&app, "mid:rr-order", Some(1), ReplyPattern::Response);
    let refused = call(&app, SoapVersion::Soap11, &ahead).await;
    assert_eq!(
        fault_of(&refused),
        Some(FaultCode::MessageProcessingFailure)
    );
    assert!(script.calls().is_empty(), "not called ahead of its gap");
    let first = request(&app, "mid:rr-order", Some(0), ReplyPattern::Response);
    assert_eq!(call(&app, SoapVersion::Soap11, &first).await.status, 200);
    assert_eq!(call(&app, SoapVersion::Soap11, &ahead).await.status, 200);
    let numbers: Vec<String> = script
        .calls()
        .iter()
        .map(|c| {
            c.headers["wsr-sequence-number"]
                .to_str()
                .expect("ascii")
                .to_owned()
        })
        .collect();
    assert_eq!(numbers, ["0", "1"]);
}

#[tokio::test]
async fn answers_count_against_the_sources_quota() {
    let script = Script::default();
    let app = gateway(&soap_service(&script).await, |c| {
        c.max_answer_bytes_per_source = 100;
    })
    .await;
    let one = request(&app, "mid:rr-q1", None, ReplyPattern::Response);
    assert_eq!(call(&app, SoapVersion::Soap11, &one).await.status, 200);
    let two = request(&app, "mid:rr-q2", None, ReplyPattern::Response);
    let refused = call(&app, SoapVersion::Soap11, &two).await;
    assert_eq!(
        fault_of(&refused),
        Some(FaultCode::MessageProcessingFailure)
    );
    assert_eq!(
        script.calls().len(),
        1,
        "refused before the service was called"
    );
    // The first one's answer is still replayed.
    let first = call(&app, SoapVersion::Soap11, &one).await;
    assert_eq!(first.status, 200);
    let held = app.store.answer_bytes_of("127.0.0.1").await.expect("reads");
    assert_eq!(
        held,
        first.body.len() as u64,
        "the running total is the answer"
    );
    // Once the first answer is purged with its message, the source's quota is free again.
    let retention = app.config.policy.answer_polls_for;
    app.clock
        .advance(Duration::hours(1) + retention + Duration::seconds(1));
    assert_eq!(purge(&app).await, 1);
    let held = app.store.answer_bytes_of("127.0.0.1").await.expect("reads");
    assert_eq!(held, 0, "freed by the purge");
    let three = request(&app, "mid:rr-q3", None, ReplyPattern::Response);
    assert_eq!(call(&app, SoapVersion::Soap11, &three).await.status, 200);
    assert_eq!(script.calls().len(), 2);
}

/// A call that outlives its take-over (a gateway that was thought dead, but only slow) cannot
/// write its answer over the answer of the call that replaced it, nor forget or doubt it:
/// every outcome is written as one attempt's.
#[tokio::test]
async fn a_call_taken_over_cannot_overwrite_the_call_that_replaced_it() {
    let app = gateway("http://127.0.0.1:9/unused", |_| {}).await;
    let r = request(&app, "mid:rr-attempts", None, ReplyPattern::Response);
    let key = r.key();
    let now = app.clock.now_utc();
    let new_call = || wsr_gateway::store::NewCall {
        partner: "",
        key: &key,
        channel: "echo",
        source: "127.0.0.1",
        now,
        keep_until: r.expiry_time + Duration::hours(2),
    };
    let Began::Call(slow) = app
        .store
        .begin_call(new_call(), BeginCall::Fresh { quota: u64::MAX })
        .await
        .expect("begins")
        .0
    else {
        panic!("the first call was not begun");
    };
    let again = app
        .store
        .begin_call(new_call(), BeginCall::Fresh { quota: u64::MAX })
        .await
        .expect("reads")
        .0;
    assert_eq!(again, Began::Exists, "one call at a time");
    let take_over = BeginCall::TakeOver {
        started_before: now + Duration::seconds(1),
    };
    let Began::Call(fresh) = app
        .store
        .begin_call(new_call(), take_over)
        .await
        .expect("takes over")
        .0
    else {
        panic!("the stale call was not taken over");
    };
    assert_ne!(slow, fresh);
    let answer = |text: &str| wsr_gateway::store::CachedAnswer {
        status: 200,
        content_type: "text/xml".into(),
        body: Bytes::from(text.to_owned()),
    };
    let stale = answer("<slow/>");
    assert!(
        !app.store
            .call_answered("", &key, slow, &stale)
            .await
            .expect("writes")
    );
    app.store.call_failed("", &key, slow).await.expect("writes");
    app.store
        .call_unknown("", &key, slow, true)
        .await
        .expect("writes");
    let kept = app.store.exchange("", &key, now).await.expect("reads");
    let kept = kept.expect("the exchange is still the fresh call's");
    assert_eq!(kept.attempt, fresh);
    assert_eq!(
        kept.state,
        wsr_gateway::store::ExchangeState::Calling,
        "neither forgotten nor in doubt"
    );
    let current = answer("<fresh/>");
    assert!(
        app.store
            .call_answered("", &key, fresh, &current)
            .await
            .expect("writes")
    );
    let kept = app.store.exchange("", &key, now).await.expect("reads");
    assert_eq!(kept.and_then(|e| e.answer), Some(current));
}

#[tokio::test]
async fn the_answer_is_kept_until_expiry_plus_the_retention() {
    let script = Script::default();
    let app = gateway(&soap_service(&script).await, |_| {}).await;
    let r = request(&app, "mid:rr-keep", None, ReplyPattern::Response);
    let first = call(&app, SoapVersion::Soap11, &r).await;
    assert_eq!(first.status, 200);
    let retention = app.config.policy.answer_polls_for;
    app.clock
        .advance(Duration::hours(1) + retention + Duration::seconds(1));
    let late = call(&app, SoapVersion::Soap11, &r).await;
    // The receiving rules answer it (as a duplicate of an expired message), without the
    // business response and without calling the service again.
    assert_ne!(late.body, first.body, "no longer replayed");
    assert!(!late.body.contains("echoResponse"), "{}", late.body);
    assert_eq!(purge(&app).await, 1);
    assert_eq!(script.calls().len(), 1);
}

#[tokio::test]
async fn under_callback_and_poll_the_business_response_comes_now_and_the_ack_later() {
    let script = Script::default();
    let app = gateway(&soap_service(&script).await, |_| {}).await;
    let mut partner = mock_partner(vec![]).await;
    app.register_callback(&partner.url).await;
    let to = ReplyTo::bare(partner.url.as_str());
    let r = request(&app, "mid:rr-cb", None, ReplyPattern::Callback(to));
    let answer = call(&app, SoapVersion::Soap11, &r).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let env = answer.envelope();
    assert!(env.response.is_none(), "no ack in the business response");
    assert!(env.body.content.contains("echoResponse"));
    let (_, ack) = partner.next_post().await;
    assert!(ack.contains("mid:rr-cb"), "{ack}");
    let again = call(&app, SoapVersion::Soap11, &r).await;
    assert_eq!(again.body, answer.body);

    let p = request(&app, "mid:rr-poll", None, ReplyPattern::Poll);
    let answer = call(&app, SoapVersion::Soap11, &p).await;
    assert_eq!(answer.status, 200);
    assert!(answer.envelope().response.is_none());
    let poll = PollRequest {
        refs: vec![RefToMessageIds {
            group_id: p.message_id.group_id.clone(),
            ranges: vec![],
        }],
        reply_to: None,
    };
    let polled = app
        .send(
            SoapVersion::Soap11,
            write_envelope(
                SoapVersion::Soap11,
                Headers {
                    poll_request: Some(&poll),
                    ..Headers::default()
                },
                "",
            ),
        )
        .await;
    let acked = polled
        .envelope()
        .response
        .expect("the poll answers the ack");
    assert_eq!(acked.replies.len(), 1, "{}", polled.body);
    assert_eq!(script.calls().len(), 2);
}

#[tokio::test]
async fn an_application_answers_through_the_api_and_every_copy_gets_its_answer() {
    use super::delivery::{Api, OWNER, tokens};
    use serde_json::json;
    let app = Arc::new(
        spawn_app_with(|c| {
            c.tokens = tokens();
            c.channels.insert("ask".into(), Agreement::everything());
            c.anonymous_channels.insert("ask".into());
            c.hold = StdDuration::from_secs(5);
            c.operations.insert(
                "ask".into(),
                RequestResponse {
                    responder: Responder::Api {
                        within: StdDuration::from_secs(10),
                    },
                    on_unknown: OnUnknown::Retry,
                },
            );
        })
        .await,
    );
    let api = Api::of(&app, OWNER);
    let sub = api
        .create(json!({ "name": "answers", "filter": "ask/#" }))
        .await;
    let session = api.join(sub, 60_000).await;
    let post = |r: Request, version: SoapVersion| {
        let app = app.clone();
        async move {
            let resp = app
                .client
                .post(app.url("/wsr/ask"))
                .header("content-type", version.content_type())
                .body(envelope(version, &r))
                .send()
                .await
                .expect("reaches the gateway");
            Answer::read(resp).await
        }
    };
    for (version, group) in [
        (SoapVersion::Soap11, "mid:ask-1"),
        (SoapVersion::Soap12, "mid:ask-2"),
    ] {
        let r = request(&app, group, None, ReplyPattern::Response);
        let waiting = tokio::spawn(post(r.clone(), version));
        let message = super::support::eventually("the request reaches the inbox", || async {
            api.fetch(&session, 1).await.into_iter().next()
        })
        .await;
        assert!(
            message["payload"].as_str().unwrap_or("").contains("e:echo"),
            "{message}"
        );
        let (status, answer) = api
            .post(
                "/api/v1/respond",
                json!({ "receipt": message["receipt"], "response": ECHO_RESPONSE }),
            )
            .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["settled"], true);
        let answered = waiting.await.expect("the exchange");
        assert_eq!(answered.status, 200, "{}", answered.body);
        let env = answered.envelope();
        assert_eq!(env.version, version);
        assert!(env.response.is_some(), "the ack rides on the answer");
        assert!(env.body.content.contains("echoResponse"));
        let again = post(r, version).await;
        assert_eq!(again.body, answered.body, "a copy gets the same bytes");
        let (status, twice) = api
            .post(
                "/api/v1/respond",
                json!({ "receipt": message["receipt"], "response": ECHO_RESPONSE }),
            )
            .await;
        assert_eq!(status, 409, "answered once: {twice}");
    }
    // An answer that is not XML is refused, and nothing is kept for it.
    let r = request(&app, "mid:ask-bad", None, ReplyPattern::Response);
    let waiting = tokio::spawn(post(r, SoapVersion::Soap11));
    let message = super::support::eventually("the request reaches the inbox", || async {
        api.fetch(&session, 1).await.into_iter().next()
    })
    .await;
    let (status, refused) = api
        .post(
            "/api/v1/respond",
            json!({ "receipt": message["receipt"], "response": "<unclosed>" }),
        )
        .await;
    assert_eq!(status, 400, "{refused}");
    let (status, answer) = api
        .post(
            "/api/v1/respond",
            json!({ "receipt": message["receipt"], "response": fault_body() }),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let answered = waiting.await.expect("the exchange");
    assert_eq!(
        answered.status, 500,
        "a SOAP Fault answer: {}",
        answered.body
    );
}

fn fault_body() -> &'static str {
    "<s:Fault xmlns:s=\"http://schemas.xmlsoap.org/soap/envelope/\"><faultcode>s:Client\
     </faultcode><faultstring>unknown order</faultstring></s:Fault>"
}

/// What a gateway killed between its call to the service and the commit of the answer leaves:
/// a call out, with no gateway left to finish it. Its outcome is unknown, so the next copy
/// calls again (with the same idempotency headers) under `retry`, and is failed for good under
/// `fail`. (The chaos run kills real gateway processes at that moment.)
#[tokio::test]
async fn a_call_left_by_a_gateway_killed_before_its_commit_is_retried_or_failed() {
    for on_unknown in [OnUnknown::Retry, OnUnknown::Fail] {
        let script = Script::default();
        let app = gateway(&soap_service(&script).await, |c| {
            if let Some(op) = c.operations.get_mut("echo") {
                op.on_unknown = on_unknown;
            }
        })
        .await;
        let r = request(&app, "mid:rr-killed", Some(0), ReplyPattern::Response);
        let key = r.key();
        let then = app.clock.now_utc() - Duration::minutes(5);
        let left = wsr_gateway::store::NewCall {
            partner: "",
            key: &key,
            channel: "echo",
            source: "127.0.0.1",
            now: then,
            keep_until: r.expiry_time + Duration::hours(2),
        };
        let (began, committed) = app
            .store
            .begin_call(left, BeginCall::Fresh { quota: u64::MAX })
            .await
            .expect("the dead gateway's call");
        committed.durable().await.expect("committed");
        assert!(matches!(began, Began::Call(_)), "{began:?}");
        let answer = call(&app, SoapVersion::Soap11, &r).await;
        match on_unknown {
            OnUnknown::Retry => {
                assert_eq!(answer.status, 200, "{}", answer.body);
                let calls = script.calls();
                assert_eq!(calls.len(), 1, "called again");
                assert_eq!(calls[0].headers["wsr-group-id"], "mid:rr-killed");
                assert_eq!(calls[0].headers["wsr-sequence-number"], "0");
                let again = call(&app, SoapVersion::Soap11, &r).await;
                assert_eq!(again.body, answer.body);
            }
            OnUnknown::Fail => {
                assert_eq!(
                    fault_of(&answer),
                    Some(FaultCode::PermanentProcessingFailure)
                );
                assert!(script.calls().is_empty(), "not called again");
                let doubt = app.store.exchanges_in_doubt(10).await.expect("reads");
                assert_eq!(doubt.len(), 1, "shown to operators");
            }
        }
    }
}

/// A partner that hangs up while the service answers does not abandon the call: the answer is
/// still kept and committed, and the partner's resend gets it without a second call. (Found by
/// the chaos run: dropped with the connection, the call's outcome was unknown.)
#[tokio::test]
async fn a_partner_hanging_up_during_the_call_leaves_the_answer_kept_for_its_resend() {
    let script = Script::default();
    let release = Arc::new(Notify::new());
    script.then(Reply::After(release.clone()));
    let app = gateway(&soap_service(&script).await, |c| {
        if let Some(RequestResponse {
            responder: Responder::Backend(b),
            ..
        }) = c.operations.get_mut("echo")
        {
            b.timeout = StdDuration::from_secs(10);
        }
    })
    .await;
    let r = request(&app, "mid:rr-hangup", None, ReplyPattern::Response);
    let impatient = reqwest::Client::builder()
        .timeout(StdDuration::from_millis(300))
        .build()
        .expect("client");
    let gave_up = impatient
        .post(app.url("/wsr/echo"))
        .header("content-type", SoapVersion::Soap11.content_type())
        .body(envelope(SoapVersion::Soap11, &r))
        .send()
        .await;
    assert!(gave_up.is_err(), "the partner hung up before the answer");
    release.notify_one();
    let key = r.key();
    super::support::eventually("the answer is kept", || async {
        let kept = app
            .store
            .exchange("", &key, app.clock.now_utc())
            .await
            .expect("reads");
        kept.and_then(|e| e.answer).map(|_| ())
    })
    .await;
    let resend = call(&app, SoapVersion::Soap11, &r).await;
    assert_eq!(resend.status, 200, "{}", resend.body);
    assert!(resend.body.contains("echoResponse"));
    assert_eq!(script.calls().len(), 1, "not called again");
}

/// A request that expires while the service answers it was answered all the same: it is
/// delivered, not faulted `InvalidExpiryTime`. (Found by the chaos run on PostgreSQL.)
#[tokio::test]
async fn a_request_expiring_during_its_call_is_still_delivered_with_its_answer() {
    let script = Script::default();
    let release = Arc::new(Notify::new());
    script.then(Reply::After(release.clone()));
    let app = Arc::new(
        gateway(&soap_service(&script).await, |c| {
            if let Some(RequestResponse {
                responder: Responder::Backend(b),
                ..
            }) = c.operations.get_mut("echo")
            {
                b.timeout = StdDuration::from_secs(10);
            }
        })
        .await,
    );
    let mut r = request(&app, "mid:rr-late", None, ReplyPattern::Response);
    r.expiry_time = app.clock.now_utc() + Duration::seconds(30);
    let (a, r1) = (app.clone(), r.clone());
    let answer = tokio::spawn(async move { call(&a, SoapVersion::Soap11, &r1).await });
    super::support::eventually("the call is out", || async {
        (!script.calls().is_empty()).then_some(())
    })
    .await;
    app.clock.advance(Duration::minutes(1));
    release.notify_one();
    let answer = answer.await.expect("the exchange");
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.envelope().response.is_some(), "acked: delivered");
}

/// Partners' requests are told apart by partner as well as by group id: two partners that
/// happen to use the same group id each get their own call and their own answer, and the
/// service is told who sent each (`WSR-Partner`, beside the group id and number).
#[tokio::test]
async fn partners_with_the_same_group_id_get_their_own_calls_and_the_service_is_told_who() {
    use wsr_gateway::partners::PartnerConfig;
    use wsr_gateway::secrets::sha256_hex;
    const TOKENS: [(&str, &str); 2] = [
        ("acme", "acme-token-0123456789abcdef"),
        ("globex", "globex-token-0123456789abcdef"),
    ];
    let script = Script::default();
    let app = gateway(&soap_service(&script).await, |c| {
        c.anonymous_channels.clear();
        let names: std::collections::BTreeSet<String> = c.channels.keys().cloned().collect();
        for (name, token) in TOKENS {
            let partner = PartnerConfig {
                channels: vec!["echo".into()],
                token_sha256: Some(sha256_hex(token.as_bytes())),
                ..PartnerConfig::default()
            };
            c.partners
                .insert(partner.check(name, None, &names).expect("partner"));
        }
    })
    .await;
    let r = request(&app, "mid:rr-shared-group", Some(0), ReplyPattern::Response);
    for (_, token) in TOKENS {
        let answer = app
            .client
            .post(app.url("/wsr/echo"))
            .header("content-type", SoapVersion::Soap11.content_type())
            .header("authorization", format!("Bearer {token}"))
            .body(envelope(SoapVersion::Soap11, &r))
            .send()
            .await
            .expect("reaches the gateway");
        let answer = Answer::read(answer).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    let calls = script.calls();
    assert_eq!(calls.len(), 2, "one call per partner");
    let partners: Vec<&str> = calls
        .iter()
        .map(|c| c.headers["wsr-partner"].to_str().expect("ascii"))
        .collect();
    assert_eq!(partners, ["acme", "globex"]);
    for c in &calls {
        assert_eq!(c.headers["wsr-group-id"], "mid:rr-shared-group");
    }
}
