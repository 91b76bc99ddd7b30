//! Durable state, as the rest of the gateway sees it (DESIGN §7): the three storage traits
//! (`ReceiverStore`, `DeliveryStore`, `OutboundStore`; with request-response exchanges and the
//! console's sign-outs, `ExchangeStore` and `ConsoleStore`), `Backend` (them plus lifecycle),
//! the rows they speak in and `StoreError`, and `Store`, the facade over one backend. No SQL
//! and no rules live here: the backends implement the traits (`sqlite/`, the embedded
//! default; see `sqlite/mod.rs` for its one writer and group commit), and the decisions are
//! the pure rooms' (`rmp/`, `delivery/`).

mod backend;
pub mod check;
mod config;
pub mod console;
pub mod delivery;
mod error;
pub mod exchange;
mod future;
pub mod group_state;
pub mod health;
mod migrate;
pub mod nonces;
pub mod outbound;
pub mod overview;
mod postgres;
mod prefill;
mod received;
pub mod receiver;
mod recover;
pub mod source_usage;
mod sqlite;
mod stats;
pub(in crate::store) mod stored_outbound;
pub mod sweeper;
#[cfg(feature = "test-hooks")]
mod test_hooks;
pub(in crate::store) mod time;
pub mod traces;
mod wakes;

pub use sqlite::group_json;

pub use backend::Backend;
pub use check::StoreCheck;
pub use config::{Database, Durability, StoreConfig};
pub use console::ConsoleStore;
pub use delivery::DeliveryStore;
pub use error::StoreError;
pub use exchange::{
    Attempt, Began, BeginCall, CachedAnswer, Exchange, ExchangeState, ExchangeStore, NewCall,
};
pub use future::{Committed, StoreFuture};
pub use migrate::{Migrated, migrate_store};
pub use nonces::NonceStore;
pub use outbound::OutboundStore;
pub use overview::{InboxFilter, InboxPage, Member, RATE_MINUTES, RATE_SERIES, Rates, Traffic};
pub use postgres::PostgresStore;
pub use prefill::Prefill;
pub use received::{
    Endpoints, InboxEntry, InboxExcerpt, KeptAnswer, Payload, PendingCallback, Received,
    ReceivedMessage, SweepReport,
};
pub use receiver::ReceiverStore;
pub use recover::{BackedUp, Restored, backup_store, check_store, restore_store};
pub use sqlite::SqliteStore;
pub use stats::{StoreStats, SubscriptionStats};
#[cfg(feature = "test-hooks")]
pub use test_hooks::TestHooks;
pub use traces::TraceStore;

use std::sync::Arc;

/// The store as the rest of the gateway sees it: cheap to clone, whatever the backend. Its
/// operations are the storage traits' (`ReceiverStore`, `DeliveryStore`, `OutboundStore`,
/// `Backend`): import the ones you call. The benchmark fixture (`Prefill`) and, in tests, the
/// test hooks (`TestHooks`) are traits of their own that it passes on to the same backend.
#[derive(Clone)]
pub struct Store {
    backend: Arc<dyn Backend>,
    prefill: Arc<dyn Prefill + Send + Sync>,
    #[cfg(feature = "test-hooks")]
    hooks: Arc<dyn TestHooks + Send + Sync>,
}

impl Store {
    /// Opens the store the configuration names (SQLite: the embedded default).
    pub async fn open(config: &StoreConfig) -> Result<Store, StoreError> {
        match &config.database {
            Database::Sqlite(path) => {
                let store = Arc::new(SqliteStore::open(path, config).await?);
                Ok(Store {
                    backend: store.clone(),
                    prefill: store.clone(),
                    #[cfg(feature = "test-hooks")]
                    hooks: store,
                })
            }
            Database::Postgres(_) => {
                let store = Arc::new(PostgresStore::open(config).await?);
                Ok(Store {
                    backend: store.clone(),
                    prefill: store.clone(),
                    #[cfg(feature = "test-hooks")]
                    hooks: store,
                })
            }
        }
    }
}

impl Prefill for Store {
    fn prefill_delivered<'a>(
        &'a self,
        channel: &'a str,
        groups: u64,
        per_group: u64,
        payload_bytes: usize,
        now: chrono::DateTime<chrono::Utc>,
    ) -> StoreFuture<'a, Result<u64, StoreError>> {
        self.prefill
            .prefill_delivered(channel, groups, per_group, payload_bytes, now)
    }
}

#[cfg(feature = "test-hooks")]
impl TestHooks for Store {
    fn panic_on_group(&self, group: Option<&str>) {
        self.hooks.panic_on_group(group)
    }

    fn cap_database_size<'a>(&'a self, capped: bool) -> StoreFuture<'a, Result<(), StoreError>> {
        self.hooks.cap_database_size(capped)
    }

    fn fail_next_commits(&self, n: usize) {
        self.hooks.fail_next_commits(n)
    }
}

impl std::ops::Deref for Store {
    type Target = dyn Backend;

    fn deref(&self) -> &(dyn Backend + 'static) {
        &*self.backend
    }
}
