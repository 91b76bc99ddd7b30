//! A PollRequest (D11), alone or riding on a message: acks for delivered messages and faults
//! for faulted ones, nothing for unknown or buffered ones, answered in this response or — with
//! a `ReplyTo` — by callback (D10 applies). Scoped to the polling partner (D14). Never axum.

use super::callback::{self, Refused};
use super::{Answer, Inbound};
use crate::rmp::receive_plan::FAULT_NOTICE_RETENTION;
use crate::rmp::replies::{Replies, ReplyItem, answer_fits, items};
use crate::wsr::{FaultCode, PollRequest, SoapVersion};

/// Answers `poll` for `partner`: into `replies` (this response's `wsrm:Response`), or by
/// callback when it names a ReplyTo. `Err` is the answer for the whole request: the poll
/// could not be answered.
pub async fn answer_into(
    ctx: Inbound<'_>,
    partner: &str,
    version: SoapVersion,
    poll: &PollRequest,
    replies: &mut Replies,
) -> Result<(), Answer> {
    let answer = ctx
        .store
        .poll_answer(partner, &poll.refs)
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "cannot answer a poll");
            poll_later("the poll could not be answered; poll again later")
        })?;
    let Some(answer) = answer else {
        return Ok(());
    };
    if let Err(reason) = answer_fits(&answer, ctx.config.limits.max_references) {
        return Err(Answer::fault(FaultCode::InvalidPollRequest, reason));
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
    match callback::check(ctx, partner, &to.uri).await {
        Ok(()) => {}
        Err(Refused::Unregistered(uri)) => return Err(callback::unregistered(&uri)),
        Err(Refused::Store(e)) => {
            tracing::error!(error = %e, "cannot check a callback endpoint");
            return Err(poll_later("poll again later"));
        }
    }
    let owed: Vec<ReplyItem> = answer.replies.iter().flat_map(items).collect();
    // The poll names no ExpiryTime of its own: its answer is kept as a fault notice is.
    let keep_until = ctx.clock.now() + FAULT_NOTICE_RETENTION;
    callback::owe(ctx, partner, &to.uri, version, &owed, keep_until)
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "cannot queue a poll answer");
            poll_later("poll again later")
        })
}

/// A transient failure of ours: the sender polls again.
fn poll_later(reason: &str) -> Answer {
    Answer::fault(FaultCode::MessageProcessingFailure, reason)
}
