//! The three WS-R header blocks: structure in, validated values out.
//!
//! `Request` is read in two steps. First everything is collected tolerantly (children in any
//! order, foreign extensions skipped) and the first structural problem noted. Then the message's
//! identity and reply pattern are settled: when either cannot be recovered the defect can only
//! travel as a SOAP Fault; otherwise every later defect is answered by the reply pattern (D4).
//! `Response` and `PollRequest` have no reply route of their own, so their defects are always
//! synchronous.

use std::borrow::Cow;

use super::xml::{Elem, Node, Ns, XmlCursor};
use super::{Quirk, invalid};
use crate::wsr::datetime::{XsDuration, Zone, parse_date_time, truncate};
use crate::wsr::fault::{Defect, FaultCode, FaultRoute};
use crate::wsr::lexical::{check_any_uri, parse_boolean, parse_unsigned_long};
use crate::wsr::model::{
    GroupId, GroupLimit, MessageId, MessageKey, PollRequest, RefToMessageIds, Reply, ReplyPattern,
    ReplyRange, ReplyTo, Request, Response, SeqRange, SequenceNum, SoapVersion,
};

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
}

#[derive(Default)]
struct RequestDraft {
    message_id: Option<MessageIdDraft>,
    /// `Some(None)`: the element was there but held child elements.
    expiry_time: Option<Option<String>>,
    reply_pattern: Option<ReplyPatternDraft>,
    ack_requested: bool,
    duplicate_elimination: bool,
    message_order: bool,
    problems: FirstProblem,
}

#[derive(Default)]
struct MessageIdDraft {
    group_id: Option<String>,
    sequence: Option<SequenceDraft>,
}

#[derive(Default)]
struct SequenceDraft {
    number: Option<String>,
    last: Option<String>,
    group_expiry_time: Option<String>,
    group_max_idle_duration: Option<String>,
}

#[derive(Default)]
struct ReplyPatternDraft {
    value: Option<Option<String>>,
    reply_to: Option<Result<ReplyTo, ReplyToProblem>>,
}

/// Why a `ReplyTo` cannot be used.
#[derive(Debug, Clone)]
enum ReplyToProblem {
    /// Not a well-formed service reference.
    Malformed(String),
    /// A well-formed reference in a scheme other than `wsrm:BareURI`.
    UnsupportedScheme(String),
}

