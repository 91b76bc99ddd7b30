//! An operator's word on one outbound message — resend it now, or fail it — as the admin API
//! (and so the console and the CLI) asks: read the message, let the pure rule decide
//! (`Outbound::resend_now`, `Outbound::fail_by_operator`), save it fenced as every decision
//! of the sender is (`OutboundStore::save_outbound`), and read it back to tell whether it
//! held: an ack, or another gateway's attempt, may have come between the read and the save.

use chrono::{DateTime, Utc};

use crate::rmp::sender::OperatorRefusal;
use crate::store::outbound::OutMessage;
use crate::store::{Store, StoreError};

/// The longest reason an operator may give: it is stored with the message and shown in
/// answers, pages and logs.
pub const MAX_REASON_BYTES: usize = 1000;

/// Whether `why` may be kept as an operator's reason for a fail; what is wrong otherwise.
/// Every door (the API, the console) checks it before `act`.
pub fn check_reason(why: &str) -> Result<(), String> {
    if why.len() > MAX_REASON_BYTES {
        return Err(format!("at most {MAX_REASON_BYTES} bytes"));
    }
    if why.chars().any(char::is_control) {
        return Err("no control characters".to_owned());
    }
    Ok(())
}

/// What the operator asks.
#[derive(Debug, Clone, Copy)]
pub enum OperatorAction<'a> {
    /// One attempt now, with the same identity (even past the schedule's last).
    Resend,
    /// End it `failed`, saying who and why.
    Fail { operator: &'a str, why: &'a str },
}

/// Why an operator's action did not apply.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("no message {0}")]
    NotFound(String),
    #[error(transparent)]
    Refused(#[from] OperatorRefusal),
    /// The message changed between the read and the save; it is now as `OutMessage` says.
    #[error("the message changed meanwhile (it is now {}); look at it again", .0.outbound.state.name())]
    Changed(Box<OutMessage>),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Applies `action` to message `id` at `now`; the message as saved.
pub async fn act(
    store: &Store,
    id: &str,
    action: OperatorAction<'_>,
    now: DateTime<Utc>,
) -> Result<OutMessage, ActionError> {
    let not_found = || ActionError::NotFound(id.to_owned());
    let message = store.out_message(id).await?.ok_or_else(not_found)?;
    let before = message.outbound.clone();
    let mut after = before.clone();
    match action {
        OperatorAction::Resend => after.resend_now(now)?,
        OperatorAction::Fail { operator, why } => after.fail_by_operator(operator, why)?,
    }
    store.save_outbound(id, &before.state, &after, now).await?;
    let saved = store.out_message(id).await?.ok_or_else(not_found)?;
    let now_is = &saved.outbound;
    let held = match action {
        OperatorAction::Fail { .. } => now_is.state == after.state,
        // Due now as decided (stored to the millisecond), or already sent again.
        OperatorAction::Resend => {
            !now_is.state.is_final()
                && (now_is.attempts > before.attempts
                    || now_is.next_attempt.is_some_and(|t| t <= now))
        }
    };
    if held {
        Ok(saved)
    } else {
        Err(ActionError::Changed(Box::new(saved)))
    }
}

/// Why an operator's "send again" was not done.
#[derive(Debug, thiserror::Error)]
pub enum SendAgainError {
    #[error("no message {0}")]
    NotFound(String),
    #[error(transparent)]
    Refused(#[from] OperatorRefusal),
    /// The new message cannot be made or stored (its destination is no longer allowed, …).
    #[error("{0}")]
    Submit(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Sends the ended (failed or faulted) message `id` again as a new message
/// (`submit::again`), on `operator`'s word; the new message as stored. Logged, and both
/// messages' histories name the other.
pub async fn send_again(
    sending: crate::outbound::submit::Sending<'_>,
    id: &str,
    operator: &str,
    now: DateTime<Utc>,
) -> Result<crate::store::outbound::Submitted, SendAgainError> {
    use crate::outbound::submit::{Refusal, again};
    use crate::store::outbound::SubmitError;
    let old = sending
        .store
        .out_message(id)
        .await?
        .ok_or_else(|| SendAgainError::NotFound(id.to_owned()))?;
    old.outbound.state.may_send_again()?;
    let refused = |refusal: Refusal| match refusal {
        Refusal::Invalid { field, reason } => SendAgainError::Submit(format!("{field}: {reason}")),
        Refusal::Store(SubmitError::Store(e)) => SendAgainError::Store(e),
        Refusal::Store(other) => SendAgainError::Submit(other.to_string()),
    };
    let submission = again(sending, &old, operator, now).await.map_err(refused)?;
    let submitted = sending
        .store
        .submit(submission, now)
        .await
        .map_err(|e| refused(Refusal::Store(e)))?;
    tracing::info!(%operator, from = %id, to = %submitted.id, "operator sent a message again");
    Ok(submitted)
}

/// Messages in doubt (`Outbound::in_doubt`), by destination partner ("" for a URL
/// destination), for the console's overview.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InDoubt {
    pub by_partner: std::collections::BTreeMap<String, u64>,
    /// Every message a poll may settle was looked at; otherwise the counts are floors.
    pub complete: bool,
}

/// Counts the messages in doubt by the pure rule, reading the ones a poll may settle
/// (`OutboundStore::awaiting_poll`) a page at a time, at most `most` of them.
pub async fn in_doubt_by_partner(store: &Store, most: usize) -> Result<InDoubt, StoreError> {
    const PAGE: usize = 500;
    let mut counted = InDoubt::default();
    let mut after = String::new();
    let mut looked = 0;
    while looked < most {
        let page = store.awaiting_poll(&after, PAGE as i64).await?;
        looked += page.len();
        for m in page.iter().filter(|m| m.outbound.in_doubt()) {
            *counted.by_partner.entry(m.partner.clone()).or_default() += 1;
        }
        match page.last() {
            Some(last) if page.len() == PAGE => after.clone_from(&last.id),
            _ => {
                counted.complete = true;
                break;
            }
        }
    }
    Ok(counted)
}
