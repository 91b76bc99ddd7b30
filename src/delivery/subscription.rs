//! What a subscription is (DESIGN §5): its identity and filter, and the delivery rules an
//! application chose when it created it. Pure: the API hands in the JSON it received, this
//! says what is wrong with it — field by field — or gives the checked rules the store keeps.

use chrono::Duration;
use serde::{Deserialize, Serialize};

use super::filter::SubscriptionId;
use super::lease::{Outcome, Policy};

/// How an application takes messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "mode")]
pub enum Mode {
    /// Consumer sessions fetch.
    Pull,
    /// The gateway POSTs each message to a registered webhook.
    Push {
        url: String,
        concurrency: u32,
        /// What is POSTed; rules stored before formats existed read as JSON.
        #[serde(default)]
        format: PushFormat,
        /// Paused by its owner or an operator (a webhook that is broken): nothing is POSTed
        /// until it is resumed; messages wait in the subscription meanwhile.
        #[serde(default)]
        paused: bool,
    },
}

/// What a push subscription POSTs (DESIGN §5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PushFormat {
    /// The message as the fetch API shows it, plus the attempt (a JSON webhook).
    #[default]
    Json,
    /// A SOAP envelope in the message's SOAP version around the Body as received, to a SOAP
    /// endpoint; a SOAP Fault in the answer rejects it.
    Soap,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SettleMode {
    /// At-least-once: a delivery stays leased until settled or its deadline passes.
    Unsettled,
    /// At-most-once: settled the moment it is sent, with the default outcome.
    Settled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ordering {
    None,
    /// One message of a WS-R group in flight at a time, in sequence order.
    Group,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Start {
    /// Only messages delivered after the subscription was created.
    New,
    /// Every message still retained in the inbox.
    Oldest,
}

/// The default outcome by name, as stored and shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DefaultOutcome {
    Accepted,
    Rejected,
    Released,
    Modified,
}

impl DefaultOutcome {
    pub fn outcome(self) -> Outcome {
        match self {
            DefaultOutcome::Accepted => Outcome::Accepted,
            DefaultOutcome::Rejected => Outcome::Rejected,
            DefaultOutcome::Released => Outcome::Released,
            DefaultOutcome::Modified => Outcome::Modified {
                delivery_failed: true,
                undeliverable_here: false,
                delay: None,
            },
        }
    }
}

/// The checked rules of one subscription, kept by the store as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rules {
    #[serde(flatten)]
    pub mode: Mode,
    pub settle_mode: SettleMode,
    pub default_outcome: DefaultOutcome,
    pub ack_wait_ms: u64,
    pub max_deliveries: u32,
    pub backoff_ms: Vec<u64>,
    pub ordering: Ordering,
    pub durable: bool,
}

impl Rules {
    /// These rules with the push paused or resumed; a pull subscription has no push to pause.
    pub fn with_push_paused(mut self, pause: bool) -> Result<Rules, String> {
        match &mut self.mode {
            Mode::Push { paused, .. } => {
                *paused = pause;
                Ok(self)
            }
            Mode::Pull => Err("a pull subscription has no push to pause or resume".to_owned()),
        }
    }

    /// Whether it is a push subscription that is paused.
    pub fn push_paused(&self) -> bool {
        matches!(self.mode, Mode::Push { paused: true, .. })
    }

    pub fn policy(&self) -> Policy {
        Policy {
            ack_wait: millis(self.ack_wait_ms),
            max_deliveries: self.max_deliveries,
            backoff: self.backoff_ms.iter().map(|ms| millis(*ms)).collect(),
        }
    }
}

fn millis(ms: u64) -> Duration {
    Duration::milliseconds(ms.min(i64::MAX as u64) as i64)
}

/// A create request as the API receives it; every field but the name has a default.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    pub name: String,
    pub filter: Option<String>,
    pub mode: Option<String>,
    pub push_url: Option<String>,
    pub push_concurrency: Option<u32>,
    pub push_format: Option<PushFormat>,
    pub settle_mode: Option<SettleMode>,
    pub default_outcome: Option<String>,
    pub ack_wait_ms: Option<u64>,
    pub max_deliveries: Option<u32>,
    pub backoff_ms: Option<Vec<u64>>,
    pub ordering: Option<Ordering>,
    pub durable: Option<bool>,
    pub start: Option<Start>,
}

/// Why a create request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The field's value is not valid (HTTP 400 `invalid-field`).
    #[error("{field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    /// A value this gateway does not implement (HTTP 501 `not-implemented`).
    #[error("{field}: {reason}")]
    NotImplemented { field: &'static str, reason: String },
}

fn invalid(field: &'static str, reason: impl Into<String>) -> SpecError {
    SpecError::Invalid {
        field,
        reason: reason.into(),
    }
}

