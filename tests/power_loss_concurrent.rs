//! Power cuts under `Sync=Always` with concurrent publishers sharing fsyncs (review 31):
//! publishes and batches from several tasks, message ids, rolls of small segments and
//! retention with kept files, a cut at a random file operation; and a failed shared fsync
//! followed by a same-boot reopen and a cut. Every publish that returned `Ok` is in the
//! image with its payload, offsets dense, and so is every record a reader saw before the
//! cut (under `Always` readers see only durable records).
//! `SPOOL_POWER_LOSS_CONCURRENT_RUNS` seeds (30).

use std::path::Path;
use std::time::Duration;

use spool::testing::{SimFs, without_background_work};
use spool::{Headers, Options, Spool, SyncPolicy};

fn first_segment(topic: &str) -> String {
    format!("/data/topics/{topic}/{:020}.log", 0)
}

fn always() -> Options {
    Options {
        sync: SyncPolicy::Always,
        ..without_background_work(Options::new("/data"))
    }
}

/// Six tasks publishing one at a time and in batches of three, a reader tailing the log,
/// a cut somewhere in the first 420 file operations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_always_publishes_survive_a_power_cut() {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    let runs: u64 = std::env::var("SPOOL_POWER_LOSS_CONCURRENT_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let opts = || {
        let mut o = always();
        o.segment_bytes = 2048;
        o.retention_bytes = 4096;
        o.dedup_window = 8;
        o.index_interval_bytes = 256;
        o
    };
    let mut failures = Vec::new();
    for seed in 1..=runs {
        let fs = SimFs::new(seed);
        let _clear = fs.faults_cleared_on_drop();
        fs.cut_at_op(20 + (seed * 7919) % 400);
        let mq = Spool::open_simulated(opts(), &fs).expect("open");
        let acked: Arc<Mutex<BTreeMap<u64, Vec<u8>>>> = Arc::default();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (mq, fs, done) = (mq.clone(), fs.clone(), done.clone());
            tokio::spawn(async move {
                let mut seen = BTreeMap::new();
                let mut from = 0;
                while !done.load(std::sync::atomic::Ordering::Acquire) && !fs.is_cut() {
                    let Ok(recs) = mq.fetch("t", from, 64).await else {
                        break;
                    };
                    // Seen before the cut: the records were visible before it happened.
                    if fs.is_cut() {
                        break;
                    }
                    for r in &recs {
                        seen.insert(r.offset(), r.payload().to_vec());
                        from = r.offset() + 1;
                    }
                    tokio::task::yield_now().await;
                }
                seen
            })
        };
        // A slow disk in every other run: syncs wait a little, so that the reader runs
        // while written records wait for theirs.
        let slow_disk = (seed % 2 == 0).then(|| {
            let (fs, done) = (fs.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    fs.hold_syncs(true);
                    std::thread::sleep(Duration::from_micros(300));
                    fs.hold_syncs(false);
                    std::thread::sleep(Duration::from_micros(100));
                }
            })
        });
        let mut tasks = Vec::new();
        for w in 0..6u64 {
            let (mq, fs, acked) = (mq.clone(), fs.clone(), acked.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..40u64 {
                    if fs.is_cut() {
                        return;
                    }
                    let body = format!("w{w}-i{i}-{}", "x".repeat(((i * 13 + w) % 90) as usize))
                        .into_bytes();
                    if (i + w) % 5 == 0 {
                        let batch: Vec<(Vec<u8>, Headers)> = (0..3)
                            .map(|k| {
                                let mut b = body.clone();
                                b.extend(format!("-b{k}").bytes());
                                (b, Headers::new())
                            })
                            .collect();
                        let bodies: Vec<Vec<u8>> = batch.iter().map(|(b, _)| b.clone()).collect();
                        if let Ok(os) = mq.publish_batch("t", batch).await
                            && !fs.is_cut()
                        {
                            let mut a = acked.lock().unwrap();
                            for (o, b) in os.into_iter().zip(bodies) {
                                a.insert(o, b);
                            }
                        }
                    } else {
                        let mut h = Headers::new();
                        if i % 3 == 0 {
                            h.insert("message-id".into(), format!("id-{w}-{}", i / 6));
                        }
                        if let Ok(o) = mq.publish("t", body.clone(), &h).await
                            && !fs.is_cut()
                        {
                            acked.lock().unwrap().entry(o).or_insert(body);
                        }
                    }
                    if i % 17 == 0 {
                        let _ = mq.apply_retention();
                    }
                }
            }));
        }
        for t in tasks {
            t.await.expect("task");
        }
        done.store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = slow_disk {
            t.join().expect("slow disk");
        }
        let seen = reader.await.expect("reader");
        let _ = mq.close().await;
        let Some(image) = fs.crash_image() else {
            continue;
        };
        let again = Spool::open_simulated(opts(), &image).expect("reopen");
        let info = again.topic_info("t").expect("info");
        let recs = again.fetch("t", 0, usize::MAX).await.expect("fetch");
        for (i, r) in recs.iter().enumerate() {
            if r.offset() != info.earliest + i as u64 {
                failures.push(format!("seed {seed}: not dense at {}", r.offset()));
            }
        }
        let acked = std::mem::take(&mut *acked.lock().unwrap());
        for (what, records) in [("acknowledged", &acked), ("seen", &seen)] {
            for (o, b) in records.iter() {
                if *o < info.earliest {
                    continue;
                }
                match recs.get((o - info.earliest) as usize) {
                    Some(r) if r.payload()[..] == b[..] => {}
                    Some(_) => failures.push(format!(
                        "seed {seed}: {what} offset {o} has another payload"
                    )),
                    None => {
                        failures.push(format!("seed {seed}: {what} {o} lost (next {})", info.next))
                    }
                }
            }
        }
        again.close().await.expect("close");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// One fsync fails under concurrent publishers sharing syncs; the process is killed and
