//! Channel agreements (D9): which features a channel offers and which it requires. A message
//! asking for something not offered gets `FeatureNotSupported`; one omitting something
//! required gets `InvalidMessageParameters`.

use chrono::{DateTime, Utc};

use crate::wsr::datetime::saturating_add;
use crate::wsr::{FaultCode, GroupLimit, ReplyPattern, Request};

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
}
