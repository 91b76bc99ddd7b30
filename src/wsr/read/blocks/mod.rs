//! The three WS-R header blocks: structure in, validated values out.
//!
//! `Request` (see `request.rs`) is read in two steps: everything is collected tolerantly, then
//! identity and reply pattern are settled, which decides where a defect can be answered (D4).
//! `Response` and `PollRequest` have no reply route of their own, so their defects are always
//! synchronous. This module holds what the three share: walking children, attributes by name,
//! `ReplyTo`, ranges and fault QNames.

mod poll;
mod request;
mod response;
mod security;

pub use security::SecurityBlock;

use std::borrow::Cow;

use super::Quirk;
use super::xml::{Elem, Node, Ns, XmlCursor};
use crate::wsr::defect::Defect;
use crate::wsr::fault::FaultCode;
use crate::wsr::lexical::excerpt;
use crate::wsr::lexical::{check_any_uri, parse_boolean, parse_unsigned_long, xml_trim};
use crate::wsr::model::{ReplyTo, SeqRange, SoapVersion};

pub(super) struct BlockReader<'x, 'a, 'l> {
    pub xml: &'x mut XmlCursor<'a, 'l>,
    pub version: SoapVersion,
    pub quirks: &'x mut Vec<Quirk>,
}

type ChildFn<'f, 'x, 'a, 'l> =
    &'f mut dyn FnMut(&mut BlockReader<'x, 'a, 'l>, Elem<'a>) -> Result<(), Defect>;

/// The first problem found, in document order.
#[derive(Default)]
struct FirstProblem(Option<(FaultCode, String)>);

impl FirstProblem {
    fn note(&mut self, code: FaultCode, reason: impl Into<String>) {
        if self.0.is_none() {
            self.0 = Some((code, reason.into()));
        }
    }

    /// The noted problem as a synchronous defect.
    fn into_result(self) -> Result<(), Defect> {
        match self.0 {
            Some((code, reason)) => Err(sync(code, reason)),
            None => Ok(()),
        }
    }
}

/// Why a `ReplyTo` cannot be used.
#[derive(Debug, Clone)]
enum ReplyToProblem {
    /// Not a well-formed service reference.
    Malformed(String),
    /// A well-formed reference in a scheme other than `wsrm:BareURI`.
    UnsupportedScheme(String),
}

/// The values of the named unqualified attributes of one element, in the order asked for, and
/// the first unqualified attribute that is not among them. Foreign-namespace attributes are
/// extensions and skipped.
struct NamedAttributes<const N: usize> {
    values: [Option<String>; N],
    unknown: Option<String>,
}

impl<const N: usize> NamedAttributes<N> {
    /// Notes an unknown attribute as a problem of `code`.
    fn note_unknown(&self, element: &str, code: FaultCode, problems: &mut FirstProblem) {
        if let Some(name) = &self.unknown {
            problems.note(
                code,
                format!("unknown attribute '{name}' on wsrm:{element}"),
            );
        }
    }

    /// An unknown attribute as an immediate synchronous defect of `code`.
    fn refuse_unknown(&self, element: &str, code: FaultCode) -> Result<(), Defect> {
        let mut problems = FirstProblem::default();
        self.note_unknown(element, code, &mut problems);
        problems.into_result()
    }
}

impl<'x, 'a, 'l> BlockReader<'x, 'a, 'l> {
    /// Calls `f` for each child element; returns whether non-whitespace text was seen.
    fn for_children(
        &mut self,
        parent: &Elem<'_>,
        f: ChildFn<'_, 'x, 'a, 'l>,
    ) -> Result<bool, Defect> {
        if parent.empty {
            return Ok(false);
        }
        let mut text = false;
        loop {
            match self.xml.next_in_element()? {
                Node::Close => return Ok(text),
                Node::Text(t) => text |= !xml_trim(&t).is_empty(),
                Node::Open(child) => f(self, child)?,
            }
        }
    }

