//! The operator commands over the admin API, in the style of the `nats` CLI:
//! `wsr-gateway messages list|show|resend|fail`, `groups list|show`,
//! `subs list|show|dead-letters|replay`, `endpoints list|add|rm`. Each is one call of
//! `/api/v1`, printed as a table (default) or as the API's own JSON (`--output json`).

use anyhow::Context as _;
use serde_json::{Value, json};

use crate::client::Api;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Columns for lists, `key  value` lines for one object.
    Table,
    /// The API's answer as it came (pretty-printed).
    Json,
}

/// Where the admin API is and how to print its answers; the flags may follow the command.
#[derive(Debug, Clone, clap::Args)]
pub struct OpsArgs {
    /// The gateway's base URL.
    #[arg(
        long,
        global = true,
        default_value = "http://127.0.0.1:8080",
        env = "WSR_API"
    )]
    pub api: String,
    /// A bearer token; the `admin` scope sees everything.
    #[arg(long, global = true, env = "WSR_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    #[arg(long, short = 'o', global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// CA certificates (PEM) to check an https gateway against, for one with a private CA
    /// (else the system's, or those `SSL_CERT_FILE` names).
    #[arg(long, global = true, env = "WSR_CA_FILE")]
    pub ca_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum MessagesCommand {
    /// Outbound messages, oldest first or `--newest` first (a page; `--after` the last id
    /// shown for the next).
    List {
        /// queued, sent, in_doubt (sent, nothing more to send: only polls settle it), acked,
        /// faulted or failed.
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        group: Option<String>,
        /// Only those to this configured partner (`anonymous`: URL destinations).
        #[arg(long)]
        partner: Option<String>,
        /// Newest first (`--after` then pages on to older ones).
        #[arg(long)]
        newest: bool,
        #[arg(long)]
        after: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// One message: its state, times, last error and identity, and every attempt and poll
    /// with the partner's status and what its answer said.
    Show { id: String },
    /// One attempt now, with the same identity (a message in doubt, above all).
    Resend { id: String },
    /// A failed or faulted message sent again as a new message (new identity; both histories
    /// name the other).
    SendAgain { id: String },
    /// End the message `failed` (and the rest of its ordered group).
    Fail {
        id: String,
        /// Why (kept as the message's reason).
        #[arg(long)]
        reason: String,
    },
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum GroupsCommand {
    /// Received groups with their state, by (partner, group id).
    List {
        #[arg(long)]
        after: Option<String>,
        #[arg(long)]
        after_partner: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// One group: delivered ranges, buffered messages, faults, when it aborts.
    Show {
        id: String,
        /// Its partner (default: anonymous senders).
        #[arg(long)]
        partner: Option<String>,
    },
    /// Abort a stuck group (D7): its buffered messages are discarded, never delivered, and
    /// every later message of it is refused with GroupAborted.
    Abort {
        id: String,
        /// Its partner (default: anonymous senders).
        #[arg(long)]
        partner: Option<String>,
    },
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum SubsCommand {
    /// Subscriptions this token may see.
    List,
    /// One subscription with its backlog (waiting, in flight, dead letters).
    Show { id: i64 },
    /// A subscription's dead letters.
    DeadLetters {
        id: i64,
        #[arg(long)]
        after: Option<i64>,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Pause a push subscription (a broken webhook): nothing is POSTed until resumed.
    Pause { id: i64 },
    /// Resume a paused push subscription.
    Resume { id: i64 },
    /// Deliver dead letters again (all, or the `--offsets` given).
    Replay {
        id: i64,
        #[arg(long, value_delimiter = ',')]
        offsets: Vec<i64>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EndpointKind {
    /// Where callback acks may be POSTed (per partner).
    Callback,
    /// Push webhooks (and notify URLs).
    Push,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum EndpointsCommand {
    /// Registered endpoints of one kind.
    List {
        #[arg(long, value_enum, default_value_t = EndpointKind::Callback)]
        kind: EndpointKind,
    },
    /// Register an endpoint.
    Add {
        url: String,
        #[arg(long, value_enum, default_value_t = EndpointKind::Callback)]
        kind: EndpointKind,
        /// The partner a callback endpoint is for (default: anonymous senders).
        #[arg(long)]
        partner: Option<String>,
    },
    /// Remove an endpoint.
    Rm {
        url: String,
        #[arg(long, value_enum, default_value_t = EndpointKind::Callback)]
        kind: EndpointKind,
        #[arg(long)]
        partner: Option<String>,
    },
}

fn endpoints_path(kind: EndpointKind) -> &'static str {
    match kind {
        EndpointKind::Callback => "callback-endpoints",
        EndpointKind::Push => "push-endpoints",
    }
}

fn api(args: &OpsArgs) -> anyhow::Result<Api> {
    let token = args
        .token
        .as_deref()
        .context("no token: give --token or set WSR_TOKEN (an admin token sees everything)")?;
    Api::new(&args.api, token, args.ca_file.as_deref())
}

/// Runs a `messages` command; the text to print.
pub async fn messages(args: &OpsArgs, command: &MessagesCommand) -> anyhow::Result<String> {
    let api = api(args)?;
    let (mut answer, shape) = match command {
        MessagesCommand::List {
            state,
            group,
            partner,
            newest,
            after,
            limit,
        } => {
            let mut query = vec![("limit", limit.to_string())];
            query.extend(state.iter().map(|s| ("state", s.clone())));
            query.extend(group.iter().map(|g| ("group", g.clone())));
            // The API's name for "no partner" is "".
            query.extend(partner.iter().map(|p| {
                let p = if p == wsr_gateway::metrics::ANONYMOUS {
                    ""
                } else {
                    p
                };
                ("partner", p.to_owned())
            }));
            if *newest {
                query.push(("order", "newest".to_owned()));
            }
            query.extend(after.iter().map(|a| ("after", a.clone())));
            let answer = api.get(&["messages"], &query).await?;
            (answer, Shape::List("messages", MESSAGE_COLUMNS, *limit))
        }
        MessagesCommand::Show { id } => {
            let message = api.get(&["messages", id], &[]).await?;
            if args.output == Output::Table {
                let attempts = api.get(&["messages", id, "attempts"], &[]).await?;
                return Ok(message_story(message, &attempts));
            }
            (message, Shape::One)
        }
        MessagesCommand::Resend { id } => (
            api.post(&["messages", id, "resend"], &json!({})).await?,
            Shape::One,
        ),
        MessagesCommand::SendAgain { id } => (
            api.post(&["messages", id, "send-again"], &json!({}))
                .await?,
            Shape::One,
        ),
        MessagesCommand::Fail { id, reason } => (
            api.post(&["messages", id, "fail"], &json!({ "reason": reason }))
                .await?,
            Shape::One,
        ),
    };
    if args.output == Output::Table {
        match shape {
            Shape::One => shown_message(&mut answer),
            Shape::List(key, ..) => answer[key]
                .as_array_mut()
                .into_iter()
                .flatten()
                .for_each(shown_message),
        }
    }
    Ok(print(args.output, &answer, shape))
}

/// One outbound message as `status` prints it: as a table (the default) or the API's JSON.
pub fn message_shown(output: Output, mut message: Value) -> String {
    if output == Output::Table {
        shown_message(&mut message);
    }
    let mut text = print(output, &message, Shape::One);
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

/// An outbound message as a table shows it: in doubt as its state, "no partner" by its one
/// name.
fn shown_message(m: &mut Value) {
    if m["in_doubt"] == json!(true) {
        m["state"] = json!("in_doubt");
    }
    if m["partner"] == json!("") {
        m["partner"] = json!(wsr_gateway::metrics::ANONYMOUS);
    }
}

/// `messages show` as a table: the message, then its attempts and polls.
fn message_story(mut message: Value, attempts: &Value) -> String {
    shown_message(&mut message);
    let mut text = pairs(&message);
    let total = attempts["total"].as_u64().unwrap_or(0);
    let omitted = attempts["omitted"].as_u64().unwrap_or(0);
    text.push_str(&format!("\nattempts and polls: {total}"));
    if omitted > 0 {
        text.push_str(&format!(
            " ({omitted} between the first 5 and the latest 20 not kept)"
        ));
    }
    text.push('\n');
    let rows = attempts["attempts"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    text.push_str(&table(rows, ATTEMPT_COLUMNS));
    text
}

/// Runs a `groups` command; the text to print.
pub async fn groups(args: &OpsArgs, command: &GroupsCommand) -> anyhow::Result<String> {
    let api = api(args)?;
    let (answer, shape) = match command {
        GroupsCommand::List {
            after,
            after_partner,
            limit,
        } => {
            let mut query = vec![("limit", limit.to_string())];
            query.extend(after.iter().map(|a| ("after", a.clone())));
            query.extend(after_partner.iter().map(|p| ("after_partner", p.clone())));
            let answer = api.get(&["groups"], &query).await?;
            (answer, Shape::List("groups", GROUP_COLUMNS, *limit))
        }
        GroupsCommand::Show { id, partner } => {
            let query: Vec<_> = partner.iter().map(|p| ("partner", p.clone())).collect();
            (api.get(&["groups", id], &query).await?, Shape::One)
        }
        GroupsCommand::Abort { id, partner } => {
            let query: Vec<_> = partner.iter().map(|p| ("partner", p.clone())).collect();
            (
                api.post_query(&["groups", id, "abort"], &query).await?,
                Shape::One,
            )
        }
    };
    Ok(print(args.output, &answer, shape))
}

/// Runs a `subs` command; the text to print.
pub async fn subs(args: &OpsArgs, command: &SubsCommand) -> anyhow::Result<String> {
    let api = api(args)?;
    let (answer, shape) = match command {
        SubsCommand::List => (
            api.get(&["subscriptions"], &[]).await?,
            Shape::List("subscriptions", SUBSCRIPTION_COLUMNS, u32::MAX),
        ),
        SubsCommand::Show { id } => (
            api.get(&["subscriptions", &id.to_string()], &[]).await?,
            Shape::One,
        ),
        SubsCommand::DeadLetters { id, after, limit } => {
            let mut query = vec![("limit", limit.to_string())];
            query.extend(after.iter().map(|a| ("after", a.to_string())));
            let path = ["subscriptions", &id.to_string(), "dead-letters"];
            (
                api.get(&path, &query).await?,
                Shape::List("dead_letters", DEAD_LETTER_COLUMNS, *limit),
            )
        }
        SubsCommand::Pause { id } => (
            api.post(&["subscriptions", &id.to_string(), "pause"], &json!({}))
                .await?,
            Shape::One,
        ),
        SubsCommand::Resume { id } => (
            api.post(&["subscriptions", &id.to_string(), "resume"], &json!({}))
                .await?,
            Shape::One,
        ),
        SubsCommand::Replay { id, offsets } => {
            let body = if offsets.is_empty() {
                json!({})
            } else {
                json!({ "offsets": offsets })
            };
            let path = ["subscriptions", &id.to_string(), "dead-letters", "replay"];
            (api.post(&path, &body).await?, Shape::One)
        }
    };
    Ok(print(args.output, &answer, shape))
}

/// Runs `partners`; the text to print.
pub async fn partners(args: &OpsArgs) -> anyhow::Result<String> {
    let answer = api(args)?.get(&["partners"], &[]).await?;
    let shape = Shape::List("partners", PARTNER_COLUMNS, u32::MAX);
    Ok(print(args.output, &answer, shape))
}

/// Runs an `endpoints` command; the text to print.
pub async fn endpoints(args: &OpsArgs, command: &EndpointsCommand) -> anyhow::Result<String> {
    let api = api(args)?;
    let (answer, shape) = match command {
        EndpointsCommand::List { kind } => {
            let answer = api.get(&[endpoints_path(*kind)], &[]).await?;
            match kind {
                EndpointKind::Callback => (
                    answer,
                    Shape::List("registrations", ENDPOINT_COLUMNS, u32::MAX),
                ),
                EndpointKind::Push => (answer, Shape::One),
            }
        }
        EndpointsCommand::Add { url, kind, partner } => {
            let mut body = json!({ "url": url });
            if let Some(p) = partner {
                body["partner"] = json!(p);
            }
            (api.post(&[endpoints_path(*kind)], &body).await?, Shape::One)
        }
        EndpointsCommand::Rm { url, kind, partner } => {
            let mut body = json!({ "url": url });
            if let Some(p) = partner {
                body["partner"] = json!(p);
            }
            api.delete(&[endpoints_path(*kind)], &body).await?;
            (json!({ "removed": url }), Shape::One)
        }
    };
    Ok(print(args.output, &answer, shape))
}

/// How a table shows an answer: the array under a key, in columns, a page of at most the
/// limit asked for; or one object.
#[derive(Clone, Copy)]
enum Shape {
    List(&'static str, &'static [(&'static str, &'static str)], u32),
    One,
}

/// (heading, JSON pointer) of each column.
const MESSAGE_COLUMNS: &[(&str, &str)] = &[
    ("ID", "/id"),
    ("STATE", "/state"),
    ("PARTNER", "/partner"),
    ("ATTEMPTS", "/attempts"),
    ("DESTINATION", "/destination"),
    ("GROUP", "/group_id"),
    ("NUMBER", "/number"),
    ("LAST ERROR", "/last_error"),
];
const ATTEMPT_COLUMNS: &[(&str, &str)] = &[
    ("N", "/n"),
    ("KIND", "/kind"),
    ("AT", "/at"),
    ("STATUS", "/status"),
    ("VERDICT", "/verdict"),
    ("FAULT", "/fault"),
    ("CAUSE", "/cause"),
];
const PARTNER_COLUMNS: &[(&str, &str)] = &[
    ("NAME", "/name"),
    ("ADDRESS", "/configured/address"),
    ("LAST SUCCESS", "/last_success_at"),
    ("FAILING", "/failures_in_row"),
    ("QUEUED", "/messages/queued"),
    ("SENT", "/messages/sent"),
    ("IN DOUBT", "/messages/in_doubt"),
    ("FAILED", "/messages/failed"),
    ("ACKS OWED", "/callback_acks_owed"),
    ("REFUSED", "/refused_sign_ins/count"),
    ("LAST ERROR", "/last_error"),
];
const GROUP_COLUMNS: &[(&str, &str)] = &[
    ("PARTNER", "/partner"),
    ("GROUP", "/group_id"),
    ("CHANNEL", "/channel"),
    ("STATUS", "/status"),
    ("DELIVERED", "/delivered"),
    ("BUFFERED", "/buffered"),
];
const SUBSCRIPTION_COLUMNS: &[(&str, &str)] = &[
    ("ID", "/id"),
    ("NAME", "/name"),
    ("MODE", "/mode"),
    ("OWNER", "/owner"),
    ("FILTER", "/filter"),
];
const DEAD_LETTER_COLUMNS: &[(&str, &str)] = &[
    ("OFFSET", "/offset"),
    ("ATTEMPTS", "/attempts"),
    ("TOPIC", "/message/topic"),
    ("REASON", "/reason"),
];
const ENDPOINT_COLUMNS: &[(&str, &str)] = &[("PARTNER", "/partner"), ("URL", "/url")];

fn print(output: Output, answer: &Value, shape: Shape) -> String {
    match (output, shape) {
        (Output::Json, _) => serde_json::to_string_pretty(answer).unwrap_or_default(),
        (Output::Table, Shape::List(key, columns, limit)) => {
            let rows = answer[key].as_array().map(Vec::as_slice).unwrap_or(&[]);
            let mut text = table(rows, columns);
            // A short page is the last one.
            let full = rows.len() >= limit as usize;
            if let Some(next) = answer.get("next_after").filter(|n| full && !n.is_null()) {
                text.push_str(&format!("next page: --after {}", cell(next)));
                // Groups page by (partner, id): "" is the anonymous senders' partner.
                if let Some(partner) = answer["next_after_partner"].as_str() {
                    text.push_str(&format!(" --after-partner '{partner}'"));
                }
                text.push('\n');
            }
            text
        }
        (Output::Table, Shape::One) => pairs(answer),
    }
}

/// A value as one table cell: text as it is, nothing as `-`, the rest as compact JSON.
fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        // Anonymous partners are "" in the API.
        Value::String(s) if s.is_empty() => "-".to_owned(),
        Value::String(s) => s.clone(),
        Value::Object(o) if o.contains_key("cause") => cell(&o["cause"]),
        other => other.to_string(),
    }
}

/// Rows in aligned columns under their headings.
fn table(rows: &[Value], columns: &[(&str, &str)]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            columns
                .iter()
                .map(|(_, at)| cell(r.pointer(at).unwrap_or(&Value::Null)))
                .collect()
        })
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, (heading, _))| {
            cells
                .iter()
                .map(|row| row[i].chars().count())
                .chain([heading.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |values: Vec<&str>| {
        let padded: Vec<String> = values
            .iter()
            .zip(&widths)
            .map(|(v, w)| format!("{v:<w$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut text = line(columns.iter().map(|(h, _)| *h).collect());
    for row in &cells {
        text.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    text
}

/// One object as `key  value` lines.
fn pairs(answer: &Value) -> String {
    let Some(object) = answer.as_object() else {
        return format!("{}\n", cell(answer));
    };
    let width = object.keys().map(String::len).max().unwrap_or(0);
    object
        .iter()
        .map(|(k, v)| format!("{k:<width$}  {}\n", cell(v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_aligns_its_columns_and_says_where_the_next_page_starts() {
        let answer = json!({
            "messages": [
                {"id": "a", "state": "sent", "attempts": 1, "destination": "acme", "partner": "acme",
                 "group_id": "mid:1", "number": null,
                 "last_error": {"cause": "connection refused", "at": "…"}},
                {"id": "bbbb", "state": "acked", "attempts": 12, "destination": "acme", "partner": "acme",
                 "group_id": "mid:2", "number": 3, "last_error": null},
            ],
            "next_after": "bbbb",
        });
        let text = print(
            Output::Table,
            &answer,
            Shape::List("messages", MESSAGE_COLUMNS, 2),
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "ID    STATE  PARTNER  ATTEMPTS  DESTINATION  GROUP  NUMBER  LAST ERROR"
        );
        assert_eq!(
            lines[1],
            "a     sent   acme     1         acme         mid:1  -       connection refused"
        );
        assert_eq!(
            lines[2],
            "bbbb  acked  acme     12        acme         mid:2  3       -"
        );
        assert_eq!(lines[3], "next page: --after bbbb");
        let short = print(
            Output::Table,
            &answer,
            Shape::List("messages", MESSAGE_COLUMNS, 100),
        );
        assert!(
            !short.contains("next page"),
            "a short page is the last: {short}"
        );
        let one = print(
            Output::Table,
            &json!({"id": "a", "state": "failed"}),
            Shape::One,
        );
        assert_eq!(one, "id     a\nstate  failed\n");
    }
}
