//! The public vocabulary of the queue: the types the API takes and reports, the header
//! names a dead-letter copy carries, and the two queries that report state.
//! **Invariant:** `lib.rs` re-exports every public item here; the queries commit nothing.

use super::Engine;
use super::engine::lock;
use super::topic_config::TopicConfig;
use crate::error::Result;
use crate::log::LogStats;
use crate::names;

/// Header naming the topic a dead-letter copy came from.
pub const X_ORIGINAL_TOPIC: &str = "x-original-topic";
/// Header holding the offset of the original message in its topic.
pub const X_ORIGINAL_OFFSET: &str = "x-original-offset";
/// Header holding the original message's timestamp, in milliseconds since the Unix epoch.
pub const X_ORIGINAL_TIMESTAMP: &str = "x-original-timestamp";
/// Header naming the consumer group that gave up on the message.
pub const X_CONSUMER_GROUP: &str = "x-consumer-group";
/// Header holding how many delivery attempts the group recorded.
pub const X_DELIVERY_ATTEMPTS: &str = "x-delivery-attempts";
/// Header holding the reason of the last failed attempt.
pub const X_DEAD_LETTER_REASON: &str = "x-dead-letter-reason";

/// Where to move a group's cursor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffsetReset {
    /// The earliest retained record.
    Earliest,
    /// The log end: only records published from now on.
    Latest,
    /// The first record with a timestamp at or after the time (the log end if none).
    Time(std::time::SystemTime),
    /// An offset, clamped to `[earliest, log end]`.
    Explicit(u64),
}

/// What a nack did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NackOutcome {
    /// Attempts recorded for the message so far, this one included.
    pub delivery_attempt: u32,
    /// Whether this nack moved the message to the dead-letter topic.
    pub dead_lettered: bool,
    /// The group's cursor after the nack.
    pub next_offset: u64,
    /// When the message may be delivered again: `None` when at once or dead-lettered.
    pub redeliver_at: Option<std::time::SystemTime>,
}

/// State of a topic's log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TopicInfo {
    /// The offset of the oldest record retention kept.
    pub earliest: u64,
    /// The log end: the offset the next publish gets.
    pub next: u64,
    /// `next - earliest`.
    pub messages: u64,
    /// Readable bytes in the topic's segments, their headers included.
    pub bytes: u64,
    /// Segment files in the log, the active one included.
    pub segments: usize,
    /// Message ids currently remembered for de-duplication.
    pub dedup_ids: usize,
    /// The topic's overrides as set (`None`: the instance's value applies).
    pub config: TopicConfig,
}

/// One offset with recorded failed attempts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingAttempt {
    /// The message's offset in its topic.
    pub offset: u64,
    /// Failed attempts recorded so far.
    pub attempts: u32,
    /// The reason the last failed attempt gave.
    pub last_reason: String,
}

/// State of a consumer group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupInfo {
    /// Next offset not yet finished.
    pub cursor: u64,
    /// The log end.
    pub next: u64,
    /// `next - cursor`.
    pub lag: u64,
    /// Deliveries handed out and not yet acked, nacked or released.
    pub in_flight: usize,
    /// Offsets with recorded failed attempts, lowest first.
    pub pending: Vec<PendingAttempt>,
    /// Messages the group moved to the dead-letter topic.
    pub dead_lettered: u64,
    /// Records retention deleted before the group finished them.
    pub skipped: u64,
    /// Bumped by each reset.
    pub epoch: u64,
    /// What the group did since this instance opened.
    pub counts: GroupCounts,
}

/// What a group did since this instance opened: in memory only, so a reopen (or an
/// instance opened from a snapshot) starts from zero, as a Prometheus counter may. Not
/// part of the group's durable state; kept across resets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupCounts {
    /// Deliveries handed out, redeliveries included.
    pub delivered: u64,
    /// Deliveries of a record that had waited for redelivery: nacked, released, expired,
    /// or out when the instance last stopped.
    pub redelivered: u64,
    /// Deliveries acked, explicitly or automatically.
    pub acked: u64,
    /// Nacks (each failed attempt an application reported).
    pub nacked: u64,
    /// Deliveries whose ack deadline passed.
    pub expired: u64,
}

/// Everything `Spool::metrics` reports: the same figures as `topic_info` and
/// `group_info` for every topic and group, and the process's sync latencies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Metrics {
    /// Every topic, sorted by name. Its `next` is also the count of records ever
    /// published to it (a counter that survives reopens).
    pub topics: Vec<TopicMetrics>,
    /// Every group with durable state, by topic then name.
    pub groups: Vec<GroupMetrics>,
    /// How long the syncs of segment, index and directory files took, process-wide.
    pub syncs: crate::io::sync_stats::SyncLatency,
}

