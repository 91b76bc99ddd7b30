//! Property tests: write→read gives back the same values for arbitrary `Request`, `Response`
//! and `PollRequest` in both SOAP versions; a sample of what the writer produced validates
//! against `schemas/`; reading arbitrary or mangled bytes never panics.

use chrono::{DateTime, Utc};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use wsr_gateway::wsr::datetime::XsDuration;
use wsr_gateway::wsr::{
    FaultCode, GroupId, GroupLimit, Headers, MessageId, PollRequest, RefToMessageIds, Reply,
    ReplyPattern, ReplyRange, ReplyTo, Request, Response, SeqRange, SequenceNum, SoapVersion,
    read_envelope, read_message, write_envelope,
};

use super::support::{assert_schema_valid, limits};

fn group_id() -> impl Strategy<Value = GroupId> {
    (
        "(mid:|mid://|urn:uuid:|http://h/)",
        "([a-zA-Z0-9._@&=-]|%[0-9A-F]{2}){1,24}",
    )
        .prop_filter_map("an xs:anyURI", |(scheme, rest)| {
            GroupId::parse(&format!("{scheme}{rest}")).ok()
        })
}

fn instant() -> impl Strategy<Value = DateTime<Utc>> {
    // Years 1970..=9999, any nanosecond.
    (0i64..253_402_300_799, 0u32..1_000_000_000)
        .prop_map(|(s, n)| DateTime::from_timestamp(s, n).expect("in range"))
}

fn duration() -> impl Strategy<Value = XsDuration> {
    (
        0u32..50,
        0u32..30,
        0u32..400,
        0u32..100,
        0u32..100,
        0u32..100_000,
        prop_oneof![Just(0u32), 0u32..1_000_000_000],
    )
        .prop_map(
            |(years, months, days, hours, minutes, seconds, nanos)| XsDuration {
                negative: false,
                years,
                months,
                days,
                hours,
                minutes,
                seconds,
                nanos,
            },
        )
}

fn reply_to() -> impl Strategy<Value = ReplyTo> {
    (
        "https?://[a-z0-9.]{1,12}(:[0-9]{2,5})?/[a-zA-Z0-9/_&=?-]{0,20}",
        proptest::option::of("urn:[a-z]{1,8}"),
    )
        .prop_map(|(uri, reference_scheme)| ReplyTo {
            uri,
            reference_scheme,
        })
}

fn fault() -> impl Strategy<Value = Option<FaultCode>> {
    proptest::option::of(proptest::sample::select(FaultCode::ALL.to_vec()))
}

fn seq_range() -> impl Strategy<Value = SeqRange> {
    (any::<u64>(), any::<u64>())
        .prop_map(|(a, b)| SeqRange::new(a.min(b), a.max(b)).expect("ordered"))
}

fn request() -> impl Strategy<Value = Request> {
    let sequence = proptest::option::of((
        any::<u64>(),
        any::<bool>(),
        proptest::option::of(prop_oneof![
            instant().prop_map(GroupLimit::ExpiryTime),
            duration().prop_map(GroupLimit::MaxIdleDuration)
        ]),
    ));
    let pattern = prop_oneof![
        Just(ReplyPattern::Response),
        Just(ReplyPattern::Poll),
        reply_to().prop_map(ReplyPattern::Callback)
    ];
    (group_id(), sequence, instant(), pattern, any::<[bool; 3]>()).prop_map(
        |(group_id, sequence, expiry_time, reply_pattern, [ack, dup, order])| {
            let sequence = sequence.map(|(number, last, group_limit)| SequenceNum {
                number,
                last,
                group_limit,
            });
            // MessageOrder only with SequenceNum, AckRequested and DuplicateElimination (D9).
            let order = order && sequence.is_some();
            Request {
                message_id: MessageId { group_id, sequence },
                expiry_time,
                reply_pattern,
                ack_requested: ack || order,
                duplicate_elimination: dup || order,
                message_order: order,
            }
        },
    )
}

