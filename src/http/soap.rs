//! The SOAP-over-HTTP binding: which SOAP version a request speaks, and turning envelopes and
//! faults into HTTP responses with the right status and media type (digest §3.3).

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::wsr::{
    FaultCode, Headers, Response as WsrResponse, SoapFault, SoapVersion, write_envelope,
    write_soap_fault,
};

/// The SOAP version a request announces by its media type (SOAP 1.2 is
/// `application/soap+xml`, also as the `type` of a multipart/related body); SOAP 1.1 otherwise.
/// Used only when the envelope itself could not be read.
pub fn version_hint(headers: &HeaderMap) -> SoapVersion {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if ct.contains("application/soap+xml") {
        SoapVersion::Soap12
    } else {
        SoapVersion::Soap11
    }
}

pub fn content_type(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
}

/// An envelope answer.
pub fn envelope(status: StatusCode, version: SoapVersion, xml: String) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(version.content_type()),
        )],
        xml,
    )
        .into_response()
}

/// 202 with an empty body: accepted, nothing to say on this connection (WS-I R2714).
pub fn accepted() -> Response {
    StatusCode::ACCEPTED.into_response()
}

/// 200 with a `wsrm:Response` header and an empty Body, or 202 when there is nothing to say.
pub fn replies(version: SoapVersion, response: Option<WsrResponse>) -> Response {
    match response {
        None => accepted(),
        Some(r) => envelope(
            StatusCode::OK,
            version,
            write_envelope(
                version,
                Headers {
                    response: Some(&r),
                    ..Headers::default()
                },
                "",
            ),
        ),
    }
}

/// A SOAP Fault carrying a WS-R code; with `header`, a `wsrm:Response` with the matching fault
/// indication rides along (D4).
pub fn fault(
    version: SoapVersion,
    code: FaultCode,
    reason: &str,
    header: Option<WsrResponse>,
) -> Response {
    let fault = SoapFault {
        code,
        reason: reason.to_owned(),
    };
    let status = StatusCode::from_u16(fault.http_status(version))
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    envelope(
        status,
        version,
        write_soap_fault(version, &fault, header.as_ref()),
    )
}

/// Reads a request body into one buffer. Memory follows the bytes that actually arrive, not
/// the announced Content-Length: a body in one piece is kept as it is, one in several is
/// copied into a growing buffer piece by piece. More than `limit` + 1 bytes,
/// announced or received, is refused with 413 (the codec gives the exact limit its own
/// fault); a body the perimeter cut is answered 408 (too slow) or 503 (busy).
pub async fn read_body(
    headers: &HeaderMap,
    body: axum::body::Body,
    limit: usize,
) -> Result<axum::body::Bytes, axum::response::Response> {
    use futures_util::StreamExt as _;
    let cap = limit.saturating_add(1);
    let announced = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    let too_large = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a message may have at most {limit} bytes\n"),
        )
            .into_response()
    };
    if announced > cap {
        return Err(too_large());
    }
    // A body that comes in one piece is kept as it is; from the second piece on, pieces are
    // copied into one buffer as they arrive. Keeping the pieces instead would keep each one's
    // share of hyper's read buffer and a list entry per piece: a body sent as 1-byte chunks
    // would pin tens of times its size.
    let mut first: Option<axum::body::Bytes> = None;
    let mut buffer: Vec<u8> = Vec::new();
    let mut total = 0usize;
    let no_memory = || crate::http::serve::busy("not enough memory for this message now");
    let mut frames = body.into_data_stream();
    while let Some(frame) = frames.next().await {
        let chunk = frame.map_err(unreadable)?;
        total += chunk.len();
        if total > cap {
            return Err(too_large());
        }
        if chunk.is_empty() {
            continue;
        }
        let Some(kept) = first.take() else {
            if buffer.is_empty() {
                first = Some(chunk);
            } else {
                // Only if the memory is there: a refusal is a 503, never an abort.
                buffer.try_reserve(chunk.len()).map_err(|_| no_memory())?;
                buffer.extend_from_slice(&chunk);
            }
            continue;
        };
        buffer
            .try_reserve(kept.len() + chunk.len())
            .map_err(|_| no_memory())?;
        buffer.extend_from_slice(&kept);
        buffer.extend_from_slice(&chunk);
    }
    Ok(match first {
        Some(only) => only,
        None => buffer.into(),
    })
}

/// The answer to a body that could not be read: the perimeter's own refusals get their status.
fn unreadable(e: axum::Error) -> axum::response::Response {
    use crate::http::serve::{BodyRefused, busy};
    let cause = e.into_inner();
    // The refusal may come wrapped (axum's body limit boxes the errors it passes on).
    let mut refused = None;
    let mut link: Option<&(dyn std::error::Error + 'static)> = Some(&*cause);
    while let Some(error) = link {
        if let Some(r) = error.downcast_ref::<BodyRefused>() {
            refused = Some(*r);
            break;
        }
        link = error.source();
    }
    match refused {
        Some(BodyRefused::TooSlow) => (
            StatusCode::REQUEST_TIMEOUT,
            format!("{}\n", BodyRefused::TooSlow),
        )
            .into_response(),
        Some(BodyRefused::OverBudget) => busy(&BodyRefused::OverBudget.to_string()),
        None => (
            StatusCode::BAD_REQUEST,
            format!("cannot read the request body: {cause}\n"),
        )
            .into_response(),
    }
}
