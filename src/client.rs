//! `wsr-gateway send` and `wsr-gateway status`: a thin client of a running gateway's API, and
//! `Api`, the one way the CLI calls it (the operator commands in `ops.rs` too).

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

/// A client of a gateway's `/api/v1` with one bearer token. Paths are built from segments,
/// each percent-encoded, so that an id given on the command line stays one segment; answers
/// are JSON, and a failure is told with the status and the API's reason.
pub struct Api {
    client: reqwest::Client,
    base: reqwest::Url,
    token: String,
}

impl Api {
    /// A client of the gateway at `base`; with `ca_file`, an https gateway's certificate is
    /// checked against those CA certificates (PEM) alone — a private CA — instead of the
    /// system's (which `SSL_CERT_FILE` may name).
    pub fn new(base: &str, token: &str, ca_file: Option<&std::path::Path>) -> anyhow::Result<Api> {
        let base = reqwest::Url::parse(base)
            .with_context(|| format!("{base:?} is not a URL (e.g. http://127.0.0.1:8080)"))?;
        if base.cannot_be_a_base() || !matches!(base.scheme(), "http" | "https") {
            bail!("{base} is not an http(s) base URL");
        }
        let mut builder = reqwest::Client::builder();
        if let Some(path) = ca_file {
            builder = crate::bench::trusting_ca_file(builder, path)?;
        }
        Ok(Api {
            client: builder.build().context("cannot build the HTTP client")?,
            base,
            token: token.to_owned(),
        })
    }

    fn url(&self, segments: &[&str], query: &[(&str, String)]) -> reqwest::Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(["api", "v1"]).extend(segments);
        }
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        url
    }

    pub async fn get(&self, segments: &[&str], query: &[(&str, String)]) -> anyhow::Result<Value> {
        self.call(self.client.get(self.url(segments, query))).await
    }

    pub async fn post(&self, segments: &[&str], body: &Value) -> anyhow::Result<Value> {
        self.call(self.client.post(self.url(segments, &[])).json(body))
            .await
    }

    /// A POST without a body, its parameters in the query.
    pub async fn post_query(
        &self,
        segments: &[&str],
        query: &[(&str, String)],
    ) -> anyhow::Result<Value> {
        self.call(self.client.post(self.url(segments, query))).await
    }

    pub async fn delete(&self, segments: &[&str], body: &Value) -> anyhow::Result<Value> {
        self.call(self.client.delete(self.url(segments, &[])).json(body))
            .await
    }

    /// A GET whose answer is not JSON (a business response as received): its bytes.
    pub async fn get_bytes(&self, segments: &[&str]) -> anyhow::Result<Vec<u8>> {
        let (status, bytes) = self
            .exchange(self.client.get(self.url(segments, &[])))
            .await?;
        if !status.is_success() {
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            bail!("{status}: {}", body["reason"].as_str().unwrap_or(""));
        }
        Ok(bytes.to_vec())
    }

    /// Sends `request` with our token; its status and whole body.
    async fn exchange(
        &self,
        request: reqwest::RequestBuilder,
    ) -> anyhow::Result<(reqwest::StatusCode, bytes::Bytes)> {
        let answer = request
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| format!("cannot reach the gateway's API at {}", self.base))?;
        let status = answer.status();
        let bytes = answer
            .bytes()
            .await
            .with_context(|| format!("the API's answer ({status}) broke off"))?;
        Ok((status, bytes))
    }

    async fn call(&self, request: reqwest::RequestBuilder) -> anyhow::Result<Value> {
        let (status, bytes) = self.exchange(request).await?;
        // A removal answers 204 with no body.
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .with_context(|| format!("the API's answer ({status}) is not JSON"))?
        };
        if !status.is_success() {
            bail!("{status}: {}", body["reason"].as_str().unwrap_or(""));
        }
        Ok(body)
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct ApiArgs {
    /// The gateway's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080", env = "WSR_API")]
    pub api: String,
    /// A bearer token with the `produce` scope.
    #[arg(long, env = "WSR_TOKEN", hide_env_values = true)]
    pub token: String,
    /// CA certificates (PEM) to check an https gateway against, for one with a private CA
    /// (else the system's, or those `SSL_CERT_FILE` names).
    #[arg(long, env = "WSR_CA_FILE")]
    pub ca_file: Option<PathBuf>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct SendArgs {
    #[command(flatten)]
    pub api: ApiArgs,
    /// Destination: a URL, or a partner named in the gateway's configuration.
    #[arg(long)]
    pub to: String,
    /// Continue this group (default: a new group when sending several files or --ordered).
    #[arg(long)]
    pub group: Option<String>,
    /// Deliver in order (MessageOrder).
    #[arg(long)]
    pub ordered: bool,
    /// Mark the last file's message as the group's last.
    #[arg(long)]
    pub last: bool,
    /// Reply pattern.
    #[arg(long, default_value = "response", value_parser = ["response", "callback", "poll"])]
    pub reply: String,
    /// SOAP version.
    #[arg(long, default_value = "1.1", value_parser = ["1.1", "1.2"])]
    pub soap: String,
    /// Wait until each message is final (acked, faulted or failed), print its state and the
    /// partner's business response, if one came back.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits for each message, in seconds.
    #[arg(long, default_value_t = 60, requires = "wait")]
    pub wait_seconds: u64,
    /// Files holding the Body content, one message each.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// Submits one message per file; returns one line per message.
pub async fn send(args: &SendArgs) -> anyhow::Result<Vec<String>> {
    let api = Api::new(&args.api.api, &args.api.token, args.api.ca_file.as_deref())?;
    let reply = match args.reply.as_str() {
        "callback" => "Callback",
        "poll" => "Poll",
        _ => "Response",
    };
    let grouped = args.group.is_some() || args.ordered || args.files.len() > 1 || args.last;
    let mut group = args.group.clone();
    // Read every file first: a later unreadable file must not leave a half-submitted group.
    let bodies = args
        .files
        .iter()
        .map(|f| std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display())))
        .collect::<anyhow::Result<Vec<String>>>()?;
    let mut lines = Vec::new();
    for (i, (file, body)) in args.files.iter().zip(bodies).enumerate() {
        // Only what the flags say; the gateway's default agreement supplies the rest.
        let mut request = json!({
            "destination": args.to,
            "agreement": { "reply_pattern": reply, "message_order": args.ordered },
            "soap_version": args.soap,
            "body": body,
        });
        if grouped {
            let mut g = json!({ "last": args.last && i + 1 == args.files.len() });
            if let Some(id) = &group {
                g["id"] = json!(id);
            }
            request["group"] = g;
        }
        let answer = api
            .post(&["messages"], &request)
            .await
            .with_context(|| format!("{}", file.display()))?;
        group = answer["group_id"].as_str().map(str::to_owned);
        let id = answer["id"].as_str().unwrap_or("");
        lines.push(format!(
            "{}\t{}\t{}\t{}",
            id,
            answer["group_id"].as_str().unwrap_or(""),
            answer["number"],
            file.display()
        ));
        if args.wait {
            let limit = std::time::Duration::from_secs(args.wait_seconds);
            lines.push(wait_for(&api, id, limit).await?);
        }
    }
    Ok(lines)
}

