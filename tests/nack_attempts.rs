//! Guards issue 3 point 3 (nack and attempts): the attempt counter and last reason are
//! durable before a nack returns (nack twice, reopen, nack → attempt 3), the nacked message
//! is the very next delivery with `attempt()` one higher, later messages wait behind it, and
//! `group_info.pending` shows the counters.

mod common_groups;

use common_groups::{assert_nothing, open, publish_n, recv};
use spool::PendingAttempt;

const TOPIC: &str = "nack.events";
const GROUP: &str = "workers";

fn pending(mq: &spool::Spool) -> Vec<(u64, u32, String)> {
    mq.group_info(TOPIC, GROUP)
        .unwrap()
        .pending
        .into_iter()
        .map(
            |PendingAttempt {
                 offset,
                 attempts,
                 last_reason,
                 ..
             }| (offset, attempts, last_reason),
        )
        .collect()
}

#[tokio::test]
async fn nack_twice_reopen_nack_is_attempt_three() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 3).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    for n in 1..=2u32 {
        let d = recv(&mut c).await;
        assert_eq!((d.offset(), d.attempt()), (0, n));
        let out = d.nack(&format!("failure {n}")).await.unwrap();
        assert_eq!(out.delivery_attempt, n);
        assert!(!out.dead_lettered);
        assert_eq!(out.next_offset, 0);
    }
    assert_eq!(pending(&mq), vec![(0, 2, "failure 2".to_owned())]);
    drop(c);
    mq.close().await.unwrap();

    let mq = open(dir.path(), "");
    assert_eq!(
        pending(&mq),
        vec![(0, 2, "failure 2".to_owned())],
        "the counter and the reason are durable"
    );
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (0, 3));
    let out = d.nack("failure 3").await.unwrap();
    assert_eq!(out.delivery_attempt, 3);
    assert_eq!(pending(&mq), vec![(0, 3, "failure 3".to_owned())]);

    // Acking it clears the counter.
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (0, 4));
    d.ack().await.unwrap();
    assert!(pending(&mq).is_empty());
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (1, 1));
}

#[tokio::test]
async fn low_level_nack_twice_reopen_nack_is_attempt_three() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 2).await;
    for n in 1..=2u32 {
        let out = mq.nack(TOPIC, GROUP, 0, "low").await.unwrap();
        assert_eq!((out.delivery_attempt, out.next_offset), (n, 0));
    }
    mq.close().await.unwrap();
    let mq = open(dir.path(), "");
    let out = mq.nack(TOPIC, GROUP, 0, "low again").await.unwrap();
    assert_eq!(out.delivery_attempt, 3);
    assert!(!out.dead_lettered);
    assert_eq!(pending(&mq), vec![(0, 3, "low again".to_owned())]);
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (0, 4));
}

#[tokio::test]
async fn the_nacked_message_is_the_very_next_delivery_and_later_ones_wait() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "Max Delivery Attempts=0");
    publish_n(&mq, TOPIC, 3).await;
    let mut c1 = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let mut c2 = common_groups::manual(&mq, TOPIC, GROUP, 1);
    for n in 1..=4u32 {
        let d = recv(if n % 2 == 0 { &mut c1 } else { &mut c2 }).await;
        assert_eq!(
            (d.offset(), d.attempt()),
            (0, n),
            "redelivered, never skipped"
        );
        // While it is out, the group has nothing else to give (max_in_flight 1).
        assert_nothing(&mut c1).await;
        assert_nothing(&mut c2).await;
        d.nack("again").await.unwrap();
    }
    let d = recv(&mut c1).await;
    d.ack().await.unwrap();
    let d = recv(&mut c2).await;
    assert_eq!((d.offset(), d.attempt()), (1, 1));
}

#[tokio::test]
async fn with_several_in_flight_a_nacked_message_is_redelivered_before_new_ones() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 6).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 3);
    let d0 = recv(&mut c).await;
    let d1 = recv(&mut c).await;
    let d2 = recv(&mut c).await;
    let out = d1.nack("later").await.unwrap();
    assert_eq!((out.delivery_attempt, out.next_offset), (1, 0));
    let again = recv(&mut c).await;
    assert_eq!((again.offset(), again.attempt()), (1, 2));
    d0.ack().await.unwrap();
    d2.ack().await.unwrap();
    again.ack().await.unwrap();
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 3);
    assert_eq!(recv(&mut c).await.offset(), 3);
}

