//! Guards issue 3 point 2 (ack): the cursor is the ack floor — out-of-order acks wait above
//! it, a nacked or unfinished offset holds it, the floor and the acks above it survive a
//! reopen — and low-level ack/nack of any offset but the cursor is `NotAtCursor`.

mod common_groups;

use common_groups::{assert_nothing, open, publish_n, recv};
use spool::{Delivery, Error};

const TOPIC: &str = "floor.events";
const GROUP: &str = "workers";

/// `n` deliveries in slots indexed by offset, so they can be finished in any order.
async fn take_slots(c: &mut spool::Consumer, n: usize) -> Vec<Option<Delivery>> {
    common_groups::take(c, n)
        .await
        .into_iter()
        .map(Some)
        .collect()
}

#[tokio::test]
async fn nack_5_while_acking_6_to_9_leaves_the_cursor_at_5_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 10).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 10);
    let ds = common_groups::take(&mut c, 10).await;
    assert_eq!(
        ds.iter().map(Delivery::offset).collect::<Vec<_>>(),
        (0..10).collect::<Vec<_>>()
    );
    let mut ds: Vec<Option<Delivery>> = ds.into_iter().map(Some).collect();
    // Acks above the floor first, in reverse order, then the floor itself.
    for o in [9, 8, 7, 6] {
        ds[o].take().unwrap().ack().await.unwrap();
    }
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 0);
    for o in [0, 1, 2, 3, 4] {
        ds[o].take().unwrap().ack().await.unwrap();
    }
    let out = ds[5].take().unwrap().nack("bad").await.unwrap();
    assert_eq!(out.next_offset, 5);
    assert!(!out.dead_lettered);
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.lag, info.in_flight), (5, 5, 0));

    // Before the reopen: 5 is the one redelivery, nothing else.
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (5, 2));
    drop(d); // released: still unfinished
    drop(c);
    mq.close().await.unwrap();

    let mq = open(dir.path(), "");
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 5);
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 10);
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (5, 2));
    assert_nothing(&mut c).await; // 6..=9 are done; nothing else is left
    d.ack().await.unwrap();
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.lag), (10, 0));
    publish_n(&mq, TOPIC, 1).await;
    assert_eq!(
        recv(&mut c).await.offset(),
        10,
        "6..=9 are never redelivered"
    );
}

#[tokio::test]
async fn an_unfinished_delivery_holds_the_floor_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 10).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 10);
    let mut ds = take_slots(&mut c, 10).await;
    for o in [0, 1, 2, 4, 6, 7, 9] {
        ds[o].take().unwrap().ack().await.unwrap();
    }
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.in_flight), (3, 3));
    // 3, 5 and 8 are still out when the instance closes.
    mq.close().await.unwrap();
    drop(ds);
    drop(c);

    let mq = open(dir.path(), "");
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.in_flight), (3, 0));
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 10);
    let ds = common_groups::take(&mut c, 3).await;
    assert_eq!(
        ds.iter()
            .map(|d| (d.offset(), d.attempt()))
            .collect::<Vec<_>>(),
        vec![(3, 1), (5, 1), (8, 1)],
        "a clean close releases what was out without counting an attempt"
    );
    assert_nothing(&mut c).await;
    for d in ds.into_iter().rev() {
        d.ack().await.unwrap();
    }
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 10);
}

#[tokio::test]
async fn out_of_order_acks_advance_the_floor_only_over_a_contiguous_run() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 6).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 6);
    let mut ds = take_slots(&mut c, 6).await;
    let mut floors = Vec::new();
    for o in [5, 3, 1, 0, 4, 2] {
        ds[o].take().unwrap().ack().await.unwrap();
        floors.push(mq.group_info(TOPIC, GROUP).unwrap().cursor);
    }
    assert_eq!(floors, vec![0, 0, 0, 2, 2, 6]);
}

