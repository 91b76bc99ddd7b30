//! Writes envelopes: the WS-R header blocks in schema order, SOAP 1.1 or 1.2, our prefixes
//! (`soap`/`env` and `wsrm`), mustUnderstand as each version wants it; and SOAP Faults.
//!
//! Everything written here validates against `schemas/` (tested with xmllint). Where a value
//! has nothing to say — a `Response` without replies, a `PollRequest` without references — the
//! block is left out rather than written empty, because an empty block is schema-invalid.

use quick_xml::escape::escape;

use super::datetime::format_date_time;
use super::fault::{FaultCategory, FaultCode};
use super::lexical::is_xml_char;
use super::model::{
    BASE64_BINARY, GroupLimit, PASSWORD_DIGEST, PASSWORD_TEXT, PollRequest, Reply, ReplyPattern,
    ReplyTo, Request, Response, SoapVersion, UsernameToken, WSRM_NS, WSSE_NS, WSU_NS,
};

/// The WS-R header blocks of one outgoing envelope; any may be absent.
#[derive(Debug, Clone, Copy, Default)]
pub struct Headers<'a> {
    pub request: Option<&'a Request>,
    pub response: Option<&'a Response>,
    pub poll_request: Option<&'a PollRequest>,
}

/// A SOAP Fault carrying a WS-R fault code (DESIGN D4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SoapFault {
    pub code: FaultCode,
    pub reason: String,
}

impl SoapFault {
    /// HTTP status of the response that carries this fault: SOAP 1.1 always 500; SOAP 1.2 400
    /// for `Sender` (format) faults and 500 for `Receiver` (processing) faults.
    pub fn http_status(&self, version: SoapVersion) -> u16 {
        match (version, self.code.category()) {
            (SoapVersion::Soap12, FaultCategory::MessageFormat) => 400,
            _ => 500,
        }
    }
}

/// Writes a whole envelope with the given headers and raw body content (the Body's children,
/// already well-formed XML; empty for a body-less message).
pub fn write_envelope(version: SoapVersion, headers: Headers<'_>, body: &str) -> String {
    let mut w = EnvelopeWriter::start(version, body.len());
    w.headers(headers);
    w.out.push_str(w.p.body_open);
    w.out.push_str(body);
    w.finish()
}

/// A `wsrm:Response` header block on its own, declaring its namespaces, for a header written
/// by someone else (a SOAP service's answer, D16); `None` when it has no reply to carry.
pub fn write_response_block(version: SoapVersion, response: &Response) -> Option<String> {
    if !has_replies(response) {
        return None;
    }
    let mut w = EnvelopeWriter::start(version, 0);
    w.out.clear();
    w.standalone = true;
    w.response(response);
    Some(w.out)
}

/// Writes a SOAP Fault envelope. With `response`, a `wsrm:Response` header carrying the matching
/// fault indication rides along, so a peer that reads only headers still correlates it (D4).
pub fn write_soap_fault(
    version: SoapVersion,
    fault: &SoapFault,
    response: Option<&Response>,
) -> String {
    let mut w = EnvelopeWriter::start(version, fault.reason.len() + 256);
    w.headers(Headers {
        response,
        ..Headers::default()
    });
    w.out.push_str(w.p.body_open);
    let reason = xml_text(&fault.reason);
    let wsr_code = fault.code.local_name();
    match version {
        SoapVersion::Soap11 => {
            let code = match fault.code.category() {
                FaultCategory::MessageFormat => "soap:Client",
                FaultCategory::Processing => "soap:Server",
            };
            w.push_all(&[
                "<soap:Fault><faultcode>",
                code,
                "</faultcode><faultstring>",
                &reason,
                "</faultstring><detail><wsrm:FaultCode>wsrm:",
                wsr_code,
                "</wsrm:FaultCode></detail></soap:Fault>",
            ]);
        }
        SoapVersion::Soap12 => {
            let code = match fault.code.category() {
                FaultCategory::MessageFormat => "env:Sender",
                FaultCategory::Processing => "env:Receiver",
            };
            w.push_all(&[
                "<env:Fault><env:Code><env:Value>",
                code,
                "</env:Value><env:Subcode><env:Value>wsrm:",
                wsr_code,
                "</env:Value></env:Subcode></env:Code><env:Reason><env:Text xml:lang=\"en\">",
                &reason,
                "</env:Text></env:Reason></env:Fault>",
            ]);
        }
    }
    w.finish()
}

