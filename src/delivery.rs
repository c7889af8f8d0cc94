//! [`Delivery`]: one message handed to a consumer, to ack or nack. Each call forwards to
//! the backend's delivery (`backend.rs`).

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
#[cfg(feature = "kafka")]
use futures_util::future::Either;

use crate::backend::DeliveryBackend;
#[cfg(feature = "kafka")]
use crate::backend::KafkaDelivery;
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

    #[cfg(feature = "kafka")]
    pub(crate) fn kafka(d: KafkaDelivery) -> Delivery {
        Delivery {
            inner: DeliveryBackend::Kafka(d),
        }
    }

    /// The embedded backend's deliveries behind `ds`, or the Kafka ones.
    fn split(ds: Vec<Delivery>) -> (Vec<EmbeddedDelivery>, Vec<Delivery>) {
        let mut embedded = Vec::with_capacity(ds.len());
        #[allow(unused_mut)]
        let mut other = Vec::new();
        for d in ds {
            match d.inner {
                DeliveryBackend::Embedded(e) => embedded.push(e),
                #[cfg(feature = "kafka")]
                DeliveryBackend::Kafka(_) => other.push(d),
            }
        }
        (embedded, other)
    }

    /// The Kafka deliveries of `split`'s second part (all of them are).
    #[cfg(feature = "kafka")]
    fn kafka_of(other: Vec<Delivery>) -> Vec<KafkaDelivery> {
        other
            .into_iter()
            .filter_map(|d| match d.inner {
                DeliveryBackend::Kafka(k) => Some(k),
                DeliveryBackend::Embedded(_) => None,
            })
            .collect()
    }

    /// [`crate::Consumer::ack_all`]. Kafka deliveries are acked together: their acks
    /// share the commits made meanwhile.
    pub(crate) async fn ack_all(ds: Vec<Delivery>) -> Result<()> {
        let (embedded, other) = Delivery::split(ds);
        if other.is_empty() {
            return crate::runtime::ack_all(embedded).await;
        }
        #[cfg(feature = "kafka")]
        {
            let kafka = Delivery::kafka_of(other);
            let acks = KafkaDelivery::ack_all(kafka);
            let embedded = crate::runtime::ack_all(embedded).await;
            let kafka = acks.await;
            embedded.and(kafka)
        }
        #[cfg(not(feature = "kafka"))]
        unreachable!("only Kafka deliveries are not embedded")
    }

    /// [`crate::Consumer::nack_all`].
    pub(crate) async fn nack_all(ds: Vec<Delivery>, reason: &str) -> Result<Vec<NackOutcome>> {
        let (embedded, other) = Delivery::split(ds);
        if other.is_empty() {
            return crate::runtime::nack_all(embedded, reason);
        }
        if !embedded.is_empty() {
            return Err(crate::error::Error::Unsupported {
                what: "nack_all of deliveries of both modes at once (nack each mode's apart)"
                    .to_owned(),
            });
        }
        #[cfg(feature = "kafka")]
        {
            let kafka = Delivery::kafka_of(other);
            KafkaDelivery::nack_all(kafka, reason).await
        }
        #[cfg(not(feature = "kafka"))]
        unreachable!("only Kafka deliveries are not embedded")
    }

    /// The topic the message was read from.
    pub fn topic(&self) -> &str {
        match &self.inner {
            DeliveryBackend::Embedded(d) => d.topic(),
            #[cfg(feature = "kafka")]
            DeliveryBackend::Kafka(d) => d.topic(),
        }
    }

    /// The consumer group it was delivered to.
    pub fn group(&self) -> &str {
        match &self.inner {
            DeliveryBackend::Embedded(d) => d.group(),
            #[cfg(feature = "kafka")]
            DeliveryBackend::Kafka(d) => d.group(),
        }
    }

    /// The message's offset in its topic.
    pub fn offset(&self) -> u64 {
        match &self.inner {
            DeliveryBackend::Embedded(d) => d.offset(),
            #[cfg(feature = "kafka")]
            DeliveryBackend::Kafka(d) => d.offset(),
        }
    }

    /// The message body. Cloning it is cheap: it shares the buffer it was read into.
    pub fn payload(&self) -> &Bytes {
        match &self.inner {
            DeliveryBackend::Embedded(d) => d.payload(),
            #[cfg(feature = "kafka")]
            DeliveryBackend::Kafka(d) => d.payload(),
        }
    }

    /// The headers it was published with.
    pub fn headers(&self) -> &Headers {
        match &self.inner {
            DeliveryBackend::Embedded(d) => d.headers(),
            #[cfg(feature = "kafka")]
            DeliveryBackend::Kafka(d) => d.headers(),
        }
    }

    /// When the message was appended (monotonic within a topic).
    pub fn timestamp(&self) -> std::time::SystemTime {
        match &self.inner {
            DeliveryBackend::Embedded(d) => d.timestamp(),
            #[cfg(feature = "kafka")]
            DeliveryBackend::Kafka(d) => d.timestamp(),
        }
    }

    /// 1 on the first delivery; one more after each nack (or unclean stop while out).
    pub fn attempt(&self) -> u32 {
        match &self.inner {
            DeliveryBackend::Embedded(d) => d.attempt(),
            #[cfg(feature = "kafka")]
            DeliveryBackend::Kafka(d) => d.attempt(),
        }
    }

    /// The partition the message was read from: always 0 in embedded mode (a topic has
    /// one).
    pub fn partition(&self) -> u32 {
        match &self.inner {
            DeliveryBackend::Embedded(d) => d.partition(),
            #[cfg(feature = "kafka")]
            DeliveryBackend::Kafka(d) => d.partition(),
        }
    }

    /// When this delivery's ack deadline passes (`None`: its consumer has none). After
    /// it, the group takes the delivery back as a failed attempt.
    pub fn deadline(&self) -> Option<std::time::Instant> {
        match &self.inner {
            DeliveryBackend::Embedded(d) => d.deadline(),
            #[cfg(feature = "kafka")]
            DeliveryBackend::Kafka(d) => d.deadline(),
        }
    }

    /// Restarts the ack deadline from now, for a handler still at work (JetStream's
    /// "in progress"). Fails with `DeliveryExpired` if the deadline already passed; `Ok`
    /// and nothing to do without a deadline.
    pub fn extend_deadline(&self) -> Result<()> {
        match &self.inner {
            DeliveryBackend::Embedded(d) => d.extend_deadline(),
            #[cfg(feature = "kafka")]
            DeliveryBackend::Kafka(d) => d.extend_deadline(),
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
            #[cfg(not(feature = "kafka"))]
            DeliveryBackend::Embedded(d) => d.ack(),
            #[cfg(feature = "kafka")]
            DeliveryBackend::Embedded(d) => Either::Left(d.ack()),
            #[cfg(feature = "kafka")]
            DeliveryBackend::Kafka(d) => Either::Right(d.ack()),
        }
    }

    /// Records a failed attempt (durably) and redelivers, or dead-letters at the limit.
    /// With a `Nack Backoff` it waits before it is delivered again (see
    /// [`Delivery::nack_with_delay`]).
    pub async fn nack(self, reason: &str) -> Result<NackOutcome> {
        match self.inner {
            DeliveryBackend::Embedded(d) => d.nack(reason, None).await,
            #[cfg(feature = "kafka")]
            DeliveryBackend::Kafka(d) => d.nack(reason, None).await,
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
            #[cfg(feature = "kafka")]
            DeliveryBackend::Kafka(d) => d.nack(reason, Some(delay)).await,
        }
    }
}
