//! The WS-Reliability 1.1 wire: the model of the three header blocks, the SOAP 1.1/1.2 envelope
//! reader and writer (quick-xml), MIME packaging, and the XSD lexical types.
//!
//! Pure: no I/O, no clock, no store. Nothing else in the crate touches bytes on the wire.

pub mod datetime;
pub mod defect;
pub mod fault;
pub mod lexical;
pub mod mime;
pub mod model;
pub mod read;
pub mod splice;
pub mod word_scan;
pub mod write;

pub use defect::{Defect, FaultRoute};
pub use fault::{FaultCategory, FaultCode};
pub use model::{
    GroupId, GroupLimit, MessageId, MessageKey, PollRequest, RefToMessageIds, Reply, ReplyPattern,
    ReplyRange, ReplyTo, Request, Response, SeqRange, SequenceNum, SoapVersion, UsernameToken,
};
pub use read::{Body, BodyRoot, Declaration, Envelope, Limits, Quirk, read_envelope, read_message};
pub use write::{
    Headers, SoapFault, write_envelope, write_must_understand_fault, write_plain_envelope,
    write_response_block, write_soap_fault,
};
