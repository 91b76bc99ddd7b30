//! What every sender of `wsr-gateway bench` shares: a message's key and envelope, one POST
//! and how an attempt ended. A leaf of `bench/`: the load loop and the Callback listener both
//! use it.

use std::time::Duration;

use chrono::Utc;

use super::Shared;
use wsr_gateway::wsr::{
    GroupId, Headers, MessageId, MessageKey, ReplyPattern, Request, SequenceNum, write_envelope,
};

/// How one attempt ended.
pub(super) enum Outcome {
    Acked(Duration),
    Failed(String),
}

pub(super) fn key(shared: &Shared, worker: usize, i: u64, sequenced: bool) -> MessageKey {
    let group = if sequenced {
        format!("mid:bench-{}-g{worker}@wsr-gateway", shared.run)
    } else {
        format!("mid:bench-{}-{worker}-{i}@wsr-gateway", shared.run)
    };
    MessageKey {
        group_id: GroupId::parse(&group).unwrap_or_else(|_| unreachable!("a valid anyURI")),
        number: sequenced.then_some(i),
    }
}

pub(super) fn envelope(
    shared: &Shared,
    key: &MessageKey,
    reply: ReplyPattern,
    ordered: bool,
) -> String {
    let request = Request {
        message_id: MessageId {
            group_id: key.group_id.clone(),
            sequence: key.number.map(|number| SequenceNum {
                number,
                last: false,
                group_limit: None,
            }),
        },
        expiry_time: Utc::now() + chrono::Duration::hours(1),
        reply_pattern: reply,
        ack_requested: true,
        duplicate_elimination: true,
        message_order: ordered,
    };
    // The send time rides in the body, for the e2e latency.
    let body = format!(
        "<b:Load xmlns:b=\"urn:wsr-gateway:bench\" t=\"{}\">{}</b:Load>",
        shared.started.elapsed().as_micros(),
        shared.payload
    );
    write_envelope(
        shared.version,
        Headers {
            request: Some(&request),
            ..Headers::default()
        },
        &body,
    )
}

/// POSTs an envelope; the answer body, or the kind of failure.
pub(super) async fn post(shared: &Shared, xml: String) -> Result<(u16, axum::body::Bytes), String> {
    let mut request = shared
        .client
        .post(&shared.args.url)
        .header("Content-Type", shared.version.content_type());
    if let Some(value) = &shared.args.authorization {
        request = request.header("Authorization", value);
    }
    let answer = request.body(xml).send().await.map_err(|e| {
        if e.is_timeout() {
            "timeout".to_owned()
        } else if e.is_connect() {
            "connect".to_owned()
        } else {
            "transport".to_owned()
        }
    })?;
    let status = answer.status().as_u16();
    let body = answer.bytes().await.map_err(|_| "transport".to_owned())?;
    Ok((status, body))
}
