//! Guards issue 3 points 2, 3, 4, 5 and 6 together: random sequences of publish / recv /
//! ack / nack / release / low-level ack+nack / reset (all four modes) / reopen on one group
//! (a manual-ack consumer, plus an auto-ack consumer sharing the group) are checked step by step against a small in-memory reference model of API.md's rules —
//! the cursor is the ack floor, the lowest unfinished offset not out is delivered next
//! (so a nacked message comes back first), attempts count per offset and survive reopen,
//! the limit dead-letters exactly once, a reset moves the cursor, clears the counters and
//! fences older deliveries. Issue 27 point 4 adds group deletion (the group starts over
//! at the earliest offset; its deliveries are fenced) and record deletion (the earliest
//! offset moves up; the group skips what it had not finished, counted in `skipped`).
//! Issue 27 point 1 adds nacks with a delay longer than any run ("parked"): a parked
//! offset is not delivered, also across reopens; with `max_in_flight(1)` nothing after
//! it is either, with more the group goes on; the cursor stays at it. Ack deadlines: a
//! third consumer of the group has a short one, and before each step the harness lets
//! every deadline of its deliveries pass (and has the group look, with `group_info`):
//! each such delivery is a failed attempt with the deadline's reason (dead-lettered at
//! the limit), and its late ack or nack fails with `DeliveryExpired`. Key order: in half
//! the runs the records carry one of two keys (or none) and the consumers are
//! `key_ordered()`: a record is delivered only once every earlier record of its key is
//! finished.

mod common_groups;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common_groups::{WAIT, all_records, open, payload_of, publish_n};
use proptest::prelude::*;
use spool::consts::{ACK_DEADLINE_REASON, MESSAGE_KEY_HEADER, X_ORIGINAL_OFFSET};
use spool::{Consumer, Delivery, Error, OffsetReset, Spool};

const TOPIC: &str = "model.events";
const DLQ: &str = "model.events.dlq";
const GROUP: &str = "g";

#[derive(Clone, Debug)]
enum ResetTo {
    Earliest,
    Latest,
    /// The timestamp of the record at this index (mod the log), plus `plus_ms`.
    TimeOfRecord(usize, u64),
    TimeBeforeAll,
    TimeAfterAll,
    Explicit(u64),
}

#[derive(Clone, Debug)]
enum Op {
    Publish(u64),
    Recv,
    /// Index into the held deliveries (mod their number).
    Ack(usize),
    Nack(usize),
    /// `nack_with_delay` of an hour: parked for the rest of the run.
    NackParked(usize),
    /// `recv_timeout` on the group's third consumer, whose ack deadline is short: the
    /// delivery expires before the next step.
    RecvDeadline,
    Release(usize),
    /// Low-level ack/nack of the cursor (`true`) or of the offset after it (`false`).
    LowAck(bool),
    LowNack(bool),
    Reset(ResetTo),
    Reopen,
    /// `recv_timeout` on the group's second consumer, an auto-ack one: acks its previous
    /// delivery (if still live), then takes the next one if any.
    AutoRecv,
    /// Closes the auto-ack consumer (acking its previous delivery) and builds a new one.
    AutoClose,
    /// Drops both consumers, deletes the group, builds both again.
    DeleteGroup,
    /// `delete_records_before` this offset.
    DeleteRecords(u64),
}

fn reset_strategy() -> impl Strategy<Value = ResetTo> {
    prop_oneof![
        Just(ResetTo::Earliest),
        Just(ResetTo::Latest),
        (any::<usize>(), 0u64..2).prop_map(|(i, p)| ResetTo::TimeOfRecord(i, p)),
        Just(ResetTo::TimeBeforeAll),
        Just(ResetTo::TimeAfterAll),
        (0u64..30).prop_map(ResetTo::Explicit),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u64..4).prop_map(Op::Publish),
        6 => Just(Op::Recv),
        4 => any::<usize>().prop_map(Op::Ack),
        4 => any::<usize>().prop_map(Op::Nack),
        1 => any::<usize>().prop_map(Op::NackParked),
        2 => Just(Op::RecvDeadline),
        2 => any::<usize>().prop_map(Op::Release),
        1 => any::<bool>().prop_map(Op::LowAck),
        1 => any::<bool>().prop_map(Op::LowNack),
        1 => reset_strategy().prop_map(Op::Reset),
        1 => Just(Op::Reopen),
        3 => Just(Op::AutoRecv),
        1 => Just(Op::AutoClose),
        1 => Just(Op::DeleteGroup),
        1 => (0u64..30).prop_map(Op::DeleteRecords),
    ]
}

