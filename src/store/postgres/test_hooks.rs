//! `TestHooks` for PostgreSQL (only with the `test-hooks` feature): the hooks' state is in
//! `Shared::hooks`, read by the writer. It must never be used outside the tests.

use super::PostgresStore;
use crate::store::error::StoreError;
use crate::store::future::StoreFuture;
use crate::store::test_hooks::TestHooks;

impl TestHooks for PostgresStore {
    fn panic_on_group(&self, group: Option<&str>) {
        self.shared.hooks.panic_on_group(group);
    }

    fn cap_database_size<'a>(&'a self, _capped: bool) -> StoreFuture<'a, Result<(), StoreError>> {
        // A full disk is the database server's to report; no gateway can simulate it there.
        Box::pin(async move {
            Err(StoreError::Refused(
                "a database size cap is a SQLite test hook; PostgreSQL has none".into(),
            ))
        })
    }

    fn fail_next_commits(&self, n: usize) {
        self.shared.hooks.fail_next_commits(n);
    }
}
