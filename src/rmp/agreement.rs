//! Agreements, both ways: a channel's (D9: which features it offers and which it requires; a
//! message asking for something not offered gets `FeatureNotSupported`, one omitting something
//! required gets `InvalidMessageParameters`), and the terms our own messages are sent on
//! (DESIGN §6: what a named, partner's or inline agreement leaves out comes from the default
//! one, then from the built-in defaults). Pure: it never reads a file or the clock; the
//! configuration only deserializes the terms (`config::AgreementSpec`).

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::rmp::quota::SourceQuota;
use crate::rmp::sender::{LONGEST_WAIT, RetrySchedule};
use crate::wsr::datetime::saturating_add;
use crate::wsr::{FaultCode, GroupLimit, ReplyPattern, ReplyTo, Request};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Feature {
    AckRequested,
    DuplicateElimination,
    MessageOrder,
    Response,
    Callback,
    Poll,
}

impl Feature {
    pub const ALL: [Feature; 6] = [
        Feature::AckRequested,
        Feature::DuplicateElimination,
        Feature::MessageOrder,
        Feature::Response,
        Feature::Callback,
        Feature::Poll,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Feature::AckRequested => "AckRequested",
            Feature::DuplicateElimination => "DuplicateElimination",
            Feature::MessageOrder => "MessageOrder",
            Feature::Response => "Response",
            Feature::Callback => "Callback",
            Feature::Poll => "Poll",
        }
    }

    pub fn parse(name: &str) -> Option<Feature> {
        Feature::ALL.into_iter().find(|f| f.name() == name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agreement {
    pub offers: Vec<Feature>,
    pub requires: Vec<Feature>,
    /// How far ahead an ExpiryTime may lie. Every channel has one (D13): a date from the wire
    /// far in the future is refused here, before anything is stored or computed from it.
    pub expiry_horizon: chrono::Duration,
    /// How far ahead a group's own time limit may reach: its `groupExpiryTime`, or its
    /// `groupMaxIdleDuration` counted from now.
    pub group_lifetime: chrono::Duration,
    /// What one source may keep stored through this channel, and how fast (D13).
    pub quota: SourceQuota,
}

fn reply_feature(pattern: &ReplyPattern) -> Feature {
    match pattern {
        ReplyPattern::Response => Feature::Response,
        ReplyPattern::Callback(_) => Feature::Callback,
        ReplyPattern::Poll => Feature::Poll,
    }
}

/// The horizon and group lifetime of a channel that names none (30 days).
pub const DEFAULT_HORIZON: chrono::Duration = chrono::Duration::days(30);

impl Agreement {
    /// Every feature offered, nothing required, the default horizons: the default channel.
    pub fn everything() -> Agreement {
        Agreement {
            offers: Feature::ALL.to_vec(),
            requires: Vec::new(),
            expiry_horizon: DEFAULT_HORIZON,
            group_lifetime: DEFAULT_HORIZON,
            quota: SourceQuota::DEFAULT,
        }
    }

    /// How long a fault decided before the store (a refusal by this agreement) is kept, and
    /// its callback retried: until the message expires, but never beyond the horizon — the
    /// refused ExpiryTime may be the year 262142.
    pub fn fault_kept_until(&self, expiry: DateTime<Utc>, now: DateTime<Utc>) -> DateTime<Utc> {
        expiry.min(saturating_add(now, self.expiry_horizon))
    }

    /// This agreement as it applies to one partner (its own `offers`/`requires`, D14): only
    /// what both offer, everything either requires.
    pub fn for_partner(&self, offers: Option<&[Feature]>, requires: &[Feature]) -> Agreement {
        let mut narrowed = self.clone();
        if let Some(offers) = offers {
            narrowed.offers.retain(|f| offers.contains(f));
        }
        for f in requires {
            if !narrowed.requires.contains(f) {
                narrowed.requires.push(*f);
            }
        }
        narrowed
    }

    /// A message whose reply pattern is not offered cannot be answered by that pattern: its
    /// `FeatureNotSupported` goes back synchronously, as a SOAP Fault (D4). Without this the
    /// fault would go out by the very pattern refused (a callback nobody agreed to, or a
    /// poll answer), and the HTTP answer would be a 202 that says all is well.
    pub fn unusable_reply_pattern(&self, request: &Request) -> Option<(FaultCode, String)> {
        let pattern = reply_feature(&request.reply_pattern);
        (!self.offers.contains(&pattern)).then(|| {
            (
                FaultCode::FeatureNotSupported,
                format!(
                    "this channel does not offer the {} reply pattern",
                    pattern.name()
                ),
            )
        })
    }

    /// Checks a message against the agreement.
    pub fn check(&self, request: &Request, now: DateTime<Utc>) -> Result<(), (FaultCode, String)> {
        let reply = reply_feature(&request.reply_pattern);
        let asked = [
            (request.ack_requested, Feature::AckRequested),
            (request.duplicate_elimination, Feature::DuplicateElimination),
            (request.message_order, Feature::MessageOrder),
            (true, reply),
        ];
        for (on, feature) in asked {
            if on && !self.offers.contains(&feature) {
                return Err((
                    FaultCode::FeatureNotSupported,
                    format!("this channel does not offer {}", feature.name()),
                ));
            }
        }
        for required in &self.requires {
            let present = asked.iter().any(|(on, f)| *on && f == required);
            if !present {
                return Err((
                    FaultCode::InvalidMessageParameters,
                    format!("this channel requires {}", required.name()),
                ));
            }
        }
        if request.expiry_time > saturating_add(now, self.expiry_horizon) {
            return Err((
                FaultCode::InvalidExpiryTime,
                format!(
                    "ExpiryTime is further ahead than this channel allows ({} s)",
                    self.expiry_horizon.num_seconds()
                ),
            ));
        }
        let latest_end = saturating_add(now, self.group_lifetime);
        let group_limit = request
            .message_id
            .sequence
            .as_ref()
            .and_then(|s| s.group_limit.as_ref());
        let (limit_name, group_end) = match group_limit {
            None => return Ok(()),
            Some(GroupLimit::ExpiryTime(t)) => ("groupExpiryTime", Some(*t)),
            // An idle limit too large to add to a date is beyond any lifetime.
            Some(GroupLimit::MaxIdleDuration(d)) => ("groupMaxIdleDuration", d.add_to(now)),
        };
        if group_end.is_none_or(|end| end > latest_end) {
            return Err((
                FaultCode::InvalidMessageParameters,
                format!(
                    "{limit_name} reaches further ahead than this channel allows for a group ({} s)",
                    self.group_lifetime.num_seconds()
                ),
            ));
        }
        Ok(())
    }
}

/// The largest retry backoff factor of a submitted message.
const MAX_BACKOFF: u32 = 10;

/// The terms our own messages are sent on, as an agreement gives them (named in the config or
/// given inline per submission): each may be left out. `check` fills what is still missing
/// with the built-in defaults (acknowledged, duplicate elimination, Response, one hour, 8
/// attempts 2 s apart doubling). An application's inline agreement is read into it as it is
/// (unknown fields refused).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendTerms {
    pub ack_requested: Option<bool>,
    pub duplicate_elimination: Option<bool>,
    pub message_order: Option<bool>,
    /// "Response", "Callback" or "Poll".
    pub reply_pattern: Option<String>,
    /// ExpiryTime = submission time + this.
    pub expiry_seconds: Option<u64>,
    /// Either max_attempts + interval_ms + backoff, or an explicit list of waits.
    pub max_attempts: Option<u32>,
    pub interval_ms: Option<u64>,
    pub backoff: Option<u32>,
    pub waits_ms: Option<Vec<u64>>,
}

/// The reply pattern an agreement asks for, before it is bound to an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyBy {
    Response,
    Callback,
    Poll,
}

