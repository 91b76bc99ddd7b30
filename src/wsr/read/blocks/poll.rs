//! `wsrm:PollRequest`: which messages a sender asks about. It has no reply route of its own,
//! so every defect is a synchronous `InvalidPollRequest` (or `FeatureNotSupported` for a
//! `ReplyTo` in another reference scheme).

use super::{BlockReader, FirstProblem, ReplyToProblem, sync};
use crate::wsr::defect::Defect;
use crate::wsr::fault::FaultCode;
use crate::wsr::lexical::excerpt;
use crate::wsr::model::{GroupId, PollRequest, RefToMessageIds, ReplyTo};
use crate::wsr::read::Quirk;
use crate::wsr::read::xml::{Elem, Ns};

const IPR: FaultCode = FaultCode::InvalidPollRequest;

impl<'a> BlockReader<'_, 'a, '_> {
    pub fn poll_request(&mut self, e: &Elem<'a>) -> Result<PollRequest, Defect> {
        let mut problems = FirstProblem::default();
        self.block_attributes(e, &mut problems, IPR)?;
        let mut refs: Vec<RefToMessageIds> = Vec::new();
        let mut reply_to: Option<ReplyTo> = None;
        // Counted as they are read, so that a huge PollRequest is refused before it is
        // materialised (D13).
        let mut references = 0usize;
        let stray_text = self.for_children(e, &mut |r, child| match (child.ns, child.local()) {
            (Ns::Wsrm, "RefToMessageIds") => {
                if reply_to.is_some() && refs.is_empty() {
                    // Holodeck writes ReplyTo first (schema-invalid); tolerated (D12).
                    r.quirks.push(Quirk::PollReplyToFirst);
                }
                refs.push(r.ref_to_message_ids(&child, &mut references)?);
                Ok(())
            }
            (Ns::Wsrm, "ReplyTo") if reply_to.is_none() => match r.reply_to(&child)? {
                Ok(to) => {
                    reply_to = Some(to);
                    Ok(())
                }
                Err(ReplyToProblem::Malformed(why)) => Err(sync(IPR, why)),
                Err(ReplyToProblem::UnsupportedScheme(why)) => {
                    Err(sync(FaultCode::FeatureNotSupported, why))
                }
            },
            (Ns::Wsrm | Ns::None, name) => Err(sync(
                IPR,
                format!(
                    "unexpected or repeated element '{}' in wsrm:PollRequest",
                    excerpt(name)
                ),
            )),
            _ => Ok(r.xml.skip(&child)?),
        })?;
        if stray_text {
            problems.note(IPR, "text content in wsrm:PollRequest");
        }
        problems.into_result()?;
        if refs.is_empty() {
            return Err(sync(IPR, "wsrm:PollRequest has no wsrm:RefToMessageIds"));
        }
        Ok(PollRequest { refs, reply_to })
    }

    /// One `RefToMessageIds`; `references` counts what the PollRequest named so far.
    fn ref_to_message_ids(
        &mut self,
        e: &Elem<'a>,
        references: &mut usize,
    ) -> Result<RefToMessageIds, Defect> {
        let attrs = self.named_attributes(e, ["groupId"])?;
        attrs.refuse_unknown("RefToMessageIds", IPR)?;
        let [group] = attrs.values;
        let group = group.ok_or_else(|| sync(IPR, "wsrm:RefToMessageIds has no groupId"))?;
        let group_id = GroupId::parse(&group).map_err(|why| sync(IPR, why))?;
        let mut ranges = Vec::new();
        let stray_text = self.for_children(e, &mut |r, child| match (child.ns, child.local()) {
            (Ns::Wsrm, "SequenceNumRange") => {
                r.count_reference(references)?;
                ranges.push(r.range(&child, IPR, false)?.0);
                Ok(())
            }
            (Ns::Wsrm | Ns::None, name) => Err(sync(
                IPR,
                format!(
                    "unexpected element '{}' in wsrm:RefToMessageIds",
                    excerpt(name)
                ),
            )),
            _ => Ok(r.xml.skip(&child)?),
        })?;
        if stray_text {
            return Err(sync(IPR, "text content in wsrm:RefToMessageIds"));
        }
        if ranges.is_empty() {
            self.count_reference(references)?;
        }
        Ok(RefToMessageIds { group_id, ranges })
    }

    fn count_reference(&self, references: &mut usize) -> Result<(), Defect> {
        *references += 1;
        let max = self.xml.limits().max_references;
        if *references > max {
            return Err(sync(
                IPR,
                format!(
                    "wsrm:PollRequest names more than {max} messages or ranges (the \
                     max_poll_references limit); ask about fewer per poll"
                ),
            ));
        }
        Ok(())
    }
}
