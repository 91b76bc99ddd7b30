//! A consumer process: a member of B's shared subscription that "processes" each message into
//! the application database shared by all consumers, then accepts it.
//!
//! Processing is idempotent, as any application behind an at-least-once subscription must be:
//! one transaction records the delivery attempt and, if this message was never processed, the
//! processing itself (with an increasing serial, so the checker sees processing order). A
//! consumer killed between processing and settling gets the message again after its session
//! lapses (to itself or another member); the record says it was done and it is only accepted.
//! Every settle answer is recorded too, so the checker can prove no accepted message was
//! handed out again.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

#[derive(Debug, clap::Args)]
pub struct ConsumeArgs {
    /// B's base URL, e.g. https://127.0.0.1:8081
    #[arg(long)]
    pub url: String,
    #[arg(long)]
    pub token: String,
    #[arg(long)]
    pub subscription: i64,
    /// The application database shared by all consumers.
    #[arg(long)]
    pub app_db: PathBuf,
    /// This consumer's name in the processing log.
    #[arg(long)]
    pub name: String,
    #[arg(long, default_value_t = 3000)]
    pub ttl_ms: u64,
    /// Sleep up to this long while "processing" each message, so that kills land mid-batch,
    /// between processing and settling.
    #[arg(long, default_value_t = 100)]
    pub work_ms: u64,
    /// The PEM CA that B's certificate chains to (the run's); the only one trusted.
    #[arg(long)]
    pub ca: PathBuf,
}

