//! One request to `/wsr/{channel}`: a reliable message (`wsrm:Request`, perhaps with a
//! PollRequest riding on it) or a PollRequest alone. The agreement (D9) and the callback
//! endpoint (D10) are checked, the store commits its verdict (duplicates D2, expiry D3,
//! ordering D6, groups D8), and the answer goes by the message's reply pattern (D4, D5) — in
//! this response only after the commit. A buffered Response-pattern message may wait for its
//! gap to fill (the hold, D6). Never axum.

use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use tokio::sync::oneshot;
use tracing::Instrument as _;

use super::callback::{self, Refused};
use super::respond::{Asked, Responded};
use super::{Answer, Inbound, Note, Outcome, Sender, poll};
use crate::outbound::backend::{RequestResponse, Responder};
use crate::rmp::agreement::Agreement;
use crate::rmp::receive_plan::FAULT_NOTICE_RETENTION;
use crate::rmp::receiver::{Action, AnswerRoute, Verdict, answer_route, may_hold};
use crate::rmp::replies::{Replies, ReplyItem, reply_for};
use crate::store::receiver::Arriving;
use crate::store::{Payload, Received, ReceivedMessage, StoreError};
use crate::wsr::{
    Defect, Envelope, FaultCode, FaultRoute, MessageKey, ReplyPattern, Request, SeqRange,
    SoapVersion,
};

/// Why MIME attachments are refused: the inbox keeps the SOAP Body only.
const NO_ATTACHMENTS: &str =
    "MIME attachments are not supported: they would not reach the consumer";

/// What came over HTTP besides the envelope.
#[derive(Debug, Clone, Copy)]
pub struct Posted<'a> {
    /// The buffer the envelope was read from: a delivered payload shares it.
    pub body: &'a Bytes,
    /// The SOAP version the Content-Type suggests, for answering a request too broken to say.
    pub version_hint: SoapVersion,
    /// The partner's SOAPAction (SOAP 1.1's header, SOAP 1.2's `action` parameter), passed
    /// on to a request-response channel's backend.
    pub soap_action: Option<&'a str>,
    /// Counts the request as on its way to the store until its message is handed over, or
    /// it is clear that none will be.
    pub arriving: &'a Arriving,
}

/// A request as read (or the defect found reading it), sent by `sender` to `channel` under
/// `agreement`.
pub async fn receive(
    ctx: Inbound<'_>,
    sender: &Sender,
    channel: &str,
    agreement: &Agreement,
    posted: Posted<'_>,
    read: Result<Envelope<'_>, Defect>,
) -> Outcome {
    let version_hint = posted.version_hint;
    let mut note = Note::default();
    let env = match read {
        Ok(env) => env,
        Err(defect) => {
            posted.arriving.arrived();
            note.faulted(defect.code);
            let answer = answer_defect(ctx, sender.partner(), version_hint, &defect).await;
            return Outcome {
                version: version_hint,
                answer,
                note,
            };
        }
    };
    let exchange = Exchange {
        ctx,
        sender,
        channel,
        agreement,
        posted,
        env: &env,
    };
    let answer = exchange.answer(&mut note).await;
    exchange.posted.arriving.arrived();
    // Every fault answered is noted (the access line's verdict, the fault counter), whichever
    // path decided it: one rule here rather than one call at each refusal.
    match &answer {
        Answer::Fault { code, .. } if note.fault.is_none() => note.faulted(*code),
        // SOAP's own fault, not a WS-R one: named in the access line all the same.
        Answer::NotUnderstood(_) if note.verdict.is_none() => {
            note.verdict = Some("MustUnderstand".into());
        }
        _ => {}
    }
    Outcome {
        version: env.version,
        answer,
        note,
    }
}

/// One request being answered, read.
struct Exchange<'a, 'e> {
    ctx: Inbound<'a>,
    sender: &'a Sender,
    channel: &'a str,
    agreement: &'a Agreement,
    posted: Posted<'a>,
    env: &'a Envelope<'e>,
}

