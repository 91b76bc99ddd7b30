//! The HTTP ceiling: a trivial bare-hyper HTTP/1.1 server in this process (keep-alive, one
//! task per connection) that reads each request body and answers with a canned WS-R
//! acknowledgement echoing the request's groupId; nothing else is parsed or stored. Loaded by
//! the same lean client as the gateway rows, it shows what that client and an HTTP stack alone
//! can do on this machine.

use std::convert::Infallible;
use std::net::SocketAddr;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const SOAP11_NS: &str = "http://schemas.xmlsoap.org/soap/envelope/";
const SOAP12_NS: &str = "http://www.w3.org/2003/05/soap-envelope";
const WSRM_NS: &str = "http://docs.oasis-open.org/wsrm/2004/06/ws-reliability-1.1.xsd";

/// Accepts on `listener` until `stopped`, one task per keep-alive HTTP/1.1 connection, each
/// request answered by `handler` (the ceiling's and the request-response rows' services).
pub async fn accept_until<F, Fut>(
    listener: TcpListener,
    mut stopped: oneshot::Receiver<()>,
    handler: F,
) where
    F: Fn(Request<Incoming>) -> Fut + Copy + Send + 'static,
    Fut: std::future::Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send + 'static,
{
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        connections.spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service_fn(handler))
                .await;
        });
    }
    connections.shutdown().await;
}

pub struct CeilingServer {
    pub addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl CeilingServer {
    /// Serves on 127.0.0.1 at a free port, in this process.
    pub async fn start() -> anyhow::Result<CeilingServer> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .context("binding the ceiling server to 127.0.0.1:0")?;
        let addr = listener
            .local_addr()
            .context("the ceiling server's address")?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(accept_until(listener, stopped, serve));
        Ok(CeilingServer { addr, stop, task })
    }

    pub fn url(&self) -> String {
        format!("http://{}/wsr/default", self.addr)
    }

    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        tokio::time::timeout(std::time::Duration::from_secs(5), self.task)
            .await
            .context("ceiling server did not stop")?
            .context("ceiling server task")
    }
}

async fn serve(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => {
            let mut answer = Response::new(Full::new(Bytes::new()));
            *answer.status_mut() = StatusCode::BAD_REQUEST;
            return Ok(answer);
        }
    };
    let (content_type, xml) = ack(&body);
    let mut answer = Response::new(Full::new(Bytes::from(xml)));
    answer.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    Ok(answer)
}

/// Every request: read the body (as the gateway must) and answer a canned ack, a
/// `NonSequenceReply` without fault. The load generator only counts an ack that names its own
/// message, so the request's first `groupId` is echoed; the SOAP version follows the request's.
fn ack(body: &[u8]) -> (&'static str, String) {
    let group_id = attribute(body, b"groupId=\"").unwrap_or(b"x");
    let group_id = String::from_utf8_lossy(group_id);
    let soap12 = find(body, SOAP12_NS.as_bytes()).is_some();
    let (ns, content_type) = if soap12 {
        (SOAP12_NS, "application/soap+xml; charset=utf-8")
    } else {
        (SOAP11_NS, "text/xml; charset=utf-8")
    };
    let xml = format!(
        concat!(
            r#"<S:Envelope xmlns:S="{ns}"><S:Header>"#,
            r#"<wsrm:Response xmlns:wsrm="{wsrm}" S:mustUnderstand="{mu}">"#,
            r#"<wsrm:NonSequenceReply groupId="{group}"/></wsrm:Response></S:Header><S:Body/></S:Envelope>"#
        ),
        ns = ns,
        wsrm = WSRM_NS,
        mu = if soap12 { "true" } else { "1" },
        group = group_id,
    );
    (content_type, xml)
}

/// The value after the first `prefix` (e.g. `groupId="`) up to the closing quote. The value is
/// echoed as it stands: it came from an attribute and is already escaped for one.
fn attribute<'a>(body: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    let start = find(body, prefix)? + prefix.len();
    let len = body[start..].iter().position(|&b| b == b'"')?;
    Some(&body[start..start + len])
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_group_id() {
        let body = br#"<wsrm:MessageId groupId="mid:1@x"><wsrm:SequenceNum number="0"/>"#;
        assert_eq!(attribute(body, b"groupId=\""), Some(&b"mid:1@x"[..]));
        assert_eq!(attribute(b"no group", b"groupId=\""), None);
    }
}
