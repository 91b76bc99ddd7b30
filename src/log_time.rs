//! The time at the start of every log line: RFC 3339 in UTC with microseconds, exactly as
//! `tracing-subscriber`'s own `SystemTime` writes it — but the date and time of day are
//! formatted once a second on each thread instead of through `core::fmt` for every line (an
//! access line is written for every request; the default timer was a sixth of its cost).

use std::cell::RefCell;
use std::fmt::{self, Write as _};

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
}