/// Where one message's own answer goes.
enum Routed {
    /// In this response's `wsrm:Response`: an ack (`None`), or a fault.
    InResponse(Option<(FaultCode, String)>),
    /// By callback or poll (or nothing to say yet).
    Elsewhere,
    /// The whole answer, now: a synchronous SOAP Fault, or a request-response channel's
    /// business response.
    Now(Answer),
}

impl Exchange<'_, '_> {
    async fn answer(&self, note: &mut Note) -> Answer {
        let env = self.env;
        if !env.quirks.is_empty() {
            tracing::debug!(quirks = ?env.quirks, "tolerated peer quirks");
        }
        if !env.not_understood.is_empty() {
            return Answer::NotUnderstood(env.not_understood.clone());
        }
        if let Some(refusal) = not_for_a_channel(env) {
            note.faulted(refusal.0);
            return Answer::fault(refusal.0, refusal.1);
        }
        // What goes into the wsrm:Response of this HTTP answer.
        let mut replies = Replies::new();
        let mut own_fault = None;
        match &env.request {
            Some(request) => match self.message(request, note).await {
                Routed::InResponse(None) => {
                    crate::metrics::acks_sent("response", 1);
                    replies.add(&request.message_id.group_id, request.key().number, None);
                }
                Routed::InResponse(Some((code, reason))) => {
                    replies.add(
                        &request.message_id.group_id,
                        request.key().number,
                        Some(code),
                    );
                    own_fault = Some((code, reason));
                }
                Routed::Elsewhere => {}
                Routed::Now(answer) => return answer,
            },
            None => note.verdict = Some("poll".into()),
        }
        if let Some(poll) = &env.poll_request {
            let partner = self.sender.partner();
            if let Err(answer) =
                poll::answer_into(self.ctx, partner, env.version, poll, &mut replies).await
            {
                if env.request.is_none() {
                    return answer;
                }
                // The message itself is already decided and committed: its answer must not
                // be replaced by the poll's failure. The poll can be asked again.
                tracing::warn!("a piggy-backed poll failed; answering for the message only");
            }
        }
        match own_fault {
            // The header carries this message's fault and any poll answers with it.
            Some((code, reason)) => Answer::Fault {
                code,
                reason,
                replies: replies.into_response(),
            },
            None => Answer::Replies(replies.into_response()),
        }
    }

    /// One reliable message: checked, committed, and routed by its reply pattern.
    async fn message(&self, request: &Request, note: &mut Note) -> Routed {
        note.group_id = Some(request.message_id.group_id.as_str().to_owned());
        note.number = request.key().number;
        if let Some((code, reason)) = self.agreement.unusable_reply_pattern(request) {
            note.faulted(code);
            return Routed::Now(Answer::fault(code, reason));
        }
        let ctx = self.ctx;
        let partner = self.sender.partner();
        let key = request.key();
        if let ReplyPattern::Callback(to) = &request.reply_pattern {
            match callback::check(ctx, partner, &to.uri).await {
                Ok(()) => {}
                Err(Refused::Unregistered(uri)) => {
                    return Routed::Now(callback::unregistered(&uri));
                }
                Err(Refused::Store(e)) => return store_failed(&key, &e),
            }
        }
        let now = ctx.clock.now();
        let refusal =
            crate::telemetry::traced!("receive.decide").in_scope(|| self.refusal(request, now));
        if let Some((code, reason)) = refusal {
            note.faulted(code);
            let keep_until = self.agreement.fault_kept_until(request.expiry_time, now);
            let pattern = &request.reply_pattern;
            let version = self.env.version;
            let fault = (code, reason);
            return by_reply_pattern(ctx, partner, version, &key, pattern, fault, keep_until).await;
        }
        if let Some(op) = ctx.config.operations.get(self.channel) {
            // A call to the service takes far longer than any commit should wait.
            self.posted.arriving.arrived();
            if let Some(routed) = self.request_response(op, request, note).await {
                return routed;
            }
        }
        // Made after a request-response channel's wait (delivered long ago, or expired while
        // it waited for its gap): stamped now, so a request that expired meanwhile is faulted,
        // never buffered without an exchange waiting.
        let message = self.stored(request);
        // A buffered Response-pattern message may be delivered while we wait (D6): watch
        // before submitting, so the delivery cannot slip by between the two.
        let hold = Hold::watch(ctx, partner, &key, request);
        self.posted.arriving.arrived();
        let committed = ctx
            .store
            .receive(message)
            .instrument(crate::telemetry::traced!("receive.commit"))
            .await;
        if let Ok(received) = &committed {
            keep_trace(ctx, partner, request, received).await;
        }
        match committed {
            Err(e) => {
                note.verdict = Some("not stored".into());
                store_failed(&key, &e)
            }
            Ok(received) => {
                note_received(note, &received);
                let sender = self.sender;
                super::note_held_back_of(self.channel, sender.partner(), &sender.source, &received);
                match answer_route(received.verdict, request) {
                    AnswerRoute::InResponse(fault) => Routed::InResponse(fault),
                    AnswerRoute::MayHold => {
                        let delivered = match hold {
                            Some(hold) => hold.delivered_within(ctx.config.hold).await,
                            None => false,
                        };
                        match delivered {
                            true => Routed::InResponse(None),
                            false => Routed::Elsewhere,
                        }
                    }
                    AnswerRoute::Elsewhere => Routed::Elsewhere,
                    AnswerRoute::Synchronous(code, reason) => {
                        Routed::Now(Answer::fault(code, reason))
                    }
                }
            }
        }
    }

