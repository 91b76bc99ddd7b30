//! The PostgreSQL rows' databases: each a fresh one created through the admin URL
//! (`--postgres`), named `wsr_compare_{pid}_{n}`, and dropped when it goes, whatever became of
//! the phase (an error, a panic, Ctrl-C dropping the run).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use sqlx::{Connection as _, PgConnection};

/// `--postgres` without a URL: a trust-auth admin connection to this machine's server.
pub const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// An unreachable server must not hang the run.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Databases made by this process so far: the `n` in their names.
static CREATED: AtomicUsize = AtomicUsize::new(0);

/// A fresh database, dropped (with any connections left to it) when this goes.
pub struct FreshDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl FreshDatabase {
    pub async fn create(admin_url: &str) -> anyhow::Result<FreshDatabase> {
        let n = CREATED.fetch_add(1, Ordering::Relaxed);
        let name = format!("wsr_compare_{}_{n}", std::process::id());
        let url = with_database(admin_url, &name)?;
        let mut admin = connect(admin_url).await?;
        // The name is ours (digits and underscores): nothing to quote.
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .with_context(|| format!("CREATE DATABASE {name}"))?;
        let _ = admin.close().await;
        Ok(FreshDatabase {
            admin_url: admin_url.to_owned(),
            name,
            url,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The URL a gateway's `database` setting takes: the admin URL's server, this database.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for FreshDatabase {
    fn drop(&mut self) {
        // Drop cannot await: drop the database from a thread with a runtime of its own, and
        // wait, so that a run leaves no databases behind.
        let (admin_url, name) = (self.admin_url.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("a runtime to drop the database")?;
            runtime.block_on(async move {
                let mut admin = connect(&admin_url).await?;
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .execute(&mut admin)
                .await?;
                let _ = admin.close().await;
                anyhow::Ok(())
            })
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("[compare] could not drop database {}: {e:#}", self.name),
            Err(_) => eprintln!("[compare] could not drop database {}", self.name),
        }
    }
}

async fn connect(url: &str) -> anyhow::Result<PgConnection> {
    let shown = crate::rabbit::redact(url);
    tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect(url))
        .await
        .with_context(|| format!("{shown}: no connection within {CONNECT_TIMEOUT:?}"))?
        .with_context(|| format!("connecting to {shown}"))
}

/// `url` with its database (the path) replaced by `name`; query parameters stay.
fn with_database(url: &str, name: &str) -> anyhow::Result<String> {
    let (base, query) = url.split_once('?').map_or((url, ""), |(b, q)| (b, q));
    let Some(scheme_end) = base.find("://").map(|i| i + 3) else {
        bail!("{}: not a postgres:// URL", crate::rabbit::redact(url));
    };
    let path_at = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let mut out = format!("{}/{name}", &base[..path_at]);
    if !query.is_empty() {
        out.push('?');
        out.push_str(query);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn names_another_database_on_the_same_server() {
        let at = |url: &str| with_database(url, "wsr_compare_1_0").expect("a URL");
        assert_eq!(
            at("postgres://postgres@127.0.0.1:5432/test"),
            "postgres://postgres@127.0.0.1:5432/wsr_compare_1_0"
        );
        assert_eq!(
            at("postgres://u:p@db:5432?sslmode=disable"),
            "postgres://u:p@db:5432/wsr_compare_1_0?sslmode=disable"
        );
        assert_eq!(
            at("postgresql://db/x/y?a=1"),
            "postgresql://db/wsr_compare_1_0?a=1"
        );
        assert!(with_database("db:5432/test", "x").is_err());
    }
}
