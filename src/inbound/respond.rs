//! A request to a request-response channel (D16): passed to the channel's SOAP backend once,
//! its business response kept and given, byte for byte, to every copy of the request. The
//! request is delivered when the backend has answered; a copy that arrives while the call is
//! out waits for it (up to the hold); an unknown outcome is called again or failed, as the
//! channel says. The decisions are `rmp::exchange`'s; the agreement and callback checks
//! before, and the answer's rendering after, `receive.rs`'s and `http/wsr.rs`'s.

use std::time::Duration;

use tokio::time::Instant;

use super::Inbound;
use crate::outbound::backend::{BackendSpec, Call, Called, RequestResponse};
use crate::rmp::exchange::{Business, Gate, Judged, OnUnknown, answer_bytes, gate, keep_until};
use crate::rmp::receiver::Verdict;
use crate::rmp::replies::reply_for;
use crate::store::{CachedAnswer, ExchangeState, NewCall, ReceivedMessage, StoreError};
use crate::wsr::splice::without_wsr_blocks;
use crate::wsr::{Envelope, FaultCode, MessageKey, ReplyPattern, Request, Response};

/// How often a copy waiting for a call out elsewhere (another gateway's) looks again.
const LOOK_AGAIN: Duration = Duration::from_millis(20);

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
    pub backend: &'a BackendSpec,
    pub operation: &'a RequestResponse,
    pub env: &'a Envelope<'a>,
    pub request: &'a Request,
    /// The request as the store takes it (not for the inbox: the answer is the delivery).
    pub message: ReceivedMessage,
    /// The SOAPAction the partner sent, passed through.
    pub soap_action: Option<&'a str>,
}