impl ReplyBy {
    /// The wire pattern; a Callback names `callback_url` (ours) as its ReplyTo.
    pub fn pattern(self, callback_url: &str) -> ReplyPattern {
        match self {
            ReplyBy::Response => ReplyPattern::Response,
            ReplyBy::Callback => ReplyPattern::Callback(ReplyTo::bare(callback_url)),
            ReplyBy::Poll => ReplyPattern::Poll,
        }
    }
}

/// Checked terms: how one submitted message is sent.
#[derive(Debug, Clone)]
pub struct SendAgreement {
    pub ack_requested: bool,
    pub duplicate_elimination: bool,
    pub message_order: bool,
    /// How the partner is to answer; a Callback's ReplyTo is our own callback address, which
    /// the sender fills in (`ReplyBy::pattern`).
    pub reply_by: ReplyBy,
    pub lifetime: chrono::Duration,
    pub schedule: RetrySchedule,
}

impl SendTerms {
    /// These terms with what they leave out taken from `base`. A retry schedule is taken
    /// whole, from whichever of the two names one.
    pub fn over(&self, base: &SendTerms) -> SendTerms {
        let own_schedule = self.waits_ms.is_some()
            || self.max_attempts.is_some()
            || self.interval_ms.is_some()
            || self.backoff.is_some();
        let schedule = if own_schedule { self } else { base };
        SendTerms {
            ack_requested: self.ack_requested.or(base.ack_requested),
            duplicate_elimination: self.duplicate_elimination.or(base.duplicate_elimination),
            message_order: self.message_order.or(base.message_order),
            reply_pattern: self
                .reply_pattern
                .clone()
                .or_else(|| base.reply_pattern.clone()),
            expiry_seconds: self.expiry_seconds.or(base.expiry_seconds),
            max_attempts: schedule.max_attempts,
            interval_ms: schedule.interval_ms,
            backoff: schedule.backoff,
            waits_ms: schedule.waits_ms.clone(),
        }
    }

