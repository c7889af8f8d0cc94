//! [`Delivery`]: one message handed to a consumer, to ack or nack. Each call forwards to
//! the backend's delivery (`backend.rs`).

use std::future::Future;

use bytes::Bytes;

use crate::backend::DeliveryBackend;
use crate::error::Result;
use crate::format::Headers;
use crate::queue::NackOutcome;
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

    /// Finishes the message; durable when the returned future completes (under
    /// `Sync=Always`, also against power loss). Fails with `StaleDelivery` if the group was
    /// reset since.
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
    pub async fn nack(self, reason: &str) -> Result<NackOutcome> {
        match self.inner {
            DeliveryBackend::Embedded(d) => d.nack(reason).await,
        }
    }
}
