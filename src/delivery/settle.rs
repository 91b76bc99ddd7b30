//! What handing out and settling do to one message of one subscription (DESIGN §5), over the
//! subscription's rules: the settle mode (`settled` is settled the moment it is sent), the
//! default outcome, and what a change makes possible for the other members. The store reads
//! the lease, calls these, and writes the lease back.

use chrono::{DateTime, Utc};

use super::lease::{Lease, Outcome, Stale, State};
use super::receipt::Receipt;
use super::subscription::{Ordering, Rules, SettleMode};

/// One message handed to a member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handing {
    pub attempt: u32,
    /// When the lease ends; `None` in settle mode `settled` (nothing to settle).
    pub deadline: Option<DateTime<Utc>>,
    /// The hand-out put it straight back in the subscription (settle mode `settled` with a
    /// default outcome that releases it): the other members may take it now.
    pub released: bool,
}

/// Hands `lease` to `consumer` under `rules`: a lease for one ack wait, or — settle mode
/// `settled` — settled as sent with the default outcome, never left acquired.
pub fn hand(rules: &Rules, lease: &mut Lease, consumer: &str, now: DateTime<Utc>) -> Handing {
    let policy = rules.policy();
    match rules.settle_mode {
        SettleMode::Settled => {
            let outcome = Some(rules.default_outcome.outcome());
            let attempt = lease.send_settled(consumer, outcome, now, &policy);
            Handing {
                attempt,
                deadline: None,
                released: matches!(lease.state, State::Available { .. }),
            }
        }
        SettleMode::Unsettled => {
            let attempt = lease.acquire(consumer, now, &policy);
            let deadline = match &lease.state {
                State::Acquired { deadline, .. } => Some(*deadline),
                _ => None,
            };
            Handing {
                attempt,
                deadline,
                released: false,
            }
        }
    }
}

/// What a settle changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// Something may now be handed out: the message is back in the subscription, or (ordering
    /// = group) the group's next one is free.
    pub wakes: bool,
}

/// Settles the attempt `receipt` names with `outcome` (`None`: the subscription's default
/// outcome). A receipt whose attempt is not the live one is refused, naming the current one.
/// `by`: who settled and why (`Lease::settle`).
pub fn settle(
    rules: &Rules,
    lease: &mut Lease,
    receipt: &Receipt,
    outcome: Option<Outcome>,
    now: DateTime<Utc>,
    by: Option<&str>,
) -> Result<Settled, Stale> {
    let outcome = outcome.unwrap_or_else(|| rules.default_outcome.outcome());
    lease.settle(
        receipt.attempt,
        &receipt.consumer,
        outcome,
        now,
        &rules.policy(),
        by,
    )?;
    Ok(Settled {
        wakes: matches!(lease.state, State::Available { .. }) || rules.ordering == Ordering::Group,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::lease::tests::t0;
    use crate::delivery::subscription::{DefaultOutcome, Mode};
    use chrono::Duration;

    fn rules(settle_mode: SettleMode, default_outcome: DefaultOutcome) -> Rules {
        Rules {
            mode: Mode::Pull,
            settle_mode,
            default_outcome,
            ack_wait_ms: 30_000,
            max_deliveries: 2,
            backoff_ms: vec![1_000],
            ordering: Ordering::None,
            durable: true,
        }
    }

    fn receipt(attempt: u32, consumer: &str) -> Receipt {
        Receipt {
            subscription: "1".into(),
            offset: 7,
            attempt,
            consumer: consumer.into(),
        }
    }

    #[test]
    fn settled_mode_never_stays_acquired() {
        for default in [
            DefaultOutcome::Accepted,
            DefaultOutcome::Rejected,
            DefaultOutcome::Released,
            DefaultOutcome::Modified,
        ] {
            let r = rules(SettleMode::Settled, default);
            let mut lease = Lease::new(t0());
            let handing = hand(&r, &mut lease, "A", t0());
            assert_eq!(handing.deadline, None, "{default:?}");
            assert!(
                !matches!(lease.state, State::Acquired { .. }),
                "{default:?}: {:?}",
                lease.state
            );
            assert_eq!(handing.released, default != DefaultOutcome::Accepted);
            if handing.released {
                assert!(!lease.available_to("A", false, t0()), "not back to A");
            }
        }
    }

    #[test]
    fn unsettled_mode_leases_for_one_ack_wait() {
        let r = rules(SettleMode::Unsettled, DefaultOutcome::Accepted);
        let mut lease = Lease::new(t0());
        let handing = hand(&r, &mut lease, "A", t0());
        assert_eq!(handing.attempt, 1);
        assert_eq!(handing.deadline, Some(t0() + Duration::seconds(30)));
        assert!(!handing.released);
    }

    #[test]
    fn a_stale_receipt_is_refused_naming_the_current_attempt() {
        let r = rules(SettleMode::Unsettled, DefaultOutcome::Accepted);
        let mut lease = Lease::new(t0());
        hand(&r, &mut lease, "A", t0());
        let late = t0() + Duration::seconds(31);
        lease.expire(late, &r.policy());
        hand(&r, &mut lease, "B", late);
        let refused =
            settle(&r, &mut lease, &receipt(1, "A"), None, late, None).expect_err("stale");
        assert_eq!(refused.current_attempt, 2);
        assert!(refused.reason.contains("superseded"), "{refused}");
        assert!(matches!(&lease.state, State::Acquired { consumer, .. } if consumer == "B"));
    }

    #[test]
    fn max_deliveries_dead_letters_with_the_reason_and_the_default_outcome_applies() {
        let r = rules(SettleMode::Unsettled, DefaultOutcome::Modified);
        let mut lease = Lease::new(t0());
        let first = hand(&r, &mut lease, "A", t0());
        let again = settle(
            &r,
            &mut lease,
            &receipt(first.attempt, "A"),
            None,
            t0(),
            None,
        )
        .expect("live");
        assert!(again.wakes, "back for the others");
        let later = t0() + Duration::seconds(2);
        let second = hand(&r, &mut lease, "B", later);
        let done = settle(
            &r,
            &mut lease,
            &receipt(second.attempt, "B"),
            None,
            later,
            None,
        )
        .expect("live");
        assert!(!done.wakes);
        assert_eq!(
            lease.state,
            State::DeadLettered {
                reason: "2 failed deliveries (max_deliveries)".into()
            }
        );
    }

    #[test]
    fn a_settle_in_group_order_frees_the_groups_next() {
        let mut r = rules(SettleMode::Unsettled, DefaultOutcome::Accepted);
        r.ordering = Ordering::Group;
        let mut lease = Lease::new(t0());
        let h = hand(&r, &mut lease, "A", t0());
        let s = settle(&r, &mut lease, &receipt(h.attempt, "A"), None, t0(), None).expect("live");
        assert!(s.wakes);
        assert_eq!(lease.state, State::Done);
    }
}
