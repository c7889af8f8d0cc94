//! What an idle instance costs (issue 31 point 5): CPU time per 5 s of an instance whose
//! topics hold one record each and nobody publishes or consumes, for 100, 1,000 and
//! 5,000 topics, with no group and with one idle group per topic.
//!
//! `cargo bench --bench idle` (each topic keeps about 2 files open: run it under
//! `ulimit -n 20000`; sizes the limit does not allow are skipped). Speed is measured
//! here, never asserted.

use std::time::{Duration, Instant};

use spool::{Headers, Options, Spool, SyncPolicy};

const IDLE: Duration = Duration::from_secs(5);

/// CPU time (user + system) of this process so far, from `/proc/self/stat`.
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on Linux.
    Some(Duration::from_millis(ticks * 10))
}

/// The soft limit on open files, from `/proc/self/limits`.
fn open_files_limit() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("Max open files"))?;
            line.split_whitespace().nth(3)?.parse().ok()
        })
        .unwrap_or(1024)
}

async fn idle_cost(topics: usize, with_groups: bool) -> Duration {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = Options {
        sync: SyncPolicy::None,
        ..Options::new(dir.path())
    };
    let mq = Spool::open_with(o).expect("open");
    for i in 0..topics {
        let topic = format!("t{i}");
        mq.publish(&topic, b"x".to_vec(), &Headers::new())
            .await
            .expect("publish");
        if with_groups {
            // A group with durable state, then left alone.
            mq.consumer(&topic, "g").build().expect("consumer");
        }
    }
    // Let the work of the set-up (commits, seals) finish first.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = cpu_time().expect("/proc/self/stat");
    let start = Instant::now();
    tokio::time::sleep(IDLE).await;
    let spent = cpu_time().expect("/proc/self/stat") - before;
    let spent = spent.mul_f64(IDLE.as_secs_f64() / start.elapsed().as_secs_f64());
    mq.close().await.expect("close");
    spent
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let limit = open_files_limit();
    println!("CPU time of an idle instance per {IDLE:?} (open-files limit {limit})");
    for topics in [100usize, 1_000, 5_000] {
        if (topics as u64) * 3 + 100 > limit {
            println!("{topics:>6} topics: skipped (raise `ulimit -n`)");
            continue;
        }
        for with_groups in [false, true] {
            let spent = idle_cost(topics, with_groups).await;
            println!(
                "{topics:>6} topics, {:<14} {:>7.1} ms ({:.2}% of a core)",
                if with_groups {
                    "a group each:"
                } else {
                    "no groups:"
                },
                spent.as_secs_f64() * 1000.0,
                100.0 * spent.as_secs_f64() / IDLE.as_secs_f64()
            );
        }
    }
}
