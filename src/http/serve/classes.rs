//! Fair shares of the listener (D13): every request is handled in one of four classes —
//! partners (`/wsr`), applications (`/api/v1`), waiting requests (fetches, which may long-poll,
//! and event streams) and operators (console, metrics, the admin-only API) — each with its own
//! cap on requests in flight, and within each class every source address has at most its
//! share. So long polls cannot lock partners or operators out, and one client, whatever it
//! sends, holds at most its share of one class.
//!
//! The class is read from the path alone, before any authentication: the listener never looks
//! further into a request. Health checks belong to no class: they answer even when every class
//! is full.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::Perimeter;
use crate::http::slots::{KeyedSlot, KeyedSlots};

/// Whom a request competes with for slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Partners,
    Api,
    Waiting,
    Operators,
}

impl Class {
    /// The class of a request for `path`; `None`: a health check, never refused for load.
    pub fn of(path: &str) -> Option<Class> {
        if matches!(path, "/healthz" | "/readyz") {
            return None;
        }
        if path.starts_with("/wsr/") {
            return Some(Class::Partners);
        }
        if path == "/api/v1/events"
            || (path.starts_with("/api/v1/sessions/") && path.ends_with("/fetch"))
        {
            return Some(Class::Waiting);
        }
        let operators = path == "/console"
            || path.starts_with("/console/")
            || path == "/metrics"
            || (ADMIN_ONLY.iter().any(|prefix| under(path, prefix)) && !path.ends_with("/close"))
            || (path.starts_with("/api/v1/messages/")
                && (path.ends_with("/resend") || path.ends_with("/fail")));
        Some(match operators {
            true => Class::Operators,
            false => Class::Api,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Class::Partners => "partners",
            Class::Api => "api",
            Class::Waiting => "waiting",
            Class::Operators => "operators",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The `/api/v1` routes only an admin token may use: operators' work (but closing a group,
/// `/api/v1/groups/{id}/close`, is a producer's).
const ADMIN_ONLY: &[&str] = &[
    "/api/v1/groups",
    "/api/v1/inbox",
    "/api/v1/callback-endpoints",
    "/api/v1/push-endpoints",
];

/// `path` is `prefix` or below it.
fn under(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// A source's share of a class of `cap`: the configured share, but never more than a quarter
/// of the class (at least one request), so that no one client — signed in or not — can hold a
/// whole class, however small it is configured.
fn share_of(cap: usize, configured: usize) -> usize {
    configured.min(cap / 4).max(1)
}

/// One class's budget: its requests in flight, and each source's share of them.
struct Budget {
    in_flight: Arc<Semaphore>,
    per_source: Arc<KeyedSlots>,
}

/// The four classes' budgets of one listener.
pub struct Classes {
    budgets: [Budget; 4],
}

/// A request admitted to its class: it holds its slots until dropped.
#[derive(Debug)]
pub struct Admitted {
    _class: OwnedSemaphorePermit,
    _share: KeyedSlot,
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Its class has every slot taken.
    ClassFull(Class),
    /// Its source holds its whole share of the class.
    ShareUsed(Class),
}

impl Refused {
    pub fn class(self) -> Class {
        match self {
            Refused::ClassFull(class) | Refused::ShareUsed(class) => class,
        }
    }

    /// Why, as a metric's label.
    pub fn reason(self) -> &'static str {
        match self {
            Refused::ClassFull(_) => "class_full",
            Refused::ShareUsed(_) => "share_used",
        }
    }
}

impl Classes {
    pub fn new(perimeter: &Perimeter) -> Classes {
        let budget = |cap: usize| Budget {
            in_flight: Arc::new(Semaphore::new(cap)),
            per_source: Arc::new(KeyedSlots::new(share_of(
                cap,
                perimeter.max_requests_in_flight_per_source,
            ))),
        };
        Classes {
            // In `Class` order.
            budgets: [
                budget(perimeter.max_requests_in_flight),
                budget(perimeter.max_api_requests_in_flight),
                budget(perimeter.max_waiting_requests),
                budget(perimeter.max_operator_requests_in_flight),
            ],
        }
    }

    /// A slot of `class` for a request from `source` (`inbound::source_of`), if its share
    /// and the class allow.
    pub fn admit(&self, class: Class, source: &str) -> Result<Admitted, Refused> {
        let budget = &self.budgets[class.index()];
        // A full class is the gateway's state (503) whoever asks; a share, the client's (429).
        let permit = budget
            .in_flight
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refused::ClassFull(class))?;
        let share = budget
            .per_source
            .take(source)
            .ok_or(Refused::ShareUsed(class))?;
        Ok(Admitted {
            _class: permit,
            _share: share,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_fall_into_their_classes() {
        for (path, class) in [
            ("/healthz", None),
            ("/readyz", None),
            ("/wsr/default", Some(Class::Partners)),
            ("/wsr/_callback", Some(Class::Partners)),
            ("/api/v1/sessions/s1/fetch", Some(Class::Waiting)),
            ("/api/v1/events", Some(Class::Waiting)),
            ("/api/v1/sessions/s1/heartbeat", Some(Class::Api)),
            ("/api/v1/messages", Some(Class::Api)),
            ("/api/v1/messages/7", Some(Class::Api)),
            ("/api/v1/messages/7/resend", Some(Class::Operators)),
            ("/api/v1/messages/7/fail", Some(Class::Operators)),
            ("/api/v1/inbox", Some(Class::Operators)),
            ("/api/v1/groups/g", Some(Class::Operators)),
            ("/api/v1/groups/g/close", Some(Class::Api)),
            ("/api/v1/inboxes", Some(Class::Api)),
            ("/api/v1/push-endpoints", Some(Class::Operators)),
            ("/console", Some(Class::Operators)),
            ("/console/messages", Some(Class::Operators)),
            ("/consoleX", Some(Class::Api)),
            ("/metrics", Some(Class::Operators)),
            ("/nowhere", Some(Class::Api)),
        ] {
            assert_eq!(Class::of(path), class, "{path}");
        }
    }

    fn perimeter(per_class: usize, per_source: usize) -> Perimeter {
        Perimeter {
            header_timeout: std::time::Duration::from_secs(1),
            body_timeout: std::time::Duration::from_secs(1),
            body_min_bytes_per_second: 1,
            idle_timeout: std::time::Duration::from_secs(1),
            max_connections: 10,
            max_requests_in_flight: per_class,
            max_api_requests_in_flight: per_class,
            max_waiting_requests: per_class,
            max_operator_requests_in_flight: per_class,
            max_requests_in_flight_per_source: per_source,
            max_body_bytes_in_flight: 100,
            max_body_bytes_in_flight_per_source: 100,
            max_tls_handshakes_per_source: 1,
        }
    }

    #[test]
    fn a_source_holds_its_share_of_one_class_and_nothing_of_the_others() {
        // Configured share 100, class of 8: no source holds more than a quarter of it.
        let classes = Classes::new(&perimeter(8, 100));
        let sources = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"];
        let mut held: Vec<_> = (0..2)
            .map(|_| {
                classes
                    .admit(Class::Waiting, sources[0])
                    .expect("within its share")
            })
            .collect();
        assert_eq!(
            classes.admit(Class::Waiting, sources[0]).unwrap_err(),
            Refused::ShareUsed(Class::Waiting),
            "a quarter of the class"
        );
        // Another class is untouched, for the same source too.
        classes
            .admit(Class::Partners, sources[0])
            .expect("partners have their own budget");
        for source in &sources[1..] {
            for _ in 0..2 {
                held.push(classes.admit(Class::Waiting, source).expect("its share"));
            }
        }
        assert_eq!(
            classes.admit(Class::Waiting, "10.0.0.5").unwrap_err(),
            Refused::ClassFull(Class::Waiting)
        );
        held.pop();
        classes
            .admit(Class::Waiting, "10.0.0.5")
            .expect("a freed slot is taken again");
    }

    #[test]
    fn a_share_is_at_most_a_quarter_of_its_class_and_at_least_one() {
        assert_eq!(share_of(512, 128), 128);
        assert_eq!(share_of(64, 128), 16);
        assert_eq!(share_of(2, 128), 1);
        assert_eq!(share_of(256, 2), 2);
    }
}