impl Asked<'_> {
    fn key(&self) -> MessageKey {
        self.request.key()
    }

    /// Answers the request: from its kept exchange, by waiting for the call out, or by
    /// calling the backend.
    pub async fn respond(&self) -> Result<Responded, StoreError> {
        let ctx = self.ctx;
        let key = self.key();
        let until = Instant::now() + ctx.config.hold;
        loop {
            let now = ctx.clock.now();
            match ctx.store.exchange(self.partner, &key, now).await? {
                Some(ex) => match (ex.state, ex.answer) {
                    (ExchangeState::Answered, Some(answer)) => {
                        return self.deliver(answer, ex.started_at).await;
                    }
                    (ExchangeState::Answered, None) => {
                        return Err(StoreError::Corrupt(
                            "an answered exchange without its answer".into(),
                        ));
                    }
                    (ExchangeState::InDoubt, _) => return Ok(in_doubt()),
                    (ExchangeState::Calling, _) if ex.started_at < self.stale_before(now) => {
                        if let Some(done) = self.unknown_outcome().await? {
                            return Ok(done);
                        }
                    }
                    (ExchangeState::Calling, _) => {}
                },
                None => {
                    let group_id = key.group_id.as_str();
                    let group = ctx.store.group(self.partner, group_id).await?;
                    let skew = ctx.store.policy().clock_skew;
                    match gate(group.as_ref(), self.request, now, skew) {
                        Gate::AsOneWay => return Ok(Responded::AsOneWay),
                        Gate::AheadOfGap => {}
                        Gate::Open => {
                            if let Some(refused) = self.over_quota().await? {
                                return Ok(refused);
                            }
                            if self.begin(None).await? {
                                return self.call().await;
                            }
                            // Another copy began the call just now: wait for it.
                        }
                    }
                }
            }
            if Instant::now() + LOOK_AGAIN > until {
                return Ok(still_out(self.request));
            }
            tokio::time::sleep(LOOK_AGAIN).await;
        }
    }

    /// A call started before this was made by a gateway that gave up on it or died: its
    /// outcome is unknown. `None`: another copy took it over first.
    async fn unknown_outcome(&self) -> Result<Option<Responded>, StoreError> {
        let key = self.key();
        match self.operation.on_unknown {
            OnUnknown::Fail => {
                self.ctx
                    .store
                    .call_unknown(self.partner, &key, true)
                    .await?;
                Ok(Some(in_doubt()))
            }
            OnUnknown::Retry => {
                let now = self.ctx.clock.now();
                match self.begin(Some(self.stale_before(now))).await? {
                    true => self.call().await.map(Some),
                    false => Ok(None),
                }
            }
        }
    }

    /// Calls before this are no longer out: past their timeout and a grace for the commit.
    fn stale_before(&self, now: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
        let timeout = chrono::Duration::from_std(self.backend.timeout).unwrap_or_default();
        now - timeout - COMMIT_GRACE
    }

    async fn begin(
        &self,
        take_over_before: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<bool, StoreError> {
        let key = self.key();
        let policy = self.ctx.store.policy();
        let call = NewCall {
            partner: self.partner,
            key: &key,
            channel: self.channel,
            source: self.source,
            now: self.ctx.clock.now(),
            keep_until: keep_until(self.request, policy.answer_polls_for),
        };
        self.ctx.store.begin_call(call, take_over_before).await
    }

    /// Cached answers count against the source's byte quota: beyond it, no call.
    async fn over_quota(&self) -> Result<Option<Responded>, StoreError> {
        let quota = self.ctx.config.max_answer_bytes_per_source;
        let now = self.ctx.clock.now();
        let held = self.ctx.store.answer_bytes_of(self.source, now).await?;
        Ok((held >= quota).then(|| {
            Responded::Fault(
                FaultCode::MessageProcessingFailure,
                format!(
                    "this sender's kept answers take {held} bytes, the quota is {quota}: \
                     resend once earlier requests have expired"
                ),
            )
        }))
    }

    /// The call: the envelope without its WS-R blocks, the idempotency headers; then the
    /// judged answer kept, forgotten, or marked unknown.
    async fn call(&self) -> Result<Responded, StoreError> {
        let ctx = self.ctx;
        let key = self.key();
        let envelope = match without_wsr_blocks(self.env.text) {
            Ok(envelope) => envelope,
            Err(why) => {
                ctx.store.call_failed(self.partner, &key).await?;
                return Ok(Responded::Fault(FaultCode::MessageProcessingFailure, why));
            }
        };
        let call = Call {
            channel: self.channel,
            envelope,
            version: self.env.version,
            soap_action: self.soap_action,
            idempotency: crate::rmp::exchange::idempotency_headers(self.request),
        };
        let cap = ctx.config.limits.max_bytes;
        match ctx.backends.call(call, ctx.config.hold, cap).await {
            Called::Busy => {
                ctx.store.call_failed(self.partner, &key).await?;
                Ok(Responded::Fault(
                    FaultCode::MessageProcessingFailure,
                    "the service is busy with other requests; resend it later".into(),
                ))
            }
            Called::Judged(Judged::Business(business)) => {
                let answer = self.answer_of(&business);
                ctx.store.call_answered(self.partner, &key, &answer).await?;
                self.deliver(answer, self.message.now).await
            }
            Called::Judged(Judged::NotDelivered(why)) => {
                tracing::info!(channel = self.channel, %key, reason = %why, "the service did not take the request");
                ctx.store.call_failed(self.partner, &key).await?;
                Ok(Responded::Fault(
                    FaultCode::MessageProcessingFailure,
                    "the service could not be reached; resend it later".into(),
                ))
            }
            Called::Judged(Judged::Unknown(why)) => {
                tracing::warn!(channel = self.channel, %key, reason = %why, "the outcome of a call to the service is unknown");
                let fail = self.operation.on_unknown == OnUnknown::Fail;
                ctx.store.call_unknown(self.partner, &key, fail).await?;
                Ok(match fail {
                    true => in_doubt(),
                    false => Responded::Fault(
                        FaultCode::MessageProcessingFailure,
                        "the service's answer did not come; resend it".into(),
                    ),
                })
            }
        }
    }

    /// The bytes every copy gets: under Response, with the ack (when asked for) in the header.
    fn answer_of(&self, business: &Business) -> CachedAnswer {
        let request = self.request;
        let ack =
            (request.reply_pattern == ReplyPattern::Response && request.ack_requested).then(|| {
                Response {
                    replies: vec![reply_for(&request.key(), None)],
                }
            });
        CachedAnswer {
            status: business.status,
            content_type: business.content_type.clone(),
            body: answer_bytes(business, ack.as_ref()),
        }
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
        Ok(match received.verdict {
            Verdict::Fault(code, reason) => Responded::Fault(code, reason),
            Verdict::Ack | Verdict::NoAck => Responded::Answer(answer),
        })
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
