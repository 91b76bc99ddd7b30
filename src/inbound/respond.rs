//! A request to a request-response channel (D16), answered by its responder:
//! - a SOAP backend, called once: the request is delivered when it has answered, and its
//!   business response is kept and given, byte for byte, to every copy of the request; a copy
//!   that arrives while the call is out waits for it (up to the hold); an unknown outcome is
//!   called again or failed, as the channel says;
//! - an application through the API (the spec's Respond): the request is delivered to the
//!   inbox, and the exchange waits for the answer the consumer gives with its receipt
//!   (`application_answer`, `POST /api/v1/respond`).
//!
//! The decisions are `rmp::exchange`'s; the agreement and callback checks before, and the
//! answer's rendering after, `receive.rs`'s and `http/wsr.rs`'s.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::Inbound;
use crate::outbound::backend::{BackendSpec, Call, RequestResponse, Responder, Slot};
use crate::rmp::exchange::{
    Gate, Judged, OnUnknown, Step, answer_bytes, gate, keep_until, request_idempotency_headers,
};
use crate::rmp::receiver::Verdict;
use crate::rmp::replies::reply_for;
use crate::store::{
    Attempt, Began, BeginCall, CachedAnswer, KeptAnswer, NewCall, Received, ReceivedMessage, Store,
    StoreError,
};
use crate::wsr::splice::without_wsr_blocks;
use crate::wsr::{
    Envelope, FaultCode, Headers, Limits, MessageKey, ReplyPattern, Request, Response, SoapVersion,
    read_envelope, write_envelope,
};

/// A copy waiting for an answer that another task or gateway is getting looks again after
/// this, then twice as long each time, up to `LOOK_AT_MOST`.
const LOOK_AGAIN: Duration = Duration::from_millis(10);
const LOOK_AT_MOST: Duration = Duration::from_millis(250);

/// How long past its timeout a call still counts as out: a gateway that made it may be
/// committing its answer right now.
const COMMIT_GRACE: chrono::Duration = chrono::Duration::seconds(2);

/// What a request to a request-response channel gets.
#[derive(Debug)]
pub enum Responded {
    /// The business response (under Response, with the ack in its header).
    Answer(CachedAnswer),
    /// A fault for this message: `MessageProcessingFailure` (resend it) or
    /// `PermanentProcessingFailure`.
    Fault(FaultCode, String),
    /// Not the responder's: delivered already and its answer no longer kept, or expired. The
    /// receiving rules answer it as on any channel.
    AsOneWay,
}

/// One request, as `receive.rs` hands it over: checked against the agreement, its callback
/// endpoint registered, not yet stored.
pub struct Asked<'a> {
    pub ctx: Inbound<'a>,
    pub partner: &'a str,
    pub source: &'a str,
    pub channel: &'a str,
    pub operation: &'a RequestResponse,
    pub env: &'a Envelope<'a>,
    pub request: &'a Request,
    /// The request as the store takes it (for the inbox only when an application answers).
    pub message: ReceivedMessage,
    /// The SOAPAction the partner sent, passed through.
    pub soap_action: Option<&'a str>,
}

