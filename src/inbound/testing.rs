//! A receiving RMP without HTTP, for the services' unit tests: a fresh SQLite store in a
//! temporary folder, a clock set by hand, the built-in configuration, and envelopes written
//! by our own codec.

use bytes::Bytes;
use chrono::{DateTime, TimeZone, Utc};

use super::{Inbound, Outcome, Sender};
use crate::clock::ManualClock;
use crate::config::Config;
use crate::outbound::backend::Backends;
use crate::rmp::agreement::Agreement;
use crate::store::{Endpoints, Store, StoreConfig};
use crate::wsr::{
    GroupId, Headers, MessageId, PollRequest, RefToMessageIds, ReplyPattern, ReplyTo, Request,
    SeqRange, SequenceNum, SoapVersion, read_message, write_envelope,
};

/// The registered callback endpoint of the anonymous caller.
pub const CALLBACK: &str = "http://127.0.0.1:9/callback";

pub struct Rig {
    pub store: Store,
    pub clock: ManualClock,
    pub config: Config,
    pub backends: Backends,
    _dir: tempfile::TempDir,
}

pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 5, 12, 0, 0)
        .single()
        .expect("a valid time")
}

impl Rig {
    pub async fn new() -> Rig {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let config = Config::for_tests(dir.path().join("gateway.db"));
        let store = Store::open(&StoreConfig {
            database: config.database.clone(),
            durability: config.durability,
            policy: config.policy.clone(),
        })
        .await
        .expect("a fresh store");
        Rig {
            store,
            clock: ManualClock::new(t0()),
            backends: Backends::new(&config.operations).expect("backends"),
            config,
            _dir: dir,
        }
    }

    pub fn ctx(&self) -> Inbound<'_> {
        Inbound {
            store: &self.store,
            clock: &self.clock,
            config: &self.config,
            backends: &self.backends,
        }
    }

    /// Registers `CALLBACK` for anonymous callers (D10).
    pub async fn register_callback(&self) {
        let added = self
            .store
            .add_endpoint(Endpoints::Callback, None, CALLBACK, t0())
            .await
            .expect("registered");
        assert!(added);
    }

    /// Posts `bytes` to the `default` channel under `agreement`, as an anonymous sender.
    pub async fn post_under(&self, agreement: &Agreement, bytes: &[u8]) -> Outcome {
        let body = Bytes::copy_from_slice(bytes);
        let read = read_message(None, &body, &self.config.limits);
        let sender = Sender::default();
        let arriving = crate::store::ReceiverStore::arriving(&*self.store);
        let posted = super::receive::Posted {
            body: &body,
            version_hint: SoapVersion::Soap11,
            soap_action: None,
            arriving: &arriving,
        };
        super::receive::receive(self.ctx(), &sender, "default", agreement, posted, read).await
    }

    /// Posts `bytes` to the `default` channel, which offers everything.
    pub async fn post(&self, bytes: &[u8]) -> Outcome {
        self.post_under(&Agreement::everything(), bytes).await
    }
}

/// A reliable message of group `group` (numbered when `number` is given), acked and with
/// duplicate elimination, answered by `pattern`, expiring an hour after `t0`.
pub fn request(group: &str, number: Option<u64>, pattern: ReplyPattern) -> Request {
    Request {
        message_id: MessageId {
            group_id: GroupId::parse(group).expect("a group id"),
            sequence: number.map(|number| SequenceNum {
                number,
                last: false,
                group_limit: None,
            }),
        },
        expiry_time: t0() + chrono::Duration::hours(1),
        reply_pattern: pattern,
        ack_requested: true,
        duplicate_elimination: true,
        message_order: false,
    }
}

pub fn callback() -> ReplyPattern {
    ReplyPattern::Callback(ReplyTo::bare(CALLBACK))
}

/// `request` in a SOAP 1.1 envelope with a one-element Body.
pub fn envelope(request: &Request) -> String {
    let headers = Headers {
        request: Some(request),
        ..Headers::default()
    };
    write_envelope(
        SoapVersion::Soap11,
        headers,
        "<m:Order xmlns:m=\"urn:test\"/>",
    )
}

/// A PollRequest for `number` of `group` (the singleton when `None`), answered in the
/// response or by callback to `reply_to`.
pub fn poll(group: &str, number: Option<u64>, reply_to: Option<&str>) -> String {
    let poll = PollRequest {
        refs: vec![RefToMessageIds {
            group_id: GroupId::parse(group).expect("a group id"),
            ranges: number.map(SeqRange::single).into_iter().collect(),
        }],
        reply_to: reply_to.map(ReplyTo::bare),
    };
    let headers = Headers {
        poll_request: Some(&poll),
        ..Headers::default()
    };
    write_envelope(SoapVersion::Soap11, headers, "")
}
