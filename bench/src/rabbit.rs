//! RabbitMQ: a durable quorum queue, emptied by deleting and redeclaring it; C workers, each
//! with its own channel in confirm mode, publish persistent messages to the default exchange and
//! await each publisher confirm before the next publish; for the end-to-end row, K consumers
//! (manual acks, prefetch) take them off the queue at the same time.
//!
//! A quorum queue confirms a message once it is in its Raft log, which RabbitMQ fdatasyncs
//! before confirming.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures_util::StreamExt as _;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};

use crate::load::{self, Figures, Params, Recorder};

const QUEUE: &str = "wsr-compare";
/// AMQP 0.9.1 `delivery_mode` 2: persistent.
const PERSISTENT: u8 = 2;

pub struct Rabbit {
    conn: Connection,
}

impl Rabbit {
    /// Connects to `url` (e.g. `amqp://guest:guest@127.0.0.1:5672/%2f`), failing fast when no
    /// broker answers.
    pub async fn connect(url: &str) -> anyhow::Result<Rabbit> {
        let conn = tokio::time::timeout(
            Duration::from_secs(5),
            Connection::connect(url, ConnectionProperties::default()),
        )
        .await
        .with_context(|| format!("connecting to RabbitMQ at {}: timed out", redact(url)))?
        .with_context(|| format!("connecting to RabbitMQ at {}", redact(url)))?;
        Ok(Rabbit { conn })
    }

    /// Deletes the queue if present and declares it anew: durable, `x-queue-type: quorum`.
    async fn recreate_queue(&self) -> anyhow::Result<()> {
        // A failed delete closes its channel: use a throwaway one.
        let channel = self
            .conn
            .create_channel()
            .await
            .context("opening a channel")?;
        let _ = channel
            .queue_delete(QUEUE.into(), QueueDeleteOptions::default())
            .await;
        let channel = self
            .conn
            .create_channel()
            .await
            .context("opening a channel")?;
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        channel
            .queue_declare(
                QUEUE.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                args,
            )
            .await
            .with_context(|| format!("declaring quorum queue {QUEUE}"))?;
        let _ = channel.close(200, "declared".into()).await;
        Ok(())
    }

    /// The closed-loop publish phase.
    pub async fn publish_phase(&self, params: &Params) -> anyhow::Result<Figures> {
        self.recreate_queue().await?;
        let publishers = self.publishers(params).await?;
        let started = Instant::now();
        let deadline = started + params.duration;
        let recorder = publishers(started, deadline).await?;
        Ok(recorder.figures(started.elapsed()))
    }

    /// C publishers as in [`Self::publish_phase`] and, concurrently, K consumers, each on its
    /// own channel with `basic.qos` prefetch = the batch size, acking every delivery manually
    /// (one `basic.ack` each, not `multiple`). The figures are the consumers': acked messages
    /// per second and publish → ack latency.
    pub async fn e2e_phase(&self, params: &Params) -> anyhow::Result<Figures> {
        self.recreate_queue().await?;
        let publishers = self.publishers(params).await?;
        let prefetch = u16::try_from(params.batch).unwrap_or(u16::MAX);
        let mut consumers = Vec::with_capacity(params.consumers);
        for i in 0..params.consumers {
            let channel = self
                .conn
                .create_channel()
                .await
                .context("opening a channel")?;
            channel
                .basic_qos(prefetch, BasicQosOptions::default())
                .await
                .context("basic.qos")?;
            let consumer = channel
                .basic_consume(
                    QUEUE.into(),
                    format!("compare-{i}").as_str().into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .context("basic.consume")?;
            consumers.push((channel, consumer));
        }
        let started = Instant::now();
        let deadline = started + params.duration;
        let publishing = tokio::spawn(publishers(started, deadline));
        let mut consumers = consumers.into_iter();
        let consumed = load::run_workers(
            params.consumers,
            load::worker_bound(params.duration),
            |_| {
                let consumer = consumers.next();
                async move {
                    let mut rec = Recorder::default();
                    let Some((channel, mut consumer)) = consumer else {
                        rec.error_kind("no consumer for this worker");
                        return rec;
                    };
                    loop {
                        let left = deadline.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            break;
                        }
                        let delivery = match tokio::time::timeout(left, consumer.next()).await {
                            Err(_) => break,
                            Ok(None) => {
                                rec.error_kind("consumer stream ended");
                                break;
                            }
                            Ok(Some(Err(e))) => {
                                rec.error(&anyhow::Error::new(e).context("delivery"));
                                continue;
                            }
                            Ok(Some(Ok(delivery))) => delivery,
                        };
                        match delivery.ack(BasicAckOptions::default()).await {
                            Ok(_) => match load::read_stamp(&delivery.data) {
                                Ok(sent) => rec.latency(started.elapsed().saturating_sub(sent)),
                                Err(e) => rec.error(&e),
                            },
                            Err(e) => rec.error(&anyhow::Error::new(e).context("basic.ack")),
                        }
                    }
                    let _ = channel.close(200, "done".into()).await;
                    rec
                }
            },
        )
        .await;
        let elapsed = started.elapsed();
        let published = publishing
            .await
            .context("publisher task")??
            .figures(elapsed);
        let consumed = consumed?.figures(elapsed);
        eprintln!(
            "[compare]   e2e publishers alongside: {:.0} msgs/s ({} published, {} consumed)",
            published.msgs_per_s, published.count, consumed.count
        );
        Ok(consumed)
    }

