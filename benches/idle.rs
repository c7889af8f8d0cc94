//! What an idle instance costs (issue 31 point 5): CPU time per 5 s of an instance whose
//! topics hold one record each and nobody publishes or consumes, for 1, 100, 1,000 and
//! 5,000 topics, with no group and with one idle group per topic; and the descriptors the
//! process holds then (counted in `/proc/self/fd`); and the disk that quiet topics take
//! under `Sync=Always`, where each active segment gets zeros ahead of its records.
//!
//! `cargo bench --bench idle`, at the default limit on open files: the instance keeps at
//! most `OPEN_FILES_MAX` (512) segment files open whatever the number of topics (idle
//! topics close theirs). Speed is measured here, never asserted.

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

/// Descriptors this process has open now (less the one that counts them).
fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count().saturating_sub(1))
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

/// CPU time over `IDLE`, descriptors open then, and descriptors open after a reopen.
async fn idle_cost(topics: usize, with_groups: bool) -> (Duration, usize, usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = Options {
        sync: SyncPolicy::None,
        ..Options::new(dir.path())
    };
    let mq = Spool::open_with(o.clone()).expect("open");
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
    let descriptors = open_descriptors();
    let before = cpu_time().expect("/proc/self/stat");
    let start = Instant::now();
    tokio::time::sleep(IDLE).await;
    let spent = cpu_time().expect("/proc/self/stat") - before;
    let spent = spent.mul_f64(IDLE.as_secs_f64() / start.elapsed().as_secs_f64());
    mq.close().await.expect("close");
    drop(mq);
    let mq = Spool::open_with(o).expect("reopen");
    let reopened = open_descriptors();
    mq.close().await.expect("close");
    (spent, descriptors, reopened)
}

/// Disk blocks (KiB) under `dir`, as `du -sk` counts them.
fn disk_kib(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut kib = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(m) = e.metadata() else { continue };
        kib += m.blocks() / 2;
        if m.is_dir() {
            kib += disk_kib(&e.path());
        }
    }
    kib
}

/// Disk taken by `topics` topics of one 1 KiB record each, under `Sync=Always`.
async fn quiet_disk(topics: usize) -> u64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = Options {
        sync: SyncPolicy::Always,
        ..Options::new(dir.path())
    };
    let mq = Spool::open_with(o).expect("open");
    for i in 0..topics {
        let topic = format!("t{i}");
        mq.publish(&topic, vec![1u8; 1024], &Headers::new())
            .await
            .expect("publish");
    }
    let kib = disk_kib(dir.path());
    mq.close().await.expect("close");
    kib
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    for topics in [1usize, 1_000] {
        let kib = quiet_disk(topics).await;
        println!("Sync=Always, {topics:>5} topics of one 1 KiB record: {kib} KiB on disk");
    }
    let limit = open_files_limit();
    println!("CPU time of an idle instance per {IDLE:?} (open-files limit {limit})");
    println!(
        "descriptors open before any instance: {}",
        open_descriptors()
    );
    for topics in [1usize, 100, 1_000, 5_000] {
        for with_groups in [false, true] {
            let (spent, descriptors, reopened) = idle_cost(topics, with_groups).await;
            println!(
                "{topics:>6} topics, {:<14} {:>7.1} ms ({:.2}% of a core); \
                 descriptors open: {descriptors}, after a reopen {reopened}",
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