    /// A request to a request-response channel: answered by its responder (D16), or `None`
    /// when the receiving rules answer it as on any channel (delivered long ago, expired).
    async fn request_response(
        &self,
        op: &RequestResponse,
        request: &Request,
        note: &mut Note,
    ) -> Option<Routed> {
        let message = self.stored(request);
        let key = request.key();
        let asked = Asked {
            ctx: self.ctx,
            partner: self.sender.partner(),
            source: &self.sender.source,
            channel: self.channel,
            operation: op,
            env: self.env,
            request,
            message,
            soap_action: self.posted.soap_action,
        };
        Some(match asked.respond().await {
            Err(e) => store_failed(&key, &e),
            Ok(Responded::AsOneWay) => return None,
            Ok(Responded::Answer(answer)) => {
                note.verdict = Some("answered".into());
                Routed::Now(Answer::Business(answer))
            }
            Ok(Responded::Fault(code, reason)) => {
                note.faulted(code);
                Routed::Now(Answer::Fault {
                    code,
                    reason,
                    replies: Some(single(reply_for(&key, Some(code)))),
                })
            }
        })
    }

    /// Why the agreement refuses the message before the store sees it (D9), if it does.
    fn refusal(&self, request: &Request, now: DateTime<Utc>) -> Option<(FaultCode, String)> {
        self.agreement.check(request, now).err().or_else(|| {
            (self.env.attachments > 0)
                .then(|| (FaultCode::FeatureNotSupported, NO_ATTACHMENTS.to_owned()))
        })
    }

    /// The message as the store takes it: its payload (the Body's children, sharing the
    /// request's buffer), the namespaces they use, and its topic (DESIGN §5).
    fn stored(&self, request: &Request) -> ReceivedMessage {
        let env = self.env;
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
        ReceivedMessage {
            partner: self.sender.partner().to_owned(),
            channel: self.channel.to_owned(),
            request: request.clone(),
            payload: Payload::within(self.posted.body, env.body.content),
            namespaces: serde_json::to_string(&namespaces).unwrap_or_else(|_| "[]".into()),
            topic: topic(self.channel, root),
            source: self.sender.source.clone(),
            quota: self.agreement.quota,
            soap12: env.version == SoapVersion::Soap12,
            // Read again, with no await before the writer's queue takes it: a PollRequest's
            // barrier queued ahead of this message then also came before this time, so a
            // sender told "not held" after the ExpiryTime can rely on it (store
            // `poll_answer`).
            now: self.ctx.clock.now(),
            // A SOAP backend's answer is the delivery, not an inbox entry (D16).
            inbox: !matches!(
                self.ctx.config.operations.get(self.channel),
                Some(RequestResponse {
                    responder: Responder::Backend(_),
                    ..
                })
            ),
            answer: None,
        }
    }
}

