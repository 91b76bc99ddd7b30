//! The request-response rows (DESIGN D16): a trivial SOAP 1.1 service on 127.0.0.1, called
//! directly by the lean client, and the gateway (durable, SQLite) in front of it on a
//! request-response channel, loaded with Response-pattern requests whose answer is the
//! service's business response with the ack in its header.
//!
//! The service runs in this process on a runtime of its own, whose threads are named
//! [`THREAD_NAME`]: their CPU is the service's (`cpu.rs`), counted alone in the direct row and
//! with the gateway's in the request-response row. It reads each request body and answers
//! every POST with the same small `echoResponse` envelope; nothing is parsed or stored.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode, header};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::cpu;
use crate::gateway::{Gateway, Store};
use crate::lean::{self, Shape, Target};
use crate::load::{Figures, Params};
use crate::table::{Outcome, Report, RowKey};
use crate::{measured, progress, show_logs_on_errors, start_failed};

/// The service's threads (at most 15 bytes: `/proc/…/comm`).
pub const THREAD_NAME: &str = "soap-backend";

/// The service's runtime: as many workers as the lean client may keep busy on a small machine.
const WORKERS: usize = 2;

/// The request-response channel on the gateway.
const CHANNEL: &str = "rr";

/// The service's only answer: a SOAP 1.1 business response (the marker the lean client looks
/// for is [`lean::BUSINESS_MARKER`]).
const ECHO_RESPONSE: &str = concat!(
    r#"<soap:Envelope xmlns:soap="http://schemas.xmlsoap.org/soap/envelope/"><soap:Body>"#,
    r#"<e:echoResponse xmlns:e="urn:wsr-compare:echo"><e:return>ok</e:return></e:echoResponse>"#,
    r#"</soap:Body></soap:Envelope>"#
);

/// The trivial SOAP service, serving on 127.0.0.1 at a free port until stopped.
pub struct SoapBackend {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl SoapBackend {
    pub fn start() -> anyhow::Result<SoapBackend> {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))
            .context("binding the SOAP backend to 127.0.0.1:0")?;
        listener
            .set_nonblocking(true)
            .context("a non-blocking listener")?;
        let addr = listener
            .local_addr()
            .context("the SOAP backend's address")?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(WORKERS)
            .thread_name(THREAD_NAME)
            .enable_all()
            .build()
            .context("the SOAP backend's runtime")?;
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || runtime.block_on(accept(listener, stopped)))
            .context("the SOAP backend's thread")?;
        // Its runtime's threads are the server's: on the server core when pinned. They exist
        // once the runtime is built (the accept thread above is named alike).
        crate::pin::own_threads_to_server(THREAD_NAME)?;
        Ok(SoapBackend { addr, stop, thread })
    }

    pub fn url(&self) -> String {
        format!("http://{}/echo", self.addr)
    }

    /// Its CPU, for `cpu::Server::measure`.
    pub fn server(&self) -> cpu::Server {
        cpu::Server::own_threads(THREAD_NAME)
    }

    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        let thread = self.thread;
        let joined = tokio::task::spawn_blocking(move || thread.join());
        match tokio::time::timeout(Duration::from_secs(5), joined).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(_))) => anyhow::bail!("the SOAP backend's thread panicked"),
            Ok(Err(e)) => Err(e).context("joining the SOAP backend"),
            Err(_) => anyhow::bail!("the SOAP backend did not stop within 5 s"),
        }
    }
}

/// The service on this runtime's listener, until `stopped`.
async fn accept(listener: std::net::TcpListener, stopped: oneshot::Receiver<()>) {
    if let Ok(listener) = TcpListener::from_std(listener) {
        crate::ceiling::accept_until(listener, stopped, echo).await;
    }
}

/// Reads the request (as a real service must) and answers the fixed business response.
async fn echo(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut answer = Response::new(Full::new(Bytes::from_static(ECHO_RESPONSE.as_bytes())));
    if request.into_body().collect().await.is_err() {
        *answer.status_mut() = StatusCode::BAD_REQUEST;
        *answer.body_mut() = Full::new(Bytes::new());
        return Ok(answer);
    }
    answer.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/xml; charset=utf-8"),
    );
    Ok(answer)
}

/// The gateway's config for the rows: the one-way `default` channel (named again, since
/// naming any channel replaces it) and the request-response channel in front of `backend`.
/// Backend calls may be as many at once as there are workers, so the gateway's own limit does
/// not queue the load.
fn channels(backend: &str, connections: usize) -> String {
    format!(
        concat!(
            "\n[[channels]]\n",
            "name = \"default\"\n",
            "anonymous = true\n",
            "\n[[channels]]\n",
            "name = \"{channel}\"\n",
            "anonymous = true\n",
            "operation = \"request-response\"\n",
            "[channels.backend]\n",
            "url = \"{backend}\"\n",
            "timeout_ms = 5000\n",
            "max_concurrency = {concurrency}\n",
        ),
        channel = CHANNEL,
        backend = backend,
        concurrency = connections.max(1),
    )
}

