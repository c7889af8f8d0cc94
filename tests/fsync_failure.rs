//! A failed `fsync` and the page cache ("fsyncgate"). Linux marks the pages of a failed
//! `fsync` clean without writing them: they stay readable until evicted, and no later
//! sync writes them. A reopen in the same boot (no reboot, so the page cache survives)
//! reads those records, syncs only what it writes after them, and acknowledges that as
//! durable; a power cut later loses the unwritten records and, behind them, records
//! whose publishes returned `Ok`. `SimFs::fail_syncs_of` models the kernel's behaviour.

use std::path::Path;
use std::time::Duration;

use spool::testing::{SimFs, without_background_work};
use spool::{Headers, Options, Spool, SyncPolicy};

fn open(fs: &SimFs) -> Spool {
    let o = Options {
        sync: SyncPolicy::Always,
        ..without_background_work(Options::new("/data"))
    };
    Spool::open_simulated(o, fs).expect("open")
}

fn first_segment(topic: &str) -> String {
    format!("/data/topics/{topic}/{:020}.log", 0)
}

async fn payloads(mq: &Spool, topic: &str) -> Vec<Vec<u8>> {
    mq.fetch(topic, 0, 100)
        .await
        .expect("fetch")
        .iter()
        .map(|r| r.payload().to_vec())
        .collect()
}

/// Under `Always`: a publish whose sync failed returns an error and poisons the topic;
/// the process is restarted in the same boot and publishes on. Every publish that
/// returned `Ok` survives a power cut after that, and so does what the reopen showed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_a_failed_sync_left_in_the_page_cache_are_made_durable_by_the_next_open() {
    let fs = SimFs::new(11);
    let mq = open(&fs);
    let none = Headers::new();
    mq.publish("t", &b"zero"[..], &none).await.expect("p0");
    fs.fail_syncs_of(Some(Path::new(&first_segment("t"))));
    let one = mq.publish("t", &b"one"[..], &none).await;
    assert!(one.is_err(), "the sync failed: {one:?}");
    fs.fail_syncs_of(None);

    // Killed and restarted, same boot: the page cache still holds "one".
    let image = fs.process_crash_now();
    drop(mq);
    let mq = open(&image);
    assert_eq!(payloads(&mq, "t").await, [&b"zero"[..], b"one"]);
    mq.publish("t", &b"two"[..], &none).await.expect("p2");

    // Power cut: what was acknowledged durable must be there, with what came before.
    let cut = image.crash_now();
    drop(mq);
    let mq = open(&cut);
    assert_eq!(
        payloads(&mq, "t").await,
        [&b"zero"[..], b"one", b"two"],
        "a record whose publish returned Ok after the restart was lost"
    );
    mq.close().await.expect("close");
}

/// Review 30: a dead-letter copy whose sync failed is written (not shown to readers, as
/// nothing unsynced is under `Always`, but kept by a reopen in the same boot). A retried nack must not move the intent's start past that
/// copy, or the reopen, not finding it, copies the message a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_dead_letter_after_a_failed_copy_sync_leaves_one_copy() {
    use spool::consts::{X_CONSUMER_GROUP, X_ORIGINAL_OFFSET, X_ORIGINAL_TOPIC};
    async fn copies_of_0(mq: &Spool) -> usize {
        mq.fetch("t.dlq", 0, 1000)
            .await
            .expect("fetch dlq")
            .iter()
            .filter(|r| {
                let h = r.headers();
                h.get(X_ORIGINAL_TOPIC).map(String::as_str) == Some("t")
                    && h.get(X_CONSUMER_GROUP).map(String::as_str) == Some("g")
                    && h.get(X_ORIGINAL_OFFSET).map(String::as_str) == Some("0")
            })
            .count()
    }
    let opts = || Options {
        sync: SyncPolicy::Always,
        max_delivery_attempts: 1,
        ..without_background_work(Options::new("/data"))
    };
    let fs = SimFs::new(7);
    let mq = Spool::open_simulated(opts(), &fs).expect("open");
    let none = Headers::new();
    mq.publish("t", &b"poison"[..], &none)
        .await
        .expect("publish");
    // The dead-letter topic exists already, so its segment's path is known.
    mq.publish("t.dlq", &b"earlier"[..], &none)
        .await
        .expect("publish dlq");
    fs.fail_syncs_of(Some(Path::new(&first_segment("t.dlq"))));
    let first = mq.nack("t", "g", 0, "bad").await;
    assert!(first.is_err(), "the copy's sync failed: {first:?}");
    fs.fail_syncs_of(None);
    assert_eq!(
        copies_of_0(&mq).await,
        0,
        "written, but never synced: not shown"
    );
    // Retried (the record is still at the cursor): the dead-letter topic is poisoned.
    let second = mq.nack("t", "g", 0, "bad").await;
    assert!(second.is_err(), "{second:?}");

    // Killed and restarted in the same boot.
    let image = fs.process_crash_now();
    drop(mq);
    let mq = Spool::open_simulated(opts(), &image).expect("reopen");
    assert_eq!(
        mq.group_info("t", "g").expect("info").cursor,
        1,
        "the interrupted dead-letter was finished"
    );
    assert_eq!(copies_of_0(&mq).await, 1, "one copy, not two");
    mq.close().await.expect("close");
}

