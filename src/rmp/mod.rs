//! Pure protocol decisions of both RMP roles: the receiver's verdict on each message, group
//! state and its lifecycle, channel agreements, poll answers, range sets. No I/O, no async, no
//! clock: time is always a parameter.

pub mod agreement;
pub mod exchange;
pub mod group;
pub mod quota;
pub mod ranges;
pub mod receive_plan;
pub mod receiver;
pub mod replies;
pub mod send_group;
pub mod sender;

#[cfg(test)]
mod extremes;
