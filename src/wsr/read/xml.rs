//! A namespace-aware, limit-enforcing cursor over one XML document (quick-xml underneath).
//!
//! It hands out elements with their namespace already classified, resolves character and the
//! five predefined entity references, refuses DOCTYPE (and with it every entity declaration),
//! and enforces the D13 limits on every element, including those inside the Body.
//!
//! Namespace scope is kept here rather than by quick-xml's `NsReader`: the attribute pass that
//! enforces the limits already sees every `xmlns` declaration, and doing the scoping in that
//! same pass halves the cost of reading a typical message (see `benches/codec.rs`).

use std::borrow::Cow;

use quick_xml::events::{BytesStart, Event};
use quick_xml::name::{PrefixDeclaration, QName};
use quick_xml::{Reader, XmlVersion};

use super::Limits;
use crate::wsr::lexical::excerpt;
use crate::wsr::lexical::{is_xml_char, xml_trim};
use crate::wsr::model::{REF_NS, SOAP11_NS, SOAP12_NS, SoapVersion, WSRM_NS, WSSE_NS, WSU_NS};

const XML_NS: &str = "http://www.w3.org/XML/1998/namespace";
const SOAP11_NEXT: &str = "http://schemas.xmlsoap.org/soap/actor/next";
const SOAP12_NEXT: &str = "http://www.w3.org/2003/05/soap-envelope/role/next";
const SOAP12_ULTIMATE: &str = "http://www.w3.org/2003/05/soap-envelope/role/ultimateReceiver";

/// Fatal for the whole document: not well-formed, hostile, or over a limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XmlError(pub String);

pub type XmlResult<T> = Result<T, XmlError>;

fn ill(what: impl std::fmt::Display) -> XmlError {
    XmlError(format!("not well-formed XML: {what}"))
}

/// The namespaces this codec cares about; everything else is `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ns {
    None,
    Soap11,
    Soap12,
    Wsrm,
    Ref,
    /// WS-Security's `wsse` and `wsu`.
    Wsse,
    Wsu,
    Other,
}

impl Ns {
    fn classify(uri: Option<&str>) -> Ns {
        match uri {
            None => Ns::None,
            Some(WSRM_NS) => Ns::Wsrm,
            Some(SOAP11_NS) => Ns::Soap11,
            Some(SOAP12_NS) => Ns::Soap12,
            Some(REF_NS) => Ns::Ref,
            Some(WSSE_NS) => Ns::Wsse,
            Some(WSU_NS) => Ns::Wsu,
            Some(_) => Ns::Other,
        }
    }
}

/// One `xmlns` declaration in scope: made on the element at `depth` (1 = root).
struct Binding<'a> {
    /// Empty for the default namespace.
    prefix: &'a str,
    /// Empty when the default namespace is undeclared (`xmlns=""`).
    uri: Cow<'a, str>,
    depth: usize,
}

/// A namespace declaration as written: `prefix` `None` for the default namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declaration<'a> {
    pub prefix: Option<&'a str>,
    pub uri: Cow<'a, str>,
}

/// The same text as `part`, but borrowed from `src` (which it is a slice of) so that it lives
/// as long as the document; an owned copy if it is not a slice of `src`.
fn reborrow<'a>(src: &'a str, part: &str) -> Cow<'a, str> {
    let start = (part.as_ptr() as usize).wrapping_sub(src.as_ptr() as usize);
    match src.get(start..start.wrapping_add(part.len())) {
        Some(same) if std::ptr::eq(same.as_ptr(), part.as_ptr()) => Cow::Borrowed(same),
        _ => Cow::Owned(part.to_owned()),
    }
}

/// What a prefix resolves to.
enum Resolved<'s> {
    /// No prefix and no default namespace (or an attribute without prefix).
    Unbound,
    Bound(&'s str),
    /// A prefix with no declaration in scope: the document is not namespace-well-formed.
    Unknown,
}

/// One element start: `<x ...>` (`empty == false`, children follow) or `<x .../>`.
pub struct Elem<'a> {
    pub ns: Ns,
    pub start: BytesStart<'a>,
    pub empty: bool,
    /// Where the local name starts in the element's name: found once, where the readers of
    /// the blocks ask for it several times (each a search for `:`).
    local_at: usize,
}

