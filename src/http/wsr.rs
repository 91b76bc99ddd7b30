//! `POST /wsr/{channel}` (reliable messages and PollRequests from partners) and
//! `POST /wsr/_callback` (acks and faults partners send for our messages). Each reads as
//! parse → call a service (`inbound::receive`; the store's `apply_replies`) → render
//! (`http/soap.rs`), with what the service decided noted for the access log.

use axum::body::Bytes;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::auth::{Access, Admission, Admitted};
use super::serve::PeerAddr;
use super::soap::{self, content_type, read_body, soap_action, version_hint};
use crate::inbound::receive::Posted;
use crate::inbound::security::{self, TokenRefusal};
use crate::inbound::{self, Answer, Inbound, Sender};
use crate::partners::Caller;
use crate::store::outbound::ReplySource;
use crate::wsr::{FaultCode, SoapVersion, read_message, write_must_understand_fault};

/// `POST /wsr/{channel}`, once the guard let it in (`auth::guarded`).
pub async fn receive(app: &AppState, request: Request, admitted: Admitted) -> Response {
    let Admitted {
        admission,
        access,
        channel,
    } = admitted;
    let (parts, body) = match read_request(app, request).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let headers = &parts.headers;
    // From here until its message is handed to the store, a commit may wait for it.
    let arriving = app.store.arriving();
    let read = crate::telemetry::traced!("receive.read")
        .in_scope(|| read_message(content_type(headers), &body, &app.config.limits));
    let ctx = inbound_of(app);
    let peer = parts.extensions.get::<PeerAddr>().map(|p| p.0);
    let token = read.as_ref().ok().and_then(|env| env.security.as_ref());
    let caller = match envelope_caller(app, Some(&channel), peer, admission, token, &access).await {
        Ok(caller) => caller,
        Err(refused) => return refused,
    };
    let Some(agreement) = inbound::agreement_for(&app.config, &channel, &caller) else {
        let missing = format!("no channel named {channel:?}\n");
        return (StatusCode::NOT_FOUND, missing).into_response();
    };
    let sender = Sender::new(caller, peer);
    let posted = Posted {
        body: &body,
        version_hint: version_hint(headers),
        soap_action: soap_action(headers),
        arriving: &arriving,
    };
    let outcome = inbound::receive::receive(ctx, &sender, &channel, &agreement, posted, read).await;
    access.note(|n| {
        let partner = n.partner.take();
        *n = outcome.note;
        n.partner = partner;
    });
    crate::telemetry::traced!("receive.answer").in_scope(|| render(outcome.version, outcome.answer))
}

/// A SOAP request's head, and its body read whole by `read_body` up to `max_message_bytes`
/// (so memory follows the bytes received); `Err` is the answer refusing the body.
async fn read_request(app: &AppState, request: Request) -> Result<(Parts, Bytes), Response> {
    let (parts, body) = request.into_parts();
    let body = read_body(&parts.headers, body, app.config.limits.max_bytes).await?;
    Ok((parts, body))
}

/// Who the request is once its envelope is read (D14): what HTTP proved, or the partner its
/// UsernameToken proves (then named in the access line) — checked before anything of the
/// message is acted on; `Err` is the answer refusing it.
async fn envelope_caller(
    app: &AppState,
    route: Option<&str>,
    peer: Option<std::net::SocketAddr>,
    admission: Admission,
    token: Option<&crate::wsr::UsernameToken>,
    access: &Access,
) -> Result<Caller, Response> {
    let Admission {
        caller,
        token_required,
    } = admission;
    let ctx = inbound_of(app);
    match security::caller_of(ctx, route, peer, caller, token_required, token).await {
        Ok(caller) => {
            if token.is_some() {
                access.note(|n| n.partner = caller.partner.clone());
            }
            Ok(caller)
        }
        Err(refusal) => Err(token_refused(
            route.unwrap_or("_callback"),
            peer,
            refusal,
            access,
        )),
    }
}