/// reopened in the same boot, publishes on, and the power is cut: every acknowledged
/// publish of both lives is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_shared_fsync_a_same_boot_reopen_and_a_power_cut_lose_nothing() {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    let runs: u64 = std::env::var("SPOOL_POWER_LOSS_CONCURRENT_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let mut failures = Vec::new();
    for seed in 1..=runs {
        let fs = SimFs::new(seed);
        let _clear = fs.faults_cleared_on_drop();
        let mq = Spool::open_simulated(always(), &fs).expect("open");
        let acked: Arc<Mutex<BTreeMap<u64, Vec<u8>>>> = Arc::default();
        let publish_some = |mq: Spool, tag: &'static str| {
            let acked = acked.clone();
            (0..4u64)
                .map(|w| {
                    let (mq, acked) = (mq.clone(), acked.clone());
                    tokio::spawn(async move {
                        for i in 0..30u64 {
                            let body = format!("{tag}-w{w}-i{i}").into_bytes();
                            let mut h = Headers::new();
                            if i % 4 == 0 {
                                h.insert("message-id".into(), format!("{tag}-{w}-{}", i / 8));
                            }
                            if let Ok(o) = mq.publish("t", body.clone(), &h).await {
                                acked.lock().unwrap().entry(o).or_insert(body);
                            }
                        }
                    })
                })
                .collect::<Vec<_>>()
        };
        let tasks = publish_some(mq.clone(), "first");
        tokio::time::sleep(Duration::from_micros(200 * (seed % 10))).await;
        fs.fail_one_sync_of(Path::new(&first_segment("t")));
        for t in tasks {
            t.await.expect("task");
        }
        let image = fs.process_crash_now();
        drop(mq);
        let mq = Spool::open_simulated(always(), &image).expect("reopen same boot");
        for t in publish_some(mq.clone(), "second") {
            t.await.expect("task");
        }
        let cut = image.crash_now();
        drop(mq);
        let again = Spool::open_simulated(always(), &cut).expect("reopen after cut");
        let recs = again.fetch("t", 0, usize::MAX).await.expect("fetch");
        for (o, b) in acked.lock().unwrap().iter() {
            match recs.get(*o as usize) {
                Some(r) if r.payload()[..] == b[..] => {}
                Some(r) => failures.push(format!(
                    "seed {seed}: offset {o} has {:?}, acknowledged {:?}",
                    String::from_utf8_lossy(r.payload()),
                    String::from_utf8_lossy(b)
                )),
                None => failures.push(format!(
                    "seed {seed}: acknowledged {o} lost ({} kept)",
                    recs.len()
                )),
            }
        }
        again.close().await.expect("close");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