impl Elem<'_> {
    pub fn local(&self) -> &str {
        let name = self.start.name().into_inner();
        name.get(self.local_at..).unwrap_or(name)
    }
}

pub enum Node<'a> {
    Open(Elem<'a>),
    Text(Cow<'a, str>),
    /// The end of the element opened last.
    Close,
}

/// One attribute of an element, with its namespace classified.
pub struct Attr<'v> {
    pub ns: Ns,
    pub local: &'v str,
    pub value: Cow<'v, str>,
}

pub struct XmlCursor<'a, 'l> {
    reader: Reader<&'a [u8]>,
    src: &'a str,
    bindings: Vec<Binding<'a>>,
    /// Indices into `bindings` of the default-namespace declarations, so that unprefixed
    /// names resolve without a scan.
    defaults: Vec<usize>,
    limits: &'l Limits,
    depth: usize,
    /// Where the event last returned by `next` starts (comments skipped before it excluded).
    event_start: usize,
    /// Whether any event was read yet: an XML declaration may only come first.
    started: bool,
    failed: bool,
}

impl<'a, 'l> XmlCursor<'a, 'l> {
    pub fn new(src: &'a str, limits: &'l Limits) -> Self {
        XmlCursor {
            reader: {
                let mut reader = Reader::from_str(src);
                // `--` inside a comment is not well-formed XML.
                reader.config_mut().check_comments = true;
                reader
            },
            src,
            bindings: Vec::new(),
            defaults: Vec::new(),
            limits,
            depth: 0,
            event_start: 0,
            started: false,
            failed: false,
        }
    }

