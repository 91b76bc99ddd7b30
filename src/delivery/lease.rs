//! One message's life in one subscription (DESIGN §5), as a pure state machine: handed to a
//! consumer for an ack-wait (a lease, one attempt), settled with an outcome, released, or
//! dead-lettered. Time is a parameter; the store keeps the state and the subscription picks
//! which message a consumer gets.
//!
//! The rules that make acks trustworthy: every attempt has its own number; a settle or extend
//! naming an attempt that is no longer current, another consumer, or a passed deadline is
//! refused with the reason and the current attempt — never applied to someone else's attempt.

use std::collections::BTreeSet;

use chrono::{DateTime, Duration, Utc};

/// The cause of an attempt whose lease ran out, as a dead letter's reason says it.
pub const DEADLINE_PASSED: &str = "the ack deadline passed with no settle";

/// AMQP outcomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done with it.
    Accepted,
    /// Never deliver it again: dead-letter.
    Rejected,
    /// Back to the subscription now; the attempt does not count.
    Released,
    /// Back to the subscription, possibly later and elsewhere.
    Modified {
        /// The attempt counts towards `max_deliveries`.
        delivery_failed: bool,
        /// Keep it away from this consumer.
        undeliverable_here: bool,
        delay: Option<Duration>,
    },
}

impl Outcome {
    /// Its AMQP name (metrics labels).
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Rejected => "rejected",
            Outcome::Released => "released",
            Outcome::Modified { .. } => "modified",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub ack_wait: Duration,
    pub max_deliveries: u32,
    /// Waits after the 1st, 2nd, … failed delivery; the last repeats.
    pub backoff: Vec<Duration>,
}

impl Policy {
    fn backoff_after(&self, failures: u32) -> Duration {
        let i = (failures.max(1) - 1) as usize;
        self.backoff
            .get(i)
            .or(self.backoff.last())
            .copied()
            .unwrap_or_else(Duration::zero)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Waiting for a consumer, not before `not_before`, preferably not one of `avoid`.
    Available {
        not_before: DateTime<Utc>,
        avoid: BTreeSet<String>,
    },
    /// Leased to `consumer` for attempt `attempt` until `deadline`.
    Acquired {
        consumer: String,
        deadline: DateTime<Utc>,
        avoid: BTreeSet<String>,
    },
    Done,
    DeadLettered {
        reason: String,
    },
}

/// One message in one subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub state: State,
    /// The latest attempt number handed out (0: never).
    pub attempt: u32,
    /// Attempts that counted as failed deliveries.
    pub failures: u32,
}

/// Why a settle or extend was refused (HTTP 409), naming the current attempt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason} (current attempt: {current_attempt})")]
pub struct Stale {
    pub current_attempt: u32,
    pub reason: String,
}

impl Lease {
    pub fn new(now: DateTime<Utc>) -> Lease {
        Lease {
            state: State::Available {
                not_before: now,
                avoid: BTreeSet::new(),
            },
            attempt: 0,
            failures: 0,
        }
    }

    /// Whether `consumer` may take it now. `alone`: no other live member could take it, so a
    /// consumer it should avoid may have it after all (better than never).
    pub fn available_to(&self, consumer: &str, alone: bool, now: DateTime<Utc>) -> bool {
        match &self.state {
            State::Available { not_before, avoid } => {
                *not_before <= now && (alone || !avoid.contains(consumer))
            }
            _ => false,
        }
    }

    /// The consumers this message should preferably not go to.
    pub fn avoided(&self) -> Option<&BTreeSet<String>> {
        match &self.state {
            State::Available { avoid, .. } | State::Acquired { avoid, .. } => Some(avoid),
            State::Done | State::DeadLettered { .. } => None,
        }
    }

    /// Hands the message to `consumer`: a new attempt with its own number and deadline.
    pub fn acquire(&mut self, consumer: &str, now: DateTime<Utc>, policy: &Policy) -> u32 {
        let avoid = match &mut self.state {
            State::Available { avoid, .. } => std::mem::take(avoid),
            _ => BTreeSet::new(),
        };
        self.attempt += 1;
        self.state = State::Acquired {
            consumer: consumer.to_owned(),
            deadline: now + policy.ack_wait,
            avoid,
        };
        self.attempt
    }

