//! Guards issue 27 point 6: `snapshot(dest)` makes a consistent copy of the whole instance
//! while publishers and consumers go on. The copy opens as a data directory (also while
//! the source is open); sealed segments are hard-linked; a bad destination is refused
//! before anything is written; a power cut at any sync point of a snapshot leaves the
//! source whole and the copy either complete or refused as incomplete.

mod common_core;
mod common_groups;

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common_core::{cut_during, fetch_all, segment_files};
use common_groups::{conn, manual, open, publish_n, recv};
use spool::testing::{SimFs, without_background_work};
use spool::{
    Error, Headers, OffsetReset, Options, RetentionPolicy, Spool, SyncPolicy, TopicConfig,
};

/// Small segments: a few dozen records make several.
const SMALL: &str = "Segment Bytes=1024;Max Delivery Attempts=2";

/// The same topics, records, topic state and group state in both instances.
async fn assert_same_instance(copy: &Spool, source: &Spool) {
    let topics = source.topics().expect("topics");
    assert_eq!(copy.topics().expect("topics"), topics);
    for t in &topics {
        assert_eq!(
            copy.topic_info(t).expect("info"),
            source.topic_info(t).expect("info"),
            "{t}"
        );
        let (a, b) = (fetch_all(copy, t).await, fetch_all(source, t).await);
        assert_eq!(a.len(), b.len(), "{t}");
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(
                (x.offset(), x.payload(), x.headers()),
                (y.offset(), y.payload(), y.headers())
            );
        }
        let groups = source.groups(t).expect("groups");
        assert_eq!(copy.groups(t).expect("groups"), groups, "{t}");
        for g in &groups {
            // The durable state; `counts` are of each instance since it opened.
            let durable = |mut i: spool::GroupInfo| {
                i.counts = spool::GroupCounts::default();
                i
            };
            assert_eq!(
                durable(copy.group_info(t, g).expect("info")),
                durable(source.group_info(t, g).expect("info")),
                "{t}/{g}"
            );
        }
    }
}

#[tokio::test]
async fn a_snapshot_of_an_idle_instance_opens_as_the_same_instance() {
    let dir = tempfile::tempdir().expect("dir");
    let data = dir.path().join("data");
    let mq = open(&data, SMALL);
    publish_n(&mq, "orders", 40).await;
    publish_n(&mq, "audit", 5).await;
    {
        // Acks, a message dead-lettered, a nack that stays pending, an out-of-order ack.
        let mut c = manual(&mq, "orders", "billing", 1);
        recv(&mut c).await.ack().await.expect("ack 0");
        recv(&mut c).await.nack("flaky").await.expect("nack 1");
        let again = recv(&mut c).await;
        assert_eq!(again.offset(), 1);
        again.nack("flaky again").await.expect("dead-letter 1");
        drop(c);
        let mut c = manual(&mq, "orders", "billing", 2);
        let d2 = recv(&mut c).await;
        let d3 = recv(&mut c).await;
        d3.ack().await.expect("ack 3");
        d2.nack("later").await.expect("nack 2");
    }
    mq.reset_offset("orders", "replay", OffsetReset::Explicit(7))
        .await
        .expect("reset");
    mq.set_topic_config(
        "audit",
        TopicConfig {
            retention_bytes: Some(1 << 20),
            retention_policy: Some(RetentionPolicy::Acked),
            ..TopicConfig::default()
        },
    )
    .await
    .expect("config");
    mq.delete_records_before("audit", 2).await.expect("delete");
    assert_eq!(
        mq.group_info("orders", "billing").expect("g").dead_lettered,
        1
    );

    let snap = dir.path().join("backups").join("s1");
    let info = mq.snapshot(&snap).await.expect("snapshot");
    assert_eq!(info.topics, 3, "orders, audit, orders.dlq");
    assert_eq!(info.groups, 2);
    let copy = open(&snap, SMALL);
    assert_same_instance(&copy, &mq).await;
    // Each goes on on its own.
    publish_n(&copy, "orders", 1).await;
    assert_eq!(
        mq.topic_info("orders").expect("info").next + 1,
        copy.topic_info("orders").expect("info").next
    );
    copy.close().await.expect("close copy");
    mq.close().await.expect("close");
}

