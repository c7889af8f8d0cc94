//! The consumer and delivery handles of `Mode=Kafka`, over a group's member (`group.rs`).
//!
//! - `recv` hands out, in this order: a held record that is due (nacked with a delay, or
//!   released), then the next record of the poll thread's buffer that `verdict` lets
//!   through.
//! - `ack` finishes the record in its floor and waits for the commit that covers it.
//! - `nack` records the attempt durably (in the commit's metadata) and holds the record
//!   in memory: it is the group's next delivery from this process, or, with a delay, is
//!   handed out when due. The floor never passes it (Brighter's ADR 0055).
//! - At `Max Delivery Attempts` the copy goes to `<topic><suffix>` once: the intent is
//!   committed first, the copy produced, then the record finished. A crash between copy
//!   and commit is found at the next read of the record (`resolve_intent`), which looks
//!   for the copy before it makes one.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use rdkafka::message::{BorrowedMessage, Headers as _, Message as _};

use super::deadline::Deadline;
use super::floor::MAX_RECORDED;
use super::group::{Group, Part};
use super::{Kafka, to_u64};
use crate::error::{Error, Result};
use crate::format::Headers;
use crate::format::record::{Record, system_time_ms};
use crate::options::MAX_MS;
use crate::queue::{ACK_DEADLINE_REASON, MESSAGE_KEY_HEADER, NackOutcome};

mod by_offset;
mod dead_letter;
mod expiry;
mod nack_all;

/// A consumer's settings, as the public builder set them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    pub manual_ack: bool,
    pub max_in_flight: usize,
    /// Each delivery's ack deadline (`deadline.rs`), if any.
    pub ack_deadline: Option<Duration>,
    /// `key_ordered()`: the member orders by key while it is open (`key_order.rs`).
    pub key_ordered: bool,
}

/// A consumer of one group under `Mode=Kafka`.
#[derive(Debug)]
pub(crate) struct KafkaConsumer {
    group: Arc<Group>,
    settings: Settings,
    /// Auto-ack: the delivery handed out last, acked at the next `recv` or `close`.
    last: Vec<KafkaDelivery>,
}

/// One record handed out under `Mode=Kafka`.
#[derive(Debug)]
pub(crate) struct KafkaDelivery {
    group: Arc<Group>,
    partition: i32,
    epoch: u64,
    /// This hand-out's ticket in its partition's `out`.
    ticket: u64,
    record: Record,
    attempt: u32,
    settled: bool,
    /// Auto-ack: the consumer holds a shadow that acks the record at its next `recv`, so
    /// dropping this one releases nothing.
    auto: bool,
    /// Its ack deadline, shared with the member's `deadlines` (`None`: no deadline).
    deadline: Option<Deadline>,
}

/// The record of a consumed message; headers without a value read as empty strings.
/// A Kafka key without a `message-key` header (another client produced it) becomes that
/// header, as spool's own publish maps it: `key_ordered()` orders by it, and a
/// dead-letter copy keeps it. A key that is not UTF-8 is read lossily.
pub(crate) fn record_of(m: &BorrowedMessage<'_>) -> Record {
    let mut headers = Headers::new();
    if let Some(hs) = m.headers() {
        for h in hs.iter() {
            let v = h.value.map(String::from_utf8_lossy).unwrap_or_default();
            headers.insert(h.key.to_owned(), v.into_owned());
        }
    }
    if let Some(key) = m.key()
        && !headers.contains_key(MESSAGE_KEY_HEADER)
    {
        let key = String::from_utf8_lossy(key).into_owned();
        headers.insert(MESSAGE_KEY_HEADER.to_owned(), key);
    }
    Record {
        offset: to_u64(m.offset()),
        timestamp_ms: m.timestamp().to_millis().map_or(0, to_u64),
        headers,
        payload: Bytes::copy_from_slice(m.payload().unwrap_or_default()),
    }
}

