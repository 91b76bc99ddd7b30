//! How the delivery workers wait (DESIGN §7): until a commit that may have made something
//! available (`delivery_changes`), until the next deadline the store told them of (worked
//! out on the gateway's clock), or until that clock is moved by hand — never "look again
//! every N ms in case".

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use crate::clock::Clock;
use crate::store::Store;
use crate::store::delivery::DeliveryStore as _;

/// A worker's wake-ups: the store's delivery changes and the clock's moves.
pub struct Waker {
    changes: Option<watch::Receiver<u64>>,
    moves: Option<watch::Receiver<u64>>,
    clock: Arc<dyn Clock>,
}

impl Waker {
    pub fn new(store: &Store, clock: &Arc<dyn Clock>) -> Waker {
        Waker {
            changes: Some(store.delivery_changes()),
            moves: clock.moves(),
            clock: clock.clone(),
        }
    }

    /// Marks everything so far as seen: call before looking, so that a change while looking
    /// still wakes the wait that follows.
    pub fn mark(&mut self) {
        for rx in [&mut self.changes, &mut self.moves].into_iter().flatten() {
            rx.borrow_and_update();
        }
    }

    /// Waits for a delivery change, a clock move, or `deadline` on the gateway's clock
    /// (`None`: no deadline).
    pub async fn wait(&mut self, deadline: Option<DateTime<Utc>>) {
        let sleep = async {
            match deadline {
                Some(at) => {
                    let left = (at - self.clock.now()).to_std().unwrap_or_default();
                    tokio::time::sleep(left).await
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = sleep => {}
            _ = changed(&mut self.changes) => {}
            _ = changed(&mut self.moves) => {}
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
