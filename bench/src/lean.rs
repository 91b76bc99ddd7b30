//! The lean client for the gateway rows and the HTTP ceiling: as cheap per request as the
//! broker clients. One bare hyper HTTP/1.1 keep-alive connection per worker; each request body
//! is a WS-R envelope spliced from a template (group id, sequence number and send time
//! substituted as bytes, no XML codec); the answer counts when its status is 200 and it holds
//! the ack marker for the message (`groupId="…"` in a `NonSequenceReply` without `fault=`, or
//! a `ReplyRange` covering the number), found by a byte search, without a parse.
//!
//! The request-response rows send the same Response-pattern envelope to a request-response
//! channel (the answer must also hold the backend's business body), and a plain SOAP envelope
//! (no WS-R blocks, the group id in the Body) to the backend itself.
//!
//! The gateway's full-codec generator (`wsr-gateway bench`) stays for correctness:
//! `wsr-compare --client codec`.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::load::{self, Figures, Params, Recorder};

const SOAP11_NS: &str = "http://schemas.xmlsoap.org/soap/envelope/";
const WSRM_NS: &str = "http://docs.oasis-open.org/wsrm/2004/06/ws-reliability-1.1.xsd";

/// `http://host:port/path` split into what a request needs.
#[derive(Debug, Clone)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub path: String,
}

impl Target {
    pub fn parse(url: &str) -> anyhow::Result<Target> {
        let rest = url
            .strip_prefix("http://")
            .with_context(|| format!("{url}: only http:// URLs"))?;
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let (host, port) = authority
            .rsplit_once(':')
            .with_context(|| format!("{url}: no port"))?;
        Ok(Target {
            host: host.to_owned(),
            port: port.parse().with_context(|| format!("{url}: bad port"))?,
            path: if path.is_empty() { "/" } else { path }.to_owned(),
        })
    }

    /// The same server, another path.
    pub fn with_path(&self, path: &str) -> Target {
        Target {
            path: path.to_owned(),
            ..self.clone()
        }
    }
}

/// One keep-alive HTTP/1.1 connection.
pub struct Conn {
    target: Target,
    sender: SendRequest<Full<Bytes>>,
}

impl Conn {
    pub async fn open(target: &Target) -> anyhow::Result<Conn> {
        let stream = TcpStream::connect((target.host.as_str(), target.port))
            .await
            .with_context(|| format!("connect {}:{}", target.host, target.port))?;
        stream.set_nodelay(true).context("TCP_NODELAY")?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP/1.1 handshake")?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Conn {
            target: target.clone(),
            sender,
        })
    }

    /// POSTs `body` to `path` (default: the target's) and returns status and whole answer.
    pub async fn post(
        &mut self,
        path: Option<&str>,
        content_type: &str,
        authorization: Option<&str>,
        body: Bytes,
    ) -> anyhow::Result<(StatusCode, Bytes)> {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(path.unwrap_or(&self.target.path))
            .header(hyper::header::HOST, self.target.host.as_str())
            .header(hyper::header::CONTENT_TYPE, content_type);
        if let Some(value) = authorization {
            request = request.header(hyper::header::AUTHORIZATION, value);
        }
        let request = request
            .body(Full::new(body))
            .context("building a request")?;
        self.sender.ready().await.context("connection")?;
        let answer = self.sender.send_request(request).await.context("request")?;
        let status = answer.status();
        let body = answer
            .into_body()
            .collect()
            .await
            .context("answer body")?
            .to_bytes();
        Ok((status, body))
    }
}

/// What the lean load sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Singletons, Response pattern.
    Response,
    /// One sequenced group with MessageOrder per worker, sent in order.
    Ordered,
    /// Singletons, Response pattern, to a request-response channel: the answer is the
    /// backend's business response with the ack in its header.
    Request,
    /// A plain SOAP envelope without WS-R blocks (the group id rides in the Body), to a SOAP
    /// service called directly: the answer is its business response.
    Plain,
}

