//! `Mode=Kafka` against plain rdkafka, on librdkafka's mock cluster, in one run
//! (issue 30 point 7): 100,000 × 100 B produced, then consumed with a commit every 100.
//!
//! - spool: `publish_batch` of 1,000; a manual-ack consumer with `max_in_flight(100)`
//!   doing `recv_batch(100)` then `ack_all` (one commit per 100, awaited).
//! - rdkafka: the same produce (1,000 sends, then their deliveries awaited); a
//!   `BaseConsumer` polling, with a synchronous commit of the next offset every 100.
//!
//! The mock cluster keeps only a partition's tail (about the last 47,000 records of
//! 100 B), so each side consumes what its topic still holds, and the rates count those.
//!
//! Each side gets its own topic and group on one cluster. Each publishes one record
//! before the clock starts (connections, the idempotent producer's id). Consumption is
//! timed from the first record received (a group join takes seconds on the mock, for
//! both).
//!
//! `cargo bench --features kafka --bench kafka`; `SPOOL_BENCH_RUNS` rounds (default 3,
//! medians printed); `SPOOL_BENCH_SCALE` scales the record count.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _};
use rdkafka::message::Message as _;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use spool::{Headers, Spool};

mod common;

const PAYLOAD: usize = 100;
const BATCH: usize = 1_000;
const COMMIT_EVERY: usize = 100;

