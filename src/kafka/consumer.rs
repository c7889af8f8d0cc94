//! The consumer and delivery handles of `Mode=Kafka`, over a group's member (`group.rs`).
//!
//! - `recv` hands out, in this order: a held record that is due (nacked with a delay, or
//!   released), then the next record of the poll thread's buffer that `verdict` lets
//!   through.
//! - `ack` finishes the record in its floor and waits for the commit that covers it.
//! - `nack` records the attempt durably (in the commit's metadata), then has the poll
//!   thread seek the partition back to the record (Brighter's ADR 0055), so it is the
//!   group's next delivery from this process; with a delay it is held instead, and
//!   handed out when due.
//! - At `Max Delivery Attempts` the copy goes to `<topic><suffix>` once: the intent is
//!   committed first, the copy produced, then the record finished. A crash between copy
//!   and commit is found at the next read of the record (`resolve_intent`), which looks
//!   for the copy before it makes one.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use rdkafka::message::{BorrowedMessage, Headers as _, Message as _};

use super::group::{Group, Part};
use super::{Kafka, to_u64};
use crate::error::{Error, Result};
use crate::format::Headers;
use crate::format::record::{Record, system_time_ms};
use crate::queue::NackOutcome;

mod dead_letter;

/// A consumer's settings, as the public builder set them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    pub manual_ack: bool,
    pub max_in_flight: usize,
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
    record: Record,
    attempt: u32,
    settled: bool,
    /// Auto-ack: the consumer holds a shadow that acks the record at its next `recv`, so
    /// dropping this one releases nothing.
    auto: bool,
}

