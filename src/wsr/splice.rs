//! Edits of a whole SOAP envelope as text, for request-response operations (D16): the
//! partner's request without its WS-R header blocks (what a SOAP backend is sent), and a
//! backend's answer with our `wsrm:Response` block added to its Header (what the partner gets
//! under the Response pattern). Everything else in the envelope stays byte for byte as it
//! was: prefixes, other header blocks, the Body.

use quick_xml::NsReader;
use quick_xml::events::Event;
use quick_xml::name::{Namespace, ResolveResult};

use super::model::{SOAP11_NS, SOAP12_NS, SoapVersion, WSRM_NS, WSSE_NS};

/// What an answer from a SOAP service is, read enough to answer with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    pub version: SoapVersion,
    /// The Body's first child is a SOAP Fault.
    pub fault: bool,
    /// Where a header block goes: before the Header's end tag, or, with no Header, a whole
    /// Header before the Body.
    insert: Insert,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Insert {
    /// Byte offset of `</…:Header>`.
    IntoHeader(usize),
    /// An empty `<…:Header/>` element: its byte range, replaced by an open Header.
    EmptyHeader(usize, usize, String),
    /// Byte offset of the Body's start tag, and the Envelope's qualified-name prefix.
    BeforeBody(usize, String),
}

fn soap_version(ns: &ResolveResult<'_>) -> Option<SoapVersion> {
    match ns {
        ResolveResult::Bound(Namespace(uri)) if *uri == SOAP11_NS => Some(SoapVersion::Soap11),
        ResolveResult::Bound(Namespace(uri)) if *uri == SOAP12_NS => Some(SoapVersion::Soap12),
        _ => None,
    }
}

fn is_wsrm(ns: &ResolveResult<'_>) -> bool {
    matches!(ns, ResolveResult::Bound(Namespace(uri)) if *uri == WSRM_NS)
}

/// A header block the partner addressed to us alone: WS-R's, and WS-Security's (its
/// UsernameToken proves the partner to us; a service behind us must not see its password).
fn is_ours(ns: &ResolveResult<'_>, local: &str) -> bool {
    is_wsrm(ns)
        || (local == "Security"
            && matches!(ns, ResolveResult::Bound(Namespace(uri)) if *uri == WSSE_NS))
}

fn ill(e: impl std::fmt::Display) -> String {
    format!("not a well-formed SOAP envelope: {e}")
}

fn position(reader: &NsReader<&[u8]>) -> usize {
    usize::try_from(reader.buffer_position()).unwrap_or(usize::MAX)
}

/// Reads the Envelope's start and the element after it: the SOAP version, the Header (if
/// any) and the Body's first child.
pub fn shape(envelope: &str) -> Result<Shape, String> {
    let mut reader = NsReader::from_reader(envelope.as_bytes());
    let mut version = None;
    let mut prefix = String::new();
    let mut insert = None;
    let mut depth = 0usize;
    let mut in_body = false;
    loop {
        let before = position(&reader);
        let (ns, event) = reader.read_resolved_event().map_err(ill)?;
        match event {
            Event::Empty(_) if depth == 0 => return Err(ill("the Envelope is empty")),
            Event::Start(e) if depth == 0 => {
                let v = soap_version(&ns)
                    .filter(|_| e.local_name().as_ref() == "Envelope")
                    .ok_or_else(|| ill("the root is no SOAP Envelope"))?;
                version = Some(v);
                prefix = e
                    .name()
                    .prefix()
                    .map(|p| p.as_ref().to_owned())
                    .unwrap_or_default();
                depth = 1;
            }
            Event::Start(e) if depth == 1 && soap_version(&ns) == version => {
                match e.local_name().as_ref() {
                    "Header" => {
                        let end = reader.read_to_end(e.name()).map_err(ill)?;
                        insert = Some(Insert::IntoHeader(
                            usize::try_from(end.end).unwrap_or(usize::MAX),
                        ));
                    }
                    "Body" => {
                        insert.get_or_insert(Insert::BeforeBody(before, prefix.clone()));
                        depth = 2;
                        in_body = true;
                    }
                    _ => return Err(ill("an element other than Header or Body in the Envelope")),
                }
            }
            Event::Empty(e) if depth == 1 && soap_version(&ns) == version => {
                match e.local_name().as_ref() {
                    "Header" => {
                        let qname = e.name().as_ref().to_owned();
                        insert = Some(Insert::EmptyHeader(before, position(&reader), qname));
                    }
                    "Body" => {
                        let insert = insert.unwrap_or(Insert::BeforeBody(before, prefix));
                        let version = version.ok_or_else(|| ill("no Envelope"))?;
                        return Ok(Shape {
                            version,
                            fault: false,
                            insert,
                        });
                    }
                    _ => return Err(ill("an element other than Header or Body in the Envelope")),
                }
            }
            Event::Start(_) | Event::Empty(_) if depth == 1 => {
                return Err(ill("an element other than Header or Body in the Envelope"));
            }
            Event::Start(e) | Event::Empty(e) if in_body => {
                let version = version.ok_or_else(|| ill("no Envelope"))?;
                let fault =
                    soap_version(&ns) == Some(version) && e.local_name().as_ref() == "Fault";
                let insert = insert.ok_or_else(|| ill("no Body"))?;
                return Ok(Shape {
                    version,
                    fault,
                    insert,
                });
            }
            Event::End(_) if in_body => {
                // An empty Body.
                let version = version.ok_or_else(|| ill("no Envelope"))?;
                let insert = insert.ok_or_else(|| ill("no Body"))?;
                return Ok(Shape {
                    version,
                    fault: false,
                    insert,
                });
            }
            Event::Eof => return Err(ill("it ends before its Body")),
            Event::DocType(_) => return Err(ill("a DOCTYPE")),
            _ => {}
        }
    }
}

