//! `wsr-gateway send` and `wsr-gateway status`: a thin client of a running gateway's API.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

#[derive(Debug, Clone, clap::Args)]
pub struct ApiArgs {
    /// The gateway's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080", env = "WSR_API")]
    pub api: String,
    /// A bearer token with the `produce` scope.
    #[arg(long, env = "WSR_TOKEN")]
    pub token: String,
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
    /// Files holding the Body content, one message each.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// Submits one message per file; returns one line per message.
pub async fn send(args: &SendArgs) -> anyhow::Result<Vec<String>> {
    let client = reqwest::Client::new();
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
        let answer = client
            .post(format!(
                "{}/api/v1/messages",
                args.api.api.trim_end_matches('/')
            ))
            .bearer_auth(&args.api.token)
            .json(&request)
            .send()
            .await
            .context("cannot reach the gateway's API")?;
        let status = answer.status();
        let answer: Value = answer
            .json()
            .await
            .context("the API's answer is not JSON")?;
        if status.as_u16() != 202 {
            bail!(
                "{}: {} {}",
                file.display(),
                status,
                answer["reason"].as_str().unwrap_or("")
            );
        }
        group = answer["group_id"].as_str().map(str::to_owned);
        lines.push(format!(
            "{}\t{}\t{}\t{}",
            answer["id"].as_str().unwrap_or(""),
            answer["group_id"].as_str().unwrap_or(""),
            answer["number"],
            file.display()
        ));
    }
    Ok(lines)
}

/// The state of one submitted message, as pretty JSON.
pub async fn status(api: &ApiArgs, id: &str) -> anyhow::Result<String> {
    let answer = reqwest::Client::new()
        .get(format!(
            "{}/api/v1/messages/{id}",
            api.api.trim_end_matches('/')
        ))
        .bearer_auth(&api.token)
        .send()
        .await
        .context("cannot reach the gateway's API")?;
    let status = answer.status();
    let body: Value = answer
        .json()
        .await
        .context("the API's answer is not JSON")?;
    if !status.is_success() {
        bail!("{status}: {}", body["reason"].as_str().unwrap_or(""));
    }
    Ok(serde_json::to_string_pretty(&body)?)
}