/// Sealed segments share their inode with the source; the active one, the indexes and
/// the catalog are copied; the figures of `SnapshotInfo` are those of the files written.
#[tokio::test]
async fn sealed_segments_are_hard_linked_and_the_active_one_copied() {
    let dir = tempfile::tempdir().expect("dir");
    let data = dir.path().join("data");
    let mq = open(&data, SMALL);
    for i in 0..40u8 {
        mq.publish("t", vec![i; 100], &Headers::new())
            .await
            .expect("publish");
    }
    let snap = dir.path().join("snap");
    std::fs::create_dir(&snap).expect("an empty directory is a fine destination");
    let info = mq.snapshot(&snap).await.expect("snapshot");
    let (src, dst) = (segment_files(&data, "t"), segment_files(&snap, "t"));
    assert_eq!(
        src.iter().map(|p| p.file_name()).collect::<Vec<_>>(),
        dst.iter().map(|p| p.file_name()).collect::<Vec<_>>()
    );
    assert!(src.len() > 3, "{} segments", src.len());
    let ino = |p: &Path| std::fs::metadata(p).expect("meta").ino();
    let last = src.len() - 1;
    for (i, (a, b)) in src.iter().zip(&dst).enumerate() {
        assert_eq!(ino(a) == ino(b), i < last, "segment {i}: linked iff sealed");
    }
    let mut files = Vec::new();
    all_files(&snap, &mut files);
    let size = |p: &PathBuf| std::fs::metadata(p).expect("meta").len();
    let linked: Vec<&PathBuf> = dst[..last].iter().collect();
    assert_eq!(info.linked_files, last);
    assert_eq!(
        info.linked_bytes,
        linked.iter().map(|p| size(p)).sum::<u64>()
    );
    assert_eq!(
        info.copied_files + info.linked_files,
        files.len(),
        "{files:?}"
    );
    assert_eq!(info.bytes, files.iter().map(size).sum::<u64>());
    assert_eq!(info.bytes, info.linked_bytes + info.copied_bytes);
    assert_eq!(
        size(&dst[last]),
        mq.topic_info("t").expect("info").bytes - info.linked_bytes,
        "the active segment up to its records only"
    );
    // Retention in the source deletes its names; the copy's files stay as they were.
    let copy = open(&snap, SMALL);
    let before = fetch_all(&copy, "t").await;
    mq.delete_records_before("t", 39).await.expect("delete");
    for i in 0..40u8 {
        mq.publish("t", vec![i; 100], &Headers::new())
            .await
            .expect("publish");
    }
    mq.close().await.expect("close");
    assert_eq!(fetch_all(&copy, "t").await, before);
}

