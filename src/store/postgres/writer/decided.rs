//! One message's decision in the writer: the pure rules (`rmp::receive_plan`) run on its
//! stored group, a panic in them caught as that message's failure. It writes nothing and must
//! never import the batch or its statements.

use super::reads::StoredGroup;
use crate::rmp::quota::SourceRoom;
use crate::rmp::receive_plan::{ReceivePlan, plan_receive};
use crate::rmp::receiver::{Action, Incoming};
use crate::store::StoreError;
use crate::store::error::panic_message;
use crate::store::postgres::shared::Shared;
use crate::store::received::ReceivedMessage;

/// The pure rules' decision for one message, a panic in them caught as its failure.
pub(super) fn decide<'m>(
    shared: &Shared,
    m: &'m ReceivedMessage,
    stored: Option<&StoredGroup>,
    open_groups_of_source: u64,
    room: SourceRoom,
) -> Result<Decided<'m>, StoreError> {
    #[cfg(feature = "test-hooks")]
    let doomed = shared.hooks.doomed(m.request.key().group_id.as_str());
    let planned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        #[cfg(feature = "test-hooks")]
        if doomed {
            panic!("injected panic (test hook)");
        }
        plan_receive(
            stored.map(|g| &g.state),
            Incoming {
                request: &m.request,
                channel: &m.channel,
                body_bytes: m.payload.len() as u64,
                open_groups_of_source,
                room,
            },
            m.now,
            &shared.policy,
        )
    }));
    let plan = planned.map_err(|p| StoreError::Panicked(panic_message(&*p)))?;
    Ok(Decided {
        message: m,
        group_row: stored.map(|g| g.id),
        group_version: stored.map(|g| g.version),
        plan,
    })
}

/// One message's decision, with the row id and version of its group when the group was stored.
pub(super) struct Decided<'m> {
    pub(super) message: &'m ReceivedMessage,
    pub(super) group_row: Option<i64>,
    pub(super) group_version: Option<i64>,
    pub(super) plan: ReceivePlan,
}

impl Decided<'_> {
    pub(super) fn group_id(&self) -> String {
        self.message.request.key().group_id.as_str().to_owned()
    }

    pub(super) fn delivers(&self) -> bool {
        self.plan.action == Action::Deliver
    }

    /// Whether the message itself is stored (in the inbox or a buffer): its bytes count for
    /// its source.
    pub(super) fn stores(&self) -> bool {
        match self.plan.action {
            Action::Deliver => self.message.inbox,
            Action::Buffer => true,
            Action::Drop => false,
        }
    }
}
