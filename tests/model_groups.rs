//! Guards issue 3 points 2, 3, 4, 5 and 6 together: random sequences of publish / recv /
//! ack / nack / release / low-level ack+nack / reset (all four modes) / reopen on one group
//! (a manual-ack consumer, plus an auto-ack consumer sharing the group) are checked step by step against a small in-memory reference model of API.md's rules —
//! the cursor is the ack floor, the lowest unfinished offset not out is delivered next
//! (so a nacked message comes back first), attempts count per offset and survive reopen,
//! the limit dead-letters exactly once, a reset moves the cursor, clears the counters and
//! fences older deliveries. Issue 27 point 4 adds group deletion (the group starts over
//! at the earliest offset; its deliveries are fenced) and record deletion (the earliest
//! offset moves up; the group skips what it had not finished, counted in `skipped`).

mod common_groups;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common_groups::{WAIT, all_records, open, payload_of, publish_n};
use proptest::prelude::*;
use spool::consts::X_ORIGINAL_OFFSET;
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
        (self.cursor..self.log_end()).find(|o| !self.done.contains(o) && !self.out.contains(o))
    }

    fn attempt(&self, o: u64) -> u32 {
        self.attempts.get(&o).map_or(0, |a| a.0) + 1
    }

    fn finish(&mut self, o: u64) {
        self.attempts.remove(&o);
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
}

struct Harness {
    dir: tempfile::TempDir,
    conn: String,
    mq: Spool,
    c: Consumer,
    auto: Consumer,
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

impl Harness {
    fn consumer(mq: &Spool, max_in_flight: usize) -> Consumer {
        mq.consumer(TOPIC, GROUP)
            .manual_ack()
            .max_in_flight(max_in_flight)
            .build()
            .unwrap()
    }

    fn auto_consumer(mq: &Spool, max_in_flight: usize) -> Consumer {
        mq.consumer(TOPIC, GROUP)
            .max_in_flight(max_in_flight)
            .build()
            .unwrap()
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
                publish_n(&self.mq, TOPIC, *n).await;
                for r in self.mq.fetch(TOPIC, from, usize::MAX).await.unwrap() {
                    assert_eq!(r.offset(), self.m.log_end());
                    self.m.ts.push(ms(r.timestamp()));
                }
            }
            Op::Recv => match self.m.next() {
                Some(o) => {
                    let d = tokio::time::timeout(WAIT, self.c.recv())
                        .await
                        .expect("the model says a delivery is available")
                        .unwrap();
                    assert_eq!(d.offset(), o, "delivery order");
                    assert_eq!(d.attempt(), self.m.attempt(o), "attempt of {o}");
                    assert_eq!(&d.payload()[..], &payload_of(o)[..]);
                    self.m.out.insert(o);
                    self.held.push(Held { d, live: true });
                }
                None => {
                    let d = self.c.recv_timeout(Duration::from_millis(1)).await.unwrap();
                    assert!(
                        d.is_none(),
                        "the model says nothing is available, got {:?}",
                        d.map(|d| d.offset())
                    );
                }
            },
            Op::Ack(i) => {
                let Some(h) = self.take(*i) else { return };
                let o = h.d.offset();
                let r = h.d.ack().await;
                if h.live {
                    r.unwrap();
                    self.m.out.remove(&o);
                    self.m.finish(o);
                } else {
                    assert!(
                        matches!(r, Err(Error::StaleDelivery { offset }) if offset == o),
                        "{r:?}"
                    );
                }
            }
            Op::Nack(i) => {
                let Some(h) = self.take(*i) else { return };
                let o = h.d.offset();
                let reason = self.reason();
                let r = h.d.nack(&reason).await;
                if h.live {
                    let r = r.unwrap();
                    self.m.out.remove(&o);
                    let (a, dl, next) = self.m.nack(o, &reason);
                    assert_eq!(
                        (r.delivery_attempt, r.dead_lettered, r.next_offset),
                        (a, dl, next),
                        "nack outcome of {o}"
                    );
                } else {
                    assert!(
                        matches!(r, Err(Error::StaleDelivery { offset }) if offset == o),
                        "{r:?}"
                    );
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
                self.c = Harness::consumer(&self.mq, self.m.max_in_flight);
                self.auto = Harness::auto_consumer(&self.mq, self.m.max_in_flight);
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
                let fresh = Harness::auto_consumer(&self.mq, self.m.max_in_flight);
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

    /// Both consumers go (the auto-ack one acks its previous delivery), the group is
    /// deleted, and both are built again on the group made anew.
    async fn delete_group(&mut self) {
        let placeholder = Harness::auto_consumer(&self.mq, self.m.max_in_flight);
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
        // The placeholders are consumers of another group: this one has none open now.
        self.mq.delete_group(TOPIC, GROUP).await.unwrap();
        self.m.start_over();
        for h in &mut self.held {
            h.live = false;
        }
        self.c = Harness::consumer(&self.mq, self.m.max_in_flight);
        self.auto = Harness::auto_consumer(&self.mq, self.m.max_in_flight);
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

async fn run(max_in_flight: usize, max_attempts: u32, ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    let conn = format!("Max Delivery Attempts={max_attempts}");
    let mq = open(dir.path(), &conn);
    let c = Harness::consumer(&mq, max_in_flight);
    let auto = Harness::auto_consumer(&mq, max_in_flight);
    let mut h = Harness {
        dir,
        conn,
        mq,
        c,
        auto,
        held: Vec::new(),
        m: Model {
            max_in_flight,
            max_attempts,
            ..Model::default()
        },
        reasons: 0,
    };
    for op in &ops {
        h.step(op).await;
        h.check(op).await;
    }
    h.check_dead_letters().await;
    // And everything survives one more reopen.
    h.step(&Op::Reopen).await;
    h.check(&Op::Reopen).await;
    h.check_dead_letters().await;
    // Draining the group from here delivers exactly what the model has left.
    let mut rest = Vec::new();
    while let Some(o) = h.m.next() {
        h.step(&Op::Recv).await;
        h.step(&Op::Ack(h.held.len() - 1)).await;
        rest.push(o);
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
        ops in proptest::collection::vec(op_strategy(), 1..60),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(run(max_in_flight, max_attempts, ops));
    }
}
