//! Publishing under `Mode=Kafka`: an idempotent produce with `acks=all`. The
//! `message-key` header is the Kafka key, so it chooses the partition (the default
//! partitioner on the key); the returned offset is the record's in its partition.
//!
//! A batch is checked whole before anything is produced (all or nothing against bad
//! input). A broker failure in the middle can leave a prefix produced: the error says how
//! many.

use bytes::Bytes;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;

use super::{Kafka, kafka_err, to_u64};
use crate::error::{Error, Result};
use crate::format::Headers;
use crate::queue::{MESSAGE_KEY_HEADER, check_message};

impl Kafka {
    /// Produces one message; returns its offset in its partition.
    pub(crate) async fn publish(
        &self,
        topic: &str,
        payload: Bytes,
        headers: &Headers,
    ) -> Result<u64> {
        self.check_publish(topic, &payload, headers)?;
        self.produce(topic, &payload, headers).await.map(|(_, o)| o)
    }

    /// Produces `messages` in order, each waiting for the one before, after checking all.
    pub(crate) async fn publish_batch(
        &self,
        topic: &str,
        messages: Vec<(Bytes, Headers)>,
    ) -> Result<Vec<u64>> {
        for (p, h) in &messages {
            self.check_publish(topic, p, h)?;
        }
        let mut offsets = Vec::with_capacity(messages.len());
        // Sent together, awaited in order: one round trip for the batch, and the
        // idempotent producer keeps their order within a partition.
        let sends: Vec<_> = messages
            .iter()
            .map(|(p, h)| self.produce(topic, p, h))
            .collect();
        for (i, send) in sends.into_iter().enumerate() {
            match send.await {
                Ok((_, o)) => offsets.push(o),
                Err(e) => {
                    return Err(Error::Kafka {
                        context: format!(
                            "producing message {i} of a batch of {} (the {i} before it may be produced)",
                            messages.len()
                        ),
                        detail: e.to_string(),
                    });
                }
            }
        }
        Ok(offsets)
    }

    fn check_publish(&self, topic: &str, payload: &[u8], headers: &Headers) -> Result<()> {
        crate::names::check(topic)?;
        self.check_open()?;
        check_message(self.options(), payload, headers).map(|_| ())
    }

    /// Produces one record to `topic`; returns its (partition, offset).
    pub(super) async fn produce(
        &self,
        topic: &str,
        payload: &[u8],
        headers: &Headers,
    ) -> Result<(i32, u64)> {
        let mut kh = OwnedHeaders::new_with_capacity(headers.len());
        for (k, v) in headers {
            kh = kh.insert(Header {
                key: k,
                value: Some(v.as_bytes()),
            });
        }
        let mut record = FutureRecord::<str, [u8]>::to(topic)
            .payload(payload)
            .headers(kh);
        if let Some(key) = headers.get(MESSAGE_KEY_HEADER) {
            record = record.key(key.as_str());
        }
        match self.producer().send(record, self.timeout()).await {
            Ok(d) => Ok((d.partition, to_u64(d.offset))),
            Err((e, _)) => Err(kafka_err("producing a message", e)),
        }
    }
}