/// The reference: the rules of API.md, written as plainly as possible.
#[derive(Debug, Default)]
struct Model {
    max_in_flight: usize,
    max_attempts: u32,
    /// Timestamps (ms) of the records, by offset; its length is the log end.
    ts: Vec<u64>,
    cursor: u64,
    /// Finished (acked or dead-lettered) offsets above the cursor.
    done: BTreeSet<u64>,
    /// Offsets out with a live delivery.
    out: BTreeSet<u64>,
    /// Failed attempts and last reason per offset.
    attempts: BTreeMap<u64, (u32, String)>,
    dead_lettered: u64,
    /// Offsets copied to the dead-letter topic, in order.
    dlq: Vec<u64>,
    /// The auto-ack consumer's previous delivery, while it is still live.
    auto_prev: Option<u64>,
    /// The first offset readers see (`delete_records_before`).
    earliest: u64,
    /// Records deleted before the group finished them.
    skipped: u64,
    /// Nacked with a delay longer than the run: not delivered again.
    parked: BTreeSet<u64>,
    /// Whether records carry keys and the consumers are key-ordered.
    keyed: bool,
}

/// The key the harness gives the record at `offset` in a keyed run (`None`: no header).
fn key_of(offset: u64) -> Option<&'static str> {
    [Some("a"), Some("b"), None, Some("a")][(offset % 4) as usize]
}

impl Model {
    fn log_end(&self) -> u64 {
        self.ts.len() as u64
    }

    /// The lowest offset that is neither finished nor out, if the group may hand one out.
    fn next(&self) -> Option<u64> {
        if self.out.len() >= self.max_in_flight {
            return None;
        }
        let strict = self.max_in_flight == 1;
        for o in self.cursor..self.log_end() {
            if self.done.contains(&o) || self.out.contains(&o) {
                continue;
            }
            if !self.parked.contains(&o) && self.key_is_free(o) {
                return Some(o);
            }
            if strict {
                // Strict order: nothing passes a waiting message.
                return None;
            }
        }
        None
    }

    /// In a keyed run: every earlier record of `o`'s key is finished.
    fn key_is_free(&self, o: u64) -> bool {
        let Some(k) = key_of(o).filter(|_| self.keyed) else {
            return true;
        };
        (self.cursor..o).all(|p| key_of(p) != Some(k) || self.done.contains(&p))
    }

    fn attempt(&self, o: u64) -> u32 {
        self.attempts.get(&o).map_or(0, |a| a.0) + 1
    }

    fn finish(&mut self, o: u64) {
        self.attempts.remove(&o);
        self.parked.remove(&o);
        self.done.insert(o);
        while self.done.remove(&self.cursor) {
            self.cursor += 1;
        }
    }

    /// Returns (delivery_attempt, dead_lettered, next_offset).
    fn nack(&mut self, o: u64, reason: &str) -> (u32, bool, u64) {
        let a = self.attempt(o);
        if self.max_attempts > 0 && a >= self.max_attempts {
            self.dlq.push(o);
            self.dead_lettered += 1;
            self.finish(o);
            (a, true, self.cursor)
        } else {
            self.attempts.insert(o, (a, reason.to_owned()));
            (a, false, self.cursor)
        }
    }

    /// The group after records below `earliest` were deleted: what it had not finished
    /// there is skipped, and what it had out there is no longer out.
    fn clamp(&mut self, earliest: u64) {
        if self.cursor >= earliest {
            return;
        }
        let done_below = self.done.range(..earliest).count() as u64;
        self.skipped += earliest - self.cursor - done_below;
        self.cursor = earliest;
        self.out.retain(|&o| o >= earliest);
        self.done.retain(|&o| o >= earliest);
        self.attempts.retain(|&o, _| o >= earliest);
        self.parked.retain(|&o| o >= earliest);
        if self.auto_prev.is_some_and(|o| o < earliest) {
            self.auto_prev = None;
        }
        while self.done.remove(&self.cursor) {
            self.cursor += 1;
        }
    }

    /// A deleted group made anew: it starts at the earliest offset with nothing recorded.
    fn start_over(&mut self) {
        self.reset(self.earliest);
        self.dead_lettered = 0;
        self.skipped = 0;
    }

