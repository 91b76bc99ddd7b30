//! The CPU a server spent per message in a phase, read from `/proc/{pid}/stat`.
//!
//! On this shared 2-core machine a phase's msgs/s drifts by ±25 % within minutes (the disk
//! and the neighbours), while the server's CPU time per message of one build stays within
//! about ±10 %: the better figure to compare two builds by. The server is the gateway child,
//! or the broker's own processes (`nats-server`, RabbitMQ's `beam.smp`), found by name; the
//! ceiling server runs inside this tool, so it has none. The trivial SOAP backend of the
//! request-response rows also runs inside this tool, but on threads of its own, known by name
//! (`/proc/self/task/{tid}/comm`), whose CPU counts. A gateway on PostgreSQL does part of
//! its work in the PostgreSQL backends serving its database, which count too.

use std::collections::BTreeMap;
use std::future::Future;

use crate::load::Figures;

/// `/proc` counts CPU time in clock ticks of `USER_HZ`, which Linux fixes at 100 for every
/// userspace-visible interface (`sysconf(_SC_CLK_TCK)`).
const TICKS_PER_SECOND: f64 = 100.0;

/// The processes whose CPU counts as the server's.
pub struct Server {
    pids: Vec<u32>,
    /// The PostgreSQL database whose backends count too. They are looked up at each reading:
    /// the gateways' pools open connections as the load grows.
    postgres_db: Option<String>,
    /// This process's threads of that name count too (an in-process server on its own
    /// runtime).
    own_threads: Option<&'static str>,
}

impl Server {
    pub fn pid(pid: u32) -> Server {
        Server {
            pids: vec![pid],
            postgres_db: None,
            own_threads: None,
        }
    }

    /// This process's threads named `name` (a runtime's `thread_name`, at most 15 bytes).
    pub fn own_threads(name: &'static str) -> Server {
        Server {
            pids: Vec::new(),
            postgres_db: None,
            own_threads: Some(name),
        }
    }

    /// Both sets of processes.
    pub fn and(mut self, other: Server) -> Server {
        self.pids.extend(other.pids);
        self.postgres_db = self.postgres_db.or(other.postgres_db);
        self.own_threads = self.own_threads.or(other.own_threads);
        self
    }

    /// With the backends of this machine's PostgreSQL serving `database` (none are found when
    /// PostgreSQL runs elsewhere).
    pub fn with_postgres_backends(mut self, database: &str) -> Server {
        self.postgres_db = Some(database.to_owned());
        self
    }

    /// Every process whose command name (`/proc/{pid}/comm`) is `name`; none found is an
    /// empty set (the figure is then left out).
    pub fn named(name: &str) -> Server {
        let pids = processes_named(name).collect();
        Server {
            pids,
            postgres_db: None,
            own_threads: None,
        }
    }

    /// User plus system CPU ticks of each process so far; `None` when one of the fixed
    /// processes cannot be read. A backend that ended meanwhile is just left out.
    fn ticks(&self) -> Option<BTreeMap<u32, u64>> {
        if self.pids.is_empty() && self.own_threads.is_none() {
            return None;
        }
        let mut ticks = BTreeMap::new();
        for pid in &self.pids {
            ticks.insert(*pid, process_ticks(*pid)?);
        }
        if let Some(db) = &self.postgres_db {
            for pid in postgres_backends(db) {
                if let Some(t) = process_ticks(pid) {
                    ticks.insert(pid, t);
                }
            }
        }
        if let Some(name) = self.own_threads {
            // Thread ids share the pid space: they do not collide with the processes'.
            for tid in own_threads_named(name) {
                if let Some(t) = stat_ticks(&format!("/proc/self/task/{tid}/stat")) {
                    ticks.insert(tid, t);
                }
            }
        }
        Some(ticks)
    }

