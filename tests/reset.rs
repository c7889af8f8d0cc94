//! Guards issue 3 point 6 (offset reset): every mode (`Earliest`, `Latest`, `Time`,
//! `Explicit`) returns the new cursor, clamps to [earliest retained, log end] also after
//! retention deleted segments, clears the group's attempt counters, survives a reopen,
//! fences deliveries handed out before it, and moves a running consumer on its next recv.

mod common_groups;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common_groups::{WAIT, all_records, assert_nothing, open, publish_n, recv};
use spool::{Error, Headers, OffsetReset, Spool};

const TOPIC: &str = "reset.events";
const GROUP: &str = "workers";

async fn consume_all(mq: &Spool, n: u64) {
    let mut c = common_groups::manual(mq, TOPIC, GROUP, 1);
    for o in 0..n {
        let d = recv(&mut c).await;
        assert_eq!(d.offset(), o);
        d.ack().await.unwrap();
    }
}

async fn first_delivery(mq: &Spool) -> u64 {
    let mut c = common_groups::manual(mq, TOPIC, GROUP, 1);
    recv(&mut c).await.offset()
}

#[tokio::test]
async fn earliest_goes_back_to_the_first_record() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 5).await;
    consume_all(&mq, 5).await;
    let at = mq
        .reset_offset(TOPIC, GROUP, OffsetReset::Earliest)
        .await
        .unwrap();
    assert_eq!(at, 0);
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.lag), (0, 5));
    assert_eq!(first_delivery(&mq).await, 0);
}

#[tokio::test]
async fn latest_skips_to_the_log_end() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 5).await;
    let at = mq
        .reset_offset(TOPIC, GROUP, OffsetReset::Latest)
        .await
        .unwrap();
    assert_eq!(at, 5);
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    assert_nothing(&mut c).await;
    publish_n(&mq, TOPIC, 1).await;
    assert_eq!(recv(&mut c).await.offset(), 5);
}

#[tokio::test]
async fn time_goes_to_the_first_record_at_or_after_the_time() {
    let dir = tempfile::tempdir().unwrap();
    // Small segments so that the search crosses segment boundaries and the time index.
    let mq = open(dir.path(), "Segment Bytes=1024;Index Interval Bytes=64");
    for i in 0..40 {
        mq.publish(TOPIC, vec![b'x'; 50], &Headers::new())
            .await
            .unwrap();
        if i % 5 == 4 {
            // Distinct timestamps between groups of records (the test does not depend on
            // them: the expected offset is computed from the stored timestamps).
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
    }
    assert!(mq.topic_info(TOPIC).unwrap().segments > 2);
    let records = all_records(&mq, TOPIC).await;
    let ts: Vec<SystemTime> = records.iter().map(|r| r.timestamp()).collect();
    assert!(
        ts.windows(2).all(|w| w[0] <= w[1]),
        "timestamps are monotonic"
    );
    for probe in [0usize, 7, 13, 22, 39] {
        let t = ts[probe];
        let expected = ts.iter().position(|x| *x >= t).unwrap() as u64;
        let at = mq
            .reset_offset(TOPIC, GROUP, OffsetReset::Time(t))
            .await
            .unwrap();
        assert_eq!(at, expected, "Time of record {probe}");
        assert_eq!(first_delivery(&mq).await, expected);
        // One millisecond later: the first record strictly after that millisecond.
        let t1 = t + Duration::from_millis(1);
        let expected = ts.iter().position(|x| *x >= t1).map_or(40, |p| p as u64);
        let at = mq
            .reset_offset(TOPIC, GROUP, OffsetReset::Time(t1))
            .await
            .unwrap();
        assert_eq!(at, expected, "just after record {probe}");
    }
    let at = mq
        .reset_offset(TOPIC, GROUP, OffsetReset::Time(UNIX_EPOCH))
        .await
        .unwrap();
    assert_eq!(at, 0, "a time before everything is the earliest");
    let future = SystemTime::now() + Duration::from_secs(3600);
    let at = mq
        .reset_offset(TOPIC, GROUP, OffsetReset::Time(future))
        .await
        .unwrap();
    assert_eq!(at, 40, "a time after everything is the log end");
}

#[tokio::test]
async fn explicit_goes_to_the_offset_clamped_to_the_log_end() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 10).await;
    let at = mq
        .reset_offset(TOPIC, GROUP, OffsetReset::Explicit(7))
        .await
        .unwrap();
    assert_eq!(at, 7);
    assert_eq!(first_delivery(&mq).await, 7);
    let at = mq
        .reset_offset(TOPIC, GROUP, OffsetReset::Explicit(10))
        .await
        .unwrap();
    assert_eq!(at, 10);
    let at = mq
        .reset_offset(TOPIC, GROUP, OffsetReset::Explicit(u64::MAX))
        .await
        .unwrap();
    assert_eq!(at, 10, "clamped to the log end");
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 10);
}