    /// Checks the terms; on error (field, reason).
    pub fn check(&self) -> Result<SendAgreement, (&'static str, String)> {
        let reply_by = match self.reply_pattern.as_deref().unwrap_or("Response") {
            "Response" => ReplyBy::Response,
            "Poll" => ReplyBy::Poll,
            "Callback" => ReplyBy::Callback,
            other => {
                return Err((
                    "reply_pattern",
                    format!("{other:?} is not Response, Callback or Poll"),
                ));
            }
        };
        let ack_requested = self.ack_requested.unwrap_or(true);
        let duplicate_elimination = self.duplicate_elimination.unwrap_or(true);
        let message_order = self.message_order.unwrap_or(false);
        if message_order && !(ack_requested && duplicate_elimination) {
            return Err((
                "message_order",
                "ordering needs ack_requested and duplicate_elimination".into(),
            ));
        }
        let expiry_seconds = self.expiry_seconds.unwrap_or(3600);
        if expiry_seconds == 0 || expiry_seconds > 366 * 86_400 {
            return Err(("expiry_seconds", "must be between 1 and 31622400".into()));
        }
        Ok(SendAgreement {
            ack_requested,
            duplicate_elimination,
            message_order,
            reply_by,
            lifetime: chrono::Duration::seconds(expiry_seconds as i64),
            schedule: self.schedule()?,
        })
    }

