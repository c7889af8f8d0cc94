//! What key-ordered parallelism buys (issue 27 point 3): a handler that takes 1 ms,
//! 10,000 records over 100 keys, handled
//! - one at a time (`max_in_flight(1)`, the strict order a group has by default), and
//! - 64 at once with per-key order (`max_in_flight(64).key_ordered()`), each delivery
//!   handed to a task of its own (the pattern a user writes: recv, spawn, ack in the task).
//!
//! `cargo bench --bench key_ordered` prints each pattern's time, messages per second and
//! the ratio. `SPOOL_BENCH_SCALE=0.1` shrinks the record count. Both runs check that every
//! key's records were finished in offset order. Speed is measured here, never asserted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spool::consts::MESSAGE_KEY_HEADER;
use spool::{Headers, Spool};

const KEYS: u64 = 100;
const HANDLER: Duration = Duration::from_millis(1);

fn records() -> u64 {
    let scale: f64 = std::env::var("SPOOL_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    ((10_000.0 * scale) as u64).max(KEYS)
}

async fn publish(mq: &Spool, n: u64) {
    let batch: Vec<(Vec<u8>, Headers)> = (0..n)
        .map(|i| {
            let key = format!("customer-{}", i % KEYS);
            let h = Headers::from([(MESSAGE_KEY_HEADER.to_owned(), key)]);
            (format!("order {i}").into_bytes(), h)
        })
        .collect();
    mq.publish_batch("orders", batch).await.expect("publish");
}

/// Finished offsets per key, in the order they were finished.
type Finished = Arc<Mutex<HashMap<String, Vec<u64>>>>;

fn finish(done: &Finished, d: &spool::Delivery) {
    let key = d.headers()[MESSAGE_KEY_HEADER].clone();
    done.lock()
        .unwrap()
        .entry(key)
        .or_default()
        .push(d.offset());
}

async fn one_at_a_time(mq: &Spool, n: u64, done: &Finished) {
    let mut c = mq
        .consumer("orders", "one-at-a-time")
        .manual_ack()
        .build()
        .expect("consumer");
    for _ in 0..n {
        let d = c.recv().await.expect("recv");
        tokio::time::sleep(HANDLER).await;
        finish(done, &d);
        d.ack().await.expect("ack");
    }
}

async fn key_ordered(mq: &Spool, n: u64, done: &Finished) {
    let mut c = mq
        .consumer("orders", "key-ordered")
        .manual_ack()
        .max_in_flight(64)
        .key_ordered()
        .build()
        .expect("consumer");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let d = c.recv().await.expect("recv");
        let done = done.clone();
        tasks.spawn(async move {
            tokio::time::sleep(HANDLER).await;
            finish(&done, &d);
            d.ack().await.expect("ack");
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

fn check_order(what: &str, done: &Finished, n: u64) {
    let done = done.lock().unwrap();
    let total: usize = done.values().map(Vec::len).sum();
    assert_eq!(total as u64, n, "{what}: every record finished once");
    for (key, offsets) in done.iter() {
        assert!(offsets.is_sorted(), "{what}: key {key} out of order");
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n = records();
    let dir = tempfile::tempdir().expect("tempdir");
    let mq = Spool::open(&format!("Data Source={}", dir.path().display())).expect("open");
    publish(&mq, n).await;
    println!("{n} records over {KEYS} keys, a handler of {HANDLER:?}, Sync=Always");
    let mut times = Vec::new();
    for (what, strict) in [
        ("max_in_flight(1)", true),
        ("max_in_flight(64).key_ordered()", false),
    ] {
        let done = Finished::default();
        let start = Instant::now();
        if strict {
            one_at_a_time(&mq, n, &done).await;
        } else {
            key_ordered(&mq, n, &done).await;
        }
        let took = start.elapsed();
        check_order(what, &done, n);
        println!(
            "{what:<34} {:>8.2} s  {:>8.0} msg/s",
            took.as_secs_f64(),
            n as f64 / took.as_secs_f64()
        );
        times.push(took);
    }
    println!(
        "key-ordered parallelism: {:.1}x the strict order's rate",
        times[0].as_secs_f64() / times[1].as_secs_f64()
    );
    mq.close().await.expect("close");
}
