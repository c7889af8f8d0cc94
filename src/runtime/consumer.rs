//! Consumers and deliveries: waiting without polling, auto-ack, release on drop.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;

use super::{Spool, now_ms};
use crate::Headers;
use crate::error::{Error, Result};
use crate::format::record::Record;
use crate::queue::{NackOutcome, Ticket, names};

/// Configures a [`Consumer`].
#[derive(Debug)]
#[must_use = "call .build() to get a consumer"]
pub struct ConsumerBuilder {
    spool: Spool,
    topic: String,
    group: String,
    manual_ack: bool,
    max_in_flight: usize,
}

impl ConsumerBuilder {
    pub(crate) fn new(spool: Spool, topic: &str, group: &str) -> Self {
        ConsumerBuilder {
            spool,
            topic: topic.to_owned(),
            group: group.to_owned(),
            manual_ack: false,
            max_in_flight: 1,
        }
    }

    /// Leave every ack and nack to the application (default: auto-ack, see [`Consumer`]).
    pub fn manual_ack(mut self) -> Self {
        self.manual_ack = true;
        self
    }

    /// How many deliveries the group may have out at once, across its consumers
    /// (default 1: strict order). The group uses the value of its latest `build`.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// Checks the names, creates the topic and group if needed.
    pub fn build(self) -> Result<Consumer> {
        names::check(&self.topic)?;
        names::check(&self.group)?;
        self.spool.engine()?.register_consumer(
            &self.topic,
            &self.group,
            self.max_in_flight,
            now_ms(),
        )?;
        let notify = self.spool.notifier(&self.topic);
        Ok(Consumer {
            spool: self.spool,
            topic: self.topic,
            group: self.group,
            manual_ack: self.manual_ack,
            notify,
            previous: None,
        })
    }
}

/// Pulls deliveries of one group of one topic.
///
/// **Auto-ack** (the default): the previous delivery is acked when this consumer asks for
/// the next one, or is closed or dropped; never when it is handed out, so a
/// `recv -> handle -> recv` loop is at-least-once. Auto-acks are persisted every
/// `Commit Interval Ms` (default 100 ms) and on close: after a crash, up to that window
/// of auto-acked messages is delivered again. An explicit `ack`/`nack` on the delivery
/// still works and is durable when it returns.
///
/// **Manual ack**: a delivery dropped without ack or nack is released and delivered
/// again (a release does not count as an attempt).
#[derive(Debug)]
pub struct Consumer {
    spool: Spool,
    topic: String,
    group: String,
    manual_ack: bool,
    notify: std::sync::Arc<tokio::sync::Notify>,
    /// Auto-ack: the delivery to ack when the next one is asked for.
    previous: Option<Ticket>,
}

impl Consumer {
    pub fn topic(&self) -> &str {
        &self.topic
    }
    pub fn group(&self) -> &str {
        &self.group
    }

    fn ack_previous(&mut self) -> Result<()> {
        if let Some(t) = self.previous.take() {
            self.spool
                .engine()?
                .ack_delivery(&self.topic, &self.group, t, None)?;
            self.spool.wake(&self.topic);
        }
        Ok(())
    }

    /// Waits for the next delivery.
    pub async fn recv(&mut self) -> Result<Delivery> {
        self.ack_previous()?;
        loop {
            // Registered before looking, so a publish in between is not missed.
            let notified = self.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let engine = self.spool.engine()?;
            if let Some(h) = engine.next_delivery(&self.topic, &self.group)? {
                drop(engine);
                let ticket = Ticket {
                    offset: h.record.offset(),
                    epoch: h.epoch,
                    token: h.token,
                };
                if !self.manual_ack {
                    self.previous = Some(ticket);
                }
                return Ok(Delivery {
                    spool: self.spool.clone(),
                    topic: self.topic.clone(),
                    group: self.group.clone(),
                    record: h.record,
                    attempt: h.attempt,
                    ticket,
                    release_on_drop: self.manual_ack,
                });
            }
            drop(engine);
            notified.await;
        }
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
    pub async fn close(mut self) -> Result<()> {
        self.ack_previous()
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        if let Err(e) = self.ack_previous() {
            tracing::debug!(error = %e, "auto-ack on consumer drop failed");
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

/// One message handed to a consumer.
#[derive(Debug)]
pub struct Delivery {
    spool: Spool,
    topic: String,
    group: String,
    record: Record,
    attempt: u32,
    ticket: Ticket,
    release_on_drop: bool,
}

impl Delivery {
    pub fn topic(&self) -> &str {
        &self.topic
    }
    pub fn group(&self) -> &str {
        &self.group
    }
    pub fn offset(&self) -> u64 {
        self.record.offset()
    }
    pub fn payload(&self) -> &Bytes {
        self.record.payload()
    }
    pub fn headers(&self) -> &Headers {
        self.record.headers()
    }
    pub fn timestamp(&self) -> std::time::SystemTime {
        self.record.timestamp()
    }
    /// 1 on the first delivery; one more after each nack (or unclean stop while out).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Finishes the message; durable when it returns (under `Sync=Always`, also against
    /// power loss). Fails with `StaleDelivery` if the group was reset since.
    pub async fn ack(mut self) -> Result<()> {
        self.release_on_drop = false;
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.spool.engine()?.ack_delivery(
            &self.topic,
            &self.group,
            self.ticket,
            Some(Box::new(move |r| {
                let _ = tx.send(r);
            })),
        )?;
        self.spool.wake(&self.topic);
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(detail)) => Err(Error::Catalog {
                context: "committing an ack".into(),
                detail,
            }),
            Err(_) => Err(Error::Closed),
        }
    }

    /// Records a failed attempt (durably) and redelivers, or dead-letters at the limit.
    pub async fn nack(mut self, reason: &str) -> Result<NackOutcome> {
        self.release_on_drop = false;
        let t = self.ticket;
        let r =
            self.spool
                .engine()?
                .nack_delivery(&self.topic, &self.group, t, reason, now_ms())?;
        self.spool.wake(&self.topic);
        Ok(r)
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if !self.release_on_drop {
            return;
        }
        let t = self.ticket;
        if let Ok(engine) = self.spool.engine() {
            if let Err(e) = engine.release_delivery(&self.topic, &self.group, t) {
                tracing::debug!(error = %e, "release on drop failed");
            }
            drop(engine);
            self.spool.wake(&self.topic);
        }
    }
}
