//! Long-poll fetch: a fetch that finds nothing waits — until a commit may have made something
//! available, until the next backoff, lease or session deadline of its subscription, or until
//! its wait ends — and tries again; when the wait ends with nothing, it answers with nothing.
//! Each try renews the member's session, and the wait never outlives half its TTL.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::wait::Waker;
use crate::clock::Clock;
use crate::delivery::fetch::Take;
use crate::delivery::{session, wake};
use crate::store::Store;
use crate::store::delivery::{DeliveryError, Handed, Session};

pub async fn fetch_waiting(
    store: &Store,
    clock: &Arc<dyn Clock>,
    session: &str,
    take: Take,
    wait: Duration,
) -> Result<Vec<Handed>, DeliveryError> {
    let until = Instant::now() + wait;
    let mut waker = Waker::for_fetching(store, clock);
    let mut member: Option<Session> = None;
    loop {
        // Mark what we have seen before looking, so a change while we look wakes us.
        waker.mark();
        let now = clock.now();
        let handed = store.fetch(session, take, now).await?;
        if !handed.is_empty() || Instant::now() >= until {
            return Ok(handed);
        }
        let me = match &member {
            Some(me) => me,
            None => match store.session(session, now).await? {
                Some(me) => member.insert(me),
                None => return Ok(handed),
            },
        };
        let deadlines = store
            .delivery_deadlines(Some(me.subscription_id), now)
            .await?;
        let next = [
            wake::next_fetch(&deadlines),
            Some(session::renew_by(now, me.ttl)),
        ]
        .into_iter()
        .flatten()
        .min();
        tokio::select! {
            _ = waker.wait(next) => {}
            _ = tokio::time::sleep_until(until) => {}
        }
    }
}
