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

/// The action a request names: SOAP 1.1's `SOAPAction` header as sent, or SOAP 1.2's
/// `action` parameter of its media type.
pub fn soap_action(headers: &HeaderMap) -> Option<&str> {
    if let Some(action) = headers.get("soapaction").and_then(|v| v.to_str().ok()) {
        return Some(action);
    }
    crate::wsr::mime::parameter(content_type(headers)?, "action")
}

/// A request-response channel's answer (D16): the bytes kept for the request, as they are.
pub fn business(answer: crate::store::CachedAnswer) -> Response {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::OK);
    let content_type = HeaderValue::from_str(&answer.content_type)
        .unwrap_or_else(|_| HeaderValue::from_static("text/xml; charset=utf-8"));
    (status, [(header::CONTENT_TYPE, content_type)], answer.body).into_response()
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

/// Reads a request body into one buffer, copying each byte at most once (how `/wsr/{channel}`
/// and `/wsr/_callback` take their bodies, so memory follows the bytes received on both). A
/// body that arrives in one piece is kept as it came (no copy). Otherwise the pieces are
/// appended to one buffer reserved from the announced Content-Length, which is trusted only up
/// to `limit` + 1 (more is refused before a byte is read); without one the buffer grows with
/// the bytes received. The reservation is address space: resident memory still follows the
/// bytes that actually arrive, which the perimeter's byte budget counts. More than `limit` + 1
/// bytes, announced or received, is refused with 413 (the codec gives the exact limit its own
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
        .and_then(|v| v.parse::<usize>().ok());
    let too_large = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a message may have at most {limit} bytes\n"),
        )
            .into_response()
    };
    if announced.is_some_and(|n| n > cap) {
        return Err(too_large());
    }
    let mut whole = Whole::new(announced);
    let mut frames = body.into_data_stream();
    while let Some(frame) = frames.next().await {
        let chunk = frame.map_err(unreadable)?;
        if whole.len().saturating_add(chunk.len()) > cap {
            return Err(too_large());
        }
        whole.add(chunk).map_err(|()| no_memory())?;
    }
    // The body's share of the perimeter's byte budget is given back once it is complete.
    drop(frames);
    Ok(whole.into_bytes())
}

/// The answer when a body cannot be held now: a 503, never an abort.
fn no_memory() -> axum::response::Response {
    crate::http::serve::busy("not enough memory for this message now")
}

/// A body being received (see `read_body`): its first piece while it is the only one, then one
/// buffer that every piece is appended to.
struct Whole {
    /// The announced length (already checked against the limit): what the buffer reserves.
    announced: Option<usize>,
    /// The first piece while it is the only one (a body in one piece is never copied).
    only: Option<axum::body::Bytes>,
    buffer: Vec<u8>,
}

impl Whole {
    fn new(announced: Option<usize>) -> Whole {
        Whole {
            announced,
            only: None,
            buffer: Vec::new(),
        }
    }

    fn len(&self) -> usize {
        self.only.as_ref().map_or(self.buffer.len(), |b| b.len())
    }

    /// Takes one piece in; `Err` when the memory for the buffer is not there.
    fn add(&mut self, piece: axum::body::Bytes) -> Result<(), ()> {
        if piece.is_empty() {
            return Ok(());
        }
        if self.only.is_none() && self.buffer.capacity() == 0 {
            self.only = Some(piece);
            return Ok(());
        }
        if let Some(first) = self.only.take() {
            // The second piece: the buffer is made now, once, for the whole announced body
            // (or for what has come so far when nothing was announced).
            let want = self
                .announced
                .unwrap_or(0)
                .max(first.len().saturating_add(piece.len()));
            self.buffer.try_reserve_exact(want).map_err(|_| ())?;
            self.buffer.extend_from_slice(&first);
        }
        // Grows only without (or beyond a lying) Content-Length; hyper stops a body at its
        // announced length, so with one this never reallocates.
        self.buffer.try_reserve(piece.len()).map_err(|_| ())?;
        self.buffer.extend_from_slice(&piece);
        Ok(())
    }

    /// The whole body; a buffer is handed over as it is (no copy, spare capacity included).
    fn into_bytes(self) -> axum::body::Bytes {
        match self.only {
            Some(only) => only,
            None => self.buffer.into(),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_with_a_content_length_is_read_into_one_buffer_allocated_once() {
        let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut whole = Whole::new(Some(body.len()));
        for piece in body.chunks(1000) {
            whole
                .add(axum::body::Bytes::copy_from_slice(piece))
                .expect("memory");
        }
        // Reserved once for the announced length at the second piece and never grown: a
        // buffer that had grown by doubling would have more capacity than the body.
        assert_eq!(whole.buffer.capacity(), body.len(), "allocated once");
        let at = whole.buffer.as_ptr();
        let read = whole.into_bytes();
        assert_eq!(read.as_ptr(), at, "handed over without a copy");
        assert_eq!(&read[..], &body[..]);
    }

    #[test]
    fn without_a_content_length_the_buffer_grows_with_the_bytes() {
        let mut whole = Whole::new(None);
        for _ in 0..1000 {
            whole
                .add(axum::body::Bytes::from_static(&[b'x'; 100]))
                .expect("memory");
        }
        assert_eq!(whole.len(), 100_000);
        assert!(whole.buffer.capacity() < 2 * 100_000 + 100);
        assert!(whole.into_bytes().iter().all(|&b| b == b'x'));
    }

    #[tokio::test]
    async fn a_body_in_many_pieces_reads_whole_and_one_piece_is_kept_as_it_came() {
        let pieces: Vec<Result<axum::body::Bytes, std::io::Error>> = (0..100_000u32)
            .map(|i| Ok(axum::body::Bytes::from(vec![(i % 7) as u8 + b'a'])))
            .collect();
        let expected: Vec<u8> = (0..100_000u32).map(|i| (i % 7) as u8 + b'a').collect();
        let body = axum::body::Body::from_stream(futures_util::stream::iter(pieces));
        let read = read_body(&HeaderMap::new(), body, 1 << 20)
            .await
            .expect("read");
        assert_eq!(&read[..], &expected[..]);
        let one = axum::body::Bytes::from_static(b"<e/>");
        let read = read_body(&HeaderMap::new(), axum::body::Body::from(one.clone()), 100)
            .await
            .expect("read");
        assert_eq!(read.as_ptr(), one.as_ptr(), "not copied");
        let over = axum::body::Body::from(vec![b'x'; 102]);
        let refused = read_body(&HeaderMap::new(), over, 100)
            .await
            .expect_err("413");
        assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }
}
