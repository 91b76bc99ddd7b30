//! Contract suites of the storage traits (DESIGN §7): one module per trait, written against
//! the traits and the facade only, so that they run unchanged against every backend. Each test
//! runs against every backend `backends()` opens: SQLite and PostgreSQL.
#![allow(dead_code, reason = "the suites of the three traits fill in")]

mod delivery;
mod outbound;
pub mod receiver;
mod source_quota;

use wsr_gateway::rmp::group::Policy;
use wsr_gateway::store::{Database, Durability, Store, StoreConfig};

use crate::test_database::TestDatabase;

/// A fresh, empty store of one backend, with whatever keeps it alive (a temporary folder, a
/// database of its own).
pub struct Backend {
    pub name: &'static str,
    pub store: Store,
    _dir: Option<tempfile::TempDir>,
    _database: Option<TestDatabase>,
}

/// A fresh store of every backend this machine can run, with the default policy.
pub async fn backends() -> Vec<Backend> {
    backends_with(Policy::default()).await
}

/// Which backends the suites run against: `WSR_TEST_BACKENDS` (comma-separated, e.g.
/// `postgres`) narrows it; by default both.
fn wanted(name: &str) -> bool {
    std::env::var("WSR_TEST_BACKENDS")
        .map(|list| list.split(',').any(|b| b.trim() == name))
        .unwrap_or(true)
}

/// A fresh store of every backend this machine can run, with `policy`.
pub async fn backends_with(policy: Policy) -> Vec<Backend> {
    let mut out = Vec::new();
    if wanted("sqlite") {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = StoreConfig {
            database: Database::Sqlite(dir.path().join("contract.db")),
            durability: Durability::Full,
            policy: policy.clone(),
        };
        let store = Store::open(&config).await.expect("open the SQLite store");
        out.push(Backend {
            name: "sqlite",
            store,
            _dir: Some(dir),
            _database: None,
        });
    }
    if wanted("postgres") {
        let database = TestDatabase::create().await;
        let config = StoreConfig {
            policy,
            ..database.config()
        };
        let store = Store::open(&config)
            .await
            .expect("open the PostgreSQL store");
        out.push(Backend {
            name: "postgres",
            store,
            _dir: None,
            _database: Some(database),
        });
    }
    out
}