fn all_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            all_files(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// A destination that is a non-empty directory, a file, or inside the data directory is
/// refused with a clear error, and nothing is written there.
#[tokio::test]
async fn a_bad_destination_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().expect("dir");
    let data = dir.path().join("data");
    let mq = open(&data, "");
    publish_n(&mq, "t", 3).await;
    let full = dir.path().join("full");
    std::fs::create_dir(&full).expect("dir");
    std::fs::write(full.join("keep.txt"), b"mine").expect("write");
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"mine").expect("write");
    let data_before = listing(&data);
    for (dest, why) in [
        (full.clone(), "not empty"),
        (file.clone(), "a file"),
        (data.join("snap"), "inside the data directory"),
        (data.join("topics").join("new"), "inside, deeper"),
        (
            data.join("..").join("data").join("x"),
            "inside, by another path",
        ),
        (data.clone(), "the data directory itself"),
    ] {
        let r = mq.snapshot(&dest).await;
        let Err(e) = r else {
            panic!("{why}: {r:?}");
        };
        assert!(
            matches!(&e, Error::SnapshotDestination { path, .. } if *path == dest),
            "{why}: {e:?}"
        );
        assert!(e.to_string().contains("empty"), "says what to do: {e}");
    }
    assert_eq!(listing(&full), ["keep.txt"]);
    assert_eq!(std::fs::read(&file).expect("read"), b"mine");
    assert_eq!(
        listing(&data),
        data_before,
        "nothing new in the data directory"
    );
    mq.close().await.expect("close");
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A directory that still has the marker of an unfinished snapshot is refused by open,
/// with an error that says so.
#[test]
fn an_unfinished_snapshot_is_refused_by_open() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("SNAPSHOT-INCOMPLETE"), b"").expect("marker");
    let r = Spool::open(&conn(dir.path(), ""));
    let e = r.expect_err("refused");
    assert!(matches!(e, Error::IncompleteSnapshot { .. }), "{e:?}");
    assert!(e.to_string().contains("did not finish"), "{e}");
    assert_eq!(listing(dir.path()), ["SNAPSHOT-INCOMPLETE"], "nothing made");
}

/// What a consumer loop of the load test acked, with the ack floor of the acks that
/// returned.
#[derive(Default)]
struct Acked {
    done: BTreeSet<u64>,
}

impl Acked {
    /// The smallest offset not acked: every ack below it had returned.
    fn floor(&self) -> u64 {
        (0..).find(|o| !self.done.contains(o)).expect("a gap")
    }
}

const LOAD_TOPICS: [&str; 3] = ["load.a", "load.b", "load.c"];
const LOAD_RECORDS: u64 = 400;

/// Publishers on three topics and manual-ack consumers (acking out of order) run while
/// snapshots are taken. Every snapshot opens; each topic's records are a prefix of the
/// source's; each group's cursor lies between the ack floor before the snapshot and the
/// cursor after it, and below the copy's log end. No timing is asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshots_under_load_are_consistent_prefixes() {
    for sync in ["Always", "None"] {
        let extra = format!("Segment Bytes=4096;Sync={sync}");
        let dir = tempfile::tempdir().expect("dir");
        let mq = open(&dir.path().join("data"), &extra);
        let published = Arc::new(AtomicU64::new(0));
        let acked: Vec<Arc<Mutex<Acked>>> = LOAD_TOPICS.iter().map(|_| Arc::default()).collect();
        let mut tasks = Vec::new();
        for (t, acks) in LOAD_TOPICS.iter().zip(&acked) {
            tasks.push(tokio::spawn(publisher(mq.clone(), t, published.clone())));
            tasks.push(tokio::spawn(acker(mq.clone(), t, acks.clone())));
        }
        let mut snaps = Vec::new();
        for i in 1..=4u64 {
            while published.load(Ordering::Acquire) < i * LOAD_RECORDS * 3 / 5 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            let floors: Vec<u64> = acked.iter().map(|a| a.lock().expect("l").floor()).collect();
            let dest = dir.path().join(format!("snap{i}"));
            let info = mq.snapshot(&dest).await.expect("snapshot");
            assert_eq!(info.topics, 3);
            let after: Vec<u64> = LOAD_TOPICS
                .iter()
                .map(|t| mq.group_info(t, "g").expect("info").cursor)
                .collect();
            snaps.push((dest, floors, after));
        }
        for t in tasks {
            t.await.expect("task");
        }
        for (dest, floors, after) in &snaps {
            let copy = open(dest, &extra);
            for (i, t) in LOAD_TOPICS.iter().enumerate() {
                let (a, b) = (fetch_all(&copy, t).await, fetch_all(&mq, t).await);
                assert!(a.len() <= b.len(), "{sync} {t}");
                assert!(
                    a.iter().zip(&b).all(|(x, y)| x == y),
                    "{sync} {t}: a prefix"
                );
                let cursor = copy.group_info(t, "g").expect("info").cursor;
                assert!(
                    floors[i] <= cursor && cursor <= after[i] && cursor <= a.len() as u64,
                    "{sync} {t}: floor {} <= cursor {cursor} <= after {} and <= end {}",
                    floors[i],
                    after[i],
                    a.len()
                );
                if cursor < a.len() as u64 {
                    let mut c = manual(&copy, t, "g", 1);
                    assert_eq!(recv(&mut c).await.offset(), cursor, "delivered again");
                }
            }
            copy.close().await.expect("close copy");
        }
        mq.close().await.expect("close");
    }
}

