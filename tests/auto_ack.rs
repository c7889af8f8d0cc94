//! Guards issue 3 point 5 (auto-ack): without `manual_ack()` a consumer's previous delivery
//! is acked when it asks for the next one or is closed/dropped — never at hand-out — so
//! `recv → handle → recv` is at-least-once; a manual-ack delivery dropped unfinished is
//! released and delivered again, and an auto-ack one dropped by a panicking handler counts
//! a failed attempt and is delivered again; after a kill, auto-acks since the last cursor commit
//! (`Commit Interval Ms`, or `Spool::commit`) are replayed, never skipped.

mod common_groups;

use common_groups::{assert_nothing, open, panic_with, panics, publish_n, recv};

const TOPIC: &str = "auto.events";
const GROUP: &str = "workers";

fn cursor(mq: &spool::Spool) -> u64 {
    mq.group_info(TOPIC, GROUP).unwrap().cursor
}

#[tokio::test]
async fn the_next_recv_acks_the_previous_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 3).await;
    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    let d0 = recv(&mut c).await;
    assert_eq!(d0.offset(), 0);
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(
        (info.cursor, info.in_flight),
        (0, 1),
        "not acked at hand-out"
    );
    drop(d0); // dropping an auto-ack delivery neither acks nor releases it
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().in_flight, 1);
    let d1 = recv(&mut c).await;
    assert_eq!(d1.offset(), 1);
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.in_flight), (1, 1));
    drop(d1);
    assert_eq!(recv(&mut c).await.offset(), 2);
    assert_eq!(cursor(&mq), 2);
}

#[tokio::test]
async fn a_recv_that_finds_nothing_still_acks_the_previous_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 1).await;
    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    recv(&mut c).await;
    assert_nothing(&mut c).await;
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.in_flight), (1, 0));
}

#[tokio::test]
async fn closing_or_dropping_the_consumer_acks_its_last_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 2).await;

    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    recv(&mut c).await;
    c.close().await.unwrap();
    assert_eq!(cursor(&mq), 1, "close acks");

    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    recv(&mut c).await;
    drop(c);
    assert_eq!(cursor(&mq), 2, "drop acks");

    // Persisted by the clean close of the instance.
    mq.close().await.unwrap();
    let mq = open(dir.path(), "");
    assert_eq!(cursor(&mq), 2);
}

#[tokio::test]
async fn a_delivery_handed_out_but_never_followed_by_a_recv_is_not_acked() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 2).await;
    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    let d = recv(&mut c).await;
    assert_eq!(d.offset(), 0);
    // The instance goes away while the delivery is being handled.
    mq.close().await.unwrap();
    drop(d);
    drop(c); // its auto-ack fails quietly: the instance is closed

    let mq = open(dir.path(), "");
    assert_eq!(cursor(&mq), 0);
    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    let d = recv(&mut c).await;
    assert_eq!(d.offset(), 0, "delivered again");
    assert_eq!(
        d.attempt(),
        1,
        "a clean close releases without counting an attempt"
    );
}

#[tokio::test]
async fn an_explicit_ack_or_nack_in_auto_mode_is_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 3).await;
    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    let d = recv(&mut c).await;
    d.ack().await.unwrap();
    assert_eq!(cursor(&mq), 1);
    let d = recv(&mut c).await; // its auto-ack of 0 is a no-op now
    assert_eq!(d.offset(), 1);
    let out = d.nack("retry").await.unwrap();
    assert_eq!(out.next_offset, 1);
    let d = recv(&mut c).await; // must not auto-ack the nacked delivery
    assert_eq!((d.offset(), d.attempt()), (1, 2));
    assert_eq!(cursor(&mq), 1);
    drop(d);
    assert_eq!(recv(&mut c).await.offset(), 2);
    assert_eq!(cursor(&mq), 2);
}

#[tokio::test]
async fn a_manual_ack_delivery_dropped_unfinished_is_delivered_again() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 2).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let d = recv(&mut c).await;
    assert_eq!(d.offset(), 0);
    drop(d);
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.in_flight), (0, 0), "released");
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (0, 1));
    // Manual ack never acks on recv or on the consumer's drop.
    d.ack().await.unwrap();
    let d = recv(&mut c).await;
    assert_eq!(d.offset(), 1);
    let mut other = common_groups::manual(&mq, TOPIC, GROUP, 1);
    drop(c);
    assert_eq!(cursor(&mq), 1);
    drop(d);
    assert_eq!(recv(&mut other).await.offset(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_ack_delivery_dropped_in_another_task_is_released() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 1).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let d = recv(&mut c).await;
    tokio::spawn(async move { drop(d) }).await.unwrap();
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (0, 1));
}

// ---- the replay window after a kill ------------------------------------------------

