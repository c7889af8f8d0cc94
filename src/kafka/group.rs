//! A group's member in this process under `Mode=Kafka`: one librdkafka consumer shared by
//! every `Consumer` of the group, the floors of the partitions Kafka assigned to it, a
//! poll thread (`poller.rs`) and a committer thread.
//!
//! - **Acks** change a floor at once; the committer then commits every assigned
//!   partition's cursor with its floor's metadata (`floor.rs`) in one `OffsetCommit`. An
//!   ack waits for the commit that covers it; acks made meanwhile share the next one.
//!   An `ack_all` sends that commit itself when none is being made (`ack_commit.rs`).
//! - **One commit at a time** (`State::turn`): a commit's snapshot of the floors is taken
//!   only once the one before was answered, so commits land in the order of their
//!   snapshots and none moves a floor back.
//! - **Rebalances**: on revoke, the lost partitions' floors are committed and their
//!   deliveries fenced (a late ack fails with `StaleDelivery`, as after a reset); on
//!   assign, each partition's floor is read back from its committed offset and metadata.
//! - **Records admitted** (`admit`): finished ones, ones out and ones held are skipped, so
//!   a seek back or a rebalance re-reading a partition hands nothing out twice.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext, Rebalance};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::{Notify, watch};

use super::ack_commit::Pending;
use super::floor::Floor;
use super::{Kafka, clients, kafka_err, to_i64, to_u64};
use crate::error::{Error, Result};
use crate::format::record::Record;
use crate::queue::key_order::KeyOrder;
use crate::queue::{GroupCounts, GroupInfo, PendingAttempt};

/// Tells deliveries of one assignment of a partition from those of another.
static EPOCHS: AtomicU64 = AtomicU64::new(1);

/// One assigned partition.
pub(super) struct Part {
    pub floor: Floor,
    /// Changes at each assignment: a delivery of an older one is stale.
    pub epoch: u64,
    /// Offsets handed out and neither acked nor nacked, with the ticket of their
    /// hand-out: only that delivery settles it (an older one of the same record is
    /// stale, as an auto-ack's shadow of a record another consumer got again).
    pub out: BTreeMap<u64, u64>,
    /// Records to hand out again later (nacked with a delay, or waiting for their key's
    /// turn), by offset.
    pub held: BTreeMap<u64, Record>,
    /// The keys of its records out or waiting (`key_order.rs`).
    pub keys: KeyOrder,
    /// The offset the poll thread reads next, if known (the position it fetches from):
    /// a record read above it means the offsets between have no record (`Floor::skip`).
    pub read_next: Option<u64>,
}

/// A seek for the poll thread: a nack's back to its record (kept, to hold it if the
/// seek fails), or a reset's to the new cursor. At most one per partition waits: see
/// `seek`.
pub(super) struct Seek {
    pub partition: i32,
    pub offset: u64,
    pub records: Vec<Record>,
}

/// What the member knows, under one lock.
#[derive(Default)]
pub(super) struct State {
    pub parts: BTreeMap<i32, Part>,
    /// Bumped by every change a commit must carry.
    pub version: u64,
    /// The version whose snapshot was taken for a commit last.
    pub(super) taken: u64,
    /// A commit is being made (a snapshot of the floors taken, its answer not handled):
    /// by the committer, by an ack (`pending`), or by the revoke. Commits land in the
    /// order of their snapshots, so one at a time.
    pub(super) turn: bool,
    /// The revoke waits for the commit turn: the committer takes over a commit an
    /// `ack_all`'s task watches rather than wait for that task (`wait_for_work`).
    pub(super) turn_wanted: usize,
    /// A commit an `ack_all` sent (`ack_commit.rs`).
    pub(super) pending: Option<Pending>,
    /// Since when commits have failed (none succeeded since).
    pub(super) failing_since: Option<Instant>,
    pub max_in_flight: usize,
    pub in_flight: usize,
    pub counts: GroupCounts,
    /// Records the poll thread read, in order, for `recv` to admit.
    pub buffer: VecDeque<(i32, Record)>,
    /// Seeks asked for by nacks and resets, for the poll thread to make.
    pub seeks: Vec<Seek>,
    /// Records dead-lettered by this member since it joined.
    pub dead_lettered: u64,
    pub closing: bool,
    /// The deliveries out with an ack deadline (`deadline.rs`).
    pub deadlines: super::deadline::Deadlines,
    /// The poll thread waits for the buffer to drain (`Shared::drained`).
    pub poller_waits: bool,
    /// Records a nack at the limit took to dead-letter, by (partition, offset, epoch),
    /// until its `PutBack` is done or dropped: a re-read skips them (they are neither
    /// out nor held, and their intent may not be there yet).
    pub dead_lettering: BTreeSet<(i32, u64, u64)>,
    /// Consumers of this member built with `key_ordered()` and still open: while there
    /// are any, the member orders by key (`key_order.rs`).
    pub key_ordered: usize,
}

