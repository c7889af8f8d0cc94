//! A group's member in this process under `Mode=Kafka`: one librdkafka consumer shared by
//! every `Consumer` of the group, the floors of the partitions Kafka assigned to it, and
//! a committer thread.
//!
//! - **Acks** change a floor at once; the committer then commits every assigned
//!   partition's cursor with its floor's metadata (`floor.rs`) in one `OffsetCommit`. An
//!   ack waits for the commit that covers it; acks made meanwhile share the next one.
//! - **Rebalances**: on revoke, the lost partitions' floors are committed and their
//!   deliveries fenced (a late ack fails with `StaleDelivery`, as after a reset); on
//!   assign, each partition's floor is read back from its committed offset and metadata.
//! - **Records admitted** (`admit`): finished ones, ones out and ones held are skipped, so
//!   a seek back or a rebalance re-reading a partition hands nothing out twice.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer as _, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::{Notify, watch};

use super::floor::Floor;
use super::{Kafka, clients, kafka_err, to_i64, to_u64};
use crate::error::{Error, Result};
use crate::format::record::Record;
use crate::queue::{GroupCounts, GroupInfo, PendingAttempt};

/// Tells deliveries of one assignment of a partition from those of another.
static EPOCHS: AtomicU64 = AtomicU64::new(1);

/// One assigned partition.
pub(super) struct Part {
    pub floor: Floor,
    /// Changes at each assignment: a delivery of an older one is stale.
    pub epoch: u64,
    /// Offsets handed out and neither acked nor nacked.
    pub out: BTreeSet<u64>,
    /// Records to hand out again later (nacked with a delay), by offset.
    pub held: BTreeMap<u64, Record>,
}

/// What the member knows, under one lock.
#[derive(Default)]
pub(super) struct State {
    pub parts: BTreeMap<i32, Part>,
    /// Bumped by every change a commit must carry.
    pub version: u64,
    /// The version the committer took last.
    taken: u64,
    pub max_in_flight: usize,
    pub in_flight: usize,
    pub counts: GroupCounts,
    /// Records dead-lettered by this member since it joined.
    pub dead_lettered: u64,
    closing: bool,
}

/// The latest commit's outcome: acks wait on it.
#[derive(Clone, Debug, Default)]
struct Committed {
    ok: u64,
    failed: Option<(u64, String)>,
}

/// What the member, its rebalance callbacks and its committer share.
pub(super) struct Shared {
    topic: String,
    timeout: Duration,
    state: Mutex<State>,
    /// Wakes the committer.
    dirty: Condvar,
    committed: watch::Sender<Committed>,
    /// Wakes a `recv` waiting for room or a held record.
    pub room: Notify,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks a change for the committer; returns the version an ack waits for.
    pub fn changed(&self, st: &mut State) -> u64 {
        st.version += 1;
        self.dirty.notify_one();
        st.version
    }

    /// Waits until a commit covering `version` is acknowledged by the broker.
    pub async fn durable(&self, version: u64) -> Result<()> {
        let mut rx = self.committed.subscribe();
        let seen = rx
            .wait_for(|c| c.ok >= version || c.failed.as_ref().is_some_and(|f| f.0 >= version))
            .await
            .map_err(|_| Error::Closed)?
            .clone();
        match seen.failed {
            Some((v, detail)) if seen.ok < version && v >= version => Err(Error::Kafka {
                context: "committing the group's offsets".to_owned(),
                detail,
            }),
            _ => Ok(()),
        }
    }
}

