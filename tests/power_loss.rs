//! Power loss at every sync point and at random points in between never breaks a promise:
//! acknowledged publishes are there, offsets stay dense, cursors never fall behind a
//! durable ack, dead-letter copies are never duplicated, the catalog never points past the
//! log end.
//!
//! The workload runs on the simulated file system (`spool::testing::SimFs`), which keeps a
//! live and a durable image and takes a crash image at the cut point (durable data plus a
//! random prefix of unsynced writes, the last one possibly torn). Every failure prints the
//! seed and cut point; replay one with
//! `SPOOL_POWER_LOSS_SEED=<seed> SPOOL_POWER_LOSS_CUT=<op> cargo test --release --test power_loss`.
//! `SPOOL_POWER_LOSS_RUNS=<n>` sets how many cut points the default test tries.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use spool::testing::{SimFs, without_background_work};
use spool::{Headers, OffsetReset, Options, Spool, SyncPolicy};

const TOPICS: [&str; 2] = ["a", "b"];
const GROUP: &str = "g";
const STEPS: usize = 200;

fn options() -> Options {
    let mut o = Options::new("/data");
    o.sync = SyncPolicy::Always;
    o.segment_bytes = 1024;
    o.retention_bytes = 1500;
    o.max_delivery_attempts = 2;
    o.dedup_window = 16;
    o.index_interval_bytes = 128;
    without_background_work(o)
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What the workload was told before the cut.
#[derive(Default, Debug)]
struct Promises {
    /// topic -> offset -> payload, for publishes that returned Ok before the cut.
    published: BTreeMap<String, BTreeMap<u64, Vec<u8>>>,
    /// The group's cursor as of the last acknowledged ack/dead-letter/reset, and whether
    /// the operation in progress at the cut could move it anywhere (a reset).
    cursor: u64,
    uncertain_cursor: bool,
    /// Earliest offset of each topic observed after the last operation.
    earliest_seen: BTreeMap<String, u64>,
    /// Dead-letterings acknowledged per original offset, and the offset of a nack still in
    /// progress at the cut (it may or may not have produced a copy).
    dead_letters: BTreeMap<u64, usize>,
    nack_in_progress: Option<u64>,
}

fn payload(rng: &mut Rng, step: usize) -> Vec<u8> {
    let len = 8 + rng.below(60) as usize;
    let mut p = format!("step-{step}-").into_bytes();
    p.resize(len, b'x');
    p
}

/// Runs the workload until the cut happens (or to the end). Returns the promises.
async fn workload(fs: &SimFs, seed: u64) -> Promises {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut p = Promises::default();
    let Ok(mq) = Spool::open_simulated(options(), fs) else {
        return p;
    };
    let Ok(mut consumer) = mq.consumer("a", GROUP).manual_ack().build() else {
        return p;
    };
    for step in 0..STEPS {
        if fs.is_cut() {
            break;
        }
        let topic = TOPICS[rng.below(2) as usize];
        match rng.below(10) {
            0..=3 => {
                let body = payload(&mut rng, step);
                let mut h = Headers::new();
                if rng.below(3) == 0 {
                    h.insert("message-id".into(), format!("id-{}", rng.below(20)));
                }
                let r = mq.publish(topic, body.clone(), &h).await;
                if let Ok(o) = r
                    && !fs.is_cut()
                {
                    // A de-duplication hit returns an earlier offset with an earlier body.
                    p.published
                        .entry(topic.to_owned())
                        .or_default()
                        .entry(o)
                        .or_insert(body);
                }
            }
            4 => {
                let n = 1 + rng.below(5) as usize;
                let batch: Vec<(Vec<u8>, Headers)> = (0..n)
                    .map(|_| (payload(&mut rng, step), Headers::new()))
                    .collect();
                let bodies: Vec<Vec<u8>> = batch.iter().map(|(b, _)| b.clone()).collect();
                if let Ok(offsets) = mq.publish_batch(topic, batch).await
                    && !fs.is_cut()
                {
                    for (o, b) in offsets.into_iter().zip(bodies) {
                        p.published
                            .entry(topic.to_owned())
                            .or_default()
                            .insert(o, b);
                    }
                }
            }
            5..=7 => {
                let Ok(Some(d)) = consumer.recv_timeout(Duration::from_millis(1)).await else {
                    continue;
                };
                let offset = d.offset();
                if rng.below(3) == 0 {
                    match d.nack("simulated failure").await {
                        Ok(r) if !fs.is_cut() => {
                            if r.dead_lettered {
                                p.cursor = r.next_offset;
                                *p.dead_letters.entry(offset).or_default() += 1;
                            }
                        }
                        _ => p.nack_in_progress = Some(offset),
                    }
                } else if d.ack().await.is_ok() && !fs.is_cut() {
                    p.cursor = p.cursor.max(offset + 1);
                }
            }
            8 => {
                let to = match rng.below(4) {
                    0 => OffsetReset::Earliest,
                    1 => OffsetReset::Latest,
                    2 => OffsetReset::Explicit(rng.below(40)),
                    _ => OffsetReset::Time(std::time::SystemTime::now()),
                };
                match mq.reset_offset("a", GROUP, to).await {
                    Ok(c) if !fs.is_cut() => p.cursor = c,
                    _ => p.uncertain_cursor = true,
                }
            }
            _ => {
                let _ = mq.apply_retention();
            }
        }
        for t in TOPICS {
            if let Ok(i) = mq.topic_info(t) {
                p.earliest_seen.insert(t.to_owned(), i.earliest);
            }
        }
    }
    drop(consumer);
    // The crash image is already taken: closing now only touches the live file system.
    let _ = mq.close().await;
    p
}

/// Reopens the crash image and checks every promise. Returns a description of the first
/// broken one.
async fn verify(image: &SimFs, p: &Promises) -> Result<(), String> {
    let mq = Spool::open_simulated(options(), image).map_err(|e| format!("reopen failed: {e}"))?;
    for t in TOPICS {
        let info = mq.topic_info(t).map_err(|e| e.to_string())?;
        let records = mq
            .fetch(t, 0, usize::MAX)
            .await
            .map_err(|e| format!("{t}: read failed: {e}"))?;
        for (i, r) in records.iter().enumerate() {
            if r.offset() != info.earliest + i as u64 {
                return Err(format!("{t}: offsets not dense at {}", r.offset()));
            }
        }
        if records.len() as u64 != info.next - info.earliest {
            return Err(format!(
                "{t}: {} records between earliest {} and next {}",
                records.len(),
                info.earliest,
                info.next
            ));
        }
        if let Some(seen) = p.earliest_seen.get(t)
            && info.earliest > *seen
        {
            return Err(format!(
                "{t}: earliest {} is past what retention had deleted ({seen})",
                info.earliest
            ));
        }
        for (o, body) in p.published.get(t).into_iter().flatten() {
            if *o < info.earliest {
                continue;
            }
            let Some(r) = records.get((o - info.earliest) as usize) else {
                return Err(format!(
                    "{t}: acknowledged offset {o} missing (next {})",
                    info.next
                ));
            };
            if &r.payload()[..] != body.as_slice() {
                return Err(format!("{t}: offset {o} has another payload"));
            }
        }
    }
    let g = mq.group_info("a", GROUP).map_err(|e| e.to_string())?;
    if g.cursor > g.next {
        return Err(format!("cursor {} past the log end {}", g.cursor, g.next));
    }
    if !p.uncertain_cursor && g.cursor < p.cursor {
        return Err(format!(
            "cursor {} fell behind the durable cursor {}",
            g.cursor, p.cursor
        ));
    }
    let dlq = mq
        .fetch("a.dlq", 0, usize::MAX)
        .await
        .map_err(|e| format!("dlq read failed: {e}"))?;
    let mut copies: BTreeMap<u64, usize> = BTreeMap::new();
    for r in &dlq {
        let o: u64 = r
            .headers()
            .get("x-original-offset")
            .and_then(|v| v.parse().ok())
            .ok_or("a dead-letter copy without x-original-offset")?;
        *copies.entry(o).or_default() += 1;
    }
    for (o, n) in copies {
        // A reset may dead-letter the same offset again later: count acknowledged events.
        let allowed = p.dead_letters.get(&o).copied().unwrap_or(0)
            + usize::from(p.nack_in_progress == Some(o));
        if n > allowed {
            return Err(format!(
                "offset {o} has {n} dead-letter copies for {allowed} dead-letterings"
            ));
        }
    }
    mq.close()
        .await
        .map_err(|e| format!("close after reopen: {e}"))?;
    Ok(())
}

async fn run_cut(seed: u64, cut: u64) -> Result<(), String> {
    let fs = SimFs::new(seed);
    fs.cut_at_op(cut);
    let promises = workload(&fs, seed).await;
    let Some(image) = fs.crash_image() else {
        return Ok(());
    };
    verify(&image, &promises).await
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_promise_holds_after_a_power_cut_at_any_point() {
    let seed = env_u64("SPOOL_POWER_LOSS_SEED").unwrap_or(0x5eed_0001);
    if let Some(cut) = env_u64("SPOOL_POWER_LOSS_CUT") {
        run_cut(seed, cut)
            .await
            .unwrap_or_else(|e| panic!("seed {seed} cut {cut}: {e}"));
        return;
    }
    // A full run without a cut tells how many operations there are.
    let full = SimFs::new(seed);
    let p = workload(&full, seed).await;
    eprintln!(
        "power loss: full run published {:?} records, cursor {}, {} dead-letterings, earliest {:?}",
        p.published.values().map(BTreeMap::len).collect::<Vec<_>>(),
        p.cursor,
        p.dead_letters.values().sum::<usize>(),
        p.earliest_seen
    );
    let total = full.ops();
    assert!(
        total > 200,
        "the workload is too small to mean anything ({total} ops)"
    );
    // Every sync point (cut just before it lands, and just after), plus random points.
    let runs = env_u64("SPOOL_POWER_LOSS_RUNS").unwrap_or(200);
    let mut rng = Rng(seed);
    let mut cuts: Vec<u64> = full
        .sync_points()
        .into_iter()
        .flat_map(|op| [op, op + 1])
        .chain((0..runs).map(|_| 1 + rng.below(total)))
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    eprintln!(
        "power loss: seed {seed}, {total} operations, {} sync points, {} cut points",
        full.sync_points().len(),
        cuts.len()
    );
    let mut failures = Vec::new();
    for cut in &cuts {
        if let Err(e) = run_cut(seed, *cut).await {
            failures.push(format!("seed {seed} cut {cut}: {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cut points broke a promise:\n{}",
        failures.len(),
        cuts.len(),
        failures.join("\n")
    );
}

/// The long campaign: many seeds. `SPOOL_POWER_LOSS_SEEDS=<n>` (default 20).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run with --ignored"]
async fn power_loss_campaign_over_many_seeds() {
    let seeds = env_u64("SPOOL_POWER_LOSS_SEEDS").unwrap_or(20);
    let mut failures = Vec::new();
    let mut checked = 0usize;
    for seed in 1..=seeds {
        let full = SimFs::new(seed);
        workload(&full, seed).await;
        let mut rng = Rng(seed);
        let total = full.ops();
        let cuts: BTreeSet<u64> = full
            .sync_points()
            .into_iter()
            .flat_map(|op| [op, op + 1])
            .chain((0..100).map(|_| 1 + rng.below(total)))
            .collect();
        for cut in cuts {
            checked += 1;
            if let Err(e) = run_cut(seed, cut).await {
                failures.push(format!("seed {seed} cut {cut}: {e}"));
            }
        }
    }
    eprintln!("power loss campaign: {seeds} seeds, {checked} cut points");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
