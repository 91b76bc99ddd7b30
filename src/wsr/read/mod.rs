//! Reads a SOAP 1.1 or 1.2 message — plain or MIME multipart/related — into its SOAP version,
//! the three WS-R header blocks as validated values, and the Body content as a slice of the
//! input (never copied).
//!
//! Every defect becomes a [`Defect`] with the exact WS-R fault code and its route (D4). The
//! reader is tolerant where real peers need it (D12) and refuses hostile input within bounded
//! memory (D13). It never panics, whatever the bytes.

mod blocks;
mod xml;

use super::defect::Defect;
use super::fault::FaultCode;
use super::lexical::excerpt;
use super::lexical::xml_trim;
use super::mime;
use super::model::{PollRequest, Request, Response, SoapVersion, UsernameToken};
use super::word_scan;
pub use xml::Declaration;
use xml::{Node, Ns, XmlCursor, XmlError};

/// Bounds on what one message may cost (D13).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Whole message, MIME packaging included.
    pub max_bytes: usize,
    pub max_depth: usize,
    pub max_attributes: usize,
    pub max_name_len: usize,
    /// Attribute values and header text values.
    pub max_value_len: usize,
    pub max_namespace_bindings: usize,
    /// References in one `wsrm:PollRequest` (each `SequenceNumRange`, and each
    /// `RefToMessageIds` without ranges) and statements in one `wsrm:Response` (each
    /// `NonSequenceReply` and `ReplyRange`); counted while reading, refused beyond it.
    pub max_references: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 16 * 1024 * 1024,
            max_depth: 64,
            max_attributes: 64,
            max_name_len: 512,
            max_value_len: 16 * 1024,
            max_namespace_bindings: 128,
            max_references: 10_000,
        }
    }
}

/// A peer habit we accepted but that an operator may want to see in the log (D12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quirk {
    /// A dateTime without a zone, read as UTC.
    ZonelessDateTime,
    /// `ReplyTo` before `RefToMessageIds` in a `PollRequest`.
    PollReplyToFirst,
    /// An empty `wsrm:Response` (schema-invalid), read as "nothing to report".
    EmptyResponse,
    /// A `ReplyTo` in a Response- or Poll-pattern `Request`, where it has no use; ignored.
    IgnoredReplyTo,
}

/// A message as read from the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope<'a> {
    /// The whole envelope as read (the root part of a multipart message).
    pub text: &'a str,
    pub version: SoapVersion,
    pub request: Option<Request>,
    pub response: Option<Response>,
    pub poll_request: Option<PollRequest>,
    pub body: Body<'a>,
    /// MIME parts other than the envelope. The codec does not interpret them; whoever stores
    /// the message must not drop them silently.
    pub attachments: usize,
    /// Other header blocks addressed to us with mustUnderstand set (WS-Security, say). The
    /// codec does not process them; SOAP requires a MustUnderstand fault rather than silently
    /// ignoring them, so the receiver must check this list. Names as written (`prefix:local`).
    pub not_understood: Vec<String>,
    /// The UsernameToken of a `wsse:Security` block addressed to us that holds nothing we do
    /// not understand (one that does is in `not_understood` when it must be understood).
    pub security: Option<UsernameToken>,
    pub quirks: Vec<Quirk>,
}

/// The Body: its children exactly as received, and the name of the first child element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Body<'a> {
    /// Everything between `<Body>` and `</Body>`.
    pub content: &'a str,
    /// The first child element, if any (it names the topic and tells a SOAP Fault apart).
    pub root: Option<BodyRoot>,
    /// When the Body is a SOAP Fault carrying a WS-R fault code (SOAP 1.1 `detail`, SOAP 1.2
    /// `Subcode`, any prefix): that code. Peers may send only this, without a `wsrm:Response`.
    pub fault: Option<FaultCode>,
    /// The namespace declarations in scope at the Body (made on the Envelope or the Body),
    /// which `content` may use without declaring them itself: whoever stores `content` on its
    /// own needs these to keep it well-formed.
    pub namespaces: Vec<Declaration<'a>>,
}

