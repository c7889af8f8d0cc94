//! Publishing under `Mode=Kafka`: an idempotent produce with `acks=all`. The
//! `message-key` header is the Kafka key, so it chooses the partition (the default
//! partitioner on the key); the returned offset is the record's in its partition.
//!
//! A batch is checked whole before anything is produced (all or nothing against bad
//! input). A broker failure in the middle can leave a prefix produced: the error says how
//! many.

use std::collections::HashMap;

use bytes::Bytes;
use futures_util::future::join_all;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;

use super::dedup::Window;
use super::{Kafka, kafka_err, to_u64};
use crate::error::{Error, Result};
use crate::format::Headers;
use crate::queue::{MESSAGE_ID_HEADER, MESSAGE_KEY_HEADER, check_message};

/// What a batch does with each message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// Its id is in the window: the original offset, nothing produced.
    Known(u64),
    Produce,
    /// Its id is an earlier message's of the same batch.
    SameAs(usize),
}

fn plan(messages: &[(Bytes, Headers)], window: Option<&Window>) -> Vec<Plan> {
    let mut first: HashMap<&str, usize> = HashMap::new();
    messages
        .iter()
        .enumerate()
        .map(|(i, (_, h))| {
            let Some(w) = window else {
                return Plan::Produce;
            };
            let Some(id) = h.get(MESSAGE_ID_HEADER) else {
                return Plan::Produce;
            };
            if let Some(o) = w.get(id) {
                return Plan::Known(o);
            }
            match first.get(id.as_str()) {
                Some(j) => Plan::SameAs(*j),
                None => {
                    first.insert(id, i);
                    Plan::Produce
                }
            }
        })
        .collect()
}

/// A broker failure in a batch: the messages before it may have been produced.
fn partial(e: Error, n: usize, of: usize) -> Error {
    let detail = match e {
        Error::Kafka { detail, .. } => detail,
        other => other.to_string(),
    };
    Error::Kafka {
        context: format!("producing message {n} of a batch of {of} (others may be produced)"),
        detail,
    }
}

impl Kafka {
    /// Produces one message; returns its offset in its partition (the original one on
    /// a de-duplication hit).
    pub(crate) async fn publish(
        &self,
        topic: &str,
        payload: Bytes,
        headers: Headers,
    ) -> Result<u64> {
        // Owned: `Spool::publish` already made the copy its boxed future needs.
        let mut offsets = self.publish_batch(topic, vec![(payload, headers)]).await?;
        Ok(offsets.pop().expect("one message, one offset"))
    }

    /// Produces `messages`, after checking all: sent together (one round trip, their
    /// order kept within a partition by the idempotent producer), awaited together.
    /// De-duplicated by `message-id`, also within the batch.
    pub(crate) async fn publish_batch(
        &self,
        topic: &str,
        messages: Vec<(Bytes, Headers)>,
    ) -> Result<Vec<u64>> {
        for (p, h) in &messages {
            self.check_publish(topic, p, h)?;
        }
        let with_ids = self.options().dedup_window > 0
            && messages
                .iter()
                .any(|(_, h)| h.contains_key(MESSAGE_ID_HEADER));
        let mut window = match with_ids {
            true => Some(self.dedup_window(topic).await?),
            false => None,
        };
        let plan = plan(&messages, window.as_deref());
        let to_send: Vec<usize> = (0..messages.len())
            .filter(|i| plan[*i] == Plan::Produce)
            .collect();
        let sent = join_all(to_send.iter().map(|i| {
            let (p, h) = &messages[*i];
            self.produce(topic, p, h)
        }))
        .await;
        let mut produced = HashMap::with_capacity(to_send.len());
        for (n, (i, r)) in to_send.iter().zip(sent).enumerate() {
            match r {
                Ok((_, o)) => produced.insert(*i, o),
                Err(e) => return Err(partial(e, n, messages.len())),
            };
        }
        let cap = self.options().dedup_window;
        let offsets: Vec<u64> = plan
            .iter()
            .enumerate()
            .map(|(i, p)| match p {
                Plan::Known(o) => *o,
                Plan::Produce => produced[&i],
                Plan::SameAs(j) => produced[j],
            })
            .collect();
        if let Some(w) = window.as_deref_mut() {
            for ((_, h), o) in messages.iter().zip(&offsets) {
                if let Some(id) = h.get(MESSAGE_ID_HEADER) {
                    w.insert(id, *o, cap);
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
        let mut record = FutureRecord::<str, [u8]>::to(topic).payload(payload);
        // No headers, no header block: an empty one costs every reader a parse (librdkafka
        // parses a block of zero headers as it does any other).
        if !headers.is_empty() {
            let mut kh = OwnedHeaders::new_with_capacity(headers.len());
            for (k, v) in headers {
                kh = kh.insert(Header {
                    key: k,
                    value: Some(v.as_bytes()),
                });
            }
            record = record.headers(kh);
        }
        if let Some(key) = headers.get(MESSAGE_KEY_HEADER) {
            record = record.key(key.as_str());
        }
        match self.producer().send(record, self.timeout()).await {
            Ok(d) => Ok((d.partition, to_u64(d.offset))),
            Err((e, _)) => Err(kafka_err("producing a message", e)),
        }
    }
}
