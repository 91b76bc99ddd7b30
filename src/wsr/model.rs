//! The WS-R 1.1 wire model: the three header blocks as validated values.
//!
//! A value of these types is always schema-valid and passes the semantic checks of digest §2.7;
//! the reader is the only place that builds them from the wire, and the writer emits them in
//! schema order.

use std::fmt;

use chrono::{DateTime, Utc};

use super::datetime::XsDuration;
use super::fault::FaultCode;
use super::lexical::{check_any_uri, xml_trim};

/// The two SOAP envelope versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SoapVersion {
    Soap11,
    Soap12,
}

pub const SOAP11_NS: &str = "http://schemas.xmlsoap.org/soap/envelope/";
pub const SOAP12_NS: &str = "http://www.w3.org/2003/05/soap-envelope";
pub const WSRM_NS: &str = "http://docs.oasis-open.org/wsrm/2004/06/ws-reliability-1.1.xsd";
pub const REF_NS: &str = "http://docs.oasis-open.org/wsrm/2004/06/reference-1.1.xsd";
/// WS-Security 1.0's `wsse` and `wsu` namespaces (OASIS WSS 2004), and the UsernameToken
/// Profile's password types.
pub const WSSE_NS: &str =
    "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd";
pub const WSU_NS: &str =
    "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-utility-1.0.xsd";
pub const PASSWORD_TEXT: &str = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-username-token-profile-1.0#PasswordText";
pub const PASSWORD_DIGEST: &str = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-username-token-profile-1.0#PasswordDigest";
pub const BASE64_BINARY: &str = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-soap-message-security-1.0#Base64Binary";

impl SoapVersion {
    pub fn envelope_namespace(self) -> &'static str {
        match self {
            SoapVersion::Soap11 => SOAP11_NS,
            SoapVersion::Soap12 => SOAP12_NS,
        }
    }

    /// The media type of a plain (non-MIME) envelope of this version.
    pub fn content_type(self) -> &'static str {
        match self {
            SoapVersion::Soap11 => "text/xml; charset=utf-8",
            SoapVersion::Soap12 => "application/soap+xml; charset=utf-8",
        }
    }

    /// The `SOAPAction` HTTP header a request of this version carries: SOAP 1.1 requires
    /// the header, and WS-R 1.1 defines no action URI, so it is the empty `""`. SOAP 1.2 has
    /// no such header (its action is an optional Content-Type parameter, which WS-R does not
    /// use either).
    pub fn soap_action(self) -> Option<&'static str> {
        match self {
            SoapVersion::Soap11 => Some("\"\""),
            SoapVersion::Soap12 => None,
        }
    }
}

/// The longest groupId we keep. Every group's state is kept until it ends and its messages
/// expire: a 16 KB groupId made each one 78 KiB on disk. Real ids (`mid:` URIs, UUIDs) are far
/// shorter.
pub const MAX_GROUP_ID_BYTES: usize = 1024;

/// A group identifier (`MessageId/@groupId`, an `xs:anyURI`): opaque, compared code-point exact.
/// Never empty; surrounding whitespace is collapsed away as the anyURI lexical rules say.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupId(String);

impl GroupId {
    /// Validates a raw `groupId` attribute value: a non-empty `xs:anyURI` (`mid://…` included,
    /// D12). Refusing what is not an anyURI here keeps every acknowledgment we write valid.
    pub fn parse(raw: &str) -> Result<GroupId, String> {
        let trimmed = xml_trim(raw);
        if trimmed.is_empty() {
            return Err("groupId is empty".into());
        }
        if trimmed.len() > MAX_GROUP_ID_BYTES {
            return Err(format!(
                "groupId is longer than {MAX_GROUP_ID_BYTES} bytes ({})",
                trimmed.len()
            ));
        }
        check_any_uri(trimmed).map_err(|why| {
            format!(
                "groupId '{}' is not an xs:anyURI: {why}",
                super::lexical::excerpt(trimmed)
            )
        })?;
        Ok(GroupId(trimmed.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Identity of one reliable message: its group and, for sequenced messages, its number.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageKey {
    pub group_id: GroupId,
    pub number: Option<u64>,
}

impl fmt::Display for MessageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.number {
            Some(n) => write!(f, "{}#{}", self.group_id, n),
            None => write!(f, "{}", self.group_id),
        }
    }
}

/// `wsrm:Request`: on every reliable message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub message_id: MessageId,
    pub expiry_time: DateTime<Utc>,
    pub reply_pattern: ReplyPattern,
    pub ack_requested: bool,
    pub duplicate_elimination: bool,
    pub message_order: bool,
}

impl Request {
    pub fn key(&self) -> MessageKey {
        MessageKey {
            group_id: self.message_id.group_id.clone(),
            number: self.message_id.sequence.as_ref().map(|s| s.number),
        }
    }
}

/// `wsrm:MessageId`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageId {
    pub group_id: GroupId,
    pub sequence: Option<SequenceNum>,
}