/// Whether `envelope` is well-formed to its end: every element closed, in order, and nothing
/// after the root but whitespace, comments or processing instructions.
pub fn well_formed(envelope: &str) -> Result<(), String> {
    let mut reader = NsReader::from_reader(envelope.as_bytes());
    let mut depth = 0usize;
    let mut roots = 0usize;
    loop {
        match reader.read_resolved_event().map_err(ill)?.1 {
            Event::Start(_) => {
                if depth == 0 {
                    roots += 1;
                }
                depth += 1;
            }
            Event::Empty(_) if depth == 0 => roots += 1,
            Event::End(_) => depth = depth.saturating_sub(1),
            Event::Text(t) if depth == 0 && !t.as_ref().trim().is_empty() => {
                return Err(ill("text after the Envelope"));
            }
            Event::DocType(_) => return Err(ill("a DOCTYPE")),
            Event::Eof if depth > 0 => return Err(ill("it ends inside an element")),
            Event::Eof => break,
            _ => {}
        }
        if roots > 1 {
            return Err(ill("more than one root element"));
        }
    }
    Ok(())
}

/// `envelope` with `block` (a header block that declares its own namespaces) as the last
/// block of its Header; a Header is added before the Body where there is none.
pub fn with_header_block(envelope: &str, shape: &Shape, block: &str) -> String {
    let mut out = String::with_capacity(envelope.len() + block.len() + 64);
    match &shape.insert {
        Insert::IntoHeader(at) => {
            out.push_str(&envelope[..*at]);
            out.push_str(block);
            out.push_str(&envelope[*at..]);
        }
        Insert::EmptyHeader(from, to, qname) => {
            out.push_str(&envelope[..*from]);
            out.push_str(&format!("<{qname}>{block}</{qname}>"));
            out.push_str(&envelope[*to..]);
        }
        Insert::BeforeBody(at, prefix) => {
            let header = match prefix.as_str() {
                "" => "Header".to_owned(),
                p => format!("{p}:Header"),
            };
            out.push_str(&envelope[..*at]);
            out.push_str(&format!("<{header}>{block}</{header}>"));
            out.push_str(&envelope[*at..]);
        }
    }
    out
}

