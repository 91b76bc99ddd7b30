//! A message's delivery steps — its fetch, settle and push — as spans of the trace it came in
//! on (`telemetry`; `store::traces` keeps its context). Nothing is read while traces are not
//! exported: the spans are then `Span::none()` and this costs nothing.

use tracing::Span;

use crate::store::{InboxEntry, Store};

/// `span` made a child of the trace `message` came in on, when one was kept.
pub async fn of_message(store: &Store, span: Span, message: &InboxEntry) -> Span {
    if span.is_none() {
        return span;
    }
    let key = (
        message.partner.clone(),
        message.group_id.clone(),
        message.number.map_or(0, |n| n as i64),
    );
    let parent = store.message_trace(&key).await.unwrap_or_else(|e| {
        tracing::debug!(error = %e, "a message's trace context could not be read");
        None
    });
    crate::telemetry::span_for(span, parent.as_deref())
}

/// `span` made a child of the trace of the message at inbox `offset`, when one was kept.
pub async fn of_offset(store: &Store, span: Span, offset: i64) -> Span {
    if span.is_none() {
        return span;
    }
    let parent = store.offset_trace(offset).await.unwrap_or_else(|e| {
        tracing::debug!(error = %e, "a message's trace context could not be read");
        None
    });
    crate::telemetry::span_for(span, parent.as_deref())
}