fn now_ms() -> u64 {
    system_time_ms(SystemTime::now())
}

impl KafkaConsumer {
    /// Joins (or shares) the group's member.
    pub(crate) fn build(k: &Kafka, topic: &str, group: &str, s: Settings) -> Result<KafkaConsumer> {
        crate::names::check(topic)?;
        crate::names::check(group)?;
        k.check_open()?;
        if s.max_in_flight > MAX_RECORDED {
            return Err(Error::Unsupported {
                what: format!(
                    "max_in_flight({}) under Mode=Kafka: at most {MAX_RECORDED}, so that a \
                     partition's floor fits the offset commit's metadata",
                    s.max_in_flight
                ),
            });
        }
        let g = k.group(topic, group)?;
        {
            let mut st = g.shared.lock();
            st.max_in_flight = s.max_in_flight.max(1);
            st.key_ordered += usize::from(s.key_ordered);
        }
        Ok(KafkaConsumer {
            group: g,
            settings: s,
            last: Vec::new(),
        })
    }

    pub(crate) fn topic(&self) -> &str {
        &self.group.topic
    }

    pub(crate) fn group(&self) -> &str {
        &self.group.name
    }

    /// Auto-ack: finishes the deliveries handed out before (durable with the next commit).
    fn ack_last(&mut self) {
        for d in self.last.drain(..) {
            drop(d.ack());
        }
    }

    fn handed_out(&mut self, mut d: KafkaDelivery) -> KafkaDelivery {
        if let Some(after) = self.settings.ack_deadline {
            let deadline = Deadline::start(after);
            let mut st = self.group.shared.lock();
            st.deadlines
                .insert(d.partition, d.ticket, &deadline, d.record.clone());
            d.deadline = Some(deadline);
        }
        if !self.settings.manual_ack {
            self.last.push(d.shadow());
            d.auto = true;
        }
        d
    }

    /// Waits for the next delivery.
    pub(crate) async fn recv(&mut self) -> Result<KafkaDelivery> {
        self.ack_last();
        let d = self.next().await?;
        Ok(self.handed_out(d))
    }

    async fn next(&self) -> Result<KafkaDelivery> {
        loop {
            self.group.kafka.check_open()?;
            let room = self.group.shared.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            if let Some(d) = self.take_expired() {
                // As a nack would: counted, backed off, redelivered or dead-lettered. A
                // failure leaves the record to come again (the nack puts it back first).
                if let Err(e) = d.nack(ACK_DEADLINE_REASON, None).await {
                    tracing::warn!(topic = %self.group.topic, group = %self.group.name, error = %e,
                        "taking back a delivery whose ack deadline passed failed");
                }
                continue;
            }
            match self.step() {
                Step::Deliver(d) => return Ok(d),
                Step::Intent(p, rec, epoch) => {
                    let back = PutBack::new(&self.group, p, rec).marked(epoch);
                    dead_letter::resolve_intent(back).await?;
                }
                Step::Wait(due) => {
                    let wait = due.map_or(Duration::from_secs(3600), |at| {
                        Duration::from_millis(at.saturating_sub(now_ms()))
                    });
                    let wait = self.until_next_deadline().map_or(wait, |d| d.min(wait));
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = &mut room => {}
                    }
                }
            }
        }
    }

    /// One look at the member's state: a held record that is due, else the buffer's
    /// next record that `verdict` lets through.
    fn step(&self) -> Step {
        step_in(&self.group, &mut self.group.shared.lock())
    }

    /// The next delivery if one is ready now.
    pub(crate) fn try_recv(&mut self) -> Result<Option<KafkaDelivery>> {
        self.ack_last();
        self.group.kafka.check_open()?;
        self.take_back_expired_now();
        Ok(self.try_step().map(|d| self.handed_out(d)))
    }

    /// `step` without waiting; a record with a dead-letter intent goes back for `recv`.
    fn try_step(&self) -> Option<KafkaDelivery> {
        match self.step() {
            Step::Deliver(d) => Some(d),
            Step::Intent(p, rec, epoch) => {
                let mut st = self.group.shared.lock();
                st.dead_lettering.remove(&(p, rec.offset, epoch));
                st.buffer.push_front((p, rec));
                None
            }
            Step::Wait(_) => None,
        }
    }

    /// At least one delivery, then what is ready now, up to `max`.
    pub(crate) async fn recv_batch(&mut self, max: usize) -> Result<Vec<KafkaDelivery>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        self.ack_last();
        let first = self.next().await?;
        let mut ds = Vec::with_capacity(max.min(MAX_RECORDED));
        ds.push(first);
        // The rest under one lock, not one per record: the poll thread takes it per poll.
        let mut st = self.group.shared.lock();
        while ds.len() < max {
            match step_in(&self.group, &mut st) {
                Step::Deliver(d) => ds.push(d),
                // Its dead-letter intent is resolved by the next `recv`.
                Step::Intent(p, rec, epoch) => {
                    st.dead_lettering.remove(&(p, rec.offset, epoch));
                    st.buffer.push_front((p, rec));
                    break;
                }
                Step::Wait(_) => break,
            }
        }
        drop(st);
        Ok(ds.into_iter().map(|d| self.handed_out(d)).collect())
    }

    /// Acks the last delivery (auto-ack) and waits for its commit.
    pub(crate) async fn close(mut self) -> Result<()> {
        self.ack_last();
        let g = self.group.clone();
        drop(self);
        g.flush().await
    }
}

