//! How log lines are timed and written out.
//!
//! The time at the start of every line is RFC 3339 in UTC with microseconds, exactly as
//! `tracing-subscriber`'s own `SystemTime` writes it — but the date and time of day are
//! formatted once a second on each thread instead of through `core::fmt` for every line (an
//! access line is written for every request; the default timer was a sixth of its cost).
//!
//! The fields of a plain-text line (`LineFields`) are written as `tracing-subscriber`'s
//! `DefaultFields` writes them, byte for byte — but a name with a plain string or a number is
//! written straight, where the default goes through `core::fmt` three times for each field
//! (name, `=`, value); the message, and a string its `Debug` would escape, are handed to the
//! default's own visitor.
//!
//! Lines go to standard output from the log thread (`tracing-appender`'s non-blocking
//! writer), which writes out whatever is queued each time it wakes. Woken for every line, it
//! cost a thread switch and a `write` per request; `Lingering` makes it pause after each
//! write-out, so that under load it finds many lines queued and a request's line costs neither.

use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::io;
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};
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

/// The plain-text lines' field formatter (`fmt::layer().fmt_fields(LineFields)`): the
/// output of `DefaultFields`, with the common fields written without `core::fmt`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LineFields;

impl<'a> MakeVisitor<Writer<'a>> for LineFields {
    type Visitor = LineVisitor<'a>;

    fn make_visitor(&self, writer: Writer<'a>) -> LineVisitor<'a> {
        LineVisitor {
            writer,
            is_empty: true,
            result: Ok(()),
        }
    }
}

/// Writes one line's (or span's) fields for `LineFields`.
pub struct LineVisitor<'a> {
    writer: Writer<'a>,
    /// No field written yet: the next one needs no separating space.
    is_empty: bool,
    result: fmt::Result,
}

impl LineVisitor<'_> {
    /// Whether `field` is written as `name=value`, with nothing done to its name: the
    /// message is written bare (and escaped), a raw identifier loses its `r#`, and colours
    /// would wrap the name.
    fn plain_name(&self, field: &Field) -> bool {
        let name = field.name();
        name != "message" && !name.starts_with("r#") && !self.writer.has_ansi_escapes()
    }

    /// Writes `name=` and then the value by `value`, after a space unless it is the first.
    fn straight(&mut self, field: &Field, value: impl FnOnce(&mut Writer<'_>) -> fmt::Result) {
        if self.result.is_err() {
            return;
        }
        let w = &mut self.writer;
        let separator = if self.is_empty { "" } else { " " };
        self.is_empty = false;
        self.result = (|| {
            w.write_str(separator)?;
            w.write_str(field.name())?;
            w.write_char('=')?;
            value(w)
        })();
    }

    /// Lets the default's visitor write one field, where it continues this line.
    fn by_default(&mut self, record: impl FnOnce(&mut DefaultVisitor<'_>)) {
        if self.result.is_err() {
            return;
        }
        let mut default = DefaultVisitor::new(self.writer.by_ref(), self.is_empty);
        record(&mut default);
        self.result = default.finish();
        // The default writes every field it is given (no `log.` fields without `tracing-log`).
        self.is_empty = false;
    }

    fn number(&mut self, field: &Field, negative: bool, magnitude: u64) {
        self.straight(field, |w| {
            if negative {
                w.write_char('-')?;
            }
            w.write_str(decimal(magnitude, &mut [0; 20]))
        });
    }
}

/// `value` in decimal, in `digits`.
fn decimal(mut value: u64, digits: &mut [u8; 20]) -> &str {
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    std::str::from_utf8(&digits[start..]).unwrap_or_default()
}

/// Whether `str`'s `Debug` writes `value` as it is between its quotes: printable ASCII
/// other than `"` and `\` (everything else it may escape).
fn debug_writes_unchanged(value: &str) -> bool {
    value
        .bytes()
        .all(|b| matches!(b, b' '..=b'~') && b != b'"' && b != b'\\')
}

impl Visit for LineVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.plain_name(field) && debug_writes_unchanged(value) {
            self.straight(field, |w| {
                w.write_char('"')?;
                w.write_str(value)?;
                w.write_char('"')
            });
        } else {
            self.by_default(|d| d.record_str(field, value));
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        match self.plain_name(field) {
            true => self.number(field, false, value),
            false => self.by_default(|d| d.record_u64(field, value)),
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        match self.plain_name(field) {
            true => self.number(field, value < 0, value.unsigned_abs()),
            false => self.by_default(|d| d.record_i64(field, value)),
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        match self.plain_name(field) {
            true => self.straight(field, |w| w.write_str(if value { "true" } else { "false" })),
            false => self.by_default(|d| d.record_bool(field, value)),
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.by_default(|d| d.record_error(field, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // A `%display` or `?debug` field: one `write!` for the value where the default
        // makes three (name, `=`, value).
        match self.plain_name(field) {
            true => self.straight(field, |w| write!(w, "{value:?}")),
            false => self.by_default(|d| d.record_debug(field, value)),
        }
    }
}

impl VisitOutput<fmt::Result> for LineVisitor<'_> {
    fn finish(self) -> fmt::Result {
        self.result
    }
}

impl VisitFmt for LineVisitor<'_> {
    fn writer(&mut self) -> &mut dyn fmt::Write {
        &mut self.writer
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

    /// What a subscriber with `fields` (no time, no colours) writes for `emit`.
    fn lines_with<N>(fields: N, emit: impl FnOnce()) -> String
    where
        N: for<'w> tracing_subscriber::fmt::FormatFields<'w> + Send + Sync + 'static,
    {
        let out = Shared::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .without_time()
            .with_ansi(false)
            .fmt_fields(fields)
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        let written = out.0.lock().expect("lock").clone();
        String::from_utf8(written).expect("text")
    }

    #[test]
    fn line_fields_write_what_the_default_fields_write() {
        let emit = || {
            let span = tracing::info_span!("request", request_id = %"0193-ab", r#type = "x");
            let _inside = span.enter();
            let error = std::io::Error::other("disk \"full\"");
            tracing::info!(
                target: "wsr_gateway::access",
                peer = tracing::field::display("127.0.0.1:9"),
                partner = "anonymous",
                quoted = "say \"hi\"",
                slash = "a\\b",
                accented = "caf\u{e9}",
                control = "tab\there\u{1b}[31m",
                empty = "",
                number = Some(7u64),
                absent = None::<u64>,
                status = 202u16,
                below = -42i64,
                least = i64::MIN,
                most = u64::MAX,
                zero = 0u64,
                yes = true,
                no = false,
                ratio = 0.5f64,
                debugged = ?("a", 1),
                error = &error as &(dyn std::error::Error + 'static),
                r#type = "raw",
                "wsr \"request\" \u{1b}[2J"
            );
            tracing::warn!(only = "one");
            tracing::info!("a message alone");
        };
        let default = lines_with(tracing_subscriber::fmt::format::DefaultFields::new(), emit);
        let ours = lines_with(LineFields, emit);
        assert_eq!(ours, default);
        // The lines hold what the fast paths write, so the comparison covered them.
        assert!(ours.contains(r#" partner="anonymous" "#), "{ours}");
        assert!(ours.contains(" number=7 status=202 below=-42 "), "{ours}");
        assert!(ours.contains(" yes=true no=false "), "{ours}");
        assert_eq!(ours.lines().count(), 3, "{ours}");
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