#[tokio::test]
async fn low_level_ack_and_nack_of_another_offset_is_not_at_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 5).await;

    let r = mq.ack(TOPIC, GROUP, 2).await;
    assert!(
        matches!(
            r,
            Err(Error::NotAtCursor {
                expected: 0,
                actual: 2
            })
        ),
        "{r:?}"
    );
    let r = mq.nack(TOPIC, GROUP, 1, "no").await;
    assert!(
        matches!(
            r,
            Err(Error::NotAtCursor {
                expected: 0,
                actual: 1
            })
        ),
        "{r:?}"
    );
    // The failed calls changed nothing.
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.in_flight), (0, 0));
    assert!(info.pending.is_empty());

    mq.ack(TOPIC, GROUP, 0).await.unwrap();
    mq.ack(TOPIC, GROUP, 1).await.unwrap();
    let r = mq.ack(TOPIC, GROUP, 1).await;
    assert!(
        matches!(
            r,
            Err(Error::NotAtCursor {
                expected: 2,
                actual: 1
            })
        ),
        "acking an offset twice: {r:?}"
    );
    let out = mq.nack(TOPIC, GROUP, 2, "retry").await.unwrap();
    assert_eq!((out.delivery_attempt, out.next_offset), (1, 2));
    let r = mq.ack(TOPIC, GROUP, 3).await;
    assert!(
        matches!(
            r,
            Err(Error::NotAtCursor {
                expected: 2,
                actual: 3
            })
        ),
        "a nacked cursor stays the cursor: {r:?}"
    );
    mq.ack(TOPIC, GROUP, 2).await.unwrap();
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 3);

    // Durable: the low-level acks survive a reopen.
    mq.close().await.unwrap();
    let mq = open(dir.path(), "");
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 3);
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    assert_eq!(recv(&mut c).await.offset(), 3);
}

#[tokio::test]
async fn low_level_ack_past_the_log_end_is_an_error_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 1).await;
    mq.ack(TOPIC, GROUP, 0).await.unwrap();
    let r = mq.ack(TOPIC, GROUP, 1).await;
    assert!(r.is_err(), "offset 1 does not exist yet: {r:?}");
    let r = mq.nack(TOPIC, GROUP, 1, "x").await;
    assert!(r.is_err(), "offset 1 does not exist yet: {r:?}");
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(info.cursor, 1);
    assert!(info.pending.is_empty());
    publish_n(&mq, TOPIC, 1).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (1, 1));
}

#[tokio::test]
async fn low_level_ack_of_a_cursor_that_is_out_fences_the_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 3).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let d = recv(&mut c).await;
    assert_eq!(d.offset(), 0);
    mq.ack(TOPIC, GROUP, 0).await.unwrap();
    // The delivery of 0 was finished by someone else: acking it again must not move the
    // floor a second time.
    let r = d.ack().await;
    assert!(
        matches!(r, Err(Error::StaleDelivery { offset: 0 })),
        "{r:?}"
    );
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.in_flight), (1, 0));
    assert_eq!(recv(&mut c).await.offset(), 1);
}

/// Child role: with 10 in flight, acks 9..=6 and 0..=4 explicitly, nacks 5, then aborts.
#[tokio::test]
async fn child_acks_around_a_nack_then_aborts() {
    let Some((role, dir)) = common_groups::child_role() else {
        return;
    };
    assert_eq!(role, "floor-abort");
    let mq = open(&dir, "");
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 10);
    let mut ds = take_slots(&mut c, 10).await;
    for o in [9, 8, 7, 6, 0, 1, 2, 3, 4] {
        ds[o].take().unwrap().ack().await.unwrap();
    }
    ds[5].take().unwrap().nack("bad").await.unwrap();
    std::process::abort();
}

#[tokio::test]
async fn the_ack_floor_and_the_acks_above_it_survive_a_process_abort() {
    let dir = common_groups::publish_then_abort_child(
        TOPIC,
        11,
        "child_acks_around_a_nack_then_aborts",
        "floor-abort",
    )
    .await;

    let mq = open(dir.path(), "");
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(
        info.cursor, 5,
        "every explicit ack was durable when it returned"
    );
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 10);
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (5, 2), "only the nack counted");
    let d10 = recv(&mut c).await;
    assert_eq!(d10.offset(), 10, "6..=9 are not delivered again");
    assert_nothing(&mut c).await;
    d.ack().await.unwrap();
    d10.ack().await.unwrap();
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 11);
}
