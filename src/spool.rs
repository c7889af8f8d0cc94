//! [`Spool`]: the handle an application opens, publishes through and builds consumers
//! from. It forwards every call to its backend (`backend.rs`).

use std::future::Future;

use bytes::Bytes;
use futures_util::future::Either;

use crate::backend::{Backend, ConsumerConfig};
use crate::consumer::ConsumerBuilder;
use crate::error::Result;
use crate::format::Headers;
use crate::format::record::Record;
use crate::io::Fs;
use crate::options::Options;
use crate::queue::{
    GroupInfo, Metrics, NackOutcome, OffsetReset, SnapshotInfo, TopicConfig, TopicInfo,
    VerifyReport,
};

/// A `Mode=Kafka` publish: boxed and owning its arguments, as it waits for a broker
/// round trip anyway (the embedded one stays unboxed).
type KafkaPublish = std::pin::Pin<Box<dyn Future<Output = Result<u64>> + Send + 'static>>;

/// An open spool instance. Cheap to clone; every clone shares the instance.
#[derive(Clone, Debug)]
pub struct Spool {
    backend: Backend,
}

impl Spool {
    /// Opens an instance from a connection string such as
    /// `Data Source=./demo-data;Mode=Embedded`.
    pub fn open(connection_string: &str) -> Result<Spool> {
        Spool::open_with(Options::parse(connection_string)?)
    }

    /// Opens an instance from [`Options`].
    pub fn open_with(options: Options) -> Result<Spool> {
        Ok(Spool {
            backend: Backend::open(Fs::real(), options)?,
        })
    }

    /// Opens an instance on a simulated file system (power-loss tests).
    #[doc(hidden)]
    pub fn open_simulated(options: Options, fs: &crate::io::sim::SimFs) -> Result<Spool> {
        let fs = Fs::new(std::sync::Arc::new(fs.clone()));
        Ok(Spool {
            backend: Backend::open(fs, options)?,
        })
    }

    pub(crate) fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Flushes everything, records a clean stop and releases the directory. Every clone
    /// then fails with [`Error::Closed`](crate::Error::Closed).
    pub async fn close(&self) -> Result<()> {
        match &self.backend {
            Backend::Embedded(e) => e.close().await,
            #[cfg(feature = "kafka")]
            Backend::Kafka(k) => k.close().await,
        }
    }

    /// Appends one message; returns its offset (the original one on a de-duplication hit).
    ///
    /// (Not an `async fn`: it returns the backend's future itself, so the hottest call
    /// pays for no second state machine around it.)
    pub fn publish(
        &self,
        topic: &str,
        payload: impl Into<Bytes>,
        headers: &Headers,
    ) -> impl Future<Output = Result<u64>> {
        match &self.backend {
            Backend::Embedded(e) => {
                Either::<_, KafkaPublish>::Left(e.publish(topic, payload, headers))
            }
            #[cfg(feature = "kafka")]
            Backend::Kafka(k) => {
                let (k, topic, headers) = (k.clone(), topic.to_owned(), headers.clone());
                let payload = payload.into();
                let f: KafkaPublish =
                    Box::pin(async move { k.publish(&topic, payload, headers).await });
                Either::Right(f)
            }
        }
    }

    /// Appends messages in one write (and one sync); all or nothing.
    pub async fn publish_batch<P: Into<Bytes>>(
        &self,
        topic: &str,
        messages: Vec<(P, Headers)>,
    ) -> Result<Vec<u64>> {
        match &self.backend {
            Backend::Embedded(e) => e.publish_batch(topic, messages).await,
            #[cfg(feature = "kafka")]
            Backend::Kafka(k) => {
                let owned = messages.into_iter().map(|(p, h)| (p.into(), h)).collect();
                k.publish_batch(topic, owned).await
            }
        }
    }

    /// A consumer of `topic` in `group`.
    pub fn consumer(&self, topic: &str, group: &str) -> ConsumerBuilder {
        ConsumerBuilder::new(
            self.clone(),
            topic,
            group,
            ConsumerConfig {
                manual_ack: false,
                max_in_flight: 1,
                busy_poll: std::time::Duration::ZERO,
                ack_deadline: None,
                key_ordered: false,
            },
        )
    }

    /// Acks the group's cursor (must equal `offset`).
    pub async fn ack(&self, topic: &str, group: &str, offset: u64) -> Result<()> {
        match &self.backend {
            Backend::Embedded(e) => e.ack(topic, group, offset).await,
            #[cfg(feature = "kafka")]
            Backend::Kafka(k) => k.ack_offset(topic, group, offset).await,
        }
    }