#[tokio::test]
async fn reset_on_an_empty_topic_is_offset_zero() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    for to in [
        OffsetReset::Earliest,
        OffsetReset::Latest,
        OffsetReset::Time(SystemTime::now()),
        OffsetReset::Explicit(5),
    ] {
        assert_eq!(mq.reset_offset(TOPIC, GROUP, to).await.unwrap(), 0);
    }
}

#[tokio::test]
async fn every_mode_clamps_to_what_retention_still_holds() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(
        dir.path(),
        "Segment Bytes=1024;Retention Bytes=2048;Retention Check Ms=3600000",
    );
    for _ in 0..60 {
        mq.publish(TOPIC, vec![b'r'; 100], &Headers::new())
            .await
            .unwrap();
    }
    mq.apply_retention().unwrap();
    let info = mq.topic_info(TOPIC).unwrap();
    let (earliest, next) = (info.earliest, info.next);
    assert!(earliest > 0 && next == 60, "{info:?}");
    let first = all_records(&mq, TOPIC).await[0].offset();
    assert_eq!(first, earliest);

    let cases = [
        (OffsetReset::Earliest, earliest),
        (OffsetReset::Explicit(0), earliest),
        (OffsetReset::Explicit(earliest - 1), earliest),
        (OffsetReset::Explicit(earliest + 1), earliest + 1),
        (OffsetReset::Time(UNIX_EPOCH), earliest),
        (OffsetReset::Latest, next),
        (OffsetReset::Explicit(1_000), next),
    ];
    for (to, expected) in cases {
        let at = mq.reset_offset(TOPIC, GROUP, to).await.unwrap();
        assert_eq!(at, expected, "{to:?}");
        assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, expected);
        assert_eq!(
            mq.group_info(TOPIC, GROUP).unwrap().skipped,
            0,
            "a reset is not a retention skip"
        );
    }
    mq.reset_offset(TOPIC, GROUP, OffsetReset::Explicit(0))
        .await
        .unwrap();
    assert_eq!(first_delivery(&mq).await, earliest);
}

#[tokio::test]
async fn reset_clears_attempt_counters_durably() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 3).await;
    mq.nack(TOPIC, GROUP, 0, "a").await.unwrap();
    mq.nack(TOPIC, GROUP, 0, "b").await.unwrap();
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().pending.len(), 1);
    let at = mq
        .reset_offset(TOPIC, GROUP, OffsetReset::Earliest)
        .await
        .unwrap();
    assert_eq!(at, 0);
    assert!(mq.group_info(TOPIC, GROUP).unwrap().pending.is_empty());
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (0, 1), "counting starts over");
    drop(d);
    drop(c);
    mq.close().await.unwrap();

    let mq = open(dir.path(), "");
    assert!(mq.group_info(TOPIC, GROUP).unwrap().pending.is_empty());
    // Five more nacks are needed to dead-letter it: the old two do not count.
    for n in 1..=4 {
        let out = mq.nack(TOPIC, GROUP, 0, "again").await.unwrap();
        assert_eq!((out.delivery_attempt, out.dead_lettered), (n, false));
    }
}

#[tokio::test]
async fn a_reset_survives_reopen_in_every_mode() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 10).await;
    let t5 = all_records(&mq, TOPIC).await[5].timestamp();
    let expected_t5 = all_records(&mq, TOPIC)
        .await
        .iter()
        .position(|r| r.timestamp() >= t5)
        .unwrap() as u64;
    consume_all(&mq, 10).await;
    drop(mq);
    for (to, expected) in [
        (OffsetReset::Explicit(3), 3),
        (OffsetReset::Earliest, 0),
        (OffsetReset::Time(t5), expected_t5),
        (OffsetReset::Latest, 10),
    ] {
        let mq = open(dir.path(), "");
        assert_eq!(mq.reset_offset(TOPIC, GROUP, to).await.unwrap(), expected);
        mq.close().await.unwrap();
        let mq = open(dir.path(), "");
        assert_eq!(
            mq.group_info(TOPIC, GROUP).unwrap().cursor,
            expected,
            "{to:?} after reopen"
        );
        if expected < 10 {
            assert_eq!(first_delivery(&mq).await, expected);
        }
        mq.close().await.unwrap();
    }
}