/// librdkafka's callbacks into the member.
pub(super) struct GroupContext {
    shared: Arc<Shared>,
}

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let lost: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
            let floors = {
                let mut st = self.shared.lock();
                let floors = floors_of(&st, &lost);
                for p in &lost {
                    if let Some(part) = st.parts.remove(p) {
                        st.in_flight -= part.out.len();
                    }
                }
                floors
            };
            self.shared.room.notify_waiters();
            if let Err(e) = commit(consumer, &self.shared.topic, &floors) {
                tracing::warn!(topic = %self.shared.topic, error = %e, "commit at revoke failed");
            }
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            let got: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
            match read_floors(consumer, &self.shared.topic, &got, self.shared.timeout) {
                Ok(floors) => {
                    let mut st = self.shared.lock();
                    for (p, floor) in floors {
                        let part = Part {
                            floor,
                            epoch: EPOCHS.fetch_add(1, Ordering::Relaxed),
                            out: BTreeSet::new(),
                            held: BTreeMap::new(),
                        };
                        st.parts.insert(p, part);
                    }
                }
                Err(e) => {
                    tracing::error!(topic = %self.shared.topic, error = %e, "reading committed floors failed")
                }
            }
            self.shared.room.notify_waiters();
        }
    }
}

/// A consumer context for checking a configuration at open.
pub(super) fn context_for_check() -> GroupContext {
    GroupContext {
        shared: Arc::new(Shared::new(String::new(), Duration::from_secs(1))),
    }
}

impl Shared {
    fn new(topic: String, timeout: Duration) -> Shared {
        Shared {
            topic,
            timeout,
            state: Mutex::new(State::default()),
            dirty: Condvar::new(),
            committed: watch::channel(Committed::default()).0,
            room: Notify::new(),
        }
    }
}

/// `(partition, cursor, metadata)` of the named partitions still assigned.
fn floors_of(st: &State, parts: &[i32]) -> Vec<(i32, u64, String)> {
    parts
        .iter()
        .filter_map(|p| {
            st.parts
                .get(p)
                .map(|part| (*p, part.floor.cursor(), part.floor.metadata()))
        })
        .collect()
}

/// Commits each partition's cursor with its metadata, synchronously.
fn commit<C: ConsumerContext, K: rdkafka::consumer::Consumer<C>>(
    consumer: &K,
    topic: &str,
    floors: &[(i32, u64, String)],
) -> Result<()> {
    if floors.is_empty() {
        return Ok(());
    }
    let mut tpl = TopicPartitionList::with_capacity(floors.len());
    for (p, cursor, metadata) in floors {
        let mut e = tpl.add_partition(topic, *p);
        e.set_offset(Offset::Offset(to_i64(*cursor)))
            .map_err(|e| kafka_err("preparing a commit", e))?;
        e.set_metadata(metadata.as_str());
    }
    consumer
        .commit(&tpl, CommitMode::Sync)
        .map_err(|e| kafka_err("committing the group's offsets", e))
}

/// The committed floors of `parts`; a partition never committed starts at its earliest.
fn read_floors<C: ConsumerContext, K: rdkafka::consumer::Consumer<C>>(
    consumer: &K,
    topic: &str,
    parts: &[i32],
    timeout: Duration,
) -> Result<Vec<(i32, Floor)>> {
    let mut tpl = TopicPartitionList::with_capacity(parts.len());
    for p in parts {
        tpl.add_partition(topic, *p);
    }
    let committed = consumer
        .committed_offsets(tpl, timeout)
        .map_err(|e| kafka_err("reading the group's committed offsets", e))?;
    let mut out = Vec::with_capacity(parts.len());
    for e in committed.elements() {
        let floor = match e.offset() {
            Offset::Offset(o) => Floor::from_commit(to_u64(o), e.metadata()),
            _ => {
                let (lo, _) = consumer
                    .fetch_watermarks(topic, e.partition(), timeout)
                    .map_err(|e| kafka_err("reading a partition's watermarks", e))?;
                Floor::from_commit(to_u64(lo), "")
            }
        };
        out.push((e.partition(), floor));
    }
    Ok(out)
}

/// The member of one group of one topic in this process.
pub(super) struct Group {
    pub kafka: Kafka,
    pub topic: String,
    pub name: String,
    pub consumer: Arc<StreamConsumer<GroupContext>>,
    pub shared: Arc<Shared>,
    committer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("topic", &self.topic)
            .field("group", &self.name)
            .finish_non_exhaustive()
    }
}