/// No periodic commit during the test: only `Spool::commit` persists auto-acks.
const KILL_CONN: &str = "Commit Interval Ms=3600000";

/// Child role: auto-acks 0 and 1, commits, auto-acks 2 and 3 (in memory only), aborts
/// while 4 is out.
#[tokio::test]
async fn child_auto_acks_then_is_killed() {
    let Some((role, dir)) = common_groups::child_role() else {
        return;
    };
    assert_eq!(role, "auto-ack-kill");
    let mq = open(&dir, KILL_CONN);
    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    for o in 0..3 {
        assert_eq!(recv(&mut c).await.offset(), o);
    }
    mq.commit().unwrap(); // cursor 2 is durable; 2 is out
    for o in 3..5 {
        assert_eq!(recv(&mut c).await.offset(), o);
    }
    assert_eq!(cursor(&mq), 4);
    std::process::abort();
}

#[tokio::test]
async fn after_a_kill_auto_acks_since_the_last_commit_are_replayed_never_skipped() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mq = open(dir.path(), KILL_CONN);
        publish_n(&mq, TOPIC, 6).await;
        mq.close().await.unwrap();
    }
    let status = common_groups::run_child(
        "child_auto_acks_then_is_killed",
        "auto-ack-kill",
        dir.path(),
        &[],
    );
    common_groups::assert_aborted(status);

    let mq = open(dir.path(), KILL_CONN);
    assert_eq!(
        cursor(&mq),
        2,
        "the committed cursor, not the in-memory one"
    );
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let mut got = Vec::new();
    while let Some(d) = c.recv_timeout(common_groups::NOTHING).await.unwrap() {
        got.push((d.offset(), d.attempt()));
        d.ack().await.unwrap();
    }
    assert_eq!(
        got,
        vec![(2, 2), (3, 1), (4, 1), (5, 1)],
        "2..=4 are replayed (2 was out at the last commit, so it carries an unclean-stop \
         attempt); nothing is skipped"
    );
}

/// Child role: auto-acks 0..=2 with a short commit interval, waits well past it, aborts.
#[tokio::test]
async fn child_auto_acks_waits_then_is_killed() {
    let Some((role, dir)) = common_groups::child_role() else {
        return;
    };
    assert_eq!(role, "auto-ack-wait-kill");
    let mq = open(&dir, "Commit Interval Ms=10");
    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    for o in 0..3 {
        assert_eq!(recv(&mut c).await.offset(), o);
    }
    assert_eq!(cursor(&mq), 2);
    // A hundred commit intervals: the background commit has certainly run.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    std::process::abort();
}

#[tokio::test]
async fn the_background_commit_persists_auto_acks_within_the_commit_interval() {
    let dir = common_groups::publish_then_abort_child(
        TOPIC,
        4,
        "child_auto_acks_waits_then_is_killed",
        "auto-ack-wait-kill",
    )
    .await;
    let mq = open(dir.path(), "");
    assert_eq!(
        cursor(&mq),
        2,
        "the auto-acks of 0 and 1 were committed before the kill"
    );
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let d = recv(&mut c).await;
    assert_eq!(d.offset(), 2, "only the delivery that was out is replayed");
}

/// Child role: auto-acks 0..3 of 100 records lent to it (the rest of the loan still
/// unread), touches nothing else of the group, waits a hundred commit intervals, aborts.
#[tokio::test]
async fn child_auto_acks_part_of_a_loan_waits_then_is_killed() {
    let Some((role, dir)) = common_groups::child_role() else {
        return;
    };
    assert_eq!(role, "auto-ack-loan-kill");
    let mq = open(&dir, "Commit Interval Ms=10");
    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    for o in 0..4 {
        assert_eq!(recv(&mut c).await.offset(), o);
    }
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    std::process::abort();
}

/// The commit tick walks the groups only when one turned dirty (issue 31 point 5); a
/// loan of read-ahead records marks its group when it is made, so the tick still takes
/// back a loan nobody touches and persists the auto-acks made through it.
#[tokio::test]
async fn the_background_commit_persists_auto_acks_made_through_a_loan() {
    let dir = common_groups::publish_then_abort_child(
        TOPIC,
        100,
        "child_auto_acks_part_of_a_loan_waits_then_is_killed",
        "auto-ack-loan-kill",
    )
    .await;
    let mq = open(dir.path(), "");
    assert_eq!(cursor(&mq), 3, "the auto-acks of 0, 1 and 2 were committed");
}

// An auto-ack consumer is lent the records it reads ahead and hands them out without the
// group lock; every other operation on the group takes the loan back first. These check
// that nothing about the rules above changes with a loan outstanding.

