//! Where "now" comes from. The protocol core takes time as a parameter; the application asks
//! this clock, so tests can set it instead of sleeping. Waiting for a moment of this clock
//! (`sleep_until`) is how workers wait for a real deadline (the next attempt due, the next
//! poll), so that a clock moved by hand wakes them as the wall clock would.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;

/// What `Clock::sleep_until` returns.
pub type Sleep<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// The longest stretch the wall clock is slept on before it is read again: a wall clock set
/// forward (NTP, a suspended machine) is noticed within it.
const LONGEST_NAP: Duration = Duration::from_secs(60);

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> DateTime<Utc>;

    /// Resolves once this clock reads `deadline` or later.
    fn sleep_until(&self, deadline: DateTime<Utc>) -> Sleep<'_> {
        Box::pin(async move {
            loop {
                let Ok(left) = (deadline - self.now()).to_std() else {
                    return;
                };
                if left.is_zero() {
                    return;
                }
                tokio::time::sleep(left.min(LONGEST_NAP)).await;
            }
        })
    }
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that moves only when told to; whoever sleeps on it wakes when it is moved past
/// their deadline.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<watch::Sender<DateTime<Utc>>>);

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> ManualClock {
        ManualClock(Arc::new(watch::channel(start).0))
    }

    pub fn set(&self, t: DateTime<Utc>) {
        self.0.send_replace(t);
    }

    pub fn advance(&self, by: chrono::Duration) {
        self.0.send_modify(|now| *now += by);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.borrow()
    }

    fn sleep_until(&self, deadline: DateTime<Utc>) -> Sleep<'_> {
        let mut moved = self.0.subscribe();
        Box::pin(async move {
            while *moved.borrow_and_update() < deadline {
                if moved.changed().await.is_err() {
                    // Nobody can move it any more.
                    std::future::pending::<()>().await;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manual_clock_wakes_its_sleepers_when_moved_past_their_deadline() {
        let start = Utc::now();
        let clock = ManualClock::new(start);
        let deadline = start + chrono::Duration::seconds(10);
        let sleeper = {
            let clock = clock.clone();
            tokio::spawn(async move { clock.sleep_until(deadline).await })
        };
        clock.advance(chrono::Duration::seconds(5));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished(), "not yet");
        clock.advance(chrono::Duration::seconds(5));
        sleeper.await.expect("woken");
        // A deadline already passed does not wait.
        clock.sleep_until(start).await;
    }

    #[tokio::test]
    async fn the_wall_clock_does_not_wait_for_a_passed_deadline() {
        SystemClock
            .sleep_until(Utc::now() - chrono::Duration::seconds(1))
            .await;
    }
}
