//! Traces across the message path (issue 34): OpenTelemetry spans, exported by OTLP over HTTP
//! when `otlp_endpoint` is set — off by default, and then nothing is contacted and nothing is
//! stored for them. A W3C `traceparent` sent with a request is continued; a message's trace
//! context is kept beside it (`store::traces`), so that a consumer's fetch and settle, a push
//! and our sends of it to a partner (which carry `traceparent`) join the trace it came in on.
//!
//! The spans themselves are plain `tracing` spans (`receive`, `delivery.fetch`, …); the layer
//! made here turns them into OpenTelemetry spans. Everything else here is the W3C text form of
//! a span's context, read and written with OpenTelemetry's own propagator.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// Whether spans are exported: only then is a message's trace context worth keeping.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// How long one export may take before it is given up (spans are dropped, never retried
/// without bound).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how spans go (`otlp_endpoint`, `otlp_protocol`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpConfig {
    /// The collector's traces URL, e.g. `http://collector:4318/v1/traces`.
    pub endpoint: String,
    /// `http/protobuf` (OTLP's default) or `http/json`.
    pub json: bool,
}

/// The exporting tracer; `shutdown` sends what is left.
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// Sends the spans still queued and stops exporting (at the end of `serve`).
    pub async fn shutdown(self) {
        let provider = self.provider;
        // The processor's shutdown blocks until its task has exported: off the runtime's
        // worker threads, and bounded.
        let done = tokio::task::spawn_blocking(move || provider.shutdown());
        match tokio::time::timeout(EXPORT_TIMEOUT, done).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "the last spans were not exported"),
            Ok(Err(_)) | Err(_) => tracing::warn!("the last spans were not exported in time"),
        }
        ENABLED.store(false, Ordering::Relaxed);
    }
}

/// The layer that exports every span to `config`'s collector. Must be called inside the Tokio
/// runtime (the exporter's batches run on it).
pub fn layer<S>(config: &OtlpConfig) -> anyhow::Result<(impl tracing_subscriber::Layer<S>, Traces)>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let client = reqwest::Client::builder()
        .timeout(EXPORT_TIMEOUT)
        // The collector is where the operator said, never somewhere it redirects to.
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .context("cannot build the OTLP exporter's HTTP client")?;
    let protocol = if config.json {
        Protocol::HttpJson
    } else {
        Protocol::HttpBinary
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_endpoint(config.endpoint.clone())
        .with_protocol(protocol)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .context("cannot build the OTLP span exporter")?;
    let processor =
        opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
            exporter,
            opentelemetry_sdk::runtime::Tokio,
        )
        .build();
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("wsr-gateway")
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("wsr-gateway");
    ENABLED.store(true, Ordering::Relaxed);
    let layer = tracing_opentelemetry::layer().with_tracer(tracer);
    Ok((layer, Traces { provider }))
}

/// An INFO span of the message path when traces are exported, else `Span::none()` (free):
/// the log lines need none of these, and a message should not pay for them when nobody
/// collects them.
macro_rules! traced {
    ($name:literal $(, $($fields:tt)*)?) => {
        if $crate::telemetry::enabled() {
            tracing::info_span!($name $(, $($fields)*)?)
        } else {
            tracing::Span::none()
        }
    };
}
pub(crate) use traced;

/// A span of work done for one stored message, e.g. its fetch or an attempt to send it: made
/// a child of the trace context `parent` reads (the one the message came in with, kept by the
/// store). `parent` is not even polled while traces are off (`span` is then `Span::none()`);
/// a context that cannot be read leaves `span` a trace of its own.
pub async fn child_of<E: std::fmt::Display>(
    span: tracing::Span,
    parent: impl std::future::Future<Output = Result<Option<String>, E>>,
) -> tracing::Span {
    if span.is_none() {
        return span;
    }
    let parent = parent.await.unwrap_or_else(|e| {
        tracing::debug!(error = %e, "a message's trace context could not be read");
        None
    });
    continue_trace(&span, parent.as_deref(), None);
    span
}

/// `request` carrying `span`'s `traceparent` (when traces are exported), so that the peer —
/// a partner, a webhook, a callback endpoint — may go on with the trace.
pub fn with_traceparent(
    request: reqwest::RequestBuilder,
    span: &tracing::Span,
) -> reqwest::RequestBuilder {
    match traceparent_of(span) {
        Some(traceparent) => request.header("traceparent", traceparent),
        None => request,
    }
}

/// Whether spans are exported (and trace contexts worth keeping).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The W3C `traceparent` of `span`, when traces are exported and it has a valid context.
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    if !enabled() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    carrier.remove("traceparent")
}

/// The current span's `traceparent` (`traceparent_of`).
pub fn current_traceparent() -> Option<String> {
    traceparent_of(&tracing::Span::current())
}

/// Makes `span` a child of the remote span `traceparent` names (with its `tracestate`), when
/// it is a valid one; anything else leaves `span` where it was (a new trace).
pub fn continue_trace(span: &tracing::Span, traceparent: Option<&str>, tracestate: Option<&str>) {
    let Some(traceparent) = traceparent.filter(|_| enabled()) else {
        return;
    };
    let mut carrier = HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    if let Some(state) = tracestate {
        carrier.insert("tracestate".to_owned(), state.to_owned());
    }
    let cx = TraceContextPropagator::new().extract(&carrier);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// `continue_trace` from a request's `traceparent` and `tracestate` headers.
pub fn continue_from_headers(span: &tracing::Span, headers: &axum::http::HeaderMap) {
    if !enabled() {
        return;
    }
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    continue_trace(span, text("traceparent"), text("tracestate"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_kept_or_continued_while_traces_are_off() {
        assert!(!enabled());
        let span = tracing::info_span!("off");
        assert_eq!(traceparent_of(&span), None);
        continue_trace(
            &span,
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            None,
        );
        assert_eq!(traceparent_of(&span), None);
    }
}
