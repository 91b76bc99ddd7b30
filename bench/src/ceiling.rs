//! The HTTP ceiling: a trivial server on the gateway's own stack (axum on hyper, HTTP/1.1) that
//! reads each request body and answers with a canned WS-R acknowledgement (echoing the request's
//! groupId, nothing else is parsed or stored). Loaded by the
//! gateway's load generator, it shows what the client and the HTTP stack alone can do on this
//! machine.

use std::net::SocketAddr;

use anyhow::Context as _;
use axum::Router;
use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const SOAP11_NS: &str = "http://schemas.xmlsoap.org/soap/envelope/";
const SOAP12_NS: &str = "http://www.w3.org/2003/05/soap-envelope";
const WSRM_NS: &str = "http://docs.oasis-open.org/wsrm/2004/06/ws-reliability-1.1.xsd";

pub struct CeilingServer {
    pub addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
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
        let app = Router::new().fallback(ack);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        Ok(CeilingServer { addr, stop, task })
    }

    pub fn url(&self) -> String {
        format!("http://{}/wsr/default", self.addr)
    }

    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        match tokio::time::timeout(std::time::Duration::from_secs(5), self.task).await {
            Ok(joined) => joined
                .context("ceiling server task")?
                .context("ceiling server"),
            // Connections still open after the load generator exited: nothing to wait for.
            Err(_) => Ok(()),
        }
    }
}

/// Every request: read the body (as the gateway must) and answer a canned ack, a
/// `NonSequenceReply` without fault. The load generator only counts an ack that names its own
/// message, so the request's first `groupId` is echoed; the SOAP version follows the request's.
async fn ack(body: Bytes) -> impl IntoResponse {
    let group_id = attribute(&body, b"groupId=\"").unwrap_or(b"x");
    let group_id = String::from_utf8_lossy(group_id);
    let soap12 = find(&body, SOAP12_NS.as_bytes()).is_some();
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
    (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], xml)
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
