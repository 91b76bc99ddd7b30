//! The defect type every reader check returns: the exact fault code and where the answer can
//! go (DESIGN D4) — by the message's own reply pattern when the message is identified and its
//! reply pattern usable, otherwise only as a synchronous SOAP Fault.

use super::fault::FaultCode;
use super::model::{MessageKey, ReplyPattern};

/// Where the answer to a defective message can travel (DESIGN D4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultRoute {
    /// No identity or no usable reply pattern could be recovered: only a synchronous SOAP Fault
    /// in the HTTP response can carry the fault.
    SoapFault,
    /// The message is identified and its reply pattern usable: a `fault` attribute in a
    /// `wsrm:Response` sent by that pattern (for Response, together with a SOAP Fault body).
    ReplyPattern {
        key: MessageKey,
        reply: ReplyPattern,
    },
}

/// One defect found while reading a message: the WS-R fault code, where it can be answered and a
/// human reason (safe to show to the partner: it names only what was on the wire).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {reason}")]
pub struct Defect {
    pub code: FaultCode,
    pub route: FaultRoute,
    pub reason: String,
}

impl Defect {
    pub fn synchronous(code: FaultCode, reason: impl Into<String>) -> Defect {
        Defect {
            code,
            route: FaultRoute::SoapFault,
            reason: reason.into(),
        }
    }

    pub fn is_synchronous(&self) -> bool {
        self.route == FaultRoute::SoapFault
    }
}
