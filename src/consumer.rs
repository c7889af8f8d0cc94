//! [`ConsumerBuilder`], [`Consumer`] and its stream [`Pull`]: how an application takes
//! deliveries of one group. Each call forwards to the backend's consumer (`backend.rs`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::backend::{ConsumerBackend, ConsumerConfig};
use crate::delivery::{Delivery, NackOutcome};
use crate::error::Result;
use crate::spool::Spool;

/// Configures a [`Consumer`].
#[derive(Debug)]
#[must_use = "call .build() to get a consumer"]
pub struct ConsumerBuilder {
    spool: Spool,
    topic: String,
    group: String,
    cfg: ConsumerConfig,
}

impl ConsumerBuilder {
    pub(crate) fn new(spool: Spool, topic: &str, group: &str, cfg: ConsumerConfig) -> Self {
        ConsumerBuilder {
            spool,
            topic: topic.to_owned(),
            group: group.to_owned(),
            cfg,
        }
    }

    /// Leave every ack and nack to the application (default: auto-ack, see [`Consumer`]).
    pub fn manual_ack(mut self) -> Self {
        self.cfg.manual_ack = true;
        self
    }

    /// How many deliveries the group may have out at once, across its consumers
    /// (default 1: strict order). The group uses the value of its latest `build`.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.cfg.max_in_flight = n.max(1);
        self
    }

    /// Each delivery must be acked or nacked within `deadline` of its hand-out
    /// (JetStream's AckWait, SQS's visibility timeout). Default: the instance's
    /// `Ack Deadline Ms` (0: none); this wins over it, and zero turns it off.
    ///
    /// A delivery whose deadline passes:
    /// - is taken back as a failed attempt (reason [`crate::consts::ACK_DEADLINE_REASON`]);
    /// - is delivered again, to any consumer of the group, after the `Nack Backoff`;
    /// - or is dead-lettered, at `Max Delivery Attempts`;
    /// - no longer counts in `in_flight`, and its slot is free;
    /// - and its late ack or nack fails with `Error::DeliveryExpired`, changing nothing.
    ///
    /// Auto-ack consumers have deadlines too: a handler that takes longer than the
    /// deadline gets its message again. A handler still at work calls
    /// [`Delivery::extend_deadline`](crate::Delivery::extend_deadline).
    pub fn ack_deadline(mut self, deadline: Duration) -> Self {
        self.cfg.ack_deadline = Some(deadline);
        self
    }

    /// Key-ordered parallelism: with `max_in_flight(n > 1)`, at most one delivery per
    /// message key is out at a time, and each key's messages come in offset order,
    /// redeliveries and delayed ones included. Other keys flow past a key that waits.
    ///
    /// - The key is the `message-key` header ([`crate::consts::MESSAGE_KEY_HEADER`]).
    /// - Messages without it are not ordered among themselves.
    /// - The cursor stays the ack floor.
    /// - The group orders by key while any consumer built with `key_ordered()` is open;
    ///   its other consumers follow the same order meanwhile.
    pub fn key_ordered(mut self) -> Self {
        self.cfg.key_ordered = true;
        self
    }

    /// Before `recv` parks its thread to wait for a record, it spins watching for one, for
    /// up to `budget` in all per call (default zero: it parks at once).
    ///
    /// It is for latency: a parked thread takes tens of microseconds to wake on some
    /// machines (a virtual CPU that halted); a spinning one sees the record within a
    /// microsecond. The costs:
    /// - a CPU is busy while the topic is quiet;
    /// - the runtime's other tasks on that thread wait while it spins (`recv_timeout`'s
    ///   timer too: it may fire up to `budget` late). Give such a consumer a thread of its
    ///   own.
    ///
    /// A close ends the spin at once.
    pub fn busy_poll(mut self, budget: Duration) -> Self {
        self.cfg.busy_poll = budget;
        self
    }

    /// Checks the names, creates the topic and group if needed.
    pub fn build(self) -> Result<Consumer> {
        let inner = self
            .spool
            .backend()
            .consumer(&self.topic, &self.group, self.cfg)?;
        Ok(Consumer { inner })
    }
}

/// Pulls deliveries of one group of one topic.
///
/// **Auto-ack** (the default): the previous delivery is acked when this consumer asks for
/// the next one, or is closed or dropped; never when it is handed out, so a
/// `recv -> handle -> recv` loop is at-least-once. Auto-acks are persisted every
/// `Commit Interval Ms` (default 100 ms) and on [`Spool::close`]: after a crash, up to
/// that window of auto-acked messages is delivered again. An explicit `ack`/`nack` on the
/// delivery still works and is durable when it returns.
///
/// **Manual ack**: a delivery dropped without ack or nack is released and delivered
/// again (a release does not count as an attempt).
#[derive(Debug)]
pub struct Consumer {
    inner: ConsumerBackend,
}

impl Consumer {
    /// The topic this consumer reads.
    pub fn topic(&self) -> &str {
        match &self.inner {
            ConsumerBackend::Embedded(c) => c.topic(),
            #[cfg(feature = "kafka")]
            ConsumerBackend::Kafka(c) => c.topic(),
        }
    }

    /// The consumer group it belongs to.
    pub fn group(&self) -> &str {
        match &self.inner {
            ConsumerBackend::Embedded(c) => c.group(),
            #[cfg(feature = "kafka")]
            ConsumerBackend::Kafka(c) => c.group(),
        }
    }

    /// Waits for the next delivery.
    pub async fn recv(&mut self) -> Result<Delivery> {
        match &mut self.inner {
            ConsumerBackend::Embedded(c) => c.recv().await.map(Delivery::embedded),
            #[cfg(feature = "kafka")]
            ConsumerBackend::Kafka(c) => c.recv().await.map(Delivery::kafka),
        }
    }

