//! [`Delivery`]: one message handed to a consumer, to ack or nack. Each call forwards to
//! the backend's delivery (`backend.rs`).

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;

use crate::backend::DeliveryBackend;
use crate::error::Result;
use crate::format::Headers;
pub(crate) use crate::queue::NackOutcome;
use crate::runtime::EmbeddedDelivery;

/// One message handed to a consumer.
///
/// Dropped without `ack` or `nack`, a manual-ack delivery is released and delivered
/// again; dropped by a panic, it counts as a failed attempt.
#[derive(Debug)]
pub struct Delivery {
    inner: DeliveryBackend,
}

impl Delivery {
    pub(crate) fn embedded(d: EmbeddedDelivery) -> Delivery {
        Delivery {
            inner: DeliveryBackend::Embedded(d),
        }
    }

    /// The embedded backend's deliveries behind `ds`.
    fn embedded_all(ds: Vec<Delivery>) -> Vec<EmbeddedDelivery> {
        ds.into_iter()
            .map(|d| match d.inner {
                DeliveryBackend::Embedded(d) => d,
            })
            .collect()
    }

    /// [`crate::Consumer::ack_all`].
    pub(crate) async fn ack_all(ds: Vec<Delivery>) -> Result<()> {
        crate::runtime::ack_all(Delivery::embedded_all(ds)).await
    }

    /// [`crate::Consumer::nack_all`].
    pub(crate) fn nack_all(ds: Vec<Delivery>, reason: &str) -> Result<Vec<NackOutcome>> {
        crate::runtime::nack_all(Delivery::embedded_all(ds), reason)
    }

    /// The topic the message was read from.
    pub fn topic(&self) -> &str {
        match &self.inner {
            DeliveryBackend::Embedded(d) => d.topic(),
        }
    }

    /// The consumer group it was delivered to.
    pub fn group(&self) -> &str {
        match &self.inner {
            DeliveryBackend::Embedded(d) => d.group(),
        }
    }

    /// The message's offset in its topic.
    pub fn offset(&self) -> u64 {
        match &self.inner {
            DeliveryBackend::Embedded(d) => d.offset(),
        }
    }

    /// The message body. Cloning it is cheap: it shares the buffer it was read into.
    pub fn payload(&self) -> &Bytes {
        match &self.inner {
            DeliveryBackend::Embedded(d) => d.payload(),
        }
    }

    /// The headers it was published with.
    pub fn headers(&self) -> &Headers {
        match &self.inner {
            DeliveryBackend::Embedded(d) => d.headers(),
        }
    }

    /// When the message was appended (monotonic within a topic).
    pub fn timestamp(&self) -> std::time::SystemTime {
        match &self.inner {
            DeliveryBackend::Embedded(d) => d.timestamp(),
        }
    }

    /// 1 on the first delivery; one more after each nack (or unclean stop while out).
    pub fn attempt(&self) -> u32 {
        match &self.inner {
            DeliveryBackend::Embedded(d) => d.attempt(),
        }
    }

    /// The partition the message was read from: always 0 in embedded mode (a topic has
    /// one).
    pub fn partition(&self) -> u32 {
        match &self.inner {
            DeliveryBackend::Embedded(d) => d.partition(),
        }
    }

    /// When this delivery's ack deadline passes (`None`: its consumer has none). After
    /// it, the group takes the delivery back as a failed attempt.
    pub fn deadline(&self) -> Option<std::time::Instant> {
        match &self.inner {
            DeliveryBackend::Embedded(d) => d.deadline(),
        }
    }

    /// Restarts the ack deadline from now, for a handler still at work (JetStream's
    /// "in progress"). Fails with `DeliveryExpired` if the deadline already passed; `Ok`
    /// and nothing to do without a deadline.
    pub fn extend_deadline(&self) -> Result<()> {
        match &self.inner {
            DeliveryBackend::Embedded(d) => d.extend_deadline(),
        }
    }

    /// Finishes the message; durable when the returned future completes (under
    /// `Sync=Always`, also against power loss). Fails with `StaleDelivery` if the group was
    /// reset since, `DeliveryExpired` if its ack deadline passed (both change nothing).
    ///
    /// The ack is made when `ack` is called, so the group's slot is free for the next
    /// delivery at once. The future only waits for the catalog commit; one commit serves
    /// every ack made meanwhile. Dropping the future does not undo the ack: it becomes
    /// durable with the next commit.
    pub fn ack(self) -> impl Future<Output = Result<()>> + Send + 'static {
        match self.inner {
            DeliveryBackend::Embedded(d) => d.ack(),
        }
    }

    /// Records a failed attempt (durably) and redelivers, or dead-letters at the limit.
    /// With a `Nack Backoff` it waits before it is delivered again (see
    /// [`Delivery::nack_with_delay`]).
    pub async fn nack(self, reason: &str) -> Result<NackOutcome> {
        match self.inner {
            DeliveryBackend::Embedded(d) => d.nack(reason, None).await,
        }
    }

    /// Like [`Delivery::nack`], and the message is not delivered again before `delay` has
    /// passed (this wins over the `Nack Backoff`; zero is a plain `nack`). The wait is
    /// durable: a reopen inside it still waits. While it waits the group's cursor stays
    /// at it; with `max_in_flight(1)` later messages wait too, with more they go on.
    /// [`NackOutcome::redeliver_at`] says when it comes again.
    pub async fn nack_with_delay(self, reason: &str, delay: Duration) -> Result<NackOutcome> {
        match self.inner {
            DeliveryBackend::Embedded(d) => d.nack(reason, Some(delay)).await,
        }
    }
}