async fn publisher(mq: Spool, topic: &'static str, published: Arc<AtomicU64>) {
    for i in 0..LOAD_RECORDS {
        mq.publish(topic, format!("{topic}-{i}").into_bytes(), &Headers::new())
            .await
            .expect("publish");
        published.fetch_add(1, Ordering::AcqRel);
        if i % 16 == 0 {
            tokio::task::yield_now().await;
        }
    }
}

/// Acks every record of `topic`, two at a time in reverse order.
async fn acker(mq: Spool, topic: &'static str, acked: Arc<Mutex<Acked>>) {
    let mut c = manual(&mq, topic, "g", 4);
    let mut left = LOAD_RECORDS;
    while left > 0 {
        let first = recv(&mut c).await;
        let mut batch = vec![first];
        if left > 1 {
            batch.push(recv(&mut c).await);
        }
        for d in batch.into_iter().rev() {
            let o = d.offset();
            d.ack().await.expect("ack");
            acked.lock().expect("lock").done.insert(o);
            left -= 1;
        }
    }
}

/// How a power-cut run's source is set up: sealed segments, a group with acks, a
/// dead-lettered message, a topic start; idle while the snapshot runs (so every run makes
/// the same file operations).
fn cut_options(data: &str, sync: SyncPolicy) -> Options {
    Options {
        sync,
        segment_bytes: 1024,
        max_delivery_attempts: 1,
        ..without_background_work(Options::new(data))
    }
}

fn cut_source(rt: &tokio::runtime::Runtime, fs: &SimFs, sync: SyncPolicy) -> Spool {
    let mq = Spool::open_simulated(cut_options("/data", sync), fs).expect("open");
    rt.block_on(async {
        for t in ["a", "b"] {
            publish_n(&mq, t, 25).await;
        }
        let mut c = manual(&mq, "a", "g", 2);
        recv(&mut c).await.ack().await.expect("ack");
        recv(&mut c)
            .await
            .nack("poison")
            .await
            .expect("dead-letter");
        drop(c);
        mq.delete_records_before("b", 4).await.expect("delete");
        // Everything durable (under `Sync=None` too): what a power cut keeps.
        mq.close().await.expect("close");
    });
    Spool::open_simulated(cut_options("/data", sync), fs).expect("reopen")
}

/// What the source shows: `(topic, records, group infos)` per topic.
type Shown = Vec<(String, Vec<spool::Record>, Vec<spool::GroupInfo>)>;

fn shown(rt: &tokio::runtime::Runtime, mq: &Spool) -> Shown {
    rt.block_on(async {
        let mut v = Vec::new();
        for t in mq.topics().expect("topics") {
            let records = fetch_all(mq, &t).await;
            let groups = mq
                .groups(&t)
                .expect("groups")
                .iter()
                .map(|g| mq.group_info(&t, g).expect("info"))
                .collect();
            v.push((t, records, groups));
        }
        v
    })
}

