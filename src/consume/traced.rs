//! A message's delivery steps — its fetch, settle and push — as spans of the trace it came in
//! on (`telemetry`; `store::traces` keeps its context). Nothing is read while traces are not
//! exported: the spans are then `Span::none()` and this costs nothing.

use tracing::Span;

use crate::store::traces::message_key;
use crate::store::{InboxEntry, Store};
use crate::telemetry::{child_of, traced};

/// `span` made a child of the trace `message` came in on, when one was kept.
pub async fn of_message(store: &Store, span: Span, message: &InboxEntry) -> Span {
    let key = message_key(&message.partner, &message.group_id, message.number);
    child_of(span, store.message_trace(&key)).await
}

/// Marks in each handed-out message's own trace that `session` fetched it, now.
pub async fn fetched<'a>(
    store: &Store,
    session: &str,
    messages: impl Iterator<Item = &'a InboxEntry>,
) {
    for m in messages {
        let span = traced!("delivery.fetch", offset = m.offset, session = %session);
        drop(of_message(store, span, m).await);
    }
}

/// One span per settled message, in the trace of the message it settles; they end when the
/// caller drops them (after the commit).
pub async fn settling(store: &Store, offsets: impl Iterator<Item = i64>) -> Vec<Span> {
    let mut spans = Vec::new();
    for offset in offsets {
        let span = traced!("delivery.settle", offset = offset);
        spans.push(child_of(span, store.offset_trace(offset)).await);
    }
    spans
}
