//! How the delivery workers wait (DESIGN §7): until a commit that may have made something
//! available (`delivery_changes`, and for fetchers `inbox_appends`), or until the next deadline
//! the store told them of, on the gateway's clock (`Clock::sleep_until`, which a clock moved by hand wakes too) — never "look
//! again every N ms in case".

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use crate::clock::Clock;
use crate::store::Store;

/// A worker's wake-ups: the store's delivery changes (and, for a fetcher, inbox appends) and
/// deadlines on the gateway's clock.
pub struct Waker {
    changes: Option<watch::Receiver<u64>>,
    appends: Option<watch::Receiver<u64>>,
    clock: Arc<dyn Clock>,
}

impl Waker {
    /// For a worker that new messages give nothing to do (the housekeeper, the push
    /// supervisor): it wakes on delivery changes and deadlines only.
    pub fn new(store: &Store, clock: &Arc<dyn Clock>) -> Waker {
        Waker {
            changes: Some(store.delivery_changes()),
            appends: None,
            clock: clock.clone(),
        }
    }

    /// For a fetcher: new messages wake it too.
    pub fn for_fetching(store: &Store, clock: &Arc<dyn Clock>) -> Waker {
        Waker {
            appends: Some(store.inbox_appends()),
            ..Waker::new(store, clock)
        }
    }

    /// Marks everything so far as seen: call before looking, so that a change while looking
    /// still wakes the wait that follows.
    pub fn mark(&mut self) {
        for rx in [&mut self.changes, &mut self.appends].into_iter().flatten() {
            rx.borrow_and_update();
        }
    }

    /// Waits for a delivery change or `deadline` on the gateway's clock (`None`: no
    /// deadline).
    pub async fn wait(&mut self, deadline: Option<DateTime<Utc>>) {
        let clock = self.clock.clone();
        let sleep = async move {
            match deadline {
                Some(at) => clock.sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = sleep => {}
            _ = changed(&mut self.changes) => {}
            _ = changed(&mut self.appends) => {}
        }
    }
}

/// The next change of `rx`; a closed channel is forgotten (and never wakes again).
async fn changed(rx: &mut Option<watch::Receiver<u64>>) {
    let closed = match rx {
        Some(r) => r.changed().await.is_err(),
        None => true,
    };
    if closed {
        *rx = None;
        std::future::pending::<()>().await;
    }
}