/// The application database: what the checker reads as "processed".
pub const APP_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS processed (
    serial   INTEGER PRIMARY KEY AUTOINCREMENT,
    hid      TEXT NOT NULL UNIQUE,
    group_id TEXT NOT NULL,
    number   INTEGER,
    consumer TEXT NOT NULL,
    attempt  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS deliveries (
    hid      TEXT NOT NULL,
    offset   INTEGER NOT NULL,
    attempt  INTEGER NOT NULL,
    consumer TEXT NOT NULL,
    fresh    INTEGER NOT NULL,
    batch    INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS settles (
    hid      TEXT NOT NULL,
    offset   INTEGER NOT NULL,
    attempt  INTEGER NOT NULL,
    status   INTEGER NOT NULL
);
";

pub async fn open_app_db(path: &std::path::Path) -> Result<SqlitePool> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .with_context(|| format!("open the application database {}", path.display()))?;
    sqlx::raw_sql(APP_SCHEMA).execute(&pool).await?;
    Ok(pool)
}

/// The harness id a message carries in its payload (`<c:Item id="…">`).
pub fn harness_id(payload: &str) -> Option<&str> {
    let start = payload.find(" id=\"")? + 5;
    let len = payload[start..].find('"')?;
    Some(&payload[start..start + len])
}

struct Delivery {
    hid: String,
    offset: i64,
    attempt: i64,
    group_id: String,
    number: Option<i64>,
    receipt: String,
}

fn delivery_of(m: &Value) -> Result<Delivery> {
    let payload = m["payload"].as_str().context("payload")?;
    Ok(Delivery {
        hid: harness_id(payload)
            .with_context(|| format!("no harness id in {payload:?}"))?
            .to_owned(),
        offset: m["offset"].as_i64().context("offset")?,
        attempt: m["attempt"].as_i64().context("attempt")?,
        group_id: m["group_id"].as_str().context("group_id")?.to_owned(),
        number: m["number"].as_i64(),
        receipt: m["receipt"].as_str().context("receipt")?.to_owned(),
    })
}

pub async fn consume(args: ConsumeArgs) -> Result<()> {
    let db = open_app_db(&args.app_db).await?;
    let ca = std::fs::read(&args.ca).with_context(|| format!("read {}", args.ca.display()))?;
    let http = crate::run::https_client(&ca, Duration::from_secs(15))?;
    let api = format!("{}/api/v1", args.url);
    let auth = format!("Bearer {}", args.token);
    let mut rng = fastrand::Rng::new();
    println!("consumer {} running", args.name);
    loop {
        let session = match join(&http, &api, &auth, &args).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "join failed; B may be restarting");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        // Fetch until the session is gone (B lost it, or it lapsed while B was down).
        loop {
            let answer = http
                .post(format!("{api}/sessions/{session}/fetch"))
                .header("Authorization", &auth)
                .json(&json!({ "max": 8, "wait_ms": 1000 }))
                .send()
                .await;
            let answer = match answer {
                Ok(a) => a,
                Err(e) => {
                    tracing::debug!(error = %e, "fetch failed");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let status = answer.status();
            if status.as_u16() == 404 || status.as_u16() == 410 || status.as_u16() == 403 {
                break;
            }
            let Ok(body) = answer.json::<Value>().await else {
                continue;
            };
            if !status.is_success() {
                tracing::debug!(%status, %body, "fetch refused");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            let messages = body["messages"].as_array().cloned().unwrap_or_default();
            let mut done = Vec::with_capacity(messages.len());
            // Which fetch handed each message out (random: unique across restarts).
            let batch = rng.i64(0..i64::MAX);
            for m in &messages {
                let d = delivery_of(m)?;
                process(&db, &d, &args.name, batch).await?;
                if args.work_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(rng.u64(0..=args.work_ms))).await;
                }
                done.push(d);
            }
            if !done.is_empty() {
                settle(&http, &api, &auth, &db, &done).await?;
            }
        }
    }
}

async fn join(http: &reqwest::Client, api: &str, auth: &str, args: &ConsumeArgs) -> Result<String> {
    let answer = http
        .post(format!(
            "{api}/subscriptions/{}/sessions",
            args.subscription
        ))
        .header("Authorization", auth)
        .json(&json!({ "ttl_ms": args.ttl_ms }))
        .send()
        .await?;
    let status = answer.status();
    let body: Value = answer.json().await?;
    if !status.is_success() {
        bail!("join answered {status}: {body}");
    }
    Ok(body["session"].as_str().context("session")?.to_owned())
}

/// The application's work, done at most once per message whatever the redeliveries.
async fn process(db: &SqlitePool, d: &Delivery, consumer: &str, batch: i64) -> Result<()> {
    let mut tx = db.begin_with("BEGIN IMMEDIATE").await?;
    let seen: Option<i64> = sqlx::query_scalar("SELECT 1 FROM processed WHERE hid = ?")
        .bind(&d.hid)
        .fetch_optional(&mut *tx)
        .await?;
    if seen.is_none() {
        sqlx::query(
            "INSERT INTO processed (hid, group_id, number, consumer, attempt) \
             VALUES (?, ?, ?, ?, ?)",
        )
        .bind(&d.hid)
        .bind(&d.group_id)
        .bind(d.number)
        .bind(consumer)
        .bind(d.attempt)
        .execute(&mut *tx)
        .await?;
    }
    sqlx::query(
        "INSERT INTO deliveries (hid, offset, attempt, consumer, fresh, batch) \
         VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(&d.hid)
    .bind(d.offset)
    .bind(d.attempt)
    .bind(consumer)
    .bind(i64::from(seen.is_none()))
    .bind(batch)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Accepts a batch and records each answer (200 = accepted for good).
async fn settle(
    http: &reqwest::Client,
    api: &str,
    auth: &str,
    db: &SqlitePool,
    done: &[Delivery],
) -> Result<()> {
    let settlements: Vec<Value> = done
        .iter()
        .map(|d| json!({ "receipt": d.receipt, "outcome": "accepted" }))
        .collect();
    let answer = http
        .post(format!("{api}/settle"))
        .header("Authorization", auth)
        .json(&json!({ "settlements": settlements }))
        .send()
        .await;
    // No answer: unknown whether it counted; the message comes back if it did not.
    let Ok(answer) = answer else { return Ok(()) };
    let Ok(body) = answer.json::<Value>().await else {
        return Ok(());
    };
    let results = body["results"].as_array().cloned().unwrap_or_default();
    for (d, r) in done.iter().zip(results) {
        let status = if r["settled"].as_bool() == Some(true) {
            200
        } else {
            r["status"].as_i64().unwrap_or(0)
        };
        sqlx::query("INSERT INTO settles (hid, offset, attempt, status) VALUES (?, ?, ?, ?)")
            .bind(&d.hid)
            .bind(d.offset)
            .bind(d.attempt)
            .bind(status)
            .execute(db)
            .await?;
    }
    Ok(())
}
