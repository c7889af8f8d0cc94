//! `spool::blocking`: the same calls without `.await`, for applications with no async
//! runtime (a plain `fn main`, threads).
//!
//! ```no_run
//! # fn main() -> Result<(), spool::Error> {
//! use spool::Headers;
//! let mq = spool::blocking::Spool::open("Data Source=./demo-data")?;
//! mq.publish("orders", b"o-1".to_vec(), &Headers::new())?;
//! let mut c = mq.consumer("orders", "billing").manual_ack().build()?;
//! for d in c.iter().take(1) {
//!     let d = d?;
//!     println!("{}", String::from_utf8_lossy(d.payload()));
//!     d.ack()?;
//! }
//! mq.close()
//! # }
//! ```
//!
//! How it works:
//! - Each `Spool` (and its clones) owns one small tokio runtime: current-thread, with the
//!   time driver, and no thread of its own.
//! - Each call runs the async call on it with `block_on`, on the caller's thread.
//! - Any number of threads may call at once. A thread that waits (`recv`) does not hold
//!   up a thread that publishes.
//!
//! Do not call it from inside an async runtime: `block_on` there panics (tokio's rule).
//! Use [`crate::Spool`] there.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::consumer::{Consumer as AsyncConsumer, ConsumerBuilder as AsyncConsumerBuilder};
use crate::delivery::Delivery as AsyncDelivery;
use crate::error::{Error, Result};
use crate::format::Headers;
use crate::format::record::Record;
use crate::options::Options;
use crate::queue::{GroupInfo, NackOutcome, OffsetReset, SnapshotInfo, TopicConfig, TopicInfo};
use crate::spool::Spool as AsyncSpool;

/// The runtime every blocking call runs on, shared by a `Spool`'s clones and consumers.
type Runtime = Arc<tokio::runtime::Runtime>;

/// An open spool instance, with blocking calls. Cheap to clone; every clone shares the
/// instance (see [`crate::Spool`] for what each call promises).
#[derive(Clone, Debug)]
pub struct Spool {
    inner: AsyncSpool,
    rt: Runtime,
}

impl Spool {
    /// Opens an instance from a connection string such as `Data Source=./demo-data`.
    pub fn open(connection_string: &str) -> Result<Spool> {
        Spool::open_with(Options::parse(connection_string)?)
    }

    /// Opens an instance from [`Options`].
    pub fn open_with(options: Options) -> Result<Spool> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(|e| Error::io("starting the blocking facade's runtime", e))?;
        Ok(Spool {
            inner: AsyncSpool::open_with(options)?,
            rt: Arc::new(rt),
        })
    }

    /// The async handle of the same instance, for code that has a runtime.
    pub fn as_async(&self) -> &AsyncSpool {
        &self.inner
    }

    /// Flushes everything, records a clean stop and releases the directory.
    pub fn close(&self) -> Result<()> {
        self.rt.block_on(self.inner.close())
    }

    /// Appends one message; returns its offset (the original one on a de-duplication hit).
    pub fn publish(
        &self,
        topic: &str,
        payload: impl Into<Bytes>,
        headers: &Headers,
    ) -> Result<u64> {
        self.rt
            .block_on(self.inner.publish(topic, payload, headers))
    }

    /// Appends messages in one write (and one sync); all or nothing.
    pub fn publish_batch<P: Into<Bytes>>(
        &self,
        topic: &str,
        messages: Vec<(P, Headers)>,
    ) -> Result<Vec<u64>> {
        self.rt.block_on(self.inner.publish_batch(topic, messages))
    }

    /// A consumer of `topic` in `group`.
    pub fn consumer(&self, topic: &str, group: &str) -> ConsumerBuilder {
        ConsumerBuilder {
            inner: self.inner.consumer(topic, group),
            rt: self.rt.clone(),
        }
    }

    /// Acks the group's cursor (must equal `offset`).
    pub fn ack(&self, topic: &str, group: &str, offset: u64) -> Result<()> {
        self.rt.block_on(self.inner.ack(topic, group, offset))
    }

    /// Nacks the group's cursor (must equal `offset`).
    pub fn nack(&self, topic: &str, group: &str, offset: u64, reason: &str) -> Result<NackOutcome> {
        self.rt
            .block_on(self.inner.nack(topic, group, offset, reason))
    }

    /// Nacks the group's cursor (must equal `offset`); not delivered again before `delay`.
    pub fn nack_with_delay(
        &self,
        topic: &str,
        group: &str,
        offset: u64,
        reason: &str,
        delay: std::time::Duration,
    ) -> Result<NackOutcome> {
        self.rt.block_on(
            self.inner
                .nack_with_delay(topic, group, offset, reason, delay),
        )
    }

    /// Moves the group's cursor; returns the new cursor.
    pub fn reset_offset(&self, topic: &str, group: &str, to: OffsetReset) -> Result<u64> {
        self.rt.block_on(self.inner.reset_offset(topic, group, to))
    }

    /// Reads up to `max_records` from `from` (clamped to the earliest retained offset).
    pub fn fetch(&self, topic: &str, from: u64, max_records: usize) -> Result<Vec<Record>> {
        self.rt.block_on(self.inner.fetch(topic, from, max_records))
    }

    /// The topic's offsets, size and segment count (see [`crate::Spool::topic_info`]).
    pub fn topic_info(&self, topic: &str) -> Result<TopicInfo> {
        self.inner.topic_info(topic)
    }

    /// Every topic's and group's figures (see [`crate::Spool::metrics`]).
    pub fn metrics(&self) -> Result<crate::queue::Metrics> {
        self.inner.metrics()
    }

    /// The group's cursor, lag and attempts (see [`crate::Spool::group_info`]).
    pub fn group_info(&self, topic: &str, group: &str) -> Result<GroupInfo> {
        self.inner.group_info(topic, group)
    }

    /// The groups with durable state on `topic`, sorted by name.
    pub fn groups(&self, topic: &str) -> Result<Vec<String>> {
        self.inner.groups(topic)
    }

    /// Forgets a group (see [`crate::Spool::delete_group`]).
    pub fn delete_group(&self, topic: &str, group: &str) -> Result<()> {
        self.rt.block_on(self.inner.delete_group(topic, group))
    }

    /// Deletes the records before `offset` (see [`crate::Spool::delete_records_before`]).
    pub fn delete_records_before(&self, topic: &str, offset: u64) -> Result<u64> {
        self.rt
            .block_on(self.inner.delete_records_before(topic, offset))
    }

    /// Sets a topic's overrides (see [`crate::Spool::set_topic_config`]).
    pub fn set_topic_config(&self, topic: &str, config: TopicConfig) -> Result<()> {
        self.rt.block_on(self.inner.set_topic_config(topic, config))
    }

    /// Every topic, sorted by name.
    pub fn topics(&self) -> Result<Vec<String>> {
        self.inner.topics()
    }

    /// Applies retention now.
    pub fn apply_retention(&self) -> Result<()> {
        self.inner.apply_retention()
    }

    /// Persists auto-acked cursors now.
    pub fn commit(&self) -> Result<()> {
        self.inner.commit()
    }

    /// Makes a consistent copy of the whole instance in `dest` (see
    /// [`crate::Spool::snapshot`]).
    pub fn snapshot(&self, dest: impl AsRef<std::path::Path>) -> Result<SnapshotInfo> {
        self.rt.block_on(self.inner.snapshot(dest))
    }
}

