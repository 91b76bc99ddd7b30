//! The sending side of the gateway: our own reliable messages to partners (`sender`), and the
//! callback acknowledgments we owe to partners who chose the Callback reply pattern (D10).

pub mod callbacks;
pub mod sender;