impl Asked<'_> {
    fn key(&self) -> MessageKey {
        self.request.key()
    }

    /// Answers the request by the channel's responder.
    pub async fn respond(&self) -> Result<Responded, StoreError> {
        match &self.operation.responder {
            Responder::Backend(backend) => self.by_backend(backend).await,
            Responder::Api { within } => self.by_application(*within).await,
        }
    }

    /// From its kept exchange, by waiting for the call out, or by calling the backend.
    async fn by_backend(&self, backend: &BackendSpec) -> Result<Responded, StoreError> {
        let ctx = self.ctx;
        let key = self.key();
        let until = Instant::now() + ctx.config.hold;
        // The common case first, without reading the exchange: a request that may be called
        // (its gate) and that no copy has begun a call for (the record of the call decides
        // that: it sees every call begun, durable or not). Anything else goes the long way,
        // from the kept exchange.
        if self.gate(ctx.clock.now()).await? == Gate::Open {
            let quota = ctx.config.max_answer_bytes_per_source;
            if let Some(done) = self.call_if_begun(BeginCall::Fresh { quota }).await? {
                return Ok(done);
            }
        }
        let mut look = LOOK_AGAIN;
        loop {
            let now = ctx.clock.now();
            let kept = ctx.store.exchange(self.partner, &key, now).await?;
            let step = match &kept {
                Some(ex) => Step::kept(ex.state, ex.started_at < stale_before(backend, now)),
                None => Step::unkept(self.gate(now).await?),
            };
            let done = match (step, kept) {
                (Step::Replay, kept) => {
                    let (answer, called) = kept
                        .and_then(|ex| Some((ex.answer?, ex.started_at)))
                        .ok_or_else(|| {
                            StoreError::Corrupt("an answered exchange without its answer".into())
                        })?;
                    Some(self.deliver(answer, called).await?)
                }
                (Step::InDoubt, _) => Some(in_doubt()),
                (Step::AsOneWay, _) => Some(Responded::AsOneWay),
                (Step::Unknown, Some(ex)) => self.unknown_outcome(backend, ex.attempt).await?,
                (Step::Call, _) => {
                    let quota = ctx.config.max_answer_bytes_per_source;
                    self.call_if_begun(BeginCall::Fresh { quota }).await?
                }
                (Step::Wait | Step::Unknown, _) => None,
            };
            if let Some(done) = done {
                return Ok(done);
            }
            if Instant::now() + look > until {
                return Ok(still_out(self.request));
            }
            tokio::time::sleep(look).await;
            look = (look * 2).min(LOOK_AT_MOST);
        }
    }

    /// The request's gate (`rmp::exchange::gate`) over its group as stored.
    async fn gate(&self, now: chrono::DateTime<chrono::Utc>) -> Result<Gate, StoreError> {
        let store = self.ctx.store;
        let group = store
            .group(self.partner, self.request.key().group_id.as_str())
            .await?;
        Ok(gate(
            group.as_ref(),
            self.request,
            now,
            store.policy().clock_skew,
        ))
    }

    /// Delivered to the inbox once, then the application's answer awaited: up to `within`
    /// by the copy that delivered it, up to the hold by any other.
    async fn by_application(&self, within: Duration) -> Result<Responded, StoreError> {
        let ctx = self.ctx;
        let key = self.key();
        let mut until = Instant::now() + ctx.config.hold;
        let mut look = LOOK_AGAIN;
        let mut delivered = false;
        loop {
            let now = ctx.clock.now();
            let kept = ctx.store.exchange(self.partner, &key, now).await?;
            if let Some(answer) = kept.and_then(|ex| ex.answer) {
                return self.deliver_application_answer(answer).await;
            }
            if !delivered {
                match self.gate(now).await? {
                    Gate::Expired => return Ok(Responded::AsOneWay),
                    Gate::AheadOfGap => {}
                    Gate::Delivered => delivered = true,
                    Gate::Open => {
                        let mut message = self.message.clone();
                        message.now = now;
                        let received = ctx.store.receive(message).await?;
                        super::note_held_back(&self.message, &received);
                        if let Verdict::Fault(code, reason) = received.verdict {
                            return Ok(Responded::Fault(code, reason));
                        }
                        delivered = true;
                        until = Instant::now() + within;
                    }
                }
            }
            if Instant::now() + look > until {
                return Ok(Responded::Fault(
                    FaultCode::MessageProcessingFailure,
                    match delivered {
                        true => "the application has not answered yet; resend it",
                        false => "the request waits for an earlier one of its group; resend it",
                    }
                    .into(),
                ));
            }
            tokio::time::sleep(look).await;
            look = (look * 2).min(LOOK_AT_MOST);
        }
    }

    /// An application's answer (the Body it gave) in an envelope of the request's version,
    /// with the ack under Response: the same bytes for every copy.
    async fn deliver_application_answer(
        &self,
        answer: CachedAnswer,
    ) -> Result<Responded, StoreError> {
        let version = self.env.version;
        let body = std::str::from_utf8(&answer.body)
            .map_err(|_| StoreError::Corrupt("an application's answer is not UTF-8".into()))?;
        let ack = self.ack();
        let envelope = write_envelope(
            version,
            Headers {
                response: ack.as_ref(),
                ..Headers::default()
            },
            body,
        );
        let answer = CachedAnswer {
            status: answer.status,
            content_type: version.content_type().to_owned(),
            body: Bytes::from(envelope),
        };
        // Delivered already: this commit only records the copy.
        self.deliver(answer, self.ctx.clock.now()).await
    }

    /// The ack a business response carries: under Response, when asked for.
    fn ack(&self) -> Option<Response> {
        let request = self.request;
        (request.reply_pattern == ReplyPattern::Response && request.ack_requested).then(|| {
            Response {
                replies: vec![reply_for(&request.key(), None)],
            }
        })
    }

    /// A call (`attempt`) started before this was made by a gateway that gave up on it or
    /// died: its outcome is unknown. `None`: another copy took it over first.
    async fn unknown_outcome(
        &self,
        backend: &BackendSpec,
        attempt: Attempt,
    ) -> Result<Option<Responded>, StoreError> {
        let key = self.key();
        match self.operation.on_unknown {
            OnUnknown::Fail => {
                self.ctx
                    .store
                    .call_unknown(self.partner, &key, attempt, true)
                    .await?;
                Ok(Some(in_doubt()))
            }
            OnUnknown::Retry => {
                let started_before = stale_before(backend, self.ctx.clock.now());
                self.call_if_begun(BeginCall::TakeOver { started_before })
                    .await
            }
        }
    }

    /// Takes one of the channel's call slots, records the call as out (`how`), and calls.
    /// `None`: another copy has the call (look again).
    async fn call_if_begun(&self, how: BeginCall) -> Result<Option<Responded>, StoreError> {
        let ctx = self.ctx;
        // The slot first: a call recorded as out is under way at once, so that its start
        // plus its timeout bounds it (`stale_before`), however long the slots stay busy.
        let Some(slot) = ctx.backends.slot(self.channel, ctx.config.hold).await else {
            return Ok(Some(Responded::Fault(
                FaultCode::MessageProcessingFailure,
                "the service is busy with other requests; resend it later".into(),
            )));
        };
        let key = self.key();
        let call = NewCall {
            partner: self.partner,
            key: &key,
            channel: self.channel,
            source: self.source,
            now: ctx.clock.now(),
            keep_until: keep_until(self.request, ctx.store.policy().answer_polls_for),
        };
        let (began, committed) = ctx.store.begin_call(call, how).await?;
        match began {
            Began::Call(attempt) => {
                // Under `fail`, a record of the call lost in a crash would let the next copy
                // call again: it must be durable before the call goes out. Under `retry`,
                // losing it is what a kill between the call and its commit does anyway (the
                // next copy calls again, with the same idempotency headers): not waited for.
                match self.operation.on_unknown {
                    OnUnknown::Fail => committed.durable().await?,
                    OnUnknown::Retry => drop(committed),
                }
                self.call(slot, attempt).await
            }
            Began::Exists => Ok(None),
            Began::OverQuota { held } => {
                let quota = ctx.config.max_answer_bytes_per_source;
                Ok(Some(Responded::Fault(
                    FaultCode::MessageProcessingFailure,
                    format!(
                        "this sender's kept answers take {held} bytes, the quota is {quota}: \
                         resend once earlier requests have expired"
                    ),
                )))
            }
        }
    }

    /// The call (`attempt`, in `slot`): the envelope without its WS-R blocks, with the
    /// idempotency headers. It and the recording of its outcome run in a task of their own,
    /// to the end even when the partner hangs up meanwhile (dropped, the call's outcome would
    /// be unknown without a kill); the slot bounds how many such tasks there are. `None`: the
    /// call was taken over meanwhile and its answer not kept (look again).
    async fn call(&self, slot: Slot, attempt: Attempt) -> Result<Option<Responded>, StoreError> {
        let ctx = self.ctx;
        let key = self.key();
        let envelope = match without_wsr_blocks(self.env.text) {
            Ok(envelope) => envelope,
            Err(why) => {
                ctx.store.call_failed(self.partner, &key, attempt).await?;
                return Ok(Some(Responded::Fault(
                    FaultCode::MessageProcessingFailure,
                    why,
                )));
            }
        };
        let call = Call {
            envelope,
            version: self.env.version,
            soap_action: self.soap_action.map(str::to_owned),
            idempotency: request_idempotency_headers(self.partner, self.request),
        };
        let outcome = Outcome {
            store: ctx.store.clone(),
            channel: self.channel.to_owned(),
            partner: self.partner.to_owned(),
            key,
            attempt,
            message: self.message.clone(),
            ack: self.ack(),
            in_doubt: self.operation.on_unknown == OnUnknown::Fail,
        };
        let backends = ctx.backends.clone();
        let cap = ctx.config.limits.max_bytes;
        let task = tokio::spawn(async move {
            let judged = backends.call(&slot, call, cap).await;
            let ended = outcome.record(judged).await;
            drop(slot);
            ended
        });
        let ended = match task.await {
            Ok(ended) => ended?,
            Err(e) => {
                tracing::error!(channel = self.channel, error = %e, "a call to the service failed");
                return Ok(Some(Responded::Fault(
                    FaultCode::MessageProcessingFailure,
                    "the call to the service failed; resend it".into(),
                )));
            }
        };
        Ok(match ended {
            CallEnd::Delivered(answer, received) => Some(responded(answer, received)),
            CallEnd::NotKept => None,
            CallEnd::NotDelivered => Some(Responded::Fault(
                FaultCode::MessageProcessingFailure,
                "the service could not be reached; resend it later".into(),
            )),
            CallEnd::Unknown if self.operation.on_unknown == OnUnknown::Fail => Some(in_doubt()),
            CallEnd::Unknown => Some(Responded::Fault(
                FaultCode::MessageProcessingFailure,
                "the service's answer did not come; resend it".into(),
            )),
        })
    }

    /// Commits the delivery (D2: a copy's is a duplicate's), then gives the answer: never an
    /// ack before the commit. Judged as of `called` (no later than the call began): the
    /// expiry was checked before the call, and a request that expired while the service
    /// answered it was answered all the same — faulting it now would tell the sender
    /// "not delivered" of a request the service carried out.
    async fn deliver(
        &self,
        answer: CachedAnswer,
        called: chrono::DateTime<chrono::Utc>,
    ) -> Result<Responded, StoreError> {
        let mut message = self.message.clone();
        message.now = called.min(self.ctx.clock.now());
        let received = self.ctx.store.receive(message).await?;
        super::note_held_back(&self.message, &received);
        Ok(responded(answer, received))
    }
}