fn main() {
    let count = common::n(100_000);
    let runs = common::runs_or(3);
    let rt = common::rt();
    let (mut sp, mut sc, mut kp, mut kc) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..runs {
        let mock = MockCluster::new(1).expect("mock cluster");
        let servers = mock.bootstrap_servers();
        for t in [format!("s{round}"), format!("k{round}")] {
            mock.create_topic(&t, 1, 1).expect("topic");
        }
        // Which side goes first alternates by round: the second producer on a mock
        // cluster was seen to run far slower, whichever it was.
        let spool_first = round % 2 == 0 || std::env::var_os("SPOOL_BENCH_SPOOL_FIRST").is_some();
        let order: [bool; 2] = if spool_first {
            [true, false]
        } else {
            [false, true]
        };
        for is_spool in order {
            if is_spool {
                let (p, c) = rt.block_on(spool_side(&servers, &format!("s{round}"), count));
                sp.push(p);
                sc.push(c);
            } else {
                let (p, c) = rt.block_on(rdkafka_side(&servers, &format!("k{round}"), count));
                kp.push(p);
                kc.push(c);
            }
        }
        drop(mock);
    }
    println!("Mode=Kafka on the mock cluster, {count} x {PAYLOAD} B, median of {runs}");
    if std::env::var_os("SPOOL_BENCH_DEBUG").is_some() {
        println!(
            "rounds: spool produce {sp:.0?} consume {sc:.0?}; rdkafka produce {kp:.0?} consume {kc:.0?}"
        );
    }
    report("produce (batches of 1,000)", &mut sp, &mut kp);
    report("consume (commit every 100)", &mut sc, &mut kc);
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn report(what: &str, spool: &mut [f64], plain: &mut [f64]) {
    let (s, k) = (median(spool), median(plain));
    let overhead = (k / s - 1.0) * 100.0;
    println!(
        "{what:<28} spool {s:>10.0} msg/s   rdkafka {k:>10.0} msg/s   spool overhead {overhead:>5.1}% (target <= 20%)"
    );
}

/// Spool: produce, then consume; returns (produce, consume) rates in msg/s.
async fn spool_side(servers: &str, topic: &str, count: usize) -> (f64, f64) {
    let mq = Spool::open(&format!(
        "Mode=Kafka;Bootstrap Servers={servers};Kafka.session.timeout.ms=6000"
    ))
    .expect("open");
    let payload = bytes::Bytes::from(vec![7u8; PAYLOAD]);
    // One record first, on both sides: connections and the producer id before the clock.
    mq.publish(topic, b"warm-up".to_vec(), &Headers::new())
        .await
        .expect("warm-up");
    let start = Instant::now();
    let mut done = 0;
    while done < count {
        let msgs: Vec<(bytes::Bytes, Headers)> = (0..BATCH.min(count - done))
            .map(|_| (payload.clone(), Headers::new()))
            .collect();
        done += msgs.len();
        mq.publish_batch(topic, msgs).await.expect("publish");
    }
    let produce = count as f64 / start.elapsed().as_secs_f64();
    // The mock cluster keeps only the tail of a partition (about the last 47,000 records
    // of 100 B): consume what it still holds.
    let info = mq.topic_info(topic).expect("topic_info");
    let count = usize::try_from(info.messages).expect("fits");
    let mut c = mq
        .consumer(topic, "bench")
        .manual_ack()
        .max_in_flight(COMMIT_EVERY)
        .build()
        .expect("consumer");
    let mut got = 0;
    let mut start = None;
    let (mut in_recv, mut in_ack) = (Duration::ZERO, Duration::ZERO);
    let mut nb = 0;
    while got < count {
        let t = Instant::now();
        let Ok(batch) =
            tokio::time::timeout(Duration::from_secs(30), c.recv_batch(COMMIT_EVERY)).await
        else {
            let gi = mq.group_info(topic, "bench").expect("group_info");
            panic!("stalled after {got} records: {gi:?}");
        };
        let batch = batch.expect("recv");
        if start.is_some() {
            in_recv += t.elapsed();
        }
        start.get_or_insert_with(Instant::now);
        got += batch.len();
        nb += 1;
        let t = Instant::now();
        c.ack_all(batch).await.expect("ack_all");
        in_ack += t.elapsed();
    }
    if std::env::var_os("SPOOL_BENCH_DEBUG").is_some() {
        eprintln!(
            "spool consume: {in_recv:?} in recv_batch, {in_ack:?} in ack_all; {nb} batches, {got} records"
        );
    }
    let consume = got as f64 / start.map_or(1e-9, |s| s.elapsed().as_secs_f64());
    drop(c);
    mq.close().await.expect("close");
    (produce, consume)
}

/// Plain rdkafka: the same produce, then a poll loop committing every 100.
async fn rdkafka_side(servers: &str, topic: &str, count: usize) -> (f64, f64) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", servers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()
        .expect("producer");
    // Connected and holding its producer id before the clock starts, as spool's is by
    // the time it publishes (its clients are made at open).
    producer
        .send(
            FutureRecord::<(), _>::to(topic).payload(b"warm-up".as_slice()),
            Duration::from_secs(10),
        )
        .await
        .expect("warm-up");
    let payload = vec![7u8; PAYLOAD];
    let start = Instant::now();
    let mut done = 0;
    while done < count {
        let n = BATCH.min(count - done);
        // Polled together (an async fn's body runs only when polled): all enqueued,
        // then their deliveries awaited, as spool's batch does.
        let sends = (0..n).map(|_| {
            let record = FutureRecord::<(), _>::to(topic).payload(&payload);
            producer.send(record, Duration::from_secs(10))
        });
        for r in futures_util::future::join_all(sends).await {
            r.expect("delivered");
        }
        done += n;
    }
    let produce = count as f64 / start.elapsed().as_secs_f64();
    // What the mock cluster still holds, as on spool's side.
    let (lo, hi) = producer
        .client()
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .expect("watermarks");
    let count = usize::try_from(hi - lo).expect("fits");
    let topic = topic.to_owned();
    let servers = servers.to_owned();
    let consume = tokio::task::spawn_blocking(move || plain_consume(&servers, &topic, count))
        .await
        .expect("consumer thread");
    (produce, consume)
}

fn plain_consume(servers: &str, topic: &str, count: usize) -> f64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", servers)
        .set("group.id", "bench")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let mut got = 0;
    let mut start = None;
    let mut in_commit = Duration::ZERO;
    while got < count {
        let Some(m) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let m = m.expect("message");
        start.get_or_insert_with(Instant::now);
        got += 1;
        if got % COMMIT_EVERY == 0 || got == count {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic, m.partition(), Offset::Offset(m.offset() + 1))
                .expect("offset");
            drop(m);
            let t = Instant::now();
            consumer.commit(&tpl, CommitMode::Sync).expect("commit");
            in_commit += t.elapsed();
        }
    }
    let rate = count as f64 / start.map_or(1e-9, |s| s.elapsed().as_secs_f64());
    if std::env::var_os("SPOOL_BENCH_DEBUG").is_some() {
        eprintln!("rdkafka consume: {in_commit:?} in commits");
    }
    drop(consumer);
    rate
}
