//! A namespace-aware, limit-enforcing cursor over one XML document (quick-xml underneath).
//!
//! It hands out elements with their namespace already classified, resolves character and the
//! five predefined entity references, refuses DOCTYPE (and with it every entity declaration),
//! and enforces the D13 limits on every element, including those inside the Body.

use std::borrow::Cow;

use quick_xml::events::{BytesStart, Event};
use quick_xml::name::{Namespace, QName, ResolveResult};
use quick_xml::{NsReader, XmlVersion};

use super::Limits;
use crate::wsr::datetime::truncate;
use crate::wsr::model::{REF_NS, SOAP11_NS, SOAP12_NS, WSRM_NS};

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
    Other,
}

impl Ns {
    fn classify(result: &ResolveResult<'_>) -> Ns {
        match result {
            ResolveResult::Unbound => Ns::None,
            ResolveResult::Bound(Namespace(uri)) => match *uri {
                WSRM_NS => Ns::Wsrm,
                SOAP11_NS => Ns::Soap11,
                SOAP12_NS => Ns::Soap12,
                REF_NS => Ns::Ref,
                _ => Ns::Other,
            },
            // Unknown prefixes are rejected before classification.
            ResolveResult::Unknown(_) => Ns::Other,
        }
    }
}

/// One element start: `<x ...>` (`empty == false`, children follow) or `<x .../>`.
pub struct Elem<'a> {
    pub ns: Ns,
    pub start: BytesStart<'a>,
    pub empty: bool,
}

impl Elem<'_> {
    pub fn local(&self) -> &str {
        self.start.local_name().into_inner()
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
    reader: NsReader<&'a [u8]>,
    limits: &'l Limits,
    depth: usize,
    /// Where the event last returned by `next` starts (comments skipped before it excluded).
    event_start: usize,
}

impl<'a, 'l> XmlCursor<'a, 'l> {
    pub fn new(src: &'a str, limits: &'l Limits) -> Self {
        let mut reader = NsReader::from_str(src);
        reader
            .resolver_mut()
            .set_max_namespace_bindings(limits.max_namespace_bindings);
        XmlCursor {
            reader,
            limits,
            depth: 0,
            event_start: 0,
        }
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
        loop {
            self.event_start = self.position();
            let event = self.reader.read_event().map_err(ill)?;
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
                Event::Text(t) => return Ok(Some(Node::Text(t.xml10_content()))),
                Event::CData(t) => return Ok(Some(Node::Text(t.xml10_content()))),
                Event::GeneralRef(r) => {
                    let ch = match r.resolve_char_ref().map_err(ill)? {
                        Some(ch) => ch,
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
                Event::Decl(decl) => {
                    if let Some(enc) = decl.encoding() {
                        let enc = enc.map_err(ill)?;
                        if !enc.eq_ignore_ascii_case("utf-8") && !enc.eq_ignore_ascii_case("utf8") {
                            return Err(XmlError(format!(
                                "encoding '{}' is not supported; send UTF-8",
                                truncate(&enc)
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

    fn element(&self, start: BytesStart<'a>, empty: bool) -> XmlResult<Elem<'a>> {
        let name = start.name();
        if name.as_ref().len() > self.limits.max_name_len {
            return Err(XmlError(format!(
                "an element name is longer than the limit of {} bytes",
                self.limits.max_name_len
            )));
        }
        let (resolved, _) = self.reader.resolver().resolve_element(name);
        if let ResolveResult::Unknown(prefix) = &resolved {
            return Err(ill(format_args!(
                "prefix '{}' is not bound",
                truncate(prefix)
            )));
        }
        let ns = Ns::classify(&resolved);
        // Check every attribute now (count, sizes, syntax, duplicates, entities), so that no
        // element anywhere can cost more than the limits allow.
        let mut count = 0;
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
            if attr.value.contains('&') {
                attr.normalized_value(XmlVersion::Implicit1_0)
                    .map_err(ill)?;
            }
            if attr.key.as_namespace_binding().is_none() {
                let (res, _) = self.reader.resolver().resolve_attribute(attr.key);
                if let ResolveResult::Unknown(prefix) = res {
                    return Err(ill(format_args!(
                        "prefix '{}' is not bound",
                        truncate(&prefix)
                    )));
                }
            }
        }
        Ok(Elem { ns, start, empty })
    }

    /// The attributes of an element just returned by `next` (namespace declarations left out).
    pub fn attributes<'e>(&self, elem: &'e Elem<'a>) -> XmlResult<Vec<Attr<'e>>> {
        let mut out = Vec::new();
        for attr in elem.start.attributes() {
            let attr = attr.map_err(ill)?;
            if attr.key.as_namespace_binding().is_some() {
                continue;
            }
            let (res, local) = self.reader.resolver().resolve_attribute(attr.key);
            let value = attr
                .normalized_value(XmlVersion::Implicit1_0)
                .map_err(ill)?;
            out.push(Attr {
                ns: Ns::classify(&res),
                local: local.into_inner(),
                value,
            });
        }
        Ok(out)
    }

    /// Resolves a QName-typed value (like `fault="r:GroupAborted"`) in the scope of the element
    /// just returned by `next`: (namespace, local name), or `None` for an unbound prefix.
    pub fn resolve_qname<'v>(&self, value: &'v str) -> Option<(Ns, &'v str)> {
        let (res, local) = self.reader.resolver().resolve(QName(value.trim()), true);
        if let ResolveResult::Unknown(_) = res {
            return None;
        }
        Some((Ns::classify(&res), local.into_inner()))
    }

    /// The namespace URI of the element just returned by `next`, when it is bound.
    pub fn namespace_uri(&self, elem: &Elem<'_>) -> Option<String> {
        match self.reader.resolver().resolve_element(elem.start.name()).0 {
            ResolveResult::Bound(Namespace(uri)) => Some(uri.to_owned()),
            _ => None,
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
            truncate(other)
        ))),
    }
}