/// What `step` found.
enum Step {
    Deliver(KafkaDelivery),
    /// A record whose dead-letter intent must be resolved first.
    /// Marked in `State::dead_lettering` with the partition's epoch, so that no re-read
    /// hands it out or resolves it again meanwhile: `recv` resolves it, the others put
    /// it back unmarked.
    Intent(i32, Record, u64),
    /// Nothing to hand out; the earliest held record is due then (ms since the epoch).
    Wait(Option<u64>),
}

/// `KafkaConsumer::step` under a lock the caller holds (`recv_batch` takes a batch under
/// one).
fn step_in(g: &Arc<Group>, st: &mut super::group::State) -> Step {
    loop {
        if st.in_flight < st.max_in_flight
            && let Some(d) = take_held(g, st)
        {
            return Step::Deliver(d);
        }
        // A held record keeps its slot while it waits, as in embedded mode: with
        // max_in_flight(1), later records wait behind a delayed nack.
        let held: usize = st.parts.values().map(|p| p.held.len()).sum();
        if st.in_flight + held >= st.max_in_flight {
            return Step::Wait(next_due(st));
        }
        let Some((p, rec)) = st.buffer.pop_front() else {
            return Step::Wait(next_due(st));
        };
        g.shared.took(st);
        match verdict(st, p, &rec) {
            Verdict::Skip => {}
            Verdict::Hold => {
                if let Some(part) = st.parts.get_mut(&p) {
                    part.note_key(&rec);
                    part.held.insert(rec.offset, rec);
                }
            }
            Verdict::KeyWait => {
                // Held only while a slot stays free: the record its key waits for may be
                // read again after a seek back (a cancelled or failed dead-letter), and it
                // needs a slot to go. Else this one waits at the buffer's front.
                if st.in_flight + held + 1 >= st.max_in_flight {
                    st.buffer.push_front((p, rec));
                    return Step::Wait(next_due(st));
                }
                if let Some(part) = st.parts.get_mut(&p) {
                    part.note_key(&rec);
                    part.held.insert(rec.offset, rec);
                }
            }
            Verdict::HandOut => return Step::Deliver(hand_out(g, st, p, rec)),
            Verdict::Intent => {
                // Unfinished until resolved: later records of its key wait behind it.
                if let Some(part) = st.parts.get_mut(&p) {
                    part.note_key(&rec);
                }
                let epoch = st.parts.get(&p).map_or(0, |part| part.epoch);
                st.dead_lettering.insert((p, rec.offset, epoch));
                return Step::Intent(p, rec, epoch);
            }
        }
    }
}

