//! Durable commits without a writer that waits for the disk (`durability = "full"`, issue 35).
//!
//! SQLite's `synchronous = FULL` syncs the WAL inside each `COMMIT`, on the writer's thread:
//! while the disk flushed one batch, the next one waited in the channel with the core idle —
//! about 0.5 ms of a 2 ms cycle under load (without it: 5–13 % more msgs/s, a fifth off p99).
//! Here the writer commits with `synchronous = NORMAL` (the WAL is written, not yet synced)
//! and hands the batch's answers to this thread, which syncs the WAL file and only then
//! answers: every ack still follows the sync of the frames it stands for, and the writer runs
//! the next batch meanwhile. One sync covers every commit written before it, so commits that
//! queued up while the disk worked share it.
//!
//! A commit is visible to other connections before it is durable, so whatever is read there
//! and told to somebody (a poll's answer, a callback ack, a message sent on, a replayed
//! response) waits too: [`Durable::caught_up`] after the read, until every commit it may
//! have seen is synced. A failed sync leaves the WAL's tail in doubt (Linux may drop the
//! failed pages and report the next sync clean), so nothing is acknowledged after one: every
//! later batch and read fails until the machine is rebooted and SQLite recovers what the disk
//! holds (a restarted process could still read the pages the kernel never wrote).

use std::fs::File;
use std::os::unix::fs::MetadataExt as _;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use tokio::sync::watch;

use crate::store::error::StoreError;

/// What the commits have made durable, shared by the writer, the syncer and the readers.
pub(in crate::store) struct Durable {
    /// Commits announced: a commit takes its number before it becomes visible.
    announced: AtomicU64,
    /// Every commit up to this number is on disk.
    synced: watch::Sender<u64>,
    /// Why a sync failed; set once, then nothing is durable any more.
    failed: OnceLock<String>,
}

impl Default for Durable {
    fn default() -> Self {
        Durable {
            announced: AtomicU64::new(0),
            synced: watch::channel(0).0,
            failed: OnceLock::new(),
        }
    }
}

impl Durable {
    /// The writer, just before `COMMIT`: the number that commit will be synced under.
    pub(super) fn announce(&self) -> u64 {
        self.announced.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The number of the last commit announced.
    pub(super) fn latest(&self) -> u64 {
        self.announced.load(Ordering::SeqCst)
    }

    /// Every commit up to `seq` is durable (or, in os mode, as durable as it will be).
    pub(super) fn synced(&self, seq: u64) {
        self.synced.send_if_modified(|s| {
            let newer = seq > *s;
            if newer {
                *s = seq;
            }
            newer
        });
    }

    /// Why the store can no longer make anything durable, if it cannot.
    pub(super) fn failure(&self) -> Option<&str> {
        self.failed.get().map(String::as_str)
    }

    fn fail(&self, why: String) {
        let _ = self.failed.set(why);
        // Wakes the readers waiting in `caught_up`, who then see the failure.
        self.synced.send_modify(|_| {});
    }

    /// After a read on another connection: waits until every commit that read may have seen
    /// is durable, so that nothing a power loss could take back is told to anybody.
    pub(in crate::store) async fn caught_up(&self) -> Result<(), StoreError> {
        let target = self.latest();
        let mut synced = self.synced.subscribe();
        // It cannot fail: the sender is `self.synced`, alive while `self` is.
        let _ = synced
            .wait_for(|s| *s >= target || self.failed.get().is_some())
            .await;
        match self.failure() {
            Some(why) => Err(StoreError::Failed(why.to_owned())),
            None => Ok(()),
        }
    }
}

/// What to do once a commit is durable (`Ok`) or cannot be made so (`Err`, why): answer the
/// batch's jobs and wake whoever waits for what it stored.
pub(super) type Finish = Box<dyn FnOnce(Result<(), &str>) + Send>;

/// A commit for the syncer: its number, and its answers (`None`: it was rolled back, nothing
/// to sync, but the readers may stop waiting for its number).
struct Committed {
    seq: u64,
    finish: Option<Finish>,
}

/// Commits handed over and not yet answered, at most: beyond, the writer waits for the disk
/// as it did inside SQLite's commit — a stalled disk holds the writer, and through its full
/// channel the requests, instead of letting answers pile up here.
const SYNC_BACKLOG: usize = 64;

/// The writer's side of the syncer thread.
pub(super) struct Syncer {
    commits: SyncSender<Committed>,
    durable: Arc<Durable>,
}

impl Syncer {
    /// Starts the thread that syncs `wal` (the database's `-wal` file, as SQLite names it). It
    /// ends when the writer drops its `Syncer`, after answering every commit handed to it.
    pub(super) fn start(wal: PathBuf, durable: Arc<Durable>) -> std::io::Result<Self> {
        let (commits, queue) = sync_channel(SYNC_BACKLOG);
        let shared = durable.clone();
        std::thread::Builder::new()
            .name("wsr-store-sync".into())
            .spawn(move || run(&wal, &queue, &shared))?;
        Ok(Syncer { commits, durable })
    }