pub const DEFAULT_ACK_WAIT_MS: u64 = 30_000;
pub const DEFAULT_MAX_DELIVERIES: u32 = 5;
pub const DEFAULT_BACKOFF_MS: [u64; 3] = [1_000, 10_000, 60_000];
pub const DEFAULT_PUSH_CONCURRENCY: u32 = 8;
const MAX_ACK_WAIT_MS: u64 = 12 * 3600 * 1000;
const MAX_PUSH_CONCURRENCY: u32 = 256;

/// A checked create request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub id: SubscriptionId,
    pub rules: Rules,
    pub start: Start,
}

impl CreateRequest {
    pub fn check(self) -> Result<Spec, SpecError> {
        let id = SubscriptionId::parse(&self.name, self.filter.as_deref())
            .map_err(|e| invalid("name", e.to_string()))?;
        let default_outcome = match self.default_outcome.as_deref() {
            None | Some("accepted") => DefaultOutcome::Accepted,
            Some("rejected") => DefaultOutcome::Rejected,
            Some("released") => DefaultOutcome::Released,
            Some("modified") => DefaultOutcome::Modified,
            // AMQP's `received` is not a terminal outcome: nothing could ever settle with it.
            Some("received") => {
                return Err(invalid(
                    "default_outcome",
                    "\"received\" is not a terminal outcome; use accepted, rejected, released or modified",
                ));
            }
            Some(other) => {
                return Err(SpecError::NotImplemented {
                    field: "default_outcome",
                    reason: format!("outcome {other:?} is not implemented"),
                });
            }
        };
        let mode = match self.mode.as_deref() {
            None | Some("pull") => {
                if self.push_url.is_some()
                    || self.push_concurrency.is_some()
                    || self.push_format.is_some()
                {
                    return Err(invalid(
                        "push_url",
                        "only a push subscription has a webhook",
                    ));
                }
                Mode::Pull
            }
            Some("push") => {
                let url = self
                    .push_url
                    .ok_or_else(|| invalid("push_url", "a push subscription needs a webhook"))?;
                let concurrency = self.push_concurrency.unwrap_or(DEFAULT_PUSH_CONCURRENCY);
                if !(1..=MAX_PUSH_CONCURRENCY).contains(&concurrency) {
                    return Err(invalid(
                        "push_concurrency",
                        format!("must be 1 to {MAX_PUSH_CONCURRENCY}"),
                    ));
                }
                Mode::Push {
                    url,
                    concurrency,
                    format: self.push_format.unwrap_or_default(),
                    paused: false,
                }
            }
            Some(other) => {
                return Err(invalid(
                    "mode",
                    format!("{other:?} is not \"pull\" or \"push\""),
                ));
            }
        };
        let ack_wait_ms = self.ack_wait_ms.unwrap_or(DEFAULT_ACK_WAIT_MS);
        if !(1..=MAX_ACK_WAIT_MS).contains(&ack_wait_ms) {
            return Err(invalid(
                "ack_wait_ms",
                format!("must be 1 to {MAX_ACK_WAIT_MS}"),
            ));
        }
        let max_deliveries = self.max_deliveries.unwrap_or(DEFAULT_MAX_DELIVERIES);
        if max_deliveries == 0 {
            return Err(invalid("max_deliveries", "must be at least 1"));
        }
        let backoff_ms = self
            .backoff_ms
            .unwrap_or_else(|| DEFAULT_BACKOFF_MS.to_vec());
        if backoff_ms.len() > 32 || backoff_ms.iter().any(|ms| *ms > MAX_ACK_WAIT_MS) {
            return Err(invalid(
                "backoff_ms",
                format!("at most 32 waits of at most {MAX_ACK_WAIT_MS} ms"),
            ));
        }
        let settle_mode = self.settle_mode.unwrap_or(SettleMode::Unsettled);
        if settle_mode == SettleMode::Settled && matches!(mode, Mode::Push { .. }) {
            return Err(invalid(
                "settle_mode",
                "a push subscription settles by the webhook's answer",
            ));
        }
        Ok(Spec {
            id,
            rules: Rules {
                mode,
                settle_mode,
                default_outcome,
                ack_wait_ms,
                max_deliveries,
                backoff_ms,
                ordering: self.ordering.unwrap_or(Ordering::None),
                durable: self.durable.unwrap_or(true),
            },
            start: self.start.unwrap_or(Start::New),
        })
    }
}

impl Start {
    /// The subscription's first cursor (every offset up to it counts as matched), given the
    /// newest offset in the inbox.
    pub fn cursor(self, newest: i64) -> i64 {
        match self {
            Start::Oldest => 0,
            Start::New => newest,
        }
    }
}

