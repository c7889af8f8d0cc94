//! Helpers shared by the benches `throughput` and `curves`: the scale and round count
//! from the environment, a run's figures (`Stat`), the runtime and the instance they use,
//! filling a topic, and the raw buffered append that big writes are compared with.
#![allow(
    dead_code,
    reason = "each bench uses a different subset of the helpers and of Stat's fields"
)]

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use spool::{Headers, Options, Spool, SyncPolicy};

/// `SPOOL_BENCH_SCALE`: every count is multiplied by it (default 1).
pub fn scale() -> f64 {
    std::env::var("SPOOL_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0)
}

/// `base` at the bench's scale, at least 10.
pub fn n(base: usize) -> usize {
    ((base as f64 * scale()) as usize).max(10)
}

/// `SPOOL_BENCH_RUNS`: how many times each workload runs (its median is printed).
pub fn runs_or(default: usize) -> usize {
    std::env::var("SPOOL_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[derive(Clone, Copy, Default, Debug)]
pub struct Stat {
    pub msgs_per_s: f64,
    pub mb_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    /// Its rate was set by pacing (a latency workload): its rounds differ in their
    /// latencies, not their throughput, so the median round is the median by p99.
    pub paced: bool,
    /// The share of the machine's CPU time the hypervisor took during the run (`steal`
    /// in `/proc/stat`; none where that file is missing): a virtual machine's latency
    /// tail follows it, spool's or not.
    pub steal_pct: Option<f64>,
}

pub fn stat(count: usize, bytes_each: usize, elapsed: Duration, mut lat_us: Vec<f64>) -> Stat {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let mut s = Stat {
        msgs_per_s: count as f64 / secs,
        mb_per_s: (count * bytes_each) as f64 / secs / 1e6,
        ..Stat::default()
    };
    if !lat_us.is_empty() {
        lat_us.sort_by(f64::total_cmp);
        let q = |p: f64| lat_us[((lat_us.len() as f64 * p) as usize).min(lat_us.len() - 1)];
        s.p50_us = q(0.50);
        s.p99_us = q(0.99);
        s.p999_us = q(0.999);
    }
    s
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

pub fn open(dir: &Path, sync: SyncPolicy) -> Spool {
    let mut o = Options::new(dir);
    o.sync = sync;
    o.dedup_window = 0;
    Spool::open_with(o).expect("open")
}

/// Length-prefixed crc'd records of `size` bytes through a `BufWriter`: the raw ceiling.
pub fn raw_append(count: usize, size: usize) -> Stat {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = std::fs::File::create(dir.path().join("raw.log")).expect("create");
    let payload = vec![7u8; size];
    let start = Instant::now();
    let mut w = std::io::BufWriter::new(file);
    for _ in 0..count {
        w.write_all(&(size as u32).to_le_bytes()).expect("write");
        w.write_all(&crc32fast::hash(&payload).to_le_bytes())
            .expect("write");
        w.write_all(&payload).expect("write");
    }
    w.flush().expect("flush");
    stat(count, size, start.elapsed(), Vec::new())
}

/// Appends `count` records of `size` bytes to `topic`, in `publish_batch`es of 1,000.
pub fn fill(mq: &Spool, rt: &tokio::runtime::Runtime, topic: &str, count: usize, size: usize) {
    let payload = bytes::Bytes::from(vec![7u8; size]);
    rt.block_on(async {
        let mut done = 0;
        while done < count {
            let msgs: Vec<(bytes::Bytes, Headers)> = (0..1000.min(count - done))
                .map(|_| (payload.clone(), Headers::new()))
                .collect();
            done += msgs.len();
            mq.publish_batch(topic, msgs).await.expect("publish");
        }
    });
}

/// Publishes 1 KiB from 64 tasks under `mq` until `window` has passed, task `p`'s `k`-th
/// publish to `names[(p + 64k) mod len]` (issue 31's spread pattern); returns msg/s.
pub fn publish_spread(
    rt: &tokio::runtime::Runtime,
    mq: &Spool,
    names: &std::sync::Arc<Vec<String>>,
    window: Duration,
) -> f64 {
    const PUBLISHERS: usize = 64;
    let payload = bytes::Bytes::from(vec![7u8; 1024]);
    let start = Instant::now();
    let deadline = start + window;
    let done: usize = rt.block_on(async {
        let tasks: Vec<_> = (0..PUBLISHERS)
            .map(|p| {
                let (mq, names, payload) = (mq.clone(), names.clone(), payload.clone());
                tokio::spawn(async move {
                    let h = Headers::new();
                    let mut k = 0;
                    while Instant::now() < deadline {
                        let topic = &names[(p + PUBLISHERS * k) % names.len()];
                        mq.publish(topic, payload.clone(), &h)
                            .await
                            .expect("publish");
                        k += 1;
                    }
                    k
                })
            })
            .collect();
        let mut done = 0;
        for t in tasks {
            done += t.await.expect("publisher");
        }
        done
    });
    done as f64 / start.elapsed().as_secs_f64()
}