/// The record of a consumed message; headers without a value read as empty strings.
pub(crate) fn record_of(m: &BorrowedMessage<'_>) -> Record {
    let mut headers = Headers::new();
    if let Some(hs) = m.headers() {
        for h in hs.iter() {
            let v = h.value.map(String::from_utf8_lossy).unwrap_or_default();
            headers.insert(h.key.to_owned(), v.into_owned());
        }
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
        let g = k.group(topic, group)?;
        g.shared.lock().max_in_flight = s.max_in_flight.max(1);
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
            match self.step() {
                Step::Deliver(d) => return Ok(d),
                Step::Intent(p, rec) => dead_letter::resolve_intent(&self.group, p, rec).await?,
                Step::Wait(due) => {
                    let wait = due.map_or(Duration::from_secs(3600), |at| {
                        Duration::from_millis(at.saturating_sub(now_ms()))
                    });
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
        let g = &self.group;
        let mut st = g.shared.lock();
        loop {
            if st.in_flight < st.max_in_flight
                && let Some(d) = take_held(g, &mut st)
            {
                return Step::Deliver(d);
            }
            // A held record keeps its slot while it waits, as in embedded mode: with
            // max_in_flight(1), later records wait behind a delayed nack.
            let held: usize = st.parts.values().map(|p| p.held.len()).sum();
            if st.in_flight + held >= st.max_in_flight {
                return Step::Wait(next_due(&st));
            }
            let Some((p, rec)) = st.buffer.pop_front() else {
                return Step::Wait(next_due(&st));
            };
            match verdict(&st, p, &rec) {
                Verdict::Skip => {}
                Verdict::Hold => {
                    if let Some(part) = st.parts.get_mut(&p) {
                        part.held.insert(rec.offset, rec);
                    }
                }
                Verdict::HandOut => return Step::Deliver(hand_out(g, &mut st, p, rec)),
                Verdict::Intent => return Step::Intent(p, rec),
            }
        }
    }

    /// The next delivery if one is ready now.
    pub(crate) fn try_recv(&mut self) -> Result<Option<KafkaDelivery>> {
        self.ack_last();
        self.group.kafka.check_open()?;
        Ok(self.try_step().map(|d| self.handed_out(d)))
    }

    /// `step` without waiting; a record with a dead-letter intent goes back for `recv`.
    fn try_step(&self) -> Option<KafkaDelivery> {
        match self.step() {
            Step::Deliver(d) => Some(d),
            Step::Intent(p, rec) => {
                self.group.shared.lock().buffer.push_front((p, rec));
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
        let mut out = vec![self.handed_out(first)];
        while out.len() < max {
            let Some(d) = self.try_step() else {
                break;
            };
            let d = self.handed_out(d);
            out.push(d);
        }
        Ok(out)
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
    Intent(i32, Record),
    /// Nothing to hand out; the earliest held record is due then (ms since the epoch).
    Wait(Option<u64>),
}

/// What `step` does with a record read.
enum Verdict {
    /// Finished, out, held, or of a partition no longer assigned.
    Skip,
    /// Failed and not due yet.
    Hold,
    /// Its dead-letter intent must be resolved.
    Intent,
    HandOut,
}

fn verdict(st: &super::group::State, p: i32, rec: &Record) -> Verdict {
    let o = rec.offset;
    let Some(part) = st.parts.get(&p) else {
        return Verdict::Skip;
    };
    if part.floor.is_done(o) || part.out.contains(&o) || part.held.contains_key(&o) {
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
    Verdict::HandOut
}

impl Drop for KafkaConsumer {
    /// Auto-ack: a dropped consumer acks its last delivery, as a closed one does.
    fn drop(&mut self) {
        self.ack_last();
    }
}

/// Marks `rec` out and makes its delivery.
fn hand_out(g: &Arc<Group>, st: &mut super::group::State, p: i32, rec: Record) -> KafkaDelivery {
    let part: &mut Part = st.parts.get_mut(&p).expect("caller checked the partition");
    part.out.insert(rec.offset);
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
        record: rec,
        attempt: failed.map_or(1, |f| f.attempts.saturating_add(1)),
        settled: false,
        auto: false,
    }
}

/// The first held record that is due, lowest partition and offset first.
fn take_held(g: &Arc<Group>, st: &mut super::group::State) -> Option<KafkaDelivery> {
    let now = now_ms();
    let (p, o) = st.parts.iter().find_map(|(p, part)| {
        part.held
            .keys()
            .find(|o| {
                part.floor
                    .failed(**o)
                    .is_none_or(|f| f.not_before_ms <= now)
            })
            .map(|o| (*p, *o))
    })?;
    let rec = st.parts.get_mut(&p)?.held.remove(&o)?;
    Some(hand_out(g, st, p, rec))
}

/// When the earliest held record becomes due (ms since the epoch).
fn next_due(st: &super::group::State) -> Option<u64> {
    st.parts
        .values()
        .flat_map(|part| {
            part.held
                .keys()
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
            record: self.record.clone(),
            attempt: self.attempt,
            settled: false,
            auto: false,
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
        let current = st
            .parts
            .get_mut(&self.partition)
            .filter(|part| part.epoch == self.epoch)
            .is_some_and(|part| part.out.remove(&o));
        if !current {
            return Err(Error::StaleDelivery { offset: o });
        }
        st.in_flight -= 1;
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
                part.floor.finish(self.record.offset);
                st.counts.acked += 1;
                shared.changed(&mut st)
            })
        };
        shared.room.notify_waiters();
        let offset = Some(self.record.offset);
        async move { shared.durable(version?, offset).await }
    }

    /// Records a failed attempt durably, then redelivers or dead-letters.
    pub(crate) async fn nack(
        mut self,
        reason: &str,
        delay: Option<Duration>,
    ) -> Result<NackOutcome> {
        let g = self.group.clone();
        let o = self.record.offset;
        let opts = g.kafka.options();
        let (attempts, delay, version) = {
            let mut st = g.shared.lock();
            self.settle(&mut st)?;
            let part = st
                .parts
                .get_mut(&self.partition)
                .expect("settled: assigned");
            let attempts = part.floor.failed(o).map_or(0, |f| f.attempts) + 1;
            let delay = delay.unwrap_or_else(|| opts.nack_backoff.delay(attempts));
            let not_before = if delay.is_zero() {
                0
            } else {
                now_ms() + delay.as_millis() as u64
            };
            part.floor.fail(o, not_before);
            st.counts.nacked += 1;
            (attempts, delay, g.shared.changed(&mut st))
        };
        g.shared.room.notify_waiters();
        if let Some(dlq) = dead_letter::topic_for(opts, &g.topic)
            && attempts >= opts.max_delivery_attempts
        {
            let record = std::mem::replace(&mut self.record, empty_record(o));
            return dead_letter::dead_letter(&g, self.partition, record, attempts, reason, &dlq)
                .await;
        }
        g.shared.durable(version, Some(o)).await?;
        let next_offset = self.redeliver(delay);
        let redeliver_at = (!delay.is_zero()).then(|| SystemTime::now() + delay);
        Ok(NackOutcome {
            delivery_attempt: attempts,
            dead_lettered: false,
            next_offset,
            redeliver_at,
        })
    }

    /// Puts the nacked record back: held in memory with a delay, else a seek back to it
    /// (held too if the seek fails). Returns the partition's cursor.
    fn redeliver(&mut self, delay: Duration) -> u64 {
        let g = self.group.clone();
        let o = self.record.offset;
        let mut st = g.shared.lock();
        let Some(part) = st
            .parts
            .get_mut(&self.partition)
            .filter(|p| p.epoch == self.epoch)
        else {
            return 0;
        };
        let cursor = part.floor.cursor();
        let rec = std::mem::replace(&mut self.record, empty_record(o));
        if delay.is_zero() {
            g.shared.seek_back(&mut st, self.partition, rec);
        } else {
            part.held.insert(o, rec);
        }
        drop(st);
        g.shared.room.notify_waiters();
        cursor
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