    /// The next delivery if one is available now, without waiting (and without a runtime
    /// timer: the cheap way to fill a window of deliveries after a `recv`).
    pub fn try_recv(&mut self) -> Result<Option<Delivery>> {
        match &mut self.inner {
            ConsumerBackend::Embedded(c) => Ok(c.try_recv()?.map(Delivery::embedded)),
            #[cfg(feature = "kafka")]
            ConsumerBackend::Kafka(c) => Ok(c.try_recv()?.map(Delivery::kafka)),
        }
    }

    /// Waits for at least one delivery, then returns every delivery ready now, up to
    /// `max` (Kafka's `poll`, JetStream's `fetch`): fewer when the log has no more yet,
    /// or when the group's `max_in_flight` leaves no more room (with the default of 1, a
    /// batch has one delivery). `max` 0 returns an empty batch at once.
    ///
    /// With auto-ack, the whole batch is acked when this consumer asks for its next
    /// delivery or batch (or is closed), as a single delivery is. With manual ack, each
    /// delivery is acked or nacked as usual; [`Consumer::ack_all`] and
    /// [`Consumer::nack_all`] do it for the batch in one commit.
    pub async fn recv_batch(&mut self, max: usize) -> Result<Vec<Delivery>> {
        match &mut self.inner {
            ConsumerBackend::Embedded(c) => Ok(c
                .recv_batch(max)
                .await?
                .into_iter()
                .map(Delivery::embedded)
                .collect()),
            #[cfg(feature = "kafka")]
            ConsumerBackend::Kafka(c) => Ok(c
                .recv_batch(max)
                .await?
                .into_iter()
                .map(Delivery::kafka)
                .collect()),
        }
    }

    /// Acks every delivery of `deliveries` with one durable catalog commit; returns once
    /// it is durable (under `Sync=Always`, also against power loss). Each ack is made
    /// when this is first polled, so the group's slots free up at once.
    ///
    /// Partial failure, as a loop of [`Delivery::ack`] would leave it: a delivery that
    /// can no longer be acked (the group was reset since: `StaleDelivery`; its ack
    /// deadline passed: `DeliveryExpired`) changes nothing, and every other one is acked
    /// all the same. The call then returns the error of the first such delivery, in the
    /// order given, once the others are durable. A failed commit returns its error
    /// instead: some or all of the acks may not be durable (with several groups, each
    /// group's commit on its own).
    ///
    /// Deliveries of another consumer, or another group, may be among them: each is acked
    /// in its own group (groups taken together usually share the commit).
    pub async fn ack_all(&self, deliveries: Vec<Delivery>) -> Result<()> {
        Delivery::ack_all(deliveries).await
    }

    /// Nacks every delivery of `deliveries` with `reason`, as [`Delivery::nack`] would one
    /// by one, but with one catalog commit for all that are redelivered. Returns one
    /// outcome per delivery, in the order given; every `next_offset` is the group's
    /// cursor after the whole batch.
    ///
    /// A delivery whose nack reaches `Max Delivery Attempts` is dead-lettered after that
    /// commit, exactly as a single nack does it: the dead-letter copy is durable before
    /// the cursor moves past it (the dead-letter protocol adds its own commits for it).
    /// Each waits the `Nack Backoff` for its attempt number, if one is set.
    ///
    /// Partial failure follows [`Consumer::ack_all`]: a stale or expired delivery changes
    /// nothing, every other one is nacked, and the call returns the first such error
    /// (no outcomes). A failed commit returns its error: every delivery of the batch not
    /// yet nacked is delivered again without an attempt counted (those at the limit too).
    /// A failed dead-letter copy concerns its own delivery only.
    pub async fn nack_all(
        &self,
        deliveries: Vec<Delivery>,
        reason: &str,
    ) -> Result<Vec<NackOutcome>> {
        Delivery::nack_all(deliveries, reason).await
    }

    /// Waits up to `timeout` for the next delivery (`None` if none came). Needs a tokio
    /// runtime with the time driver enabled.
    pub async fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<Delivery>> {
        match tokio::time::timeout(timeout, self.recv()).await {
            Ok(r) => r.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// The deliveries as a stream (it ends after an error such as `Closed`).
    pub fn pull(&mut self) -> Pull<'_> {
        Pull {
            consumer: Some(self),
            pending: None,
            done: false,
        }
    }

    /// Acks the previous delivery (auto-ack) and stops.
    pub async fn close(self) -> Result<()> {
        match self.inner {
            ConsumerBackend::Embedded(c) => c.close().await,
            #[cfg(feature = "kafka")]
            ConsumerBackend::Kafka(c) => c.close().await,
        }
    }
}

type RecvFuture<'a> =
    Pin<Box<dyn Future<Output = (Result<Delivery>, &'a mut Consumer)> + Send + 'a>>;

/// The stream returned by [`Consumer::pull`].
pub struct Pull<'a> {
    consumer: Option<&'a mut Consumer>,
    pending: Option<RecvFuture<'a>>,
    done: bool,
}

impl futures_core::Stream for Pull<'_> {
    type Item = Result<Delivery>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if self.pending.is_none() {
            let Some(c) = self.consumer.take() else {
                return Poll::Ready(None);
            };
            self.pending = Some(Box::pin(async move {
                let r = c.recv().await;
                (r, c)
            }));
        }
        let Some(fut) = self.pending.as_mut() else {
            return Poll::Ready(None);
        };
        match fut.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready((r, c)) => {
                self.pending = None;
                self.consumer = Some(c);
                if r.is_err() {
                    self.done = true;
                }
                Poll::Ready(Some(r))
            }
        }
    }
}
