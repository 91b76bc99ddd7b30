//! How a store is opened: which database, how durable, under which receiver policy.

use std::fmt;
use std::path::PathBuf;

use crate::rmp::group::Policy;

/// How hard a commit presses the data to disk before the ack goes out (DESIGN §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous=FULL`: acked messages survive power loss. The default.
    Full,
    /// `synchronous=NORMAL`: acked messages survive a process crash, but the last commits can
    /// be lost on power failure. Faster.
    Os,
}

/// Which database the `database` setting names (DESIGN §7): a path or `sqlite://…` (the
/// embedded default), or `postgres://…` / `postgresql://…` (several gateways on one database).
#[derive(Clone, PartialEq, Eq)]
pub enum Database {
    Sqlite(PathBuf),
    /// A libpq connection URL; it may carry a password, so it is never printed whole.
    Postgres(String),
}

impl Database {
    /// The SQLite file, when this names one.
    pub fn sqlite_path(&self) -> Option<&std::path::Path> {
        match self {
            Database::Sqlite(path) => Some(path),
            Database::Postgres(_) => None,
        }
    }

    pub fn parse(setting: &str) -> Database {
        if setting.starts_with("postgres://") || setting.starts_with("postgresql://") {
            Database::Postgres(setting.to_owned())
        } else {
            let path = setting.strip_prefix("sqlite://").unwrap_or(setting);
            Database::Sqlite(PathBuf::from(path))
        }
    }
}

/// For logs and errors: a PostgreSQL URL without its password (and without query parameters,
/// which may carry one too, e.g. `?password=`).
impl fmt::Display for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Database::Sqlite(path) => write!(f, "{}", path.display()),
            Database::Postgres(url) => f.write_str(&redacted(url)),
        }
    }
}

impl fmt::Debug for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Database::Sqlite(path) => f.debug_tuple("Sqlite").field(path).finish(),
            Database::Postgres(_) => f.debug_tuple("Postgres").field(&self.to_string()).finish(),
        }
    }
}

fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "postgres://…".to_owned();
    };
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let host = match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            if userinfo.contains(':') {
                format!("{user}:***@{host}")
            } else {
                format!("{user}@{host}")
            }
        }
        None => authority.to_owned(),
    };
    let query = if rest.len() < url.len() - scheme.len() - 3 {
        "?…"
    } else {
        ""
    };
    format!("{scheme}://{host}{path}{query}")
}

#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub database: Database,
    pub durability: Durability,
    pub policy: Policy,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_names_sqlite_unless_it_is_a_postgres_url() {
        assert_eq!(
            Database::parse("data/wsr.db"),
            Database::Sqlite("data/wsr.db".into())
        );
        assert_eq!(
            Database::parse("sqlite:///var/lib/wsr.db"),
            Database::Sqlite("/var/lib/wsr.db".into())
        );
        assert_eq!(
            Database::parse("postgresql://wsr@db/wsr"),
            Database::Postgres("postgresql://wsr@db/wsr".into())
        );
    }

    #[test]
    fn a_postgres_password_is_never_printed() {
        let db = Database::parse("postgres://wsr:s3cret@db.example:5432/wsr?sslmode=require");
        let shown = format!("{db} {db:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(
            shown.contains("postgres://wsr:***@db.example:5432/wsr?…"),
            "{shown}"
        );
        let db = Database::parse("postgres://db/wsr?password=s3cret");
        assert_eq!(db.to_string(), "postgres://db/wsr?…");
        assert_eq!(
            Database::parse("postgres://wsr@db/wsr").to_string(),
            "postgres://wsr@db/wsr"
        );
    }
}
