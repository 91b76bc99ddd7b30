//! `wsrm:Response`: acknowledgments and fault indications we receive. A defective one is
//! refused as a whole (synchronous `InvalidRequest`): acting on half of it could mark messages
//! acked that were not. An empty one is tolerated as "nothing to report" (D12).

use super::{BlockReader, FirstProblem, sync};
use crate::wsr::defect::Defect;
use crate::wsr::fault::FaultCode;
use crate::wsr::lexical::excerpt;
use crate::wsr::model::{GroupId, Reply, ReplyRange, Response};
use crate::wsr::read::Quirk;
use crate::wsr::read::xml::{Elem, Ns};

const INVALID: FaultCode = FaultCode::InvalidRequest;

impl<'a> BlockReader<'_, 'a, '_> {
    pub fn response(&mut self, e: &Elem<'a>) -> Result<Response, Defect> {
        let mut problems = FirstProblem::default();
        self.block_attributes(e, &mut problems, INVALID)?;
        let mut replies = Vec::new();
        // Counted as they are read: a huge Response is refused before it is materialised.
        let mut statements = 0usize;
        let stray_text = self.for_children(e, &mut |r, child| {
            match (child.ns, child.local()) {
                (Ns::Wsrm, "NonSequenceReply") => {
                    r.count_statement(&mut statements)?;
                    let attrs = r.named_attributes(&child, ["groupId", "fault"])?;
                    attrs.refuse_unknown("NonSequenceReply", INVALID)?;
                    let [group, fault] = attrs.values;
                    let group_id = reply_group(group, "NonSequenceReply")?;
                    let fault = fault.map(|raw| r.fault_code(&raw)).transpose()?;
                    r.closed_strict(&child, INVALID)?;
                    replies.push(Reply::NonSequence { group_id, fault });
                }
                (Ns::Wsrm, "SequenceReplies") => {
                    let attrs = r.named_attributes(&child, ["groupId"])?;
                    attrs.refuse_unknown("SequenceReplies", INVALID)?;
                    let [group] = attrs.values;
                    let group_id = reply_group(group, "SequenceReplies")?;
                    let ranges = r.reply_ranges(&child, &mut statements)?;
                    replies.push(Reply::Sequence { group_id, ranges });
                }
                (Ns::Wsrm | Ns::None, name) => {
                    let name = excerpt(name);
                    return Err(sync(
                        INVALID,
                        format!("unexpected element '{name}' in wsrm:Response"),
                    ));
                }
                _ => r.xml.skip(&child)?,
            }
            Ok(())
        })?;
        if stray_text {
            problems.note(INVALID, "text content in wsrm:Response");
        }
        problems.into_result()?;
        if replies.is_empty() {
            self.quirks.push(Quirk::EmptyResponse);
        }
        Ok(Response { replies })
    }

    fn count_statement(&self, statements: &mut usize) -> Result<(), Defect> {
        *statements += 1;
        let max = self.xml.limits().max_references;
        if *statements > max {
            return Err(sync(
                INVALID,
                format!(
                    "wsrm:Response makes more than {max} statements (NonSequenceReply, \
                     ReplyRange; the max_poll_references limit); send them in several"
                ),
            ));
        }
        Ok(())
    }

    fn reply_ranges(
        &mut self,
        e: &Elem<'a>,
        statements: &mut usize,
    ) -> Result<Vec<ReplyRange>, Defect> {
        let mut ranges = Vec::new();
        let stray_text = self.for_children(e, &mut |r, child| match (child.ns, child.local()) {
            (Ns::Wsrm, "ReplyRange") => {
                r.count_statement(statements)?;
                let (range, fault) = r.range(&child, INVALID, true)?;
                ranges.push(ReplyRange { range, fault });
                Ok(())
            }
            (Ns::Wsrm | Ns::None, name) => Err(sync(
                INVALID,
                format!(
                    "unexpected element '{}' in wsrm:SequenceReplies",
                    excerpt(name)
                ),
            )),
            _ => Ok(r.xml.skip(&child)?),
        })?;
        if stray_text {
            return Err(sync(INVALID, "text content in wsrm:SequenceReplies"));
        }
        if ranges.is_empty() {
            return Err(sync(
                INVALID,
                "wsrm:SequenceReplies without wsrm:ReplyRange",
            ));
        }
        Ok(ranges)
    }
}

fn reply_group(raw: Option<String>, element: &str) -> Result<GroupId, Defect> {
    let raw = raw.ok_or_else(|| sync(INVALID, format!("wsrm:{element} has no groupId")))?;
    GroupId::parse(&raw).map_err(|why| sync(INVALID, format!("wsrm:{element}: {why}")))
}
