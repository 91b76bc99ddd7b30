//! Request-response operations (D16), the decisions: what a SOAP service's answer is (a
//! business response, or no delivery, or an unknown outcome), whether an ordered request may
//! be passed on now, and the bytes every copy of a request is answered with. Pure: the calls
//! and the store are `inbound::respond`'s.

use bytes::Bytes;
use chrono::{DateTime, Utc};

use crate::rmp::group::GroupState;
use crate::wsr::splice::{self, Shape};
use crate::wsr::{Request, Response, mime, write_response_block};

/// Where a request's exchange stands (stored with it: `store::exchange`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeState {
    /// A call went out (since its start) and its outcome is not known yet.
    Calling,
    /// The responder answered: the kept answer is the request's.
    Answered,
    /// The outcome stayed unknown and the channel fails such requests.
    InDoubt,
}

impl ExchangeState {
    pub fn as_str(self) -> &'static str {
        match self {
            ExchangeState::Calling => "calling",
            ExchangeState::Answered => "answered",
            ExchangeState::InDoubt => "in_doubt",
        }
    }

    pub fn parse(s: &str) -> Option<ExchangeState> {
        [
            ExchangeState::Calling,
            ExchangeState::Answered,
            ExchangeState::InDoubt,
        ]
        .into_iter()
        .find(|state| state.as_str() == s)
    }
}

/// What a channel does when a call's outcome is unknown (a timeout after the request went
/// out, a gateway gone between the call and the commit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnUnknown {
    /// The next copy of the request calls again, with the same idempotency headers.
    #[default]
    Retry,
    /// The request is answered `PermanentProcessingFailure` and shown to operators.
    Fail,
}

/// A SOAP service's answer, judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judged {
    /// A business response (a SOAP Fault from the service included): the request is
    /// delivered, and this is its answer.
    Business(Business),
    /// The service certainly did not take the request (nothing listening, a gateway's error
    /// page, a refusal at the HTTP level): nothing is delivered, the sender resends.
    NotDelivered(String),
    /// The service may or may not have acted on it.
    Unknown(String),
}

/// A business response: one SOAP envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Business {
    pub status: u16,
    pub content_type: String,
    pub envelope: String,
    pub shape: Shape,
}

/// Judges an HTTP answer (`status`, its Content-Type, its body as read within the cap).
pub fn judge(status: u16, content_type: Option<&str>, body: &[u8]) -> Judged {
    let content_type = content_type.unwrap_or("");
    let envelope = match envelope_of(content_type, body) {
        Ok(envelope) => envelope,
        Err(why) => return without_envelope(status, why),
    };
    // Read whole before it is kept and replayed, and without WS-R blocks of the service's
    // own: the partner's answer carries our ack, not one a service (or a WS-R stack in front
    // of it) wrote for another exchange.
    let envelope =
        match splice::well_formed(envelope).and_then(|()| splice::without_wsr_blocks(envelope)) {
            Ok(envelope) => envelope,
            Err(why) => return without_envelope(status, why),
        };
    match splice::shape(&envelope) {
        Ok(shape) if (200..300).contains(&status) || (status == 500 && shape.fault) => {
            Judged::Business(Business {
                status,
                content_type: shape.version.content_type().to_owned(),
                envelope,
                shape,
            })
        }
        // An envelope but an unexpected status: a proxy's or the service's own trouble.
        Ok(_) if (400..500).contains(&status) || matches!(status, 502..=504) => {
            Judged::NotDelivered(format!("HTTP {status} with a SOAP envelope but no Fault"))
        }
        Ok(_) => Judged::Unknown(format!("HTTP {status} with a SOAP envelope but no Fault")),
        Err(why) => without_envelope(status, why),
    }
}

/// The SOAP envelope of an answer: the body, or the root part of a multipart/related one
/// without attachments.
fn envelope_of<'b>(content_type: &str, body: &'b [u8]) -> Result<&'b str, String> {
    let bytes = if mime::is_multipart(content_type) {
        let root = mime::root_part(content_type, body)?;
        if root.attachments > 0 {
            return Err("a multipart answer with attachments".into());
        }
        root.envelope
    } else {
        body
    };
    let text = std::str::from_utf8(bytes).map_err(|_| "an answer that is not UTF-8".to_owned())?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text).trim();
    if text.is_empty() {
        return Err("an empty answer".into());
    }
    Ok(text)
}

fn without_envelope(status: u16, why: String) -> Judged {
    match status {
        // Refused before the service acted on it, or a gateway in front of it that could not
        // reach it.
        400..=499 | 502..=504 => Judged::NotDelivered(format!("HTTP {status}: {why}")),
        _ => Judged::Unknown(format!("HTTP {status}: {why}")),
    }
}

