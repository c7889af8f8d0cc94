//! The `Mode=Kafka` backend (cargo feature `kafka`): the same `Spool` on a Kafka cluster,
//! through librdkafka (the `rdkafka` crate). docs/kafka.md says what maps to what.
//!
//! Files, by role:
//! - `mod.rs`: the instance: its clients, topics and the calls that need no group.
//! - `clients.rs`: building and checking librdkafka configurations.
//! - `commit.rs`: an offset commit bounded by `Kafka Timeout Ms` (the one module with
//!   `unsafe` code).
//! - `ack_commit.rs`: an `ack_all`'s commit, sent and awaited on its own task.
//! - `produce.rs`: idempotent produce, single and batch.
//! - `dedup.rs`: the `message-id` window of each topic, rebuilt from its tail.
//! - `deadline.rs`: ack deadlines of the deliveries out.
//! - `floor.rs`: one partition's ack floor and its encoding in a commit's metadata.
//! - `group.rs`: a group's member in this process: its partitions, floors and committer.
//! - `key_order.rs`: key-ordered parallelism, per partition.
//! - `poller.rs`: a group member's poll thread, the only reader of its consumer.
//! - `consumer.rs`: the consumer and delivery handles over a group.
//! - `consumer/by_offset.rs`: the low-level `ack` and `nack` of partition 0's cursor.
//! - `consumer/expiry.rs`: taking back deliveries past their ack deadline.
//! - `consumer/nack_all.rs`: `nack_all`.
//! - `delete_group.rs`: `delete_group`, a tombstone commit per partition.
//! - `reset.rs`: `reset_offset` (moving this process's member, or committing from
//!   outside the group) and `groups`.
//! - `outside.rs`: a group's commit read and written with no member joining.
//! - `topics.rs`: creating a missing dead-letter topic with its source's partitions.
//!
//! **Invariant:** the committed offset of a partition is its floor's cursor: a commit never
//! passes a record that is neither acked nor dead-lettered (Brighter's ADR 0055 failure,
//! a later cumulative commit swallowing a nacked record, cannot happen).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::producer::FutureProducer;
use rdkafka::{Offset, TopicPartitionList};

use crate::error::{Error, Result};
use crate::format::record::Record;
use crate::options::Options;
use crate::queue::{GroupInfo, TopicInfo};

mod ack_commit;
mod clients;
mod commit;
mod consumer;
mod deadline;
mod dedup;
mod delete_group;
mod floor;
mod group;
mod key_order;
mod outside;
mod poller;
mod produce;
mod reset;
mod topics;

pub(crate) use consumer::{KafkaConsumer, KafkaDelivery, Settings};
use group::Group;

/// An open `Mode=Kafka` instance. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Kafka {
    inner: Arc<Inner>,
}

struct Inner {
    opts: Options,
    producer: FutureProducer,
    /// A group-less consumer for metadata, watermarks and `fetch`.
    reader: BaseConsumer,
    /// The group members of this instance, by (topic, group); consumers of one group
    /// share one member, as they share one group in embedded mode.
    groups: Mutex<HashMap<(String, String), Weak<Group>>>,
    /// The `message-id` window of each topic published to with an id.
    dedup: Mutex<HashMap<String, dedup::Shared>>,
    closed: std::sync::atomic::AtomicBool,
    /// Made at the first topic creation (`topics.rs`).
    admin: std::sync::OnceLock<rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>>,
    /// Dead-letter topics seen to exist (`topics.rs`).
    known_topics: Mutex<std::collections::HashSet<String>>,
}

impl std::fmt::Debug for Kafka {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kafka")
            .field("bootstrap_servers", &self.inner.opts.bootstrap_servers)
            .finish_non_exhaustive()
    }
}

impl Kafka {
    /// Creates the clients. Fails with `InvalidConnectionString` naming a
    /// `Kafka.<property>` librdkafka refuses; connects lazily.
    pub(crate) fn open(opts: Options) -> Result<Kafka> {
        opts.validate()?;
        let producer = clients::producer(&opts)?;
        let reader = clients::reader(&opts)?;
        // A consumer's configuration is checked here too, not at the first `build`.
        drop(clients::member(
            &opts,
            "spool-config-check",
            group::context_for_check(),
        )?);
        Ok(Kafka {
            inner: Arc::new(Inner {
                opts,
                producer,
                reader,
                groups: Mutex::new(HashMap::new()),
                dedup: Mutex::new(HashMap::new()),
                closed: std::sync::atomic::AtomicBool::new(false),
                admin: std::sync::OnceLock::new(),
                known_topics: Mutex::new(std::collections::HashSet::new()),
            }),
        })
    }