    /// Runs a phase and adds to its figures the server's CPU microseconds per completed
    /// operation over the phase.
    pub async fn measure(
        &self,
        phase: impl Future<Output = anyhow::Result<Figures>>,
    ) -> anyhow::Result<Figures> {
        let before = self.ticks();
        let mut figures = phase.await?;
        if let (Some(before), Some(after)) = (before, self.ticks())
            && figures.count > 0
        {
            // A backend first seen after the phase counts from zero: it was started during the
            // phase, for its load (the database is fresh and the gateways' own).
            let ticks: u64 = after
                .iter()
                .map(|(pid, t)| t.saturating_sub(before.get(pid).copied().unwrap_or(0)))
                .sum();
            let seconds = ticks as f64 / TICKS_PER_SECOND;
            figures.server_cpu_us = Some(seconds * 1e6 / figures.count as f64);
        }
        Ok(figures)
    }
}

/// The PostgreSQL backends connected to `database`: processes named `postgres` whose title
/// (`postgres: [cluster:] user database host(port) activity`, in `/proc/{pid}/cmdline`) names
/// it. The database's name is this tool's own (`wsr_compare_…`), so it matches nothing else.
fn postgres_backends(database: &str) -> Vec<u32> {
    processes_named("postgres")
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|title| serves(&String::from_utf8_lossy(&title), database))
        })
        .collect()
}

/// The processes whose command name (`/proc/{pid}/comm`) is `name`.
pub fn processes_named(name: &str) -> impl Iterator<Item = u32> + '_ {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(move |pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim_end() == name)
        })
}

/// This process's threads whose name (`/proc/self/task/{tid}/comm`) is `name`.
fn own_threads_named(name: &str) -> impl Iterator<Item = u32> + '_ {
    std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(move |tid| {
            std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
                .is_ok_and(|comm| comm.trim_end() == name)
        })
}

/// Whether a backend's process title names `database`.
fn serves(title: &str, database: &str) -> bool {
    let mut words = title.split(|c: char| c.is_whitespace() || c == '\0');
    words.next() == Some("postgres:") && words.any(|w| w == database)
}

/// utime + stime of one process (fields 14 and 15 of `/proc/{pid}/stat`, counted after the
/// command name, which may itself hold spaces and parentheses).
fn process_ticks(pid: u32) -> Option<u64> {
    stat_ticks(&format!("/proc/{pid}/stat"))
}

/// utime + stime from a `stat` file (a process's or one thread's).
fn stat_ticks(path: &str) -> Option<u64> {
    parse_ticks(&std::fs::read_to_string(path).ok()?)
}

fn parse_ticks(stat: &str) -> Option<u64> {
    let (_, after_comm) = stat.rsplit_once(')')?;
    // After the name: state (field 3) is the first; utime and stime are fields 14 and 15.
    let mut fields = after_comm.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::{parse_ticks, serves};

    #[test]
    fn a_backend_is_known_by_the_database_in_its_title() {
        let db = "wsr_compare_42_0";
        assert!(serves(
            "postgres: 15/main: postgres wsr_compare_42_0 127.0.0.1(51234) idle\0\0",
            db
        ));
        assert!(serves("postgres: wsr wsr_compare_42_0 [local] COMMIT", db));
        assert!(!serves(
            "postgres: 15/main: postgres wsr_compare_42_01 127.0.0.1(51234) idle",
            db
        ));
        assert!(!serves("postgres: 15/main: walwriter", db));
        assert!(!serves(
            "/usr/lib/postgresql/15/bin/postgres\0-D\0wsr_compare_42_0\0",
            db
        ));
    }

    #[test]
    fn reads_user_and_system_ticks_after_a_name_with_spaces_and_parentheses() {
        let stat = "4242 (wsr (store) w) S 1 4242 4242 0 -1 4194560 1520 0 0 0 731 96 0 0 20 0 \
                    9 0 1234 567890 1234 18446744073709551615";
        assert_eq!(parse_ticks(stat), Some(731 + 96));
    }

    #[test]
    fn a_truncated_line_has_no_ticks() {
        assert_eq!(parse_ticks("4242 (wsr) S 1 2 3"), None);
        assert_eq!(parse_ticks("garbage"), None);
    }
}
