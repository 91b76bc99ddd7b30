//! The ten WS-R fault codes, their local names and categories (DESIGN D4). A leaf of `wsr/`:
//! the defect that carries a code with its route is `defect.rs`.

use std::fmt;

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
