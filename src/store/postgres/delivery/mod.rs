//! The PostgreSQL backend of `DeliveryStore` (not built yet: every operation fails).
#![allow(unused_variables, reason = "stubs until the port lands")]

use chrono::{DateTime, Duration, Utc};
use tokio::sync::watch;

use crate::delivery::receipt::Receipt;
use crate::delivery::subscription::Spec;
use crate::delivery::wake::Deadlines;
use crate::store::delivery::{
    Backlog, DeadLetter, DeadLetterChange, DeliveryError, DeliveryStore, Handed, Maintenance,
    Session, Settlement, Subscription,
};
use crate::store::postgres::PostgresStore;
use crate::store::{StoreError, StoreFuture};

fn not_built(what: &str) -> StoreError {
    StoreError::Failed(format!("PostgreSQL backend: {what} is not built yet"))
}

impl DeliveryStore for PostgresStore {
    fn delivery_changes(&self) -> watch::Receiver<u64> {
        self.shared.deliveries_changed.subscribe()
    }

    fn inbox_appends(&self) -> watch::Receiver<u64> {
        self.shared.inbox_appended.subscribe()
    }

    fn receipt_secret(&self) -> StoreFuture<'_, Result<Vec<u8>, StoreError>> {
        Box::pin(async move { Err(not_built("receipt_secret").into()) })
    }

    fn create_subscription<'a>(
        &'a self,
        spec: &'a Spec,
        owner: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(Subscription, bool), DeliveryError>> {
        Box::pin(async move { Err(not_built("create_subscription").into()) })
    }

    fn subscription(&self, id: i64) -> StoreFuture<'_, Result<Option<Subscription>, StoreError>> {
        Box::pin(async move { Err(not_built("subscription").into()) })
    }

    fn subscriptions(&self) -> StoreFuture<'_, Result<Vec<Subscription>, StoreError>> {
        Box::pin(async move { Err(not_built("subscriptions").into()) })
    }

    fn delete_subscription(&self, id: i64) -> StoreFuture<'_, Result<bool, DeliveryError>> {
        Box::pin(async move { Err(not_built("delete_subscription").into()) })
    }

    fn grant<'a>(&'a self, id: i64, principal: &'a str) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { Err(not_built("grant").into()) })
    }

    fn revoke<'a>(
        &'a self,
        id: i64,
        principal: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<bool, DeliveryError>> {
        Box::pin(async move { Err(not_built("revoke").into()) })
    }

    fn join<'a>(
        &'a self,
        subscription_id: i64,
        session_id: &'a str,
        principal: &'a str,
        ttl: Duration,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Session, DeliveryError>> {
        Box::pin(async move { Err(not_built("join").into()) })
    }

    fn session<'a>(
        &'a self,
        id: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Option<Session>, StoreError>> {
        Box::pin(async move { Err(not_built("session").into()) })
    }

    fn heartbeat<'a>(
        &'a self,
        session_id: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<DateTime<Utc>, DeliveryError>> {
        Box::pin(async move { Err(not_built("heartbeat").into()) })
    }

    fn leave<'a>(
        &'a self,
        session_id: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<bool, DeliveryError>> {
        Box::pin(async move { Err(not_built("leave").into()) })
    }

    fn fetch<'a>(
        &'a self,
        session_id: &'a str,
        max: usize,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Vec<Handed>, DeliveryError>> {
        Box::pin(async move { Err(not_built("fetch").into()) })
    }

    fn settle_many<'a>(
        &'a self,
        settlements: &'a [Settlement],
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Vec<Result<(), DeliveryError>>, DeliveryError>> {
        Box::pin(async move { Err(not_built("settle_many").into()) })
    }

    fn extend<'a>(
        &'a self,
        receipt: &'a Receipt,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<DateTime<Utc>, DeliveryError>> {
        Box::pin(async move { Err(not_built("extend").into()) })
    }

    fn dead_letters(
        &self,
        subscription_id: i64,
        after: i64,
        limit: i64,
    ) -> StoreFuture<'_, Result<Vec<DeadLetter>, StoreError>> {
        Box::pin(async move { Err(not_built("dead_letters").into()) })
    }

    fn change_dead_letters<'a>(
        &'a self,
        subscription_id: i64,
        offsets: Option<&'a [i64]>,
        change: DeadLetterChange,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, DeliveryError>> {
        Box::pin(async move { Err(not_built("change_dead_letters").into()) })
    }

    fn maintain_deliveries(
        &self,
        now: DateTime<Utc>,
        grace: Duration,
        retention: Duration,
    ) -> StoreFuture<'_, Result<Maintenance, DeliveryError>> {
        Box::pin(async move { Err(not_built("maintain_deliveries").into()) })
    }

    fn backlog(&self, subscription_id: i64) -> StoreFuture<'_, Result<Backlog, StoreError>> {
        Box::pin(async move { Err(not_built("backlog").into()) })
    }

    fn delivery_deadlines(
        &self,
        subscription_id: Option<i64>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'_, Result<Deadlines, StoreError>> {
        Box::pin(async move { Err(not_built("delivery_deadlines").into()) })
    }
}
