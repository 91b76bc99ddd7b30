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

/// A SOAP request's body, read by `read_body` up to `max_message_bytes`: how `/wsr/{channel}`
/// and `/wsr/_callback` take their bodies, so memory follows the bytes received on both.
pub struct SoapBody(pub axum::body::Bytes);

impl axum::extract::FromRequest<super::AppState> for SoapBody {
    type Rejection = Response;

    async fn from_request(
        request: axum::extract::Request,
        app: &super::AppState,
    ) -> Result<SoapBody, Response> {
        let (parts, body) = request.into_parts();
        read_body(&parts.headers, body, app.config.limits.max_bytes)
            .await
            .map(SoapBody)
    }
}

/// Reads a request body into one buffer. Memory follows the bytes that actually arrive, not
/// the announced Content-Length (see `Pieces`): a body in one piece is kept as it is. More
/// than `limit` + 1 bytes, announced or received, is refused with 413 (the codec gives the
/// exact limit its own fault); a body the perimeter cut is answered 408 (too slow) or 503
/// (busy).
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
    // Pieces of a fair size are kept as they came (no copy); small ones are copied into blocks
    // of a fixed size as they arrive. Keeping every piece would keep a list entry and a share
    // of hyper's read buffer per piece: a body sent as 1-byte chunks pinned tens of times its
    // size. Once the body is complete it is copied into one buffer (not at all if it came in
    // one piece).
    let mut pieces = Pieces::default();
    let mut total = 0usize;
    let mut frames = body.into_data_stream();
    while let Some(frame) = frames.next().await {
        let chunk = frame.map_err(unreadable)?;
        total += chunk.len();
        if total > cap {
            return Err(too_large());
        }
        pieces.add(chunk).map_err(|()| no_memory())?;
    }
    // The body's share of the perimeter's byte budget is given back before the copy.
    drop(frames);
    pieces.into_one(total).map_err(|()| no_memory())
}

/// The answer when a body cannot be held now: a 503, never an abort.
fn no_memory() -> axum::response::Response {
    crate::http::serve::busy("not enough memory for this message now")
}

/// A body being received (see `read_body`): kept pieces and filled blocks, in order, and the
/// block being filled.
#[derive(Default)]
struct Pieces {
    /// The first piece while it is the only one (a body in one piece is never copied).
    only: Option<axum::body::Bytes>,
    done: Vec<axum::body::Bytes>,
    filling: Vec<u8>,
}

impl Pieces {
    /// Blocks small pieces are copied into.
    const BLOCK: usize = 64 * 1024;
    /// Pieces this large are kept as they came.
    const KEEP: usize = 16 * 1024;

    /// Takes one piece in; `Err` when the memory for a block is not there.
    fn add(&mut self, piece: axum::body::Bytes) -> Result<(), ()> {
        if piece.is_empty() {
            return Ok(());
        }
        if self.only.is_none() && self.done.is_empty() && self.filling.is_empty() {
            self.only = Some(piece);
            return Ok(());
        }
        if let Some(first) = self.only.take() {
            self.store(first)?;
        }
        self.store(piece)
    }

    fn store(&mut self, piece: axum::body::Bytes) -> Result<(), ()> {
        if piece.len() >= Self::KEEP {
            self.close_block();
            self.done.push(piece);
            return Ok(());
        }
        let mut data = &piece[..];
        while !data.is_empty() {
            if self.filling.capacity() == self.filling.len() {
                self.close_block();
                self.filling
                    .try_reserve_exact(Self::BLOCK)
                    .map_err(|_| ())?;
            }
            let room = self.filling.capacity() - self.filling.len();
            let (now, later) = data.split_at(room.min(data.len()));
            self.filling.extend_from_slice(now);
            data = later;
        }
        Ok(())
    }

    fn close_block(&mut self) {
        if !self.filling.is_empty() {
            self.done.push(std::mem::take(&mut self.filling).into());
        }
    }

    /// The whole body of `total` bytes in one buffer; each piece is freed once copied.
    fn into_one(mut self, total: usize) -> Result<axum::body::Bytes, ()> {
        if let Some(only) = self.only.take() {
            return Ok(only);
        }
        self.close_block();
        if self.done.len() <= 1 {
            return Ok(self.done.pop().unwrap_or_default());
        }
        let mut buffer: Vec<u8> = Vec::new();
        buffer.try_reserve_exact(total).map_err(|_| ())?;
        for piece in self.done.drain(..) {
            buffer.extend_from_slice(&piece);
        }
        Ok(buffer.into())
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
    fn small_pieces_are_copied_into_whole_blocks_large_ones_kept() {
        let mut pieces = Pieces::default();
        let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        for byte in &body {
            pieces
                .add(axum::body::Bytes::copy_from_slice(std::slice::from_ref(
                    byte,
                )))
                .expect("memory");
        }
        // 200 000 one-byte pieces take four 64 KiB blocks, not 200 000 entries.
        pieces.close_block();
        assert_eq!(pieces.done.len(), body.len().div_ceil(Pieces::BLOCK));
        let large = axum::body::Bytes::from(vec![b'L'; Pieces::KEEP]);
        pieces.add(large.clone()).expect("memory");
        assert_eq!(
            pieces.done.last().map(|p| p.as_ptr()),
            Some(large.as_ptr()),
            "kept"
        );
        let whole = pieces.into_one(body.len() + large.len()).expect("memory");
        assert_eq!(&whole[..body.len()], &body[..]);
        assert_eq!(&whole[body.len()..], &large[..]);
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
