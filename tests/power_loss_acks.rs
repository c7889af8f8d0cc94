//! Concurrent durable acks under power loss: many acks of one group share one catalog
//! commit (the committer takes the group's image once for all of them), and every ack
//! that returned `Ok` before the cut must survive it; nothing unacked may be lost.
//!
//! `SPOOL_POWER_LOSS_ACK_SEEDS=<n>` runs more seeds (default 2).

use std::collections::BTreeSet;
use std::time::Duration;

use spool::testing::{SimFs, without_background_work};
use spool::{Headers, Options, Spool, SyncPolicy};

const RECORDS: u64 = 240;

fn options() -> Options {
    let mut o = Options::new("/data");
    o.sync = SyncPolicy::Always;
    o.segment_bytes = 4096;
    // No background commits: only the acks decide what the catalog holds.
    without_background_work(o)
}

/// What the workload knows at the cut.
#[derive(Default)]
struct Acks {
    /// Acks that returned `Ok` before the cut: durable.
    done: BTreeSet<u64>,
    /// Acks that were started: an ack still out at the cut may or may not have landed.
    started: BTreeSet<u64>,
}

/// Publishes, then acks windows of up to 48 deliveries concurrently, releasing every
/// seventh one.
async fn workload(fs: &SimFs) -> Option<Acks> {
    let mq = Spool::open_simulated(options(), fs).ok()?;
    let batch: Vec<(Vec<u8>, Headers)> = (0..RECORDS)
        .map(|i| (i.to_le_bytes().to_vec(), Headers::new()))
        .collect();
    mq.publish_batch("t", batch).await.ok()?;
    if fs.is_cut() {
        return None;
    }
    let mut acks = Acks::default();
    let mut c = mq
        .consumer("t", "g")
        .manual_ack()
        .max_in_flight(48)
        .build()
        .ok()?;
    let mut round = 0u64;
    while !fs.is_cut() && (acks.done.len() as u64) < RECORDS {
        round += 1;
        let mut window = Vec::new();
        while let Ok(Some(d)) = c.recv_timeout(Duration::from_millis(2)).await {
            window.push(d);
            if window.len() == 48 {
                break;
            }
        }
        if window.is_empty() {
            break;
        }
        // Acks in an order that leaves gaps above the floor, with some released.
        window.reverse();
        let window_acks = window.into_iter().enumerate().filter_map(|(i, d)| {
            if (i as u64 + round).is_multiple_of(7) {
                drop(d);
                return None;
            }
            let o = d.offset();
            acks.started.insert(o);
            Some(async move { (o, d.ack().await.is_ok() && !fs.is_cut()) })
        });
        let outcomes = futures_util::future::join_all(window_acks).await;
        for (o, ok) in outcomes {
            if ok {
                acks.done.insert(o);
            }
        }
    }
    drop(c);
    let _ = mq.close().await;
    Some(acks)
}

/// Reopens the crash image: no acked offset is delivered again; every offset whose ack was
/// never started is.
async fn verify(image: &SimFs, acks: &Acks) -> Result<(), String> {
    let mq = Spool::open_simulated(options(), image).map_err(|e| format!("reopen: {e}"))?;
    let mut c = mq
        .consumer("t", "g")
        .manual_ack()
        .max_in_flight(1024)
        .build()
        .map_err(|e| format!("consumer: {e}"))?;
    let mut seen = BTreeSet::new();
    let mut held = Vec::new();
    while let Ok(Some(d)) = c.recv_timeout(Duration::from_millis(20)).await {
        if acks.done.contains(&d.offset()) {
            return Err(format!(
                "offset {} was acked, yet delivered again",
                d.offset()
            ));
        }
        seen.insert(d.offset());
        held.push(d);
    }
    let missing: Vec<u64> = (0..RECORDS)
        .filter(|o| !acks.started.contains(o) && !seen.contains(o))
        .collect();
    if !missing.is_empty() {
        return Err(format!("never acked, yet not delivered: {missing:?}"));
    }
    drop(held);
    drop(c);
    mq.close().await.map_err(|e| format!("close: {e}"))
}

async fn campaign(seed: u64) -> (usize, Vec<String>) {
    let full = SimFs::new(seed);
    let all = workload(&full).await.expect("full run");
    assert_eq!(
        all.done.len() as u64,
        RECORDS,
        "the full run acks everything"
    );
    let total = full.ops();
    let cuts: BTreeSet<u64> = full
        .sync_points()
        .into_iter()
        .flat_map(|op| [op, op + 1])
        .chain((1..=40).map(|i| i * total / 41))
        .collect();
    let mut failures = Vec::new();
    for &cut in &cuts {
        let fs = SimFs::new(seed);
        fs.cut_at_op(cut);
        let Some(acks) = workload(&fs).await else {
            continue;
        };
        let Some(image) = fs.crash_image() else {
            continue;
        };
        if let Err(e) = verify(&image, &acks).await {
            failures.push(format!("seed {seed} cut {cut}: {e}"));
        }
    }
    (cuts.len(), failures)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_durable_acks_survive_a_power_cut() {
    let seeds: u64 = std::env::var("SPOOL_POWER_LOSS_ACK_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let mut checked = 0;
    let mut failures = Vec::new();
    for seed in 1..=seeds {
        let (n, f) = campaign(seed).await;
        checked += n;
        failures.extend(f);
    }
    eprintln!("power loss (concurrent acks): {seeds} seeds, {checked} cut points");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
