//! Which waiting messages a consumer gets when it fetches (DESIGN §5): the store hands in the
//! candidates in offset order — for `ordering = group` only the head of each group, the one
//! message of it that may be in flight — and this decides, purely, which of them this member
//! may take now.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};

use super::lease::Lease;
use super::subscription::{Rules, SettleMode};

/// A message waiting in one subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub offset: i64,
    pub lease: Lease,
    /// The member its group is bound to (`ordering = group`), if any.
    pub affinity: Option<String>,
    /// `ordering = group`: another message of its group is leased (a replayed dead letter can
    /// be the head behind a leased one), so none of the group goes out until that is settled.
    pub group_busy: bool,
}

/// Who is asking, and who else could take messages.
pub struct Members<'a> {
    pub me: &'a str,
    /// The live members of the subscription (sessions not lapsed), `me` included.
    pub live: &'a BTreeSet<String>,
    /// Settle mode `settled`: a message released by a member never goes back to it, even when
    /// no other member is there to take it.
    pub strict_avoid: bool,
}

impl<'a> Members<'a> {
    /// `me` among the `live` members of a subscription with `rules`: settle mode `settled`
    /// keeps a released message from its member strictly.
    pub fn under(rules: &Rules, me: &'a str, live: &'a BTreeSet<String>) -> Members<'a> {
        Members {
            me,
            live,
            strict_avoid: rules.settle_mode == SettleMode::Settled,
        }
    }
}

/// The indexes of the candidates `members.me` takes now, at most `max`, in offset order.
pub fn pick(
    candidates: &[Candidate],
    members: &Members,
    max: usize,
    now: DateTime<Utc>,
) -> Vec<usize> {
    let mut chosen = Vec::new();
    for (i, candidate) in candidates.iter().enumerate() {
        if chosen.len() >= max {
            break;
        }
        // One message of a group in flight at a time.
        if candidate.group_busy {
            continue;
        }
        // A group stays with its member while that member lives — unless the message is to
        // be kept from that member (it nacked it, or let its lease lapse): then the group
        // moves on rather than wait for the member to leave.
        if let Some(holder) = &candidate.affinity {
            let kept_from_holder = candidate
                .lease
                .avoided()
                .is_some_and(|avoid| avoid.contains(holder));
            if holder != members.me && members.live.contains(holder) && !kept_from_holder {
                continue;
            }
        }
        // Preferably elsewhere — unless nobody else is there to take it.
        let alone = !members.strict_avoid
            && candidate.lease.avoided().is_some_and(|avoid| {
                members
                    .live
                    .iter()
                    .all(|m| m == members.me || avoid.contains(m))
            });
        if candidate.lease.available_to(members.me, alone, now) {
            chosen.push(i);
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::lease::tests::{nack, policy, t0};

    fn nacked_by(consumer: &str) -> Lease {
        let mut lease = Lease::new(t0());
        let attempt = lease.acquire(consumer, t0(), &policy());
        lease
            .settle(attempt, consumer, nack(), t0(), &policy(), None)
            .expect("live");
        lease
    }

    fn live(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_group_bound_to_a_live_member_is_not_taken_by_another() {
        let candidates = vec![Candidate {
            offset: 1,
            lease: Lease::new(t0()),
            affinity: Some("a".into()),
            group_busy: false,
        }];
        let members = live(&["a", "b"]);
        let b = Members {
            me: "b",
            live: &members,
            strict_avoid: false,
        };
        assert!(pick(&candidates, &b, 10, t0()).is_empty());
        // Once "a" is gone, the group moves on.
        let members = live(&["b"]);
        let b = Members {
            me: "b",
            live: &members,
            strict_avoid: false,
        };
        assert_eq!(pick(&candidates, &b, 10, t0()), vec![0]);
    }

    #[test]
    fn a_group_whose_member_nacked_its_head_moves_to_another_member() {
        let after_backoff = t0() + chrono::Duration::seconds(5);
        let candidates = vec![Candidate {
            offset: 1,
            lease: nacked_by("a"),
            affinity: Some("a".into()),
            group_busy: false,
        }];
        let both = live(&["a", "b"]);
        let b = Members {
            me: "b",
            live: &both,
            strict_avoid: false,
        };
        assert_eq!(pick(&candidates, &b, 10, after_backoff), vec![0]);
    }

    #[test]
    fn a_nack_goes_elsewhere_but_comes_back_when_the_nacker_is_alone() {
        // Past its backoff.
        let after_backoff = t0() + chrono::Duration::seconds(5);
        let candidates = vec![Candidate {
            offset: 1,
            lease: nacked_by("a"),
            affinity: None,
            group_busy: false,
        }];
        let both = live(&["a", "b"]);
        let a = Members {
            me: "a",
            live: &both,
            strict_avoid: false,
        };
        assert!(pick(&candidates, &a, 10, after_backoff).is_empty());
        let b = Members {
            me: "b",
            live: &both,
            strict_avoid: false,
        };
        assert_eq!(pick(&candidates, &b, 10, after_backoff), vec![0]);
        let only_a = live(&["a"]);
        let a = Members {
            me: "a",
            live: &only_a,
            strict_avoid: false,
        };
        assert_eq!(pick(&candidates, &a, 10, after_backoff), vec![0]);
        // Settled mode never hands it back to the member that released it.
        let a = Members {
            me: "a",
            live: &only_a,
            strict_avoid: true,
        };
        assert!(pick(&candidates, &a, 10, after_backoff).is_empty());
    }

    #[test]
    fn at_most_max_in_offset_order() {
        let candidates: Vec<Candidate> = (1..=5)
            .map(|offset| Candidate {
                offset,
                lease: Lease::new(t0()),
                affinity: None,
                group_busy: false,
            })
            .collect();
        let members = live(&["a"]);
        let a = Members {
            me: "a",
            live: &members,
            strict_avoid: false,
        };
        assert_eq!(pick(&candidates, &a, 3, t0()), vec![0, 1, 2]);
    }

    #[test]
    fn a_group_with_a_message_in_flight_hands_out_nothing_more() {
        let mut busy = Candidate {
            offset: 1,
            lease: Lease::new(t0()),
            affinity: None,
            group_busy: true,
        };
        let members = live(&["a"]);
        let a = Members {
            me: "a",
            live: &members,
            strict_avoid: false,
        };
        assert!(pick(std::slice::from_ref(&busy), &a, 10, t0()).is_empty());
        busy.group_busy = false;
        assert_eq!(pick(&[busy], &a, 10, t0()), vec![0]);
    }
}