/// What `step` does with a record read.
enum Verdict {
    /// Finished, out, held, or of a partition no longer assigned.
    Skip,
    /// Failed and not due yet.
    Hold,
    /// Its key has an earlier record unfinished: its turn comes when that one is
    /// finished (`take_held`).
    KeyWait,
    /// Its dead-letter intent must be resolved.
    Intent,
    HandOut,
}

fn verdict(st: &super::group::State, p: i32, rec: &Record) -> Verdict {
    let o = rec.offset;
    let Some(part) = st.parts.get(&p) else {
        return Verdict::Skip;
    };
    if part.floor.is_done(o)
        || part.out.contains_key(&o)
        || part.held.contains_key(&o)
        || st.dead_lettering.contains(&(p, o, part.epoch))
    {
        return Verdict::Skip;
    }
    if part.floor.intents().any(|i| i == o) {
        return Verdict::Intent;
    }
    if part
        .floor
        .failed(o)
        .is_some_and(|f| f.not_before_ms > now_ms())
    {
        return Verdict::Hold;
    }
    if st.key_ordered > 0 && part.waits_for_key(rec) {
        return Verdict::KeyWait;
    }
    Verdict::HandOut
}

impl Drop for KafkaConsumer {
    /// Auto-ack: a dropped consumer acks its last delivery, as a closed one does.
    fn drop(&mut self) {
        self.ack_last();
        if self.settings.key_ordered {
            let mut st = self.group.shared.lock();
            debug_assert!(st.key_ordered > 0, "counted at build");
            st.key_ordered = st.key_ordered.saturating_sub(1);
            drop(st);
            // Records waiting only for their key's turn may go now.
            self.group.shared.room.notify_waiters();
        }
    }
}

/// Marks `rec` out and makes its delivery.
fn hand_out(g: &Arc<Group>, st: &mut super::group::State, p: i32, rec: Record) -> KafkaDelivery {
    let part: &mut Part = st.parts.get_mut(&p).expect("caller checked the partition");
    part.note_key(&rec);
    let ticket = super::group::new_epoch();
    part.out.insert(rec.offset, ticket);
    let failed = part.floor.failed(rec.offset);
    let epoch = part.epoch;
    st.in_flight += 1;
    st.counts.delivered += 1;
    if failed.is_some() {
        st.counts.redelivered += 1;
    }
    KafkaDelivery {
        group: g.clone(),
        partition: p,
        epoch,
        ticket,
        record: rec,
        attempt: failed.map_or(1, |f| f.attempts.saturating_add(1)),
        settled: false,
        auto: false,
        deadline: None,
    }
}

/// The first held record that is due (and its key's turn, when ordered by key), lowest
/// partition and offset first.
fn take_held(g: &Arc<Group>, st: &mut super::group::State) -> Option<KafkaDelivery> {
    if st.parts.values().all(|part| part.held.is_empty()) {
        return None;
    }
    let now = now_ms();
    let by_key = st.key_ordered > 0;
    let (p, o) = st.parts.iter().find_map(|(p, part)| {
        part.held
            .keys()
            .find(|o| {
                part.floor
                    .failed(**o)
                    .is_none_or(|f| f.not_before_ms <= now)
                    && (!by_key || part.key_turn(**o))
            })
            .map(|o| (*p, *o))
    })?;
    let rec = st.parts.get_mut(&p)?.held.remove(&o)?;
    Some(hand_out(g, st, p, rec))
}

/// When the earliest held record becomes due (ms since the epoch). One waiting for its
/// key's turn is not counted: the ack or nack that gives it the turn wakes `recv`.
fn next_due(st: &super::group::State) -> Option<u64> {
    let by_key = st.key_ordered > 0;
    st.parts
        .values()
        .flat_map(|part| {
            part.held
                .keys()
                .filter(move |o| !by_key || part.key_turn(**o))
                .map(|o| part.floor.failed(*o).map_or(0, |f| f.not_before_ms))
        })
        .min()
}

