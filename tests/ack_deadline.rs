//! Issue 27 point 2 (ack deadlines): a delivery neither acked nor nacked in time is
//! taken back as a failed attempt, goes to any consumer of the group, dead-letters at the
//! limit with the deadline's reason; its late ack, nack or extension fails with
//! `DeliveryExpired` and changes nothing; a stuck handler no longer stalls its group.
//! Timing: only lower bounds are asserted; `WAIT` guards against hangs.

mod common_groups;

use std::time::{Duration, Instant};

use common_groups::{all_records, manual, open, publish_n, recv};
use spool::consts::{ACK_DEADLINE_REASON, X_DEAD_LETTER_REASON};
use spool::{Error, Spool};

const TOPIC: &str = "deadline.events";
const GROUP: &str = "workers";

fn with_deadline(mq: &Spool, max_in_flight: usize, deadline: Duration) -> spool::Consumer {
    mq.consumer(TOPIC, GROUP)
        .manual_ack()
        .max_in_flight(max_in_flight)
        .ack_deadline(deadline)
        .build()
        .expect("consumer")
}

fn is_expired(e: &Error, offset: u64) -> bool {
    matches!(e, Error::DeliveryExpired { offset: o, topic, group }
        if *o == offset && topic == TOPIC && group == GROUP)
}

#[tokio::test]
async fn a_stuck_handler_no_longer_stalls_its_group() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 2).await;
    let deadline = Duration::from_millis(200);
    let mut stuck = with_deadline(&mq, 1, deadline);
    let mut other = with_deadline(&mq, 1, deadline);
    let held = recv(&mut stuck).await;
    let start = Instant::now();
    // The other consumer waits for the group's only slot, and gets the message once
    // the deadline took it back.
    let again = recv(&mut other).await;
    assert!(start.elapsed() + Duration::from_millis(5) >= deadline);
    assert_eq!((again.offset(), again.attempt()), (0, 2));
    let pending = mq.group_info(TOPIC, GROUP).unwrap().pending;
    assert_eq!(pending[0].last_reason, ACK_DEADLINE_REASON);
    // The late ack of the stuck handler changes nothing.
    let e = held.ack().await.unwrap_err();
    assert!(is_expired(&e, 0), "{e}");
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 0);
    again.ack().await.unwrap();
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 1);
}

#[tokio::test]
async fn the_deadline_can_be_extended_until_it_passes() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 1).await;
    let deadline = Duration::from_secs(2);
    let mut c = with_deadline(&mq, 1, deadline);
    let before = Instant::now();
    let d = recv(&mut c).await;
    let first = d.deadline().expect("a deadline");
    assert!(first >= before + deadline && first <= Instant::now() + deadline);
    tokio::time::sleep(Duration::from_millis(20)).await;
    d.extend_deadline().unwrap();
    assert!(
        d.deadline().unwrap() > first,
        "extending restarts it from now"
    );
    tokio::time::sleep_until(d.deadline().unwrap().into()).await;
    let e = d.extend_deadline().unwrap_err();
    assert!(is_expired(&e, 0), "{e}");
    let e = d.nack("too late").await.unwrap_err();
    assert!(is_expired(&e, 0), "{e}");
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(info.pending.len(), 1);
    assert_eq!(
        info.pending[0].attempts, 1,
        "the expiry counted once, the late nack not"
    );
}

#[tokio::test]
async fn an_expired_delivery_frees_its_slot_and_leaves_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 3).await;
    let mut c = with_deadline(&mq, 2, Duration::from_secs(2));
    let (a, b) = (recv(&mut c).await, recv(&mut c).await);
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().in_flight, 2);
    tokio::time::sleep_until(b.deadline().unwrap().into()).await;
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(info.in_flight, 0);
    assert_eq!(info.pending.len(), 2);
    // Both come again, first in offset order, before the fresh one.
    let (a2, b2) = (recv(&mut c).await, recv(&mut c).await);
    assert_eq!((a2.offset(), b2.offset()), (a.offset(), b.offset()));
    assert_eq!((a2.attempt(), b2.attempt()), (2, 2));
}

#[tokio::test]
async fn expiries_dead_letter_at_the_limit_with_the_deadline_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "Max Delivery Attempts=2");
    publish_n(&mq, TOPIC, 2).await;
    let mut c = with_deadline(&mq, 1, Duration::from_millis(50));
    let mut held = Vec::new();
    for attempt in 1..=2 {
        let d = recv(&mut c).await;
        assert_eq!((d.offset(), d.attempt()), (0, attempt));
        held.push(d); // never acked: each expires
    }
    let next = recv(&mut c).await;
    assert_eq!(next.offset(), 1, "the second expiry dead-lettered offset 0");
    let dlq = all_records(&mq, &format!("{TOPIC}.dlq")).await;
    assert_eq!(dlq.len(), 1);
    assert_eq!(
        dlq[0]
            .headers()
            .get(X_DEAD_LETTER_REASON)
            .map(String::as_str),
        Some(ACK_DEADLINE_REASON)
    );
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.dead_lettered), (1, 1));
}

#[tokio::test]
async fn the_connection_string_sets_it_and_the_builder_wins() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "Ack Deadline Ms=60000");
    publish_n(&mq, TOPIC, 2).await;
    let mut c = manual(&mq, TOPIC, GROUP, 2);
    let d = recv(&mut c).await;
    let at = d.deadline().expect("the instance's deadline applies");
    assert!(at > Instant::now() + Duration::from_secs(50));
    drop(c);
    let mut none = with_deadline(&mq, 2, Duration::ZERO);
    let d = recv(&mut none).await;
    assert_eq!(d.deadline(), None, "zero in the builder turns it off");
    d.extend_deadline()
        .expect("nothing to do without a deadline");
}

#[tokio::test]
async fn an_auto_ack_consumer_gets_a_message_again_after_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 2).await;
    // Long enough for the last `recv` to come well before the redelivery's deadline.
    let deadline = Duration::from_secs(2);
    let mut c = mq
        .consumer(TOPIC, GROUP)
        .ack_deadline(deadline)
        .build()
        .unwrap();
    let d = recv(&mut c).await;
    assert_eq!(d.offset(), 0);
    // The handler takes longer than the deadline: its auto-ack changes nothing.
    tokio::time::sleep_until(d.deadline().unwrap().into()).await;
    let again = recv(&mut c).await;
    assert_eq!((again.offset(), again.attempt()), (0, 2));
    assert_eq!(recv(&mut c).await.offset(), 1, "acked in time this time");
}

#[tokio::test]
async fn a_huge_deadline_or_delay_is_bounded_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 2).await;
    let mut c = with_deadline(&mq, 2, Duration::MAX);
    let d = recv(&mut c).await;
    assert!(d.deadline().unwrap() > Instant::now() + Duration::from_secs(365 * 24 * 3600));
    d.extend_deadline().unwrap();
    let out = d.nack_with_delay("forever", Duration::MAX).await.unwrap();
    let years = out
        .redeliver_at
        .unwrap()
        .duration_since(std::time::SystemTime::now())
        .unwrap()
        .as_secs()
        / (365 * 24 * 3600);
    assert!((9..=10).contains(&years), "about ten years: {years}");
    assert_eq!(recv(&mut c).await.offset(), 1, "the next one goes on");
}