    /// Checks that `attempt` by `consumer` is the live lease at `now`.
    fn live(&self, attempt: u32, consumer: &str, now: DateTime<Utc>) -> Result<(), Stale> {
        let stale = |reason: String| {
            Err(Stale {
                current_attempt: self.attempt,
                reason,
            })
        };
        match &self.state {
            State::Acquired {
                consumer: holder,
                deadline,
                ..
            } => {
                if attempt != self.attempt {
                    stale(format!(
                        "attempt {attempt} was superseded by attempt {}",
                        self.attempt
                    ))
                } else if holder != consumer {
                    stale(format!("attempt {attempt} belongs to another consumer"))
                } else if *deadline < now {
                    stale(format!("the deadline of attempt {attempt} has passed"))
                } else {
                    Ok(())
                }
            }
            State::Available { .. } => stale(format!("attempt {attempt} is no longer leased")),
            State::Done => stale("the message was already settled".into()),
            State::DeadLettered { .. } => stale("the message was dead-lettered".into()),
        }
    }

    /// Extends the live lease by one ack-wait; returns the confirmed new deadline.
    pub fn extend(
        &mut self,
        attempt: u32,
        consumer: &str,
        now: DateTime<Utc>,
        policy: &Policy,
    ) -> Result<DateTime<Utc>, Stale> {
        self.live(attempt, consumer, now)?;
        let new_deadline = now + policy.ack_wait;
        if let State::Acquired { deadline, .. } = &mut self.state {
            *deadline = new_deadline;
        }
        Ok(new_deadline)
    }

    /// Settles the live lease with an outcome.
    ///
    /// `by` says who settled and why, as a dead letter's reason names it (the principal, or
    /// the push endpoint and what it answered); without it, the consumer.
    pub fn settle(
        &mut self,
        attempt: u32,
        consumer: &str,
        outcome: Outcome,
        now: DateTime<Utc>,
        policy: &Policy,
        by: Option<&str>,
    ) -> Result<(), Stale> {
        self.live(attempt, consumer, now)?;
        self.apply(consumer, outcome, now, policy, by);
        Ok(())
    }

    /// Settle mode `settled` (at-most-once): settled the moment it is sent, with the default
    /// outcome; never left acquired. Whatever does not remove it goes to other members only.
    pub fn send_settled(
        &mut self,
        consumer: &str,
        default_outcome: Option<Outcome>,
        now: DateTime<Utc>,
        policy: &Policy,
    ) -> u32 {
        let attempt = self.acquire(consumer, now, policy);
        // DESIGN §5: accepted (or none) removes it; every other outcome releases it to the
        // other members — a consumer that never saw a chance to answer cannot reject it.
        let outcome = match default_outcome {
            None | Some(Outcome::Accepted) => Outcome::Accepted,
            Some(Outcome::Rejected) | Some(Outcome::Released) | Some(Outcome::Modified { .. }) => {
                Outcome::Modified {
                    delivery_failed: false,
                    undeliverable_here: true,
                    delay: None,
                }
            }
        };
        self.apply(consumer, outcome, now, policy, None);
        attempt
    }

    /// The lease's deadline passed with no settle: the attempt failed; back to the others at
    /// once — the ack-wait already was the pause a backoff would give.
    pub fn expire(&mut self, now: DateTime<Utc>, policy: &Policy) {
        if let State::Acquired {
            deadline, consumer, ..
        } = &self.state
            && *deadline < now
        {
            let consumer = consumer.clone();
            self.apply(
                &consumer,
                Outcome::Modified {
                    delivery_failed: true,
                    undeliverable_here: false,
                    delay: Some(Duration::zero()),
                },
                now,
                policy,
                Some(DEADLINE_PASSED),
            );
        }
    }

    /// The member holding it vanished (its session lapsed): released to the others at once,
    /// without waiting for the ack-wait and without counting the attempt.
    pub fn holder_gone(&mut self, gone: &str, now: DateTime<Utc>, policy: &Policy) {
        if matches!(&self.state, State::Acquired { consumer, .. } if consumer == gone) {
            self.apply(gone, Outcome::Released, now, policy, None);
        }
    }

    /// A dead letter replayed: back in the subscription as new — its failure count starts
    /// over, nobody is avoided — keeping its attempt numbers (old receipts stay stale).
    /// `false`: it was not dead-lettered, nothing changed.
    pub fn replay(&mut self, now: DateTime<Utc>) -> bool {
        if !matches!(self.state, State::DeadLettered { .. }) {
            return false;
        }
        self.state = State::Available {
            not_before: now,
            avoid: BTreeSet::new(),
        };
        self.failures = 0;
        true
    }

    /// A dead letter purged for good (settled as done). `false`: it was not dead-lettered.
    pub fn purge(&mut self) -> bool {
        if !matches!(self.state, State::DeadLettered { .. }) {
            return false;
        }
        self.state = State::Done;
        true
    }

