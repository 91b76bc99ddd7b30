//! The CPU a server spent per message in a phase, read from `/proc/{pid}/stat`.
//!
//! On this shared 2-core machine a phase's msgs/s drifts by ±25 % within minutes (the disk
//! and the neighbours), while the server's CPU time per message of one build stays within
//! about ±10 %: the better figure to compare two builds by. The server is the gateway child,
//! or the broker's own processes (`nats-server`, RabbitMQ's `beam.smp`), found by name; the
//! ceiling server runs inside this tool, so it has none.

use std::future::Future;

use crate::load::Figures;

/// `/proc` counts CPU time in clock ticks of `USER_HZ`, which Linux fixes at 100 for every
/// userspace-visible interface (`sysconf(_SC_CLK_TCK)`).
const TICKS_PER_SECOND: f64 = 100.0;

/// The processes whose CPU counts as the server's.
pub struct Server {
    pids: Vec<u32>,
}

impl Server {
    pub fn pid(pid: u32) -> Server {
        Server { pids: vec![pid] }
    }

    /// Every process whose command name (`/proc/{pid}/comm`) is `name`; none found is an
    /// empty set (the figure is then left out).
    pub fn named(name: &str) -> Server {
        let pids = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|comm| comm.trim_end() == name)
            })
            .collect();
        Server { pids }
    }

    /// User plus system CPU ticks of the processes so far; `None` when one cannot be read.
    fn ticks(&self) -> Option<u64> {
        if self.pids.is_empty() {
            return None;
        }
        self.pids.iter().map(|pid| process_ticks(*pid)).sum()
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
            let seconds = after.saturating_sub(before) as f64 / TICKS_PER_SECOND;
            figures.server_cpu_us = Some(seconds * 1e6 / figures.count as f64);
        }
        Ok(figures)
    }
}

/// utime + stime of one process (fields 14 and 15 of `/proc/{pid}/stat`, counted after the
/// command name, which may itself hold spaces and parentheses).
fn process_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_ticks(&stat)
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
    use super::parse_ticks;

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