/// Keeps the trace context a stored (delivered or buffered) message came in with, while
/// traces are exported, so that its fetch, settle or push joins this trace. Best effort: a
/// context not kept is a new trace later, never a refused message.
async fn keep_trace(ctx: Inbound<'_>, partner: &str, request: &Request, received: &Received) {
    let stored = matches!(received.action, Action::Deliver | Action::Buffer);
    let Some(traceparent) = crate::telemetry::current_traceparent().filter(|_| stored) else {
        return;
    };
    let key = crate::store::traces::message_key(
        partner,
        request.message_id.group_id.as_str(),
        request.key().number,
    );
    if let Err(e) = ctx
        .store
        .keep_message_trace(&key, &traceparent, ctx.clock.now())
        .await
    {
        tracing::debug!(error = %e, "a message's trace context was not kept");
    }
}

/// A delivered message's topic (DESIGN §5): `{channel}/{local name of the first Body child}`.
pub fn topic(channel: &str, root: &str) -> String {
    format!("{channel}/{root}")
}

/// An envelope this endpoint does not take, and the fault that says so.
fn not_for_a_channel(env: &Envelope<'_>) -> Option<(FaultCode, &'static str)> {
    if env.request.is_some() || env.poll_request.is_some() {
        return None;
    }
    Some(if env.response.is_some() {
        // Acks for messages we sent belong to the sending RMP, at /wsr/_callback.
        (
            FaultCode::FeatureNotSupported,
            "acknowledgments are accepted at /wsr/_callback, not at a channel",
        )
    } else {
        (
            FaultCode::InvalidRequest,
            "no wsrm:Request or wsrm:PollRequest header: this endpoint takes reliable messages",
        )
    })
}

/// The committed decision as the access log and the metrics show it: the fault code, or
/// what became of the message (`delivered`, `buffered`, `duplicate`).
fn note_received(note: &mut Note, received: &Received) {
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

/// The store could not take the message: nothing was acked, the sender resends later.
fn store_failed(key: &MessageKey, e: &StoreError) -> Routed {
    crate::store::health::log_store_failure(
        "message not stored; answered MessageProcessingFailure",
        e,
    );
    tracing::debug!(error = %e, %key, "message not stored");
    let code = FaultCode::MessageProcessingFailure;
    Routed::Now(Answer::Fault {
        code,
        reason: "the message could not be stored; resend it later".into(),
        replies: Some(single(reply_for(key, Some(code)))),
    })
}

fn single(reply: crate::wsr::Reply) -> crate::wsr::Response {
    crate::wsr::Response {
        replies: vec![reply],
    }
}

/// A fault decided before the store (a defect, the agreement), sent the way the message
/// asked (D4): in the response, queued for its registered callback endpoint (checked by the
/// caller), or kept for its sender's polls — until `keep_until`.
async fn by_reply_pattern(
    ctx: Inbound<'_>,
    partner: &str,
    version: SoapVersion,
    key: &MessageKey,
    pattern: &ReplyPattern,
    (code, reason): (FaultCode, String),
    keep_until: DateTime<Utc>,
) -> Routed {
    let stored = match pattern {
        ReplyPattern::Response => return Routed::InResponse(Some((code, reason))),
        ReplyPattern::Callback(to) => {
            let owed = ReplyItem {
                group_id: key.group_id.clone(),
                range: key.number.map(SeqRange::single),
                fault: Some(code),
            };
            callback::owe(ctx, partner, &to.uri, version, &[owed], keep_until).await
        }
        ReplyPattern::Poll => {
            let now = ctx.clock.now();
            (ctx.store.record_fault(partner, key, code, keep_until, now)).await
        }
    };
    match stored {
        Ok(()) => Routed::Elsewhere,
        Err(e) => store_failed(key, &e),
    }
}

/// Answers a defect found while reading: synchronously when no group or reply pattern could
/// be recovered, or else by the message's reply pattern (D4).
async fn answer_defect(
    ctx: Inbound<'_>,
    partner: &str,
    version: SoapVersion,
    defect: &Defect,
) -> Answer {
    tracing::info!(code = %defect.code, reason = %defect.reason, "refused a message");
    let FaultRoute::ReplyPattern { key, reply } = &defect.route else {
        return Answer::fault(defect.code, defect.reason.clone());
    };
    if let ReplyPattern::Callback(to) = reply {
        match callback::check(ctx, partner, &to.uri).await {
            Ok(()) => {}
            Err(Refused::Unregistered(uri)) => return callback::unregistered(&uri),
            Err(Refused::Store(e)) => return settled(store_failed(key, &e)),
        }
    }
    // Its own ExpiryTime is unknown (it may be the defect): kept as any fault notice is.
    let keep_until = ctx.clock.now() + FAULT_NOTICE_RETENTION;
    let fault = (defect.code, defect.reason.clone());
    match by_reply_pattern(ctx, partner, version, key, reply, fault, keep_until).await {
        Routed::InResponse(_) => Answer::Fault {
            code: defect.code,
            reason: defect.reason.clone(),
            replies: Some(single(reply_for(key, Some(defect.code)))),
        },
        other => settled(other),
    }
}

/// A defect's answer when it is not in the response: the synchronous one, or 202.
fn settled(routed: Routed) -> Answer {
    match routed {
        Routed::Now(answer) => answer,
        Routed::Elsewhere | Routed::InResponse(_) => Answer::Replies(None),
    }
}

/// The hold (D6): a Response-pattern answer for a buffered message waits up to the
/// configured hold for the gap to fill, then carries the ack. Watching starts before the
/// message is submitted, so the delivery cannot slip by; the watch is forgotten when the hold
/// ends, whichever way.
struct Hold<'a> {
    ctx: Inbound<'a>,
    partner: &'a str,
    key: &'a MessageKey,
    delivered: Option<oneshot::Receiver<()>>,
}