    /// Nacks the group's cursor (must equal `offset`). It waits the `Nack Backoff`
    /// before it is delivered again (at once by default).
    pub async fn nack(
        &self,
        topic: &str,
        group: &str,
        offset: u64,
        reason: &str,
    ) -> Result<NackOutcome> {
        match &self.backend {
            Backend::Embedded(e) => e.nack(topic, group, offset, reason, None).await,
            #[cfg(feature = "kafka")]
            Backend::Kafka(k) => k.nack_offset(topic, group, offset, reason, None).await,
        }
    }

    /// Nacks the group's cursor (must equal `offset`); it is not delivered again before
    /// `delay` has passed, also across a reopen. A zero `delay` is a plain [`Spool::nack`].
    pub async fn nack_with_delay(
        &self,
        topic: &str,
        group: &str,
        offset: u64,
        reason: &str,
        delay: std::time::Duration,
    ) -> Result<NackOutcome> {
        let delay = Some(delay);
        match &self.backend {
            Backend::Embedded(e) => e.nack(topic, group, offset, reason, delay).await,
            #[cfg(feature = "kafka")]
            Backend::Kafka(k) => k.nack_offset(topic, group, offset, reason, delay).await,
        }
    }

    /// Moves the group's cursor; returns the new cursor.
    pub async fn reset_offset(&self, topic: &str, group: &str, to: OffsetReset) -> Result<u64> {
        match &self.backend {
            Backend::Embedded(e) => e.reset_offset(topic, group, to).await,
            #[cfg(feature = "kafka")]
            Backend::Kafka(k) => k.reset_offset(topic, group, to).await,
        }
    }

    /// Reads up to `max_records` from `from` (clamped to the earliest retained offset).
    pub async fn fetch(&self, topic: &str, from: u64, max_records: usize) -> Result<Vec<Record>> {
        match &self.backend {
            Backend::Embedded(e) => e.fetch(topic, from, max_records).await,
            #[cfg(feature = "kafka")]
            Backend::Kafka(k) => k.fetch(topic, from, max_records).await,
        }
    }

    /// The topic's offsets, size and segment count. An unknown topic reads as all zeros
    /// and is not created.
    pub fn topic_info(&self, topic: &str) -> Result<TopicInfo> {
        match &self.backend {
            Backend::Embedded(e) => e.topic_info(topic),
            #[cfg(feature = "kafka")]
            Backend::Kafka(k) => k.topic_info(topic),
        }
    }

    /// The group's cursor, lag, deliveries out and recorded failed attempts. An unknown
    /// group reads as a new one would start (at the earliest retained offset) and is not
    /// created.
    pub fn group_info(&self, topic: &str, group: &str) -> Result<GroupInfo> {
        match &self.backend {
            Backend::Embedded(e) => e.group_info(topic, group),
            #[cfg(feature = "kafka")]
            Backend::Kafka(k) => k.group_info(topic, group),
        }
    }

    /// The figures of every topic and group (`topic_info` and `group_info` of each, with
    /// the groups' counts since open) and the process's sync latencies: what `spool
    /// serve` shows and exports for Prometheus. Read one topic and group at a time, so
    /// not one instant across them.
    pub fn metrics(&self) -> Result<Metrics> {
        Metrics::gather(
            self.topics()?,
            |t| self.topic_info(t),
            |t| self.groups(t),
            |t, g| self.group_info(t, g),
        )
    }

    /// The groups with durable state on `topic`, sorted by name. A group has state from
    /// its first consumer build, ack, nack or reset on. An unknown topic has none.
    pub fn groups(&self, topic: &str) -> Result<Vec<String>> {
        match &self.backend {
            Backend::Embedded(e) => e.groups(topic),
            #[cfg(feature = "kafka")]
            Backend::Kafka(k) => k.groups(topic),
        }
    }

    /// Forgets a group: its cursor, attempt counters and reset epoch, durably. A consumer
    /// built later starts at the earliest retained offset, like a new group's.
    ///
    /// - Fails with [`Error::GroupInUse`](crate::Error::GroupInUse) while a consumer of it
    ///   is open (not yet dropped).
    /// - Deleting a group that does not exist is `Ok`.
    /// - A delivery handed out before is stale: its ack or nack fails and changes nothing.
    pub async fn delete_group(&self, topic: &str, group: &str) -> Result<()> {
        match &self.backend {
            Backend::Embedded(e) => e.delete_group(topic, group).await,
            #[cfg(feature = "kafka")]
            Backend::Kafka(k) => k.delete_group(topic, group).await,
        }
    }