const REQUEST_CHILDREN: [&str; 6] = [
    "MessageId",
    "ExpiryTime",
    "ReplyPattern",
    "AckRequested",
    "DuplicateElimination",
    "MessageOrder",
];

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
                Node::Text(t) => text |= !t.trim().is_empty(),
                Node::Open(child) => f(self, child)?,
            }
        }
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
                    problems.note(
                        code,
                        format!(
                            "mustUnderstand='{}' is not a boolean",
                            truncate(&attr.value)
                        ),
                    );
                }
            } else if attr.ns == Ns::None {
                problems.note(
                    code,
                    format!(
                        "unknown attribute '{}' on wsrm:{}",
                        truncate(attr.local),
                        e.local()
                    ),
                );
            }
        }
        Ok(())
    }

    // ---------------------------------------------------------------- Request

    pub fn request(&mut self, e: &Elem<'a>) -> Result<Request, Defect> {
        let mut d = RequestDraft::default();
        self.block_attributes(e, &mut d.problems, FaultCode::InvalidRequest)?;
        let mut highest_rank = 0;
        let stray_text = self.for_children(e, &mut |r, child| {
            match child.ns {
                Ns::Wsrm => {
                    let name = child.local();
                    let Some(rank) = REQUEST_CHILDREN.iter().position(|c| *c == name) else {
                        d.problems.note(
                            FaultCode::InvalidRequest,
                            format!("unknown element wsrm:{} in wsrm:Request", truncate(name)),
                        );
                        return Ok(r.xml.skip(&child)?);
                    };
                    let seen = match rank {
                        0 => d.message_id.is_some(),
                        1 => d.expiry_time.is_some(),
                        2 => d.reply_pattern.is_some(),
                        3 => d.ack_requested,
                        4 => d.duplicate_elimination,
                        _ => d.message_order,
                    };
                    if seen {
                        d.problems.note(
                            FaultCode::InvalidRequest,
                            format!("wsrm:{name} appears twice in wsrm:Request"),
                        );
                        return Ok(r.xml.skip(&child)?);
                    }
                    if rank + 1 < highest_rank {
                        d.problems.note(
                            FaultCode::InvalidRequest,
                            format!("wsrm:{name} is out of order in wsrm:Request"),
                        );
                    }
                    highest_rank = highest_rank.max(rank + 1);
                    match rank {
                        0 => d.message_id = Some(r.message_id(&child, &mut d.problems)?),
                        1 => d.expiry_time = Some(r.xml.text(&child)?.map(Cow::into_owned)),
                        2 => d.reply_pattern = Some(r.reply_pattern(&child, &mut d.problems)?),
                        _ => {
                            r.marker(&child, &mut d.problems)?;
                            match rank {
                                3 => d.ack_requested = true,
                                4 => d.duplicate_elimination = true,
                                _ => d.message_order = true,
                            }
                        }
                    }
                    Ok(())
                }
                Ns::None => {
                    d.problems.note(
                        FaultCode::InvalidRequest,
                        format!(
                            "unqualified element '{}' in wsrm:Request",
                            truncate(child.local())
                        ),
                    );
                    Ok(r.xml.skip(&child)?)
                }
                // Foreign extension elements, wherever they are (D12).
                _ => Ok(r.xml.skip(&child)?),
            }
        })?;
        if stray_text {
            d.problems
                .note(FaultCode::InvalidRequest, "text content in wsrm:Request");
        }
        self.validate_request(d)
    }

    fn message_id(
        &mut self,
        e: &Elem<'a>,
        problems: &mut FirstProblem,
    ) -> Result<MessageIdDraft, Defect> {
        let mut draft = MessageIdDraft::default();
        for attr in self.xml.attributes(e) {
            let attr = attr?;
            match (attr.ns, attr.local) {
                (Ns::None, "groupId") => draft.group_id = Some(attr.value.into_owned()),
                (Ns::None, other) => problems.note(
                    FaultCode::InvalidMessageId,
                    format!("unknown attribute '{}' on wsrm:MessageId", truncate(other)),
                ),
                _ => {}
            }
        }
        let stray_text = self.for_children(e, &mut |r, child| match (child.ns, child.local()) {
            (Ns::Wsrm, "SequenceNum") if draft.sequence.is_none() => {
                draft.sequence = Some(r.sequence_num(&child, problems)?);
                Ok(())
            }
            (Ns::Wsrm | Ns::None, name) => {
                problems.note(
                    FaultCode::InvalidRequest,
                    format!("unexpected element '{}' in wsrm:MessageId", truncate(name)),
                );
                Ok(r.xml.skip(&child)?)
            }
            _ => Ok(r.xml.skip(&child)?),
        })?;
        if stray_text {
            problems.note(FaultCode::InvalidRequest, "text content in wsrm:MessageId");
        }
        Ok(draft)
    }

    fn sequence_num(
        &mut self,
        e: &Elem<'a>,
        problems: &mut FirstProblem,
    ) -> Result<SequenceDraft, Defect> {
        let mut draft = SequenceDraft::default();
        for attr in self.xml.attributes(e) {
            let attr = attr?;
            let slot = match (attr.ns, attr.local) {
                (Ns::None, "number") => &mut draft.number,
                (Ns::None, "last") => &mut draft.last,
                (Ns::None, "groupExpiryTime") => &mut draft.group_expiry_time,
                (Ns::None, "groupMaxIdleDuration") => &mut draft.group_max_idle_duration,
                (Ns::None, other) => {
                    problems.note(
                        FaultCode::InvalidMessageId,
                        format!(
                            "unknown attribute '{}' on wsrm:SequenceNum",
                            truncate(other)
                        ),
                    );
                    continue;
                }
                _ => continue,
            };
            *slot = Some(attr.value.into_owned());
        }
        self.closed_element(e, "SequenceNum", FaultCode::InvalidRequest, problems)?;
        Ok(draft)
    }

    /// `AckRequested`, `DuplicateElimination`, `MessageOrder`: empty, no attributes.
    fn marker(&mut self, e: &Elem<'a>, problems: &mut FirstProblem) -> Result<(), Defect> {
        for attr in self.xml.attributes(e) {
            let attr = attr?;
            if attr.ns == Ns::None {
                problems.note(
                    FaultCode::InvalidRequest,
                    format!(
                        "unknown attribute '{}' on wsrm:{}",
                        truncate(attr.local),
                        e.local()
                    ),
                );
            }
        }
        self.closed_element(e, e.local(), FaultCode::InvalidRequest, problems)
    }

    /// An element of an empty WS-R type: foreign children skipped, anything else a problem.
    fn closed_element(
        &mut self,
        e: &Elem<'a>,
        name: &str,
        code: FaultCode,
        problems: &mut FirstProblem,
    ) -> Result<(), Defect> {
        let stray_text = self.for_children(e, &mut |r, child| {
            if matches!(child.ns, Ns::Wsrm | Ns::None) {
                problems.note(
                    code,
                    format!(
                        "unexpected element '{}' in wsrm:{name}",
                        truncate(child.local())
                    ),
                );
            }
            Ok(r.xml.skip(&child)?)
        })?;
        if stray_text {
            problems.note(code, format!("text content in wsrm:{name}"));
        }
        Ok(())
    }

    fn reply_pattern(
        &mut self,
        e: &Elem<'a>,
        problems: &mut FirstProblem,
    ) -> Result<ReplyPatternDraft, Defect> {
        let mut draft = ReplyPatternDraft::default();
        for attr in self.xml.attributes(e) {
            let attr = attr?;
            if attr.ns == Ns::None {
                problems.note(
                    FaultCode::InvalidReplyPattern,
                    format!(
                        "unknown attribute '{}' on wsrm:ReplyPattern",
                        truncate(attr.local)
                    ),
                );
            }
        }
        let stray_text = self.for_children(e, &mut |r, child| match (child.ns, child.local()) {
            (Ns::Wsrm, "Value") if draft.value.is_none() => {
                if draft.reply_to.is_some() {
                    problems.note(
                        FaultCode::InvalidReplyPattern,
                        "wsrm:ReplyTo before wsrm:Value",
                    );
                }
                draft.value = Some(r.xml.text(&child)?.map(Cow::into_owned));
                Ok(())
            }
            (Ns::Wsrm, "ReplyTo") if draft.reply_to.is_none() => {
                draft.reply_to = Some(r.reply_to(&child)?);
                Ok(())
            }
            (Ns::Wsrm | Ns::None, name) => {
                problems.note(
                    FaultCode::InvalidReplyPattern,
                    format!(
                        "unexpected or repeated element '{}' in wsrm:ReplyPattern",
                        truncate(name)
                    ),
                );
                Ok(r.xml.skip(&child)?)
            }
            _ => Ok(r.xml.skip(&child)?),
        })?;
        if stray_text {
            problems.note(
                FaultCode::InvalidReplyPattern,
                "text content in wsrm:ReplyPattern",
            );
        }
        Ok(draft)
    }

    /// A `ReplyTo` (`ref:ServiceRefType`): exactly one child element; we support the default
    /// scheme, `wsrm:BareURI`.
    fn reply_to(&mut self, e: &Elem<'a>) -> Result<Result<ReplyTo, ReplyToProblem>, Defect> {
        let mut reference_scheme = None;
        let mut problem: Option<ReplyToProblem> = None;
        for attr in self.xml.attributes(e) {
            let attr = attr?;
            match (attr.ns, attr.local) {
                (Ns::None, "reference-scheme") => {
                    if let Err(why) = check_any_uri(attr.value.trim()) {
                        problem.get_or_insert(ReplyToProblem::Malformed(format!(
                            "reference-scheme is not an xs:anyURI: {why}"
                        )));
                    }
                    reference_scheme = Some(attr.value.trim().to_owned());
                }
                (Ns::None, other) => {
                    problem.get_or_insert(ReplyToProblem::Malformed(format!(
                        "unknown attribute '{}' on wsrm:ReplyTo",
                        truncate(other)
                    )));
                }
                _ => {}
            }
        }
        let mut children = 0;
        let mut uri: Option<String> = None;
        let stray_text = self.for_children(e, &mut |r, child| {
            children += 1;
            if children > 1 {
                return Ok(r.xml.skip(&child)?);
            }
            match (child.ns, child.local()) {
                (Ns::Wsrm, "BareURI") => match r.xml.text(&child)? {
                    Some(text) if !text.trim().is_empty() => match check_any_uri(text.trim()) {
                        Ok(()) => uri = Some(text.trim().to_owned()),
                        Err(why) => {
                            problem.get_or_insert(ReplyToProblem::Malformed(format!(
                                "wsrm:BareURI '{}' is not an xs:anyURI: {why}",
                                truncate(text.trim())
                            )));
                        }
                    },
                    Some(_) => {
                        problem.get_or_insert(ReplyToProblem::Malformed("wsrm:BareURI is empty".into()));
                    }
                    None => {
                        problem.get_or_insert(ReplyToProblem::Malformed(
                            "wsrm:BareURI holds elements, not a URI".into(),
                        ));
                    }
                },
                (_, name) => {
                    problem.get_or_insert(ReplyToProblem::UnsupportedScheme(format!(
                        "wsrm:ReplyTo holds '{}'; only the default scheme wsrm:BareURI is supported",
                        truncate(name)
                    )));
                    r.xml.skip(&child)?;
                }
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

    /// Settles identity and reply pattern (synchronous defects), then checks everything else
    /// with the reply pattern as the route.
    fn validate_request(&mut self, d: RequestDraft) -> Result<Request, Defect> {
        use FaultCode::*;
        let Some(mid) = d.message_id else {
            return Err(sync(InvalidRequest, "wsrm:Request has no wsrm:MessageId"));
        };
        let raw_group = mid
            .group_id
            .ok_or_else(|| sync(InvalidMessageId, "wsrm:MessageId has no groupId"))?;
        let group_id = GroupId::parse(&raw_group).map_err(|why| sync(InvalidMessageId, why))?;
        let number = match &mid.sequence {
            None => None,
            Some(seq) => {
                let raw = seq
                    .number
                    .as_deref()
                    .ok_or_else(|| sync(InvalidMessageId, "wsrm:SequenceNum has no number"))?;
                Some(parse_unsigned_long(raw).map_err(|why| sync(InvalidMessageId, why))?)
            }
        };
        let Some(rp) = d.reply_pattern else {
            return Err(sync(
                InvalidRequest,
                "wsrm:Request has no wsrm:ReplyPattern",
            ));
        };
        let mut problems = d.problems;
        let reply = self.settle_reply_pattern(rp, &mut problems)?;

        let route = FaultRoute::ReplyPattern {
            key: MessageKey {
                group_id: group_id.clone(),
                number,
            },
            reply: reply.clone(),
        };
        let fail = |code: FaultCode, reason: String| Defect {
            code,
            route: route.clone(),
            reason,
        };
        if let Some((code, reason)) = problems.0 {
            return Err(fail(code, reason));
        }
        let expiry_time = match d.expiry_time {
            None => {
                return Err(fail(
                    InvalidRequest,
                    "wsrm:Request has no wsrm:ExpiryTime".into(),
                ));
            }
            Some(None) => {
                return Err(fail(
                    InvalidExpiryTime,
                    "wsrm:ExpiryTime holds elements".into(),
                ));
            }
            Some(Some(text)) => {
                let (t, zone) =
                    parse_date_time(&text).map_err(|why| fail(InvalidExpiryTime, why))?;
                self.note_zone(zone);
                t
            }
        };
        let sequence = match mid.sequence {
            None => None,
            Some(seq) => Some(self.validate_sequence(seq, number.unwrap_or_default(), &fail)?),
        };
        if d.message_order {
            let missing = [
                (sequence.is_none(), "wsrm:SequenceNum"),
                (!d.ack_requested, "wsrm:AckRequested"),
                (!d.duplicate_elimination, "wsrm:DuplicateElimination"),
            ];
            if let Some((_, what)) = missing.iter().find(|(m, _)| *m) {
                return Err(fail(
                    InvalidMessageParameters,
                    format!("wsrm:MessageOrder requires {what}"),
                ));
            }
        }
        Ok(Request {
            message_id: MessageId { group_id, sequence },
            expiry_time,
            reply_pattern: reply,
            ack_requested: d.ack_requested,
            duplicate_elimination: d.duplicate_elimination,
            message_order: d.message_order,
        })
    }

    fn settle_reply_pattern(
        &mut self,
        rp: ReplyPatternDraft,
        problems: &mut FirstProblem,
    ) -> Result<ReplyPattern, Defect> {
        use FaultCode::*;
        let value = match rp.value {
            None => {
                return Err(sync(
                    InvalidReplyPattern,
                    "wsrm:ReplyPattern has no wsrm:Value",
                ));
            }
            Some(None) => return Err(sync(InvalidReplyPattern, "wsrm:Value holds elements")),
            Some(Some(v)) => v,
        };
        // Case-sensitive as the schema's enumeration; surrounding whitespace is forgiven.
        match value.trim() {
            "Callback" => match rp.reply_to {
                None => Err(sync(
                    InvalidReplyPattern,
                    "Callback reply pattern without wsrm:ReplyTo",
                )),
                Some(Ok(to)) => Ok(ReplyPattern::Callback(to)),
                Some(Err(ReplyToProblem::Malformed(why))) => Err(sync(InvalidReplyPattern, why)),
                Some(Err(ReplyToProblem::UnsupportedScheme(why))) => {
                    Err(sync(FeatureNotSupported, why))
                }
            },
            v @ ("Response" | "Poll") => {
                match rp.reply_to {
                    None => {}
                    Some(Ok(_)) => self.quirks.push(Quirk::IgnoredReplyTo),
                    Some(Err(ReplyToProblem::Malformed(why))) => {
                        problems.note(InvalidReplyPattern, why)
                    }
                    Some(Err(ReplyToProblem::UnsupportedScheme(why))) => {
                        problems.note(FeatureNotSupported, why)
                    }
                }
                Ok(if v == "Response" {
                    ReplyPattern::Response
                } else {
                    ReplyPattern::Poll
                })
            }
            other => Err(sync(
                InvalidReplyPattern,
                format!(
                    "wsrm:Value '{}' is not one of Response, Callback, Poll (case matters)",
                    truncate(other)
                ),
            )),
        }
    }

    fn validate_sequence(
        &mut self,
        seq: SequenceDraft,
        number: u64,
        fail: &dyn Fn(FaultCode, String) -> Defect,
    ) -> Result<SequenceNum, Defect> {
        use FaultCode::InvalidMessageParameters as Imp;
        let last = match seq.last {
            None => false,
            Some(raw) => parse_boolean(&raw)
                .ok_or_else(|| fail(Imp, format!("last='{}' is not a boolean", truncate(&raw))))?,
        };
        let group_limit = match (seq.group_expiry_time, seq.group_max_idle_duration) {
            (Some(_), Some(_)) => {
                return Err(fail(
                    Imp,
                    "groupExpiryTime and groupMaxIdleDuration are alternatives; both were given"
                        .into(),
                ));
            }
            (Some(raw), None) => {
                let (t, zone) = parse_date_time(&raw)
                    .map_err(|why| fail(Imp, format!("groupExpiryTime: {why}")))?;
                self.note_zone(zone);
                Some(GroupLimit::ExpiryTime(t))
            }
            (None, Some(raw)) => {
                let d = XsDuration::parse(&raw)
                    .map_err(|why| fail(Imp, format!("groupMaxIdleDuration: {why}")))?;
                if d.negative && !d.is_zero() {
                    return Err(fail(Imp, format!("groupMaxIdleDuration '{d}' is negative")));
                }
                Some(GroupLimit::MaxIdleDuration(XsDuration {
                    negative: false,
                    ..d
                }))
            }
            (None, None) => None,
        };
        Ok(SequenceNum {
            number,
            last,
            group_limit,
        })
    }

    fn note_zone(&mut self, zone: Zone) {
        if zone == Zone::Absent && !self.quirks.contains(&Quirk::ZonelessDateTime) {
            self.quirks.push(Quirk::ZonelessDateTime);
        }
    }

    // ---------------------------------------------------------------- PollRequest

    pub fn poll_request(&mut self, e: &Elem<'a>) -> Result<PollRequest, Defect> {
        use FaultCode::InvalidPollRequest as Ipr;
        let mut problems = FirstProblem::default();
        self.block_attributes(e, &mut problems, Ipr)?;
        let mut refs: Vec<RefToMessageIds> = Vec::new();
        let mut reply_to: Option<ReplyTo> = None;
        let stray_text = self.for_children(e, &mut |r, child| match (child.ns, child.local()) {
            (Ns::Wsrm, "RefToMessageIds") => {
                if reply_to.is_some() && refs.is_empty() {
                    r.quirks.push(Quirk::PollReplyToFirst);
                }
                refs.push(r.ref_to_message_ids(&child)?);
                Ok(())
            }
            (Ns::Wsrm, "ReplyTo") if reply_to.is_none() => match r.reply_to(&child)? {
                Ok(to) => {
                    reply_to = Some(to);
                    Ok(())
                }
                Err(ReplyToProblem::Malformed(why)) => Err(Defect::synchronous(Ipr, why)),
                Err(ReplyToProblem::UnsupportedScheme(why)) => {
                    Err(Defect::synchronous(FaultCode::FeatureNotSupported, why))
                }
            },
            (Ns::Wsrm | Ns::None, name) => Err(Defect::synchronous(
                Ipr,
                format!(
                    "unexpected or repeated element '{}' in wsrm:PollRequest",
                    truncate(name)
                ),
            )),
            _ => Ok(r.xml.skip(&child)?),
        })?;
        if stray_text {
            problems.note(Ipr, "text content in wsrm:PollRequest");
        }
        if let Some((code, reason)) = problems.0 {
            return Err(Defect::synchronous(code, reason));
        }
        if refs.is_empty() {
            return Err(Defect::synchronous(
                Ipr,
                "wsrm:PollRequest has no wsrm:RefToMessageIds",
            ));
        }
        Ok(PollRequest { refs, reply_to })
    }

    fn ref_to_message_ids(&mut self, e: &Elem<'a>) -> Result<RefToMessageIds, Defect> {
        use FaultCode::InvalidPollRequest as Ipr;
        let mut group = None;
        for attr in self.xml.attributes(e) {
            let attr = attr?;
            match (attr.ns, attr.local) {
                (Ns::None, "groupId") => group = Some(attr.value.into_owned()),
                (Ns::None, other) => {
                    return Err(Defect::synchronous(
                        Ipr,
                        format!(
                            "unknown attribute '{}' on wsrm:RefToMessageIds",
                            truncate(other)
                        ),
                    ));
                }
                _ => {}
            }
        }
        let group =
            group.ok_or_else(|| Defect::synchronous(Ipr, "wsrm:RefToMessageIds has no groupId"))?;
        let group_id = GroupId::parse(&group).map_err(|why| Defect::synchronous(Ipr, why))?;
        let mut ranges = Vec::new();
        let stray_text = self.for_children(e, &mut |r, child| match (child.ns, child.local()) {
            (Ns::Wsrm, "SequenceNumRange") => {
                let range = r.range(&child, "SequenceNumRange", Ipr)?;
                r.closed_strict(&child, "SequenceNumRange", Ipr)?;
                ranges.push(range);
                Ok(())
            }
            (Ns::Wsrm | Ns::None, name) => Err(Defect::synchronous(
                Ipr,
                format!(
                    "unexpected element '{}' in wsrm:RefToMessageIds",
                    truncate(name)
                ),
            )),
            _ => Ok(r.xml.skip(&child)?),
        })?;
        if stray_text {
            return Err(Defect::synchronous(
                Ipr,
                "text content in wsrm:RefToMessageIds",
            ));
        }
        Ok(RefToMessageIds { group_id, ranges })
    }

    /// `from`/`to` (both required, `from <= to`) of a range element, plus an optional `fault`.
    fn range(&mut self, e: &Elem<'a>, name: &str, code: FaultCode) -> Result<SeqRange, Defect> {
        let (range, _) = self.range_with_fault(e, name, code, false)?;
        Ok(range)
    }

    fn range_with_fault(
        &mut self,
        e: &Elem<'a>,
        name: &str,
        code: FaultCode,
        fault_allowed: bool,
    ) -> Result<(SeqRange, Option<FaultCode>), Defect> {
        let err = |why: String| Defect::synchronous(code, why);
        let (mut from, mut to, mut fault) = (None, None, None);
        for attr in self.xml.attributes(e) {
            let attr = attr?;
            match (attr.ns, attr.local) {
                (Ns::None, "from") => {
                    from = Some(
                        parse_unsigned_long(&attr.value)
                            .map_err(|w| err(format!("{name}/@from: {w}")))?,
                    )
                }
                (Ns::None, "to") => {
                    to = Some(
                        parse_unsigned_long(&attr.value)
                            .map_err(|w| err(format!("{name}/@to: {w}")))?,
                    )
                }
                (Ns::None, "fault") if fault_allowed => fault = Some(self.fault_code(&attr.value)?),
                (Ns::None, other) => {
                    return Err(err(format!(
                        "unknown attribute '{}' on wsrm:{name}",
                        truncate(other)
                    )));
                }
                _ => {}
            }
        }
        let (Some(from), Some(to)) = (from, to) else {
            return Err(err(format!("wsrm:{name} needs both from and to")));
        };
        let range = SeqRange::new(from, to)
            .ok_or_else(|| err(format!("wsrm:{name} from={from} is greater than to={to}")))?;
        Ok((range, fault))
    }

    /// Like `closed_element`, but the first problem is an immediate synchronous defect.
    fn closed_strict(&mut self, e: &Elem<'a>, name: &str, code: FaultCode) -> Result<(), Defect> {
        let mut problems = FirstProblem::default();
        self.closed_element(e, name, code, &mut problems)?;
        match problems.0 {
            Some((code, why)) => Err(Defect::synchronous(code, why)),
            None => Ok(()),
        }
    }

    /// Resolves a `fault` QName through the namespaces in scope (any prefix) to one of the ten.
    fn fault_code(&self, raw: &str) -> Result<FaultCode, Defect> {
        let err = |why: String| invalid(why);
        match self.xml.resolve_qname(raw) {
            None => Err(err(format!(
                "fault '{}': its prefix is not bound",
                truncate(raw)
            ))),
            Some((Ns::Wsrm, local)) => FaultCode::from_local_name(local).ok_or_else(|| {
                err(format!(
                    "fault '{}' is not one of the ten WS-Reliability fault codes",
                    truncate(raw)
                ))
            }),
            Some(_) => Err(err(format!(
                "fault '{}' is not in the WS-Reliability namespace",
                truncate(raw)
            ))),
        }
    }

    // ---------------------------------------------------------------- Response

    pub fn response(&mut self, e: &Elem<'a>) -> Result<Response, Defect> {
        let code = FaultCode::InvalidRequest;
        let mut problems = FirstProblem::default();
        self.block_attributes(e, &mut problems, code)?;
        let mut replies = Vec::new();
        let stray_text = self.for_children(e, &mut |r, child| match (child.ns, child.local()) {
            (Ns::Wsrm, "NonSequenceReply") => {
                let mut group = None;
                let mut fault = None;
                for attr in r.xml.attributes(&child) {
                    let attr = attr?;
                    match (attr.ns, attr.local) {
                        (Ns::None, "groupId") => group = Some(attr.value.into_owned()),
                        (Ns::None, "fault") => fault = Some(r.fault_code(&attr.value)?),
                        (Ns::None, other) => {
                            return Err(invalid(format!(
                                "unknown attribute '{}' on wsrm:NonSequenceReply",
                                truncate(other)
                            )));
                        }
                        _ => {}
                    }
                }
                let group_id = r.reply_group(group, "NonSequenceReply")?;
                r.closed_strict(&child, "NonSequenceReply", code)?;
                replies.push(Reply::NonSequence { group_id, fault });
                Ok(())
            }
            (Ns::Wsrm, "SequenceReplies") => {
                let mut group = None;
                for attr in r.xml.attributes(&child) {
                    let attr = attr?;
                    match (attr.ns, attr.local) {
                        (Ns::None, "groupId") => group = Some(attr.value.into_owned()),
                        (Ns::None, other) => {
                            return Err(invalid(format!(
                                "unknown attribute '{}' on wsrm:SequenceReplies",
                                truncate(other)
                            )));
                        }
                        _ => {}
                    }
                }
                let group_id = r.reply_group(group, "SequenceReplies")?;
                let mut ranges = Vec::new();
                let stray =
                    r.for_children(&child, &mut |r, range| match (range.ns, range.local()) {
                        (Ns::Wsrm, "ReplyRange") => {
                            let (seq, fault) =
                                r.range_with_fault(&range, "ReplyRange", code, true)?;
                            r.closed_strict(&range, "ReplyRange", code)?;
                            ranges.push(ReplyRange { range: seq, fault });
                            Ok(())
                        }
                        (Ns::Wsrm | Ns::None, name) => Err(invalid(format!(
                            "unexpected element '{}' in wsrm:SequenceReplies",
                            truncate(name)
                        ))),
                        _ => Ok(r.xml.skip(&range)?),
                    })?;
                if stray {
                    return Err(invalid("text content in wsrm:SequenceReplies"));
                }
                if ranges.is_empty() {
                    return Err(invalid("wsrm:SequenceReplies without wsrm:ReplyRange"));
                }
                replies.push(Reply::Sequence { group_id, ranges });
                Ok(())
            }
            (Ns::Wsrm | Ns::None, name) => Err(invalid(format!(
                "unexpected element '{}' in wsrm:Response",
                truncate(name)
            ))),
            _ => Ok(r.xml.skip(&child)?),
        })?;
        if stray_text {
            problems.note(code, "text content in wsrm:Response");
        }
        if let Some((code, why)) = problems.0 {
            return Err(Defect::synchronous(code, why));
        }
        if replies.is_empty() {
            self.quirks.push(Quirk::EmptyResponse);
        }
        Ok(Response { replies })
    }

    fn reply_group(&self, raw: Option<String>, element: &str) -> Result<GroupId, Defect> {
        let raw = raw.ok_or_else(|| invalid(format!("wsrm:{element} has no groupId")))?;
        GroupId::parse(&raw).map_err(|why| invalid(format!("wsrm:{element}: {why}")))
    }
}

fn sync(code: FaultCode, reason: impl Into<String>) -> Defect {
    Defect::synchronous(code, reason)
}