impl<'a> Hold<'a> {
    /// Starts watching for `request`'s delivery, when its answer may wait at all.
    fn watch(
        ctx: Inbound<'a>,
        partner: &'a str,
        key: &'a MessageKey,
        request: &Request,
    ) -> Option<Hold<'a>> {
        if !may_hold(request) || ctx.config.hold.is_zero() {
            return None;
        }
        let delivered = Some(ctx.store.watch_delivery(partner, key));
        Some(Hold {
            ctx,
            partner,
            key,
            delivered,
        })
    }

    /// Whether the message was delivered within `hold`.
    async fn delivered_within(mut self, hold: Duration) -> bool {
        let Some(delivered) = self.delivered.take() else {
            return false;
        };
        matches!(tokio::time::timeout(hold, delivered).await, Ok(Ok(())))
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        // Our receiver must be gone before the map is cleaned, or the entry would stay.
        drop(self.delivered.take());
        self.ctx.store.forget_watchers(self.partner, self.key);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::testing::{Rig, callback, envelope, poll, request};
    use super::*;
    use crate::rmp::agreement::Feature;
    use crate::wsr::{Reply, ReplyRange, Response};

    fn ack(group: &str) -> Option<Response> {
        Some(Response {
            replies: vec![Reply::NonSequence {
                group_id: crate::wsr::GroupId::parse(group).expect("group"),
                fault: None,
            }],
        })
    }

    fn faulted(group: &str, code: FaultCode) -> Option<Response> {
        Some(Response {
            replies: vec![Reply::NonSequence {
                group_id: crate::wsr::GroupId::parse(group).expect("group"),
                fault: Some(code),
            }],
        })
    }

    /// Everything but DuplicateElimination.
    fn without_duplicate_elimination() -> Agreement {
        let offers: Vec<Feature> = Feature::ALL
            .into_iter()
            .filter(|f| *f != Feature::DuplicateElimination)
            .collect();
        Agreement::everything().for_partner(Some(&offers), &[])
    }

    #[tokio::test]
    async fn d5_a_response_message_is_acked_in_the_response_and_again_when_resent() {
        let rig = Rig::new().await;
        let msg = envelope(&request("urn:g:1", None, ReplyPattern::Response));
        let first = rig.post(msg.as_bytes()).await;
        assert_eq!(first.answer, Answer::Replies(ack("urn:g:1")));
        assert_eq!(first.note.verdict.as_deref(), Some("delivered"));
        assert_eq!(first.note.group_id.as_deref(), Some("urn:g:1"));
        // D2: a duplicate of a delivered message is acked again, not delivered again.
        let again = rig.post(msg.as_bytes()).await;
        assert_eq!(again.answer, Answer::Replies(ack("urn:g:1")));
        assert_eq!(again.note.verdict.as_deref(), Some("duplicate"));
    }

    #[tokio::test]
    async fn d4_d9_a_refusal_of_a_response_message_rides_in_the_header_with_a_soap_fault() {
        let rig = Rig::new().await;
        let msg = envelope(&request("urn:g:2", None, ReplyPattern::Response));
        let out = rig
            .post_under(&without_duplicate_elimination(), msg.as_bytes())
            .await;
        let code = FaultCode::FeatureNotSupported;
        match out.answer {
            Answer::Fault {
                code: c, replies, ..
            } => {
                assert_eq!(c, code);
                assert_eq!(replies, faulted("urn:g:2", code));
            }
            other => panic!("expected a fault, got {other:?}"),
        }
        assert_eq!(out.note.fault, Some(code));
    }

    #[tokio::test]
    async fn d9_a_required_feature_left_out_is_invalid_message_parameters() {
        let rig = Rig::new().await;
        let mut req = request("urn:g:3", None, ReplyPattern::Response);
        req.ack_requested = false;
        let requiring = Agreement::everything().for_partner(None, &[Feature::AckRequested]);
        let out = rig.post_under(&requiring, envelope(&req).as_bytes()).await;
        assert!(
            matches!(
                out.answer,
                Answer::Fault {
                    code: FaultCode::InvalidMessageParameters,
                    ..
                }
            ),
            "{:?}",
            out.answer
        );
    }

    #[tokio::test]
    async fn d4_d11_a_refusal_of_a_poll_message_is_told_when_polled() {
        let rig = Rig::new().await;
        let msg = envelope(&request("urn:g:4", None, ReplyPattern::Poll));
        let out = rig
            .post_under(&without_duplicate_elimination(), msg.as_bytes())
            .await;
        assert_eq!(
            out.answer,
            Answer::Replies(None),
            "nothing on this connection"
        );
        let polled = rig.post(poll("urn:g:4", None, None).as_bytes()).await;
        let code = FaultCode::FeatureNotSupported;
        assert_eq!(polled.answer, Answer::Replies(faulted("urn:g:4", code)));
        assert_eq!(polled.note.verdict.as_deref(), Some("poll"));
    }

    #[tokio::test]
    async fn d10_a_callback_to_an_unregistered_endpoint_is_refused_and_not_stored() {
        let rig = Rig::new().await;
        let msg = envelope(&request("urn:g:5", None, callback()));
        let out = rig.post(msg.as_bytes()).await;
        assert!(
            matches!(
                &out.answer,
                Answer::Fault {
                    code: FaultCode::InvalidReplyPattern,
                    replies: None,
                    ..
                }
            ),
            "{:?}",
            out.answer
        );
        let group = rig.store.group("", "urn:g:5").await.expect("read");
        assert!(group.is_none(), "nothing stored");
    }

    #[tokio::test]
    async fn d10_a_callback_message_is_answered_by_its_registered_endpoint() {
        let rig = Rig::new().await;
        rig.register_callback().await;
        assert_eq!(rig.store.next_callback_due().await.expect("read"), None);
        let msg = envelope(&request("urn:g:6", None, callback()));
        let out = rig.post(msg.as_bytes()).await;
        assert_eq!(
            out.answer,
            Answer::Replies(None),
            "202: the ack goes by callback"
        );
        assert_eq!(out.note.verdict.as_deref(), Some("delivered"));
        assert!(
            rig.store.next_callback_due().await.expect("read").is_some(),
            "an ack is owed to the endpoint"
        );
    }

    #[tokio::test]
    async fn d4_a_number_no_reply_can_name_is_a_synchronous_fault() {
        let rig = Rig::new().await;
        let msg = envelope(&request("urn:g:7", Some(0), ReplyPattern::Response));
        let broken = msg.replacen("number=\"0\"", "number=\"x\"", 1);
        assert_ne!(broken, msg, "the number attribute was found");
        let out = rig.post(broken.as_bytes()).await;
        assert!(
            matches!(
                &out.answer,
                Answer::Fault {
                    code: FaultCode::InvalidMessageId,
                    replies: None,
                    ..
                }
            ),
            "{:?}",
            out.answer
        );
        assert_eq!(out.note.fault, Some(FaultCode::InvalidMessageId));
    }

    #[tokio::test]
    async fn d11_a_poll_is_answered_for_delivered_messages_only() {
        let rig = Rig::new().await;
        let msg = envelope(&request("urn:g:8", None, ReplyPattern::Poll));
        assert_eq!(rig.post(msg.as_bytes()).await.answer, Answer::Replies(None));
        let known = rig.post(poll("urn:g:8", None, None).as_bytes()).await;
        assert_eq!(known.answer, Answer::Replies(ack("urn:g:8")));
        // Nothing to say: no wsrm:Response at all (an empty one is schema-invalid).
        let unknown = rig.post(poll("urn:g:unknown", None, None).as_bytes()).await;
        assert_eq!(unknown.answer, Answer::Replies(None));
    }

    #[tokio::test]
    async fn d11_a_poll_answered_by_callback_needs_a_registered_endpoint() {
        let rig = Rig::new().await;
        let msg = envelope(&request("urn:g:9", None, ReplyPattern::Poll));
        rig.post(msg.as_bytes()).await;
        let to = super::super::testing::CALLBACK;
        let refused = rig.post(poll("urn:g:9", None, Some(to)).as_bytes()).await;
        assert!(
            matches!(
                &refused.answer,
                Answer::Fault {
                    code: FaultCode::InvalidReplyPattern,
                    ..
                }
            ),
            "{:?}",
            refused.answer
        );
        rig.register_callback().await;
        let queued = rig.post(poll("urn:g:9", None, Some(to)).as_bytes()).await;
        assert_eq!(
            queued.answer,
            Answer::Replies(None),
            "the answer goes by callback"
        );
        assert!(rig.store.next_callback_due().await.expect("read").is_some());
    }

    fn ordered(number: u64) -> String {
        let mut req = request("urn:g:ordered", Some(number), ReplyPattern::Response);
        req.message_order = true;
        envelope(&req)
    }

    fn seq_ack(group: &str, number: u64) -> Option<Response> {
        Some(Response {
            replies: vec![Reply::Sequence {
                group_id: crate::wsr::GroupId::parse(group).expect("group"),
                ranges: vec![ReplyRange {
                    range: SeqRange::single(number),
                    fault: None,
                }],
            }],
        })
    }

    #[tokio::test]
    async fn d6_a_buffered_message_is_answered_without_an_ack_when_its_gap_stays_open() {
        let mut rig = Rig::new().await;
        rig.config.hold = Duration::from_millis(20);
        let out = rig.post(ordered(1).as_bytes()).await;
        assert_eq!(
            out.answer,
            Answer::Replies(None),
            "202 once the hold is over"
        );
        assert_eq!(out.note.verdict.as_deref(), Some("buffered"));
    }

    #[tokio::test]
    async fn d6_a_held_answer_carries_the_ack_once_the_gap_fills() {
        let mut rig = Rig::new().await;
        rig.config.hold = Duration::from_secs(60);
        let rig = &rig;
        let second = ordered(1);
        let held = rig.post(second.as_bytes());
        let fill = async {
            // Message 0 only once message 1 is buffered, so that 1 is delivered while held.
            for _ in 0..2000 {
                let group = rig.store.group("", "urn:g:ordered").await.expect("read");
                if group.is_some_and(|g| g.buffered.contains_key(&1)) {
                    return rig.post(ordered(0).as_bytes()).await;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            panic!("message 1 was never buffered");
        };
        let (held, filled) = tokio::join!(held, fill);
        assert_eq!(filled.answer, Answer::Replies(seq_ack("urn:g:ordered", 0)));
        assert_eq!(held.answer, Answer::Replies(seq_ack("urn:g:ordered", 1)));
    }
}