    /// Kafka's deleteRecords: the records of `topic` before `offset` (clamped to the log
    /// end) are gone for every reader from now on and after a reopen. Returns the topic's
    /// earliest offset after it.
    ///
    /// - `fetch` clamps to it; a `Time` or `Earliest` reset cannot go below it.
    /// - Groups behind it resume there and count the skipped records in `skipped`.
    /// - Whole segments below it are removed from disk.
    /// - An offset at or below the current earliest changes nothing.
    pub async fn delete_records_before(&self, topic: &str, offset: u64) -> Result<u64> {
        self.backend
            .embedded("delete_records_before")?
            .delete_records_before(topic, offset)
            .await
    }

    /// Sets `topic`'s overrides of the instance's retention settings, durably; they
    /// replace the ones set before. `None` in a field leaves the instance's value in force.
    /// `topic_info(topic).config` shows them as set. Retention applies them from its next
    /// pass (`apply_retention`, or the background one).
    pub async fn set_topic_config(&self, topic: &str, config: TopicConfig) -> Result<()> {
        self.backend
            .embedded("set_topic_config")?
            .set_topic_config(topic, config)
            .await
    }

    /// Every topic, sorted by name.
    pub fn topics(&self) -> Result<Vec<String>> {
        match &self.backend {
            Backend::Embedded(e) => e.topics(),
            #[cfg(feature = "kafka")]
            Backend::Kafka(k) => k.topics(),
        }
    }

    /// Applies retention now (the background thread also does every `Retention Check Ms`).
    pub fn apply_retention(&self) -> Result<()> {
        self.backend.embedded("apply_retention")?.apply_retention()
    }

    /// Catalog commits that succeeded since this instance was opened (for tests: a
    /// batch's acks are counted in commits).
    #[doc(hidden)]
    pub fn catalog_commits(&self) -> u64 {
        match &self.backend {
            Backend::Embedded(e) => e.catalog_commits(),
            #[cfg(feature = "kafka")]
            Backend::Kafka(_) => 0,
        }
    }

    /// Persists auto-acked cursors now (the background thread also does every
    /// `Commit Interval Ms`).
    pub fn commit(&self) -> Result<()> {
        self.backend.embedded("commit")?.commit()
    }

    /// Makes a consistent copy of the whole instance in `dest`, while publishers and
    /// consumers go on. The copy is a data directory: [`Spool::open`] opens it, also
    /// while this instance is still open.
    ///
    /// - Consistent: every group's durable state as of one instant, and every log up to
    ///   what its readers saw then or a little later. Acks not yet committed at that
    ///   instant are not in the copy: those records are delivered again from it, as after
    ///   a crash (docs/operations.md, "Snapshots").
    /// - `dest` must not exist, or be an empty directory, outside the data directory;
    ///   otherwise [`Error::SnapshotDestination`](crate::Error::SnapshotDestination) and
    ///   nothing is written there.
    /// - Sealed segments are hard-linked (copied on another file system); the rest is
    ///   copied and synced.
    /// - A copy cut short (a power cut, an error) is refused by `open` with
    ///   [`Error::IncompleteSnapshot`](crate::Error::IncompleteSnapshot).
    /// - Retention and `delete_records_before` wait while it runs.
    pub async fn snapshot(&self, dest: impl AsRef<std::path::Path>) -> Result<SnapshotInfo> {
        self.backend
            .embedded("snapshot")?
            .snapshot(dest.as_ref())
            .await
    }

    /// Reads back every record and index entry of every segment (of `topic` only, if
    /// given) and checks the catalog against the logs: what `spool verify` runs. Read-only;
    /// each problem names its file and byte position. Doc-hidden: an operator's tool,
    /// not part of the API contract.
    #[doc(hidden)]
    pub async fn verify(&self, topic: Option<&str>) -> Result<VerifyReport> {
        self.backend.embedded("verify")?.verify(topic).await
    }

    /// [`Spool::verify`]'s reading of the logs, on a closed data directory and without
    /// opening it (an open would first cut a damaged tail of an active segment away as
    /// torn). Holds the directory's lock while it reads; fails with
    /// [`Error::Locked`](crate::Error::Locked) while an instance has it. Read-only; the
    /// catalog is not checked (open the directory and call [`Spool::verify`] for that).
    #[doc(hidden)]
    pub fn verify_closed(
        dir: impl AsRef<std::path::Path>,
        topic: Option<&str>,
    ) -> Result<VerifyReport> {
        crate::queue::verify_closed(&Fs::real(), dir.as_ref(), topic)
    }
}