/// Writes the SOAP `MustUnderstand` fault for header blocks addressed to us that we do not
/// process (SOAP 1.1 §4.4, SOAP 1.2 Part 1 §5.4.8). Always answered with HTTP 500.
pub fn write_must_understand_fault(version: SoapVersion, not_understood: &[String]) -> String {
    let reason = format!(
        "header blocks not understood: {}",
        not_understood.join(", ")
    );
    let reason = xml_text(&reason);
    let mut w = EnvelopeWriter::start(version, reason.len() + 256);
    w.out.push_str(w.p.body_open);
    match version {
        SoapVersion::Soap11 => w.push_all(&[
            "<soap:Fault><faultcode>soap:MustUnderstand</faultcode><faultstring>",
            &reason,
            "</faultstring></soap:Fault>",
        ]),
        SoapVersion::Soap12 => w.push_all(&[
            "<env:Fault><env:Code><env:Value>env:MustUnderstand</env:Value></env:Code>",
            "<env:Reason><env:Text xml:lang=\"en\">",
            &reason,
            "</env:Text></env:Reason></env:Fault>",
        ]),
    }
    w.finish()
}

/// Writes an envelope without WS-R blocks around a Body's children kept on their own (a push
/// to a SOAP endpoint, DESIGN §5): `namespaces` are the declarations in scope at the Body the
/// children came from (prefix, URI), declared again on the Body. The envelope's prefix is one
/// they do not bind, so no redeclaration can change what the Body or its children mean.
pub fn write_plain_envelope(
    version: SoapVersion,
    namespaces: &[(Option<String>, String)],
    body: &str,
) -> String {
    let taken = |p: &str| namespaces.iter().any(|(q, _)| q.as_deref() == Some(p));
    let preferred = match version {
        SoapVersion::Soap11 => "soap",
        SoapVersion::Soap12 => "env",
    };
    let prefix = std::iter::once(preferred.to_owned())
        .chain((0..).map(|n| format!("{preferred}{n}")))
        .find(|p| !taken(p))
        .unwrap_or_else(|| preferred.to_owned());
    let mut out = String::with_capacity(256 + body.len());
    out.push('<');
    out.push_str(&prefix);
    out.push_str(":Envelope xmlns:");
    out.push_str(&prefix);
    out.push_str("=\"");
    out.push_str(version.envelope_namespace());
    out.push_str("\"><");
    out.push_str(&prefix);
    out.push_str(":Body");
    for (p, uri) in namespaces {
        match p.as_deref() {
            None => out.push_str(" xmlns=\""),
            // `xml` is bound by definition and `xmlns` cannot be; an empty URI only
            // undeclares a default namespace (XML Namespaces 1.0).
            Some("xml" | "xmlns") => continue,
            Some(_) if uri.is_empty() => continue,
            Some(p) => {
                out.push_str(" xmlns:");
                out.push_str(p);
                out.push_str("=\"");
            }
        }
        out.push_str(&escape(uri.as_str()));
        out.push('"');
    }
    out.push('>');
    out.push_str(body);
    out.push_str("</");
    out.push_str(&prefix);
    out.push_str(":Body></");
    out.push_str(&prefix);
    out.push_str(":Envelope>");
    out
}

/// `envelope` (one we wrote: its Header opens as `write_envelope` opens it) with a
/// `wsse:Security` block holding `token` as the Header's first block, marked mustUnderstand
/// as the UsernameToken Profile's senders do. `None` when the envelope has no Header.
pub fn with_security(
    envelope: &str,
    version: SoapVersion,
    token: &UsernameToken,
) -> Option<String> {
    let p = match version {
        SoapVersion::Soap11 => &SOAP11_PARTS,
        SoapVersion::Soap12 => &SOAP12_PARTS,
    };
    let at = envelope.find(p.header_open)? + p.header_open.len();
    let password_type = if token.digest {
        PASSWORD_DIGEST
    } else {
        PASSWORD_TEXT
    };
    let mut block = String::with_capacity(768);
    block.push_str("<wsse:Security");
    block.push_str(p.must_understand);
    block.push_str(" xmlns:wsse=\"");
    block.push_str(WSSE_NS);
    block.push_str("\" xmlns:wsu=\"");
    block.push_str(WSU_NS);
    block.push_str("\"><wsse:UsernameToken><wsse:Username>");
    block.push_str(&xml_text(&token.username));
    block.push_str("</wsse:Username><wsse:Password Type=\"");
    block.push_str(password_type);
    block.push_str("\">");
    block.push_str(&xml_text(token.password.as_deref().unwrap_or_default()));
    block.push_str("</wsse:Password>");
    if let Some(nonce) = &token.nonce {
        block.push_str("<wsse:Nonce EncodingType=\"");
        block.push_str(BASE64_BINARY);
        block.push_str("\">");
        block.push_str(&xml_text(nonce));
        block.push_str("</wsse:Nonce>");
    }
    if let Some(created) = &token.created {
        block.push_str("<wsu:Created>");
        block.push_str(&xml_text(created));
        block.push_str("</wsu:Created>");
    }
    block.push_str("</wsse:UsernameToken></wsse:Security>");
    let mut out = String::with_capacity(envelope.len() + block.len());
    out.push_str(&envelope[..at]);
    out.push_str(&block);
    out.push_str(&envelope[at..]);
    Some(out)
}