    fn named_attributes<const N: usize>(
        &self,
        e: &Elem<'_>,
        names: [&str; N],
    ) -> Result<NamedAttributes<N>, Defect> {
        let mut found = NamedAttributes {
            values: [const { None }; N],
            unknown: None,
        };
        for attr in self.xml.attributes(e) {
            let attr = attr?;
            if attr.ns != Ns::None {
                continue;
            }
            match names.iter().position(|n| *n == attr.local) {
                Some(i) => found.values[i] = Some(attr.value.into_owned()),
                None => {
                    found
                        .unknown
                        .get_or_insert_with(|| excerpt(attr.local).into_owned());
                }
            }
        }
        Ok(found)
    }

    /// Checks the attributes of a header block element: mustUnderstand of this SOAP version
    /// (`1`/`true` and `0`/`false` accepted, D12), foreign attributes skipped, unqualified
    /// ones refused.
    fn block_attributes(
        &self,
        e: &Elem<'_>,
        problems: &mut FirstProblem,
        code: FaultCode,
    ) -> Result<(), Defect> {
        let envelope_ns = match self.version {
            SoapVersion::Soap11 => Ns::Soap11,
            SoapVersion::Soap12 => Ns::Soap12,
        };
        for attr in self.xml.attributes(e) {
            let attr = attr?;
            if attr.ns == envelope_ns && attr.local == "mustUnderstand" {
                if parse_boolean(&attr.value).is_none() {
                    let value = excerpt(&attr.value);
                    problems.note(code, format!("mustUnderstand='{value}' is not a boolean"));
                }
            } else if attr.ns == Ns::None {
                let (name, block) = (excerpt(attr.local), e.local());
                problems.note(code, format!("unknown attribute '{name}' on wsrm:{block}"));
            }
        }
        Ok(())
    }

    /// An element of an empty WS-R type: foreign children skipped, anything else a problem.
    fn closed_element(
        &mut self,
        e: &Elem<'a>,
        code: FaultCode,
        problems: &mut FirstProblem,
    ) -> Result<(), Defect> {
        let name = e.local().to_owned();
        let stray_text = self.for_children(e, &mut |r, child| {
            if matches!(child.ns, Ns::Wsrm | Ns::None) {
                let child_name = excerpt(child.local());
                problems.note(
                    code,
                    format!("unexpected element '{child_name}' in wsrm:{name}"),
                );
            }
            Ok(r.xml.skip(&child)?)
        })?;
        if stray_text {
            problems.note(code, format!("text content in wsrm:{name}"));
        }
        Ok(())
    }

    /// Like `closed_element`, but the first problem is an immediate synchronous defect.
    fn closed_strict(&mut self, e: &Elem<'a>, code: FaultCode) -> Result<(), Defect> {
        let mut problems = FirstProblem::default();
        self.closed_element(e, code, &mut problems)?;
        problems.into_result()
    }

