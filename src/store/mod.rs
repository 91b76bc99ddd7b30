//! Durable state, as the rest of the gateway sees it (DESIGN §7): the three storage traits
//! (`ReceiverStore`, `DeliveryStore`, `OutboundStore`), `Backend` (the three plus lifecycle),
//! the rows they speak in and `StoreError`, and `Store`, the facade over one backend. No SQL
//! and no rules live here: the backends implement the traits (`sqlite/`, the embedded
//! default; see `sqlite/mod.rs` for its one writer and group commit), and the decisions are
//! the pure rooms' (`rmp/`, `delivery/`).

mod backend;
mod config;
pub mod delivery;
mod error;
mod future;
pub mod group_state;
pub mod health;
mod migrate;
pub mod outbound;
pub mod overview;
mod postgres;
mod received;
pub mod receiver;
mod sqlite;
mod stats;
pub(in crate::store) mod stored_outbound;
pub mod sweeper;
pub(in crate::store) mod time;
mod wakes;

pub use sqlite::group_json;

pub use backend::Backend;
pub use config::{Database, Durability, StoreConfig};
pub use delivery::DeliveryStore;
pub use error::StoreError;
pub use future::StoreFuture;
pub use migrate::{Migrated, migrate_store};
pub use outbound::OutboundStore;
pub use overview::{InboxFilter, InboxPage, Member, Traffic};
pub use postgres::PostgresStore;
pub use received::{
    Endpoints, InboxEntry, Payload, PendingCallback, Received, ReceivedMessage, SweepReport,
};
pub use receiver::ReceiverStore;
pub use sqlite::SqliteStore;
pub use stats::{StoreStats, SubscriptionStats};

/// The store as the rest of the gateway sees it: cheap to clone, whatever the backend. Its
/// operations are the storage traits' (`ReceiverStore`, `DeliveryStore`, `OutboundStore`,
/// `Backend`): import the ones you call.
#[derive(Clone)]
pub struct Store(std::sync::Arc<dyn Backend>);

impl Store {
    /// Opens the store the configuration names (SQLite: the embedded default).
    pub async fn open(config: &StoreConfig) -> Result<Store, StoreError> {
        match &config.database {
            Database::Sqlite(path) => Ok(Store(std::sync::Arc::new(
                SqliteStore::open(path, config).await?,
            ))),
            Database::Postgres(_) => Ok(Store(std::sync::Arc::new(
                PostgresStore::open(config).await?,
            ))),
        }
    }
}

impl std::ops::Deref for Store {
    type Target = dyn Backend;

    fn deref(&self) -> &(dyn Backend + 'static) {
        &*self.0
    }
}