/// A request's answer once its delivery is stored: the answer, or the receiving rules' fault.
fn responded(answer: CachedAnswer, received: Received) -> Responded {
    match received.verdict {
        Verdict::Fault(code, reason) => Responded::Fault(code, reason),
        Verdict::Ack | Verdict::NoAck => Responded::Answer(answer),
    }
}

/// What became of one call, its outcome recorded.
enum CallEnd {
    /// The business response, kept as the request's answer with its delivery in one
    /// transaction (D16).
    Delivered(CachedAnswer, Received),
    /// Answered, but the exchange was no longer this call's (taken over, or purged): not kept.
    NotKept,
    NotDelivered,
    Unknown,
}

/// How one call's outcome is recorded: owned, for the call's task.
struct Outcome {
    store: Store,
    channel: String,
    partner: String,
    key: MessageKey,
    attempt: Attempt,
    /// The request as the store takes it: delivered with the answer.
    message: ReceivedMessage,
    /// The ack the answer carries (under Response).
    ack: Option<Response>,
    /// An unknown outcome is in doubt for good (`on_unknown = "fail"`).
    in_doubt: bool,
}

impl Outcome {
    async fn record(&self, judged: Judged) -> Result<CallEnd, StoreError> {
        let (store, partner, key, attempt) = (&self.store, &self.partner, &self.key, self.attempt);
        Ok(match judged {
            Judged::Business(business) => {
                let answer = CachedAnswer {
                    status: business.status,
                    content_type: business.content_type.clone(),
                    body: answer_bytes(&business, self.ack.as_ref()),
                };
                let mut message = self.message.clone();
                message.answer = Some(KeptAnswer {
                    attempt,
                    answer: answer.clone(),
                });
                match store.receive(message).await {
                    Ok(received) => {
                        super::note_held_back(&self.message, &received);
                        CallEnd::Delivered(answer, received)
                    }
                    Err(StoreError::Superseded) => CallEnd::NotKept,
                    Err(e) => return Err(e),
                }
            }
            Judged::NotDelivered(why) => {
                tracing::info!(channel = self.channel, %key, reason = %why, "the service did not take the request");
                store.call_failed(partner, key, attempt).await?;
                CallEnd::NotDelivered
            }
            Judged::Unknown(why) => {
                tracing::warn!(channel = self.channel, %key, reason = %why, "the outcome of a call to the service is unknown");
                store
                    .call_unknown(partner, key, attempt, self.in_doubt)
                    .await?;
                CallEnd::Unknown
            }
        })
    }
}

