//! Contract suites of the storage traits (DESIGN §7): one module per trait, written against
//! the traits and the facade only, so that they run unchanged against every backend. Each test
//! runs against every backend `backends()` opens (SQLite now; PostgreSQL next).
#![allow(dead_code, reason = "the suites of the three traits fill in")]

mod delivery;
mod outbound;
mod receiver;

use wsr_gateway::rmp::group::Policy;
use wsr_gateway::store::{Database, Durability, Store, StoreConfig};

/// A fresh, empty store of one backend, with whatever keeps it alive (a temporary folder).
pub struct Backend {
    pub name: &'static str,
    pub store: Store,
    _dir: tempfile::TempDir,
}

/// A fresh store of every backend this machine can run, with the default policy.
pub async fn backends() -> Vec<Backend> {
    backends_with(Policy::default()).await
}

/// A fresh store of every backend this machine can run, with `policy`.
pub async fn backends_with(policy: Policy) -> Vec<Backend> {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = StoreConfig {
        database: Database::Sqlite(dir.path().join("contract.db")),
        durability: Durability::Full,
        policy,
    };
    let store = Store::open(&config).await.expect("open the SQLite store");
    vec![Backend {
        name: "sqlite",
        store,
        _dir: dir,
    }]
}