impl Body<'_> {
    /// Whether the Body holds an application's answer (a business response, or a SOAP Fault of
    /// the application's own), not only WS-R: some child element, and not a SOAP Fault with a
    /// WS-R code. `Some(true)` for an application SOAP Fault.
    pub fn business_response(&self) -> Option<bool> {
        let root = self.root.as_ref()?;
        if self.fault.is_some() {
            return None;
        }
        Some(root.is_soap_fault())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyRoot {
    pub namespace: Option<String>,
    pub local_name: String,
}

impl BodyRoot {
    /// A SOAP 1.1 or 1.2 `Fault`.
    pub fn is_soap_fault(&self) -> bool {
        let soap = [crate::wsr::model::SOAP11_NS, crate::wsr::model::SOAP12_NS];
        self.local_name == "Fault"
            && self
                .namespace
                .as_deref()
                .is_some_and(|ns| soap.contains(&ns))
    }
}

/// Reads an HTTP request or response body given its `Content-Type` (MIME multipart/related is
/// unwrapped to its root part; anything else is taken as the envelope itself).
pub fn read_message<'a>(
    content_type: Option<&str>,
    bytes: &'a [u8],
    limits: &Limits,
) -> Result<Envelope<'a>, Defect> {
    if bytes.len() > limits.max_bytes {
        return Err(invalid(format!(
            "message of {} bytes exceeds the limit of {} bytes",
            bytes.len(),
            limits.max_bytes
        )));
    }
    match content_type {
        Some(ct) if mime::is_multipart(ct) => {
            let root = mime::root_part(ct, bytes).map_err(invalid)?;
            let mut envelope = read_envelope(root.envelope, limits)?;
            envelope.attachments = root.attachments;
            Ok(envelope)
        }
        _ => read_envelope(bytes, limits),
    }
}

/// Reads one SOAP envelope (no MIME packaging).
pub fn read_envelope<'a>(bytes: &'a [u8], limits: &Limits) -> Result<Envelope<'a>, Defect> {
    if bytes.len() > limits.max_bytes {
        return Err(invalid(format!(
            "message of {} bytes exceeds the limit of {} bytes",
            bytes.len(),
            limits.max_bytes
        )));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| invalid(format!("the message is not UTF-8 ({e})")))?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    check_characters(text)?;
    let mut reader = EnvelopeReader {
        xml: XmlCursor::new(text, limits),
        src: text,
        quirks: Vec::new(),
        not_understood: Vec::new(),
    };
    reader.envelope()
}

/// Refuses characters XML 1.0 does not allow anywhere in a document: control characters other
/// than tab, CR, LF, and U+FFFE/U+FFFF. One pass over the bytes, before any parsing.
fn check_characters(text: &str) -> Result<(), Defect> {
    let bytes = text.as_bytes();
    if let Some(at) = first_control_character(bytes) {
        return Err(invalid(format!(
            "control character U+{:04X} at byte {at}, which XML does not allow",
            bytes[at]
        )));
    }
    // U+FFFE and U+FFFF are EF BF BE and EF BF BF in UTF-8; EF itself is rare.
    for at in memchr::memchr_iter(0xEF, bytes) {
        if let [0xBF, 0xBE | 0xBF, ..] = bytes[at + 1..] {
            return Err(invalid(format!(
                "non-character U+FFFE or U+FFFF at byte {at}"
            )));
        }
    }
    Ok(())
}

/// Where the first control character other than tab, CR and LF is, a word at a time (line
/// ends, the only control characters most documents hold, are looked at byte by byte).
fn first_control_character(bytes: &[u8]) -> Option<usize> {
    let control = |b: u8| b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r');
    word_scan::first_byte(
        bytes,
        |word| word_scan::some_byte_below(word, 0x20),
        control,
    )
}

fn invalid(reason: impl Into<String>) -> Defect {
    Defect::synchronous(FaultCode::InvalidRequest, reason)
}

impl From<XmlError> for Defect {
    fn from(e: XmlError) -> Defect {
        invalid(e.0)
    }
}

struct EnvelopeReader<'a, 'l> {
    xml: XmlCursor<'a, 'l>,
    src: &'a str,
    quirks: Vec<Quirk>,
    not_understood: Vec<String>,
}

#[derive(Default)]
struct HeaderBlocks {
    request: Option<Request>,
    response: Option<Response>,
    poll_request: Option<PollRequest>,
    security: Option<UsernameToken>,
    /// The first defect of a block, held until the rest of the document is read.
    defect: Option<Defect>,
}