/// Free text as XML character data: escaped, and with characters XML cannot carry replaced.
fn xml_text(text: &str) -> String {
    let legal: String = text
        .chars()
        .map(|c| if is_xml_char(c) { c } else { '\u{FFFD}' })
        .collect();
    escape(legal.as_str()).into_owned()
}

/// Prefix-specific fragments of one SOAP version.
struct VersionParts {
    envelope_open: &'static str,
    header_open: &'static str,
    header_close: &'static str,
    body_open: &'static str,
    close: &'static str,
    must_understand: &'static str,
    /// The namespaces a header block written on its own declares (`write_header_block`).
    block_declarations: &'static str,
}

const SOAP11_PARTS: VersionParts = VersionParts {
    envelope_open: concat!(
        "<soap:Envelope xmlns:soap=\"http://schemas.xmlsoap.org/soap/envelope/\" xmlns:wsrm=\"",
        "http://docs.oasis-open.org/wsrm/2004/06/ws-reliability-1.1.xsd",
        "\">"
    ),
    header_open: "<soap:Header>",
    header_close: "</soap:Header>",
    body_open: "<soap:Body>",
    close: "</soap:Body></soap:Envelope>",
    must_understand: " soap:mustUnderstand=\"1\"",
    block_declarations: concat!(
        " xmlns:soap=\"http://schemas.xmlsoap.org/soap/envelope/\" xmlns:wsrm=\"",
        "http://docs.oasis-open.org/wsrm/2004/06/ws-reliability-1.1.xsd",
        "\""
    ),
};

const SOAP12_PARTS: VersionParts = VersionParts {
    envelope_open: concat!(
        "<env:Envelope xmlns:env=\"http://www.w3.org/2003/05/soap-envelope\" xmlns:wsrm=\"",
        "http://docs.oasis-open.org/wsrm/2004/06/ws-reliability-1.1.xsd",
        "\">"
    ),
    header_open: "<env:Header>",
    header_close: "</env:Header>",
    body_open: "<env:Body>",
    close: "</env:Body></env:Envelope>",
    must_understand: " env:mustUnderstand=\"true\"",
    block_declarations: concat!(
        " xmlns:env=\"http://www.w3.org/2003/05/soap-envelope\" xmlns:wsrm=\"",
        "http://docs.oasis-open.org/wsrm/2004/06/ws-reliability-1.1.xsd",
        "\""
    ),
};

struct EnvelopeWriter {
    out: String,
    p: &'static VersionParts,
    /// Blocks declare their namespaces themselves: they go into someone else's envelope.
    standalone: bool,
}

impl EnvelopeWriter {
    fn start(version: SoapVersion, extra: usize) -> EnvelopeWriter {
        debug_assert!(SOAP11_PARTS.envelope_open.contains(WSRM_NS));
        let p = match version {
            SoapVersion::Soap11 => &SOAP11_PARTS,
            SoapVersion::Soap12 => &SOAP12_PARTS,
        };
        let mut out = String::with_capacity(768 + extra);
        out.push_str(p.envelope_open);
        EnvelopeWriter {
            out,
            p,
            standalone: false,
        }
    }

    fn push_all(&mut self, parts: &[&str]) {
        for part in parts {
            self.out.push_str(part);
        }
    }

    fn headers(&mut self, h: Headers<'_>) {
        let response = h.response.filter(|r| has_replies(r));
        let poll = h.poll_request.filter(|p| !p.refs.is_empty());
        if h.request.is_none() && response.is_none() && poll.is_none() {
            return;
        }
        self.out.push_str(self.p.header_open);
        if let Some(r) = h.request {
            self.request(r);
        }
        if let Some(r) = response {
            self.response(r);
        }
        if let Some(p) = poll {
            self.poll_request(p);
        }
        self.out.push_str(self.p.header_close);
    }

