//! Channel agreements (D9): which features a channel offers and which it requires. A message
//! asking for something not offered gets `FeatureNotSupported`; one omitting something
//! required gets `InvalidMessageParameters`.

use chrono::{DateTime, Utc};

use crate::wsr::{FaultCode, ReplyPattern, Request};

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
    /// How far ahead an ExpiryTime may lie; `None` = no limit.
    pub max_expiry_horizon: Option<chrono::Duration>,
}

impl Agreement {
    /// Every feature offered, nothing required: the default channel.
    pub fn everything() -> Agreement {
        Agreement {
            offers: Feature::ALL.to_vec(),
            requires: Vec::new(),
            max_expiry_horizon: None,
        }
    }

    /// Checks a message against the agreement.
    pub fn check(&self, request: &Request, now: DateTime<Utc>) -> Result<(), (FaultCode, String)> {
        let reply = match request.reply_pattern {
            ReplyPattern::Response => Feature::Response,
            ReplyPattern::Callback(_) => Feature::Callback,
            ReplyPattern::Poll => Feature::Poll,
        };
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
        if let Some(horizon) = self.max_expiry_horizon {
            if request.expiry_time > now + horizon {
                return Err((
                    FaultCode::InvalidExpiryTime,
                    format!(
                        "ExpiryTime is further ahead than this channel allows ({} s)",
                        horizon.num_seconds()
                    ),
                ));
            }
        }
        Ok(())
    }
}
