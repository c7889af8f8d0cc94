//! Power cuts under `Sync=Always` with publishers spread over many topics (issue 31
//! point 2): their rounds share one sync of the journal, and the journal is checkpointed
//! often (the simulated file system makes it small). Rolls of small segments, retention
//! with kept files, message ids, a cut at a random file operation. Every publish that
//! returned `Ok` is in the image, in its topic, at its offset, with its payload; so is
//! every record a reader saw before the cut. Also across a process crash and a reopen in
//! the same boot, and a reopen under another sync policy (the journal is copied back
//! whatever the policy).
//! `SPOOL_POWER_LOSS_TOPICS_RUNS` seeds (40).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use spool::testing::{SimFs, without_background_work};
use spool::{Headers, Options, Spool, SyncPolicy};

const TOPICS: usize = 10;
const TASKS: u64 = 8;

/// Acknowledged (or seen) records: (topic, offset) → payload.
type Records = BTreeMap<(String, u64), Vec<u8>>;

fn runs() -> u64 {
    std::env::var("SPOOL_POWER_LOSS_TOPICS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
}

fn opts(sync: SyncPolicy) -> Options {
    let mut o = without_background_work(Options::new("/data"));
    o.sync = sync;
    o.segment_bytes = 2048;
    o.retention_bytes = 4096;
    o.dedup_window = 8;
    o.index_interval_bytes = 256;
    o
}

fn topic(i: u64) -> String {
    format!("t{}", i % TOPICS as u64)
}

/// `TASKS` tasks, each publishing `count` records (some in batches of three) to the
/// topics in turn; what returned `Ok` before the cut goes into `acked`.
async fn publish_spread(
    mq: &Spool,
    fs: &SimFs,
    tag: &'static str,
    count: u64,
    acked: &Arc<Mutex<Records>>,
) {
    let mut tasks = Vec::new();
    for w in 0..TASKS {
        let (mq, fs, acked) = (mq.clone(), fs.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..count {
                if fs.is_cut() {
                    return;
                }
                let t = topic(w + i);
                let body = format!(
                    "{tag}-w{w}-i{i}-{}",
                    "x".repeat(((i * 13 + w) % 90) as usize)
                );
                if (i + w) % 5 == 0 {
                    let bodies: Vec<Vec<u8>> = (0..3)
                        .map(|k| format!("{body}-b{k}").into_bytes())
                        .collect();
                    let batch = bodies.iter().map(|b| (b.clone(), Headers::new())).collect();
                    if let Ok(os) = mq.publish_batch(&t, batch).await
                        && !fs.is_cut()
                    {
                        let mut a = acked.lock().unwrap();
                        for (o, b) in os.into_iter().zip(bodies) {
                            a.insert((t.clone(), o), b);
                        }
                    }
                } else {
                    let mut h = Headers::new();
                    if i % 3 == 0 {
                        h.insert("message-id".into(), format!("{tag}-{w}-{}", i / 6));
                    }
                    if let Ok(o) = mq.publish(&t, body.clone().into_bytes(), &h).await
                        && !fs.is_cut()
                    {
                        acked
                            .lock()
                            .unwrap()
                            .entry((t, o))
                            .or_insert(body.into_bytes());
                    }
                }
                if i % 17 == 0 {
                    let _ = mq.apply_retention();
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("publisher");
    }
}

/// A reader tailing three of the topics until `done` or the cut: what it saw before the
/// cut was visible, so durable (under `Always` readers see only durable records).
fn tail(mq: &Spool, fs: &SimFs, done: &Arc<AtomicBool>) -> tokio::task::JoinHandle<Records> {
    let (mq, fs, done) = (mq.clone(), fs.clone(), done.clone());
    tokio::spawn(async move {
        let mut seen = Records::new();
        let mut from = [0u64; 3];
        while !done.load(Ordering::Acquire) && !fs.is_cut() {
            for (k, next) in from.iter_mut().enumerate() {
                let t = topic(k as u64 * 3);
                let Ok(recs) = mq.fetch(&t, *next, 64).await else {
                    continue;
                };
                if fs.is_cut() {
                    return seen;
                }
                for r in &recs {
                    seen.insert((t.clone(), r.offset()), r.payload().to_vec());
                    *next = r.offset() + 1;
                }
            }
            tokio::task::yield_now().await;
        }
        seen
    })
}

/// A slow disk until `done`: syncs wait a little, so that rounds pile up behind a
/// checkpoint and the journal's two files are both in play.
fn slow_disk(fs: &SimFs, done: &Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    let (fs, done) = (fs.clone(), done.clone());
    std::thread::spawn(move || {
        while !done.load(Ordering::Acquire) && !fs.is_cut() {
            fs.hold_syncs(true);
            std::thread::sleep(std::time::Duration::from_micros(400));
            fs.hold_syncs(false);
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        fs.hold_syncs(false);
    })
}

/// What of `records` the reopened `image` lacks or holds otherwise; also that every
/// topic's offsets are dense.
async fn check(image: &SimFs, sync: SyncPolicy, what: &[(&str, &Records)]) -> Vec<String> {
    let mut failures = Vec::new();
    let again = Spool::open_simulated(opts(sync), image).expect("reopen");
    for i in 0..TOPICS as u64 {
        let t = topic(i);
        let Ok(info) = again.topic_info(&t) else {
            continue;
        };
        let recs = again.fetch(&t, 0, usize::MAX).await.expect("fetch");
        for (k, r) in recs.iter().enumerate() {
            if r.offset() != info.earliest + k as u64 {
                failures.push(format!("{t}: not dense at {}", r.offset()));
            }
        }
        for (kind, records) in what {
            for ((rt, o), b) in records.iter().filter(|((rt, _), _)| *rt == t) {
                if *o < info.earliest {
                    continue;
                }
                match recs.get((o - info.earliest) as usize) {
                    Some(r) if r.payload()[..] == b[..] => {}
                    Some(_) => failures.push(format!("{kind} {rt}@{o} has another payload")),
                    None => failures.push(format!("{kind} {rt}@{o} lost (next {})", info.next)),
                }
            }
        }
    }
    again.close().await.expect("close");
    failures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_spread_over_topics_survive_a_power_cut() {
    let mut failures = Vec::new();
    for seed in 1..=runs() {
        let fs = SimFs::new(seed);
        let _clear = fs.faults_cleared_on_drop();
        fs.cut_at_op(40 + (seed * 7919) % 900);
        let mq = Spool::open_simulated(opts(SyncPolicy::Always), &fs).expect("open");
        let acked = Arc::new(Mutex::new(Records::new()));
        let done = Arc::new(AtomicBool::new(false));
        let reader = tail(&mq, &fs, &done);
        let slow = (seed % 3 == 0).then(|| slow_disk(&fs, &done));
        publish_spread(&mq, &fs, "first", 30, &acked).await;
        done.store(true, Ordering::Release);
        if let Some(t) = slow {
            t.join().expect("slow disk");
        }
        let seen = reader.await.expect("reader");
        let _ = mq.close().await;
        let Some(image) = fs.crash_image() else {
            continue;
        };
        // Every other seed reopens under `None`: the journal is copied back all the same.
        let sync = if seed % 2 == 0 {
            SyncPolicy::None
        } else {
            SyncPolicy::Always
        };
        let acked = std::mem::take(&mut *acked.lock().unwrap());
        for f in check(&image, sync, &[("acknowledged", &acked), ("seen", &seen)]).await {
            failures.push(format!("seed {seed}: {f}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A process crash mid-way (the page cache survives, the journal is not checkpointed),
/// a reopen in the same boot that copies the journal back and publishes on, then a power
/// cut: both lives' acknowledged publishes are there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_crash_a_reopen_and_a_power_cut_lose_nothing_across_topics() {
    let mut failures = Vec::new();
    for seed in 1..=runs() {
        let fs = SimFs::new(seed);
        let _clear = fs.faults_cleared_on_drop();
        let mq = Spool::open_simulated(opts(SyncPolicy::Always), &fs).expect("open");
        let acked = Arc::new(Mutex::new(Records::new()));
        publish_spread(&mq, &fs, "first", 12 + seed % 7, &acked).await;
        let image = fs.process_crash_now();
        drop(mq);
        let mq = Spool::open_simulated(opts(SyncPolicy::Always), &image).expect("reopen");
        publish_spread(&mq, &image, "second", 10, &acked).await;
        let cut = image.crash_now();
        drop(mq);
        let acked = std::mem::take(&mut *acked.lock().unwrap());
        for f in check(&cut, SyncPolicy::Always, &[("acknowledged", &acked)]).await {
            failures.push(format!("seed {seed}: {f}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `opts` with segments that hold a few records of 3,000 bytes (no roll in the publish).
fn big_segments() -> Options {
    let mut o = opts(SyncPolicy::Always);
    o.segment_bytes = 1 << 20;
    o
}

/// Publishes to eight topics at once while syncs are held (one round over them all),
/// `size` bytes each; what returned `Ok`.
async fn one_round_over_eight(mq: &Spool, fs: &SimFs, size: usize) -> Records {
    let body = vec![7u8; size];
    fs.hold_syncs(true);
    let mut tasks = Vec::new();
    for k in 0..8 {
        let (mq, body) = (mq.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let t = format!("b{k}");
            (t.clone(), mq.publish(&t, body, &Headers::new()).await)
        }));
    }
    while fs.syncs_waiting() == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    fs.hold_syncs(false);
    let mut acked = Records::new();
    for t in tasks {
        let (t, r) = t.await.expect("task");
        if let Ok(o) = r {
            acked.insert((t, o), body.clone());
        }
    }
    acked
}

/// What of `acked` the reopened `image` lacks.
async fn lost(image: &SimFs, acked: &Records) -> Vec<String> {
    let again = Spool::open_simulated(big_segments(), image).expect("reopen");
    let mut lost = Vec::new();
    for ((t, o), b) in acked {
        let recs = again.fetch(t, *o, 1).await.expect("fetch");
        if recs
            .first()
            .is_none_or(|r| r.offset() != *o || r.payload()[..] != b[..])
        {
            lost.push(format!("{t}@{o} acknowledged, then lost"));
        }
    }
    again.close().await.expect("close");
    lost
}

/// A failed sync of the journal file in use (`fail_one_sync_of`: its changes since the
/// last sync dropped, as Linux does): either a round's own (small records: its topics'
/// files are synced instead) or its checkpoint's (records bigger than the simulated
/// journal file's 4 KiB: the round goes to the other file, the full one's checkpoint
/// fails, the journal turns off). Found by review.
/// Every publish that returned `Ok` survives a power cut then, and a process crash, a
/// reopen in the same boot and a power cut after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_sync_of_the_journal_loses_no_acknowledged_publish() {
    let journal = std::path::Path::new("/data/journal.0.wal");
    let mut failures = Vec::new();
    for seed in 1..=8u64 {
        let size = if seed % 2 == 0 { 3000 } else { 40 };
        let fs = SimFs::new(seed);
        let _clear = fs.faults_cleared_on_drop();
        let mq = Spool::open_simulated(big_segments(), &fs).expect("open");
        let none = Headers::new();
        // Rounds over two topics until the journal file exists; the eight topics made
        // one at a time (no journal).
        while fs.read_file(journal).is_none() {
            let (a, b) = tokio::join!(
                mq.publish("a1", &b"small"[..], &none),
                mq.publish("a2", &b"small"[..], &none),
            );
            a.expect("a1");
            b.expect("a2");
        }
        for k in 0..8 {
            mq.publish(&format!("b{k}"), &b"made"[..], &none)
                .await
                .expect("make");
        }
        fs.fail_one_sync_of(journal);
        let mut acked = one_round_over_eight(&mq, &fs, size).await;
        // More rounds, and a power cut after each: the journal switches back to the file
        // whose sync failed, unless that failure turned it off.
        for r in 0..3 {
            acked.extend(one_round_over_eight(&mq, &fs, size).await);
            for f in lost(&fs.crash_now(), &acked).await {
                failures.push(format!("seed {seed}, power cut after round {r}: {f}"));
            }
        }
        let image = fs.process_crash_now();
        let cut = fs.crash_now();
        drop(mq);
        for f in lost(&cut, &acked).await {
            failures.push(format!("seed {seed}, power cut: {f}"));
        }
        let again = Spool::open_simulated(big_segments(), &image).expect("same boot");
        let cut = image.crash_now();
        drop(again);
        for f in lost(&cut, &acked).await {
            failures.push(format!("seed {seed}, reopen then power cut: {f}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A power cut during the open that copies the journal back (at each of its first file
/// operations: the copies, the syncs of the files, the new headers): the next open
/// copies again, and every acknowledged publish is there. Found by review.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_cut_while_the_journal_is_copied_back_loses_nothing() {
    let mut failures = Vec::new();
    for seed in 1..=3u64 {
        let fs = SimFs::new(seed);
        let _clear = fs.faults_cleared_on_drop();
        let mq = Spool::open_simulated(opts(SyncPolicy::Always), &fs).expect("open");
        let acked = Arc::new(Mutex::new(Records::new()));
        publish_spread(&mq, &fs, "first", 6, &acked).await;
        let image = fs.crash_now();
        drop(mq);
        let acked = std::mem::take(&mut *acked.lock().unwrap());
        for k in 1..=30u64 {
            let img = image.process_crash_now();
            img.cut_at_op(img.ops() + k);
            if let Ok(mq) = Spool::open_simulated(opts(SyncPolicy::Always), &img) {
                drop(mq);
            }
            let Some(cut) = img.crash_image() else {
                break;
            };
            for f in check(&cut, SyncPolicy::Always, &[("acknowledged", &acked)]).await {
                failures.push(format!("seed {seed}, cut at op {k} of the open: {f}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