    pub(crate) fn options(&self) -> &Options {
        &self.inner.opts
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_millis(self.inner.opts.kafka_timeout_ms)
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if self.inner.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// Flushes the producer; later calls fail with `Closed`.
    pub(crate) async fn close(&self) -> Result<()> {
        self.inner
            .closed
            .store(true, std::sync::atomic::Ordering::Release);
        let k = self.clone();
        blocking(move || {
            use rdkafka::producer::Producer as _;
            k.inner
                .producer
                .flush(k.timeout())
                .map_err(|e| kafka_err("flushing", e))
        })
        .await
    }

    /// Every topic, sorted, without Kafka's internal `__` topics.
    pub(crate) fn topics(&self) -> Result<Vec<String>> {
        self.check_open()?;
        let md = self
            .inner
            .reader
            .fetch_metadata(None, self.timeout())
            .map_err(|e| kafka_err("reading the cluster's metadata", e))?;
        let mut names: Vec<String> = md
            .topics()
            .iter()
            .map(|t| t.name().to_owned())
            .filter(|n| !n.starts_with("__"))
            .collect();
        names.sort();
        Ok(names)
    }

    /// The number of partitions of `topic` (0: it does not exist).
    pub(crate) fn partitions(&self, topic: &str) -> Result<i32> {
        let md = self
            .inner
            .reader
            .fetch_metadata(Some(topic), self.timeout())
            .map_err(|e| kafka_err("reading a topic's metadata", e))?;
        let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
            return Ok(0);
        };
        if t.error().is_some() {
            return Ok(0);
        }
        Ok(i32::try_from(t.partitions().len()).unwrap_or(i32::MAX))
    }

    /// The low and high watermarks of one partition.
    pub(crate) fn watermarks(&self, topic: &str, partition: i32) -> Result<(u64, u64)> {
        let (lo, hi) = self
            .inner
            .reader
            .fetch_watermarks(topic, partition, self.timeout())
            .map_err(|e| kafka_err("reading a partition's watermarks", e))?;
        Ok((to_u64(lo), to_u64(hi)))
    }

    /// The watermarks summed over the topic's partitions; an unknown topic reads as zeros.
    pub(crate) fn topic_info(&self, topic: &str) -> Result<TopicInfo> {
        crate::names::check(topic)?;
        self.check_open()?;
        let mut info = TopicInfo::default();
        for p in 0..self.partitions(topic)? {
            let (lo, hi) = self.watermarks(topic, p)?;
            info.earliest += lo;
            info.next += hi;
        }
        info.messages = info.next - info.earliest;
        info.dedup_ids = self.dedup_len(topic);
        Ok(info)
    }

    /// Up to `max_records` of partition 0 from `from` (clamped to the earliest), through
    /// an assign-only reader: no group, nothing committed.
    pub(crate) async fn fetch(&self, topic: &str, from: u64, max: usize) -> Result<Vec<Record>> {
        crate::names::check(topic)?;
        self.check_open()?;
        let k = self.clone();
        let topic = topic.to_owned();
        blocking(move || k.fetch_blocking(&topic, 0, from, max)).await
    }

    fn fetch_blocking(&self, topic: &str, p: i32, from: u64, max: usize) -> Result<Vec<Record>> {
        let (lo, hi) = self.watermarks(topic, p)?;
        let from = from.max(lo);
        if from > hi {
            return Err(Error::OffsetOutOfRange {
                offset: from,
                next: hi,
            });
        }
        let want = usize::try_from(hi - from).unwrap_or(usize::MAX).min(max);
        self.read_range(topic, p, from, hi, want)
    }