#[tokio::test]
async fn a_nack_in_auto_mode_is_redelivered_before_the_records_read_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 300).await;
    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    for i in 0..5 {
        assert_eq!(recv(&mut c).await.offset(), i);
    }
    let d = recv(&mut c).await;
    assert_eq!(d.offset(), 5);
    d.nack("try again").await.unwrap();
    let again = recv(&mut c).await;
    assert_eq!((again.offset(), again.attempt()), (5, 2));
    assert_eq!(recv(&mut c).await.offset(), 6);
    assert_eq!(cursor(&mq), 6);
}

#[tokio::test]
async fn consumers_of_one_group_sharing_read_ahead_records_get_each_once() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 2000).await;
    let mut a = mq.consumer(TOPIC, GROUP).max_in_flight(2).build().unwrap();
    let mut b = mq.consumer(TOPIC, GROUP).max_in_flight(2).build().unwrap();
    let mut seen = Vec::new();
    for i in 0..2000 {
        // Uneven turns: a takes runs from its loan, b takes the loan back in between.
        let c = if i % 7 < 5 { &mut a } else { &mut b };
        seen.push(recv(c).await.offset());
    }
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..2000).collect::<Vec<u64>>(),
        "each record exactly once"
    );
    drop(a);
    drop(b);
    assert_eq!(cursor(&mq), 2000);
}

#[tokio::test]
async fn group_info_and_reset_see_through_a_loan() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 500).await;
    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    for i in 0..40 {
        assert_eq!(recv(&mut c).await.offset(), i);
    }
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(
        (info.cursor, info.in_flight),
        (39, 1),
        "39 auto-acked, 39 out"
    );
    assert_eq!(recv(&mut c).await.offset(), 40);
    mq.reset_offset(TOPIC, GROUP, spool::OffsetReset::Explicit(10))
        .await
        .unwrap();
    assert_eq!(
        recv(&mut c).await.offset(),
        10,
        "the reset takes the loan back"
    );
    assert_eq!(recv(&mut c).await.offset(), 11);
    mq.commit().unwrap();
    drop(c);
    assert_eq!(cursor(&mq), 12);
}

#[tokio::test]
async fn a_closed_instance_hands_out_nothing_more_from_a_loan() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 100).await;
    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    assert_eq!(recv(&mut c).await.offset(), 0);
    mq.close().await.unwrap();
    assert!(matches!(c.recv().await, Err(spool::Error::Closed)));
    drop(c);
    let mq = open(dir.path(), "");
    // The delivery out at the close was released, not acked: it comes again.
    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    assert_eq!(recv(&mut c).await.offset(), 0);
}

/// A handler that panics did not handle its message: the auto-ack delivery it held counts
/// as a failed attempt as the panic unwinds, so neither the consumer's drop nor a later
/// `recv` acks it, and the message comes again (at-least-once holds for a crashing handler
/// too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_dropped_by_a_panicking_handler_is_delivered_again() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 3).await;
    // The whole task dies: the consumer is dropped after the delivery, both while unwinding.
    let mq2 = mq.clone();
    panics(async move {
        let mut c = mq2.consumer(TOPIC, GROUP).build().unwrap();
        let d = recv(&mut c).await;
        assert_eq!(d.offset(), 0);
        panic!("the handler of offset {} failed", d.offset());
    })
    .await;
    assert_eq!(cursor(&mq), 0);
    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    let again = recv(&mut c).await;
    assert_eq!((again.offset(), again.attempt()), (0, 2), "delivered again");
    // The consumer outlives the panic (caught around the handler): its next `recv` does
    // not ack the delivery the panic dropped either.
    let d = recv(&mut c).await;
    assert_eq!(d.offset(), 1);
    panic_with(d);
    let again = recv(&mut c).await;
    assert_eq!((again.offset(), again.attempt()), (1, 2), "delivered again");
    assert_eq!(recv(&mut c).await.offset(), 2);
    c.close().await.unwrap();
    assert_eq!(cursor(&mq), 3);
}

/// The same when the delivery outlives its consumer while the panic unwinds (declared
/// before it): the consumer's drop leaves its last delivery to that delivery's own drop,
/// which charges it, instead of acking it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_dropped_after_its_consumer_by_a_panic_is_delivered_again() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 2).await;
    let mq2 = mq.clone();
    panics(async move {
        let d;
        let mut c = mq2.consumer(TOPIC, GROUP).build().unwrap();
        d = recv(&mut c).await;
        assert_eq!(d.offset(), 0);
        panic!("the handler of offset {} failed", d.offset());
    })
    .await;
    assert_eq!(cursor(&mq), 0);
    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    assert_eq!(recv(&mut c).await.offset(), 0, "delivered again");
    assert_eq!(recv(&mut c).await.offset(), 1);
    c.close().await.unwrap();
    assert_eq!(cursor(&mq), 2);
}