/// Configures a blocking [`Consumer`] (see [`crate::ConsumerBuilder`]).
#[derive(Debug)]
#[must_use = "call .build() to get a consumer"]
pub struct ConsumerBuilder {
    inner: AsyncConsumerBuilder,
    rt: Runtime,
}

impl ConsumerBuilder {
    /// Leave every ack and nack to the application (default: auto-ack).
    pub fn manual_ack(self) -> Self {
        ConsumerBuilder {
            inner: self.inner.manual_ack(),
            rt: self.rt,
        }
    }

    /// How many deliveries the group may have out at once, across its consumers.
    pub fn max_in_flight(self, n: usize) -> Self {
        ConsumerBuilder {
            inner: self.inner.max_in_flight(n),
            rt: self.rt,
        }
    }

    /// Each delivery must be acked or nacked within `deadline` (see
    /// [`crate::ConsumerBuilder::ack_deadline`]).
    pub fn ack_deadline(self, deadline: std::time::Duration) -> Self {
        ConsumerBuilder {
            inner: self.inner.ack_deadline(deadline),
            rt: self.rt,
        }
    }

    /// At most one delivery per message key out (see
    /// [`crate::ConsumerBuilder::key_ordered`]).
    pub fn key_ordered(self) -> Self {
        ConsumerBuilder {
            inner: self.inner.key_ordered(),
            rt: self.rt,
        }
    }

    /// Spin up to `budget` per `recv` before parking (see
    /// [`crate::ConsumerBuilder::busy_poll`]).
    pub fn busy_poll(self, budget: Duration) -> Self {
        ConsumerBuilder {
            inner: self.inner.busy_poll(budget),
            rt: self.rt,
        }
    }

    /// Checks the names, creates the topic and group if needed.
    pub fn build(self) -> Result<Consumer> {
        Ok(Consumer {
            inner: self.inner.build()?,
            rt: self.rt,
        })
    }
}

/// Pulls deliveries of one group of one topic, with blocking calls (the rules of
/// [`crate::Consumer`]: auto-ack by default, at-least-once).
#[derive(Debug)]
pub struct Consumer {
    inner: AsyncConsumer,
    rt: Runtime,
}

impl Consumer {
    /// The topic this consumer reads.
    pub fn topic(&self) -> &str {
        self.inner.topic()
    }

    /// The consumer group it belongs to.
    pub fn group(&self) -> &str {
        self.inner.group()
    }

