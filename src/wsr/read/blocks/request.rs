//! `wsrm:Request`: collected tolerantly, then validated. Identity (`groupId`, `number`) and the
//! reply pattern are settled first: a defect in either can only travel as a SOAP Fault. Once
//! both are known, every other defect is answered by the message's own reply pattern (D4).

use super::{BlockReader, FirstProblem, ReplyToProblem, owned, sync};
use crate::wsr::datetime::{XsDuration, Zone, parse_date_time};
use crate::wsr::defect::{Defect, FaultRoute};
use crate::wsr::fault::FaultCode;
use crate::wsr::lexical::excerpt;
use crate::wsr::lexical::{parse_boolean, parse_unsigned_long, xml_trim};
use crate::wsr::model::{
    GroupId, GroupLimit, MessageId, MessageKey, ReplyPattern, ReplyTo, Request, SequenceNum,
};
use crate::wsr::read::Quirk;
use crate::wsr::read::xml::{Elem, Ns};

/// The children of `Request` in schema order.
const CHILDREN: [&str; 6] = [
    "MessageId",
    "ExpiryTime",
    "ReplyPattern",
    "AckRequested",
    "DuplicateElimination",
    "MessageOrder",
];

#[derive(Default)]
struct RequestDraft {
    message_id: Option<MessageIdDraft>,
    /// `Some(None)`: the element was there but held child elements.
    expiry_time: Option<Option<String>>,
    reply_pattern: Option<ReplyPatternDraft>,
    /// AckRequested, DuplicateElimination, MessageOrder.
    markers: [bool; 3],
    problems: FirstProblem,
}

impl RequestDraft {
    fn seen(&self, child: usize) -> bool {
        match child {
            0 => self.message_id.is_some(),
            1 => self.expiry_time.is_some(),
            2 => self.reply_pattern.is_some(),
            marker => self.markers[marker - 3],
        }
    }
}

#[derive(Default)]
struct MessageIdDraft {
    group_id: Option<String>,
    /// number, last, groupExpiryTime, groupMaxIdleDuration.
    sequence: Option<[Option<String>; 4]>,
}

#[derive(Default)]
struct ReplyPatternDraft {
    value: Option<Option<String>>,
    reply_to: Option<Result<ReplyTo, ReplyToProblem>>,
}

impl<'a> BlockReader<'_, 'a, '_> {
    pub fn request(&mut self, e: &Elem<'a>) -> Result<Request, Defect> {
        use FaultCode::InvalidRequest;
        let mut d = RequestDraft::default();
        self.block_attributes(e, &mut d.problems, InvalidRequest)?;
        let mut highest = 0;
        let stray_text = self.for_children(e, &mut |r, child| {
            let name = child.local();
            let index = match child.ns {
                Ns::Wsrm => CHILDREN.iter().position(|c| *c == name),
                // Foreign extension elements, wherever they are (D12).
                ns if ns != Ns::None => return Ok(r.xml.skip(&child)?),
                _ => None,
            };
            let Some(index) = index else {
                let name = excerpt(name);
                d.problems.note(
                    InvalidRequest,
                    format!("unknown element '{name}' in wsrm:Request"),
                );
                return Ok(r.xml.skip(&child)?);
            };
            if d.seen(index) {
                d.problems.note(
                    InvalidRequest,
                    format!("wsrm:{name} appears twice in wsrm:Request"),
                );
                return Ok(r.xml.skip(&child)?);
            }
            if index + 1 < highest {
                d.problems.note(
                    InvalidRequest,
                    format!("wsrm:{name} is out of order in wsrm:Request"),
                );
            }
            highest = highest.max(index + 1);
            match index {
                0 => d.message_id = Some(r.message_id(&child, &mut d.problems)?),
                1 => d.expiry_time = Some(owned(r.xml.text(&child)?)),
                2 => d.reply_pattern = Some(r.reply_pattern(&child, &mut d.problems)?),
                marker => {
                    let attrs = r.named_attributes(&child, [])?;
                    attrs.note_unknown(name, InvalidRequest, &mut d.problems);
                    r.closed_element(&child, InvalidRequest, &mut d.problems)?;
                    d.markers[marker - 3] = true;
                }
            }
            Ok(())
        })?;
        if stray_text {
            d.problems
                .note(InvalidRequest, "text content in wsrm:Request");
        }
        self.validate_request(d)
    }

