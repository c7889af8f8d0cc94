//! Issue 31 point 1 (batches): `recv_batch` returns what is ready up to `max` and the
//! group's room; `ack_all` acks a batch with one catalog commit and `nack_all` nacks it with
//! one (dead-lettering at the limit, the copy before the cursor moves); acks made back to
//! back (`join_all`) share a commit too; a stale or expired delivery among them fails
//! alone. Commits are counted with the doc-hidden `Spool::catalog_commits`; nothing here
//! asserts timing.

mod common_groups;

use std::time::Duration;

use common_groups::{WAIT, all_records, manual, open, publish_n};
use spool::consts::{X_DELIVERY_ATTEMPTS, X_ORIGINAL_OFFSET};
use spool::{Delivery, Error, OffsetReset, Spool};

const TOPIC: &str = "batch.events";
const GROUP: &str = "workers";
/// No periodic commit of cursors (the ticker would add commits to the counts).
const QUIET: &str = "Commit Interval Ms=3600000";

/// Every commit queued so far has landed (`commit` waits behind them), so a count taken
/// after this one sees only what the test does next.
fn settled_commits(mq: &Spool) -> u64 {
    mq.commit().expect("commit");
    mq.catalog_commits()
}

async fn batch(c: &mut spool::Consumer, max: usize) -> Vec<Delivery> {
    tokio::time::timeout(WAIT, c.recv_batch(max))
        .await
        .expect("a batch in time")
        .expect("recv_batch")
}

#[tokio::test]
async fn recv_batch_returns_what_is_ready_up_to_max_and_the_groups_room() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 10).await;
    let mut c = manual(&mq, TOPIC, GROUP, 4);
    let first = batch(&mut c, 100).await;
    let offsets: Vec<u64> = first.iter().map(Delivery::offset).collect();
    assert_eq!(
        offsets,
        [0, 1, 2, 3],
        "the group's room (max_in_flight 4) bounds it"
    );
    c.ack_all(first).await.unwrap();
    let second = batch(&mut c, 3).await;
    assert_eq!(
        second.iter().map(Delivery::offset).collect::<Vec<_>>(),
        [4, 5, 6]
    );
    c.ack_all(second).await.unwrap();
    let rest = batch(&mut c, 100).await;
    assert_eq!(
        rest.iter().map(Delivery::offset).collect::<Vec<_>>(),
        [7, 8, 9]
    );
    assert!(
        c.recv_batch(0).await.unwrap().is_empty(),
        "max 0: at once, empty"
    );
    c.ack_all(rest).await.unwrap();
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 10);

    // It waits for at least one, then returns it without waiting for `max`.
    let waiter = tokio::spawn(async move {
        let got = batch(&mut c, 50).await;
        got.iter().map(Delivery::offset).collect::<Vec<_>>()
    });
    publish_n(&mq, TOPIC, 1).await;
    assert_eq!(waiter.await.unwrap(), [10]);
}

#[tokio::test]
async fn ack_all_of_100_deliveries_takes_exactly_one_commit() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), QUIET);
    publish_n(&mq, TOPIC, 300).await;
    let mut c = manual(&mq, TOPIC, GROUP, 100);
    for round in 0..3 {
        let ds = batch(&mut c, 100).await;
        assert_eq!(ds.len(), 100);
        let before = settled_commits(&mq);
        c.ack_all(ds).await.unwrap();
        // Exactly one: the ack_all's own commit, and nothing else runs meanwhile.
        assert_eq!(mq.catalog_commits() - before, 1, "round {round}");
    }
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 300);
    // Durable: a reopen starts after them.
    mq.close().await.unwrap();
    let mq = open(dir.path(), QUIET);
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 300);
}

/// The plain pattern: `join_all` of 100 `d.ack()`. The acks share commits: the
/// committer, woken by the first ack, waits while acks are being made and their futures
/// polled (`join_all` polls them all right after the last is made). Normally one commit
/// per 100 acks; asserted: at most 10, since the wait is bounded (at most 250 µs) and a
/// loaded machine may preempt the test's thread in the middle of a burst. Acks that did
/// not share would take 100 (benches/throughput.rs measures the pattern's speed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_all_of_100_acks_shares_commits() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), QUIET);
    publish_n(&mq, TOPIC, 300).await;
    let mut c = manual(&mq, TOPIC, GROUP, 100);
    let mut counts = Vec::new();
    for _ in 0..3 {
        let ds = batch(&mut c, 100).await;
        assert_eq!(ds.len(), 100);
        let before = settled_commits(&mq);
        for r in futures_util::future::join_all(ds.into_iter().map(|d| d.ack())).await {
            r.unwrap();
        }
        counts.push(mq.catalog_commits() - before);
    }
    assert!(
        counts.iter().all(|&n| (1..=10).contains(&n)),
        "commits per batch of 100 acks: {counts:?}"
    );
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 300);
}

