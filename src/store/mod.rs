//! Durable state: the inbox, group state, the ordered buffer, callback acks owed, registered
//! callback endpoints. SQLite in WAL mode is the embedded default (DESIGN §7).
//!
//! Every change that decides an ack goes through one writer task that commits concurrent
//! requests together (group commit); each request learns its verdict only after the commit
//! that made it durable. Reads go to a separate pool.

mod backend;
mod config;
pub mod delivery;
mod error;
mod future;
pub mod health;
pub mod outbound;
mod received;
pub mod receiver;
mod sqlite;
pub mod sweeper;

pub use sqlite::group_json;

pub use backend::Backend;
pub use config::{Durability, StoreConfig};
pub use delivery::DeliveryStore;
pub use error::StoreError;
pub use future::StoreFuture;
pub use outbound::OutboundStore;
pub use received::{
    Endpoints, InboxEntry, Payload, PendingCallback, Received, ReceivedMessage, SweepReport,
};
pub use receiver::ReceiverStore;
pub use sqlite::SqliteStore;

/// The store as the rest of the gateway sees it: cheap to clone, whatever the backend. Its
/// operations are the storage traits' (`ReceiverStore`, `DeliveryStore`, `OutboundStore`,
/// `Backend`): import the ones you call.
#[derive(Clone)]
pub struct Store(std::sync::Arc<dyn Backend>);

impl Store {
    /// Opens the store the configuration names (SQLite: the embedded default).
    pub async fn open(config: &StoreConfig) -> Result<Store, StoreError> {
        Ok(Store(std::sync::Arc::new(SqliteStore::open(config).await?)))
    }
}

impl std::ops::Deref for Store {
    type Target = dyn Backend;

    fn deref(&self) -> &(dyn Backend + 'static) {
        &*self.0
    }
}
