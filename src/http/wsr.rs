//! `POST /wsr/{channel}`: reliable messages and PollRequests from partners. Reads like the
//! design says it should: parse → decide (rmp, inside the store's commit) → answer by the
//! message's reply pattern, only after the commit.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::auth::Access;
use super::serve::PeerAddr;
use super::soap::{self, SoapBody, content_type, version_hint};
use crate::partners::Caller;
use crate::rmp::agreement::Agreement;
use crate::rmp::receiver::{AnswerRoute, answer_route, may_hold};
use crate::rmp::replies::{Replies, ReplyItem, answer_fits, items, reply_for};
use crate::store::{Payload, ReceivedMessage};
use crate::wsr::{
    Defect, Envelope, FaultCode, FaultRoute, MessageKey, PollRequest, ReplyPattern, Request,
    SoapVersion, read_message, write_must_understand_fault,
};

/// How long a fault or ack is kept for a message whose own ExpiryTime is unknown (it was the
/// defect), so the sender can still learn of it.
const UNKNOWN_EXPIRY_RETENTION: chrono::Duration = chrono::Duration::hours(1);

pub async fn receive(
    State(app): State<AppState>,
    Path(channel): Path<String>,
    peer: Option<axum::Extension<PeerAddr>>,
    caller: Option<axum::Extension<Caller>>,
    access: Option<axum::Extension<Access>>,
    headers: HeaderMap,
    SoapBody(body): SoapBody,
) -> Response {
    // Whose state the request may see and change ("" for an anonymous caller, D14).
    let caller = caller.map(|c| c.0).unwrap_or_default();
    let partner = caller.key();
    let access = access.map(|a| a.0).unwrap_or_default();
    let Some(channel_agreement) = app.config.channels.get(&channel) else {
        return (
            StatusCode::NOT_FOUND,
            format!("no channel named {channel:?}\n"),
        )
            .into_response();
    };
    // A partner's own agreement narrows the channel's (D14).
    let profile = caller
        .partner
        .as_deref()
        .and_then(|p| app.config.partners.get(p));
    let agreement = &match profile {
        Some(p) => channel_agreement.for_partner(p.inbound.offers.as_deref(), &p.inbound.requires),
        None => channel_agreement.clone(),
    };
    // New groups count against the partner's quota, or the peer address's when anonymous.
    let source = match &caller.partner {
        Some(name) => format!("partner:{name}"),
        None => source(peer),
    };
    let env = match read_message(content_type(&headers), &body, &app.config.limits) {
        Ok(env) => env,
        Err(defect) => {
            access.note(|n| n.faulted(defect.code));
            return answer_defect(&app, partner, version_hint(&headers), &defect).await;
        }
    };
    if !env.quirks.is_empty() {
        tracing::debug!(quirks = ?env.quirks, "tolerated peer quirks");
    }
    let version = env.version;
    if !env.not_understood.is_empty() {
        return soap::envelope(
            StatusCode::INTERNAL_SERVER_ERROR,
            version,
            write_must_understand_fault(version, &env.not_understood),
        );
    }
    if env.request.is_none() && env.poll_request.is_none() {
        if env.response.is_some() {
            // Acks for messages we sent belong to the sending RMP, at /wsr/_callback.
            access.note(|n| n.faulted(FaultCode::FeatureNotSupported));
            return soap::fault(
                version,
                FaultCode::FeatureNotSupported,
                "acknowledgments are accepted at /wsr/_callback, not at a channel",
                None,
            );
        }
        access.note(|n| n.faulted(FaultCode::InvalidRequest));
        return soap::fault(
            version,
            FaultCode::InvalidRequest,
            "no wsrm:Request or wsrm:PollRequest header: this endpoint takes reliable messages",
            None,
        );
    }

    // What goes into the wsrm:Response of this HTTP answer.
    let mut replies = Replies::new();
    let mut own_fault: Option<(FaultCode, String)> = None;
    if let Some(request) = &env.request {
        access.note(|n| {
            n.group_id = Some(request.message_id.group_id.as_str().to_owned());
            n.number = request.key().number;
        });
        if let Some((code, reason)) = agreement.unusable_reply_pattern(request) {
            access.note(|n| n.faulted(code));
            return soap::fault(version, code, &reason, None);
        }
        match handle_request(
            &app, partner, &channel, source, agreement, &access, &body, &env, request,
        )
        .await
        {
            RequestAnswer::InResponse(None) => {
                crate::metrics::acks_sent("response", 1);
                replies.add(&request.message_id.group_id, request.key().number, None);
            }
            RequestAnswer::InResponse(Some((code, reason))) => {
                replies.add(
                    &request.message_id.group_id,
                    request.key().number,
                    Some(code),
                );
                own_fault = Some((code, reason));
            }
            RequestAnswer::Elsewhere => {}
            RequestAnswer::Now(response) => return response,
        }
    }
    if env.request.is_none() {
        access.note(|n| n.verdict = Some("poll".into()));
    }
    if let Some(poll) = &env.poll_request
        && let Err(response) = handle_poll(&app, partner, version, poll, &mut replies).await
    {
        if env.request.is_none() {
            return response;
        }
        // The message itself is already decided and committed: its answer must not be
        // replaced by the poll's failure. The poll can be asked again.
        tracing::warn!("a piggy-backed poll failed; answering for the message only");
    }
    match own_fault {
        // The header carries this message's fault and any poll answers with it.
        Some((code, reason)) => soap::fault(version, code, &reason, replies.into_response()),
        None => soap::replies(version, replies.into_response()),
    }
}

