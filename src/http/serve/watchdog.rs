//! A connection's watchdog: which phase it is in (waiting for a request head, idle, busy with
//! requests) and when that phase has lasted longer than its timeout allows. It only watches;
//! it never reads, changes or answers a request.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The state of one connection, as far as its timeouts care.
pub(super) struct Watch {
    state: Mutex<Phase>,
    changed: Notify,
}

#[derive(Clone, Copy)]
enum Phase {
    /// Waiting for a request head whose first byte (or the accept) came at this instant.
    Head(Instant),
    /// No request open, nothing of the next one received, since this instant.
    Idle(Instant),
    /// This many requests are being handled or answered (their own timeouts apply).
    Busy(usize),
}

impl Watch {
    pub(super) fn new() -> Watch {
        Watch {
            // A fresh connection must send its first head within the header timeout.
            state: Mutex::new(Phase::Head(Instant::now())),
            changed: Notify::new(),
        }
    }

    fn update(&self, change: impl FnOnce(Phase) -> Phase) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        *state = change(*state);
        drop(state);
        self.changed.notify_one();
    }

    fn phase(&self) -> Phase {
        *self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn read_bytes(&self) {
        if matches!(self.phase(), Phase::Idle(_)) {
            self.update(|p| match p {
                Phase::Idle(_) => Phase::Head(Instant::now()),
                other => other,
            });
        }
    }

    /// Completes when the connection has waited longer than its phase allows.
    pub(super) async fn expired(&self, header: Duration, idle: Duration) -> &'static str {
        let deadline = |phase| match phase {
            Phase::Head(since) => Some((since + header, "header timeout")),
            Phase::Idle(since) => Some((since + idle, "idle timeout")),
            Phase::Busy(_) => None,
        };
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let Some((at, _)) = deadline(self.phase()) else {
                changed.await;
                continue;
            };
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep_until(at) => {
                    // The phase may have moved on just as the timer fired.
                    if let Some((at, why)) = deadline(self.phase())
                        && at <= Instant::now() {
                            return why;
                        }
                }
            }
        }
    }
}

/// Marks a request open on its connection until its answer has been written (or dropped).
pub(super) struct OpenRequest(Arc<Watch>);

impl OpenRequest {
    pub(super) fn new(watch: Arc<Watch>) -> OpenRequest {
        watch.update(|p| match p {
            Phase::Busy(n) => Phase::Busy(n + 1),
            _ => Phase::Busy(1),
        });
        OpenRequest(watch)
    }
}

impl Drop for OpenRequest {
    fn drop(&mut self) {
        self.0.update(|p| match p {
            Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
            _ => Phase::Idle(Instant::now()),
        });
    }
}

/// The socket, telling the watch when bytes arrive.
pub(super) struct Watched<IO> {
    pub(super) io: IO,
    pub(super) watch: Arc<Watch>,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.io).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            self.watch.read_bytes();
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