/// What a business response holds, for the request-response shapes: the trivial backend's
/// (`rr.rs`) answer element.
pub const BUSINESS_MARKER: &[u8] = b"echoResponse";

impl Shape {
    /// Whether every message is its own group (all but `Ordered`).
    fn singletons(self) -> bool {
        self != Shape::Ordered
    }

    /// Whether `answer` completes the message: `Ok`, or the kind of failure.
    pub fn check(self, answer: &[u8], group: &str, number: Option<u64>) -> Result<(), String> {
        if matches!(self, Shape::Request | Shape::Plain) && find(answer, BUSINESS_MARKER).is_none()
        {
            return Err(if find(answer, b"Fault").is_some() {
                "soap-fault".into()
            } else {
                "no-business-response".into()
            });
        }
        match self {
            Shape::Plain => Ok(()),
            _ => acked(answer, group, number),
        }
    }
}

/// The WS-R envelope as pieces around the spliced values.
#[derive(Debug, Clone)]
pub struct Template {
    /// `…<wsrm:MessageId groupId="`
    head: Vec<u8>,
    /// After the group id, for a singleton: `"/>` + the rest of the Request up to the Body's
    /// `t="`; for a sequenced message: `"><wsrm:SequenceNum number="`.
    after_group: Vec<u8>,
    /// Sequenced only: after the number, up to `t="`.
    after_number: Vec<u8>,
    /// After the send time: `">` + payload + the close.
    tail: Vec<u8>,
    run: String,
}

impl Template {
    /// `payload`: the Body's content length to aim at (the `b:Load` element included).
    pub fn new(shape: Shape, payload: usize) -> Template {
        let mut template = Template::ws_r(shape);
        // The Load element around the filler is about 60 bytes, the time up to 20.
        let filler = payload.saturating_sub(80);
        let mut tail = Vec::with_capacity(filler + 64);
        tail.extend_from_slice(b"\">");
        tail.extend((0..filler).map(|i| b'a' + (i % 26) as u8));
        tail.extend_from_slice(b"</b:Load></soap:Body></soap:Envelope>");
        template.tail = tail;
        template
    }

    /// The pieces up to the send time; the tail is the caller's.
    fn ws_r(shape: Shape) -> Template {
        let run = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
            .to_string();
        if shape == Shape::Plain {
            return Template {
                head: format!(
                    "<soap:Envelope xmlns:soap=\"{SOAP11_NS}\"><soap:Body><b:Load xmlns:b=\"urn:wsr-gateway:bench\" id=\""
                )
                .into_bytes(),
                after_group: b"\" t=\"".to_vec(),
                after_number: Vec::new(),
                tail: Vec::new(),
                run,
            };
        }
        let expiry = rfc3339(SystemTime::now() + Duration::from_secs(3600));
        let head = format!(
            "<soap:Envelope xmlns:soap=\"{SOAP11_NS}\" xmlns:wsrm=\"{WSRM_NS}\"><soap:Header><wsrm:Request soap:mustUnderstand=\"1\"><wsrm:MessageId groupId=\""
        );
        let rest = format!(
            "<wsrm:ExpiryTime>{expiry}</wsrm:ExpiryTime><wsrm:ReplyPattern><wsrm:Value>Response</wsrm:Value></wsrm:ReplyPattern><wsrm:AckRequested/><wsrm:DuplicateElimination/>{order}</wsrm:Request></soap:Header><soap:Body><b:Load xmlns:b=\"urn:wsr-gateway:bench\" t=\"",
            order = if shape == Shape::Ordered {
                "<wsrm:MessageOrder/>"
            } else {
                ""
            }
        );
        let (after_group, after_number) = if shape.singletons() {
            (format!("\"/>{rest}"), String::new())
        } else {
            (
                "\"><wsrm:SequenceNum number=\"".to_owned(),
                format!("\"/></wsrm:MessageId>{rest}"),
            )
        };
        Template {
            head: head.into_bytes(),
            after_group: after_group.into_bytes(),
            after_number: after_number.into_bytes(),
            tail: Vec::new(),
            run,
        }
    }

