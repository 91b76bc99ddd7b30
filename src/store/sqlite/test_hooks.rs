//! `TestHooks` for SQLite (only with the `test-hooks` feature): the hooks' state is in
//! `Shared::hooks`, read by the writer thread; the size cap is a pragma on the writer's
//! connection. It must never be used outside the tests.

use super::{SqliteStore, Wakes};
use crate::store::error::StoreError;
use crate::store::future::StoreFuture;
use crate::store::test_hooks::TestHooks;

impl TestHooks for SqliteStore {
    fn panic_on_group(&self, group: Option<&str>) {
        self.shared.hooks.panic_on_group(group);
    }

    fn cap_database_size<'a>(&'a self, capped: bool) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.keep(move |conn| {
                // SQLite raises a cap below the current size to the current size.
                let pages: i64 = if capped { 1 } else { 1_073_741_823 };
                conn.pragma_update(None, "max_page_count", pages)?;
                Ok(((), Wakes::NONE))
            })
            .await
        })
    }

    fn fail_next_commits(&self, n: usize) {
        self.shared.hooks.fail_next_commits(n);
    }
}
