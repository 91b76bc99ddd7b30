//! How log lines are timed and written out.
//!
//! The time at the start of every line is RFC 3339 in UTC with microseconds, exactly as
//! `tracing-subscriber`'s own `SystemTime` writes it — but the date and time of day are
//! formatted once a second on each thread instead of through `core::fmt` for every line (an
//! access line is written for every request; the default timer was a sixth of its cost).
//!
//! Lines go to standard output from the log thread (`tracing-appender`'s non-blocking
//! writer), which writes out whatever is queued each time it wakes. Woken for every line, it
//! cost a thread switch and a `write` per request; `Lingering` makes it pause after each
//! write-out, so that under load it finds many lines queued and a request's line costs neither.

use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::io;
use std::time::Duration;

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;

use crate::wsr::datetime::push_decimal;

/// The log lines' timer (`fmt::layer().with_timer(LineTime)`).
#[derive(Debug, Clone, Copy, Default)]
pub struct LineTime;

thread_local! {
    /// The second last written on this thread, and its line time: the text up to the fraction
    /// is kept for the second, the fraction written after it for each line.
    static SECOND: RefCell<(i64, String)> = const { RefCell::new((i64::MIN, String::new())) };
}

/// `.uuuuuuZ`: what each line adds to its second's text.
const FRACTION_LEN: usize = 8;

impl FormatTime for LineTime {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        let now = chrono::Utc::now();
        let second = now.timestamp();
        // A leap second's microseconds run past a million; the line shows its last one.
        let micros = now.timestamp_subsec_micros().min(999_999);
        SECOND.with_borrow_mut(|(written, text)| {
            if *written == second {
                text.truncate(text.len() - FRACTION_LEN);
            } else {
                text.clear();
                write!(text, "{}", now.format("%Y-%m-%dT%H:%M:%S"))?;
                *written = second;
            }
            text.push('.');
            push_decimal(text, micros, 6);
            text.push('Z');
            w.write_str(text)
        })
    }
}

/// How long the log thread pauses after writing lines out: a line waits at most this long
/// before it is written, and under load the thread wakes about this often instead of once per
/// line.
pub const LINGER: Duration = Duration::from_millis(10);

/// The log thread's writer: `inner`, and after each write-out (`flush`, which the log thread
/// calls when it has taken every queued line) a pause of `linger`. Lines logged meanwhile wait
/// in the queue — bounded as the non-blocking writer is configured — without waking the thread.
pub struct Lingering<W> {
    inner: W,
    linger: Duration,
}

impl<W: io::Write> Lingering<W> {
    pub fn new(inner: W, linger: Duration) -> Self {
        Lingering { inner, linger }
    }
}

impl<W: io::Write> io::Write for Lingering<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()?;
        std::thread::sleep(self.linger);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(timer: impl FormatTime) -> String {
        let mut line = String::new();
        timer
            .format_time(&mut Writer::new(&mut line))
            .expect("format");
        line
    }

    #[test]
    fn lines_carry_the_time_as_the_default_timer_writes_it() {
        let default = written(tracing_subscriber::fmt::time::SystemTime);
        for _ in 0..2 {
            // The second time from the kept second.
            let ours = written(LineTime);
            assert_eq!(ours.len(), default.len(), "{ours} vs {default}");
            assert_eq!(ours.as_bytes()[19], b'.');
            assert!(ours.ends_with('Z'));
            let at = chrono::DateTime::parse_from_rfc3339(&ours).expect("RFC 3339");
            let theirs = chrono::DateTime::parse_from_rfc3339(&default).expect("RFC 3339");
            let apart = (at - theirs).num_milliseconds();
            assert!((0..5_000).contains(&apart), "{ours} vs {default}");
        }
    }

    /// A writer whose output the test reads after the log thread is gone.
    #[derive(Clone, Default)]
    struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl io::Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn every_line_reaches_the_output_in_order_when_the_log_thread_lingers() {
        use std::io::Write as _;
        let out = Shared::default();
        let (mut writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
            .lossy(false)
            .finish(Lingering::new(out.clone(), Duration::from_millis(5)));
        let lines: Vec<String> = (0..500).map(|i| format!("line {i}\n")).collect();
        for line in &lines {
            writer.write_all(line.as_bytes()).expect("queued");
        }
        // Dropping the guard writes out what is still queued, as the gateway does at exit.
        drop(guard);
        let written = String::from_utf8(out.0.lock().expect("lock").clone()).expect("text");
        assert_eq!(written, lines.concat());
    }
}