#[tokio::test]
async fn a_delivery_handed_out_before_a_reset_is_fenced() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 5).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 3);
    let d0 = recv(&mut c).await;
    let d1 = recv(&mut c).await;
    let d2 = recv(&mut c).await;
    assert_eq!(
        mq.reset_offset(TOPIC, GROUP, OffsetReset::Explicit(0))
            .await
            .unwrap(),
        0
    );
    let before = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((before.cursor, before.in_flight), (0, 0));

    let r = d0.ack().await;
    assert!(
        matches!(r, Err(Error::StaleDelivery { offset: 0 })),
        "{r:?}"
    );
    let r = d1.nack("late").await;
    assert!(
        matches!(r, Err(Error::StaleDelivery { offset: 1 })),
        "{r:?}"
    );
    drop(d2); // a stale release changes nothing either
    assert_eq!(
        mq.group_info(TOPIC, GROUP).unwrap(),
        before,
        "nothing changed"
    );

    // The fresh hand-outs are the ones that count.
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (0, 1));
    d.ack().await.unwrap();
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 1);
}

#[tokio::test]
async fn a_fenced_delivery_does_not_finish_the_same_offset_handed_out_again() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 3).await;
    let mut old = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let stale = recv(&mut old).await;
    mq.reset_offset(TOPIC, GROUP, OffsetReset::Earliest)
        .await
        .unwrap();
    let mut new = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let fresh = recv(&mut new).await;
    assert_eq!((stale.offset(), fresh.offset()), (0, 0));
    assert!(matches!(
        stale.ack().await,
        Err(Error::StaleDelivery { offset: 0 })
    ));
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(
        (info.cursor, info.in_flight),
        (0, 1),
        "the fresh delivery is still out"
    );
    fresh.ack().await.unwrap();
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 1);
}

#[tokio::test]
async fn a_running_auto_ack_consumer_continues_from_the_new_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 10).await;
    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    for o in 0..3 {
        assert_eq!(recv(&mut c).await.offset(), o);
    }
    mq.reset_offset(TOPIC, GROUP, OffsetReset::Explicit(7))
        .await
        .unwrap();
    assert_eq!(recv(&mut c).await.offset(), 7, "forward");
    mq.reset_offset(TOPIC, GROUP, OffsetReset::Earliest)
        .await
        .unwrap();
    let d = recv(&mut c).await;
    assert_eq!(d.offset(), 0, "backward");
    // The stale auto-ack of 7 did not move the new epoch's cursor.
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.in_flight), (0, 1));
    drop(d);
    assert_eq!(recv(&mut c).await.offset(), 1);
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 1);
}

#[tokio::test]
async fn a_running_manual_consumer_with_prefetched_records_continues_from_the_new_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 50).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    for _ in 0..10 {
        recv(&mut c).await.ack().await.unwrap();
    }
    mq.reset_offset(TOPIC, GROUP, OffsetReset::Explicit(30))
        .await
        .unwrap();
    for o in 30..35 {
        let d = recv(&mut c).await;
        assert_eq!(d.offset(), o);
        assert_eq!(&d.payload()[..], &common_groups::payload_of(o)[..]);
        d.ack().await.unwrap();
    }
    mq.reset_offset(TOPIC, GROUP, OffsetReset::Explicit(5))
        .await
        .unwrap();
    let d = recv(&mut c).await;
    assert_eq!(d.offset(), 5);
    assert_eq!(&d.payload()[..], &common_groups::payload_of(5)[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_waiting_at_the_log_end_wakes_on_a_reset_backwards() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 3).await;
    consume_all(&mq, 3).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let recv = c.recv();
    tokio::pin!(recv);
    assert!(futures_util::poll!(recv.as_mut()).is_pending());
    mq.reset_offset(TOPIC, GROUP, OffsetReset::Earliest)
        .await
        .unwrap();
    let d = tokio::time::timeout(WAIT, recv)
        .await
        .expect("woken by the reset")
        .unwrap();
    assert_eq!(d.offset(), 0);
}