/// A UsernameToken that lets nobody in, answered as the same refusal of HTTP credentials.
fn token_refused(
    channel: &str,
    peer: Option<std::net::SocketAddr>,
    refusal: TokenRefusal,
    access: &Access,
) -> Response {
    let peer = peer.map(tracing::field::display);
    match refusal {
        TokenRefusal::Unauthorized(why) => {
            tracing::warn!(peer, channel, reason = %why, "refused: the envelope proves no partner");
            super::auth::unauthorized(&why)
        }
        TokenRefusal::Forbidden { partner, why } => {
            tracing::warn!(peer, %partner, channel, "refused: channel not allowed for this partner");
            access.note(|n| n.partner = Some(partner));
            (StatusCode::FORBIDDEN, format!("{why}\n")).into_response()
        }
        TokenRefusal::Unavailable(why) => {
            crate::store::health::log_store_failure("a UsernameToken's nonce not checked", &why);
            let mut answer = (
                StatusCode::SERVICE_UNAVAILABLE,
                "the credentials could not be checked now; send again\n",
            )
                .into_response();
            answer.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
            answer
        }
    }
}

/// The receiving services' view of the application.
pub(super) fn inbound_of(app: &AppState) -> Inbound<'_> {
    Inbound {
        store: &app.store,
        clock: app.clock.as_ref(),
        config: &app.config,
        backends: &app.backends,
    }
}

/// An `Answer` as SOAP over HTTP (D4, D5).
fn render(version: SoapVersion, answer: Answer) -> Response {
    match answer {
        Answer::Replies(replies) => soap::replies(version, replies),
        Answer::Fault {
            code,
            reason,
            replies,
        } => soap::fault(version, code, &reason, replies),
        Answer::Business(answer) => soap::business(answer),
        Answer::NotUnderstood(blocks) => soap::envelope(
            StatusCode::INTERNAL_SERVER_ERROR,
            version,
            write_must_understand_fault(version, &blocks),
        ),
    }
}

/// `POST /wsr/_callback`: acks and faults partners send for our Callback-pattern messages.
pub async fn callback(app: &AppState, request: Request, admitted: Admitted) -> Response {
    let Admitted {
        admission, access, ..
    } = admitted;
    let (parts, body) = match read_request(app, request).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let headers = &parts.headers;
    let env = match read_message(content_type(headers), &body, &app.config.limits) {
        Ok(env) => env,
        Err(defect) => {
            access.note(|n| n.verdict = Some(defect.code.local_name().to_owned()));
            return soap::fault(version_hint(headers), defect.code, &defect.reason, None);
        }
    };
    // A UsernameToken in the envelope (D14), as on the channels.
    let peer = parts.extensions.get::<PeerAddr>().map(|p| p.0);
    let token = env.security.as_ref();
    let caller = match envelope_caller(app, None, peer, admission, token, &access).await {
        Ok(caller) => caller,
        Err(refused) => return refused,
    };
    let Some(response) = env.response else {
        let why = "no wsrm:Response header: this endpoint takes acknowledgments";
        return soap::fault(env.version, FaultCode::InvalidRequest, why, None);
    };
    let partners = app.config.partners.settled_by(&caller);
    let source = ReplySource::Callback {
        partners: &partners,
    };
    let now = app.clock.now();
    match app
        .store
        .apply_replies(&response.replies, source, now)
        .await
    {
        Ok(settled) => {
            access.note(|n| n.verdict = Some(format!("{} settled", settled.len())));
            if settled.is_empty() {
                // Acks for messages sent to someone else, unknown or already settled: the
                // caller learns nothing from the answer, the operator learns of it here.
                tracing::info!(
                    partner = caller.key(),
                    statements = response.replies.len(),
                    "a callback settled nothing (not this caller's messages, or settled already)"
                );
            }
            soap::accepted()
        }
        Err(e) => {
            crate::store::health::log_store_failure("callback acks not applied", &e);
            let why = "acknowledgments not recorded; send them again";
            soap::fault(env.version, FaultCode::MessageProcessingFailure, why, None)
        }
    }
}