impl<'a> EnvelopeReader<'a, '_> {
    fn envelope(&mut self) -> Result<Envelope<'a>, Defect> {
        let root = loop {
            match self.xml.next()? {
                None => return Err(invalid("the message holds no XML element")),
                Some(Node::Text(t)) if xml_trim(&t).is_empty() => {}
                Some(Node::Text(_)) => return Err(invalid("text before the SOAP Envelope")),
                Some(Node::Close) => return Err(invalid("stray end tag")),
                Some(Node::Open(e)) => break e,
            }
        };
        let version = match (root.ns, root.local()) {
            (Ns::Soap11, "Envelope") => SoapVersion::Soap11,
            (Ns::Soap12, "Envelope") => SoapVersion::Soap12,
            _ => {
                return Err(invalid(
                    "the root element is not a SOAP 1.1 or SOAP 1.2 Envelope",
                ));
            }
        };
        let env_ns = match version {
            SoapVersion::Soap11 => Ns::Soap11,
            SoapVersion::Soap12 => Ns::Soap12,
        };
        if root.empty {
            return Err(invalid("the SOAP Envelope has no Body"));
        }

        let mut headers = HeaderBlocks::default();
        let mut seen_header = false;
        let mut body = None;
        loop {
            match self.xml.next_in_element()? {
                Node::Close => break,
                Node::Text(t) if xml_trim(&t).is_empty() => {}
                Node::Text(_) => return Err(invalid("text directly inside the SOAP Envelope")),
                Node::Open(e) if e.ns == env_ns && e.local() == "Header" => {
                    if seen_header || body.is_some() {
                        return Err(invalid("SOAP Header repeated or after the Body"));
                    }
                    seen_header = true;
                    self.header(&e, version, &mut headers)?;
                }
                Node::Open(e) if e.ns == env_ns && e.local() == "Body" => {
                    if body.is_some() {
                        return Err(invalid("SOAP Body repeated"));
                    }
                    body = Some(self.body(&e)?);
                }
                Node::Open(e) if e.ns == env_ns => {
                    return Err(invalid(format!(
                        "unexpected SOAP element '{}' in the Envelope",
                        xml_name(&e)
                    )));
                }
                // SOAP 1.1 allows foreign elements after the Body; skip any foreign element.
                Node::Open(e) => self.xml.skip(&e)?,
            }
        }
        loop {
            match self.xml.next()? {
                None => break,
                Some(Node::Text(t)) if xml_trim(&t).is_empty() => {}
                Some(_) => return Err(invalid("content after the SOAP Envelope")),
            }
        }
        let body = body.ok_or_else(|| invalid("the SOAP Envelope has no Body"))?;
        if let Some(defect) = headers.defect {
            return Err(defect);
        }
        Ok(Envelope {
            text: self.src,
            version,
            request: headers.request,
            response: headers.response,
            poll_request: headers.poll_request,
            security: headers.security,
            body,
            attachments: 0,
            not_understood: std::mem::take(&mut self.not_understood),
            quirks: std::mem::take(&mut self.quirks),
        })
    }

    fn header(
        &mut self,
        header: &xml::Elem<'_>,
        version: SoapVersion,
        blocks: &mut HeaderBlocks,
    ) -> Result<(), Defect> {
        if header.empty {
            return Ok(());
        }
        loop {
            match self.xml.next_in_element()? {
                Node::Close => return Ok(()),
                Node::Text(t) if xml_trim(&t).is_empty() => {}
                Node::Text(_) => return Err(invalid("text directly inside the SOAP Header")),
                Node::Open(e) if e.ns == Ns::Wsrm => {
                    // A block aimed at another SOAP node is not ours to process.
                    if !self.xml.header_targeting(&e, version)?.1 {
                        self.xml.skip(&e)?;
                        continue;
                    }
                    let header_depth = self.xml.depth() - usize::from(!e.empty);
                    let mut block = blocks::BlockReader {
                        xml: &mut self.xml,
                        version,
                        quirks: &mut self.quirks,
                    };
                    let read = match e.local() {
                        "Request" if blocks.request.is_none() => {
                            block.request(&e).map(|r| blocks.request = Some(r))
                        }
                        "Response" if blocks.response.is_none() => {
                            block.response(&e).map(|r| blocks.response = Some(r))
                        }
                        "PollRequest" if blocks.poll_request.is_none() => block
                            .poll_request(&e)
                            .map(|p| blocks.poll_request = Some(p)),
                        "Request" | "Response" | "PollRequest" => {
                            return Err(invalid(format!(
                                "more than one wsrm:{} header block",
                                e.local()
                            )));
                        }
                        other => {
                            return Err(invalid(format!(
                                "unknown WS-Reliability header block '{}'",
                                excerpt(other)
                            )));
                        }
                    };
                    // A defective block is reported only once the whole document proved
                    // well-formed and within limits: those failures must win (D4, D13).
                    if let Err(defect) = read {
                        if self.xml.failed() {
                            return Err(defect);
                        }
                        self.xml.skip_to_depth(header_depth)?;
                        blocks.defect.get_or_insert(defect);
                    }
                }
                Node::Open(e) if e.ns == Ns::Wsse && e.local() == "Security" => {
                    let (must, for_us) = self.xml.header_targeting(&e, version)?;
                    if !for_us {
                        self.xml.skip(&e)?;
                        continue;
                    }
                    let name = excerpt(e.start.name().as_ref()).into_owned();
                    let mut block = blocks::BlockReader {
                        xml: &mut self.xml,
                        version,
                        quirks: &mut self.quirks,
                    };
                    match block.security(&e)? {
                        // One Security block per SOAP node (WSS 1.0 §5); a second is not one
                        // we can take as this message's.
                        blocks::SecurityBlock::Understood(token) if blocks.security.is_none() => {
                            blocks.security = token;
                        }
                        _ if must => self.not_understood.push(name),
                        _ => {}
                    }
                }
                // Other headers (WS-Addressing, WS-Security, ...) are not ours to process, but
                // one that must be understood by us has to be reported, not skipped silently.
                Node::Open(e) => {
                    if self.xml.header_targeting(&e, version)? == (true, true) {
                        self.not_understood
                            .push(excerpt(e.start.name().as_ref()).into_owned());
                    }
                    self.xml.skip(&e)?;
                }
            }
        }
    }

    fn body(&mut self, body: &xml::Elem<'_>) -> Result<Body<'a>, Defect> {
        let namespaces = self.xml.in_scope();
        if body.empty {
            return Ok(Body {
                content: "",
                root: None,
                fault: None,
                namespaces,
            });
        }
        let start = self.xml.position();
        let target = self.xml.depth() - 1;
        let mut root = None;
        let mut in_fault = false;
        let mut fault = None;
        loop {
            match self.xml.next_in_element()? {
                Node::Close if self.xml.depth() == target => {
                    return Ok(Body {
                        content: &self.src[start..self.xml.event_start()],
                        root,
                        fault,
                        namespaces,
                    });
                }
                Node::Open(e) if root.is_none() => {
                    in_fault = e.local() == "Fault" && matches!(e.ns, Ns::Soap11 | Ns::Soap12);
                    root = Some(BodyRoot {
                        namespace: self.xml.namespace_uri(&e),
                        local_name: e.local().to_owned(),
                    });
                }
                // Inside a SOAP Fault, the first text that is a QName of one of the ten WS-R
                // codes (resolved in its own scope) is the fault code.
                Node::Text(t) if in_fault && fault.is_none() => {
                    fault = match self.xml.resolve_qname(xml_trim(&t)) {
                        Some((Ns::Wsrm, local)) => FaultCode::from_local_name(local),
                        _ => None,
                    };
                }
                _ => {}
            }
        }
    }
}