    /// Reads up to `count` records of one partition from `from`, stopping at `to` (the
    /// high watermark read before: offsets below it may have gaps, as transaction
    /// markers leave), through a reader of its own (assigned, no group). Blocking.
    pub(crate) fn read_range(
        &self,
        topic: &str,
        p: i32,
        from: u64,
        to: u64,
        count: usize,
    ) -> Result<Vec<Record>> {
        if count == 0 || from >= to {
            return Ok(Vec::new());
        }
        let reader = clients::reader(&self.inner.opts)?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, p, Offset::Offset(to_i64(from)))
            .map_err(|e| kafka_err("assigning a partition to read", e))?;
        reader
            .assign(&tpl)
            .map_err(|e| kafka_err("assigning a partition to read", e))?;
        let deadline = std::time::Instant::now() + self.timeout();
        let mut out: Vec<Record> = Vec::with_capacity(count.min(4096));
        while out.len() < count && out.last().is_none_or(|r| r.offset + 1 < to) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(timed_out("reading records"));
            }
            match reader.poll(left) {
                None => continue,
                Some(Err(e)) => return Err(kafka_err("reading records", e)),
                Some(Ok(m)) => out.push(consumer::record_of(&m)),
            }
        }
        // The list goes before its reader (dropping a consumer first can hang).
        drop(tpl);
        drop(reader);
        Ok(out)
    }

    /// The group's figures from its committed offsets, the watermarks and this process's
    /// own bookkeeping.
    pub(crate) fn group_info(&self, topic: &str, group: &str) -> Result<GroupInfo> {
        crate::names::check(topic)?;
        crate::names::check(group)?;
        self.check_open()?;
        let live = self.live_group(topic, group);
        group::info(self, topic, group, live.as_deref())
    }

    /// The member of (topic, group) in this process, if one is open.
    fn live_group(&self, topic: &str, group: &str) -> Option<Arc<Group>> {
        let groups = self.inner.groups.lock().unwrap_or_else(|e| e.into_inner());
        groups
            .get(&(topic.to_owned(), group.to_owned()))
            .and_then(Weak::upgrade)
    }

    /// The member of (topic, group) in this process, joined now if none is open.
    fn group(&self, topic: &str, group: &str) -> Result<Arc<Group>> {
        let mut groups = self.inner.groups.lock().unwrap_or_else(|e| e.into_inner());
        let key = (topic.to_owned(), group.to_owned());
        if let Some(g) = groups.get(&key).and_then(Weak::upgrade) {
            return Ok(g);
        }
        let g = Group::join(self.clone(), topic, group)?;
        groups.retain(|_, w| w.strong_count() > 0);
        groups.insert(key, Arc::downgrade(&g));
        Ok(g)
    }

    fn reader(&self) -> &BaseConsumer {
        &self.inner.reader
    }

    /// The groups of `topic` with a member in this process.
    fn live_groups_of(&self, topic: &str) -> Vec<String> {
        let groups = self.inner.groups.lock().unwrap_or_else(|e| e.into_inner());
        groups
            .iter()
            .filter(|((t, _), w)| t == topic && w.strong_count() > 0)
            .map(|((_, g), _)| g.clone())
            .collect()
    }

    pub(crate) fn producer(&self) -> &FutureProducer {
        &self.inner.producer
    }
}

/// What a call not available under `Mode=Kafka` fails with.
pub(crate) fn unsupported(what: &str) -> Error {
    Error::Unsupported {
        what: format!("{what} under Mode=Kafka (docs/kafka.md, \"What differs\")"),
    }
}

pub(crate) fn kafka_err(context: &str, e: rdkafka::error::KafkaError) -> Error {
    Error::Kafka {
        context: context.to_owned(),
        detail: e.to_string(),
    }
}

fn timed_out(context: &str) -> Error {
    Error::Kafka {
        context: context.to_owned(),
        detail: "timed out (Kafka Timeout Ms)".to_owned(),
    }
}

/// Runs a blocking librdkafka call off the async worker threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Kafka {
            context: "a blocking Kafka call".to_owned(),
            detail: e.to_string(),
        })?
}

pub(crate) fn to_u64(o: i64) -> u64 {
    u64::try_from(o).unwrap_or(0)
}

pub(crate) fn to_i64(o: u64) -> i64 {
    i64::try_from(o).unwrap_or(i64::MAX)
}