    fn request(&mut self, r: &Request) {
        self.block_open("Request");
        let id = &r.message_id;
        self.push_all(&[
            "<wsrm:MessageId groupId=\"",
            &escape(id.group_id.as_str()),
            "\"",
        ]);
        match &id.sequence {
            None => self.out.push_str("/>"),
            Some(seq) => {
                self.out.push_str("><wsrm:SequenceNum number=\"");
                self.out.push_str(&seq.number.to_string());
                self.out.push('"');
                if seq.last {
                    self.out.push_str(" last=\"true\"");
                }
                match &seq.group_limit {
                    None => {}
                    Some(GroupLimit::ExpiryTime(t)) => {
                        self.out.push_str(" groupExpiryTime=\"");
                        format_date_time(t, &mut self.out);
                        self.out.push('"');
                    }
                    Some(GroupLimit::MaxIdleDuration(d)) => {
                        self.push_all(&[" groupMaxIdleDuration=\"", &d.to_string(), "\""]);
                    }
                }
                self.out.push_str("/></wsrm:MessageId>");
            }
        }
        self.out.push_str("<wsrm:ExpiryTime>");
        format_date_time(&r.expiry_time, &mut self.out);
        self.out
            .push_str("</wsrm:ExpiryTime><wsrm:ReplyPattern><wsrm:Value>");
        self.out.push_str(r.reply_pattern.value());
        self.out.push_str("</wsrm:Value>");
        if let ReplyPattern::Callback(to) = &r.reply_pattern {
            self.reply_to(to);
        }
        self.out.push_str("</wsrm:ReplyPattern>");
        for (on, marker) in [
            (r.ack_requested, "<wsrm:AckRequested/>"),
            (r.duplicate_elimination, "<wsrm:DuplicateElimination/>"),
            (r.message_order, "<wsrm:MessageOrder/>"),
        ] {
            if on {
                self.out.push_str(marker);
            }
        }
        self.out.push_str("</wsrm:Request>");
    }

    fn response(&mut self, r: &Response) {
        self.block_open("Response");
        for reply in &r.replies {
            match reply {
                Reply::NonSequence { group_id, fault } => {
                    self.push_all(&[
                        "<wsrm:NonSequenceReply groupId=\"",
                        &escape(group_id.as_str()),
                        "\"",
                    ]);
                    self.fault_attr(*fault);
                    self.out.push_str("/>");
                }
                Reply::Sequence { group_id, ranges } if !ranges.is_empty() => {
                    self.push_all(&[
                        "<wsrm:SequenceReplies groupId=\"",
                        &escape(group_id.as_str()),
                        "\">",
                    ]);
                    for r in ranges {
                        self.range("ReplyRange", r.range.from(), r.range.to());
                        self.fault_attr(r.fault);
                        self.out.push_str("/>");
                    }
                    self.out.push_str("</wsrm:SequenceReplies>");
                }
                Reply::Sequence { .. } => {}
            }
        }
        self.out.push_str("</wsrm:Response>");
    }

    fn poll_request(&mut self, p: &PollRequest) {
        self.block_open("PollRequest");
        for r in &p.refs {
            self.push_all(&[
                "<wsrm:RefToMessageIds groupId=\"",
                &escape(r.group_id.as_str()),
                "\"",
            ]);
            if r.ranges.is_empty() {
                self.out.push_str("/>");
                continue;
            }
            self.out.push('>');
            for range in &r.ranges {
                self.range("SequenceNumRange", range.from(), range.to());
                self.out.push_str("/>");
            }
            self.out.push_str("</wsrm:RefToMessageIds>");
        }
        if let Some(to) = &p.reply_to {
            self.reply_to(to);
        }
        self.out.push_str("</wsrm:PollRequest>");
    }

    fn block_open(&mut self, name: &str) {
        self.push_all(&["<wsrm:", name]);
        if self.standalone {
            self.out.push_str(self.p.block_declarations);
        }
        self.push_all(&[self.p.must_understand, ">"]);
    }

    fn reply_to(&mut self, to: &ReplyTo) {
        self.out.push_str("<wsrm:ReplyTo");
        if let Some(scheme) = &to.reference_scheme {
            self.push_all(&[" reference-scheme=\"", &escape(scheme.as_str()), "\""]);
        }
        self.push_all(&[
            "><wsrm:BareURI>",
            &escape(to.uri.as_str()),
            "</wsrm:BareURI></wsrm:ReplyTo>",
        ]);
    }

    fn range(&mut self, element: &str, from: u64, to: u64) {
        self.push_all(&[
            "<wsrm:",
            element,
            " from=\"",
            &from.to_string(),
            "\" to=\"",
            &to.to_string(),
            "\"",
        ]);
    }

    fn fault_attr(&mut self, fault: Option<FaultCode>) {
        if let Some(code) = fault {
            self.push_all(&[" fault=\"wsrm:", code.local_name(), "\""]);
        }
    }

    fn finish(mut self) -> String {
        self.out.push_str(self.p.close);
        self.out
    }
}

fn has_replies(r: &Response) -> bool {
    r.replies.iter().any(|reply| match reply {
        Reply::NonSequence { .. } => true,
        Reply::Sequence { ranges, .. } => !ranges.is_empty(),
    })
}