fn response() -> impl Strategy<Value = Response> {
    let reply = prop_oneof![
        (group_id(), fault()).prop_map(|(group_id, fault)| Reply::NonSequence { group_id, fault }),
        (
            group_id(),
            proptest::collection::vec((seq_range(), fault()), 1..4)
        )
            .prop_map(|(group_id, ranges)| {
                Reply::Sequence {
                    group_id,
                    ranges: ranges
                        .into_iter()
                        .map(|(range, fault)| ReplyRange { range, fault })
                        .collect(),
                }
            }),
    ];
    proptest::collection::vec(reply, 1..5).prop_map(|replies| Response { replies })
}

fn poll_request() -> impl Strategy<Value = PollRequest> {
    let refs = proptest::collection::vec(
        (group_id(), proptest::collection::vec(seq_range(), 0..3))
            .prop_map(|(group_id, ranges)| RefToMessageIds { group_id, ranges }),
        1..4,
    );
    (refs, proptest::option::of(reply_to()))
        .prop_map(|(refs, reply_to)| PollRequest { refs, reply_to })
}

fn body() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-zA-Z0-9 <>&\"']{0,40}".prop_map(|t| format!(
            "<p:Order xmlns:p=\"urn:p\" id=\"1\">{}</p:Order>",
            quick_xml::escape::escape(t.as_str())
        )),
        Just("<a><b/><c>text</c></a><!-- note -->".to_owned()),
    ]
}

fn version() -> impl Strategy<Value = SoapVersion> {
    prop_oneof![Just(SoapVersion::Soap11), Just(SoapVersion::Soap12)]
}

type Case = (
    SoapVersion,
    Option<Request>,
    Option<Response>,
    Option<PollRequest>,
    String,
);

fn case() -> impl Strategy<Value = Case> {
    (
        version(),
        proptest::option::of(request()),
        proptest::option::of(response()),
        proptest::option::of(poll_request()),
        body(),
    )
}

fn write(case: &Case) -> String {
    let (version, request, response, poll, body) = case;
    write_envelope(
        *version,
        Headers {
            request: request.as_ref(),
            response: response.as_ref(),
            poll_request: poll.as_ref(),
        },
        body,
    )
}

fn check_round_trip(case: &Case) -> Result<(), TestCaseError> {
    let xml = write(case);
    let env = read_envelope(xml.as_bytes(), &limits())
        .map_err(|d| TestCaseError::fail(format!("{d}\n{xml}")))?;
    let (version, request, response, poll, body) = case;
    prop_assert_eq!(env.version, *version);
    prop_assert_eq!(&env.request, request);
    prop_assert_eq!(&env.response, response);
    prop_assert_eq!(&env.poll_request, poll);
    prop_assert_eq!(env.body.content, body.as_str());
    prop_assert!(
        env.quirks.is_empty(),
        "our own output needs no tolerance: {:?}",
        env.quirks
    );
    Ok(())
}

proptest! {
    #![proptest_config(Config { cases: 512, ..Config::default() })]

    #[test]
    fn write_then_read_gives_the_same_values(case in case()) {
        check_round_trip(&case)?;
    }

    #[test]
    fn reading_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
        let _ = read_envelope(&bytes, &limits());
        let _ = read_message(Some("multipart/related; boundary=b"), &bytes, &limits());
    }

    #[test]
    fn reading_mangled_envelopes_never_panics(
        case in case(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8),
    ) {
        let mut bytes = write(&case).into_bytes();
        for (at, byte, kind) in edits {
            if bytes.is_empty() {
                break;
            }
            let i = at.index(bytes.len());
            match kind {
                0 => bytes[i] = byte,
                1 => { bytes.remove(i); }
                _ => bytes.truncate(i),
            }
        }
        let _ = read_envelope(&bytes, &limits());
    }
}

#[test]
fn written_envelopes_validate_against_the_schema() {
    let mut runner = TestRunner::new(Config {
        cases: 300,
        ..Config::default()
    });
    let strategy = case();
    let mut docs = Vec::new();
    for _ in 0..300 {
        let case = strategy
            .new_tree(&mut runner)
            .expect("generate a case")
            .current();
        docs.push((case.0, write(&case)));
    }
    assert_schema_valid(&docs);
}
