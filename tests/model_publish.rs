//! Guards the storage engine as a whole against a simple in-memory model: random
//! sequences of `publish` / `publish_batch` (with and without message-ids, random sizes),
//! clean reopens, unclean stops and retention, on tiny segments, must return the offsets
//! the model predicts and read back exactly the model's records, earliest offset, segment
//! layout and de-duplication hits.

mod common_core;

use common_core::{block_on, fetch_all, open, payload};
use proptest::prelude::*;
use spool::{Headers, Options, Spool, SyncPolicy};

const TOPIC: &str = "model";
/// Bytes of a segment header.
const SEGMENT_HEADER: u64 = 32;
/// Frame bytes besides the encoded headers and the payload.
const RECORD_OVERHEAD: u64 = 28;

#[derive(Clone, Debug)]
struct Msg {
    id: Option<u8>,
    extra_header: bool,
    size: usize,
}

#[derive(Clone, Debug)]
enum Op {
    Publish(Msg),
    Batch(Vec<Msg>),
    /// `close` then open.
    Reopen,
    /// Drop every handle without `close`, then open.
    Crash,
    Retention,
}

#[derive(Clone, Debug)]
struct Config {
    segment_bytes: u64,
    retention_bytes: u64,
    dedup_window: usize,
    index_interval_bytes: u64,
}

/// The reference: records by offset, the segment layout, and the de-duplication rule.
#[derive(Debug, Default)]
struct Model {
    exists: bool,
    earliest: u64,
    /// Every record ever appended, by offset (those below `earliest` are deleted).
    records: Vec<(Vec<u8>, Headers)>,
    /// (base offset, bytes) of each retained segment, oldest first.
    segments: Vec<(u64, u64)>,
}

/// postcard's size of a `BTreeMap<String, String>` whose lengths are all below 128.
fn headers_len(h: &Headers) -> u64 {
    1 + h
        .iter()
        .map(|(k, v)| 2 + k.len() as u64 + v.len() as u64)
        .sum::<u64>()
}

impl Model {
    fn create(&mut self) {
        if !self.exists {
            self.exists = true;
            self.segments.push((0, SEGMENT_HEADER));
        }
    }

    fn next(&self) -> u64 {
        self.records.len() as u64
    }

    /// The last `window` message-ids appended and still retained; a hit returns the
    /// offset of the record carrying the id.
    fn dedup_hit(&self, id: &str, window: usize) -> Option<u64> {
        if window == 0 {
            return None;
        }
        (self.earliest..self.next())
            .rev()
            .filter_map(|o| {
                self.records[o as usize]
                    .1
                    .get("message-id")
                    .map(|i| (o, i.as_str()))
            })
            .take(window)
            .find(|(_, i)| *i == id)
            .map(|(o, _)| o)
    }

    /// Publishes one message; returns its offset (the original one on a hit).
    fn publish(&mut self, p: Vec<u8>, h: Headers, cfg: &Config) -> u64 {
        self.create();
        if let Some(id) = h.get("message-id")
            && let Some(o) = self.dedup_hit(id, cfg.dedup_window)
        {
            return o;
        }
        let frame = RECORD_OVERHEAD + headers_len(&h) + p.len() as u64;
        let offset = self.next();
        let (base, bytes) = *self.segments.last().expect("a segment");
        if offset > base && bytes + frame > cfg.segment_bytes {
            self.segments.push((offset, SEGMENT_HEADER + frame));
        } else {
            self.segments.last_mut().expect("a segment").1 += frame;
        }
        self.records.push((p, h));
        offset
    }

    /// Kafka's rule: delete the oldest sealed segment while the rest still hold at least
    /// `retention_bytes`.
    fn retention(&mut self, cfg: &Config) {
        if cfg.retention_bytes == 0 {
            return;
        }
        let mut total: u64 = self.segments.iter().map(|s| s.1).sum();
        while self.segments.len() > 1 && total - self.segments[0].1 >= cfg.retention_bytes {
            total -= self.segments[0].1;
            self.segments.remove(0);
        }
        self.earliest = self.segments.first().map_or(0, |s| s.0);
    }
}

fn message(m: &Msg, seed: u64) -> (Vec<u8>, Headers) {
    let mut h = Headers::new();
    if let Some(id) = m.id {
        h.insert("message-id".into(), format!("m{id}"));
    }
    if m.extra_header {
        h.insert("trace".into(), format!("t{seed}"));
    }
    (payload(seed, m.size), h)
}

async fn check(mq: &Spool, model: &Model, ctx: &str) {
    let info = mq.topic_info(TOPIC).expect("topic_info");
    assert_eq!(info.earliest, model.earliest, "{ctx}: earliest");
    assert_eq!(info.next, model.next(), "{ctx}: next");
    assert_eq!(
        info.messages,
        model.next() - model.earliest,
        "{ctx}: messages"
    );
    assert_eq!(info.segments, model.segments.len(), "{ctx}: segments");
    assert_eq!(
        info.bytes,
        model.segments.iter().map(|s| s.1).sum::<u64>(),
        "{ctx}: bytes"
    );
    let records = fetch_all(mq, TOPIC).await;
    assert_eq!(
        records.len() as u64,
        model.next() - model.earliest,
        "{ctx}: count"
    );
    for (r, o) in records.iter().zip(model.earliest..) {
        let (p, h) = &model.records[o as usize];
        assert_eq!(r.offset(), o, "{ctx}");
        assert_eq!(&r.payload()[..], &p[..], "{ctx}: payload of {o}");
        assert_eq!(r.headers(), h, "{ctx}: headers of {o}");
    }
    assert!(
        records
            .windows(2)
            .all(|w| w[0].timestamp() <= w[1].timestamp())
    );
}