#[tokio::test]
async fn nack_all_redelivers_the_batch_with_one_commit() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), QUIET);
    publish_n(&mq, TOPIC, 20).await;
    let mut c = manual(&mq, TOPIC, GROUP, 20);
    let ds = batch(&mut c, 20).await;
    let before = settled_commits(&mq);
    let outcomes = c.nack_all(ds, "downstream down").await.unwrap();
    assert_eq!(mq.catalog_commits() - before, 1);
    assert_eq!(outcomes.len(), 20);
    assert!(outcomes.iter().all(|o| o.delivery_attempt == 1
        && !o.dead_lettered
        && o.next_offset == 0
        && o.redeliver_at.is_none()));
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(
        (info.cursor, info.in_flight, info.pending.len()),
        (0, 0, 20)
    );
    assert!(
        info.pending
            .iter()
            .all(|p| p.attempts == 1 && p.last_reason == "downstream down")
    );
    // Delivered again, in order, one attempt higher.
    let again = batch(&mut c, 20).await;
    assert_eq!(
        again.iter().map(Delivery::offset).collect::<Vec<_>>(),
        (0..20).collect::<Vec<_>>()
    );
    assert!(again.iter().all(|d| d.attempt() == 2));
    c.ack_all(again).await.unwrap();
    // The attempts survive a reopen (durable), and the acks cleared them.
    mq.close().await.unwrap();
    let mq = open(dir.path(), QUIET);
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.pending.len()), (20, 0));
}

#[tokio::test]
async fn nack_all_dead_letters_once_at_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "Max Delivery Attempts=3");
    publish_n(&mq, TOPIC, 5).await;
    let mut c = manual(&mq, TOPIC, GROUP, 5);
    for attempt in 1..=3u32 {
        let ds = batch(&mut c, 5).await;
        assert_eq!(ds.len(), 5);
        assert!(ds.iter().all(|d| d.attempt() == attempt));
        let outcomes = c.nack_all(ds, "poison").await.unwrap();
        let last = attempt == 3;
        assert!(
            outcomes
                .iter()
                .all(|o| o.delivery_attempt == attempt && o.dead_lettered == last)
        );
        let cursor = if last { 5 } else { 0 };
        assert!(outcomes.iter().all(|o| o.next_offset == cursor));
    }
    let copies = all_records(&mq, &format!("{TOPIC}.dlq")).await;
    let originals: Vec<&str> = copies
        .iter()
        .map(|r| r.headers()[X_ORIGINAL_OFFSET].as_str())
        .collect();
    assert_eq!(
        originals,
        ["0", "1", "2", "3", "4"],
        "one copy each, in order"
    );
    assert!(
        copies
            .iter()
            .all(|r| r.headers()[X_DELIVERY_ATTEMPTS] == "3")
    );
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(
        (info.cursor, info.dead_lettered, info.pending.len()),
        (5, 5, 0)
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(30), c.recv())
            .await
            .is_err()
    );
}

/// A reset makes the deliveries out stale: in a batch, each stale one fails alone (its
/// ack or nack changes nothing, as a single one would) and the others are acked or
/// nacked; the call returns the first stale delivery's error after they are durable.
#[tokio::test]
async fn a_stale_delivery_in_a_batch_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), QUIET);
    publish_n(&mq, TOPIC, 6).await;
    let mut c = manual(&mq, TOPIC, GROUP, 6);
    let old = batch(&mut c, 2).await;
    assert_eq!(old.iter().map(Delivery::offset).collect::<Vec<_>>(), [0, 1]);
    // Reset to 2: offsets 0 and 1 are behind the cursor, their deliveries stale.
    assert_eq!(
        mq.reset_offset(TOPIC, GROUP, OffsetReset::Explicit(2))
            .await
            .unwrap(),
        2
    );
    let fresh = batch(&mut c, 4).await;
    assert_eq!(
        fresh.iter().map(Delivery::offset).collect::<Vec<_>>(),
        [2, 3, 4, 5]
    );
    let mut fresh = fresh.into_iter();
    let (a, b) = (fresh.next().unwrap(), fresh.next().unwrap());
    let mut old = old.into_iter();
    let mixed = vec![a, old.next().unwrap(), b];
    let e = c.ack_all(mixed).await.unwrap_err();
    assert!(matches!(e, Error::StaleDelivery { offset: 0 }), "{e:?}");
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(
        (info.cursor, info.in_flight),
        (4, 2),
        "2 and 3 acked all the same"
    );

    let mixed: Vec<Delivery> = old.chain(fresh).collect();
    let e = c.nack_all(mixed, "later").await.unwrap_err();
    assert!(matches!(e, Error::StaleDelivery { offset: 1 }), "{e:?}");
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.in_flight), (4, 0));
    let pending: Vec<(u64, u32)> = info
        .pending
        .iter()
        .map(|p| (p.offset, p.attempts))
        .collect();
    assert_eq!(pending, [(4, 1), (5, 1)], "4 and 5 nacked all the same");
    // Durable before the error was returned.
    mq.close().await.unwrap();
    let mq = open(dir.path(), QUIET);
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().pending.len(), 2);
}