    /// Waits for the next delivery.
    pub fn recv(&mut self) -> Result<Delivery> {
        let d = self.rt.block_on(self.inner.recv())?;
        Ok(self.wrap(d))
    }

    /// The next delivery if one is available now, without waiting.
    pub fn try_recv(&mut self) -> Result<Option<Delivery>> {
        Ok(self.inner.try_recv()?.map(|d| self.wrap(d)))
    }

    /// Waits for at least one delivery, then returns what is ready now, up to `max` (see
    /// [`crate::Consumer::recv_batch`]).
    pub fn recv_batch(&mut self, max: usize) -> Result<Vec<Delivery>> {
        let ds = self.rt.block_on(self.inner.recv_batch(max))?;
        Ok(ds.into_iter().map(|d| self.wrap(d)).collect())
    }

    /// Acks them all with one durable commit (see [`crate::Consumer::ack_all`], also for
    /// partial failure).
    pub fn ack_all(&self, deliveries: Vec<Delivery>) -> Result<()> {
        let ds = deliveries.into_iter().map(|d| d.inner).collect();
        self.rt.block_on(self.inner.ack_all(ds))
    }

    /// Nacks them all, one commit for those redelivered (see
    /// [`crate::Consumer::nack_all`]).
    pub fn nack_all(&self, deliveries: Vec<Delivery>, reason: &str) -> Result<Vec<NackOutcome>> {
        let ds = deliveries.into_iter().map(|d| d.inner).collect();
        self.rt.block_on(self.inner.nack_all(ds, reason))
    }

    /// Waits up to `timeout` for the next delivery; `Ok(None)` if none came.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<Delivery>> {
        let d = self.rt.block_on(self.inner.recv_timeout(timeout))?;
        Ok(d.map(|d| self.wrap(d)))
    }

    /// The deliveries, one `recv` each, forever (an error such as `Closed` is yielded, and
    /// so is every one after it: stop at the first).
    pub fn iter(&mut self) -> Iter<'_> {
        Iter { consumer: self }
    }

    /// Acks the previous delivery (auto-ack) and stops.
    pub fn close(self) -> Result<()> {
        self.rt.block_on(self.inner.close())
    }

    fn wrap(&self, inner: AsyncDelivery) -> Delivery {
        Delivery {
            inner,
            rt: self.rt.clone(),
        }
    }
}

/// The iterator returned by [`Consumer::iter`].
#[derive(Debug)]
pub struct Iter<'a> {
    consumer: &'a mut Consumer,
}

impl Iterator for Iter<'_> {
    type Item = Result<Delivery>;

    fn next(&mut self) -> Option<Self::Item> {
        Some(self.consumer.recv())
    }
}

/// One message handed to a blocking consumer (the rules of [`crate::Delivery`]).
#[derive(Debug)]
pub struct Delivery {
    inner: AsyncDelivery,
    rt: Runtime,
}

impl Delivery {
    /// The topic the message was read from.
    pub fn topic(&self) -> &str {
        self.inner.topic()
    }

    /// The consumer group it was delivered to.
    pub fn group(&self) -> &str {
        self.inner.group()
    }

    /// The message's offset in its topic.
    pub fn offset(&self) -> u64 {
        self.inner.offset()
    }

    /// The message body.
    pub fn payload(&self) -> &Bytes {
        self.inner.payload()
    }

    /// The headers it was published with.
    pub fn headers(&self) -> &Headers {
        self.inner.headers()
    }

    /// When the message was appended.
    pub fn timestamp(&self) -> std::time::SystemTime {
        self.inner.timestamp()
    }

    /// 1 on the first delivery; one more after each nack (or unclean stop while out).
    pub fn attempt(&self) -> u32 {
        self.inner.attempt()
    }

    /// Finishes the message; returns once the ack is durable.
    pub fn ack(self) -> Result<()> {
        self.rt.block_on(self.inner.ack())
    }

    /// Always 0 in embedded mode (a topic has one partition).
    pub fn partition(&self) -> u32 {
        self.inner.partition()
    }

    /// When the ack deadline passes, if the consumer has one.
    pub fn deadline(&self) -> Option<std::time::Instant> {
        self.inner.deadline()
    }

    /// Restarts the ack deadline from now (see [`crate::Delivery::extend_deadline`]).
    pub fn extend_deadline(&self) -> Result<()> {
        self.inner.extend_deadline()
    }

    /// Records a failed attempt (durably) and redelivers, or dead-letters at the limit.
    pub fn nack(self, reason: &str) -> Result<NackOutcome> {
        self.rt.block_on(self.inner.nack(reason))
    }

    /// Like `nack`; not delivered again before `delay` has passed.
    pub fn nack_with_delay(self, reason: &str, delay: std::time::Duration) -> Result<NackOutcome> {
        self.rt.block_on(self.inner.nack_with_delay(reason, delay))
    }
}
