//! Random sequences over the public API — publish, batch, recv, ack, nack (to
//! dead-letter), reset in all four modes, retention, clean close/reopen and simulated power
//! cuts — follow an in-memory reference model of API.md's rules, on the simulated disk.
//! Issue 27 point 4 adds deleting the group and deleting records before an offset: both
//! durable once they returned, so a power cut after them keeps them. Issue 27 point 1
//! adds a nack with a delay longer than the run: the message waits (and, with one in
//! flight, everything after it) through reopens and power cuts.
//!
//! Under `Sync=Always` every call that returned is durable, so after a power cut the
//! state is the model's, with one documented exception: the delivery that was out at the
//! cut may have been charged one attempt (and dead-lettered on open if that reached the
//! limit). The test accepts exactly that and nothing else. `SPOOL_MODEL_CASES=<n>` for a
//! longer hunt.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use spool::testing::SimFs;
use spool::{Consumer, Delivery, Error, Headers, OffsetReset, Options, Spool, SyncPolicy};

const TOPIC: &str = "t";
const DLQ: &str = "t.dlq";
const GROUP: &str = "g";
const MAX_ATTEMPTS: u32 = 3;

#[derive(Clone, Debug)]
enum Reset {
    Earliest,
    Latest,
    /// The timestamp of the retained record at this index (mod their number).
    Time(usize),
    Explicit(u64),
}

#[derive(Clone, Debug)]
enum Op {
    Publish(usize),
    Batch(usize),
    Recv,
    Ack,
    Nack,
    /// `nack_with_delay` of an hour: parked for the rest of the run.
    NackParked,
    Reset(Reset),
    Retention,
    Reopen,
    Crash,
    DeleteGroup,
    DeleteRecords(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1usize..120).prop_map(Op::Publish),
        1 => (1usize..6).prop_map(Op::Batch),
        5 => Just(Op::Recv),
        3 => Just(Op::Ack),
        3 => Just(Op::Nack),
        1 => Just(Op::NackParked),
        1 => prop_oneof![
            Just(Reset::Earliest),
            Just(Reset::Latest),
            any::<usize>().prop_map(Reset::Time),
            (0u64..40).prop_map(Reset::Explicit),
        ]
        .prop_map(Op::Reset),
        1 => Just(Op::Retention),
        1 => Just(Op::Reopen),
        2 => Just(Op::Crash),
        1 => Just(Op::DeleteGroup),
        1 => (0u64..40).prop_map(Op::DeleteRecords),
    ]
}

fn options() -> Options {
    let mut o = Options::new("/data");
    o.sync = SyncPolicy::Always;
    o.segment_bytes = 1024;
    o.retention_bytes = 2048;
    o.max_delivery_attempts = MAX_ATTEMPTS;
    // Background work off: the operations alone decide the state.
    o.commit_interval_ms = 10 * 365 * 24 * 3600 * 1000;
    o.retention_check_ms = o.commit_interval_ms;
    o
}

/// The reference (one consumer, manual ack, `max_in_flight` 1).
#[derive(Debug, Default)]
struct Model {
    /// offset -> (payload, timestamp ms) of retained records; `next` is the log end.
    records: BTreeMap<u64, (Vec<u8>, u64)>,
    next: u64,
    earliest: u64,
    cursor: u64,
    out: Option<u64>,
    attempts: BTreeMap<u64, u32>,
    dead_lettered: u64,
    skipped: u64,
    dlq: Vec<u64>,
    /// The cursor's message, nacked with a delay longer than the run.
    parked: Option<u64>,
}

impl Model {
    fn clamp(&mut self) {
        if self.parked.is_some_and(|o| o < self.earliest) {
            self.parked = None;
        }
        if self.cursor < self.earliest {
            self.skipped += self.earliest - self.cursor;
            self.cursor = self.earliest;
            self.attempts.retain(|o, _| *o >= self.cursor);
            if self.out.is_some_and(|o| o < self.earliest) {
                self.out = None;
            }
        }
    }