    fn reset(&mut self, to: u64) {
        self.auto_prev = None;
        self.cursor = to.min(self.log_end());
        self.done.clear();
        self.out.clear();
        self.attempts.clear();
        self.parked.clear();
    }

    fn first_at_or_after(&self, t_ms: u64) -> u64 {
        self.ts
            .iter()
            .position(|&x| x >= t_ms)
            .map_or(self.log_end(), |p| p as u64)
    }
}

struct Held {
    d: Delivery,
    /// False once a reset or a low-level call finished or fenced it.
    live: bool,
    /// Its ack deadline passed: the group took it back.
    expired: bool,
}

/// The deadline of the third consumer's deliveries.
const DEADLINE: Duration = Duration::from_millis(5);

struct Harness {
    dir: tempfile::TempDir,
    conn: String,
    mq: Spool,
    c: Consumer,
    auto: Consumer,
    /// A manual-ack consumer with a short ack deadline.
    dl: Consumer,
    held: Vec<Held>,
    m: Model,
    reasons: u64,
}

/// A consumer of another group, to stand in while the harness's are dropped.
fn mq_placeholder(mq: &Spool) -> Consumer {
    mq.consumer(TOPIC, "placeholder").build().unwrap()
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// The group's consumers: manual, auto-ack, manual with a deadline (all key-ordered in a
/// keyed run: the group keeps its latest build's setting).
fn consumers(mq: &Spool, m: &Model) -> (Consumer, Consumer, Consumer) {
    let b = || {
        let b = mq.consumer(TOPIC, GROUP).max_in_flight(m.max_in_flight);
        if m.keyed { b.key_ordered() } else { b }
    };
    let c = b().manual_ack().build().unwrap();
    let auto = b().build().unwrap();
    let dl = b().manual_ack().ack_deadline(DEADLINE).build().unwrap();
    (c, auto, dl)
}

impl Harness {
    fn rebuild_consumers(&mut self) {
        (self.c, self.auto, self.dl) = consumers(&self.mq, &self.m);
    }

    /// Lets every deadline of a live delivery pass and has the group look (`group_info`):
    /// each is taken back as a failed attempt, in offset order.
    async fn let_deadlines_pass(&mut self) {
        let due: Vec<std::time::Instant> = self
            .held
            .iter()
            .filter(|h| h.live)
            .filter_map(|h| h.d.deadline())
            .collect();
        let Some(last) = due.into_iter().max() else {
            return;
        };
        tokio::time::sleep_until(last.into()).await;
        self.mq.group_info(TOPIC, GROUP).unwrap();
        let mut expired: Vec<u64> = Vec::new();
        for h in &mut self.held {
            if h.live && h.d.deadline().is_some() {
                h.live = false;
                h.expired = true;
                expired.push(h.d.offset());
            }
        }
        expired.sort_unstable();
        for o in expired {
            self.m.out.remove(&o);
            self.m.nack(o, ACK_DEADLINE_REASON);
        }
    }

    /// The error a late ack or nack of offset `o` must get.
    fn assert_refused(o: u64, expired: bool, r: &Result<impl std::fmt::Debug, Error>) {
        let ok = if expired {
            matches!(r, Err(Error::DeliveryExpired { offset, .. }) if *offset == o)
        } else {
            matches!(r, Err(Error::StaleDelivery { offset }) if *offset == o)
        };
        assert!(ok, "offset {o} (expired: {expired}): {r:?}");
    }

    /// Publishes `n` records (with their keys in a keyed run).
    async fn publish(&mut self, n: u64) {
        if !self.m.keyed {
            publish_n(&self.mq, TOPIC, n).await;
            return;
        }
        for _ in 0..n {
            let o = self.mq.topic_info(TOPIC).unwrap().next;
            let h: spool::Headers = key_of(o)
                .map(|k| (MESSAGE_KEY_HEADER.to_owned(), k.to_owned()))
                .into_iter()
                .collect();
            let got = self.mq.publish(TOPIC, payload_of(o), &h).await.unwrap();
            assert_eq!(got, o);
        }
    }

    /// Takes the next delivery from `which` consumer (the manual one or the one with a
    /// deadline) if the model says one is available, else checks there is none.
    async fn recv_from(&mut self, deadline: bool) {
        let c = if deadline { &mut self.dl } else { &mut self.c };
        match self.m.next() {
            Some(o) => {
                let d = tokio::time::timeout(WAIT, c.recv())
                    .await
                    .expect("the model says a delivery is available")
                    .unwrap();
                assert_eq!(d.offset(), o, "delivery order");
                assert_eq!(d.attempt(), self.m.attempt(o), "attempt of {o}");
                assert_eq!(&d.payload()[..], &payload_of(o)[..]);
                assert_eq!(d.deadline().is_some(), deadline);
                self.m.out.insert(o);
                self.held.push(Held {
                    d,
                    live: true,
                    expired: false,
                });
            }
            None => {
                let d = c.recv_timeout(Duration::from_millis(1)).await.unwrap();
                assert!(
                    d.is_none(),
                    "the model says nothing is available, got {:?}",
                    d.map(|d| d.offset())
                );
            }
        }
    }

    /// The model's side of an auto-ack: the previous delivery, if still live, is finished.
    fn auto_ack_previous(&mut self) {
        if let Some(o) = self.m.auto_prev.take() {
            self.m.out.remove(&o);
            self.m.finish(o);
        }
    }

    fn take(&mut self, i: usize) -> Option<Held> {
        if self.held.is_empty() {
            return None;
        }
        let i = i % self.held.len();
        Some(self.held.swap_remove(i))
    }

    fn reason(&mut self) -> String {
        self.reasons += 1;
        format!("reason {}", self.reasons)
    }

    /// Marks the live delivery of `o`, if any, as finished elsewhere.
    fn fence(&mut self, o: u64) {
        for h in &mut self.held {
            if h.live && h.d.offset() == o {
                h.live = false;
            }
        }
        if self.m.auto_prev == Some(o) {
            self.m.auto_prev = None;
        }
        self.m.out.remove(&o);
    }

    async fn step(&mut self, op: &Op) {
        match op {
            Op::Publish(n) => {
                let from = self.m.log_end();
                self.publish(*n).await;
                for r in self.mq.fetch(TOPIC, from, usize::MAX).await.unwrap() {
                    assert_eq!(r.offset(), self.m.log_end());
                    self.m.ts.push(ms(r.timestamp()));
                }
            }
            Op::Recv => self.recv_from(false).await,
            Op::RecvDeadline => self.recv_from(true).await,
            Op::Ack(i) => {
                let Some(h) = self.take(*i) else { return };
                let o = h.d.offset();
                let r = h.d.ack().await;
                if h.live {
                    r.unwrap();
                    self.m.out.remove(&o);
                    self.m.finish(o);
                } else {
                    Harness::assert_refused(o, h.expired, &r);
                }
            }
            Op::Nack(i) | Op::NackParked(i) => {
                let Some(h) = self.take(*i) else { return };
                let o = h.d.offset();
                let reason = self.reason();
                let parked = matches!(op, Op::NackParked(_));
                let r = if parked {
                    h.d.nack_with_delay(&reason, Duration::from_secs(3600))
                        .await
                } else {
                    h.d.nack(&reason).await
                };
                if h.live {
                    let r = r.unwrap();
                    self.m.out.remove(&o);
                    let (a, dl, next) = self.m.nack(o, &reason);
                    assert_eq!(
                        (r.delivery_attempt, r.dead_lettered, r.next_offset),
                        (a, dl, next),
                        "nack outcome of {o}"
                    );
                    assert_eq!(r.redeliver_at.is_some(), parked && !dl);
                    if parked && !dl {
                        self.m.parked.insert(o);
                    }
                } else {
                    Harness::assert_refused(o, h.expired, &r);
                }
            }
            Op::Release(i) => {
                let Some(h) = self.take(*i) else { return };
                if h.live {
                    self.m.out.remove(&h.d.offset());
                }
                drop(h);
            }
            Op::LowAck(at_cursor) | Op::LowNack(at_cursor) => {
                let cursor = self.m.cursor;
                let o = if *at_cursor { cursor } else { cursor + 1 };
                let is_ack = matches!(op, Op::LowAck(_));
                let reason = self.reason();
                let r = if is_ack {
                    self.mq.ack(TOPIC, GROUP, o).await.map(|()| None)
                } else {
                    self.mq.nack(TOPIC, GROUP, o, &reason).await.map(Some)
                };
                if o != cursor {
                    assert!(
                        matches!(r, Err(Error::NotAtCursor { expected, actual }) if expected == cursor && actual == o),
                        "{r:?}"
                    );
                } else if o >= self.m.log_end() {
                    assert!(r.is_err(), "offset {o} does not exist yet: {r:?}");
                } else {
                    let r = r.unwrap();
                    self.fence(o);
                    // Addressed to the cursor: a parked one is taken out of its wait.
                    self.m.parked.remove(&o);
                    if is_ack {
                        self.m.finish(o);
                    } else {
                        let r = r.unwrap();
                        let (a, dl, next) = self.m.nack(o, &reason);
                        assert_eq!(
                            (r.delivery_attempt, r.dead_lettered, r.next_offset),
                            (a, dl, next),
                            "low-level nack outcome of {o}"
                        );
                    }
                }
            }
            Op::Reset(to) => {
                let (to, expected) = match to {
                    ResetTo::Earliest => (OffsetReset::Earliest, self.m.earliest),
                    ResetTo::Latest => (OffsetReset::Latest, self.m.log_end()),
                    ResetTo::TimeBeforeAll => (OffsetReset::Time(UNIX_EPOCH), self.m.earliest),
                    ResetTo::TimeAfterAll => (
                        OffsetReset::Time(SystemTime::now() + Duration::from_secs(3600)),
                        self.m.log_end(),
                    ),
                    ResetTo::TimeOfRecord(i, plus) => {
                        if self.m.ts.is_empty() {
                            (OffsetReset::Time(SystemTime::now()), 0)
                        } else {
                            let t = self.m.ts[i % self.m.ts.len()] + plus;
                            (
                                OffsetReset::Time(UNIX_EPOCH + Duration::from_millis(t)),
                                self.m.first_at_or_after(t).max(self.m.earliest),
                            )
                        }
                    }
                    ResetTo::Explicit(n) => (
                        OffsetReset::Explicit(*n),
                        (*n).clamp(self.m.earliest, self.m.log_end()),
                    ),
                };
                let at = self.mq.reset_offset(TOPIC, GROUP, to).await.unwrap();
                assert_eq!(at, expected, "{to:?}");
                self.m.reset(expected);
                for h in &mut self.held {
                    h.live = false;
                }
            }
            Op::Reopen => {
                self.mq.close().await.unwrap();
                // Dropped after the close: their releases go nowhere. A clean close
                // released them without counting attempts.
                self.held.clear();
                self.m.out.clear();
                self.m.auto_prev = None;
                self.mq = open(self.dir.path(), &self.conn);
                self.rebuild_consumers();
            }
            Op::AutoRecv => {
                self.auto_ack_previous();
                let d = self
                    .auto
                    .recv_timeout(Duration::from_millis(1))
                    .await
                    .unwrap();
                match (self.m.next(), d) {
                    (Some(o), Some(d)) => {
                        assert_eq!(d.offset(), o, "auto-ack delivery order");
                        assert_eq!(d.attempt(), self.m.attempt(o), "attempt of {o}");
                        self.m.out.insert(o);
                        self.m.auto_prev = Some(o);
                        // Dropping an auto-ack delivery neither acks nor releases it.
                    }
                    (None, None) => {}
                    (want, got) => panic!(
                        "auto-ack consumer: model {want:?}, got {:?}",
                        got.map(|d| d.offset())
                    ),
                }
            }
            Op::AutoClose => {
                let fresh = consumers(&self.mq, &self.m).1;
                let old = std::mem::replace(&mut self.auto, fresh);
                old.close().await.unwrap();
                self.auto_ack_previous();
            }
            Op::DeleteGroup => self.delete_group().await,
            Op::DeleteRecords(n) => {
                let earliest = self.mq.delete_records_before(TOPIC, *n).await.unwrap();
                let expected = self.m.earliest.max((*n).min(self.m.log_end()));
                assert_eq!(earliest, expected, "earliest after deleting before {n}");
                self.m.earliest = expected;
                self.m.clamp(expected);
                for h in &mut self.held {
                    if h.d.offset() < expected {
                        h.live = false;
                    }
                }
            }
        }
    }

    /// The consumers go (the auto-ack one acks its previous delivery), the group is
    /// deleted, and they are built again on the group made anew.
    async fn delete_group(&mut self) {
        let placeholder = consumers(&self.mq, &self.m).1;
        let old_auto = std::mem::replace(&mut self.auto, placeholder);
        drop(old_auto);
        self.auto_ack_previous();
        // Still open: the placeholder. Deleting now must be refused.
        let refused = self.mq.delete_group(TOPIC, GROUP).await;
        assert!(
            matches!(refused, Err(Error::GroupInUse { .. })),
            "{refused:?}"
        );
        let other = mq_placeholder(&self.mq);
        drop(std::mem::replace(&mut self.auto, other));
        let old_c = std::mem::replace(&mut self.c, mq_placeholder(&self.mq));
        drop(old_c);
        drop(std::mem::replace(&mut self.dl, mq_placeholder(&self.mq)));
        // The placeholders are consumers of another group: this one has none open now.
        self.mq.delete_group(TOPIC, GROUP).await.unwrap();
        self.m.start_over();
        for h in &mut self.held {
            h.live = false;
        }
        self.rebuild_consumers();
    }

    async fn check(&self, after: &Op) {
        let info = self.mq.group_info(TOPIC, GROUP).unwrap();
        let m = &self.m;
        assert_eq!(info.cursor, m.cursor, "cursor after {after:?}");
        assert_eq!(info.next, m.log_end(), "log end after {after:?}");
        assert_eq!(info.lag, m.log_end() - m.cursor);
        assert_eq!(info.in_flight, m.out.len(), "in flight after {after:?}");
        let pending: Vec<(u64, u32, String)> = info
            .pending
            .iter()
            .map(|p| (p.offset, p.attempts, p.last_reason.clone()))
            .collect();
        let expected: Vec<(u64, u32, String)> = m
            .attempts
            .iter()
            .map(|(o, (a, r))| (*o, *a, r.clone()))
            .collect();
        assert_eq!(pending, expected, "pending after {after:?}");
        assert_eq!(info.dead_lettered, m.dead_lettered);
        assert_eq!(info.skipped, m.skipped, "skipped after {after:?}");
    }

    async fn check_dead_letters(&self) {
        let copies: Vec<u64> = all_records(&self.mq, DLQ)
            .await
            .iter()
            .map(|r| r.headers()[X_ORIGINAL_OFFSET].parse().unwrap())
            .collect();
        assert_eq!(copies, self.m.dlq, "dead-letter copies");
    }
}

async fn run(max_in_flight: usize, max_attempts: u32, keyed: bool, ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    let conn = format!("Max Delivery Attempts={max_attempts}");
    let mq = open(dir.path(), &conn);
    let m = Model {
        max_in_flight,
        max_attempts,
        keyed,
        ..Model::default()
    };
    let (c, auto, dl) = consumers(&mq, &m);
    let mut h = Harness {
        dir,
        conn,
        mq,
        c,
        auto,
        dl,
        held: Vec::new(),
        m,
        reasons: 0,
    };
    for op in &ops {
        h.step(op).await;
        // The deadlines of this step's deliveries pass before anything else happens.
        h.let_deadlines_pass().await;
        h.check(op).await;
    }
    h.check_dead_letters().await;
    // And everything survives one more reopen.
    h.step(&Op::Reopen).await;
    h.check(&Op::Reopen).await;
    h.check_dead_letters().await;
    // Draining the group from here delivers exactly what the model has left (a parked
    // message is acked at the cursor, low-level, once nothing else is available).
    let mut rest = Vec::new();
    loop {
        if let Some(o) = h.m.next() {
            h.step(&Op::Recv).await;
            h.step(&Op::Ack(h.held.len() - 1)).await;
            rest.push(o);
        } else if h.m.parked.contains(&h.m.cursor) {
            h.step(&Op::LowAck(true)).await;
        } else {
            break;
        }
    }
    h.step(&Op::Recv).await; // nothing more
    assert_eq!(h.m.cursor, h.m.log_end(), "drained: {rest:?}");
    h.check(&Op::Recv).await;
}

proptest! {
    // `SPOOL_MODEL_CASES=2000` for a longer hunt; the default keeps the suite quick.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("SPOOL_MODEL_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(48),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn one_group_follows_the_reference_model(
        max_in_flight in 1usize..=3,
        max_attempts in prop_oneof![Just(0u32), Just(2), Just(3)],
        keyed in any::<bool>(),
        ops in proptest::collection::vec(op_strategy(), 1..60),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(run(max_in_flight, max_attempts, keyed, ops));
    }
}