/// The bytes a request is answered with: the service's envelope as it came, with our
/// `wsrm:Response` (the ack) added to its Header when the reply pattern is Response.
pub fn answer_bytes(business: &Business, ack: Option<&Response>) -> Bytes {
    let block = ack.and_then(|r| write_response_block(business.shape.version, r));
    match block {
        Some(block) => Bytes::from(splice::with_header_block(
            &business.envelope,
            &business.shape,
            &block,
        )),
        None => Bytes::from(business.envelope.clone()),
    }
}

/// Whether a request without an exchange can be passed to the service now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Not delivered, and unordered or the next one of its group.
    Open,
    /// Ordered, with a gap before it: it must wait for the messages ahead of it.
    AheadOfGap,
    /// Delivered: a backend's answer is no longer kept, an application's may still come.
    Delivered,
    /// Expired: the receiving rules answer it as any channel's (D3).
    Expired,
}

/// Requests are passed on once; ordered ones in sequence (`group`: the request's group as
/// stored, if any).
pub fn gate(
    group: Option<&GroupState>,
    request: &Request,
    now: DateTime<Utc>,
    clock_skew: chrono::Duration,
) -> Gate {
    let number = request.key().number;
    let expired = request.expiry_time < crate::wsr::datetime::saturating_sub(now, clock_skew);
    let delivered = group.is_some_and(|g| g.delivered.contains(crate::rmp::group::slot(number)));
    if expired {
        return Gate::Expired;
    }
    if delivered {
        return Gate::Delivered;
    }
    let Some(number) = number.filter(|_| request.message_order) else {
        return Gate::Open;
    };
    let next = group.map_or(0, |g| g.next_expected);
    match number > next {
        true => Gate::AheadOfGap,
        false => Gate::Open,
    }
}

/// What a request to a backend's channel does next, given its kept exchange (if any) and,
/// without one, its gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Its answer is kept: give it (after committing the delivery).
    Replay,
    /// Its call's outcome stayed unknown and the channel fails such requests.
    InDoubt,
    /// A call is out whose gateway gave up on it or died: its outcome is unknown.
    Unknown,
    /// A call is out, or a gap is before it: look again shortly.
    Wait,
    /// Call the service.
    Call,
    /// Not the responder's (delivered long ago, or expired).
    AsOneWay,
}

impl Step {
    /// The step of a request whose exchange is kept in `state`; `stale`: a call out started
    /// before calls count as out (its timeout and a grace for the commit).
    pub fn kept(state: ExchangeState, stale: bool) -> Step {
        match (state, stale) {
            (ExchangeState::Answered, _) => Step::Replay,
            (ExchangeState::InDoubt, _) => Step::InDoubt,
            (ExchangeState::Calling, true) => Step::Unknown,
            (ExchangeState::Calling, false) => Step::Wait,
        }
    }

    /// The step of a request with no exchange kept, by its gate.
    pub fn unkept(gate: Gate) -> Step {
        match gate {
            Gate::Delivered | Gate::Expired => Step::AsOneWay,
            Gate::AheadOfGap => Step::Wait,
            Gate::Open => Step::Call,
        }
    }
}

/// How long a request's answer is kept: its ExpiryTime plus the delivered-ID retention, as
/// long as a resend can still come and ask.
pub fn keep_until(request: &Request, retention: chrono::Duration) -> DateTime<Utc> {
    keep_until_from(request.expiry_time, retention)
}

/// `keep_until` of a request whose ExpiryTime is `expiry`.
pub fn keep_until_from(expiry: DateTime<Utc>, retention: chrono::Duration) -> DateTime<Utc> {
    crate::wsr::datetime::saturating_add(expiry, retention)
}

/// The HTTP header naming the group of the message a SOAP service is sent.
pub const GROUP_ID_HEADER: &str = "WSR-Group-Id";
/// The HTTP header carrying the message's sequence number (sequenced groups only).
pub const SEQUENCE_NUMBER_HEADER: &str = "WSR-Sequence-Number";
/// The HTTP header naming the partner that sent a request (authenticated partners only):
/// group ids are the sender's, so a service tells repeats apart by partner and group.
pub const PARTNER_HEADER: &str = "WSR-Partner";

/// The idempotency headers a SOAP service is sent with every call or push of one message: the
/// same every time, so that a service can tell a repeat. Values are visible ASCII.
pub fn idempotency_headers(group_id: &str, number: Option<u64>) -> Vec<(&'static str, String)> {
    let mut headers = vec![(GROUP_ID_HEADER, header_text(group_id))];
    if let Some(n) = number {
        headers.push((SEQUENCE_NUMBER_HEADER, n.to_string()));
    }
    headers
}