    /// Hands over commit `seq`: `finish` runs once its WAL frames are synced.
    pub(super) fn after_sync(&self, seq: u64, finish: Option<Finish>) {
        if let Err(unsent) = self.commits.send(Committed { seq, finish }) {
            // The thread is gone: nobody is told a commit is durable that was not synced, and
            // readers waiting for a sync are let go with the failure rather than left waiting.
            self.durable
                .fail("the store's syncer thread stopped; restart the gateway".into());
            if let Some(finish) = unsent.0.finish {
                finish(Err("the store's syncer thread stopped"));
            }
        }
    }
}

fn run(wal: &Path, queue: &Receiver<Committed>, durable: &Durable) {
    let mut file = WalFile::default();
    while let Ok(first) = queue.recv() {
        let mut commits = vec![first];
        commits.extend(queue.try_iter());
        let wrote = commits.iter().any(|c| c.finish.is_some());
        let last = commits.iter().map(|c| c.seq).max().unwrap_or(0);
        let synced = if durable.failure().is_none() && wrote {
            let started = Instant::now();
            let synced = file.sync(wal);
            crate::metrics::wal_sync(started.elapsed());
            synced
        } else {
            Ok(())
        };
        if let Err(e) = synced {
            // The reason reaches `/readyz` and refused requests: the path only the log.
            let why = format!(
                "syncing the WAL failed ({e}): acknowledging nothing more; fix the disk, then \
                 restart the gateway by rebooting the machine, so that SQLite recovers from what \
                 the disk holds"
            );
            tracing::error!(
                wal = %wal.display(),
                reason = %why,
                "the store cannot make commits durable"
            );
            durable.fail(why);
        }
        let outcome = match durable.failure() {
            Some(why) => Err(why),
            None => {
                durable.synced(last);
                Ok(())
            }
        };
        for finish in commits.into_iter().filter_map(|c| c.finish) {
            // A panicking answer must not end the thread every later answer and read waits on.
            if std::panic::catch_unwind(AssertUnwindSafe(|| finish(outcome))).is_err() {
                tracing::error!("answering a synced commit panicked");
            }
        }
    }
}

/// Syncs the database file and its WAL (`wal`, when there is one) before a gateway serves
/// from them: a gateway that stopped with commits written but not synced left them in the
/// page cache, where its successor would read — and tell — them as if they were on disk.
pub(super) fn sync_at_start(database: &Path, wal: &Path) -> std::io::Result<()> {
    File::open(database)?.sync_all()?;
    match File::open(wal) {
        Ok(file) => file.sync_all(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The WAL file, opened by this thread for its syncs.
#[derive(Default)]
struct WalFile {
    open: Option<(File, u64)>,
}

impl WalFile {
    /// `fdatasync` of the WAL file — the file now at `path`: SQLite keeps one WAL file while
    /// it has connections (it starts it over in place), but one it deleted and made again
    /// must not be answered by a sync of the old one.
    fn sync(&mut self, path: &Path) -> std::io::Result<()> {
        let inode = std::fs::metadata(path)?.ino();
        if self.open.as_ref().is_none_or(|(_, ino)| *ino != inode) {
            let file = File::open(path)?;
            let opened = file.metadata()?.ino();
            self.open = Some((file, opened));
        }
        match &self.open {
            Some((file, _)) => file.sync_data(),
            None => Err(std::io::Error::other("the WAL file is not open")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::sync_channel;

    fn finish_into(tx: std::sync::mpsc::SyncSender<Result<(), String>>) -> Option<Finish> {
        Some(Box::new(move |outcome: Result<(), &str>| {
            let _ = tx.send(outcome.map_err(str::to_owned));
        }))
    }

    #[tokio::test]
    async fn readers_wait_for_the_sync_of_every_commit_announced_before_they_ask() {
        let dir = tempfile::tempdir().expect("dir");
        let wal = dir.path().join("db-wal");
        std::fs::write(&wal, b"frames").expect("wal");
        let durable = Arc::new(Durable::default());
        // Nothing announced: nothing to wait for.
        durable.caught_up().await.expect("caught up at the start");

        let seq = durable.announce();
        let reader = {
            let durable = durable.clone();
            tokio::spawn(async move { durable.caught_up().await })
        };
        tokio::task::yield_now().await;
        assert!(!reader.is_finished(), "a reader passed an unsynced commit");

        let syncer = Syncer::start(wal, durable.clone()).expect("syncer");
        let (tx, answered) = sync_channel(1);
        syncer.after_sync(seq, finish_into(tx));
        assert_eq!(answered.recv().expect("answered"), Ok(()));
        reader
            .await
            .expect("reader")
            .expect("caught up after the sync");
    }

    #[tokio::test]
    async fn a_failed_sync_answers_nothing_as_durable_then_or_later() {
        let dir = tempfile::tempdir().expect("dir");
        // No WAL file to sync: the sync fails.
        let wal = dir.path().join("missing-wal");
        let durable = Arc::new(Durable::default());
        let syncer = Syncer::start(wal.clone(), durable.clone()).expect("syncer");

        let (tx, answered) = sync_channel(1);
        syncer.after_sync(durable.announce(), finish_into(tx));
        let why = answered
            .recv()
            .expect("answered")
            .expect_err("acked a failed sync");
        assert!(why.contains("restart the gateway"), "{why}");
        assert!(
            durable.caught_up().await.is_err(),
            "a read passed a failed sync"
        );

        // The file is there now, but what the failed sync lost stays in doubt.
        std::fs::write(&wal, b"frames").expect("wal");
        let (tx, answered) = sync_channel(1);
        syncer.after_sync(durable.announce(), finish_into(tx));
        assert!(
            answered.recv().expect("answered").is_err(),
            "acked after a failed sync"
        );
    }

    #[test]
    fn a_panicking_answer_leaves_the_syncer_answering_the_next_commits() {
        let dir = tempfile::tempdir().expect("dir");
        let wal = dir.path().join("db-wal");
        std::fs::write(&wal, b"frames").expect("wal");
        let durable = Arc::new(Durable::default());
        let syncer = Syncer::start(wal, durable.clone()).expect("syncer");
        syncer.after_sync(
            durable.announce(),
            Some(Box::new(|_| panic!("an answer panics"))),
        );
        let (tx, answered) = sync_channel(1);
        syncer.after_sync(durable.announce(), finish_into(tx));
        assert_eq!(answered.recv().expect("answered"), Ok(()));
        assert!(durable.failure().is_none());
    }

    #[test]
    fn a_rolled_back_commit_releases_its_number_without_a_sync() {
        let dir = tempfile::tempdir().expect("dir");
        // Never synced: a sync would fail on the missing file and mark the store failed.
        let durable = Arc::new(Durable::default());
        let syncer = Syncer::start(dir.path().join("missing-wal"), durable.clone()).expect("start");
        let seq = durable.announce();
        syncer.after_sync(seq, None);
        drop(syncer);
        let mut synced = durable.synced.subscribe();
        let reached = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(async { synced.wait_for(|s| *s >= seq).await.map(|s| *s) });
        assert_eq!(reached.ok(), Some(seq));
        assert!(durable.failure().is_none());
    }
}