fn xml_name(e: &xml::Elem<'_>) -> String {
    excerpt(e.start.name().as_ref()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::first_control_character;

    /// The byte-by-byte rule the word-at-a-time scan must agree with.
    fn plainly(bytes: &[u8]) -> Option<usize> {
        bytes
            .iter()
            .position(|&b| b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r'))
    }

    #[test]
    fn the_word_scan_finds_what_the_byte_scan_finds_at_every_position() {
        let base = "<a>caf\u{e9} \u{20ac}\u{10348}\t\r\nz</a>"
            .repeat(3)
            .into_bytes();
        assert_eq!(first_control_character(&base), None);
        for len in 0..base.len() {
            assert_eq!(first_control_character(&base[..len]), plainly(&base[..len]));
            for bad in [0x00, 0x01, 0x08, 0x0b, 0x0c, 0x1f] {
                let mut with = base[..len].to_vec();
                with.push(bad);
                with.extend_from_slice(&base[len..]);
                assert_eq!(
                    first_control_character(&with),
                    Some(len),
                    "{bad:#x} at {len}"
                );
                assert_eq!(first_control_character(&with), plainly(&with));
            }
        }
        // Bytes at 0x20 and above, high bytes among them, never alarm.
        let high: Vec<u8> = (0x20..=0xff).collect();
        assert_eq!(first_control_character(&high), None);
    }
}