#[tokio::test]
async fn a_reset_after_a_dead_letter_replays_without_a_second_copy_until_nacked_again() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "Max Delivery Attempts=1");
    publish_n(&mq, TOPIC, 2).await;
    assert!(mq.nack(TOPIC, GROUP, 0, "x").await.unwrap().dead_lettered);
    mq.reset_offset(TOPIC, GROUP, OffsetReset::Earliest)
        .await
        .unwrap();
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (0, 1));
    d.ack().await.unwrap();
    assert_eq!(all_records(&mq, "reset.events.dlq").await.len(), 1);
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().dead_lettered, 1);
}

#[tokio::test]
async fn reset_checks_names() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    let r = mq
        .reset_offset("no/slash", GROUP, OffsetReset::Earliest)
        .await;
    assert!(matches!(r, Err(Error::InvalidTopicName { .. })), "{r:?}");
    let r = mq.reset_offset(TOPIC, "", OffsetReset::Earliest).await;
    assert!(matches!(r, Err(Error::InvalidTopicName { .. })), "{r:?}");
}

/// Child role: finishes 0..=3, nacks 4 twice, holds a delivery of 4, resets to
/// `Explicit(2)` and aborts.
#[tokio::test]
async fn child_resets_then_aborts() {
    let Some((role, dir)) = common_groups::child_role() else {
        return;
    };
    assert_eq!(role, "reset-abort");
    let mq = open(&dir, "");
    consume_all(&mq, 4).await;
    mq.nack(TOPIC, GROUP, 4, "one").await.unwrap();
    mq.nack(TOPIC, GROUP, 4, "two").await.unwrap();
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let held = recv(&mut c).await;
    assert_eq!((held.offset(), held.attempt()), (4, 3));
    let at = mq
        .reset_offset(TOPIC, GROUP, OffsetReset::Explicit(2))
        .await
        .unwrap();
    assert_eq!(at, 2);
    std::process::abort();
}

#[tokio::test]
async fn a_reset_that_returned_survives_a_process_abort() {
    let dir = common_groups::publish_then_abort_child(
        TOPIC,
        6,
        "child_resets_then_aborts",
        "reset-abort",
    )
    .await;
    let mq = open(dir.path(), "");
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(info.cursor, 2);
    assert!(info.pending.is_empty(), "cleared: {:?}", info.pending);
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    for o in 2..6 {
        let d = recv(&mut c).await;
        assert_eq!(
            (d.offset(), d.attempt()),
            (o, 1),
            "the delivery fenced by the reset is not charged for the abort"
        );
        d.ack().await.unwrap();
    }
}

/// A crash after a reset replays at full speed: the reset starts the group's lease over
/// at the new cursor, so the careful mode that follows an unclean stop (one catalog commit
/// per record) covers a lease past the new cursor, not everything up to the old lease
/// (found by review: a crash after a reset to Earliest made the whole replay careful).
#[tokio::test]
async fn a_crash_after_a_reset_does_not_make_the_replay_commit_per_record() {
    use spool::testing::{SimFs, without_background_work};
    let opts = || {
        let mut o = spool::Options::new("/data");
        o.sync = spool::SyncPolicy::None;
        o.dedup_window = 0;
        without_background_work(o)
    };
    let fs = SimFs::new(3);
    let mq = Spool::open_simulated(opts(), &fs).unwrap();
    let n = 6000;
    let batch: Vec<(Vec<u8>, Headers)> = (0..n)
        .map(|i| (format!("m{i}").into_bytes(), Headers::new()))
        .collect();
    mq.publish_batch(TOPIC, batch).await.unwrap();
    {
        let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
        for o in 0..n {
            assert_eq!(c.recv().await.unwrap().offset(), o);
        }
        c.close().await.unwrap();
    }
    assert_eq!(
        mq.reset_offset(TOPIC, GROUP, OffsetReset::Earliest)
            .await
            .unwrap(),
        0
    );
    let crashed = fs.process_crash_now();
    std::mem::forget(mq);
    let mq = Spool::open_simulated(opts(), &crashed).unwrap();
    let before = crashed.sync_points().len();
    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    for o in 0..1000 {
        assert_eq!(c.recv().await.unwrap().offset(), o);
    }
    let syncs = crashed.sync_points().len() - before;
    // Careful mode would be a sync per record; a lease commit now and then is a few.
    assert!(syncs < 100, "{syncs} syncs to replay 1,000 records");
}
