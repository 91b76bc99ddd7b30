//! NATS JetStream: a file-storage stream with a duplicate window; closed-loop publishers that
//! await each PubAck, then publishers together with consumers on a durable pull consumer.
//!
//! JetStream acknowledges a publish once the message is in the stream's file store, which by
//! default is fsynced every two minutes (`sync_interval`), not before the PubAck.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{Config, DiscardPolicy, StorageType};
use async_nats::jetstream::{self, Context};
use bytes::Bytes;
use futures_util::StreamExt as _;

use crate::load::{self, Figures, Params, Recorder};

const STREAM: &str = "COMPARE";
const CONSUMER: &str = "compare-e2e";
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// Bounds the stream's disk use; old messages go first.
const MAX_BYTES: i64 = 4 << 30;
/// How long one pull waits for messages when the stream is drained.
const FETCH_EXPIRES: Duration = Duration::from_millis(500);

/// How consumers acknowledge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AckStyle {
    /// `double_ack`: wait for the server to confirm each ack (a batch's acks concurrently).
    Double,
    /// Plain ack: fire and forget.
    Plain,
}

impl AckStyle {
    pub fn describe(self) -> &'static str {
        match self {
            AckStyle::Double => {
                "consumers double_ack (each ack confirmed by the server; a batch's acks awaited concurrently)"
            }
            AckStyle::Plain => "consumers ack without confirmation (plain ack)",
        }
    }
}

pub struct JetStream {
    ctx: Context,
    /// Distinguishes this run's `Nats-Msg-Id`s from any earlier run's.
    run_id: String,
    server_version: String,
}

impl JetStream {
    /// Connects to `url`, failing fast when no server answers.
    pub async fn connect(url: &str) -> anyhow::Result<JetStream> {
        let client = tokio::time::timeout(
            Duration::from_secs(5),
            async_nats::ConnectOptions::new()
                .connection_timeout(Duration::from_secs(3))
                .name("wsr-compare")
                .connect(url),
        )
        .await
        .with_context(|| format!("connecting to NATS at {url}: timed out"))?
        .with_context(|| format!("connecting to NATS at {url}"))?;
        let server_version = client.server_info().version;
        let ctx = jetstream::new(client);
        let run_id = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
            .to_string();
        Ok(JetStream {
            ctx,
            run_id,
            server_version,
        })
    }

    pub fn server_version(&self) -> &str {
        &self.server_version
    }

    /// Deletes the stream if it exists and creates it empty.
    async fn recreate_stream(&self) -> anyhow::Result<jetstream::stream::Stream> {
        // Absent is fine; any other failure shows up in create_stream.
        let _ = self.ctx.delete_stream(STREAM).await;
        self.ctx
            .create_stream(Config {
                name: STREAM.to_owned(),
                subjects: vec!["compare.>".to_owned()],
                storage: StorageType::File,
                duplicate_window: DUPLICATE_WINDOW,
                max_bytes: MAX_BYTES,
                discard: DiscardPolicy::Old,
                num_replicas: 1,
                ..Default::default()
            })
            .await
            .map_err(|e| anyhow!(e))
            .with_context(|| format!("creating stream {STREAM}"))
    }

    /// Removes the stream and its data.
    pub async fn cleanup(&self) {
        let _ = tokio::time::timeout(Duration::from_secs(10), self.ctx.delete_stream(STREAM)).await;
    }

    /// C publishers, each awaiting its PubAck before the next publish.
    pub async fn publish_phase(&self, params: &Params) -> anyhow::Result<Figures> {
        self.recreate_stream().await?;
        let started = Instant::now();
        let deadline = started + params.duration;
        let recorder = self
            .publishers(params, "compare.pub", started, deadline, "p")
            .await?;
        Ok(recorder.figures(started.elapsed()))
    }

