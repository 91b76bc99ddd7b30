//! Where "now" comes from. The protocol core takes time as a parameter; the application asks
//! this clock, so tests can set it instead of sleeping.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use tokio::sync::watch;

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> DateTime<Utc>;

    /// Told whenever the clock is set or moved by hand (a test's clock): a wait worked out
    /// from `now` is then wrong and worth working out again. `None` for a clock that only runs.
    fn moves(&self) -> Option<watch::Receiver<u64>> {
        None
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

/// A clock that moves only when told to.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<Mutex<DateTime<Utc>>>, Arc<watch::Sender<u64>>);

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> ManualClock {
        ManualClock(Arc::new(Mutex::new(start)), Arc::new(watch::channel(0).0))
    }

    pub fn set(&self, t: DateTime<Utc>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = t;
        self.moved();
    }

    pub fn advance(&self, by: chrono::Duration) {
        {
            let mut now = self.0.lock().unwrap_or_else(|p| p.into_inner());
            *now += by;
        }
        self.moved();
    }

    fn moved(&self) {
        self.1.send_modify(|n| *n = n.wrapping_add(1));
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn moves(&self) -> Option<watch::Receiver<u64>> {
        Some(self.1.subscribe())
    }
}
