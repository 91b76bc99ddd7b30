//! Property tests: the protocol core never panics, whatever dates, durations and numbers the
//! wire, the API or the config hand it (D13). Each case drives the receiver, the group
//! lifecycle, the agreement and the sender with values drawn from the edges of their ranges.

use chrono::{DateTime, Duration, Utc};
use proptest::prelude::*;

use super::agreement::Agreement;
use super::group::{Policy, sweep};
use super::receiver::{Incoming, receive};
use super::sender::{Event, Outbound, RetrySchedule};
use crate::wsr::datetime::XsDuration;
use crate::wsr::{FaultCode, GroupId, GroupLimit, MessageId, ReplyPattern, Request, SequenceNum};

/// An instant anywhere in chrono's range, with the edges and the near future over-weighted.
fn instant() -> impl Strategy<Value = DateTime<Utc>> {
    let min = DateTime::<Utc>::MIN_UTC.timestamp_millis();
    let max = DateTime::<Utc>::MAX_UTC.timestamp_millis();
    let now = Utc::now().timestamp_millis();
    prop_oneof![
        Just(DateTime::<Utc>::MIN_UTC),
        Just(DateTime::<Utc>::MAX_UTC),
        (min..=max).prop_map(|ms| DateTime::from_timestamp_millis(ms).unwrap_or_default()),
        (-86_400_000i64..86_400_000 * 400)
            .prop_map(move |d| DateTime::from_timestamp_millis(now + d).unwrap_or_default()),
    ]
}

fn span() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::MAX),
        Just(Duration::MIN),
        Just(Duration::zero()),
        any::<i64>().prop_map(Duration::milliseconds),
        (0i64..86_400 * 400).prop_map(Duration::seconds),
    ]
}

fn xs_duration() -> impl Strategy<Value = XsDuration> {
    let field = prop_oneof![Just(0u32), Just(u32::MAX), any::<u32>(), 0u32..100];
    (
        field.clone(),
        field.clone(),
        field.clone(),
        field.clone(),
        field.clone(),
        field,
        0u32..1_000_000_000,
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

fn limit() -> impl Strategy<Value = Option<GroupLimit>> {
    prop_oneof![
        Just(None),
        instant().prop_map(|t| Some(GroupLimit::ExpiryTime(t))),
        xs_duration().prop_map(|d| Some(GroupLimit::MaxIdleDuration(d))),
    ]
}

fn number() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![
        Just(None),
        Just(Some(0)),
        Just(Some(u64::MAX)),
        any::<u64>().prop_map(Some),
        (0u64..5).prop_map(Some),
    ]
}

fn request(
    number: Option<u64>,
    last: bool,
    limit: Option<GroupLimit>,
    expiry: DateTime<Utc>,
) -> Request {
    Request {
        message_id: MessageId {
            group_id: GroupId::parse("mid:extreme@test").expect("group id"),
            sequence: number.map(|number| SequenceNum {
                number,
                last,
                group_limit: limit,
            }),
        },
        expiry_time: expiry,
        reply_pattern: ReplyPattern::Poll,
        ack_requested: true,
        duplicate_elimination: true,
        message_order: number.is_some(),
    }
}

fn policy() -> impl Strategy<Value = Policy> {
    (span(), xs_duration(), span(), any::<u64>()).prop_map(
        |(clock_skew, default_idle, answer_polls_for, buffer_max_bytes)| Policy {
            clock_skew,
            default_idle,
            buffer_max_messages: 1000,
            buffer_max_bytes,
            answer_polls_for,
            max_open_groups_per_source: 1,
        },
    )
}

fn schedule() -> impl Strategy<Value = RetrySchedule> {
    let wait = prop_oneof![
        Just(std::time::Duration::MAX),
        any::<u64>().prop_map(std::time::Duration::from_millis),
        any::<u64>().prop_map(std::time::Duration::from_secs),
    ];
    prop_oneof![
        proptest::collection::vec(wait.clone(), 0..4).prop_map(RetrySchedule::Waits),
        (any::<u32>(), wait, any::<u32>()).prop_map(|(max_attempts, interval, backoff)| {
            RetrySchedule::Interval {
                max_attempts,
                interval,
                backoff,
            }
        }),
    ]
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        Just(Event::Sent),
        Just(Event::Unreached),
        Just(Event::Acked),
        Just(Event::Faulted(FaultCode::MessageProcessingFailure)),
        (instant(), any::<u64>()).prop_map(|(asked_at, s)| Event::NotHeld {
            asked_at,
            kept_for: std::time::Duration::from_secs(s),
        }),
    ]
}