impl KafkaDelivery {
    /// A copy for auto-ack bookkeeping: the consumer acks through it, the application's
    /// copy then finds the record settled.
    fn shadow(&self) -> KafkaDelivery {
        KafkaDelivery {
            group: self.group.clone(),
            partition: self.partition,
            epoch: self.epoch,
            ticket: self.ticket,
            record: self.record.clone(),
            attempt: self.attempt,
            settled: false,
            auto: false,
            deadline: self.deadline.clone(),
        }
    }

    pub(crate) fn topic(&self) -> &str {
        &self.group.topic
    }
    pub(crate) fn group(&self) -> &str {
        &self.group.name
    }
    pub(crate) fn offset(&self) -> u64 {
        self.record.offset
    }
    pub(crate) fn payload(&self) -> &Bytes {
        &self.record.payload
    }
    pub(crate) fn headers(&self) -> &Headers {
        &self.record.headers
    }
    pub(crate) fn timestamp(&self) -> SystemTime {
        self.record.timestamp()
    }
    pub(crate) fn attempt(&self) -> u32 {
        self.attempt
    }
    pub(crate) fn partition(&self) -> u32 {
        u32::try_from(self.partition).unwrap_or(0)
    }

    /// Takes the record back from `out` if this delivery is still current.
    fn settle(&mut self, st: &mut super::group::State) -> Result<()> {
        self.settled = true;
        let o = self.record.offset;
        if let Some(deadline) = &self.deadline {
            if deadline.passed(Instant::now()) {
                return Err(self.expired());
            }
            st.deadlines.remove(self.partition, o, self.ticket);
        }
        let current = st
            .parts
            .get_mut(&self.partition)
            .filter(|part| part.epoch == self.epoch && part.out.get(&o) == Some(&self.ticket))
            .is_some_and(|part| part.out.remove(&o).is_some());
        if !current {
            return Err(Error::StaleDelivery { offset: o });
        }
        debug_assert!(st.in_flight > 0, "a delivery out counts in in_flight");
        st.in_flight = st.in_flight.saturating_sub(1);
        Ok(())
    }

