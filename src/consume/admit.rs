//! Admissions (security review, second round): a subscription or a session counted against
//! its cap — subscriptions per principal, sessions per subscription — and created, one at a
//! time per gateway, so that two at once cannot both take the last place. (Gateways of a
//! cluster count each on their own: at the same moment, each other gateway may add one.)

use chrono::{DateTime, Duration, Utc};

use crate::delivery::subscription::Spec;
use crate::store::Store;
use crate::store::delivery::{DeliveryError, Session, Subscription};

/// Why a creation was refused, or what failed.
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    /// The principal owns `held` subscriptions, `cap` at most.
    #[error(
        "{principal} owns {held} subscriptions, the most one principal may own \
             (max_subscriptions_per_principal = {cap}); delete one first"
    )]
    TooManySubscriptions {
        principal: String,
        held: u64,
        cap: usize,
    },
    /// The subscription has `held` sessions, `cap` at most.
    #[error(
        "subscription {subscription} has {held} sessions, the most one may have \
             (max_sessions_per_subscription = {cap}); leave one first"
    )]
    TooManySessions {
        subscription: i64,
        held: u64,
        cap: usize,
    },
    #[error(transparent)]
    Delivery(#[from] DeliveryError),
}

impl From<crate::store::StoreError> for AdmitError {
    fn from(e: crate::store::StoreError) -> AdmitError {
        AdmitError::Delivery(e.into())
    }
}

/// The caps admissions hold to (`config::DeliverySettings`).
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    pub subscriptions_per_principal: usize,
    pub sessions_per_subscription: usize,
}

/// One gateway's admissions, one at a time.
pub struct Admissions {
    store: Store,
    caps: Caps,
    one_at_a_time: tokio::sync::Mutex<()>,
}

impl Admissions {
    pub fn new(store: Store, caps: Caps) -> Admissions {
        Admissions {
            store,
            caps,
            one_at_a_time: tokio::sync::Mutex::new(()),
        }
    }

    /// `spec` created for `owner` (or found: asking again for one it owns is not one more),
    /// unless `owner` owns its cap of subscriptions already.
    pub async fn create_subscription(
        &self,
        spec: &Spec,
        owner: &str,
        now: DateTime<Utc>,
    ) -> Result<(Subscription, bool), AdmitError> {
        let (store, cap) = (&self.store, self.caps.subscriptions_per_principal);
        let _one = self.one_at_a_time.lock().await;
        let name = spec.id.to_string();
        let held = store
            .subscriptions()
            .await?
            .iter()
            .filter(|s| s.owner == owner && s.name != name)
            .count() as u64;
        if held >= cap as u64 {
            return Err(AdmitError::TooManySubscriptions {
                principal: owner.to_owned(),
                held,
                cap,
            });
        }
        Ok(store.create_subscription(spec, owner, now).await?)
    }

    /// A session of `principal` on `subscription`, unless it has its cap of sessions already.
    pub async fn join(
        &self,
        subscription: i64,
        session: &str,
        principal: &str,
        ttl: Duration,
        now: DateTime<Utc>,
    ) -> Result<Session, AdmitError> {
        let (store, cap) = (&self.store, self.caps.sessions_per_subscription);
        let _one = self.one_at_a_time.lock().await;
        let held = store.session_count(subscription).await?;
        if held >= cap as u64 {
            return Err(AdmitError::TooManySessions {
                subscription,
                held,
                cap,
            });
        }
        Ok(store
            .join(subscription, session, principal, ttl, now)
            .await?)
    }
}