async fn run(cfg: Config, ops: Vec<Op>) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let opts = Options {
        sync: SyncPolicy::None,
        segment_bytes: cfg.segment_bytes,
        retention_bytes: cfg.retention_bytes,
        dedup_window: cfg.dedup_window,
        index_interval_bytes: cfg.index_interval_bytes,
        // Retention runs only when the sequence says so.
        retention_check_ms: 3_600_000,
        ..Options::new(tmp.path())
    };
    let mut mq = open(&opts);
    let mut model = Model::default();
    let mut seed = 0u64;
    for (step, op) in ops.iter().enumerate() {
        let ctx = format!("step {step} ({op:?})");
        match op {
            Op::Publish(m) => {
                seed += 1;
                let (p, h) = message(m, seed);
                let want = model.publish(p.clone(), h.clone(), &cfg);
                let got = mq.publish(TOPIC, p, &h).await.expect("publish");
                assert_eq!(got, want, "{ctx}: offset");
            }
            Op::Batch(msgs) => {
                let batch: Vec<(Vec<u8>, Headers)> = msgs
                    .iter()
                    .map(|m| {
                        seed += 1;
                        message(m, seed)
                    })
                    .collect();
                let want: Vec<u64> = batch
                    .iter()
                    .map(|(p, h)| model.publish(p.clone(), h.clone(), &cfg))
                    .collect();
                model.create();
                let got = mq.publish_batch(TOPIC, batch).await.expect("batch");
                assert_eq!(got, want, "{ctx}: offsets");
            }
            Op::Reopen => {
                mq.close().await.expect("close");
                mq = open(&opts);
                check(&mq, &model, &ctx).await;
            }
            Op::Crash => {
                drop(mq);
                mq = open(&opts);
                check(&mq, &model, &ctx).await;
            }
            Op::Retention => {
                mq.apply_retention().expect("retention");
                model.retention(&cfg);
                check(&mq, &model, &ctx).await;
            }
        }
    }
    check(&mq, &model, "end").await;
    mq.close().await.expect("close");
    let mq = open(&opts);
    check(&mq, &model, "end, reopened").await;
    mq.close().await.expect("close");
}

fn msg() -> impl Strategy<Value = Msg> {
    (
        prop::option::weighted(0.6, 0u8..12),
        prop::bool::weighted(0.3),
        prop_oneof![6 => 0usize..120, 1 => 120usize..1200],
    )
        .prop_map(|(id, extra_header, size)| Msg {
            id,
            extra_header,
            size,
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => msg().prop_map(Op::Publish),
        4 => prop::collection::vec(msg(), 0..7).prop_map(Op::Batch),
        1 => Just(Op::Reopen),
        1 => Just(Op::Crash),
        2 => Just(Op::Retention),
    ]
}

fn config() -> impl Strategy<Value = Config> {
    (
        prop::sample::select(vec![1024u64, 1500, 2048]),
        prop::sample::select(vec![0u64, 1, 2500, 5000]),
        prop::sample::select(vec![0usize, 1, 3, 8, 1000]),
        prop::sample::select(vec![1u64, 300, 4096]),
    )
        .prop_map(
            |(segment_bytes, retention_bytes, dedup_window, index_interval_bytes)| Config {
                segment_bytes,
                retention_bytes,
                dedup_window,
                index_interval_bytes,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 40,
        // Failures are turned into named regression tests below, not files in the tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_publish_reopen_retention_sequences_match_the_model(
        cfg in config(),
        ops in prop::collection::vec(op(), 1..32),
    ) {
        block_on(run(cfg, ops));
    }
}

/// The de-duplication window after retention and a reopen: ids of deleted records are
/// forgotten, the rest rebuilt from the tail in log order.
#[test]
fn regression_dedup_window_across_retention_and_reopen() {
    let m = |id: Option<u8>, size: usize| Msg {
        id,
        extra_header: false,
        size,
    };
    let cfg = Config {
        segment_bytes: 1024,
        retention_bytes: 1,
        dedup_window: 3,
        index_interval_bytes: 300,
    };
    let ops = vec![
        Op::Batch(vec![m(Some(0), 300), m(Some(1), 300), m(Some(2), 300)]),
        Op::Publish(m(Some(3), 300)),
        Op::Publish(m(Some(1), 10)),
        Op::Retention,
        Op::Publish(m(Some(0), 10)),
        Op::Reopen,
        Op::Batch(vec![
            m(Some(3), 10),
            m(Some(4), 10),
            m(Some(5), 10),
            m(Some(3), 10),
        ]),
        Op::Crash,
        Op::Publish(m(Some(4), 10)),
    ];
    block_on(run(cfg, ops));
}