    fn publishers(
        &self,
        params: &Params,
        subject: &'static str,
        t0: Instant,
        deadline: Instant,
        tag: &'static str,
    ) -> impl Future<Output = anyhow::Result<Recorder>> + Send + 'static {
        let ctx = self.ctx.clone();
        let run_id = Arc::new(self.run_id.clone());
        let payload = params.payload;
        let bound = load::worker_bound(params.duration);
        let connections = params.connections;
        async move {
            load::run_workers(connections, bound, |worker| {
                let ctx = ctx.clone();
                let run_id = Arc::clone(&run_id);
                async move {
                    let mut rec = Recorder::default();
                    let mut body = load::payload(payload);
                    let mut n: u64 = 0;
                    while Instant::now() < deadline {
                        n += 1;
                        load::stamp(&mut body, t0.elapsed());
                        let message = PublishMessage::build()
                            .payload(Bytes::copy_from_slice(&body))
                            .message_id(format!("{run_id}-{tag}-{worker}-{n}"));
                        rec.time(async {
                            let ack = ctx
                                .send_publish(subject, message)
                                .await
                                .context("publish")?
                                .await
                                .context("PubAck")?;
                            if ack.duplicate {
                                bail!("PubAck: flagged as a duplicate");
                            }
                            Ok(())
                        })
                        .await;
                    }
                    rec
                }
            })
            .await
        }
    }

    /// C publishers as in [`Self::publish_phase`] and, concurrently, K consumers on one durable
    /// pull consumer fetching batches and acking each message. The figures are the consumers':
    /// acked messages per second and publish→ack latency.
    pub async fn e2e_phase(&self, params: &Params, ack: AckStyle) -> anyhow::Result<Figures> {
        let stream = self.recreate_stream().await?;
        let consumer: PullConsumer = stream
            .create_consumer(pull::Config {
                durable_name: Some(CONSUMER.to_owned()),
                ack_policy: AckPolicy::Explicit,
                deliver_policy: DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .map_err(|e| anyhow!(e))
            .with_context(|| format!("creating durable pull consumer {CONSUMER}"))?;

        let started = Instant::now();
        let deadline = started + params.duration;
        let publishers =
            tokio::spawn(self.publishers(params, "compare.e2e", started, deadline, "e"));
        let batch = params.batch;
        let consumers = load::run_workers(
            params.consumers,
            load::worker_bound(params.duration),
            |_| consume(consumer.clone(), batch, ack, started, deadline),
        )
        .await;
        let elapsed = started.elapsed();
        let published = publishers.await.context("publisher task")??;
        let published = published.figures(elapsed);
        let consumed = consumers?.figures(elapsed);
        eprintln!(
            "[compare]   e2e publishers alongside: {:.0} msgs/s ({} published, {} consumed)",
            published.msgs_per_s, published.count, consumed.count
        );
        Ok(consumed)
    }
}

/// One consumer: fetch a batch, ack each message, record publish→ack for each confirmed ack.
async fn consume(
    consumer: PullConsumer,
    batch: usize,
    ack: AckStyle,
    t0: Instant,
    deadline: Instant,
) -> Recorder {
    let mut rec = Recorder::default();
    while Instant::now() < deadline {
        let fetched = tokio::time::timeout(load::OP_TIMEOUT, async {
            let mut messages = consumer
                .fetch()
                .max_messages(batch)
                .expires(FETCH_EXPIRES)
                .messages()
                .await
                .map_err(|e| anyhow!(e))
                .context("fetch")?;
            let mut got = Vec::with_capacity(batch);
            while let Some(message) = messages.next().await {
                got.push(message.map_err(|e| anyhow!(e)).context("fetched message")?);
            }
            anyhow::Ok(got)
        })
        .await
        .unwrap_or_else(|_| Err(anyhow!("fetch: timed out")));
        let messages = match fetched {
            Ok(messages) => messages,
            Err(e) => {
                rec.error(&e);
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        match ack {
            AckStyle::Double => {
                let acks = futures_util::future::join_all(messages.iter().map(|m| async move {
                    let result = tokio::time::timeout(load::OP_TIMEOUT, m.double_ack()).await;
                    (m, result)
                }))
                .await;
                for (message, result) in acks {
                    match result {
                        Ok(Ok(())) => record_e2e(&mut rec, &message.payload, t0),
                        Ok(Err(e)) => rec.error(&anyhow!(e).context("double_ack")),
                        Err(_) => rec.error_kind("double_ack: timed out"),
                    }
                }
            }
            AckStyle::Plain => {
                for message in &messages {
                    match message.ack().await {
                        Ok(()) => record_e2e(&mut rec, &message.payload, t0),
                        Err(e) => rec.error(&anyhow!(e).context("ack")),
                    }
                }
            }
        }
    }
    rec
}

fn record_e2e(rec: &mut Recorder, payload: &[u8], t0: Instant) {
    match load::read_stamp(payload) {
        Ok(sent) => rec.latency(t0.elapsed().saturating_sub(sent)),
        Err(e) => rec.error(&e),
    }
}
