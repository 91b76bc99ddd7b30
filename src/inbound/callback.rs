//! The Callback pattern on the receiving side (D10): a `ReplyTo` is used only when it is a
//! callback endpoint registered for the partner, and what we owe it is queued in the store for
//! the callback worker (`outbound::callbacks`). One check for messages, defects and polls.

use chrono::{DateTime, Utc};

use super::{Answer, Inbound};
use crate::rmp::replies::ReplyItem;
use crate::store::StoreError;
use crate::wsr::{FaultCode, SoapVersion};

/// Why a `ReplyTo` cannot be used.
#[derive(Debug)]
pub enum Refused {
    /// Not a registered callback endpoint of this partner: refused synchronously (D10).
    Unregistered(String),
    /// The registry could not be read.
    Store(StoreError),
}

/// Whether `uri` is a callback endpoint registered for `partner`.
pub async fn check(ctx: Inbound<'_>, partner: &str, uri: &str) -> Result<(), Refused> {
    match ctx.store.is_callback_endpoint(partner, uri).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(Refused::Unregistered(uri.to_owned())),
        Err(e) => Err(Refused::Store(e)),
    }
}

/// The synchronous fault for a `ReplyTo` nobody registered.
pub fn unregistered(uri: &str) -> Answer {
    Answer::fault(
        FaultCode::InvalidReplyPattern,
        format!("ReplyTo {uri} is not a registered callback endpoint"),
    )
}

/// Queues `items` (acks and faults) for `partner`'s registered endpoint `uri`, in the SOAP
/// version of the request they answer, kept (and retried) until `keep_until`.
pub async fn owe(
    ctx: Inbound<'_>,
    partner: &str,
    uri: &str,
    version: SoapVersion,
    items: &[ReplyItem],
    keep_until: DateTime<Utc>,
) -> Result<(), StoreError> {
    let soap12 = version == SoapVersion::Soap12;
    let now = ctx.clock.now();
    ctx.store
        .owe_callbacks(partner, uri, soap12, items, keep_until, now)
        .await
}