    /// A `ReplyTo` (`ref:ServiceRefType`): exactly one child element; we support the default
    /// scheme, `wsrm:BareURI`, whose content must be an `xs:anyURI`.
    fn reply_to(&mut self, e: &Elem<'a>) -> Result<Result<ReplyTo, ReplyToProblem>, Defect> {
        let attrs = self.named_attributes(e, ["reference-scheme"])?;
        let [reference_scheme] = attrs.values;
        let mut problem = attrs.unknown.map(|name| {
            ReplyToProblem::Malformed(format!("unknown attribute '{name}' on wsrm:ReplyTo"))
        });
        let reference_scheme = reference_scheme.map(|s| xml_trim(&s).to_owned());
        if let Some(Err(why)) = reference_scheme.as_deref().map(check_any_uri) {
            problem.get_or_insert(ReplyToProblem::Malformed(format!(
                "reference-scheme is not an xs:anyURI: {why}"
            )));
        }
        let mut children = 0;
        let mut uri: Option<String> = None;
        let stray_text = self.for_children(e, &mut |r, child| {
            children += 1;
            if children > 1 {
                return Ok(r.xml.skip(&child)?);
            }
            if (child.ns, child.local()) != (Ns::Wsrm, "BareURI") {
                let name = excerpt(child.local());
                problem.get_or_insert(ReplyToProblem::UnsupportedScheme(format!(
                    "wsrm:ReplyTo holds '{name}'; only the default scheme wsrm:BareURI is supported"
                )));
                return Ok(r.xml.skip(&child)?);
            }
            let malformed = match r.xml.text(&child)? {
                None => Some("wsrm:BareURI holds elements, not a URI".to_owned()),
                Some(text) if xml_trim(&text).is_empty() => {
                    Some("wsrm:BareURI is empty".to_owned())
                }
                Some(text) => match check_any_uri(xml_trim(&text)) {
                    Ok(()) => {
                        uri = Some(xml_trim(&text).to_owned());
                        None
                    }
                    Err(why) => Some(format!(
                        "wsrm:BareURI '{}' is not an xs:anyURI: {why}",
                        excerpt(xml_trim(&text))
                    )),
                },
            };
            if let Some(why) = malformed {
                problem.get_or_insert(ReplyToProblem::Malformed(why));
            }
            Ok(())
        })?;
        if stray_text {
            problem.get_or_insert(ReplyToProblem::Malformed(
                "text content in wsrm:ReplyTo".into(),
            ));
        }
        if children != 1 {
            return Ok(Err(ReplyToProblem::Malformed(format!(
                "wsrm:ReplyTo must hold exactly one element, not {children}"
            ))));
        }
        Ok(match (problem, uri) {
            (Some(p), _) => Err(p),
            (None, Some(uri)) => Ok(ReplyTo {
                uri,
                reference_scheme,
            }),
            (None, None) => Err(ReplyToProblem::Malformed(
                "wsrm:ReplyTo has no address".into(),
            )),
        })
    }

    /// `from`/`to` of a range element (both required, `from <= to`) and, where `fault_allowed`,
    /// its `fault`. Every defect is synchronous with `code`.
    fn range(
        &mut self,
        e: &Elem<'a>,
        code: FaultCode,
        fault_allowed: bool,
    ) -> Result<(SeqRange, Option<FaultCode>), Defect> {
        let name = e.local().to_owned();
        let err = |why: String| sync(code, why);
        let attrs = if fault_allowed {
            self.named_attributes(e, ["from", "to", "fault"])?
        } else {
            let plain = self.named_attributes(e, ["from", "to"])?;
            let [from, to] = plain.values;
            NamedAttributes {
                values: [from, to, None],
                unknown: plain.unknown,
            }
        };
        attrs.refuse_unknown(&name, code)?;
        let [from, to, fault] = attrs.values;
        let (Some(from), Some(to)) = (from, to) else {
            return Err(err(format!("wsrm:{name} needs both from and to")));
        };
        let from = parse_unsigned_long(&from).map_err(|w| err(format!("{name}/@from: {w}")))?;
        let to = parse_unsigned_long(&to).map_err(|w| err(format!("{name}/@to: {w}")))?;
        let range = SeqRange::new(from, to)
            .ok_or_else(|| err(format!("wsrm:{name} from={from} is greater than to={to}")))?;
        let fault = fault.map(|raw| self.fault_code(&raw)).transpose()?;
        self.closed_strict(e, code)?;
        Ok((range, fault))
    }

    /// Resolves a `fault` QName through the namespaces in scope (any prefix) to one of the ten.
    fn fault_code(&self, raw: &str) -> Result<FaultCode, Defect> {
        let err = |why: String| sync(FaultCode::InvalidRequest, why);
        let shown = excerpt(raw);
        match self.xml.resolve_qname(raw) {
            None => Err(err(format!("fault '{shown}': its prefix is not bound"))),
            Some((Ns::Wsrm, local)) => FaultCode::from_local_name(local).ok_or_else(|| {
                err(format!(
                    "fault '{shown}' is not one of the ten WS-Reliability fault codes"
                ))
            }),
            Some(_) => Err(err(format!(
                "fault '{shown}' is not in the WS-Reliability namespace"
            ))),
        }
    }
}

fn sync(code: FaultCode, reason: impl Into<String>) -> Defect {
    Defect::synchronous(code, reason)
}

/// A text value as an owned string, `None` when the element held child elements.
fn owned(text: Option<Cow<'_, str>>) -> Option<String> {
    text.map(Cow::into_owned)
}