    fn nack(&mut self, o: u64) -> (u32, bool, u64) {
        let a = self.attempts.get(&o).copied().unwrap_or(0) + 1;
        if a >= MAX_ATTEMPTS {
            self.attempts.remove(&o);
            self.dlq.push(o);
            self.dead_lettered += 1;
            self.cursor = o + 1;
            (a, true, self.cursor)
        } else {
            self.attempts.insert(o, a);
            (a, false, self.cursor)
        }
    }
}

struct Harness {
    fs: SimFs,
    mq: Spool,
    c: Consumer,
    held: Option<Delivery>,
    m: Model,
    payloads: u64,
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Harness {
    fn open(fs: &SimFs) -> (Spool, Consumer) {
        let mq = Spool::open_simulated(options(), fs).expect("open");
        let c = mq
            .consumer(TOPIC, GROUP)
            .manual_ack()
            .build()
            .expect("consumer");
        (mq, c)
    }

    fn payload(&mut self, len: usize) -> Vec<u8> {
        self.payloads += 1;
        let mut p = format!("p{}-", self.payloads).into_bytes();
        p.resize(len.max(p.len()), b'.');
        p
    }

    async fn learn_timestamps(&mut self, from: u64) {
        for r in self.mq.fetch(TOPIC, from, usize::MAX).await.expect("fetch") {
            if let Some(e) = self.m.records.get_mut(&r.offset()) {
                e.1 = ms(r.timestamp());
            }
        }
    }

    async fn step(&mut self, op: &Op) {
        match op {
            Op::Publish(len) => {
                let p = self.payload(*len);
                let o = self
                    .mq
                    .publish(TOPIC, p.clone(), &Headers::new())
                    .await
                    .expect("publish");
                assert_eq!(o, self.m.next, "dense offsets");
                self.m.records.insert(o, (p, 0));
                self.m.next += 1;
                self.learn_timestamps(o).await;
            }
            Op::Batch(n) => {
                let msgs: Vec<(Vec<u8>, Headers)> = (0..*n)
                    .map(|i| (self.payload(10 + i * 7), Headers::new()))
                    .collect();
                let offsets = self
                    .mq
                    .publish_batch(TOPIC, msgs.clone())
                    .await
                    .expect("batch");
                let from = self.m.next;
                for (o, (p, _)) in offsets.iter().zip(msgs) {
                    assert_eq!(*o, self.m.next, "dense batch offsets");
                    self.m.records.insert(*o, (p, 0));
                    self.m.next += 1;
                }
                self.learn_timestamps(from).await;
            }
            Op::Recv => {
                self.m.clamp();
                let want = (self.m.out.is_none()
                    && self.m.cursor < self.m.next
                    && self.m.parked != Some(self.m.cursor))
                .then_some(self.m.cursor);
                let got = self
                    .c
                    .recv_timeout(Duration::from_millis(1))
                    .await
                    .expect("recv");
                match (want, got) {
                    (Some(o), Some(d)) => {
                        assert_eq!(d.offset(), o, "delivery order");
                        assert_eq!(
                            d.attempt(),
                            self.m.attempts.get(&o).copied().unwrap_or(0) + 1,
                            "attempt of {o}"
                        );
                        assert_eq!(&d.payload()[..], &self.m.records[&o].0[..]);
                        self.m.out = Some(o);
                        self.held = Some(d);
                    }
                    (None, None) => {}
                    (w, g) => panic!("model {w:?}, got {:?}", g.map(|d| d.offset())),
                }
            }
            Op::Ack => {
                let Some(d) = self.held.take() else { return };
                let o = d.offset();
                let r = d.ack().await;
                if self.m.out == Some(o) {
                    r.expect("ack");
                    self.m.out = None;
                    self.m.attempts.remove(&o);
                    self.m.cursor = o + 1;
                } else {
                    assert!(matches!(r, Err(Error::StaleDelivery { .. })), "{r:?}");
                }
            }
            Op::Nack | Op::NackParked => {
                let Some(d) = self.held.take() else { return };
                let o = d.offset();
                let parked = matches!(op, Op::NackParked);
                let r = if parked {
                    d.nack_with_delay("later", Duration::from_secs(3600)).await
                } else {
                    d.nack("model says no").await
                };
                if self.m.out == Some(o) {
                    let r = r.expect("nack");
                    self.m.out = None;
                    let want = self.m.nack(o);
                    assert_eq!(
                        (r.delivery_attempt, r.dead_lettered, r.next_offset),
                        want,
                        "nack outcome of {o}"
                    );
                    if parked && !want.1 {
                        self.m.parked = Some(o);
                    }
                } else {
                    assert!(matches!(r, Err(Error::StaleDelivery { .. })), "{r:?}");
                }
            }
            Op::Reset(to) => {
                let m = &self.m;
                let (to, want) = match to {
                    Reset::Earliest => (OffsetReset::Earliest, m.earliest),
                    Reset::Latest => (OffsetReset::Latest, m.next),
                    Reset::Explicit(n) => {
                        (OffsetReset::Explicit(*n), (*n).clamp(m.earliest, m.next))
                    }
                    Reset::Time(i) => match m.records.values().nth(i % m.records.len().max(1)) {
                        Some((_, ts)) => {
                            let want = m
                                .records
                                .iter()
                                .find(|(_, (_, t))| t >= ts)
                                .map_or(m.next, |(o, _)| *o);
                            (
                                OffsetReset::Time(UNIX_EPOCH + Duration::from_millis(*ts)),
                                want,
                            )
                        }
                        None => (OffsetReset::Time(SystemTime::now()), m.next),
                    },
                };
                let at = self.mq.reset_offset(TOPIC, GROUP, to).await.expect("reset");
                assert_eq!(at, want, "{to:?}");
                self.m.cursor = want;
                self.m.out = None;
                self.m.parked = None;
                self.m.attempts.clear();
            }
            Op::Retention => {
                self.mq.apply_retention().expect("retention");
                let earliest = self.mq.topic_info(TOPIC).expect("info").earliest;
                assert!(earliest >= self.m.earliest && earliest <= self.m.next);
                self.m.earliest = earliest;
                self.m.records.retain(|o, _| *o >= earliest);
                self.m.clamp();
            }
            Op::Reopen => {
                self.held = None;
                self.m.out = None;
                self.mq.close().await.expect("close");
                let (mq, c) = Harness::open(&self.fs);
                self.mq = mq;
                self.c = c;
            }
            Op::DeleteGroup => {
                // No consumer of the group may be open: stand one of another group in.
                self.held = None;
                let stand_in = self.mq.consumer(TOPIC, "stand-in").build().expect("c");
                drop(std::mem::replace(&mut self.c, stand_in));
                self.mq.delete_group(TOPIC, GROUP).await.expect("delete");
                self.m.cursor = self.m.earliest;
                self.m.out = None;
                self.m.parked = None;
                self.m.attempts.clear();
                self.m.dead_lettered = 0;
                self.m.skipped = 0;
                self.c = self
                    .mq
                    .consumer(TOPIC, GROUP)
                    .manual_ack()
                    .build()
                    .expect("consumer");
            }
            Op::DeleteRecords(n) => {
                let got = self
                    .mq
                    .delete_records_before(TOPIC, *n)
                    .await
                    .expect("delete records");
                let want = self.m.earliest.max((*n).min(self.m.next));
                assert_eq!(got, want, "earliest after deleting before {n}");
                self.m.earliest = want;
                self.m.records.retain(|o, _| *o >= want);
                self.m.clamp();
            }
            Op::Crash => {
                // The power goes out now: nothing of this instance runs again.
                let image = self.fs.crash_now();
                let held = self.held.take();
                let old = std::mem::replace(&mut self.fs, image);
                let (mq, c) = Harness::open(&self.fs);
                let dead = std::mem::replace(&mut self.mq, mq);
                self.c = c;
                drop(held);
                let _ = dead.close().await;
                drop(old);
                self.reconcile_after_crash().await;
            }
        }
    }

    /// The documented exception: the delivery out at the cut may have been charged one
    /// attempt, and dead-lettered on open if that reached the limit. Learn which.
    async fn reconcile_after_crash(&mut self) {
        let Some(o) = self.m.out.take() else { return };
        let g = self.mq.group_info(TOPIC, GROUP).expect("group");
        let before = self.m.attempts.get(&o).copied().unwrap_or(0);
        if g.dead_lettered == self.m.dead_lettered + 1 {
            assert_eq!(
                before + 1,
                MAX_ATTEMPTS,
                "only the charge can dead-letter {o}"
            );
            assert_eq!(g.cursor, o + 1);
            self.m.attempts.remove(&o);
            self.m.dlq.push(o);
            self.m.dead_lettered += 1;
            self.m.cursor = o + 1;
            return;
        }
        let now = g
            .pending
            .iter()
            .find(|p| p.offset == o)
            .map_or(0, |p| p.attempts);
        assert!(
            now == before || now == before + 1,
            "offset {o}: {before} attempts before the cut, {now} after"
        );
        if now > 0 {
            self.m.attempts.insert(o, now);
        }
    }

    async fn check(&self, after: &Op) {
        let g = self.mq.group_info(TOPIC, GROUP).expect("group");
        let m = &self.m;
        let info = self.mq.topic_info(TOPIC).expect("info");
        assert_eq!(
            (info.earliest, info.next),
            (m.earliest, m.next),
            "log after {after:?}"
        );
        // The group clamps lazily; compare with the model clamped the same way.
        let cursor = m.cursor.max(m.earliest);
        assert_eq!(g.cursor, cursor, "cursor after {after:?}");
        assert_eq!(
            g.in_flight,
            usize::from(m.out.is_some()),
            "in flight after {after:?}"
        );
        let pending: Vec<(u64, u32)> = g.pending.iter().map(|p| (p.offset, p.attempts)).collect();
        let want: Vec<(u64, u32)> = m
            .attempts
            .iter()
            .filter(|(o, _)| **o >= cursor)
            .map(|(o, a)| (*o, *a))
            .collect();
        assert_eq!(pending, want, "attempts after {after:?}");
        assert_eq!(
            g.dead_lettered, m.dead_lettered,
            "dead-lettered after {after:?}"
        );
        let records = self.mq.fetch(TOPIC, 0, usize::MAX).await.expect("fetch");
        let got: Vec<(u64, Vec<u8>)> = records
            .iter()
            .map(|r| (r.offset(), r.payload().to_vec()))
            .collect();
        let want: Vec<(u64, Vec<u8>)> = m
            .records
            .iter()
            .map(|(o, (p, _))| (*o, p.clone()))
            .collect();
        assert_eq!(got, want, "records after {after:?}");
        let copies: Vec<u64> = self
            .mq
            .fetch(DLQ, 0, usize::MAX)
            .await
            .expect("dlq")
            .iter()
            .filter_map(|r| r.headers().get("x-original-offset")?.parse().ok())
            .collect();
        assert_eq!(copies, m.dlq, "dead-letter copies after {after:?}");
    }
}

async fn run(seed: u64, ops: Vec<Op>) {
    let fs = SimFs::new(seed);
    let (mq, c) = Harness::open(&fs);
    let mut h = Harness {
        fs,
        mq,
        c,
        held: None,
        m: Model::default(),
        payloads: 0,
    };
    for op in &ops {
        h.step(op).await;
        h.check(op).await;
    }
    h.step(&Op::Crash).await;
    h.check(&Op::Crash).await;
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("SPOOL_MODEL_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(48),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_public_api_follows_the_model_through_power_cuts(
        seed in any::<u64>(),
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(run(seed, ops));
    }
}
