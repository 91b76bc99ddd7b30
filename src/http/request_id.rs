//! The request id: taken from a sane incoming `X-Request-Id` (a proxy's or the client's, so
//! that one id follows a request across systems) or made here (UUID v7), returned in the
//! response's `X-Request-Id`, and carried by a tracing span around the request, so that every
//! log line the request causes names it.

use std::future::Future;

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::response::Response;
use tracing::Instrument as _;

pub const HEADER: &str = "x-request-id";

/// The longest incoming id kept: enough for any UUID or trace id, short enough that a hostile
/// one cannot bloat every log line of its request.
const MAX_LEN: usize = 128;

/// Runs `handler` with the request's id in its headers, its span around it, and the id in the
/// response (called by `http::framed`, around every request).
pub async fn within<F, Fut>(mut request: Request, handler: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: Future<Output = Response>,
{
    let id = request
        .headers()
        .get(HEADER)
        .and_then(|v| sane(v.as_bytes()))
        .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    // Handlers and logs downstream see the id we use, not one we refused.
    let value = HeaderValue::from_str(&id).ok();
    if let Some(v) = &value {
        request.headers_mut().insert(HEADER, v.clone());
    }
    let span = tracing::info_span!("request", request_id = %id);
    // A caller's W3C trace goes on through us (traces exported only).
    crate::telemetry::continue_from_headers(&span, request.headers());
    let mut response = handler(request).instrument(span).await;
    if let Some(v) = value {
        response.headers_mut().insert(HEADER, v);
    }
    response
}

/// An incoming id worth keeping: 1 to `MAX_LEN` visible ASCII characters (no spaces, no
/// control characters: it goes into log lines as it is).
fn sane(raw: &[u8]) -> Option<String> {
    let ok = !raw.is_empty() && raw.len() <= MAX_LEN && raw.iter().all(|b| b.is_ascii_graphic());
    ok.then(|| String::from_utf8_lossy(raw).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_short_visible_ascii_ids_are_kept() {
        assert_eq!(sane(b"abc-123").as_deref(), Some("abc-123"));
        assert_eq!(sane(b""), None);
        assert_eq!(sane(b"has space"), None);
        assert_eq!(sane(b"line\nbreak"), None);
        assert_eq!(sane("caf\u{e9}".as_bytes()), None);
        assert_eq!(sane(&[b'a'; MAX_LEN]).map(|s| s.len()), Some(MAX_LEN));
        assert_eq!(sane(&[b'a'; MAX_LEN + 1]), None);
    }
}