/// A snapshot cut at every sync point: the source reopens with everything it had, and the
/// copy either opens as the whole snapshot, or is refused as incomplete, or (cut before
/// its marker was durable) holds nothing of it. Never a silently partial copy.
/// `SPOOL_SNAPSHOT_CUT_SEEDS=<n>` runs more seeds (each alternates the sync policy).
#[test]
fn a_power_cut_during_a_snapshot_leaves_it_complete_or_detectably_incomplete() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let seeds: u64 = std::env::var("SPOOL_SNAPSHOT_CUT_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let (mut complete, mut refused, mut nothing) = (0, 0, 0);
    for seed in 0..seeds {
        let sync = if seed % 2 == 0 {
            SyncPolicy::Always
        } else {
            SyncPolicy::None
        };
        // A run without a cut: the snapshot's sync points.
        let fs = SimFs::new(900 + seed);
        let mq = cut_source(&rt, &fs, sync);
        let start = fs.ops();
        rt.block_on(mq.snapshot("/snap")).expect("snapshot");
        let points: Vec<u64> = fs
            .sync_points()
            .into_iter()
            .filter(|&p| p > start)
            .map(|p| p - start)
            .collect();
        assert!(points.len() > 5, "{points:?}");
        drop(mq);
        for &k in points
            .iter()
            .chain([points.last().copied().unwrap_or(0) + 1].iter())
        {
            let fs = SimFs::new(900 + seed);
            let mq = cut_source(&rt, &fs, sync);
            let want = shown(&rt, &mq);
            let (r, image, cut) = cut_during(&fs, k, || rt.block_on(mq.snapshot("/snap")));
            let what = format!("seed {seed} cut {k} ({sync:?})");
            assert!(cut || r.is_ok(), "{what}: {r:?}");
            drop(mq);
            let source = Spool::open_simulated(cut_options("/data", sync), &image).expect("source");
            assert_eq!(shown(&rt, &source), want, "{what}: the source as it was");
            let left_files = cut_left_files(&image);
            match Spool::open_simulated(cut_options("/snap", sync), &image) {
                // Cut before the marker was durable: nothing of the snapshot is there.
                Ok(copy) if shown(&rt, &copy).is_empty() && !left_files => nothing += 1,
                Ok(copy) => {
                    assert_eq!(shown(&rt, &copy), want, "{what}: a whole snapshot");
                    complete += 1;
                }
                Err(Error::IncompleteSnapshot { .. }) => refused += 1,
                Err(e) => panic!("{what}: {e:?}"),
            }
        }
    }
    eprintln!("complete {complete}, refused {refused}, nothing {nothing}");
    assert!(
        complete > 0 && refused > 0,
        "complete {complete}, refused {refused}, nothing {nothing}"
    );
}

/// Whether a cut snapshot left any of its segment files.
fn cut_left_files(image: &SimFs) -> bool {
    ["a", "b"].iter().any(|t| {
        image
            .read_file(
                &Path::new("/snap/topics")
                    .join(t)
                    .join(format!("{:020}.log", 0)),
            )
            .is_some()
    })
}

#[test]
fn the_blocking_facade_takes_a_snapshot_too() {
    let dir = tempfile::tempdir().expect("dir");
    let mq = spool::blocking::Spool::open(&conn(&dir.path().join("data"), "")).expect("open");
    mq.publish("t", b"x".to_vec(), &Headers::new())
        .expect("publish");
    let snap = dir.path().join("snap");
    let info = mq.snapshot(&snap).expect("snapshot");
    assert_eq!((info.topics, info.groups), (1, 0));
    let copy = spool::blocking::Spool::open(&conn(&snap, "")).expect("open copy");
    assert_eq!(copy.fetch("t", 0, 10).expect("fetch").len(), 1);
}

/// On another file system a hard link cannot be made (`EXDEV`): sealed segments are
/// copied instead, and the copy is the same.
#[tokio::test]
async fn on_another_file_system_sealed_segments_are_copied() {
    let src = common_groups::tmpfs_tempdir();
    let dst = tempfile::tempdir().expect("dir");
    let dev = |p: &Path| std::fs::metadata(p).expect("meta").dev();
    let mq = open(src.path(), SMALL);
    for i in 0..40u8 {
        mq.publish("t", vec![i; 100], &Headers::new())
            .await
            .expect("publish");
    }
    let snap = dst.path().join("snap");
    let info = mq.snapshot(&snap).await.expect("snapshot");
    assert!(segment_files(src.path(), "t").len() > 3);
    if dev(src.path()) != dev(dst.path()) {
        assert_eq!((info.linked_files, info.linked_bytes), (0, 0), "{info:?}");
    }
    let copy = open(&snap, SMALL);
    assert_same_instance(&copy, &mq).await;
}