#[tokio::test]
async fn pending_lists_every_nacked_offset_lowest_first() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 4).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 4);
    let mut ds = Vec::new();
    for _ in 0..4 {
        ds.push(recv(&mut c).await);
    }
    let d3 = ds.pop().unwrap();
    let d2 = ds.pop().unwrap();
    d3.nack("three").await.unwrap();
    d2.nack("two").await.unwrap();
    let d3 = recv(&mut c).await;
    assert_eq!(d3.offset(), 2, "lowest redelivery first");
    d3.nack("two again").await.unwrap();
    assert_eq!(
        pending(&mq),
        vec![(2, 2, "two again".to_owned()), (3, 1, "three".to_owned())]
    );
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.in_flight, info.dead_lettered), (0, 2, 0));
}

#[tokio::test]
async fn releasing_a_delivery_does_not_count_an_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 1).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    recv(&mut c).await.nack("one").await.unwrap();
    for _ in 0..3 {
        let d = recv(&mut c).await;
        assert_eq!(d.attempt(), 2);
        drop(d);
    }
    assert_eq!(pending(&mq), vec![(0, 1, "one".to_owned())]);
}

/// Child role: nacks offset 0 twice and aborts without closing.
#[tokio::test]
async fn child_nacks_twice_then_aborts() {
    let Some((role, dir)) = common_groups::child_role() else {
        return;
    };
    assert_eq!(role, "nack-twice-abort");
    let mq = open(&dir, "");
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    for n in 1..=2 {
        let out = recv(&mut c)
            .await
            .nack(&format!("crash {n}"))
            .await
            .unwrap();
        assert_eq!(out.delivery_attempt, n);
    }
    std::process::abort();
}

#[tokio::test]
async fn nack_counters_survive_a_process_abort() {
    let dir = common_groups::publish_then_abort_child(
        TOPIC,
        2,
        "child_nacks_twice_then_aborts",
        "nack-twice-abort",
    )
    .await;
    let mq = open(dir.path(), "");
    assert_eq!(
        pending(&mq),
        vec![(0, 2, "crash 2".to_owned())],
        "both nacks were durable when they returned, and nothing was out at the abort"
    );
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (0, 3));
}

/// The attempt counter of a record a power cut took away (`Sync=None`) is not inherited
/// by the record published later at its offset, even if the process dies again before the
/// group's next commit: the open that cuts the group back deletes the rows in the same
/// commit (found by review: it committed the group's image only, and the rows came back).
#[tokio::test]
async fn a_record_lost_to_a_power_cut_leaves_no_attempts_to_its_successor() {
    use spool::testing::{SimFs, without_background_work};
    use spool::{Headers, Spool, SyncPolicy};
    let opts = || {
        let mut o = spool::Options::new("/data");
        o.sync = SyncPolicy::None;
        o.dedup_window = 0;
        without_background_work(o)
    };
    let one = |i: u64| vec![(format!("m{i}").into_bytes(), Headers::new())];
    // Seeds differ in what the power cut keeps; the first that loses offset 5 shows it.
    for seed in 1..400u64 {
        let fs = SimFs::new(seed);
        {
            let mq = Spool::open_simulated(opts(), &fs).unwrap();
            for i in 0..5 {
                mq.publish_batch(TOPIC, one(i)).await.unwrap();
            }
            mq.close().await.unwrap(); // 0..5 durable
        }
        let mq = Spool::open_simulated(opts(), &fs).unwrap();
        for i in 5..10 {
            mq.publish_batch(TOPIC, one(i)).await.unwrap(); // not synced
        }
        {
            let mut c = mq.consumer(TOPIC, GROUP).manual_ack().build().unwrap();
            for _ in 0..5 {
                recv(&mut c).await.ack().await.unwrap();
            }
            for a in 1..=3 {
                let d = recv(&mut c).await;
                assert_eq!((d.offset(), d.attempt()), (5, a));
                d.nack("bad").await.unwrap(); // durable attempt rows
            }
        }
        let image = fs.crash_now();
        std::mem::forget(mq);
        let mq = Spool::open_simulated(opts(), &image).unwrap();
        if mq.topic_info(TOPIC).unwrap().next > 5 {
            continue;
        }
        for i in 100..110 {
            mq.publish_batch(TOPIC, one(i)).await.unwrap(); // a new record at offset 5
        }
        let again = image.process_crash_now();
        std::mem::forget(mq);
        let mq = Spool::open_simulated(opts(), &again).unwrap();
        let info = mq.group_info(TOPIC, GROUP).unwrap();
        assert!(info.pending.is_empty(), "seed {seed}: {:?}", info.pending);
        let mut c = mq.consumer(TOPIC, GROUP).manual_ack().build().unwrap();
        let d = recv(&mut c).await;
        assert_eq!((d.offset(), d.attempt()), (5, 1), "seed {seed}");
        return;
    }
    panic!("no seed lost offset 5 to the power cut");
}
