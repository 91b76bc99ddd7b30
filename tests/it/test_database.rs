//! The database a test's gateway runs on: a SQLite file in a temporary folder, or a
//! PostgreSQL database of the test's own (`WSR_TEST_POSTGRES`, default
//! `postgres://postgres@127.0.0.1:5432/test`, the server `.ci/run` makes sure is up), dropped
//! afterwards. Which one is the test binary's: `it` runs the suite on SQLite, `it-postgres`
//! the same files on PostgreSQL (`crate::BACKEND`).

use std::path::Path;

use sqlx::{Connection, PgConnection};
use wsr_gateway::store::{Database, Durability, StoreConfig};

/// The backend a test binary runs its gateways on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestBackend {
    Sqlite,
    Postgres,
}

/// A fresh database for one gateway of a test, and what keeps it alive.
pub struct FreshDatabase {
    pub database: Database,
    _postgres: Option<TestDatabase>,
}

impl FreshDatabase {
    /// The `database` setting naming it, as a config file or `WSR_DATABASE` takes it.
    pub fn setting(&self) -> String {
        match &self.database {
            Database::Sqlite(path) => path.display().to_string(),
            Database::Postgres(url) => url.clone(),
        }
    }
}

/// A fresh database of this binary's backend: `dir/name` on SQLite.
pub async fn fresh_database(dir: &Path, name: &str) -> FreshDatabase {
    match crate::BACKEND {
        TestBackend::Sqlite => FreshDatabase {
            database: Database::Sqlite(dir.join(name)),
            _postgres: None,
        },
        TestBackend::Postgres => {
            let db = TestDatabase::create().await;
            FreshDatabase {
                database: Database::Postgres(db.url.clone()),
                _postgres: Some(db),
            }
        }
    }
}

fn admin_url() -> String {
    std::env::var("WSR_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A database of this test's own, dropped (with any connections left to it) when it goes.
pub struct TestDatabase {
    name: String,
    pub url: String,
}

impl TestDatabase {
    pub async fn create() -> TestDatabase {
        let name = format!("wsr_test_{}", uuid::Uuid::now_v7().simple());
        let mut admin = PgConnection::connect(&admin_url())
            .await
            .expect("PostgreSQL is up (WSR_TEST_POSTGRES, or 127.0.0.1:5432)");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .expect("create the test database");
        let base = admin_url();
        let server = base.rsplit_once('/').map_or(base.as_str(), |(s, _)| s);
        let url = format!("{server}/{name}");
        TestDatabase { name, url }
    }

    pub fn config(&self) -> StoreConfig {
        StoreConfig {
            database: Database::Postgres(self.url.clone()),
            durability: Durability::Full,
            policy: Default::default(),
        }
    }

    pub async fn connect(&self) -> PgConnection {
        PgConnection::connect(&self.url).await.expect("connect")
    }

    pub async fn execute(&self, sql: &'static str) {
        sqlx::query(sql)
            .execute(&mut self.connect().await)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    pub async fn tables(&self) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT table_name::text FROM information_schema.tables \
             WHERE table_schema = 'public' ORDER BY table_name",
        )
        .fetch_all(&mut self.connect().await)
        .await
        .expect("list tables")
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // Drop runs outside any runtime the test had: drop the database from a thread of its
        // own, and wait, so that a run leaves no databases behind.
        let name = self.name.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let mut admin = PgConnection::connect(&admin_url()).await?;
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .execute(&mut admin)
                .await
                .map(|_| ())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test database {}", self.name);
        }
    }
}