    /// The retry schedule: an explicit list of waits, or attempts at an interval with backoff.
    fn schedule(&self) -> Result<RetrySchedule, (&'static str, String)> {
        let longest_wait_ms = LONGEST_WAIT.as_millis() as u64;
        let interval_given =
            self.max_attempts.is_some() || self.interval_ms.is_some() || self.backoff.is_some();
        match &self.waits_ms {
            Some(_) if interval_given => Err((
                "waits_ms",
                "give either waits_ms or max_attempts/interval_ms/backoff".into(),
            )),
            Some(waits) if waits.len() > 1000 => Err(("waits_ms", "at most 1000 waits".into())),
            Some(waits) if waits.iter().any(|ms| *ms > longest_wait_ms) => Err((
                "waits_ms",
                format!("each wait must be at most {longest_wait_ms} ms (one day)"),
            )),
            Some(waits) => Ok(RetrySchedule::Waits(
                waits.iter().map(|ms| Duration::from_millis(*ms)).collect(),
            )),
            None => {
                let max_attempts = self.max_attempts.unwrap_or(8);
                if max_attempts == 0 || max_attempts > 1000 {
                    return Err(("max_attempts", "must be between 1 and 1000".into()));
                }
                let interval_ms = self.interval_ms.unwrap_or(2000);
                let backoff = self.backoff.unwrap_or(2);
                if interval_ms == 0 || backoff == 0 {
                    return Err((
                        "interval_ms",
                        "interval_ms and backoff must be positive".into(),
                    ));
                }
                if interval_ms > longest_wait_ms {
                    return Err((
                        "interval_ms",
                        format!("must be at most {longest_wait_ms} ms (one day)"),
                    ));
                }
                if backoff > MAX_BACKOFF {
                    return Err(("backoff", format!("must be at most {MAX_BACKOFF}")));
                }
                Ok(RetrySchedule::Interval {
                    max_attempts,
                    interval: Duration::from_millis(interval_ms),
                    backoff,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_messages_fault_is_kept_no_longer_than_the_horizon() {
        let a = Agreement::everything();
        let now = DateTime::<Utc>::UNIX_EPOCH;
        let soon = now + chrono::Duration::hours(1);
        assert_eq!(a.fault_kept_until(soon, now), soon);
        assert_eq!(
            a.fault_kept_until(DateTime::<Utc>::MAX_UTC, now),
            now + DEFAULT_HORIZON
        );
        assert_eq!(
            a.fault_kept_until(DateTime::<Utc>::MAX_UTC, DateTime::<Utc>::MAX_UTC),
            DateTime::<Utc>::MAX_UTC,
            "no overflow at the end of time"
        );
    }

    #[test]
    fn terms_left_out_come_from_the_base_and_a_schedule_is_taken_whole() {
        let base = SendTerms {
            ack_requested: Some(false),
            reply_pattern: Some("Poll".into()),
            max_attempts: Some(3),
            interval_ms: Some(500),
            ..SendTerms::default()
        };
        let own = SendTerms {
            reply_pattern: Some("Callback".into()),
            waits_ms: Some(vec![10, 20]),
            ..SendTerms::default()
        };
        let merged = own.over(&base);
        assert_eq!(merged.ack_requested, Some(false), "from the base");
        assert_eq!(merged.reply_pattern.as_deref(), Some("Callback"), "its own");
        assert_eq!(
            (merged.max_attempts, merged.interval_ms, merged.waits_ms),
            (None, None, Some(vec![10, 20])),
            "its own schedule, none of the base's"
        );
        let merged = SendTerms::default().over(&base);
        assert_eq!(
            (merged.max_attempts, merged.interval_ms),
            (Some(3), Some(500))
        );
    }

    #[test]
    fn built_in_defaults_and_refusals_name_the_field() {
        let checked = SendTerms::default()
            .check()
            .expect("the defaults are valid");
        assert!(checked.ack_requested && checked.duplicate_elimination);
        assert!(!checked.message_order);
        assert_eq!(checked.reply_by, ReplyBy::Response);
        assert_eq!(checked.lifetime, chrono::Duration::hours(1));
        assert_eq!(checked.schedule.max_attempts(), 8);
        let refused = |terms: SendTerms| terms.check().err().map(|(field, _)| field);
        assert_eq!(
            refused(SendTerms {
                reply_pattern: Some("Carrier pigeon".into()),
                ..SendTerms::default()
            }),
            Some("reply_pattern")
        );
        assert_eq!(
            refused(SendTerms {
                message_order: Some(true),
                duplicate_elimination: Some(false),
                ..SendTerms::default()
            }),
            Some("message_order")
        );
        assert_eq!(
            refused(SendTerms {
                expiry_seconds: Some(0),
                ..SendTerms::default()
            }),
            Some("expiry_seconds")
        );
        assert_eq!(
            refused(SendTerms {
                waits_ms: Some(vec![1]),
                backoff: Some(2),
                ..SendTerms::default()
            }),
            Some("waits_ms")
        );
        assert_eq!(
            refused(SendTerms {
                interval_ms: Some(LONGEST_WAIT.as_millis() as u64 + 1),
                ..SendTerms::default()
            }),
            Some("interval_ms")
        );
        assert_eq!(
            refused(SendTerms {
                backoff: Some(MAX_BACKOFF + 1),
                ..SendTerms::default()
            }),
            Some("backoff")
        );
    }
}