/// `wsrm:SequenceNum`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceNum {
    pub number: u64,
    pub last: bool,
    pub group_limit: Option<GroupLimit>,
}

/// The group's lifetime limit: at most one of the two attributes may be present (digest §2.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupLimit {
    /// `groupExpiryTime`.
    ExpiryTime(DateTime<Utc>),
    /// `groupMaxIdleDuration`; never negative.
    MaxIdleDuration(XsDuration),
}

/// `wsrm:ReplyPattern`. A `ReplyTo` only means something for Callback; one sent with Response or
/// Poll is checked for well-formedness and then ignored, as the spec gives it no use there.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ReplyPattern {
    Response,
    Callback(ReplyTo),
    Poll,
}

impl ReplyPattern {
    pub fn value(&self) -> &'static str {
        match self {
            ReplyPattern::Response => "Response",
            ReplyPattern::Callback(_) => "Callback",
            ReplyPattern::Poll => "Poll",
        }
    }
}

/// `wsrm:ReplyTo` in the default reference scheme: one `wsrm:BareURI`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReplyTo {
    pub uri: String,
    /// The optional `reference-scheme` attribute, kept so a resend is faithful.
    pub reference_scheme: Option<String>,
}

impl ReplyTo {
    pub fn bare(uri: impl Into<String>) -> ReplyTo {
        ReplyTo {
            uri: uri.into(),
            reference_scheme: None,
        }
    }
}

/// `wsrm:Response`: acknowledgments and fault indications, freely interleaved.
/// An empty list is legal here (a tolerated peer quirk on input) but is never written: an empty
/// `wsrm:Response` is schema-invalid.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Response {
    pub replies: Vec<Reply>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `NonSequenceReply`: for a message without `SequenceNum`.
    NonSequence {
        group_id: GroupId,
        fault: Option<FaultCode>,
    },
    /// `SequenceReplies`: ranges of one sequenced group; never empty.
    Sequence {
        group_id: GroupId,
        ranges: Vec<ReplyRange>,
    },
}

/// `ReplyRange`: `from..=to` acknowledged, or faulted with `fault`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyRange {
    pub range: SeqRange,
    pub fault: Option<FaultCode>,
}

/// An inclusive range of sequence numbers with `from <= to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqRange {
    from: u64,
    to: u64,
}

impl SeqRange {
    pub fn new(from: u64, to: u64) -> Option<SeqRange> {
        (from <= to).then_some(SeqRange { from, to })
    }

    pub fn single(n: u64) -> SeqRange {
        SeqRange { from: n, to: n }
    }

    pub fn from(self) -> u64 {
        self.from
    }

    pub fn to(self) -> u64 {
        self.to
    }

    pub fn contains(self, n: u64) -> bool {
        self.from <= n && n <= self.to
    }
}

/// A WS-Security `wsse:UsernameToken` as sent (UsernameToken Profile 1.0/1.1): the values
/// as written, since a PasswordDigest is computed over the `Nonce` and `Created` texts.
/// Whether it proves anything is the partners' rule (`partners::wss`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsernameToken {
    pub username: String,
    pub password: Option<String>,
    pub digest: bool,
    /// Base64 text (the only encoding the profile defines).
    pub nonce: Option<String>,
    /// `wsu:Created` as written (xs:dateTime).
    pub created: Option<String>,
}

/// `wsrm:PollRequest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollRequest {
    /// Never empty.
    pub refs: Vec<RefToMessageIds>,
    pub reply_to: Option<ReplyTo>,
}

/// `RefToMessageIds`: a group and the ranges asked about; no ranges = the singleton `groupId`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefToMessageIds {
    pub group_id: GroupId,
    pub ranges: Vec<SeqRange>,
}