/// `envelope` without its WS-R header blocks (Request, PollRequest, Response) and its
/// `wsse:Security` (the partner's credentials for us): what the SOAP service behind a
/// request-response channel is sent. Other header blocks stay.
pub fn without_wsr_blocks(envelope: &str) -> Result<String, String> {
    let mut reader = NsReader::from_reader(envelope.as_bytes());
    let mut cuts: Vec<(usize, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut in_header = false;
    loop {
        let before = position(&reader);
        let (ns, event) = reader.read_resolved_event().map_err(ill)?;
        match event {
            Event::Start(e) => {
                if in_header && depth == 2 && is_ours(&ns, e.local_name().as_ref()) {
                    reader.read_to_end(e.name()).map_err(ill)?;
                    cuts.push((before, position(&reader)));
                    continue;
                }
                if depth == 1 && e.local_name().as_ref() == "Header" {
                    in_header = true;
                }
                if depth == 1 && e.local_name().as_ref() == "Body" {
                    break;
                }
                depth += 1;
            }
            Event::Empty(e) if in_header && depth == 2 && is_ours(&ns, e.local_name().as_ref()) => {
                cuts.push((before, position(&reader)));
            }
            Event::End(_) => {
                depth = depth.saturating_sub(1);
                if depth == 1 {
                    in_header = false;
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    let mut out = String::with_capacity(envelope.len());
    let mut from = 0;
    for (start, end) in cuts {
        out.push_str(&envelope[from..start]);
        from = end;
    }
    out.push_str(&envelope[from..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WITH_HEADER: &str = "<S:Envelope xmlns:S=\"http://schemas.xmlsoap.org/soap/envelope/\">\
        <S:Header><x:Trace xmlns:x=\"urn:x\">1</x:Trace></S:Header>\
        <S:Body><e:echoResponse xmlns:e=\"urn:echo\">hi</e:echoResponse></S:Body></S:Envelope>";

    #[test]
    fn an_element_of_another_namespace_beside_header_and_body_is_refused() {
        let odd = "<S:Envelope xmlns:S=\"http://schemas.xmlsoap.org/soap/envelope/\">\
            <x:Header xmlns:x=\"urn:x\"><S:Body><a/></S:Body></x:Header>\
            <S:Body><e:r xmlns:e=\"urn:e\"/></S:Body></S:Envelope>";
        assert!(shape(odd).is_err());
        assert!(well_formed(WITH_HEADER).is_ok());
        assert!(well_formed(&WITH_HEADER[..WITH_HEADER.len() - 3]).is_err());
    }

    #[test]
    fn a_block_goes_last_into_an_existing_header() {
        let shape = shape(WITH_HEADER).expect("shape");
        assert_eq!(shape.version, SoapVersion::Soap11);
        assert!(!shape.fault);
        let out = with_header_block(WITH_HEADER, &shape, "<w:R xmlns:w=\"urn:w\"/>");
        assert!(
            out.contains("</x:Trace><w:R xmlns:w=\"urn:w\"/></S:Header><S:Body>"),
            "{out}"
        );
    }

    #[test]
    fn a_header_is_added_before_the_body_in_the_envelopes_prefix() {
        let env = "<env:Envelope xmlns:env=\"http://www.w3.org/2003/05/soap-envelope\">\n\
            <env:Body><env:Fault><env:Code><env:Value>env:Receiver</env:Value></env:Code>\
            </env:Fault></env:Body></env:Envelope>";
        let shape = shape(env).expect("shape");
        assert_eq!(shape.version, SoapVersion::Soap12);
        assert!(shape.fault);
        let out = with_header_block(env, &shape, "<b/>");
        assert!(
            out.contains("\n<env:Header><b/></env:Header><env:Body>"),
            "{out}"
        );
        let default_ns = "<Envelope xmlns=\"http://schemas.xmlsoap.org/soap/envelope/\">\
            <Header/><Body/></Envelope>";
        let shape = super::shape(default_ns).expect("shape");
        assert_eq!(
            with_header_block(default_ns, &shape, "<b/>"),
            "<Envelope xmlns=\"http://schemas.xmlsoap.org/soap/envelope/\">\
             <Header><b/></Header><Body/></Envelope>"
        );
    }

    #[test]
    fn what_is_no_soap_envelope_has_no_shape() {
        assert!(shape("<html><body>502</body></html>").is_err());
        assert!(shape("<S:Envelope xmlns:S=\"urn:not-soap\"><S:Body/></S:Envelope>").is_err());
        assert!(shape("not xml").is_err());
        assert!(shape(&WITH_HEADER[..60]).is_err());
    }

    #[test]
    fn the_wsr_blocks_are_cut_and_the_rest_kept() {
        let env = "<s:Envelope xmlns:s=\"http://schemas.xmlsoap.org/soap/envelope/\" \
            xmlns:wsrm=\"http://docs.oasis-open.org/wsrm/2004/06/ws-reliability-1.1.xsd\">\
            <s:Header><wsrm:Request s:mustUnderstand=\"1\"><wsrm:MessageId groupId=\"g\"/>\
            </wsrm:Request><x:Keep xmlns:x=\"urn:x\"><wsrm:Inner/></x:Keep>\
            <wsrm:PollRequest/></s:Header><s:Body><e:echo xmlns:e=\"urn:echo\"/></s:Body>\
            </s:Envelope>";
        let out = without_wsr_blocks(env).expect("cut");
        assert_eq!(
            out,
            "<s:Envelope xmlns:s=\"http://schemas.xmlsoap.org/soap/envelope/\" \
             xmlns:wsrm=\"http://docs.oasis-open.org/wsrm/2004/06/ws-reliability-1.1.xsd\">\
             <s:Header><x:Keep xmlns:x=\"urn:x\"><wsrm:Inner/></x:Keep></s:Header>\
             <s:Body><e:echo xmlns:e=\"urn:echo\"/></s:Body></s:Envelope>"
        );
    }
}
