//! The bodies on a connection: a request body under the body timeout, the minimum rate and the
//! shared byte budget on its way in, and a response body that keeps its request open until it
//! is sent. They count and time bytes; they never look at what the bytes say.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use super::classes::Admitted;
use super::watchdog::OpenRequest;
use crate::http::slots::{KeyedSlot, KeyedSlots};

/// Why the perimeter refused a request body; `read_body` turns it into its status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyRefused {
    /// It paused longer than `body_timeout` or fell below `body_min_bytes_per_second`.
    TooSlow,
    /// Bodies being received already hold `max_body_bytes_in_flight`, or this client's
    /// share of it.
    OverBudget,
}

impl std::fmt::Display for BodyRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BodyRefused::TooSlow => "the request body arrived too slowly",
            BodyRefused::OverBudget => "too many request bodies are being received now",
        })
    }
}

impl std::error::Error for BodyRefused {}

/// Each source address's share of the body budget, and whose this body is.
pub(super) struct SourceShares {
    pub slots: Arc<KeyedSlots>,
    pub source: String,
}

/// A response body that keeps its request open on the connection, and its class slot taken,
/// until it has been sent.
pub(super) struct Tracked {
    body: Body,
    _open: OpenRequest,
    /// The request's slot of its class (`classes.rs`): an answer that streams (an event
    /// stream) holds it until its last byte.
    _admitted: Option<Admitted>,
}

impl Tracked {
    pub(super) fn new(body: Body, open: OpenRequest, admitted: Option<Admitted>) -> Tracked {
        Tracked {
            body,
            _open: open,
            _admitted: admitted,
        }
    }
}

impl HttpBody for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body under the body timeout, the minimum rate and the shared byte budget.
///
/// The body is cut when the next piece takes longer than `pause` to come, or when fewer than
/// `min_rate` × `pause` bytes come within one window of `pause`: the rate is kept in every
/// window, not as an average since the start, which a fast start would bank for hours of
/// trickling while holding its share of the budget. Every byte received takes its share of
/// `budget` until the body is dropped, so bodies that stall hold at most the budget between
/// them, whatever they announced — and each source address at most its share of it
/// (`max_body_bytes_in_flight_per_source`), so that one client's stalled bodies cannot hold
/// the whole budget.
pub(super) struct TimedBody {
    inner: Incoming,
    pause: Duration,
    min_rate: u64,
    budget: Arc<Semaphore>,
    held: Option<OwnedSemaphorePermit>,
    shares: SourceShares,
    share: Option<KeyedSlot>,
    /// When the current window began (the first read, or when the last one met its quota).
    window_start: Option<Instant>,
    /// Bytes received in the current window.
    window_bytes: u64,
    waiting: bool,
    timer: Pin<Box<Sleep>>,
}

impl TimedBody {
    /// A fresh body: nothing received, no window started, no share of the budget held.
    pub(super) fn new(
        inner: Incoming,
        pause: Duration,
        min_rate: u64,
        budget: Arc<Semaphore>,
        shares: SourceShares,
    ) -> TimedBody {
        TimedBody {
            inner,
            pause,
            min_rate,
            budget,
            held: None,
            shares,
            share: None,
            window_start: None,
            window_bytes: 0,
            waiting: false,
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
        }
    }

    /// Bytes one window must bring.
    fn window_quota(&self) -> u64 {
        let millis = u64::try_from(self.pause.as_millis()).unwrap_or(u64::MAX);
        self.min_rate.saturating_mul(millis) / 1000
    }

    fn deadline(&self, now: Instant, window_start: Instant) -> Instant {
        if self.min_rate == 0 {
            return now + self.pause;
        }
        // The window's end comes no later than `now + pause`: it also bounds the gap.
        window_start + self.pause
    }

    /// Takes `bytes` more of the budget and of the source's share; false when either is spent.
    fn hold(&mut self, bytes: usize) -> bool {
        let grown = match &mut self.share {
            Some(share) => share.grow(bytes),
            None => {
                self.share = self.shares.slots.take_many(&self.shares.source, bytes);
                self.share.is_some()
            }
        };
        if !grown {
            return false;
        }
        let count = u32::try_from(bytes).unwrap_or(u32::MAX);
        match self.budget.clone().try_acquire_many_owned(count) {
            Ok(permit) => match &mut self.held {
                Some(held) => held.merge(permit),
                None => self.held = Some(permit),
            },
            Err(_) => return false,
        }
        true
    }

    /// Counts a piece into the window; a window whose quota is met starts the next one.
    fn count(&mut self, bytes: usize, now: Instant) {
        self.window_bytes = self.window_bytes.saturating_add(bytes as u64);
        if self.window_bytes >= self.window_quota() {
            self.window_start = Some(now);
            self.window_bytes = 0;
        }
    }
}

impl HttpBody for TimedBody {
    type Data = axum::body::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if !this.waiting {
            let now = Instant::now();
            let window_start = *this.window_start.get_or_insert(now);
            let deadline = this.deadline(now, window_start);
            this.timer.as_mut().reset(deadline);
            this.waiting = true;
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.waiting = false;
                if let Some(data) = frame.data_ref() {
                    let bytes = data.len();
                    this.count(bytes, Instant::now());
                    if !this.hold(bytes) {
                        return Poll::Ready(Some(Err(BodyRefused::OverBudget.into())));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
                this.waiting = false;
                Poll::Ready(None)
            }
            Poll::Pending => {
                if this.timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Some(Err(BodyRefused::TooSlow.into())));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