/// Calls started before this are no longer out: past their timeout and a grace for the commit.
fn stale_before(
    backend: &BackendSpec,
    now: chrono::DateTime<chrono::Utc>,
) -> chrono::DateTime<chrono::Utc> {
    let timeout = chrono::Duration::from_std(backend.timeout).unwrap_or_default();
    now - timeout - COMMIT_GRACE
}

/// What an application answers a request with (`POST /api/v1/respond`): the children of the
/// SOAP Body, checked to be well-formed within the message limits; a SOAP Fault (of either
/// version) is answered with HTTP 500. Kept as the Body only: it is written into an envelope
/// of each request's own SOAP version when given.
fn application_answer(body: &str, limits: &Limits) -> Result<CachedAnswer, String> {
    let envelope = write_envelope(SoapVersion::Soap11, Headers::default(), body);
    let read = read_envelope(envelope.as_bytes(), limits).map_err(|d| d.reason)?;
    let Some(root) = read.body.root else {
        return Err("the answer has no element: give the children of the SOAP Body".into());
    };
    let soap_ns = [crate::wsr::model::SOAP11_NS, crate::wsr::model::SOAP12_NS];
    let fault = root.local_name == "Fault"
        && root
            .namespace
            .as_deref()
            .is_some_and(|n| soap_ns.contains(&n));
    Ok(CachedAnswer {
        status: if fault { 500 } else { 200 },
        content_type: String::new(),
        body: Bytes::copy_from_slice(body.as_bytes()),
    })
}