/// The latest commit's outcome: acks wait on it.
#[derive(Clone, Debug, Default)]
struct Committed {
    ok: u64,
    failed: Option<Failure>,
    /// Versions `(after, upto]` a failed revoke commit left not durable, for good: a
    /// later success covers other partitions only. The latest `LOST_KEPT`.
    lost: VecDeque<(u64, u64)>,
    /// The member stopped: nothing more will be committed.
    closed: bool,
}

/// Lost version ranges remembered (an ack older than these has long returned).
const LOST_KEPT: usize = 64;

/// A commit that failed for good, and the versions it leaves not durable.
#[derive(Clone, Debug)]
struct Failure {
    version: u64,
    /// At a revoke: the partitions are another member's now, and their records will be
    /// delivered there again. An ack left behind is stale, as after a reset.
    revoked: bool,
    detail: String,
}

impl State {
    /// Someone besides the task that watches the pending commit waits for the commit
    /// turn to pass: a change made since its snapshot, the revoke, or the close.
    pub(super) fn others_wait(&self) -> bool {
        self.version != self.taken || self.turn_wanted > 0 || self.closing
    }
}

/// What the member, its rebalance callbacks and its committer share.
pub(super) struct Shared {
    pub(super) topic: String,
    timeout: Duration,
    state: Mutex<State>,
    /// Wakes the committer.
    pub(super) dirty: Condvar,
    /// Wakes the poll thread waiting for room in the buffer (`State::poller_waits`).
    pub drained: Condvar,
    committed: watch::Sender<Committed>,
    /// Wakes a `recv` waiting for room or a held record.
    pub room: Notify,
    /// Wakes the revoke waiting for the commit turn (`State::turn`).
    turn_free: Condvar,
    /// Records the poll thread read and has not moved to `State::buffer` yet: it moves a
    /// poll's worth at a time, under one state lock. Only the poll thread touches it (the
    /// rebalance callbacks run on it too, and move it first, so every record reaches the
    /// buffer before a rebalance that followed its read changes the state).
    polled: Mutex<Vec<(i32, Record)>>,
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

    /// `changed` without waking the committer: the caller calls `wake_committer` once it
    /// let the lock go (woken under it, the committer would block on the lock at once).
    pub fn bump(&self, st: &mut State) -> u64 {
        st.version += 1;
        st.version
    }

    /// Wakes the committer after a `bump`; made without the state lock held. Acks made
    /// back to back (a `join_all`) share the commit the committer then makes.
    pub fn wake_committer(&self) {
        self.dirty.notify_one();
    }

    /// Takes the commit turn and the floors to commit, as of the current version.
    pub(super) fn snapshot(&self, st: &mut State) -> (u64, Vec<(i32, u64, String)>) {
        debug_assert!(!st.turn, "one commit at a time");
        st.turn = true;
        st.taken = st.version;
        let parts: Vec<i32> = st.parts.keys().copied().collect();
        (st.version, floors_of(st, &parts))
    }

    /// Waits for the commit turn (the revoke, on the poll thread) and takes it.
    fn take_turn<'a>(&'a self, mut st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        if st.turn {
            // A task that watches its commit may not be polled: the committer answers.
            st.turn_wanted += 1;
            self.dirty.notify_one();
            while st.turn {
                st = self.turn_free.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            st.turn_wanted -= 1;
        }
        st.turn = true;
        st
    }

