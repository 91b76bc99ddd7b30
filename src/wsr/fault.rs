//! The ten WS-R fault codes and the defect type every reader check returns.
//!
//! A defect carries the exact fault code and where the answer can go (DESIGN D4): by the
//! message's own reply pattern when the message is identified and its reply pattern usable,
//! otherwise only as a synchronous SOAP Fault.

use std::fmt;

use super::model::{MessageKey, ReplyPattern};

/// `FaultCodeEnum` of the WS-R 1.1 schema: exactly these ten QNames in the WS-R namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultCode {
    InvalidRequest,
    InvalidPollRequest,
    InvalidMessageId,
    InvalidExpiryTime,
    InvalidReplyPattern,
    InvalidMessageParameters,
    FeatureNotSupported,
    PermanentProcessingFailure,
    MessageProcessingFailure,
    GroupAborted,
}

/// Whose fault it is: the sender's message (SOAP `Client`/`Sender`) or our processing
/// (`Server`/`Receiver`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultCategory {
    MessageFormat,
    Processing,
}

impl FaultCode {
    pub const ALL: [FaultCode; 10] = [
        FaultCode::InvalidRequest,
        FaultCode::InvalidPollRequest,
        FaultCode::InvalidMessageId,
        FaultCode::InvalidExpiryTime,
        FaultCode::InvalidReplyPattern,
        FaultCode::InvalidMessageParameters,
        FaultCode::FeatureNotSupported,
        FaultCode::PermanentProcessingFailure,
        FaultCode::MessageProcessingFailure,
        FaultCode::GroupAborted,
    ];

    /// Local name of the QName; the namespace is always the WS-R one.
    pub fn local_name(self) -> &'static str {
        match self {
            FaultCode::InvalidRequest => "InvalidRequest",
            FaultCode::InvalidPollRequest => "InvalidPollRequest",
            FaultCode::InvalidMessageId => "InvalidMessageId",
            FaultCode::InvalidExpiryTime => "InvalidExpiryTime",
            FaultCode::InvalidReplyPattern => "InvalidReplyPattern",
            FaultCode::InvalidMessageParameters => "InvalidMessageParameters",
            FaultCode::FeatureNotSupported => "FeatureNotSupported",
            FaultCode::PermanentProcessingFailure => "PermanentProcessingFailure",
            FaultCode::MessageProcessingFailure => "MessageProcessingFailure",
            FaultCode::GroupAborted => "GroupAborted",
        }
    }

    /// The code with this local name, if it is one of the ten (case-sensitive, as QNames are).
    pub fn from_local_name(name: &str) -> Option<FaultCode> {
        FaultCode::ALL.into_iter().find(|c| c.local_name() == name)
    }

    pub fn category(self) -> FaultCategory {
        match self {
            FaultCode::FeatureNotSupported
            | FaultCode::PermanentProcessingFailure
            | FaultCode::MessageProcessingFailure
            | FaultCode::GroupAborted => FaultCategory::Processing,
            _ => FaultCategory::MessageFormat,
        }
    }

    /// Only `MessageProcessingFailure` invites the sender to try again (DESIGN §6).
    pub fn is_transient(self) -> bool {
        self == FaultCode::MessageProcessingFailure
    }
}

impl fmt::Display for FaultCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.local_name())
    }
}

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

/// The start of a wire value for a defect's reason: at most 64 characters, so that a hostile
/// value cannot make the reason (and the SOAP Fault or log line carrying it) large, with
/// control and non-XML characters replaced so the fault we write stays well-formed.
pub(crate) fn excerpt(s: &str) -> std::borrow::Cow<'_, str> {
    let cut = match s.char_indices().nth(64) {
        Some((i, _)) => &s[..i],
        None => s,
    };
    let clean = |c: char| !c.is_control() && super::lexical::is_xml_char(c);
    if cut.chars().all(clean) {
        std::borrow::Cow::Borrowed(cut)
    } else {
        cut.chars()
            .map(|c| if clean(c) { c } else { '\u{FFFD}' })
            .collect()
    }
}