impl Group {
    /// Joins `group` on `topic` and starts its committer.
    pub fn join(kafka: Kafka, topic: &str, group: &str) -> Result<Arc<Group>> {
        let shared = Arc::new(Shared::new(topic.to_owned(), kafka.timeout()));
        shared.lock().max_in_flight = 1;
        let consumer = clients::member(
            kafka.options(),
            group,
            GroupContext {
                shared: shared.clone(),
            },
        )?;
        consumer
            .subscribe(&[topic])
            .map_err(|e| kafka_err("subscribing to the topic", e))?;
        let consumer = Arc::new(consumer);
        let committer = {
            let (shared, consumer) = (shared.clone(), consumer.clone());
            let topic = topic.to_owned();
            let interval = Duration::from_millis(kafka.options().commit_interval_ms);
            std::thread::Builder::new()
                .name("spool-kafka-commit".into())
                .spawn(move || run_committer(&shared, &consumer, &topic, interval))
                .map_err(|e| Error::Io {
                    context: "starting a Kafka committer thread".into(),
                    source: e,
                })?
        };
        Ok(Arc::new(Group {
            kafka,
            topic: topic.to_owned(),
            name: group.to_owned(),
            consumer,
            shared,
            committer: Mutex::new(Some(committer)),
        }))
    }

    /// Waits until everything changed so far is committed.
    pub async fn flush(&self) -> Result<()> {
        let v = self.shared.lock().version;
        self.shared.durable(v).await
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.closing = true;
            self.shared.dirty.notify_one();
        }
        let handle = self
            .committer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

/// Commits whenever the state changed; on a failed commit, retries after `interval`.
/// Ends, after a last commit, once the member closes.
fn run_committer(
    shared: &Shared,
    consumer: &StreamConsumer<GroupContext>,
    topic: &str,
    interval: Duration,
) {
    loop {
        let (version, floors) = {
            let mut st = shared.lock();
            while st.version == st.taken && !st.closing {
                st = shared.dirty.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.version == st.taken {
                return;
            }
            st.taken = st.version;
            let parts: Vec<i32> = st.parts.keys().copied().collect();
            (st.version, floors_of(&st, &parts))
        };
        match commit(consumer, topic, &floors) {
            Ok(()) => shared.committed.send_modify(|c| c.ok = c.ok.max(version)),
            Err(e) => {
                tracing::warn!(%topic, error = %e, "offset commit failed; retrying");
                shared
                    .committed
                    .send_modify(|c| c.failed = Some((version, e.to_string())));
                let mut st = shared.lock();
                if st.closing {
                    return;
                }
                st.taken = st.taken.min(version - 1);
                drop(shared.dirty.wait_timeout(st, interval));
            }
        }
    }
}

/// `group_info` from the committed offsets and watermarks, with this process's own
/// figures when a member of the group is open here.
pub(super) fn info(k: &Kafka, topic: &str, group: &str, live: Option<&Group>) -> Result<GroupInfo> {
    let n = k.partitions(topic)?;
    let mut gi = GroupInfo::default();
    if n == 0 {
        return Ok(gi);
    }
    let parts: Vec<i32> = (0..n).collect();
    let reader = clients::member(k.options(), group, context_for_check())?;
    let floors = read_floors(&reader, topic, &parts, k.timeout())?;
    for (p, floor) in floors {
        let (_, hi) = k.watermarks(topic, p)?;
        gi.cursor += floor.cursor();
        gi.next += hi;
        for (offset, f) in floor.failures() {
            gi.pending.push(PendingAttempt {
                offset,
                attempts: f.attempts,
                last_reason: String::new(),
            });
        }
    }
    gi.lag = gi.next.saturating_sub(gi.cursor);
    if let Some(g) = live {
        let st = g.shared.lock();
        gi.in_flight = st.in_flight;
        gi.counts = st.counts;
        gi.dead_lettered = st.dead_lettered;
    }
    drop(reader);
    Ok(gi)
}