    /// Ends a commit: the next may take its snapshot.
    pub(super) fn give_turn(&self) {
        self.lock().turn = false;
        self.turn_free.notify_all();
        self.dirty.notify_one();
    }

    /// After records were taken from the buffer: wakes the poll thread if it waits and
    /// the buffer has drained to `RESUME_RECORDS`.
    pub fn took(&self, st: &mut State) {
        if st.poller_waits && st.buffer.len() <= super::poller::RESUME_RECORDS {
            st.poller_waits = false;
            self.drained.notify_one();
        }
    }

    /// Keeps `rec` to hand out again from memory (due by its floor's not-before time).
    pub fn hold(&self, p: i32, rec: Record) {
        let mut st = self.lock();
        if let Some(part) = st.parts.get_mut(&p) {
            part.held.insert(rec.offset, rec);
        }
        drop(st);
        self.room.notify_waiters();
    }

    /// A record the poll thread read, for `recv` once `arrived` moves it.
    pub fn polled(&self, p: i32, rec: Record) {
        self.polled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((p, rec));
    }

    /// Moves the records `polled` to the buffer, under one lock. A record is dropped if
    /// its partition went, or if a seek back of its partition to it or before it is
    /// pending (it will be read again).
    pub fn arrived(&self) {
        let batch = std::mem::take(&mut *self.polled.lock().unwrap_or_else(|e| e.into_inner()));
        if batch.is_empty() {
            return;
        }
        let mut st = self.lock();
        // Only a first record wakes a `recv`: one that waits while records are buffered
        // waits for room, which an ack or nack signals.
        let was_empty = st.buffer.is_empty();
        let mut skipped = false;
        for (p, rec) in batch {
            let sought = st
                .seeks
                .iter()
                .any(|s| s.partition == p && s.offset <= rec.offset);
            let Some(part) = st.parts.get_mut(&p).filter(|_| !sought) else {
                continue;
            };
            // Read in order from `read_next`: what lies between had no record.
            if let Some(next) = part.read_next {
                skipped |= part.floor.skip(next, rec.offset);
            }
            part.read_next = Some(rec.offset + 1);
            st.buffer.push_back((p, rec));
        }
        if skipped {
            // The cursor moved: a commit carries it.
            self.changed(&mut st);
        }
        let wake = was_empty && !st.buffer.is_empty();
        drop(st);
        if wake {
            self.room.notify_waiters();
        }
    }

    /// `Kafka Timeout Ms`.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Tells the acks waiting for `version` or below how its commit went.
    pub(super) fn committed(&self, version: u64, result: Result<()>, revoked: bool) {
        match result {
            Ok(()) => self.committed.send_modify(|c| c.ok = c.ok.max(version)),
            Err(e) => {
                let detail = match e {
                    Error::Kafka { detail, .. } => detail,
                    other => other.to_string(),
                };
                let f = Failure {
                    version,
                    revoked,
                    detail,
                };
                self.committed.send_modify(|c| {
                    if revoked && c.ok < version {
                        c.lost.push_back((c.ok, version));
                        if c.lost.len() > LOST_KEPT {
                            c.lost.pop_front();
                        }
                    }
                    c.failed = Some(f);
                });
            }
        }
    }