    /// Opens and confirm-enables C channels (before the clock starts) and returns the closed
    /// loop to run on them from `started` until `deadline`.
    async fn publishers(
        &self,
        params: &Params,
    ) -> anyhow::Result<impl FnOnce(Instant, Instant) -> PublishLoop + use<>> {
        let mut channels = Vec::with_capacity(params.connections);
        for _ in 0..params.connections {
            let channel = self
                .conn
                .create_channel()
                .await
                .context("opening a channel")?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .context("confirm.select")?;
            channels.push(channel);
        }
        let params = params.clone();
        Ok(move |started: Instant, deadline: Instant| -> PublishLoop {
            Box::pin(publish_loop(channels, params, started, deadline))
        })
    }
    /// Deletes the queue and closes the connection.
    pub async fn cleanup(self) {
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            if let Ok(channel) = self.conn.create_channel().await {
                let _ = channel
                    .queue_delete(QUEUE.into(), QueueDeleteOptions::default())
                    .await;
            }
            let _ = self.conn.close(200, "bye".into()).await;
        })
        .await;
    }
}

type PublishLoop =
    std::pin::Pin<Box<dyn Future<Output = anyhow::Result<Recorder>> + Send + 'static>>;

async fn publish_loop(
    channels: Vec<lapin::Channel>,
    params: Params,
    started: Instant,
    deadline: Instant,
) -> anyhow::Result<Recorder> {
    let mut channels = channels.into_iter();
    let payload = params.payload;
    load::run_workers(
        params.connections,
        load::worker_bound(params.duration),
        |_| {
            let channel = channels.next();
            async move {
                let mut rec = Recorder::default();
                let Some(channel) = channel else {
                    rec.error_kind("no channel for this worker");
                    return rec;
                };
                let mut body = load::payload(payload);
                while Instant::now() < deadline {
                    load::stamp(&mut body, started.elapsed());
                    rec.time(async {
                        let confirm = channel
                            .basic_publish(
                                "".into(),
                                QUEUE.into(),
                                BasicPublishOptions::default(),
                                &body,
                                BasicProperties::default().with_delivery_mode(PERSISTENT),
                            )
                            .await
                            .context("basic.publish")?
                            .await
                            .context("publisher confirm")?;
                        if !confirm.is_ack() {
                            bail!("publisher confirm: nack");
                        }
                        Ok(())
                    })
                    .await;
                }
                let _ = channel.close(200, "done".into()).await;
                rec
            }
        },
    )
    .await
}

/// The URL without its password, for logs and the table.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redacts_the_password() {
        assert_eq!(
            redact("amqp://guest:guest@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(redact("amqp://127.0.0.1"), "amqp://127.0.0.1");
    }
}