    fn message_id(
        &mut self,
        e: &Elem<'a>,
        problems: &mut FirstProblem,
    ) -> Result<MessageIdDraft, Defect> {
        let attrs = self.named_attributes(e, ["groupId"])?;
        attrs.note_unknown("MessageId", FaultCode::InvalidMessageId, problems);
        let [group_id] = attrs.values;
        let mut draft = MessageIdDraft {
            group_id,
            sequence: None,
        };
        let stray_text = self.for_children(e, &mut |r, child| {
            match (child.ns, child.local()) {
                (Ns::Wsrm, "SequenceNum") if draft.sequence.is_none() => {
                    let names = ["number", "last", "groupExpiryTime", "groupMaxIdleDuration"];
                    let attrs = r.named_attributes(&child, names)?;
                    attrs.note_unknown("SequenceNum", FaultCode::InvalidMessageId, problems);
                    r.closed_element(&child, FaultCode::InvalidRequest, problems)?;
                    draft.sequence = Some(attrs.values);
                }
                (Ns::Wsrm | Ns::None, name) => {
                    let name = excerpt(name);
                    problems.note(
                        FaultCode::InvalidRequest,
                        format!("unexpected element '{name}' in wsrm:MessageId"),
                    );
                    r.xml.skip(&child)?;
                }
                _ => r.xml.skip(&child)?,
            }
            Ok(())
        })?;
        if stray_text {
            problems.note(FaultCode::InvalidRequest, "text content in wsrm:MessageId");
        }
        Ok(draft)
    }

    fn reply_pattern(
        &mut self,
        e: &Elem<'a>,
        problems: &mut FirstProblem,
    ) -> Result<ReplyPatternDraft, Defect> {
        use FaultCode::InvalidReplyPattern;
        self.named_attributes(e, [])?
            .note_unknown("ReplyPattern", InvalidReplyPattern, problems);
        let mut draft = ReplyPatternDraft::default();
        let stray_text = self.for_children(e, &mut |r, child| {
            match (child.ns, child.local()) {
                (Ns::Wsrm, "Value") if draft.value.is_none() => {
                    if draft.reply_to.is_some() {
                        problems.note(InvalidReplyPattern, "wsrm:ReplyTo before wsrm:Value");
                    }
                    draft.value = Some(owned(r.xml.text(&child)?));
                }
                (Ns::Wsrm, "ReplyTo") if draft.reply_to.is_none() => {
                    draft.reply_to = Some(r.reply_to(&child)?);
                }
                (Ns::Wsrm | Ns::None, name) => {
                    let name = excerpt(name);
                    problems.note(
                        InvalidReplyPattern,
                        format!("unexpected or repeated element '{name}' in wsrm:ReplyPattern"),
                    );
                    r.xml.skip(&child)?;
                }
                _ => r.xml.skip(&child)?,
            }
            Ok(())
        })?;
        if stray_text {
            problems.note(InvalidReplyPattern, "text content in wsrm:ReplyPattern");
        }
        Ok(draft)
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
            Some([number, ..]) => {
                let raw = number
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
        let sequence = match (mid.sequence, number) {
            (Some([_, last, expiry, idle]), Some(number)) => {
                Some(self.validate_sequence(number, last, expiry, idle, &fail)?)
            }
            _ => None,
        };
        let [ack_requested, duplicate_elimination, message_order] = d.markers;
        if message_order {
            let missing = [
                (sequence.is_none(), "wsrm:SequenceNum"),
                (!ack_requested, "wsrm:AckRequested"),
                (!duplicate_elimination, "wsrm:DuplicateElimination"),
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
            ack_requested,
            duplicate_elimination,
            message_order,
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
        let pattern = match xml_trim(&value) {
            "Callback" => {
                return match rp.reply_to {
                    None => Err(sync(
                        InvalidReplyPattern,
                        "Callback reply pattern without wsrm:ReplyTo",
                    )),
                    Some(Ok(to)) => Ok(ReplyPattern::Callback(to)),
                    Some(Err(ReplyToProblem::Malformed(why))) => {
                        Err(sync(InvalidReplyPattern, why))
                    }
                    Some(Err(ReplyToProblem::UnsupportedScheme(why))) => {
                        Err(sync(FeatureNotSupported, why))
                    }
                };
            }
            "Response" => ReplyPattern::Response,
            "Poll" => ReplyPattern::Poll,
            other => {
                let other = excerpt(other);
                return Err(sync(
                    InvalidReplyPattern,
                    format!(
                        "wsrm:Value '{other}' is not one of Response, Callback, Poll (case matters)"
                    ),
                ));
            }
        };
        // A ReplyTo has no use with Response or Poll: ignored when well-formed.
        match rp.reply_to {
            None => {}
            Some(Ok(_)) => self.quirks.push(Quirk::IgnoredReplyTo),
            Some(Err(ReplyToProblem::Malformed(why))) => problems.note(InvalidReplyPattern, why),
            Some(Err(ReplyToProblem::UnsupportedScheme(why))) => {
                problems.note(FeatureNotSupported, why)
            }
        }
        Ok(pattern)
    }

    fn validate_sequence(
        &mut self,
        number: u64,
        last: Option<String>,
        group_expiry_time: Option<String>,
        group_max_idle_duration: Option<String>,
        fail: &dyn Fn(FaultCode, String) -> Defect,
    ) -> Result<SequenceNum, Defect> {
        use FaultCode::InvalidMessageParameters as Imp;
        let last = match last {
            None => false,
            Some(raw) => parse_boolean(&raw)
                .ok_or_else(|| fail(Imp, format!("last='{}' is not a boolean", excerpt(&raw))))?,
        };
        let group_limit = match (group_expiry_time, group_max_idle_duration) {
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
}