/// An expired delivery in a batch fails with `DeliveryExpired` and changes nothing; the
/// others are acked.
#[tokio::test]
async fn an_expired_delivery_in_a_batch_fails_alone_with_delivery_expired() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), QUIET);
    publish_n(&mq, TOPIC, 2).await;
    // Both built first, and a deadline a loaded machine cannot outrun between the two
    // receives: offset 0 must still be out with `short` when `long` asks.
    let mut short = mq
        .consumer(TOPIC, GROUP)
        .manual_ack()
        .max_in_flight(2)
        .ack_deadline(Duration::from_millis(2000))
        .build()
        .unwrap();
    let mut long = mq
        .consumer(TOPIC, GROUP)
        .manual_ack()
        .max_in_flight(2)
        .ack_deadline(Duration::from_secs(3600))
        .build()
        .unwrap();
    let expired = batch(&mut short, 1).await.pop().unwrap();
    let alive = batch(&mut long, 1).await.pop().unwrap();
    assert_eq!((expired.offset(), alive.offset()), (0, 1));
    while expired
        .deadline()
        .is_some_and(|d| d > std::time::Instant::now())
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let e = long.ack_all(vec![expired, alive]).await.unwrap_err();
    assert!(
        matches!(e, Error::DeliveryExpired { offset: 0, .. }),
        "{e:?}"
    );
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(info.cursor, 0, "offset 0 was taken back, not acked");
    assert_eq!(
        info.pending.iter().map(|p| p.offset).collect::<Vec<_>>(),
        [0]
    );
    // Offset 1 was acked: the redelivery of 0 is all that is left.
    let again = batch(&mut long, 10).await;
    assert_eq!(
        again
            .iter()
            .map(|d| (d.offset(), d.attempt()))
            .collect::<Vec<_>>(),
        [(0, 2)]
    );
    long.ack_all(again).await.unwrap();
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 2);
}

/// Auto-ack: a batch is acked when the consumer asks for the next one, never when it is
/// handed out; a batch dropped by a crash before that is delivered again.
#[tokio::test]
async fn an_auto_ack_batch_is_acked_when_the_next_is_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), QUIET);
    publish_n(&mq, TOPIC, 10).await;
    let mut c = mq.consumer(TOPIC, GROUP).max_in_flight(4).build().unwrap();
    let first = batch(&mut c, 4).await;
    assert_eq!(first.len(), 4);
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(
        (info.cursor, info.in_flight),
        (0, 4),
        "not acked at hand-out"
    );
    drop(first);
    let second = batch(&mut c, 4).await;
    assert_eq!(
        second.iter().map(Delivery::offset).collect::<Vec<_>>(),
        [4, 5, 6, 7]
    );
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 4);
    // A plain recv acks the batch before it, too.
    let d = c.recv().await.unwrap();
    assert_eq!(d.offset(), 8);
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 8);
    drop(d);
    c.close().await.unwrap();
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 9);
}

#[test]
fn the_blocking_facade_has_the_batch_calls() {
    let dir = tempfile::tempdir().unwrap();
    let mq = spool::blocking::Spool::open(&common_groups::conn(dir.path(), QUIET)).unwrap();
    for i in 0..5u8 {
        mq.publish(TOPIC, vec![i], &spool::Headers::new()).unwrap();
    }
    let mut c = mq
        .consumer(TOPIC, GROUP)
        .manual_ack()
        .max_in_flight(5)
        .build()
        .unwrap();
    let ds = c.recv_batch(3).unwrap();
    assert_eq!(ds.len(), 3);
    c.ack_all(ds).unwrap();
    let ds = c.recv_batch(10).unwrap();
    assert_eq!(ds.len(), 2);
    let outcomes = c.nack_all(ds, "again").unwrap();
    assert_eq!(
        outcomes
            .iter()
            .map(|o| o.delivery_attempt)
            .collect::<Vec<_>>(),
        [1, 1]
    );
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 3);
    mq.close().unwrap();
}

/// Key order holds in batches: one delivery per key is out, and a nacked batch comes back
/// in the same order.
#[tokio::test]
async fn a_key_ordered_batch_holds_one_delivery_per_key() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), QUIET);
    for k in ["a", "a", "b"] {
        let h = common_groups::headers(&[(spool::consts::MESSAGE_KEY_HEADER, k)]);
        mq.publish(TOPIC, b"x".to_vec(), &h).await.unwrap();
    }
    let mut c = mq
        .consumer(TOPIC, GROUP)
        .manual_ack()
        .max_in_flight(10)
        .key_ordered()
        .build()
        .unwrap();
    let ds = batch(&mut c, 10).await;
    assert_eq!(ds.iter().map(Delivery::offset).collect::<Vec<_>>(), [0, 2]);
    c.nack_all(ds, "retry").await.unwrap();
    let ds = batch(&mut c, 10).await;
    assert_eq!(
        ds.iter()
            .map(|d| (d.offset(), d.attempt()))
            .collect::<Vec<_>>(),
        [(0, 2), (2, 2)]
    );
    c.ack_all(ds).await.unwrap();
    let ds = batch(&mut c, 10).await;
    assert_eq!(ds.iter().map(Delivery::offset).collect::<Vec<_>>(), [1]);
    c.ack_all(ds).await.unwrap();
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 3);
}