    /// Finishes the record; the future waits for the commit that covers it.
    pub(crate) fn ack(mut self) -> impl std::future::Future<Output = Result<()>> + Send + 'static {
        let shared = self.group.shared.clone();
        let version = {
            let mut st = shared.lock();
            self.settle(&mut st).map(|()| {
                let part = st
                    .parts
                    .get_mut(&self.partition)
                    .expect("settled: assigned");
                part.finish(self.record.offset);
                st.counts.acked += 1;
                shared.bump(&mut st)
            })
        };
        if version.is_ok() {
            shared.wake_committer();
        }
        shared.room.notify_waiters();
        let offset = Some(self.record.offset);
        async move { shared.durable(version?, offset).await }
    }

    /// Acks every delivery of `ds` at once: under one lock and with one version per group,
    /// so that one commit carries them all (acked one by one, the committer woke at the
    /// first and committed the batch in two). The future waits for that commit; it returns
    /// the first error in the order given (a stale delivery changes nothing, the others
    /// are acked all the same).
    pub(crate) fn ack_all(
        ds: Vec<KafkaDelivery>,
    ) -> impl std::future::Future<Output = Result<()>> + Send + 'static {
        let mut errors: Vec<(usize, Error)> = Vec::new();
        let mut waits = Vec::new();
        // Settled in place, group by group (most often one): no delivery is moved.
        let mut ds = ds;
        let mut seen = vec![false; ds.len()];
        for start in 0..ds.len() {
            if seen[start] {
                continue;
            }
            let shared = ds[start].group.shared.clone();
            let mut st = shared.lock();
            let mut first_ok = None;
            for (i, d) in ds.iter_mut().enumerate().skip(start) {
                if seen[i] || !Arc::ptr_eq(&d.group.shared, &shared) {
                    continue;
                }
                seen[i] = true;
                match d.settle(&mut st) {
                    Ok(()) => {
                        let part = st.parts.get_mut(&d.partition).expect("settled: assigned");
                        part.finish(d.record.offset);
                        st.counts.acked += 1;
                        first_ok.get_or_insert((i, d.record.offset));
                    }
                    Err(e) => errors.push((i, e)),
                }
            }
            let version = first_ok.map(|_| shared.bump(&mut st));
            drop(st);
            if let (Some((i, offset)), Some(version)) = (first_ok, version) {
                let sent = shared.commit_soon(&ds[start].group.consumer);
                waits.push((i, shared.clone(), version, offset, sent));
            }
            shared.room.notify_waiters();
        }
        // Dropped after the locks: a last reference to a group stops it.
        drop(ds);
        async move {
            for (i, shared, version, offset, sent) in waits {
                if let Some(watch) = sent {
                    watch.answer().await;
                }
                if let Err(e) = shared.durable(version, Some(offset)).await {
                    errors.push((i, e));
                }
            }
            errors.sort_by_key(|(i, _)| *i);
            errors.into_iter().next().map_or(Ok(()), |(_, e)| Err(e))
        }
    }

    /// Records a failed attempt, puts the record back at once (so a failed or dropped
    /// commit cannot lose it), then waits for the attempt's commit; or dead-letters.
    pub(crate) async fn nack(
        mut self,
        reason: &str,
        delay: Option<Duration>,
    ) -> Result<NackOutcome> {
        let n = self.fail(delay)?;
        let version = match n.then {
            Then::DeadLetter(dlq, back) => {
                return dead_letter::dead_letter(back, self.epoch, n.attempts, reason, &dlq).await;
            }
            Then::Wait(version) => version,
        };
        self.group.shared.durable(version, Some(n.offset)).await?;
        Ok(n.redelivered())
    }

    /// The nack's work under the lock: the attempt in the floor, and the record back in
    /// place (held, due at once or after its delay) or handed to the dead-letter protocol.
    fn fail(&mut self, delay: Option<Duration>) -> Result<Nacked> {
        let g = self.group.clone();
        let (o, p) = (self.record.offset, self.partition);
        let opts = g.kafka.options();
        let mut st = g.shared.lock();
        self.settle(&mut st)?;
        let part = st.parts.get_mut(&p).expect("settled: assigned");
        let attempts = part.floor.failed(o).map_or(0, |f| f.attempts) + 1;
        // A zero delay is a plain nack: the backoff applies.
        let delay = delay
            .filter(|d| !d.is_zero())
            .unwrap_or_else(|| opts.nack_backoff.delay(attempts));
        part.floor.fail(o, not_before_ms(delay));
        let next_offset = part.floor.cursor();
        st.counts.nacked += 1;
        let record = std::mem::replace(&mut self.record, empty_record(o));
        let then = match dead_letter::topic_for(opts, &g.topic) {
            Some(dlq) if attempts >= opts.max_delivery_attempts => {
                // Taken until the dead-letter ends: a re-read meanwhile skips it.
                st.dead_lettering.insert((p, o, self.epoch));
                Then::DeadLetter(dlq, PutBack::new(&g, p, record).marked(self.epoch))
            }
            _ => {
                // Held in memory, due at once without a delay: the group's next delivery.
                // Not a seek back: the records read again after a seek could arrive
                // behind ones read before it, and a record waiting for its key's turn
                // at the buffer's front then hid the nacked one for good (the
                // concurrent key-order rule hung 1 run in 6 under load).
                if let Some(part) = st.parts.get_mut(&p) {
                    part.held.insert(o, record);
                }
                Then::Wait(g.shared.changed(&mut st))
            }
        };
        drop(st);
        g.shared.room.notify_waiters();
        Ok(Nacked {
            offset: o,
            attempts,
            delay,
            next_offset,
            then,
        })
    }
}

