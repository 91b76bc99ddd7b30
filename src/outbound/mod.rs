//! The sending side of the gateway: for now the callback acknowledgments we owe to partners
//! who chose the Callback reply pattern (D10).

pub mod callbacks;