    pub fn limits(&self) -> &'l Limits {
        self.limits
    }

    /// Byte offset just after the last event read.
    pub fn position(&self) -> usize {
        // The input is a &str of at most `max_bytes`, so the offset always fits.
        usize::try_from(self.reader.buffer_position()).unwrap_or(usize::MAX)
    }

    /// Byte offset where the node last returned by `next` starts.
    pub fn event_start(&self) -> usize {
        self.event_start
    }

    pub fn depth(&self) -> usize {
        self.depth
    }

    /// The next node; comments, processing instructions and the XML declaration are consumed
    /// (after checking the declared encoding). `None` at the end of the document.
    pub fn next(&mut self) -> XmlResult<Option<Node<'a>>> {
        let node = self.read_node();
        self.failed |= node.is_err();
        node
    }

    /// Whether the document turned out not to be well-formed (or over a limit): after that,
    /// nothing more can be read from it.
    pub fn failed(&self) -> bool {
        self.failed
    }

    fn read_node(&mut self) -> XmlResult<Option<Node<'a>>> {
        // Declarations of elements that are closed (or were empty) go out of scope.
        while self.bindings.last().is_some_and(|b| b.depth > self.depth) {
            self.bindings.pop();
        }
        while self
            .defaults
            .last()
            .is_some_and(|&i| i >= self.bindings.len())
        {
            self.defaults.pop();
        }
        loop {
            self.event_start = self.position();
            let event = self.reader.read_event().map_err(ill)?;
            let first = !std::mem::replace(&mut self.started, true);
            match event {
                Event::Start(start) => {
                    let elem = self.element(start, false)?;
                    self.depth += 1;
                    if self.depth > self.limits.max_depth {
                        return Err(XmlError(format!(
                            "elements nested deeper than the limit of {}",
                            self.limits.max_depth
                        )));
                    }
                    return Ok(Some(Node::Open(elem)));
                }
                Event::Empty(start) => return Ok(Some(Node::Open(self.element(start, true)?))),
                Event::End(_) => {
                    self.depth = self.depth.saturating_sub(1);
                    return Ok(Some(Node::Close));
                }
                // Header values are trimmed, so line-end normalization would change nothing.
                Event::Text(t) => {
                    let text = t.into_inner();
                    if contains_cdata_end(text.as_bytes()) {
                        return Err(ill("']]>' in character data"));
                    }
                    return Ok(Some(Node::Text(text)));
                }
                Event::CData(t) => return Ok(Some(Node::Text(t.xml10_content()))),
                Event::GeneralRef(r) => {
                    let ch = match r.resolve_char_ref().map_err(ill)? {
                        Some(ch) if is_xml_char(ch) => ch,
                        Some(ch) => {
                            return Err(ill(format_args!(
                                "character reference to U+{:04X}, which XML does not allow",
                                u32::from(ch)
                            )));
                        }
                        None => predefined_entity(&r)?,
                    };
                    return Ok(Some(Node::Text(Cow::Owned(ch.to_string()))));
                }
                Event::DocType(_) => {
                    return Err(XmlError(
                        "DOCTYPE and entity declarations are not allowed in SOAP messages"
                            .to_owned(),
                    ));
                }
                Event::Decl(_) if !first => {
                    return Err(ill("an XML declaration that is not at the start"));
                }
                Event::Decl(decl) => {
                    if let Some(enc) = decl.encoding() {
                        let enc = enc.map_err(ill)?;
                        if !enc.eq_ignore_ascii_case("utf-8") && !enc.eq_ignore_ascii_case("utf8") {
                            return Err(XmlError(format!(
                                "encoding '{}' is not supported; send UTF-8",
                                excerpt(&enc)
                            )));
                        }
                    }
                }
                Event::Comment(_) | Event::PI(_) => {}
                Event::Eof => {
                    if self.depth > 0 {
                        return Err(ill("the document ends inside an element"));
                    }
                    return Ok(None);
                }
            }
        }
    }

    /// Like `next`, but the end of the document inside an element is an error.
    pub fn next_in_element(&mut self) -> XmlResult<Node<'a>> {
        self.next()?
            .ok_or_else(|| ill("unexpected end of document"))
    }

    fn element(&mut self, start: BytesStart<'a>, empty: bool) -> XmlResult<Elem<'a>> {
        let name = start.name();
        if name.as_ref().len() > self.limits.max_name_len {
            return Err(XmlError(format!(
                "an element name is longer than the limit of {} bytes",
                self.limits.max_name_len
            )));
        }
        let depth = self.depth + 1;
        // One pass over the attributes checks them all (count, sizes, syntax, duplicates,
        // entities), so that no element anywhere can cost more than the limits allow, and
        // brings this element's namespace declarations into scope.
        let mut count = 0;
        let mut prefixed_attribute = false;
        for attr in start.attributes() {
            let attr = attr.map_err(ill)?;
            count += 1;
            if count > self.limits.max_attributes {
                return Err(XmlError(format!(
                    "an element has more than {} attributes",
                    self.limits.max_attributes
                )));
            }
            if attr.key.as_ref().len() > self.limits.max_name_len {
                return Err(XmlError(format!(
                    "an attribute name is longer than the limit of {} bytes",
                    self.limits.max_name_len
                )));
            }
            if attr.value.len() > self.limits.max_value_len {
                return Err(XmlError(format!(
                    "an attribute value is longer than the limit of {} bytes",
                    self.limits.max_value_len
                )));
            }
            if attr.value.contains('<') {
                return Err(ill("'<' in an attribute value"));
            }
            let value = if attr.value.contains('&') {
                let value = attr
                    .normalized_value(XmlVersion::Implicit1_0)
                    .map_err(ill)?;
                if !value.chars().all(is_xml_char) {
                    return Err(ill("a character reference XML does not allow"));
                }
                Cow::Owned(value.into_owned())
            } else {
                reborrow(self.src, &attr.value)
            };
            match attr.key.as_namespace_binding() {
                Some(declaration) => {
                    let prefix: &'a str = match declaration {
                        PrefixDeclaration::Default => "",
                        PrefixDeclaration::Named(p) => match reborrow(self.src, p) {
                            Cow::Borrowed(p) => p,
                            // Names are never escaped, so they are always slices of the source.
                            Cow::Owned(_) => {
                                return Err(ill("a namespace prefix outside the document"));
                            }
                        },
                    };
                    self.declare(prefix, value, depth)?;
                }
                None => prefixed_attribute |= attr.key.prefix().is_some(),
            }
        }
        let ns = match self.resolve(name, true) {
            Resolved::Unknown => {
                return Err(ill(format_args!(
                    "the prefix of '{}' is not bound",
                    excerpt(name.as_ref())
                )));
            }
            Resolved::Unbound => Ns::None,
            Resolved::Bound(uri) => Ns::classify(Some(uri)),
        };
        if prefixed_attribute {
            for attr in start.attributes() {
                let attr = attr.map_err(ill)?;
                if attr.key.as_namespace_binding().is_none()
                    && matches!(self.resolve(attr.key, false), Resolved::Unknown)
                {
                    return Err(ill(format_args!(
                        "the prefix of attribute '{}' is not bound",
                        excerpt(attr.key.as_ref())
                    )));
                }
            }
        }
        let local_at = name.as_ref().len() - name.local_name().as_ref().len();
        Ok(Elem {
            ns,
            start,
            empty,
            local_at,
        })
    }

    fn declare(&mut self, prefix: &'a str, uri: Cow<'a, str>, depth: usize) -> XmlResult<()> {
        if !prefix.is_empty() && uri.is_empty() {
            return Err(ill(format_args!(
                "prefix '{}' is undeclared, which XML 1.0 does not allow",
                excerpt(prefix)
            )));
        }
        if prefix == "xmlns" || (prefix == "xml") != (uri == XML_NS) {
            return Err(ill("the reserved prefixes xml and xmlns cannot be rebound"));
        }
        if self.bindings.len() >= self.limits.max_namespace_bindings {
            return Err(XmlError(format!(
                "more than {} namespace declarations in scope",
                self.limits.max_namespace_bindings
            )));
        }
        if prefix.is_empty() {
            self.defaults.push(self.bindings.len());
        }
        self.bindings.push(Binding { prefix, uri, depth });
        Ok(())
    }

    /// Resolves the prefix of a name in the current scope. Unprefixed attribute names are in
    /// no namespace; unprefixed element names take the default namespace.
    fn resolve(&self, name: QName<'_>, element: bool) -> Resolved<'_> {
        match name.prefix() {
            None if !element => Resolved::Unbound,
            None => match self.defaults.last().and_then(|&i| self.bindings.get(i)) {
                Some(b) if !b.uri.is_empty() => Resolved::Bound(b.uri.as_ref()),
                _ => Resolved::Unbound,
            },
            Some(prefix) => {
                let prefix = prefix.into_inner();
                if prefix == "xml" {
                    return Resolved::Bound(XML_NS);
                }
                match self.bindings.iter().rev().find(|b| b.prefix == prefix) {
                    Some(b) => Resolved::Bound(b.uri.as_ref()),
                    None => Resolved::Unknown,
                }
            }
        }
    }

    fn namespace_of(&self, name: QName<'_>, element: bool) -> Ns {
        match self.resolve(name, element) {
            Resolved::Bound(uri) => Ns::classify(Some(uri)),
            Resolved::Unbound | Resolved::Unknown => Ns::None,
        }
    }

    /// The attributes of an element just returned by `next` (namespace declarations left out).
    pub fn attributes<'e>(
        &'e self,
        elem: &'e Elem<'a>,
    ) -> impl Iterator<Item = XmlResult<Attr<'e>>> + 'e {
        elem.start.attributes().filter_map(move |attr| {
            let attr = match attr {
                Ok(attr) => attr,
                Err(e) => return Some(Err(ill(e))),
            };
            if attr.key.as_namespace_binding().is_some() {
                return None;
            }
            let value = if attr.value.contains('&') {
                match attr.normalized_value(XmlVersion::Implicit1_0) {
                    Ok(v) => Cow::Owned(v.into_owned()),
                    Err(e) => return Some(Err(ill(e))),
                }
            } else {
                attr.value
            };
            Some(Ok(Attr {
                ns: self.namespace_of(attr.key, false),
                local: attr.key.local_name().into_inner(),
                value,
            }))
        })
    }

    /// Whether a header block is addressed to us (the ultimate receiver) with mustUnderstand
    /// set, per the SOAP version's own attributes (`actor` / `role`).
    /// Reads the SOAP processing attributes of a header block: (mustUnderstand set, addressed
    /// to us). Addressed to us means no `actor`/`role`, or the next / ultimate receiver.
    pub fn header_targeting(
        &self,
        elem: &Elem<'a>,
        version: SoapVersion,
    ) -> XmlResult<(bool, bool)> {
        let (envelope_ns, role_attr, ours): (Ns, &str, &[&str]) = match version {
            SoapVersion::Soap11 => (Ns::Soap11, "actor", &[SOAP11_NEXT]),
            SoapVersion::Soap12 => (Ns::Soap12, "role", &[SOAP12_NEXT, SOAP12_ULTIMATE]),
        };
        let (mut must, mut for_us) = (false, true);
        for attr in self.attributes(elem) {
            let attr = attr?;
            if attr.ns != envelope_ns {
                continue;
            }
            if attr.local == "mustUnderstand" {
                must = matches!(xml_trim(&attr.value), "1" | "true");
            } else if attr.local == role_attr {
                for_us = ours.contains(&xml_trim(&attr.value));
            }
        }
        Ok((must, for_us))
    }

    /// Skips up to the end of the element open at `depth` (after a block stopped midway).
    pub fn skip_to_depth(&mut self, depth: usize) -> XmlResult<()> {
        while self.depth > depth {
            self.next_in_element()?;
        }
        Ok(())
    }

    /// Every namespace declaration in scope now, innermost last, one per prefix.
    pub fn in_scope(&self) -> Vec<Declaration<'a>> {
        let mut out: Vec<Declaration<'a>> = Vec::with_capacity(self.bindings.len());
        for b in &self.bindings {
            let prefix = (!b.prefix.is_empty()).then_some(b.prefix);
            out.retain(|d| d.prefix != prefix);
            out.push(Declaration {
                prefix,
                uri: b.uri.clone(),
            });
        }
        out
    }

    /// Resolves a QName-typed value (like `fault="r:GroupAborted"`) in the scope of the element
    /// just returned by `next`: (namespace, local name), or `None` for an unbound prefix.
    pub fn resolve_qname<'v>(&self, value: &'v str) -> Option<(Ns, &'v str)> {
        let qname = QName(xml_trim(value));
        let ns = match self.resolve(qname, true) {
            Resolved::Unknown => return None,
            Resolved::Unbound => Ns::None,
            Resolved::Bound(uri) => Ns::classify(Some(uri)),
        };
        Some((ns, qname.local_name().into_inner()))
    }

    /// The namespace URI of the element just returned by `next`, when it is bound.
    pub fn namespace_uri(&self, elem: &Elem<'_>) -> Option<String> {
        match self.resolve(elem.start.name(), true) {
            Resolved::Bound(uri) => Some(uri.to_owned()),
            Resolved::Unbound | Resolved::Unknown => None,
        }
    }

    /// Skips the rest of an element (its children and its end), still enforcing the limits.
    pub fn skip(&mut self, elem: &Elem<'_>) -> XmlResult<()> {
        if elem.empty {
            return Ok(());
        }
        let target = self.depth - 1;
        while self.depth > target {
            self.next_in_element()?;
        }
        Ok(())
    }

    /// The text content of a simple-content element, up to its end. `Ok(None)` when the element
    /// had child elements (they are skipped): the caller decides which fault that is.
    pub fn text(&mut self, elem: &Elem<'_>) -> XmlResult<Option<Cow<'a, str>>> {
        if elem.empty {
            return Ok(Some(Cow::Borrowed("")));
        }
        let mut text: Option<Cow<'a, str>> = None;
        let mut had_child = false;
        loop {
            match self.next_in_element()? {
                Node::Close => break,
                Node::Text(t) => {
                    text = Some(match text {
                        None => t,
                        Some(prev) => Cow::Owned(prev.into_owned() + &t),
                    });
                    if text
                        .as_ref()
                        .is_some_and(|t| t.len() > self.limits.max_value_len)
                    {
                        return Err(XmlError(format!(
                            "a header value is longer than the limit of {} bytes",
                            self.limits.max_value_len
                        )));
                    }
                }
                Node::Open(child) => {
                    had_child = true;
                    self.skip(&child)?;
                }
            }
        }
        Ok(if had_child {
            None
        } else {
            Some(text.unwrap_or(Cow::Borrowed("")))
        })
    }
}

/// Whether text holds `]]>`, which character data may not. `>` is rare in text, so looking
/// for it first is cheaper than a substring search on every text node.
fn contains_cdata_end(text: &[u8]) -> bool {
    memchr::memchr_iter(b'>', text).any(|i| i >= 2 && &text[i - 2..i] == b"]]")
}

fn predefined_entity(r: &quick_xml::events::BytesRef<'_>) -> XmlResult<char> {
    let name = r.xml10_content();
    match name.as_ref() {
        "amp" => Ok('&'),
        "lt" => Ok('<'),
        "gt" => Ok('>'),
        "quot" => Ok('"'),
        "apos" => Ok('\''),
        other => Err(ill(format_args!(
            "entity '&{};' is not declared (and declarations are not allowed)",
            excerpt(other)
        ))),
    }
}