enum RequestAnswer {
    /// Answer in this HTTP response's `wsrm:Response`: an ack, or a fault.
    InResponse(Option<(FaultCode, String)>),
    /// Answered by callback or poll (or nothing to say yet): 202.
    Elsewhere,
    /// A complete answer (a synchronous SOAP Fault).
    Now(Response),
}

/// The source a request's new groups count against: the peer's IPv4 address, or its IPv6
/// /64 (one host may hold a whole /64, so a single address would be no quota at all).
fn source(peer: Option<axum::Extension<PeerAddr>>) -> String {
    use std::net::IpAddr;
    let Some(axum::Extension(PeerAddr(addr))) = peer else {
        return String::new();
    };
    // An IPv4 address written as IPv6 (`::ffff:192.0.2.7`) is that IPv4 address.
    match addr.ip().to_canonical() {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn handle_request(
    app: &AppState,
    partner: &str,
    channel: &str,
    source: String,
    agreement: &Agreement,
    access: &Access,
    body: &Bytes,
    env: &Envelope<'_>,
    request: &Request,
) -> RequestAnswer {
    let now = app.clock.now();
    let key = request.key();
    if let ReplyPattern::Callback(to) = &request.reply_pattern {
        match app.store.is_callback_endpoint(partner, &to.uri).await {
            Ok(true) => {}
            Ok(false) => return RequestAnswer::Now(unregistered(env.version, &to.uri)),
            Err(e) => return store_failed(env.version, &key, &e),
        }
    }
    let refusal = agreement.check(request, now).err().or_else(|| {
        (env.attachments > 0).then(|| {
            let why = "MIME attachments are not supported: they would not reach the consumer";
            (FaultCode::FeatureNotSupported, why.to_owned())
        })
    });
    if let Some((code, reason)) = refusal {
        access.note(|n| n.faulted(code));
        let pattern = &request.reply_pattern;
        let expiry = agreement.fault_kept_until(request.expiry_time, now);
        let version = env.version;
        return by_reply_pattern(app, partner, version, &key, pattern, code, reason, expiry).await;
    }
    let root = env
        .body
        .root
        .as_ref()
        .map_or("_", |r| r.local_name.as_str());
    let namespaces: Vec<(Option<&str>, &str)> = env
        .body
        .namespaces
        .iter()
        .map(|d| (d.prefix, d.uri.as_ref()))
        .collect();
    let message = ReceivedMessage {
        partner: partner.to_owned(),
        channel: channel.to_owned(),
        request: request.clone(),
        payload: Payload::within(body, env.body.content),
        namespaces: serde_json::to_string(&namespaces).unwrap_or_else(|_| "[]".into()),
        topic: format!("{channel}/{root}"),
        source,
        soap12: env.version == SoapVersion::Soap12,
        // Read again, with no await before the writer's queue takes it: a PollRequest's
        // barrier queued ahead of this message then also came before this time, so a sender
        // told "not held" after the ExpiryTime can rely on it (store `poll_answer`).
        now: app.clock.now(),
    };
    // A buffered Response-pattern message may be delivered while we wait (D6): watch before
    // submitting, so the delivery cannot slip by between the two.
    let watching = may_hold(request) && !app.config.hold.is_zero();
    let mut hold = watching.then(|| app.store.watch_delivery(partner, &key));
    let answer = match app.store.receive(message).await {
        Err(e) => {
            access.note(|n| n.verdict = Some("not stored".into()));
            store_failed(env.version, &key, &e)
        }
        Ok(r) => {
            access.note(|n| note_received(n, &r));
            match answer_route(r.verdict, request) {
                AnswerRoute::InResponse(fault) => RequestAnswer::InResponse(fault),
                AnswerRoute::MayHold => match hold.take() {
                    Some(delivered) => match tokio::time::timeout(app.config.hold, delivered).await
                    {
                        Ok(Ok(())) => RequestAnswer::InResponse(None),
                        _ => RequestAnswer::Elsewhere,
                    },
                    None => RequestAnswer::Elsewhere,
                },
                AnswerRoute::Elsewhere => RequestAnswer::Elsewhere,
                AnswerRoute::Synchronous(code, reason) => {
                    RequestAnswer::Now(soap::fault(env.version, code, &reason, None))
                }
            }
        }
    };
    // Our receiver must be gone before the map is cleaned, or the entry would stay.
    drop(hold);
    if watching {
        app.store.forget_watchers(partner, &key);
    }
    answer
}

/// The committed decision as the access log and the metrics show it: the fault code, or
/// what became of the message (`delivered`, `buffered`, `duplicate`).
fn note_received(note: &mut super::auth::AccessNote, received: &crate::store::Received) {
    use crate::rmp::receiver::{Action, Verdict};
    if let Verdict::Fault(code, _) = &received.verdict {
        return note.faulted(*code);
    }
    note.verdict = Some(
        match received.action {
            Action::Deliver => "delivered",
            Action::Buffer => "buffered",
            // Nothing stored and no fault: a resend of a message delivered or held (D2).
            Action::Drop => "duplicate",
        }
        .into(),
    );
}

fn store_failed(
    version: SoapVersion,
    key: &MessageKey,
    e: &crate::store::StoreError,
) -> RequestAnswer {
    crate::store::health::log_store_failure(
        "message not stored; answered MessageProcessingFailure",
        e,
    );
    tracing::debug!(error = %e, %key, "message not stored");
    RequestAnswer::Now(soap::fault(
        version,
        FaultCode::MessageProcessingFailure,
        "the message could not be stored; resend it later",
        Some(single(reply_for(
            key,
            Some(FaultCode::MessageProcessingFailure),
        ))),
    ))
}

fn single(reply: crate::wsr::Reply) -> crate::wsr::Response {
    crate::wsr::Response {
        replies: vec![reply],
    }
}

/// Callbacks go only to registered endpoints (D10); anything else is refused synchronously.
fn unregistered(version: SoapVersion, uri: &str) -> Response {
    let reason = format!("ReplyTo {uri} is not a registered callback endpoint");
    soap::fault(version, FaultCode::InvalidReplyPattern, &reason, None)
}

/// A fault decided before the store (defect, agreement): sent the way the message asked (D4).
#[allow(clippy::too_many_arguments)]
async fn by_reply_pattern(
    app: &AppState,
    partner: &str,
    version: SoapVersion,
    key: &MessageKey,
    pattern: &ReplyPattern,
    code: FaultCode,
    reason: String,
    expiry: chrono::DateTime<chrono::Utc>,
) -> RequestAnswer {
    match pattern {
        ReplyPattern::Response => RequestAnswer::InResponse(Some((code, reason))),
        ReplyPattern::Callback(to) => {
            let owed = ReplyItem {
                group_id: key.group_id.clone(),
                range: key.number.map(crate::wsr::SeqRange::single),
                fault: Some(code),
            };
            let soap12 = version == SoapVersion::Soap12;
            let now = app.clock.now();
            let registered = app.store.is_callback_endpoint(partner, &to.uri).await;
            match registered {
                Ok(true) => match app
                    .store
                    .owe_callbacks(partner, &to.uri, soap12, &[owed], expiry, now)
                    .await
                {
                    Ok(()) => RequestAnswer::Elsewhere,
                    Err(e) => store_failed(version, key, &e),
                },
                Ok(false) => RequestAnswer::Now(unregistered(version, &to.uri)),
                Err(e) => store_failed(version, key, &e),
            }
        }
        ReplyPattern::Poll => match app
            .store
            .record_fault(partner, key, code, expiry, app.clock.now())
            .await
        {
            Ok(()) => RequestAnswer::Elsewhere,
            Err(e) => store_failed(version, key, &e),
        },
    }
}

/// Answers a defect found while reading: synchronously, or by the message's reply pattern.
async fn answer_defect(
    app: &AppState,
    partner: &str,
    version: SoapVersion,
    defect: &Defect,
) -> Response {
    tracing::info!(code = %defect.code, reason = %defect.reason, "refused a message");
    let FaultRoute::ReplyPattern { key, reply } = &defect.route else {
        return soap::fault(version, defect.code, &defect.reason, None);
    };
    let expiry = app.clock.now() + UNKNOWN_EXPIRY_RETENTION;
    let answer = by_reply_pattern(
        app,
        partner,
        version,
        key,
        reply,
        defect.code,
        defect.reason.clone(),
        expiry,
    )
    .await;
    match answer {
        RequestAnswer::Now(r) => r,
        RequestAnswer::Elsewhere => soap::accepted(),
        RequestAnswer::InResponse(_) => soap::fault(
            version,
            defect.code,
            &defect.reason,
            Some(single(reply_for(key, Some(defect.code)))),
        ),
    }
}

/// Answers a PollRequest: into this response, or by callback when it names a ReplyTo (D11).
async fn handle_poll(
    app: &AppState,
    partner: &str,
    version: SoapVersion,
    poll: &PollRequest,
    replies: &mut Replies,
) -> Result<(), Response> {
    let answer = app
        .store
        .poll_answer(partner, &poll.refs)
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "cannot answer a poll");
            soap::fault(
                version,
                FaultCode::MessageProcessingFailure,
                "the poll could not be answered; poll again later",
                None,
            )
        })?;
    let Some(answer) = answer else {
        return Ok(());
    };
    if let Err(reason) = answer_fits(&answer, app.config.limits.max_references) {
        return Err(soap::fault(
            version,
            FaultCode::InvalidPollRequest,
            &reason,
            None,
        ));
    }
    let Some(to) = &poll.reply_to else {
        let mut acks = 0;
        for item in answer.replies.iter().flat_map(items) {
            acks += u64::from(item.fault.is_none());
            replies.add_item(&item);
        }
        crate::metrics::acks_sent("poll", acks);
        return Ok(());
    };
    let registered = app
        .store
        .is_callback_endpoint(partner, &to.uri)
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "cannot check a callback endpoint");
            soap::fault(
                version,
                FaultCode::MessageProcessingFailure,
                "poll again later",
                None,
            )
        })?;
    if !registered {
        return Err(unregistered(version, &to.uri));
    }
    let owed: Vec<ReplyItem> = answer.replies.iter().flat_map(items).collect();
    let now = app.clock.now();
    let expiry = now + UNKNOWN_EXPIRY_RETENTION;
    app.store
        .owe_callbacks(
            partner,
            &to.uri,
            version == SoapVersion::Soap12,
            &owed,
            expiry,
            now,
        )
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "cannot queue a poll answer");
            soap::fault(
                version,
                FaultCode::MessageProcessingFailure,
                "poll again later",
                None,
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(addr: &str) -> String {
        source(Some(axum::Extension(PeerAddr(
            addr.parse().expect("address"),
        ))))
    }

    #[test]
    fn a_source_is_an_ipv4_address_or_an_ipv6_64() {
        assert_eq!(of("192.0.2.7:4000"), "192.0.2.7");
        assert_eq!(of("192.0.2.7:4001"), "192.0.2.7", "any port");
        assert_eq!(of("[2001:db8:1:2:aaaa::1]:80"), "2001:db8:1:2::/64");
        assert_eq!(
            of("[2001:db8:1:2:bbbb::9]:80"),
            "2001:db8:1:2::/64",
            "one /64"
        );
        assert_eq!(of("[::ffff:192.0.2.7]:80"), "192.0.2.7");
        assert_eq!(source(None), "");
    }
}