/// The idempotency headers of a request from `partner` ("" for an anonymous caller).
pub fn request_idempotency_headers(
    partner: &str,
    request: &Request,
) -> Vec<(&'static str, String)> {
    let key = request.key();
    let mut headers = idempotency_headers(key.group_id.as_str(), key.number);
    if !partner.is_empty() {
        headers.push((PARTNER_HEADER, header_text(partner)));
    }
    headers
}

/// Text as an HTTP header value: bytes outside visible ASCII, and `%` itself,
/// percent-encoded (group ids are URIs, mostly plain ASCII already).
pub fn header_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x21..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rmp::replies::reply_for;

    const ECHO11: &str = "<s:Envelope xmlns:s=\"http://schemas.xmlsoap.org/soap/envelope/\">\
        <s:Body><e:echoResponse xmlns:e=\"urn:echo\">hi</e:echoResponse></s:Body></s:Envelope>";
    const FAULT11: &str = "<s:Envelope xmlns:s=\"http://schemas.xmlsoap.org/soap/envelope/\">\
        <s:Body><s:Fault><faultcode>s:Server</faultcode><faultstring>no</faultstring>\
        </s:Fault></s:Body></s:Envelope>";

    fn business(j: Judged) -> Business {
        match j {
            Judged::Business(b) => b,
            other => panic!("not a business response: {other:?}"),
        }
    }

    #[test]
    fn idempotency_headers_are_visible_ascii_and_name_the_partner() {
        let request = Request {
            message_id: crate::wsr::MessageId {
                group_id: crate::wsr::GroupId::parse("urn:g/é%41").expect("group id"),
                sequence: Some(crate::wsr::SequenceNum {
                    number: 7,
                    last: false,
                    group_limit: None,
                }),
            },
            expiry_time: DateTime::<Utc>::MAX_UTC,
            reply_pattern: crate::wsr::ReplyPattern::Response,
            ack_requested: true,
            duplicate_elimination: true,
            message_order: true,
        };
        let headers = request_idempotency_headers("acme ü", &request);
        assert_eq!(
            headers,
            [
                (GROUP_ID_HEADER, "urn:g/%C3%A9%2541".to_owned()),
                (SEQUENCE_NUMBER_HEADER, "7".to_owned()),
                (PARTNER_HEADER, "acme%20%C3%BC".to_owned()),
            ]
        );
        let anonymous = request_idempotency_headers("", &request);
        assert!(anonymous.iter().all(|(n, _)| *n != PARTNER_HEADER));
    }

    #[test]
    fn a_services_own_wsr_blocks_are_not_kept_and_a_broken_answer_is_no_business_response() {
        let with_ack = "<s:Envelope xmlns:s=\"http://schemas.xmlsoap.org/soap/envelope/\" \
            xmlns:w=\"http://docs.oasis-open.org/wsrm/2004/06/ws-reliability-1.1.xsd\">\
            <s:Header><w:Response s:mustUnderstand=\"1\"><w:NonSequenceReply groupId=\"x\"/>\
            </w:Response><t:T xmlns:t=\"urn:t\">1</t:T></s:Header>\
            <s:Body><e:echoResponse xmlns:e=\"urn:echo\">hi</e:echoResponse></s:Body>\
            </s:Envelope>";
        let b = business(judge(200, Some("text/xml"), with_ack.as_bytes()));
        assert!(!b.envelope.contains("Response s:"), "{}", b.envelope);
        assert!(!b.envelope.contains("NonSequenceReply"), "{}", b.envelope);
        assert!(
            b.envelope.contains("<t:T xmlns:t=\"urn:t\">1</t:T>"),
            "{}",
            b.envelope
        );
        assert!(b.envelope.contains("echoResponse"));
        // Cut short after the Body's first child: not well-formed, not replayed to anyone.
        let cut = &ECHO11[..ECHO11.len() - "</s:Body></s:Envelope>".len()];
        assert!(matches!(
            judge(200, Some("text/xml"), cut.as_bytes()),
            Judged::Unknown(_)
        ));
        let two_roots = format!("{ECHO11}<x/>");
        assert!(matches!(
            judge(200, Some("text/xml"), two_roots.as_bytes()),
            Judged::Unknown(_)
        ));
    }

    #[test]
    fn an_envelope_or_a_soap_fault_is_a_business_response() {
        let ok = business(judge(200, Some("text/xml"), ECHO11.as_bytes()));
        assert!(!ok.shape.fault);
        assert_eq!(ok.content_type, "text/xml; charset=utf-8");
        let fault = business(judge(500, Some("text/xml"), FAULT11.as_bytes()));
        assert!(fault.shape.fault);
        assert_eq!(fault.status, 500);
    }

    #[test]
    fn no_envelope_from_a_gateway_is_no_delivery_and_a_bare_500_is_unknown() {
        for status in [502, 503, 504, 404, 401] {
            assert!(
                matches!(
                    judge(status, Some("text/html"), b"<html>down</html>"),
                    Judged::NotDelivered(_)
                ),
                "{status}"
            );
        }
        assert!(matches!(judge(500, None, b"oops"), Judged::Unknown(_)));
        assert!(matches!(judge(200, None, b""), Judged::Unknown(_)));
        assert!(matches!(
            judge(500, Some("text/xml"), ECHO11.as_bytes()),
            Judged::Unknown(_)
        ));
    }

    #[test]
    fn the_ack_rides_in_the_services_envelope_under_response() {
        let b = business(judge(200, Some("text/xml"), ECHO11.as_bytes()));
        let key = crate::wsr::MessageKey {
            group_id: crate::wsr::GroupId::parse("mid:g").expect("id"),
            number: None,
        };
        let ack = Response {
            replies: vec![reply_for(&key, None)],
        };
        let bytes = answer_bytes(&b, Some(&ack));
        let text = std::str::from_utf8(&bytes).expect("utf-8");
        assert!(text.starts_with("<s:Envelope xmlns:s=\"http://schemas.xmlsoap.org/soap/envelope/\"><s:Header><wsrm:Response"), "{text}");
        assert!(
            text.contains("<wsrm:NonSequenceReply groupId=\"mid:g\"/>"),
            "{text}"
        );
        assert!(text.ends_with(
            "<e:echoResponse xmlns:e=\"urn:echo\">hi</e:echoResponse></s:Body></s:Envelope>"
        ));
        let env = crate::wsr::read_envelope(&bytes, &crate::wsr::Limits::default()).expect("read");
        assert_eq!(env.response.expect("ack").replies.len(), 1);
        assert_eq!(answer_bytes(&b, None), Bytes::from(ECHO11));
    }

    fn ordered(number: u64, expiry_in: chrono::Duration) -> Request {
        let now = t0();
        Request {
            message_id: crate::wsr::MessageId {
                group_id: crate::wsr::GroupId::parse("mid:o").expect("id"),
                sequence: Some(crate::wsr::SequenceNum {
                    number,
                    last: false,
                    group_limit: None,
                }),
            },
            expiry_time: now + expiry_in,
            reply_pattern: crate::wsr::ReplyPattern::Response,
            ack_requested: true,
            duplicate_elimination: true,
            message_order: true,
        }
    }

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).expect("time")
    }

    #[test]
    fn an_ordered_request_waits_for_its_gap_and_a_delivered_or_expired_one_is_not_called() {
        let hour = chrono::Duration::hours(1);
        let skew = chrono::Duration::zero();
        assert_eq!(gate(None, &ordered(0, hour), t0(), skew), Gate::Open);
        assert_eq!(gate(None, &ordered(1, hour), t0(), skew), Gate::AheadOfGap);
        let req = ordered(0, hour);
        let params = crate::rmp::group::GroupParams::of(&req, "c");
        let mut group = GroupState::new(req.message_id.group_id.clone(), params, t0());
        group.delivered.insert(0);
        group.next_expected = 1;
        assert_eq!(
            gate(Some(&group), &ordered(0, hour), t0(), skew),
            Gate::Delivered
        );
        assert_eq!(
            gate(Some(&group), &ordered(1, hour), t0(), skew),
            Gate::Open
        );
        assert_eq!(
            gate(Some(&group), &ordered(2, hour), t0(), skew),
            Gate::AheadOfGap
        );
        let expired = ordered(1, -hour);
        assert_eq!(gate(Some(&group), &expired, t0(), skew), Gate::Expired);
    }

    #[test]
    fn a_kept_exchange_decides_before_the_gate() {
        assert_eq!(Step::kept(ExchangeState::Answered, true), Step::Replay);
        assert_eq!(Step::kept(ExchangeState::InDoubt, false), Step::InDoubt);
        assert_eq!(Step::kept(ExchangeState::Calling, false), Step::Wait);
        assert_eq!(Step::kept(ExchangeState::Calling, true), Step::Unknown);
        assert_eq!(Step::unkept(Gate::Open), Step::Call);
        assert_eq!(Step::unkept(Gate::AheadOfGap), Step::Wait);
        assert_eq!(Step::unkept(Gate::Delivered), Step::AsOneWay);
        assert_eq!(Step::unkept(Gate::Expired), Step::AsOneWay);
        for state in [
            ExchangeState::Calling,
            ExchangeState::Answered,
            ExchangeState::InDoubt,
        ] {
            assert_eq!(ExchangeState::parse(state.as_str()), Some(state));
        }
    }
}
