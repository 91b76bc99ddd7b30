//! `--pin`: every system under test on one core and the load on the other, so that each row
//! is a per-core figure and the client never competes with the server for a CPU.
//!
//! This process (every thread, and so every child it starts: the codec client) goes on the
//! client core; the gateway children are started under `taskset` on the server core; the
//! machine's running servers (`nats-server`, RabbitMQ's `beam.smp`, PostgreSQL's processes,
//! whose new backends inherit the postmaster's mask) are moved there for the run and put back
//! as they were when `Restore` is dropped — at the end, on an error and on Ctrl-C alike. The
//! request-response rows' in-process SOAP service moves its threads there too. Affinity is set
//! with util-linux's `taskset`, the tool an operator would use to check it.

use std::path::Path;
use std::process::Command as StdCommand;
use std::sync::OnceLock;

use anyhow::{Context as _, bail};
use tokio::process::Command;

/// The two cores of a pinned run.
#[derive(Debug, Clone, Copy)]
pub struct Cores {
    pub server: usize,
    pub client: usize,
}

static PINNED: OnceLock<Cores> = OnceLock::new();

/// The machine's CPUs as this process saw them before it pinned itself (after, it sees one).
static MACHINE_CPUS: OnceLock<usize> = OnceLock::new();

/// The CPUs this machine offers this tool, whether or not the run is pinned.
pub fn machine_cpus() -> usize {
    *MACHINE_CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The machine's servers moved to the server core for a pinned run.
pub const EXTERNAL_SERVERS: &[&str] = &["nats-server", "beam.smp", "postgres"];

/// Puts the processes moved by `start` back on the CPUs they had.
pub struct Restore {
    masks: Vec<(u32, String)>,
}

impl Drop for Restore {
    fn drop(&mut self) {
        for (pid, mask) in &self.masks {
            // A process that ended meanwhile has nothing to restore.
            let _ = StdCommand::new("taskset")
                .args(["-a", "-p", mask, &pid.to_string()])
                .output();
        }
    }
}

/// Pins this process to `cores.client` and the running servers named in `EXTERNAL_SERVERS` to
/// `cores.server`; the guard restores the servers.
pub fn start(cores: Cores) -> anyhow::Result<Restore> {
    let available = machine_cpus();
    if cores.server == cores.client || cores.server.max(cores.client) >= available {
        bail!(
            "--pin needs two distinct CPUs below {available} (server {}, client {})",
            cores.server,
            cores.client
        );
    }
    let mut restore = Restore { masks: Vec::new() };
    for name in EXTERNAL_SERVERS {
        for pid in crate::cpu::processes_named(name) {
            let mask = mask_of(pid).with_context(|| format!("reading {name} {pid}'s affinity"))?;
            set(pid, cores.server, Threads::All)
                .with_context(|| format!("pinning {name} {pid}"))?;
            restore.masks.push((pid, mask));
        }
    }
    set(std::process::id(), cores.client, Threads::All).context("pinning this process")?;
    let _ = PINNED.set(cores);
    Ok(restore)
}

/// The cores of this run, when it is pinned.
pub fn cores() -> Option<Cores> {
    PINNED.get().copied()
}

/// A command that runs `bin` as a server: on the server core when the run is pinned (set
/// before it starts, so that none of its threads ever runs elsewhere).
pub fn server_command(bin: &Path) -> Command {
    match cores() {
        Some(cores) => {
            let mut cmd = Command::new("taskset");
            cmd.arg("-c").arg(cores.server.to_string()).arg(bin);
            cmd
        }
        None => Command::new(bin),
    }
}

/// Moves this process's threads named `name` (an in-process server's runtime) to the server
/// core, when the run is pinned.
pub fn own_threads_to_server(name: &str) -> anyhow::Result<()> {
    let Some(cores) = cores() else {
        return Ok(());
    };
    let tasks = std::fs::read_dir("/proc/self/task").context("listing this process's threads")?;
    for tid in tasks
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
    {
        let named = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
            .is_ok_and(|comm| comm.trim_end() == name);
        if named {
            set(tid, cores.server, Threads::One)?;
        }
    }
    Ok(())
}

/// Whether `set` moves a process with all its threads or one thread (a task id).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Threads {
    All,
    One,
}

/// `id` (every thread of a process, or one thread) onto `cpu`.
fn set(id: u32, cpu: usize, threads: Threads) -> anyhow::Result<()> {
    let mut taskset = StdCommand::new("taskset");
    if threads == Threads::All {
        taskset.arg("-a");
    }
    run(taskset.args(["-p", "-c", &cpu.to_string(), &id.to_string()]))
}

/// `pid`'s affinity mask, as `taskset -p` prints it (hex).
fn mask_of(pid: u32) -> anyhow::Result<String> {
    let out = StdCommand::new("taskset")
        .args(["-p", &pid.to_string()])
        .output()
        .context("running taskset")?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "pid 123's current affinity mask: 3"
    let mask = text
        .rsplit(':')
        .next()
        .map(str::trim)
        .filter(|m| !m.is_empty() && m.chars().all(|c| c.is_ascii_hexdigit()))
        .with_context(|| format!("taskset -p {pid} said {text:?}"))?;
    Ok(mask.to_owned())
}

fn run(cmd: &mut StdCommand) -> anyhow::Result<()> {
    let out = cmd.output().context("running taskset (util-linux)")?;
    if !out.status.success() {
        bail!(
            "taskset failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