/// A group in the copy has its durable state of the snapshot's instant: auto-acks not
/// committed yet are not in it, so those records are delivered again from the copy (as
/// after a crash), while the source goes on from its own cursor.
#[tokio::test]
async fn acks_not_committed_at_the_snapshot_are_delivered_again_from_the_copy() {
    let dir = tempfile::tempdir().expect("dir");
    let rare_commits = "Commit Interval Ms=3600000";
    let mq = open(&dir.path().join("data"), rare_commits);
    publish_n(&mq, "t", 5).await;
    let mut auto = mq.consumer("t", "auto").build().expect("build");
    for want in 0..4 {
        assert_eq!(auto.recv().await.expect("recv").offset(), want);
    }
    let in_memory = mq.group_info("t", "auto").expect("info").cursor;
    assert_eq!(in_memory, 3, "three auto-acked, in memory only");
    let snap = dir.path().join("snap");
    mq.snapshot(&snap).await.expect("snapshot");
    let copy = open(&snap, rare_commits);
    assert_eq!(copy.group_info("t", "auto").expect("info").cursor, 0);
    let mut again = copy.consumer("t", "auto").build().expect("build");
    assert_eq!(
        again.recv().await.expect("recv").offset(),
        0,
        "delivered again"
    );
    drop(auto);
    mq.commit().expect("commit");
    assert!(mq.group_info("t", "auto").expect("info").cursor >= 3);
}

/// While a snapshot runs (held here inside its catalog copy's sync), publishes go on and
/// a deletion of records waits: the segments it would delete are still to be linked.
/// Once the snapshot returned, the deletion goes through in the source only.
#[test]
fn a_deletion_waits_for_a_running_snapshot_and_publishes_go_on() {
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt")
    };
    let fs = SimFs::new(5);
    let opts = |data: &str| Options {
        segment_bytes: 1024,
        ..without_background_work(Options::new(data))
    };
    let mq = Spool::open_simulated(opts("/data"), &fs).expect("open");
    rt().block_on(async {
        for i in 0..40u8 {
            mq.publish("t", vec![i; 100], &Headers::new())
                .await
                .expect("publish");
        }
    });
    let release = fs.faults_cleared_on_drop();
    fs.hold_syncs_of(Some(Path::new("/snap/catalog.redb.new")));
    let snapshot = {
        let mq = mq.clone();
        std::thread::spawn(move || rt().block_on(mq.snapshot("/snap")))
    };
    while fs.syncs_waiting() == 0 {
        assert!(
            !snapshot.is_finished(),
            "the snapshot reached its catalog sync"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let deletion = {
        let mq = mq.clone();
        std::thread::spawn(move || rt().block_on(mq.delete_records_before("t", 30)))
    };
    let published = rt()
        .block_on(mq.publish("t", b"during".to_vec(), &Headers::new()))
        .expect("a publish during the snapshot");
    assert_eq!(published, 40);
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(
        !deletion.is_finished(),
        "the deletion waits for the snapshot"
    );
    drop(release);
    let info = snapshot.join().expect("thread").expect("snapshot");
    assert_eq!(deletion.join().expect("thread").expect("delete"), 30);
    assert!(info.linked_files > 3, "{info:?}");
    let copy = Spool::open_simulated(opts("/snap"), &fs).expect("open copy");
    let records = rt().block_on(fetch_all(&copy, "t"));
    assert_eq!(
        records.first().map(|r| r.offset()),
        Some(0),
        "nothing deleted"
    );
    assert!(records.len() >= 40, "{}", records.len());
    assert_eq!(mq.topic_info("t").expect("info").earliest, 30);
}