impl Nacked {
    /// The outcome of a nack that put the record back (not dead-lettered).
    fn redelivered(&self) -> NackOutcome {
        NackOutcome {
            delivery_attempt: self.attempts,
            dead_lettered: false,
            next_offset: self.next_offset,
            redeliver_at: (!self.delay.is_zero())
                .then(|| SystemTime::now().checked_add(self.delay))
                .flatten(),
        }
    }
}

/// What a nack decided under the lock.
struct Nacked {
    offset: u64,
    attempts: u32,
    delay: Duration,
    next_offset: u64,
    then: Then,
}

enum Then {
    /// At the attempt limit: the dead-letter protocol takes the record.
    DeadLetter(String, PutBack),
    /// Back in place: the attempt is durable once this version is committed.
    Wait(u64),
}

/// When a record nacked now with `delay` may be delivered again (0: at once), capped at
/// `MAX_MS` ahead so no arithmetic overflows.
fn not_before_ms(delay: Duration) -> u64 {
    if delay.is_zero() {
        return 0;
    }
    let ms = u64::try_from(delay.as_millis())
        .unwrap_or(u64::MAX)
        .min(MAX_MS);
    now_ms().saturating_add(ms.max(1))
}

/// A record taken from its place while an await runs (a dead-letter copy, an intent's
/// resolution). Dropped without `done` (an error, a cancelled future), it seeks its
/// partition back to the record, so its next read takes the work up again.
pub(super) struct PutBack {
    pub group: Arc<Group>,
    pub partition: i32,
    record: Option<Record>,
    /// Its entry in `State::dead_lettering` (offset, epoch), removed when this ends.
    marked: Option<(u64, u64)>,
}

impl PutBack {
    pub fn new(group: &Arc<Group>, partition: i32, record: Record) -> PutBack {
        PutBack {
            group: group.clone(),
            partition,
            record: Some(record),
            marked: None,
        }
    }

    /// The caller put the record in `State::dead_lettering` with `epoch`.
    fn marked(mut self, epoch: u64) -> PutBack {
        self.marked = self.record.as_ref().map(|r| (r.offset, epoch));
        self
    }

    pub fn record(&self) -> &Record {
        self.record.as_ref().expect("present until done or dropped")
    }

    /// The work is finished: nothing to put back.
    pub fn done(mut self) {
        self.record = None;
    }
}

impl Drop for PutBack {
    fn drop(&mut self) {
        let rec = self.record.take();
        if rec.is_none() && self.marked.is_none() {
            return;
        }
        let mut st = self.group.shared.lock();
        if let Some((o, epoch)) = self.marked {
            st.dead_lettering.remove(&(self.partition, o, epoch));
        }
        if let Some(rec) = rec
            && st.parts.contains_key(&self.partition)
        {
            let o = rec.offset;
            super::group::seek(&mut st, self.partition, o, Some(rec));
        }
    }
}

fn empty_record(offset: u64) -> Record {
    Record {
        offset,
        timestamp_ms: 0,
        headers: Headers::new(),
        payload: Bytes::new(),
    }
}

impl Drop for KafkaDelivery {
    /// A delivery dropped without ack or nack is released: handed out again, no attempt
    /// counted.
    fn drop(&mut self) {
        if self.settled || self.auto {
            return;
        }
        let group = self.group.clone();
        let mut st = group.shared.lock();
        if self.settle(&mut st).is_ok()
            && let Some(part) = st.parts.get_mut(&self.partition)
        {
            let o = self.record.offset;
            part.held
                .insert(o, std::mem::replace(&mut self.record, empty_record(o)));
        }
        drop(st);
        group.shared.room.notify_waiters();
    }
}