    /// Settled as done (accepted by an application, or a purged dead letter).
    pub fn done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Settled or dead-lettered: nothing more happens to it (its group moves on).
    pub fn finished(&self) -> bool {
        matches!(self.state, State::Done | State::DeadLettered { .. })
    }

    /// The lease's deadline passed at `now` without a settle.
    pub fn overdue(&self, now: DateTime<Utc>) -> bool {
        matches!(&self.state, State::Acquired { deadline, .. } if *deadline < now)
    }

    /// `by`: who settled and why (`settle`), or what failed the attempt (`DEADLINE_PASSED`):
    /// a dead letter's reason names it, so that the operator sees the cause, not a count.
    fn apply(
        &mut self,
        consumer: &str,
        outcome: Outcome,
        now: DateTime<Utc>,
        policy: &Policy,
        by: Option<&str>,
    ) {
        let mut avoid = match &mut self.state {
            State::Acquired { avoid, .. } | State::Available { avoid, .. } => std::mem::take(avoid),
            _ => BTreeSet::new(),
        };
        self.state = match outcome {
            Outcome::Accepted => State::Done,
            Outcome::Rejected => State::DeadLettered {
                reason: format!("rejected by {}", by.unwrap_or(consumer)),
            },
            Outcome::Released => State::Available {
                not_before: now,
                avoid,
            },
            Outcome::Modified {
                delivery_failed,
                undeliverable_here,
                delay,
            } => {
                if undeliverable_here {
                    avoid.insert(consumer.to_owned());
                }
                if delivery_failed {
                    self.failures += 1;
                    // A failed delivery goes preferably to someone else.
                    avoid.insert(consumer.to_owned());
                }
                if self.failures >= policy.max_deliveries {
                    let last = by.map_or(String::new(), |why| format!("; the last: {why}"));
                    State::DeadLettered {
                        reason: format!(
                            "{} failed deliveries (max_deliveries){last}",
                            self.failures
                        ),
                    }
                } else {
                    let wait = match delay {
                        Some(d) => d,
                        None if delivery_failed => policy.backoff_after(self.failures),
                        None => Duration::zero(),
                    };
                    State::Available {
                        // A delay past the end of time is no delay the API lets through;
                        // saturate rather than panic inside the store's writer.
                        not_before: now
                            .checked_add_signed(wait)
                            .unwrap_or(DateTime::<Utc>::MAX_UTC),
                        avoid,
                    }
                }
            }
        };
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use chrono::TimeZone;

    pub(crate) fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0)
            .single()
            .expect("date")
    }

    pub(crate) fn policy() -> Policy {
        Policy {
            ack_wait: Duration::seconds(30),
            max_deliveries: 3,
            backoff: vec![Duration::seconds(1), Duration::seconds(5)],
        }
    }

    pub(crate) fn nack() -> Outcome {
        Outcome::Modified {
            delivery_failed: true,
            undeliverable_here: false,
            delay: None,
        }
    }

    #[test]
    fn a_late_settle_of_a_superseded_attempt_is_refused_and_the_message_stays_with_b() {
        let p = policy();
        let mut m = Lease::new(t0());
        let a = m.acquire("A", t0(), &p);
        let late = t0() + Duration::seconds(31);
        m.expire(late, &p);
        assert!(m.available_to("B", false, late + Duration::seconds(1)));
        let b = m.acquire("B", late + Duration::seconds(1), &p);
        assert_eq!((a, b), (1, 2));
        let refused = m.settle(
            a,
            "A",
            Outcome::Accepted,
            late + Duration::seconds(2),
            &p,
            None,
        );
        assert_eq!(refused.expect_err("stale").current_attempt, 2);
        let extend = m.extend(a, "A", late + Duration::seconds(2), &p);
        assert!(extend.is_err(), "A's old receipt cannot extend either");
        assert!(matches!(&m.state, State::Acquired { consumer, .. } if consumer == "B"));
        let deadline = m
            .extend(b, "B", late + Duration::seconds(3), &p)
            .expect("B extends");
        assert_eq!(
            deadline,
            late + Duration::seconds(33),
            "the confirmed new deadline"
        );
        m.settle(
            b,
            "B",
            Outcome::Accepted,
            late + Duration::seconds(4),
            &p,
            None,
        )
        .expect("B settles");
        assert_eq!(m.state, State::Done);
    }

    #[test]
    fn a_settle_after_the_deadline_is_refused_even_before_anyone_else_took_it() {
        let p = policy();
        let mut m = Lease::new(t0());
        let a = m.acquire("A", t0(), &p);
        let err = m
            .settle(
                a,
                "A",
                Outcome::Accepted,
                t0() + Duration::seconds(31),
                &p,
                None,
            )
            .expect_err("late");
        assert!(err.reason.contains("deadline"), "{err}");
        assert!(
            m.settle(a, "B", Outcome::Accepted, t0(), &p, None).is_err(),
            "not B's attempt"
        );
    }

    #[test]
    fn nacks_go_elsewhere_with_backoff_and_end_in_the_dead_letter_list() {
        let p = policy();
        let mut m = Lease::new(t0());
        let mut now = t0();
        for round in 1..=3u32 {
            let attempt = m.acquire("A", now, &p);
            m.settle(attempt, "A", nack(), now, &p, None).expect("live");
            if round < 3 {
                assert!(
                    !m.available_to("A", false, now + Duration::seconds(10)),
                    "A is avoided"
                );
                assert!(
                    m.available_to("A", true, now + Duration::seconds(10)),
                    "unless A is alone"
                );
                assert!(!m.available_to("B", false, now), "backoff first");
                now += Duration::seconds(10);
                assert!(m.available_to("B", false, now));
            }
        }
        assert!(
            matches!(&m.state, State::DeadLettered { reason } if reason.contains("max_deliveries"))
        );
    }

    #[test]
    fn released_does_not_count_and_a_vanished_holder_releases_at_once() {
        let p = policy();
        let mut m = Lease::new(t0());
        for _ in 0..5 {
            let a = m.acquire("A", t0(), &p);
            m.settle(a, "A", Outcome::Released, t0(), &p, None)
                .expect("live");
        }
        assert_eq!(m.failures, 0);
        m.acquire("A", t0(), &p);
        m.holder_gone("A", t0() + Duration::seconds(1), &p);
        assert!(
            m.available_to("B", false, t0() + Duration::seconds(1)),
            "well before the ack-wait"
        );
    }

    /// A dead letter's reason says the cause of the last failure: a deadline that passed.
    #[test]
    fn a_lease_that_ran_out_max_times_says_so() {
        let p = Policy {
            max_deliveries: 1,
            ..policy()
        };
        let mut m = Lease::new(t0());
        m.acquire("A", t0(), &p);
        m.expire(t0() + Duration::hours(1), &p);
        assert_eq!(
            m.state,
            State::DeadLettered {
                reason: format!(
                    "1 failed deliveries (max_deliveries); the last: {DEADLINE_PASSED}"
                )
            }
        );
    }

    #[test]
    fn max_deliveries_dead_letters_with_the_reason_and_a_replay_starts_over() {
        let p = policy();
        let mut m = Lease::new(t0());
        let mut now = t0();
        for _ in 0..3 {
            now += Duration::seconds(60);
            let attempt = m.acquire("A", now, &p);
            m.settle(attempt, "A", nack(), now, &p, None).expect("live");
        }
        assert_eq!(
            m.state,
            State::DeadLettered {
                reason: "3 failed deliveries (max_deliveries)".into()
            }
        );
        assert!(m.finished());
        assert!(m.replay(now));
        assert_eq!(m.failures, 0);
        assert_eq!(m.attempt, 3, "old receipts stay stale");
        assert!(m.available_to("A", false, now), "nobody avoided");
        assert!(!m.replay(now), "only a dead letter replays");
        assert!(!m.purge());
        let mut d = Lease::new(t0());
        d.state = State::DeadLettered { reason: "x".into() };
        assert!(d.purge());
        assert_eq!(d.state, State::Done);
    }

    #[test]
    fn a_lease_is_overdue_only_after_its_deadline() {
        let p = policy();
        let mut m = Lease::new(t0());
        m.acquire("A", t0(), &p);
        assert!(!m.overdue(t0() + Duration::seconds(30)));
        assert!(m.overdue(t0() + Duration::seconds(31)));
    }

    #[test]
    fn settled_mode_is_never_left_acquired_and_never_returns_to_the_same_consumer() {
        let p = policy();
        let mut m = Lease::new(t0());
        m.send_settled("A", Some(Outcome::Released), t0(), &p);
        assert!(!m.available_to("A", false, t0()), "not back to A");
        assert!(m.available_to("B", false, t0()));
        m.send_settled("B", None, t0(), &p);
        assert_eq!(m.state, State::Done);
        // Rejected as a default outcome releases too (DESIGN §5).
        let mut r = Lease::new(t0());
        r.send_settled("A", Some(Outcome::Rejected), t0(), &p);
        assert!(!r.available_to("A", false, t0()));
        assert!(r.available_to("B", false, t0()));
    }
}