    /// The group id of worker `worker`'s `i`th singleton, or of its sequenced group.
    pub fn group(&self, worker: usize, i: Option<u64>) -> String {
        match i {
            Some(i) => format!("mid:c{}-{worker}-{i}@wsr-compare", self.run),
            None => format!("mid:c{}-g{worker}@wsr-compare", self.run),
        }
    }

    /// One request body: `number` for a sequenced message, `sent_us` the send time.
    pub fn body(&self, group: &str, number: Option<u64>, sent_us: u64) -> Bytes {
        let mut out = Vec::with_capacity(
            self.head.len() + group.len() + self.after_group.len() + self.tail.len() + 64,
        );
        out.extend_from_slice(&self.head);
        out.extend_from_slice(group.as_bytes());
        out.extend_from_slice(&self.after_group);
        if let Some(n) = number {
            out.extend_from_slice(n.to_string().as_bytes());
            out.extend_from_slice(&self.after_number);
        }
        out.extend_from_slice(sent_us.to_string().as_bytes());
        out.extend_from_slice(&self.tail);
        Bytes::from(out)
    }
}

/// Whether `answer` acknowledges `group` (and `number`, for a sequenced message): `Ok`, or the
/// kind of failure. A byte search for the reply naming the group, no XML parse.
pub fn acked(answer: &[u8], group: &str, number: Option<u64>) -> Result<(), String> {
    let needle = format!("groupId=\"{group}\"");
    let Some(at) = find(answer, needle.as_bytes()) else {
        return Err(if find(answer, b"Fault").is_some() {
            "soap-fault".into()
        } else {
            "no-ack".into()
        });
    };
    let reply = &answer[at + needle.len()..];
    match number {
        None => {
            let end = find(reply, b"/>").unwrap_or(reply.len());
            if find(&reply[..end], b"fault=").is_some() {
                return Err("fault".into());
            }
            Ok(())
        }
        Some(n) => {
            let end = find(reply, b"SequenceReplies>").unwrap_or(reply.len());
            let mut ranges = &reply[..end];
            while let Some(from_at) = find(ranges, b"from=\"") {
                ranges = &ranges[from_at + 6..];
                let from = number_at(ranges);
                let Some(to_at) = find(ranges, b"to=\"") else {
                    break;
                };
                ranges = &ranges[to_at + 4..];
                let to = number_at(ranges);
                let close = find(ranges, b"/>").unwrap_or(ranges.len());
                let faulted = find(&ranges[..close], b"fault=").is_some();
                if let (Some(from), Some(to)) = (from, to)
                    && from <= n
                    && n <= to
                {
                    return if faulted { Err("fault".into()) } else { Ok(()) };
                }
            }
            Err("no-ack".into())
        }
    }
}

fn number_at(s: &[u8]) -> Option<u64> {
    let digits = s.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&s[..digits]).ok()?.parse().ok()
}

pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The closed loop: C workers, each on its own connection, one message outstanding; worker
/// `i` sends to `targets[i % n]` (several gateways on one database share the load). One
/// template for all, so group ids stay unique across the targets.
pub async fn load(
    targets: &[Target],
    shape: Shape,
    params: &Params,
    started: Instant,
    deadline: Instant,
) -> anyhow::Result<Recorder> {
    if targets.is_empty() {
        bail!("no target to load");
    }
    let template = std::sync::Arc::new(Template::new(shape, params.payload));
    load::run_workers(
        params.connections,
        load::worker_bound(params.duration),
        |worker| {
            let template = template.clone();
            let target = targets[worker % targets.len()].clone();
            async move {
                let mut rec = Recorder::default();
                let mut conn: Option<Conn> = None;
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let (group, number) = if shape.singletons() {
                        (template.group(worker, Some(i)), None)
                    } else {
                        (template.group(worker, None), Some(i))
                    };
                    let sent_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(0);
                    let body = template.body(&group, number, sent_us);
                    let done = rec
                        .time(async {
                            let c = match &mut conn {
                                Some(c) => c,
                                None => conn.insert(Conn::open(&target).await?),
                            };
                            let result = c.post(None, "text/xml; charset=utf-8", None, body).await;
                            let (status, answer) = match result {
                                Ok(r) => r,
                                Err(e) => {
                                    conn = None;
                                    return Err(e);
                                }
                            };
                            if status != StatusCode::OK {
                                bail!("http-{}", status.as_u16());
                            }
                            shape
                                .check(&answer, &group, number)
                                .map_err(anyhow::Error::msg)
                        })
                        .await;
                    // An ordered group must not skip a number: resend the same one.
                    if done.is_some() || shape.singletons() {
                        i += 1;
                    }
                }
                rec
            }
        },
    )
    .await
}

/// One lean phase: its figures.
pub async fn phase(target: &Target, shape: Shape, params: &Params) -> anyhow::Result<Figures> {
    phase_on(std::slice::from_ref(target), shape, params).await
}

/// One lean phase with the workers spread over `targets`: the figures of all together.
pub async fn phase_on(
    targets: &[Target],
    shape: Shape,
    params: &Params,
) -> anyhow::Result<Figures> {
    let started = Instant::now();
    let deadline = started + params.duration;
    let rec = load(targets, shape, params, started, deadline).await?;
    Ok(rec.figures(started.elapsed()))
}

/// Ingest → fetch → accept on the gateway: the lean Response-pattern load and, concurrently,
/// K members of one fresh shared subscription (created before the clock starts, so only this
/// phase's messages reach it) fetching batches and accepting them in one settle call each.
/// The figures are the consumers': accepted messages per second, POST sent → accept answered.
pub async fn e2e_phase(target: &Target, params: &Params, token: &str) -> anyhow::Result<Figures> {
    let (_, channel) = target
        .path
        .rsplit_once("/wsr/")
        .context("the gateway URL must end in /wsr/{channel}")?;
    let api = target.with_path("/");
    let auth = format!("Bearer {token}");
    let mut admin = Conn::open(&api).await?;
    let run = Template::new(Shape::Response, 0).run;
    let created = json_call(
        &mut admin,
        "/api/v1/subscriptions",
        &auth,
        serde_json::json!({
            "name": format!("$share/compare-{run}/{channel}/Load"),
            "durable": false,
            "ack_wait_ms": 60_000,
        }),
    )
    .await
    .context("creating the subscription")?;
    let sub = created["id"].as_i64().context("no subscription id")?;
    let mut sessions = Vec::new();
    for _ in 0..params.consumers {
        let joined = json_call(
            &mut admin,
            &format!("/api/v1/subscriptions/{sub}/sessions"),
            &auth,
            serde_json::json!({ "ttl_ms": 30_000 }),
        )
        .await
        .context("joining the subscription")?;
        sessions.push(
            joined["session"]
                .as_str()
                .context("no session id")?
                .to_owned(),
        );
    }
    let started = Instant::now();
    let deadline = started + params.duration;
    let ingest = {
        let (target, params) = (target.clone(), params.clone());
        tokio::spawn(
            async move { load(&[target], Shape::Response, &params, started, deadline).await },
        )
    };
    let mut sessions = sessions.into_iter();
    let batch = params.batch;
    let consumed = load::run_workers(
        params.consumers,
        load::worker_bound(params.duration),
        |_| {
            let session = sessions.next().unwrap_or_default();
            let (api, auth) = (api.clone(), auth.clone());
            async move { consume(&api, &auth, &session, batch, started, deadline).await }
        },
    )
    .await;
    let elapsed = started.elapsed();
    let ingested = ingest.await.context("ingest task")??.figures(elapsed);
    let consumed = consumed?.figures(elapsed);
    eprintln!(
        "[compare]   e2e ingest alongside: {:.0} msgs/s ({} ingested, {} accepted)",
        ingested.msgs_per_s, ingested.count, consumed.count
    );
    Ok(consumed)
}

