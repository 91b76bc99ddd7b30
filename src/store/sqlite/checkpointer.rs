//! WAL checkpoints on a thread of their own. Left to SQLite, a checkpoint runs inside the
//! writer's commit whenever the WAL passed 1 000 pages, and every request of the next batch
//! waits for it (a tenth of the writer's time under load). Here the writer only signals "the
//! WAL holds N pages" after a commit and goes on with the next batch; this thread copies the
//! WAL back into the database meanwhile, on the other core.
//!
//! It checkpoints each time the WAL has grown by `CHECKPOINT_AT` pages, not after every
//! commit: a page that many commits rewrite (the inbox's last page, a busy group's row, the
//! B-tree pages new groups land in) is then copied into the database once, not once per
//! commit, and the database file is synced a few times a second instead of once per commit
//! (in os mode the checkpointer was a fifth of the gateway's CPU). A PASSIVE checkpoint never
//! blocks the writer; when it copied everything, the writer's next commit starts the WAL over.
//! When the WAL has grown past `RESTART_ABOVE` pages anyway (readers kept old pages needed),
//! one RESTART checkpoint waits for the writer's current transaction and lets the WAL start
//! over, so it stays bounded.

use std::cell::Cell;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

use rusqlite::Connection;

use crate::store::error::StoreError;

/// WAL pages (4 MiB) from which a commit asks for a checkpoint.
const CHECKPOINT_AT: i64 = 1024;

/// WAL pages above which the checkpoint makes the WAL start over.
const RESTART_ABOVE: i64 = 8 * 1024;

/// The writer's side: tells the checkpointer that commits happened.
pub(super) struct Checkpoints {
    committed: SyncSender<()>,
    /// The WAL's size when a checkpoint was last asked for (0 after the WAL started over).
    asked_at: Cell<i64>,
}

impl Checkpoints {
    /// Starts the checkpointer on `conn` (a connection of its own). It ends when the writer
    /// drops its `Checkpoints`.
    pub(super) fn start(conn: Connection) -> Result<Checkpoints, StoreError> {
        // One pending signal is enough: a checkpoint covers every commit before it.
        let (committed, signals) = sync_channel(1);
        std::thread::Builder::new()
            .name("wsr-store-ckpt".into())
            .spawn(move || run(&conn, &signals))
            .map_err(|e| StoreError::Failed(format!("cannot start the checkpointer: {e}")))?;
        Ok(Checkpoints {
            committed,
            asked_at: Cell::new(0),
        })
    }

    /// After a commit that left `wal_pages` in the WAL: asks for a checkpoint when enough
    /// piled up since the last one was asked for, without waiting for it.
    ///
    /// Under steady load the WAL rarely starts over between two checkpoints (the writer has
    /// committed again before the checkpoint copied everything), so "the WAL holds
    /// `CHECKPOINT_AT` pages" stays true after the first one: asking after every commit then
    /// made SQLite sort the WAL's frame index once per commit — a fifth of the gateway's
    /// instructions per message — and copy the hot pages once per commit again.
    pub(super) fn committed(&self, wal_pages: i64) {
        if wal_pages < self.asked_at.get() {
            // The WAL started over.
            self.asked_at.set(0);
        }
        if !checkpoint_due(wal_pages, self.asked_at.get()) {
            return;
        }
        self.asked_at.set(wal_pages);
        match self.committed.try_send(()) {
            Ok(()) | Err(TrySendError::Full(())) => {}
            // The checkpointer died (a bug): SQLite's own checkpoint at close still runs, and
            // readers keep reading the WAL; nothing is lost, the WAL only grows.
            Err(TrySendError::Disconnected(())) => {
                tracing::error!("the WAL checkpointer is gone; the WAL grows until restart");
            }
        }
    }
}

/// Whether a WAL of `wal_pages`, last checkpointed when it held `asked_at`, needs another.
fn checkpoint_due(wal_pages: i64, asked_at: i64) -> bool {
    wal_pages - asked_at >= CHECKPOINT_AT
}

fn run(conn: &Connection, signals: &Receiver<()>) {
    while signals.recv().is_ok() {
        let wal_pages = match checkpoint(conn, "PASSIVE") {
            Ok(pages) => pages,
            Err(e) => {
                tracing::warn!(error = %e, "WAL checkpoint failed; the next commit tries again");
                continue;
            }
        };
        if wal_pages > RESTART_ABOVE
            && let Err(e) = checkpoint(conn, "RESTART")
        {
            tracing::warn!(error = %e, wal_pages, "WAL restart checkpoint failed");
        }
    }
}

/// Runs one checkpoint; answers how many pages the WAL holds.
fn checkpoint(conn: &Connection, mode: &str) -> Result<i64, rusqlite::Error> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        r.get::<_, i64>(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_is_due_per_checkpoint_at_pages_of_growth_not_per_commit() {
        assert!(!checkpoint_due(CHECKPOINT_AT - 1, 0));
        assert!(checkpoint_due(CHECKPOINT_AT, 0));
        // Asked at 1 030: the commits that follow do not ask again…
        assert!(!checkpoint_due(1_100, 1_030));
        assert!(!checkpoint_due(1_030 + CHECKPOINT_AT - 1, 1_030));
        // …until the WAL grew by as much again.
        assert!(checkpoint_due(1_030 + CHECKPOINT_AT, 1_030));
    }

    #[test]
    fn the_writer_asks_again_only_after_the_wal_grew_or_started_over() {
        let (committed, signals) = sync_channel(8);
        let checkpoints = Checkpoints {
            committed,
            asked_at: Cell::new(0),
        };
        let asks = |pages: &[i64]| {
            for p in pages {
                checkpoints.committed(*p);
            }
            signals.try_iter().count()
        };
        assert_eq!(asks(&[10, 500, 1_023]), 0);
        assert_eq!(asks(&[1_024, 1_100, 1_500, 2_000]), 1);
        assert_eq!(asks(&[2_048]), 1);
        // The WAL started over: counted from zero again.
        assert_eq!(asks(&[40, 900]), 0);
        assert_eq!(asks(&[1_024]), 1);
    }
}