/// Review 31: under `Interval:<ms>` a power cut loses at most the publishes of the last
/// `<ms>`, also when a failed write stopped the topic after them: the interval thread
/// still syncs what the topic wrote before (the stop used to end every later sync).
#[test]
fn interval_a_publish_acknowledged_before_a_failed_write_is_synced_within_the_interval() {
    let fs = SimFs::new(21);
    let mut o = Options::new("/data");
    o.sync = SyncPolicy::Interval(Duration::from_millis(200));
    let mq = Spool::open_simulated(o.clone(), &fs).expect("open");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let h = Headers::new();
    // Returns Ok (written, not synced yet: the next interval sync is ~200 ms away).
    rt.block_on(mq.publish("a", b"acknowledged".to_vec(), &h))
        .expect("publish acknowledged");
    // The next write to the topic fails (say ENOSPC) and stops the topic.
    fs.fail_writes_to(Some(Path::new(&first_segment("a"))));
    let failed = rt.block_on(mq.publish("a", b"failed".to_vec(), &h));
    fs.fail_writes_to(None);
    assert!(failed.is_err(), "{failed:?}");
    // Six intervals later: "acknowledged" was published 1.2 s before the cut.
    std::thread::sleep(Duration::from_millis(1200));
    // A cut keeps a random prefix of what was never synced: look at several.
    for cut in 0..16 {
        let image = fs.crash_now();
        let again = Spool::open_simulated(o.clone(), &image).expect("reopen");
        let kept = rt.block_on(payloads(&again, "a"));
        rt.block_on(again.close()).expect("close");
        assert_eq!(
            kept,
            [b"acknowledged".to_vec()],
            "Sync=Interval:200, cut {cut}: a power cut 1.2 s after an acknowledged publish \
             lost it"
        );
    }
    drop(mq);
}

/// Review 31: a topic stopped by a failed write does not make `close` a crash for the
/// others: their deliveries out are released, not charged an attempt at the next open
/// (nor, at `Max Delivery Attempts=1`, dead-lettered without ever having failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_with_one_poisoned_topic_charges_no_attempt_to_deliveries_of_the_others() {
    let fs = SimFs::new(3);
    let _clear = fs.faults_cleared_on_drop();
    let opts = || Options {
        max_delivery_attempts: 1,
        sync: SyncPolicy::Always,
        ..without_background_work(Options::new("/data"))
    };
    let mq = Spool::open_simulated(opts(), &fs).expect("open");
    let none = Headers::new();
    mq.publish("a", b"a0".to_vec(), &none).await.expect("a0");
    mq.publish("b", b"b0".to_vec(), &none).await.expect("b0");
    // A healthy topic: one delivery out, its group committed with it in flight.
    let mut c = mq
        .consumer("b", "g")
        .manual_ack()
        .build()
        .expect("consumer");
    let d = c.recv().await.expect("b0");
    assert_eq!(d.offset(), 0);
    mq.commit().expect("commit");
    // Another topic is stopped by a failed write.
    fs.fail_writes_to(Some(Path::new(&first_segment("a"))));
    assert!(mq.publish("a", b"a1".to_vec(), &none).await.is_err());
    fs.fail_writes_to(None);
    drop(d);
    drop(c);
    let closed = mq.close().await;
    assert!(
        closed.is_err(),
        "the stopped topic's error is still reported"
    );
    let mq = Spool::open_simulated(opts(), &fs).expect("reopen");
    let info = mq.group_info("b", "g").expect("info");
    mq.close().await.expect("close");
    assert_eq!(
        (info.dead_lettered, info.cursor),
        (0, 0),
        "b0 was never nacked, yet the reopen dead-lettered it (close returned {closed:?})"
    );
}

/// Issue 27 point 8: a dead-letter topic stopped by a failed sync must not stop its source
/// group. A delivery a panic dropped at the attempt limit is dead-lettered by the group's
/// next hand-out; when that copy fails, the hand-out used to fail too, so no record of the
/// group was delivered until a reopen. Now the charged record stays in the group (as after
/// a nack whose copy failed) and the group's hand-outs go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_dead_letter_topic_does_not_stop_its_source_group() {
    let fs = SimFs::new(31);
    let o = Options {
        sync: SyncPolicy::Always,
        max_delivery_attempts: 1,
        ..without_background_work(Options::new("/data"))
    };
    let mq = Spool::open_simulated(o, &fs).expect("open");
    let none = Headers::new();
    for p in [&b"poison"[..], b"fine"] {
        mq.publish("t", p, &none).await.expect("publish");
    }
    // The dead-letter topic exists already, so its segment's path is known; a failed
    // copy's sync then stops it for good (until a reopen).
    mq.publish("t.dlq", &b"earlier"[..], &none)
        .await
        .expect("publish dlq");
    fs.fail_syncs_of(Some(Path::new(&first_segment("t.dlq"))));
    assert!(
        mq.nack("t", "g", 0, "bad").await.is_err(),
        "the copy failed"
    );
    fs.fail_syncs_of(None);

    let mut c = mq
        .consumer("t", "g")
        .manual_ack()
        .max_in_flight(2)
        .build()
        .expect("consumer");
    let d = c.recv().await.expect("offset 0 again");
    assert_eq!(d.offset(), 0);
    // Its handler panics: the drop charges an attempt past the limit.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _held = d;
        std::panic::resume_unwind(Box::new("the handler panicked"));
    }));
    assert!(panicked.is_err());

    let next = async |c: &mut spool::Consumer| {
        tokio::time::timeout(Duration::from_secs(30), c.recv())
            .await
            .expect("a delivery, not a wait")
            .expect("the hand-out goes on though the dead-letter copy fails")
    };
    let again = next(&mut c).await;
    assert_eq!(
        again.offset(),
        0,
        "the charged record stays in its group, first"
    );
    let d = next(&mut c).await;
    assert_eq!(d.offset(), 1, "and the group goes on behind it");
    d.ack().await.expect("ack 1");
    let info = mq.group_info("t", "g").expect("info");
    assert_eq!(
        info.cursor, 0,
        "the ack floor stays at the record not dead-lettered"
    );
    assert_eq!(info.dead_lettered, 0);
}