/// Both rows, on one service: the service called directly, then the gateway in front of it.
pub async fn phases(bin: Result<&Path, String>, params: &Params, report: &mut Report) {
    let backend = match SoapBackend::start() {
        Ok(backend) => backend,
        Err(e) => {
            let why = format!("{e:#}");
            progress(format!("SOAP backend: failed to start: {why}"));
            for key in [RowKey::BackendDirect, RowKey::GatewayRr] {
                report.set(key, Outcome::Failed(why.clone()));
            }
            return;
        }
    };
    progress(format!(
        "SOAP backend called directly at {}, for {} s",
        backend.url(),
        params.duration.as_secs()
    ));
    report.set(
        RowKey::BackendDirect,
        measured(direct(&backend, params).await),
    );
    let rr = match bin {
        Ok(bin) => gateway_rr(bin, &backend, params, report).await,
        Err(why) => Outcome::Unavailable(why),
    };
    report.set(RowKey::GatewayRr, rr);
    if let Err(e) = backend.stop().await {
        report.notes.push(format!("SOAP backend: {e:#}"));
    }
    report.notes.push(format!(
        "Request-response: a trivial SOAP 1.1 service in this tool ({WORKERS} threads of its own, every POST answered with the same {}-byte echoResponse). Direct: the lean client POSTs plain SOAP envelopes (no WS-R blocks) to it; an answer counts when it is 200 with the echoResponse. wsr-gateway request-response: a fresh durable gateway (durability=full, SQLite) whose channel \"{CHANNEL}\" (operation = \"request-response\", backend max_concurrency = C) calls the service; Response-pattern singletons, an answer counts when it is 200 and holds both the ack for its groupId and the echoResponse. Server CPU = the service's threads, plus the gateway process in the request-response row.",
        ECHO_RESPONSE.len()
    ));
}

async fn direct(backend: &SoapBackend, params: &Params) -> anyhow::Result<Figures> {
    let target = Target::parse(&backend.url())?;
    backend
        .server()
        .measure(lean::phase(&target, Shape::Plain, params))
        .await
}

async fn gateway_rr(
    bin: &Path,
    backend: &SoapBackend,
    params: &Params,
    report: &mut Report,
) -> Outcome {
    progress("wsr-gateway request-response (durability=full): starting");
    let extra = channels(&backend.url(), params.connections);
    let gw = match Gateway::start_with(bin, "full", Store::Sqlite, &extra).await {
        Ok(gw) => gw,
        Err(e) => return start_failed(e),
    };
    progress(format!(
        "wsr-gateway request-response: Response pattern to /wsr/{CHANNEL} for {} s",
        params.duration.as_secs()
    ));
    let load = async {
        let target = Target::parse(&gw.url())?.with_path(&format!("/wsr/{CHANNEL}"));
        lean::phase(&target, Shape::Request, params).await
    };
    let result = gw.server().and(backend.server()).measure(load).await;
    let outcome = measured(result);
    show_logs_on_errors(&outcome, &[&gw]);
    if let Err(e) = gw.stop().await {
        report
            .notes
            .push(format!("gateway (request-response): {e:#}"));
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_business_response_is_what_the_client_looks_for() {
        assert!(lean::find(ECHO_RESPONSE.as_bytes(), lean::BUSINESS_MARKER).is_some());
        assert!(THREAD_NAME.len() <= 15);
    }

    #[test]
    fn the_channel_config_names_both_channels() {
        let toml = channels("http://127.0.0.1:1/echo", 64);
        assert!(toml.contains("name = \"default\"\nanonymous = true\n"));
        assert!(toml.contains("operation = \"request-response\"\n[channels.backend]\n"));
        assert!(toml.contains("url = \"http://127.0.0.1:1/echo\"\n"));
        assert!(toml.contains("max_concurrency = 64\n"));
    }

    #[tokio::test]
    async fn the_service_answers_every_post_with_the_echo() {
        let backend = SoapBackend::start().expect("starts");
        let target = Target::parse(&backend.url()).expect("url");
        let mut conn = lean::Conn::open(&target).await.expect("connects");
        let (status, body) = conn
            .post(None, "text/xml", None, Bytes::from_static(b"<x/>"))
            .await
            .expect("answers");
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, ECHO_RESPONSE.as_bytes());
        backend.stop().await.expect("stops");
    }
}