/// The case the properties below first found (kept here rather than in a regressions file at
/// the top of the repository): the largest clock skew plus the purge's millisecond overflowed.
#[test]
fn the_largest_skew_does_not_overflow_the_purge() {
    let policy = Policy {
        clock_skew: Duration::MAX,
        answer_polls_for: Duration::MAX,
        ..Policy::default()
    };
    let r = request(None, false, None, DateTime::<Utc>::MIN_UTC);
    let msg = Incoming {
        request: &r,
        channel: "c",
        body_bytes: 0,
        open_groups_of_source: 0,
        room: crate::rmp::quota::SourceRoom::UNLIMITED,
    };
    let out = receive(None, msg, DateTime::<Utc>::MIN_UTC, &policy);
    if let Some(mut s) = out.state {
        let _ = s.purge_at(&policy);
        let _ = s.next_deadline(&policy);
        let _ = sweep(&mut s, DateTime::<Utc>::MAX_UTC, &policy);
    }
}

proptest! {
    // No regressions file: a failing case is shrunk and printed, and kept as a test above.
    #![proptest_config(ProptestConfig {
        cases: 1_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Receive, resend, sweep and purge a group at extreme times under an extreme policy.
    #[test]
    fn the_receiver_and_the_group_lifecycle_never_panic(
        first in (number(), any::<bool>(), limit(), instant()),
        second in (number(), any::<bool>(), instant()),
        times in proptest::collection::vec(instant(), 1..4),
        policy in policy(),
        horizon in span(),
    ) {
        let (n, last, lim, expiry) = first;
        let r1 = request(n, last, lim.clone(), expiry);
        let agreement = Agreement {
            expiry_horizon: horizon,
            group_lifetime: horizon,
            ..Agreement::everything()
        };
        let msg = |r| Incoming {
            request: r,
            channel: "c",
            body_bytes: u64::MAX,
            open_groups_of_source: u64::MAX,
            room: crate::rmp::quota::SourceRoom::UNLIMITED,
        };
        let mut state = None;
        for now in &times {
            let _ = agreement.check(&r1, *now);
            let out = receive(state.as_ref(), msg(&r1), *now, &policy);
            if out.state.is_some() {
                state = out.state;
            }
        }
        let (n2, last2, expiry2) = second;
        let r2 = request(n2, last2, lim, expiry2);
        for now in &times {
            let out = receive(state.as_ref(), msg(&r2), *now, &policy);
            if out.state.is_some() {
                state = out.state;
            }
            if let Some(s) = state.as_mut() {
                let _ = s.next_deadline(&policy);
                let _ = s.purge_at(&policy);
                let _ = sweep(s, *now, &policy);
            }
        }
    }

    /// The sender's schedule and stop rules with extreme waits, expiries and events.
    #[test]
    fn the_sender_never_panics(
        expiry in instant(),
        schedule in schedule(),
        steps in proptest::collection::vec((event(), instant(), any::<u64>()), 0..12),
    ) {
        let mut m = Outbound::new(expiry, schedule, DateTime::<Utc>::MIN_UTC);
        for (event, now, resolve) in steps {
            let _ = m.due(now, std::time::Duration::from_secs(resolve));
            m.apply(event, now);
        }
    }
}