/// Why an application's answer was not kept.
#[derive(Debug)]
pub enum AnswerRefused {
    /// No delivered message at that offset.
    NoSuchMessage,
    /// Its channel is not answered through the API.
    NotAnsweredByApi(String),
    /// The answer is no well-formed SOAP Body content within the limits.
    Invalid(String),
    /// The message has an answer already.
    AnsweredAlready,
    Store(StoreError),
}

impl From<StoreError> for AnswerRefused {
    fn from(e: StoreError) -> AnswerRefused {
        AnswerRefused::Store(e)
    }
}

/// Keeps an application's answer (`response`: the children of the SOAP Body) for the
/// delivered message at `offset` (the spec's Respond): the partner's exchange, and every copy
/// of the request, gets it. The caller has checked that it may settle that delivery.
pub async fn keep_application_answer(
    ctx: Inbound<'_>,
    offset: i64,
    response: &str,
) -> Result<(), AnswerRefused> {
    let entry = ctx
        .store
        .inbox(offset - 1, 1)
        .await?
        .into_iter()
        .find(|e| e.offset == offset)
        .ok_or(AnswerRefused::NoSuchMessage)?;
    match ctx.config.operations.get(&entry.channel) {
        Some(op) if matches!(op.responder, Responder::Api { .. }) => {}
        _ => return Err(AnswerRefused::NotAnsweredByApi(entry.channel)),
    }
    let answer =
        application_answer(response, &ctx.config.limits).map_err(AnswerRefused::Invalid)?;
    let group_id =
        crate::wsr::GroupId::parse(&entry.group_id).map_err(|_| AnswerRefused::NoSuchMessage)?;
    let key = MessageKey {
        group_id,
        number: entry.number,
    };
    // The inbox keeps no peer address: anonymous callers' answers share one source.
    let source = match entry.partner.as_str() {
        "" => "(anonymous)".to_owned(),
        p => super::partner_source(p),
    };
    let retention = ctx.store.policy().answer_polls_for;
    let call = NewCall {
        partner: &entry.partner,
        key: &key,
        channel: &entry.channel,
        source: &source,
        now: ctx.clock.now(),
        keep_until: crate::rmp::exchange::keep_until_from(entry.expiry, retention),
    };
    match ctx.store.answer_request(call, &answer).await? {
        true => Ok(()),
        false => Err(AnswerRefused::AnsweredAlready),
    }
}

fn in_doubt() -> Responded {
    Responded::Fault(
        FaultCode::PermanentProcessingFailure,
        "the outcome of this request at the service is unknown; it is not called again".into(),
    )
}

fn still_out(request: &Request) -> Responded {
    let why = match request.message_order {
        true => "the request waits for an earlier one of its group (or its answer); resend it",
        false => "the request is still being answered; resend it",
    };
    Responded::Fault(FaultCode::MessageProcessingFailure, why.into())
}