/// One member: fetch (long-poll 200 ms), accept the batch in one settle, record each accepted
/// message's POST sent → settle answered.
async fn consume(
    api: &Target,
    auth: &str,
    session: &str,
    batch: usize,
    started: Instant,
    deadline: Instant,
) -> Recorder {
    let mut rec = Recorder::default();
    let mut conn: Option<Conn> = None;
    let fetch_path = format!("/api/v1/sessions/{session}/fetch");
    while Instant::now() < deadline {
        let round = tokio::time::timeout(load::OP_TIMEOUT, async {
            let c = match &mut conn {
                Some(c) => c,
                None => conn.insert(Conn::open(api).await?),
            };
            let fetched = json_call(
                c,
                &fetch_path,
                auth,
                serde_json::json!({ "max": batch, "wait_ms": 200 }),
            )
            .await
            .context("fetch")?;
            let Some(messages) = fetched["messages"].as_array().filter(|m| !m.is_empty()) else {
                return anyhow::Ok(Vec::new());
            };
            let settlements: Vec<serde_json::Value> = messages
                .iter()
                .map(|m| serde_json::json!({ "receipt": m["receipt"], "outcome": "accepted" }))
                .collect();
            let settled = json_call(
                c,
                "/api/v1/settle",
                auth,
                serde_json::json!({ "settlements": settlements }),
            )
            .await
            .context("settle")?;
            let now = started.elapsed();
            let results = settled["results"].as_array().cloned().unwrap_or_default();
            if results.len() != messages.len() {
                bail!(
                    "settle: {} results for {} messages",
                    results.len(),
                    messages.len()
                );
            }
            Ok(messages
                .iter()
                .zip(&results)
                .map(|(m, r)| {
                    let sent = m["payload"]
                        .as_str()
                        .and_then(|p| p.split(" t=\"").nth(1))
                        .and_then(|t| t.split('"').next())
                        .and_then(|t| t.parse::<u64>().ok());
                    (
                        r["settled"] == true,
                        sent.map(|us| now.saturating_sub(Duration::from_micros(us))),
                    )
                })
                .collect())
        })
        .await;
        match round {
            Ok(Ok(outcomes)) => {
                for (settled, latency) in outcomes {
                    match (settled, latency) {
                        (true, Some(l)) if Instant::now() <= deadline => rec.latency(l),
                        (true, Some(_)) => {}
                        (true, None) => rec.error_kind("accepted message without its send time"),
                        (false, _) => rec.error_kind("settle: not settled"),
                    }
                }
            }
            Ok(Err(e)) => {
                conn = None;
                rec.error(&e);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(_) => {
                conn = None;
                rec.error_kind("fetch/settle: timed out");
            }
        }
    }
    rec
}

/// POSTs JSON, expects a 2xx JSON answer.
async fn json_call(
    conn: &mut Conn,
    path: &str,
    auth: &str,
    body: serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    let bytes = Bytes::from(serde_json::to_vec(&body).context("encoding JSON")?);
    let (status, answer) = conn
        .post(Some(path), "application/json", Some(auth), bytes)
        .await?;
    if !status.is_success() {
        bail!(
            "POST {path}: {status}: {}",
            String::from_utf8_lossy(&answer[..answer.len().min(200)])
        );
    }
    serde_json::from_slice(&answer).with_context(|| format!("POST {path}: not JSON"))
}

/// `t` as `YYYY-MM-DDThh:mm:ssZ` (UTC), without a date library.
fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_civil() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(1_709_210_096)),
            "2024-02-29T12:34:56Z"
        );
    }

    #[test]
    fn spliced_bodies_carry_their_ids() {
        let t = Template::new(Shape::Ordered, 1024);
        let g = t.group(3, None);
        let body = t.body(&g, Some(7), 42);
        let text = std::str::from_utf8(&body).expect("utf-8");
        assert!(text.contains(&format!("groupId=\"{g}\"><wsrm:SequenceNum number=\"7\"/>")));
        assert!(text.contains("<wsrm:MessageOrder/>"));
        assert!(text.contains(" t=\"42\">"));
        assert!((1400..1700).contains(&body.len()), "{}", body.len());
        let t = Template::new(Shape::Response, 1024);
        let text = String::from_utf8(t.body("mid:x", None, 1).to_vec()).expect("utf-8");
        assert!(text.contains("groupId=\"mid:x\"/><wsrm:ExpiryTime>"));
        assert!(!text.contains("MessageOrder"));
    }

    #[test]
    fn plain_bodies_have_no_ws_r_blocks() {
        let t = Template::new(Shape::Plain, 1024);
        let g = t.group(1, Some(2));
        let text = String::from_utf8(t.body(&g, None, 9).to_vec()).expect("utf-8");
        assert!(text.starts_with("<soap:Envelope xmlns:soap=\""));
        assert!(text.contains(&format!(
            "<soap:Body><b:Load xmlns:b=\"urn:wsr-gateway:bench\" id=\"{g}\" t=\"9\">"
        )));
        assert!(!text.contains("wsrm"));
        assert!(text.ends_with("</b:Load></soap:Body></soap:Envelope>"));
        assert!((1000..1250).contains(&text.len()), "{}", text.len());
    }

    #[test]
    fn business_responses_count_with_their_ack() {
        let answer = br#"<S:Envelope><S:Header><wsrm:Response><wsrm:NonSequenceReply groupId="mid:a"/></wsrm:Response></S:Header><S:Body><e:echoResponse/></S:Body></S:Envelope>"#;
        assert_eq!(Shape::Request.check(answer, "mid:a", None), Ok(()));
        assert_eq!(
            Shape::Request.check(answer, "mid:b", None),
            Err("no-ack".into())
        );
        let bare_ack = br#"<wsrm:NonSequenceReply groupId="mid:a"/>"#;
        assert_eq!(
            Shape::Request.check(bare_ack, "mid:a", None),
            Err("no-business-response".into())
        );
        assert_eq!(Shape::Response.check(bare_ack, "mid:a", None), Ok(()));
        assert_eq!(
            Shape::Plain.check(b"<e:echoResponse/>", "mid:x", None),
            Ok(())
        );
    }

    #[test]
    fn acks_are_found_without_a_parse() {
        let ok = br#"<wsrm:Response><wsrm:NonSequenceReply groupId="mid:a"/></wsrm:Response>"#;
        assert_eq!(acked(ok, "mid:a", None), Ok(()));
        assert_eq!(acked(ok, "mid:b", None), Err("no-ack".into()));
        let faulted = br#"<wsrm:NonSequenceReply groupId="mid:a" fault="wsrm:X"/>"#;
        assert_eq!(acked(faulted, "mid:a", None), Err("fault".into()));
        let seq = br#"<wsrm:SequenceReplies groupId="g"><wsrm:ReplyRange from="0" to="4"/><wsrm:ReplyRange from="6" to="9"/></wsrm:SequenceReplies>"#;
        assert_eq!(acked(seq, "g", Some(7)), Ok(()));
        assert_eq!(acked(seq, "g", Some(5)), Err("no-ack".into()));
    }

    #[test]
    fn targets_parse() {
        let t = Target::parse("http://127.0.0.1:8080/wsr/default").expect("url");
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("127.0.0.1", 8080, "/wsr/default")
        );
    }
}
