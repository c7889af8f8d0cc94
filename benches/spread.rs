//! Issue 31 point 2 under the common descriptor limit: 64 tasks publish 1 KiB one at a
//! time under `Sync=Always`, task `p`'s `k`-th publish to topic `(p + 64k) mod topics`,
//! for 1 / 10 / 100 / 1,000 / 5,000 topics. Each point runs in a child process whose
//! soft `RLIMIT_NOFILE` is 1,024, the common default, so spool keeps at most 512 segment
//! files open (`benches/curves.rs` raises the limit for its raw baseline instead).
//! The topics are made before the timed window, by the same instance.
//!
//! `SPOOL_BENCH_RUNS=3 cargo bench --bench spread` (median of the runs; 3 by default);
//! `SPOOL_BENCH_SECS` sets the window (2 s).

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{open, rt, runs_or};
use spool::{Headers, SyncPolicy};

const POINTS: [usize; 5] = [1, 10, 100, 1_000, 5_000];
const CHILD_ENV: &str = "SPOOL_BENCH_SPREAD_TOPICS";
const SOFT_LIMIT: u64 = 1_024;

fn window() -> Duration {
    let secs = std::env::var("SPOOL_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    Duration::from_secs_f64(secs)
}

fn main() {
    if let Ok(topics) = std::env::var(CHILD_ENV) {
        child(topics.parse().expect("topics"));
        return;
    }
    let runs = runs_or(3);
    println!(
        "64 publishers x 1 KiB under Sync=Always, soft limit {SOFT_LIMIT} descriptors, median of {runs}"
    );
    let mut first = None;
    for topics in POINTS {
        let mut rates: Vec<f64> = (0..runs).map(|_| run_child(topics)).collect();
        rates.sort_by(f64::total_cmp);
        let median = rates[rates.len() / 2];
        let base = *first.get_or_insert(median);
        println!(
            "{topics:>6} topics: {:>9.1} k msg/s  ({:.2}x one topic; runs {})",
            median / 1e3,
            median / base,
            rates
                .iter()
                .map(|r| format!("{:.1} k", r / 1e3))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// Runs the bench binary again as a child for one point; its msg/s.
fn run_child(topics: usize) -> f64 {
    let out = Command::new(std::env::current_exe().expect("exe"))
        .env(CHILD_ENV, topics.to_string())
        .output()
        .expect("child");
    assert!(
        out.status.success(),
        "child: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("the child prints its rate")
}

/// One point: lowers the soft limit before spool opens, makes the topics, publishes for
/// the window, prints msg/s.
fn child(topics: usize) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    limit.current = Some(SOFT_LIMIT);
    setrlimit(Resource::Nofile, limit).expect("setrlimit");
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = rt();
    let mq = open(dir.path(), SyncPolicy::Always);
    let names: Arc<Vec<String>> = Arc::new((0..topics).map(|i| format!("t{i}")).collect());
    rt.block_on(async {
        for n in names.iter() {
            mq.publish(n, vec![7u8; 100], &Headers::new())
                .await
                .expect("create");
        }
    });
    let rate = common::publish_spread(&rt, &mq, &names, window());
    println!("{rate}");
    rt.block_on(mq.close()).expect("close");
}