impl Spec {
    /// Whether `owner` asking for this subscription again may have the existing one (same
    /// owner, same rules and filter). The identity of a subscription belongs to its owner:
    /// another principal naming it gets a refusal, never a way in.
    pub fn again(
        &self,
        owner: &str,
        existing_owner: &str,
        existing_filter: &str,
        existing_rules: &Rules,
    ) -> Result<(), String> {
        let name = self.id.to_string();
        if existing_owner != owner {
            return Err(format!(
                "subscription {name:?} belongs to another application"
            ));
        }
        if *existing_rules != self.rules || existing_filter != self.id.filter().as_str() {
            return Err(format!(
                "subscription {name:?} exists with other rules; delete it first"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(name: &str) -> CreateRequest {
        CreateRequest {
            name: name.into(),
            filter: Some("orders/#".into()),
            ..CreateRequest::default()
        }
    }

    #[test]
    fn defaults_are_pull_unsettled_accepted_durable_from_new() {
        let spec = request("billing").check().expect("valid");
        assert_eq!(spec.rules.mode, Mode::Pull);
        assert_eq!(spec.rules.settle_mode, SettleMode::Unsettled);
        assert_eq!(spec.rules.default_outcome, DefaultOutcome::Accepted);
        assert_eq!(spec.rules.ordering, Ordering::None);
        assert!(spec.rules.durable);
        assert_eq!(spec.start, Start::New);
        assert_eq!(spec.rules.policy().ack_wait, Duration::seconds(30));
    }

    #[test]
    fn received_is_an_invalid_default_outcome_and_an_unknown_one_is_not_implemented() {
        let mut r = request("billing");
        r.default_outcome = Some("received".into());
        assert!(matches!(
            r.check(),
            Err(SpecError::Invalid {
                field: "default_outcome",
                ..
            })
        ));
        let mut r = request("billing");
        r.default_outcome = Some("transferred".into());
        assert!(matches!(
            r.check(),
            Err(SpecError::NotImplemented {
                field: "default_outcome",
                ..
            })
        ));
    }

    #[test]
    fn push_needs_a_url_and_pull_refuses_one() {
        let mut r = request("hook");
        r.mode = Some("push".into());
        assert!(matches!(
            r.clone().check(),
            Err(SpecError::Invalid {
                field: "push_url",
                ..
            })
        ));
        r.push_url = Some("http://127.0.0.1:9/hook".into());
        assert!(matches!(
            r.check().expect("valid").rules.mode,
            Mode::Push { concurrency: 8, .. }
        ));
        let mut r = request("pull");
        r.push_url = Some("http://127.0.0.1:9/hook".into());
        assert!(r.check().is_err());
        let mut r = request("pull");
        r.push_format = Some(PushFormat::Soap);
        assert!(r.check().is_err(), "only a push subscription has a format");
    }

    #[test]
    fn push_delivers_json_unless_asked_for_soap_and_old_rules_read_as_json() {
        let mut r = request("hook");
        r.mode = Some("push".into());
        r.push_url = Some("http://127.0.0.1:9/hook".into());
        assert!(matches!(
            r.clone().check().expect("valid").rules.mode,
            Mode::Push {
                format: PushFormat::Json,
                ..
            }
        ));
        r.push_format = Some(PushFormat::Soap);
        let rules = r.check().expect("valid").rules;
        let json = serde_json::to_value(&rules).expect("encodes");
        assert_eq!(json["format"], "soap");
        let mut old = json;
        if let Some(o) = old.as_object_mut() {
            o.remove("format");
        }
        let old: Rules = serde_json::from_value(old).expect("decodes");
        assert!(matches!(
            old.mode,
            Mode::Push {
                format: PushFormat::Json,
                ..
            }
        ));
    }

    #[test]
    fn zero_ack_wait_and_zero_max_deliveries_are_refused() {
        let mut r = request("a");
        r.ack_wait_ms = Some(0);
        assert!(r.check().is_err());
        let mut r = request("a");
        r.max_deliveries = Some(0);
        assert!(r.check().is_err());
    }

    #[test]
    fn rules_round_trip_through_their_stored_json() {
        let mut r = request("hook");
        r.mode = Some("push".into());
        r.push_url = Some("http://127.0.0.1:9/hook".into());
        r.ordering = Some(Ordering::Group);
        let rules = r.check().expect("valid").rules;
        let json = serde_json::to_string(&rules).expect("encodes");
        assert_eq!(
            serde_json::from_str::<Rules>(&json).expect("decodes"),
            rules
        );
    }

    #[test]
    fn asking_again_gets_the_same_subscription_only_for_its_owner_with_its_rules() {
        let spec = request("billing").check().expect("valid");
        let filter = spec.id.filter().as_str().to_owned();
        assert_eq!(spec.again("app", "app", &filter, &spec.rules), Ok(()));
        let theirs = spec.again("intruder", "app", &filter, &spec.rules);
        assert!(theirs.expect_err("refused").contains("another application"));
        let mut other = spec.rules.clone();
        other.max_deliveries += 1;
        assert!(spec.again("app", "app", &filter, &other).is_err());
        assert_eq!(Start::Oldest.cursor(42), 0);
        assert_eq!(Start::New.cursor(42), 42);
    }
}