    /// Waits until a commit covering `version` is acknowledged by the broker. `offset`
    /// names the record an ack or nack waits for (a stale one fails naming it).
    pub async fn durable(&self, version: u64, offset: Option<u64>) -> Result<()> {
        let mut rx = self.committed.subscribe();
        let seen = rx
            .wait_for(|c| {
                c.ok >= version
                    || c.closed
                    || c.failed.as_ref().is_some_and(|f| f.version >= version)
            })
            .await
            .map_err(|_| Error::Closed)?
            .clone();
        if seen
            .lost
            .iter()
            .any(|(after, upto)| *after < version && version <= *upto)
        {
            return Err(match offset {
                Some(offset) => Error::StaleDelivery { offset },
                None => Error::Kafka {
                    context: "committing the group's offsets at a rebalance".to_owned(),
                    detail: "the partitions moved before the commit was acknowledged".to_owned(),
                },
            });
        }
        if seen.ok >= version {
            return Ok(());
        }
        match (seen.failed, offset) {
            (Some(f), Some(offset)) if f.version >= version && f.revoked => {
                Err(Error::StaleDelivery { offset })
            }
            (Some(f), _) if f.version >= version => Err(Error::Kafka {
                context: "committing the group's offsets".to_owned(),
                detail: f.detail,
            }),
            _ => Err(Error::Closed),
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
        // What was read before the rebalance is in the buffer before it changes anything.
        self.shared.arrived();
        if let Rebalance::Revoke(tpl) = rebalance {
            let lost: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
            // Every assigned partition's floor, as of one version: a success covers every
            // ack made so far, whichever partition it was of. One commit at a time: an
            // older snapshot cannot land after this one and move a floor back.
            let (version, floors) = {
                let mut st = self.shared.take_turn(self.shared.lock());
                let all: Vec<i32> = st.parts.keys().copied().collect();
                let floors = floors_of(&st, &all);
                for p in &lost {
                    if let Some(part) = st.parts.remove(p) {
                        st.in_flight = st.in_flight.saturating_sub(part.out.len());
                    }
                }
                st.buffer.retain(|(p, _)| !lost.contains(p));
                st.seeks.retain(|s| !lost.contains(&s.partition));
                (st.version, floors)
            };
            self.shared.room.notify_waiters();
            let result = commit(consumer, &self.shared.topic, &floors, self.shared.timeout);
            if let Err(e) = &result {
                tracing::warn!(topic = %self.shared.topic, error = %e, "commit at revoke failed");
            }
            // The lost partitions' acks are never committed by this member again: their
            // waiters learn now whether they are durable. Before the turn is given back:
            // a later commit's success must not be told first (it would cover the versions
            // this one lost).
            self.shared.committed(version, result, true);
            self.shared.give_turn();
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        self.shared.arrived();
        if let Rebalance::Assign(tpl) = rebalance {
            let got: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
            match read_floors(consumer, &self.shared.topic, &got, self.shared.timeout) {
                Ok(floors) => {
                    let mut st = self.shared.lock();
                    for (p, floor) in floors {
                        let part = Part {
                            read_next: Some(floor.cursor()),
                            floor,
                            epoch: new_epoch(),
                            out: BTreeMap::new(),
                            held: BTreeMap::new(),
                            keys: KeyOrder::default(),
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

/// Asks for a seek of `p` to `offset`, dropping what the buffer holds of `p` from there.
///
/// Seeks of one partition not made yet become one, to the lowest offset. Made in turn,
/// the last would win: a batch of nacks (0, 1, 2) would re-read only 2, and 0 and 1
/// would never come again. From the lowest, every later record is read again, and
/// `verdict` skips those out, held or finished (a reset's higher target included).
pub(super) fn seek(st: &mut State, p: i32, offset: u64, record: Option<Record>) {
    st.buffer.retain(|(bp, r)| *bp != p || r.offset < offset);
    if let Some(sk) = st.seeks.iter_mut().find(|sk| sk.partition == p) {
        sk.offset = sk.offset.min(offset);
        sk.records.extend(record);
        return;
    }
    st.seeks.push(Seek {
        partition: p,
        offset,
        records: record.into_iter().collect(),
    });
}

/// A fresh epoch: deliveries of every earlier one are stale. Also a hand-out's ticket.
pub(super) fn new_epoch() -> u64 {
    EPOCHS.fetch_add(1, Ordering::Relaxed)
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
            drained: Condvar::new(),
            committed: watch::channel(Committed::default()).0,
            room: Notify::new(),
            turn_free: Condvar::new(),
            polled: Mutex::new(Vec::new()),
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

/// Commits each partition's cursor with its metadata, waiting at most `timeout`.
fn commit<C: ConsumerContext, K: rdkafka::consumer::Consumer<C>>(
    consumer: &K,
    topic: &str,
    floors: &[(i32, u64, String)],
    timeout: Duration,
) -> Result<()> {
    super::ack_commit::send(consumer, topic, floors, None).answer(timeout)
}

/// The list a commit of `floors` (partition, cursor, metadata) sends.
pub(super) fn commit_list(
    topic: &str,
    floors: &[(i32, u64, String)],
) -> Result<TopicPartitionList> {
    let mut tpl = TopicPartitionList::with_capacity(floors.len());
    for (p, cursor, metadata) in floors {
        debug_assert!(
            metadata.len() <= super::floor::METADATA_MAX_BYTES,
            "MAX_RECORDED bounds the metadata"
        );
        let mut e = tpl.add_partition(topic, *p);
        e.set_offset(Offset::Offset(to_i64(*cursor)))
            .map_err(|e| kafka_err("preparing a commit", e))?;
        e.set_metadata(metadata.as_str());
    }
    Ok(tpl)
}

/// The committed offset and metadata of each of `parts` (`Offset::Invalid`: none).
pub(super) fn committed<C: ConsumerContext, K: rdkafka::consumer::Consumer<C>>(
    consumer: &K,
    topic: &str,
    parts: &[i32],
    timeout: Duration,
) -> Result<Vec<(i32, Offset, String)>> {
    let mut tpl = TopicPartitionList::with_capacity(parts.len());
    for p in parts {
        tpl.add_partition(topic, *p);
    }
    let committed = consumer
        .committed_offsets(tpl, timeout)
        .map_err(|e| kafka_err("reading the group's committed offsets", e))?;
    Ok(committed
        .elements()
        .iter()
        .map(|e| (e.partition(), e.offset(), e.metadata().to_owned()))
        .collect())
}

/// The committed floors of `parts`; a partition never committed starts at its earliest.
pub(super) fn read_floors<C: ConsumerContext, K: rdkafka::consumer::Consumer<C>>(
    consumer: &K,
    topic: &str,
    parts: &[i32],
    timeout: Duration,
) -> Result<Vec<(i32, Floor)>> {
    let mut out = Vec::with_capacity(parts.len());
    for (p, offset, metadata) in committed(consumer, topic, parts, timeout)? {
        let floor = match offset {
            Offset::Offset(o) => Floor::from_commit(to_u64(o), &metadata),
            _ => {
                let (lo, _) = consumer
                    .fetch_watermarks(topic, p, timeout)
                    .map_err(|e| kafka_err("reading a partition's watermarks", e))?;
                Floor::from_commit(to_u64(lo), "")
            }
        };
        out.push((p, floor));
    }
    Ok(out)
}

/// The member of one group of one topic in this process.
pub(super) struct Group {
    pub kafka: Kafka,
    pub topic: String,
    pub name: String,
    pub consumer: Arc<BaseConsumer<GroupContext>>,
    pub shared: Arc<Shared>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
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
        let group = Arc::new(Group {
            kafka,
            topic: topic.to_owned(),
            name: group.to_owned(),
            consumer,
            shared,
            threads: Mutex::new(Vec::new()),
        });
        // If a thread cannot start, dropping `group` stops the other.
        group.start("spool-kafka-commit", run_committer)?;
        group.start("spool-kafka-poll", super::poller::run)?;
        Ok(group)
    }

    fn start(&self, name: &str, f: fn(&Shared, &BaseConsumer<GroupContext>, &str)) -> Result<()> {
        let (shared, consumer) = (self.shared.clone(), self.consumer.clone());
        let topic = self.topic.clone();
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || f(&shared, &consumer, &topic))
            .map_err(|e| Error::Io {
                context: format!("starting the thread {name}"),
                source: e,
            })?;
        self.threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(handle);
        Ok(())
    }

    /// Waits until everything changed so far is committed.
    pub async fn flush(&self) -> Result<()> {
        let v = self.shared.lock().version;
        self.shared.durable(v, None).await
    }

    /// Commits a last time and leaves the group (the poll thread closes the consumer,
    /// committing the floors at the revoke). Later acks fail with `Closed`. Blocking;
    /// idempotent.
    pub fn stop(&self) {
        {
            let mut st = self.shared.lock();
            st.closing = true;
            self.shared.dirty.notify_one();
            self.shared.drained.notify_one();
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for h in threads {
            let _ = h.join();
        }
        // The committer waits for every commit sent before it ends; a commit sent after
        // (none is: `commit_soon` checks `closing`) goes while the consumer still lives.
        drop(self.shared.lock().pending.take());
        self.shared.committed.send_modify(|c| c.closed = true);
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.stop();
        if !self.consumer.closed() {
            self.close_elsewhere();
        }
    }
}

impl Group {
    /// rdkafka's drop of a consumer that has not closed waits for it without end.
    /// librdkafka closes it once its parked commits time out, `session.timeout.ms` after
    /// the close began (a cluster gone), or never while no coordinator answers. That wait
    /// goes to a thread of its own, so the caller's drop or close returns.
    fn close_elsewhere(&self) {
        tracing::warn!(topic = %self.topic, group = %self.name,
            "the group's consumer did not close in time; it closes in the background");
        let c = self.consumer.clone();
        let spawned = std::thread::Builder::new()
            .name("spool-kafka-close".into())
            .spawn(move || {
                // The last reference drops here: wait for the Group's own to go.
                while Arc::strong_count(&c) > 1 {
                    std::thread::sleep(Duration::from_millis(10));
                }
                drop(c);
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "no thread to close the group's consumer on");
        }
    }
}

/// Commits whenever the state changed, and answers for the commits `ack_all`s sent that
/// their tasks left to it (`ack_commit.rs`). A failed commit (a rebalance in progress, a
/// broker away) is retried every `RETRY` while its acks wait; they fail once commits have
/// failed for `Kafka Timeout Ms`. Ends, after a last commit, once the member closes.
fn run_committer(shared: &Shared, consumer: &BaseConsumer<GroupContext>, topic: &str) {
    loop {
        let mut st = wait_for_work(shared);
        let (version, result) = if let Some(p) = st.pending.take() {
            drop(st);
            (p.version, p.issued.answer(shared.timeout))
        } else if st.version == st.taken {
            debug_assert!(st.closing && !st.turn, "nothing left to commit or wait for");
            return;
        } else {
            let (version, floors) = shared.snapshot(&mut st);
            drop(st);
            (version, commit(consumer, topic, &floors, shared.timeout))
        };
        // Each outcome is told before the turn passes: a later commit's success must not
        // be told first (a revoke's failure would then lose versions it covers).
        let Err(e) = result else {
            shared.lock().failing_since = None;
            shared.committed(version, Ok(()), false);
            shared.give_turn();
            continue;
        };
        tracing::warn!(%topic, error = %e, "offset commit failed; retrying");
        let mut st = shared.lock();
        let since = *st.failing_since.get_or_insert_with(Instant::now);
        if st.closing || since.elapsed() >= shared.timeout {
            st.failing_since = None;
            shared.committed(version, Err(e), false);
        }
        st.turn = false;
        shared.turn_free.notify_all();
        if st.closing {
            return;
        }
        st.taken = st.taken.min(version.saturating_sub(1));
        drop(shared.dirty.wait_timeout(st, RETRY));
    }
}

/// A failed commit is retried after this.
const RETRY: Duration = Duration::from_millis(100);

/// Waits until the committer has something to do: a commit an `ack_all`'s task left to
/// it (or has watched for longer than `Kafka Timeout Ms`), else a change to commit, or
/// the end.
fn wait_for_work(shared: &Shared) -> MutexGuard<'_, State> {
    let mut st = shared.lock();
    loop {
        if let Some(p) = &st.pending {
            let left =
                (p.sent_at + shared.timeout + RETRY).saturating_duration_since(Instant::now());
            // Someone else waits (a later ack, the revoke, the close): the committer
            // answers at once, whether or not the watching task is polled.
            if !p.watched || left.is_zero() || st.others_wait() {
                return st;
            }
            st = shared
                .dirty
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        } else if !st.turn && st.turn_wanted == 0 && (st.version != st.taken || st.closing) {
            return st;
        } else {
            st = shared.dirty.wait(st).unwrap_or_else(|e| e.into_inner());
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