/// How often `--wait` asks about a message.
const WAIT_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// `send --wait`: asks about message `id` until it is final, then tells its state (with its
/// fault or reason) and the partner's business response as received, if one was kept.
async fn wait_for(api: &Api, id: &str, limit: std::time::Duration) -> anyhow::Result<String> {
    let deadline = std::time::Instant::now() + limit;
    let message = loop {
        let message = api.get(&["messages", id], &[]).await?;
        let state = message["state"].as_str().unwrap_or("");
        if ["acked", "faulted", "failed"].contains(&state) {
            break message;
        }
        if std::time::Instant::now() >= deadline {
            bail!("{id} is still {state} after {} s", limit.as_secs());
        }
        tokio::time::sleep(WAIT_POLL).await;
    };
    let mut out = format!("{id}\t{}", message["state"].as_str().unwrap_or(""));
    for why in ["fault", "reason"] {
        if let Some(text) = message[why].as_str() {
            out.push_str(&format!("\t{text}"));
        }
    }
    let response = &message["response"];
    if response.is_object() {
        let body = api.get_bytes(&["messages", id, "response"]).await?;
        let fault = if response["soap_fault"] == json!(true) {
            ", a SOAP Fault"
        } else {
            ""
        };
        out.push_str(&format!(
            "\nresponse: {} bytes of {}{fault}\n{}",
            body.len(),
            response["content_type"].as_str().unwrap_or(""),
            String::from_utf8_lossy(&body)
        ));
    }
    Ok(out)
}

/// The state of one submitted message, as pretty JSON.
pub async fn status(api: &ApiArgs, id: &str) -> anyhow::Result<Value> {
    Api::new(&api.api, &api.token, api.ca_file.as_deref())?
        .get(&["messages", id], &[])
        .await
}

#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// The gateway's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080", env = "WSR_API")]
    pub api: String,
    /// CA certificates (PEM) to check an https gateway against (a private CA).
    #[arg(long, env = "WSR_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// How long to wait for the answer, in seconds.
    #[arg(long, default_value_t = 5)]
    pub timeout_seconds: u64,
}

/// `health`: the gateway's `/readyz` answer, `ready` when it is ready; an error (exit 1) with
/// its reason when it is not, or cannot be reached.
pub async fn health(args: &HealthArgs) -> anyhow::Result<String> {
    let base = reqwest::Url::parse(&args.api)
        .with_context(|| format!("{:?} is not a URL (e.g. http://127.0.0.1:8080)", args.api))?;
    let url = base.join("/readyz").context("no /readyz under that URL")?;
    let mut builder = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(args.timeout_seconds.max(1)))
        .no_proxy();
    if let Some(path) = &args.ca_file {
        builder = crate::bench::trusting_ca_file(builder, path)?;
    }
    let client = builder.build().context("cannot build the HTTP client")?;
    let answer = client
        .get(url.clone())
        .send()
        .await
        .with_context(|| format!("cannot reach {url}"))?;
    let status = answer.status();
    let text = answer.text().await.unwrap_or_default();
    if !status.is_success() {
        bail!("not ready ({status}): {}", text.trim());
    }
    Ok("ready".to_owned())
}