/// One topic's figures in [`Metrics`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TopicMetrics {
    /// The topic's name.
    pub topic: String,
    /// What `topic_info` says.
    pub info: TopicInfo,
}

/// One group's figures in [`Metrics`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupMetrics {
    /// The topic the group reads.
    pub topic: String,
    /// The group's name.
    pub group: String,
    /// What `group_info` says, `counts` included.
    pub info: GroupInfo,
}

impl Metrics {
    /// Builds the figures from a source of topics and groups (one call each, as the
    /// public API has them), so that every backend reports the same way.
    #[doc(hidden)]
    pub fn gather(
        topics: Vec<String>,
        topic_info: impl Fn(&str) -> Result<TopicInfo>,
        groups: impl Fn(&str) -> Result<Vec<String>>,
        group_info: impl Fn(&str, &str) -> Result<GroupInfo>,
    ) -> Result<Metrics> {
        let mut m = Metrics::default();
        for topic in topics {
            for group in groups(&topic)? {
                let info = group_info(&topic, &group)?;
                let topic = topic.clone();
                m.groups.push(GroupMetrics { topic, group, info });
            }
            let info = topic_info(&topic)?;
            m.topics.push(TopicMetrics { topic, info });
        }
        m.syncs = crate::io::sync_stats::snapshot();
        Ok(m)
    }
}

impl GroupCounts {
    /// The counts in their field order (the admin protocol's form).
    #[doc(hidden)]
    pub fn to_array(self) -> [u64; 5] {
        [
            self.delivered,
            self.redelivered,
            self.acked,
            self.nacked,
            self.expired,
        ]
    }

    /// The counts from [`GroupCounts::to_array`]'s form.
    #[doc(hidden)]
    pub fn from_array(a: [u64; 5]) -> GroupCounts {
        let [delivered, redelivered, acked, nacked, expired] = a;
        GroupCounts {
            delivered,
            redelivered,
            acked,
            nacked,
            expired,
        }
    }
}

impl Engine {
    /// The state of `topic`'s log (all zero if the topic does not exist).
    pub fn topic_info(&self, topic: &str) -> Result<TopicInfo> {
        names::check(topic)?;
        let Some(t) = self.topic(topic) else {
            return Ok(TopicInfo::default());
        };
        // The log's end as readers, `group_info` and `reset` see it: records held for the
        // sync thread (`Sync=Always`) are not in it until written, as their publishes
        // have not returned (and a failed write drops them).
        let LogStats {
            earliest,
            next,
            bytes,
            segments,
        } = t.reader.stats();
        let dedup_ids = lock(&t.writer).dedup.len();
        let config = lock(&t.config).clone();
        Ok(TopicInfo {
            earliest,
            next,
            messages: next - earliest,
            bytes,
            segments,
            dedup_ids,
            config,
        })
    }

    /// The state of `group` on `topic`. A group that does not exist yet reports the state
    /// it would start in.
    pub fn group_info(&self, topic: &str, group: &str) -> Result<GroupInfo> {
        names::check(topic)?;
        names::check(group)?;
        let Some(t) = self.topic(topic) else {
            return Ok(GroupInfo::default());
        };
        let g = lock(&t.groups).get(group).cloned();
        let Some(g) = g else {
            // Earliest first: both only grow, so a `next` read after it is not below it
            // (read the other way round, a roll and retention in between put it above).
            let earliest = t.reader.earliest();
            let next = t.reader.next();
            return Ok(GroupInfo {
                cursor: earliest,
                next,
                lag: next.saturating_sub(earliest),
                ..GroupInfo::default()
            });
        };
        let mut g = g.lock();
        self.clamp(&t, group, &mut g);
        // An expired delivery no longer counts as in flight.
        self.expire_due(&t, group, &mut g);
        // After the clamp, for the same reason: the cursor is at most the log's end.
        let next = t.reader.next();
        Ok(GroupInfo {
            cursor: g.cursor,
            next,
            lag: next.saturating_sub(g.cursor),
            in_flight: g.in_flight.len(),
            pending: g
                .attempts
                .iter()
                .map(|(o, a)| PendingAttempt {
                    offset: *o,
                    attempts: a.attempts,
                    last_reason: a.last_reason.clone(),
                })
                .collect(),
            dead_lettered: g.dead_lettered,
            skipped: g.skipped,
            epoch: g.epoch,
            counts: g.counts,
        })
    }
}
