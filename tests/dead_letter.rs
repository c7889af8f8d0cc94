//! Guards issue 3 point 4 (dead-lettering): at `Max Delivery Attempts` the message is copied
//! to `<topic><suffix>` with its payload, all original headers and the `x-*` headers, and
//! only then does the cursor move; a crash between the copy and the cursor move still
//! routes it exactly once; 0 disables it; a dead-letter topic is an ordinary topic whose
//! own nacks chain only when `Dead Letter Chain=true`.

mod common_groups;

use std::time::UNIX_EPOCH;

use common_groups::{all_records, assert_nothing, open, panic_with, panics, publish_n, recv};
use spool::consts::{
    X_CONSUMER_GROUP, X_DEAD_LETTER_REASON, X_DELIVERY_ATTEMPTS, X_ORIGINAL_OFFSET,
    X_ORIGINAL_TIMESTAMP, X_ORIGINAL_TOPIC,
};
use spool::{Headers, OffsetReset, Spool};

const TOPIC: &str = "factory.events";
const DLQ: &str = "factory.events.dlq";
const GROUP: &str = "quality-workers";

fn ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

async fn publish_poison_then_good(mq: &Spool) -> Headers {
    let h = common_groups::headers(&[
        ("message-id", "order-3"),
        ("content-type", "text/plain"),
        ("trace", "abc-123"),
    ]);
    assert_eq!(mq.publish(TOPIC, b"poison".to_vec(), &h).await.unwrap(), 0);
    let good = common_groups::headers(&[("message-id", "order-4")]);
    assert_eq!(mq.publish(TOPIC, b"good".to_vec(), &good).await.unwrap(), 1);
    h
}

#[tokio::test]
async fn five_nacks_route_one_copy_with_every_header_then_the_next_message_comes() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    let original = publish_poison_then_good(&mq).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let mut original_ts = None;
    for n in 1..=5u32 {
        let d = recv(&mut c).await;
        assert_eq!((d.offset(), d.attempt()), (0, n));
        assert_eq!(&d.payload()[..], b"poison");
        original_ts = Some(d.timestamp());
        let out = d.nack(&format!("validation failed #{n}")).await.unwrap();
        assert_eq!(out.delivery_attempt, n);
        if n < 5 {
            assert!(!out.dead_lettered);
            assert_eq!(out.next_offset, 0);
            assert!(
                all_records(&mq, DLQ).await.is_empty(),
                "no copy before the limit"
            );
        } else {
            assert!(out.dead_lettered);
            assert_eq!(out.next_offset, 1, "next_offset is the new cursor");
        }
    }

    let copies = all_records(&mq, DLQ).await;
    assert_eq!(copies.len(), 1, "exactly one dead-letter record");
    let copy = &copies[0];
    assert_eq!(&copy.payload()[..], b"poison");
    let h = copy.headers();
    for (k, v) in &original {
        assert_eq!(h.get(k), Some(v), "original header {k} is kept");
    }
    let expect = |k: &str| h.get(k).map(String::as_str);
    assert_eq!(expect(X_ORIGINAL_TOPIC), Some(TOPIC));
    assert_eq!(expect(X_ORIGINAL_OFFSET), Some("0"));
    assert_eq!(
        expect(X_ORIGINAL_TIMESTAMP),
        Some(ms(original_ts.unwrap()).to_string().as_str())
    );
    assert_eq!(expect(X_CONSUMER_GROUP), Some(GROUP));
    assert_eq!(expect(X_DELIVERY_ATTEMPTS), Some("5"));
    assert_eq!(expect(X_DEAD_LETTER_REASON), Some("validation failed #5"));
    assert_eq!(
        h.len(),
        original.len() + 6,
        "nothing but the six x- headers is added: {h:?}"
    );

    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (1, 1));
    assert_eq!(&d.payload()[..], b"good");
    d.ack().await.unwrap();

    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(info.dead_lettered, 1);
    assert_eq!(info.cursor, 2);
    assert!(info.pending.is_empty(), "the counter went with the message");

    // All of it is durable.
    drop(c);
    mq.close().await.unwrap();
    let mq = open(dir.path(), "");
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.dead_lettered), (2, 1));
    assert_eq!(all_records(&mq, DLQ).await.len(), 1);
    assert!(mq.topics().unwrap().contains(&DLQ.to_owned()));
}

#[tokio::test]
async fn low_level_nacks_dead_letter_at_the_limit_too() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "Max Delivery Attempts=3");
    publish_n(&mq, TOPIC, 2).await;
    for n in 1..=3u32 {
        let out = mq.nack(TOPIC, GROUP, 0, "low").await.unwrap();
        assert_eq!(out.delivery_attempt, n);
        assert_eq!(out.dead_lettered, n == 3);
        assert_eq!(out.next_offset, if n == 3 { 1 } else { 0 });
    }
    let copies = all_records(&mq, DLQ).await;
    assert_eq!(copies.len(), 1);
    assert_eq!(
        copies[0]
            .headers()
            .get(X_DELIVERY_ATTEMPTS)
            .map(String::as_str),
        Some("3")
    );
    mq.ack(TOPIC, GROUP, 1).await.unwrap();
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 2);
}

#[tokio::test]
async fn attempts_counted_before_a_reopen_count_towards_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let conn = "Max Delivery Attempts=3";
    let mq = open(dir.path(), conn);
    publish_n(&mq, TOPIC, 2).await;
    mq.nack(TOPIC, GROUP, 0, "a").await.unwrap();
    mq.nack(TOPIC, GROUP, 0, "b").await.unwrap();
    mq.close().await.unwrap();
    let mq = open(dir.path(), conn);
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let out = recv(&mut c).await.nack("c").await.unwrap();
    assert!(out.dead_lettered);
    assert_eq!(recv(&mut c).await.offset(), 1);
}

#[tokio::test]
async fn max_delivery_attempts_zero_never_dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "Max Delivery Attempts=0");
    publish_n(&mq, TOPIC, 2).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    for n in 1..=12u32 {
        let d = recv(&mut c).await;
        assert_eq!((d.offset(), d.attempt()), (0, n));
        let out = d.nack("nope").await.unwrap();
        assert_eq!(
            (out.delivery_attempt, out.dead_lettered, out.next_offset),
            (n, false, 0)
        );
    }
    assert!(!mq.topics().unwrap().contains(&DLQ.to_owned()));
    assert_eq!(mq.topic_info(DLQ).unwrap().next, 0);
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.dead_lettered), (0, 0));
    assert_eq!(info.pending[0].attempts, 12);
}

#[tokio::test]
async fn a_custom_suffix_names_the_dead_letter_topic() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(
        dir.path(),
        "Max Delivery Attempts=2;Dead Letter Suffix=-poison",
    );
    publish_n(&mq, TOPIC, 1).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    recv(&mut c).await.nack("1").await.unwrap();
    let out = recv(&mut c).await.nack("2").await.unwrap();
    assert!(out.dead_lettered);
    let copies = all_records(&mq, "factory.events-poison").await;
    assert_eq!(copies.len(), 1);
    assert_eq!(&copies[0].payload()[..], b"m0");
    assert!(!mq.topics().unwrap().contains(&DLQ.to_owned()));
}

#[tokio::test]
async fn the_dead_letter_topic_is_an_ordinary_topic_and_does_not_chain() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "Max Delivery Attempts=2");
    publish_n(&mq, TOPIC, 3).await;
    for o in 0..3 {
        mq.nack(TOPIC, GROUP, o, "x").await.unwrap();
        assert!(mq.nack(TOPIC, GROUP, o, "y").await.unwrap().dead_lettered);
    }
    assert_eq!(mq.topic_info(DLQ).unwrap().messages, 3);

    // Consumed like any topic.
    let mut c = common_groups::manual(&mq, DLQ, "ops", 1);
    let d = recv(&mut c).await;
    assert_eq!(
        d.headers().get(X_ORIGINAL_OFFSET).map(String::as_str),
        Some("0")
    );
    d.ack().await.unwrap();
    // Its nacks are only counted: no `.dlq.dlq`.
    for n in 1..=6u32 {
        let d = recv(&mut c).await;
        assert_eq!((d.offset(), d.attempt()), (1, n));
        let out = d.nack("still broken").await.unwrap();
        assert!(!out.dead_lettered);
    }
    assert!(!mq.topics().unwrap().contains(&format!("{DLQ}.dlq")));
    // Reset like any topic.
    assert_eq!(
        mq.reset_offset(DLQ, "ops", OffsetReset::Earliest)
            .await
            .unwrap(),
        0
    );
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (0, 1));
    drop(d);
    // Published to like any topic.
    let o = mq
        .publish(DLQ, b"by hand".to_vec(), &Headers::new())
        .await
        .unwrap();
    assert_eq!(o, 3);
}

#[tokio::test]
async fn dead_letter_chain_true_routes_a_dead_letter_topics_nacks_onward() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "Max Delivery Attempts=2;Dead Letter Chain=true");
    publish_n(&mq, TOPIC, 1).await;
    mq.nack(TOPIC, GROUP, 0, "x").await.unwrap();
    assert!(mq.nack(TOPIC, GROUP, 0, "x").await.unwrap().dead_lettered);
    mq.nack(DLQ, "ops", 0, "y").await.unwrap();
    let out = mq.nack(DLQ, "ops", 0, "y").await.unwrap();
    assert!(out.dead_lettered);
    let chained = all_records(&mq, &format!("{DLQ}.dlq")).await;
    assert_eq!(chained.len(), 1);
    let h = chained[0].headers();
    assert_eq!(h.get(X_ORIGINAL_TOPIC).map(String::as_str), Some(DLQ));
    assert_eq!(h.get(X_CONSUMER_GROUP).map(String::as_str), Some("ops"));
    assert_eq!(&chained[0].payload()[..], b"m0");
}

#[tokio::test]
async fn the_dead_letter_topic_is_retained_like_any_topic() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(
        dir.path(),
        "Max Delivery Attempts=1;Segment Bytes=1024;Retention Bytes=2048;Retention Check Ms=3600000",
    );
    let body = vec![b'p'; 100];
    for _ in 0..40 {
        mq.publish(TOPIC, body.clone(), &Headers::new())
            .await
            .unwrap();
    }
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    for o in 0..40 {
        let d = recv(&mut c).await;
        assert_eq!(d.offset(), o);
        assert!(d.nack("bad").await.unwrap().dead_lettered);
    }
    assert_eq!(mq.topic_info(DLQ).unwrap().next, 40);
    mq.apply_retention().unwrap();
    let info = mq.topic_info(DLQ).unwrap();
    assert!(
        info.earliest > 0,
        "retention applies to the dead-letter topic: {info:?}"
    );
}

#[tokio::test]
async fn each_group_dead_letters_its_own_copy() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "Max Delivery Attempts=1");
    publish_n(&mq, TOPIC, 1).await;
    assert!(mq.nack(TOPIC, "a", 0, "ra").await.unwrap().dead_lettered);
    assert!(mq.nack(TOPIC, "b", 0, "rb").await.unwrap().dead_lettered);
    let copies = all_records(&mq, DLQ).await;
    let groups: Vec<&str> = copies
        .iter()
        .map(|r| r.headers()[X_CONSUMER_GROUP].as_str())
        .collect();
    assert_eq!(groups, vec!["a", "b"]);
}

// ---- crash between the durable intent, the copy and the cursor move ------------------

const CRASH_CONN: &str = "Max Delivery Attempts=3";

/// Child role: nacks offset 0 up to the limit; `SPOOL_CRASH_AT` aborts it on the way.
#[tokio::test]
async fn child_nacks_to_the_limit() {
    let Some((role, dir)) = common_groups::child_role() else {
        return;
    };
    let mq = open(&dir, CRASH_CONN);
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    for n in 1..=3 {
        let d = recv(&mut c).await;
        assert_eq!((d.offset(), d.attempt()), (0, n));
        d.nack(&format!("{role} #{n}")).await.unwrap();
    }
    panic!("the crash point was not reached");
}

async fn crash_while_dead_lettering(point: &str) {
    let dir = tempfile::tempdir().unwrap();
    {
        let mq = open(dir.path(), CRASH_CONN);
        publish_n(&mq, TOPIC, 3).await;
        mq.close().await.unwrap();
    }
    let status = common_groups::run_child(
        "child_nacks_to_the_limit",
        point,
        dir.path(),
        &[("SPOOL_CRASH_AT", point)],
    );
    common_groups::assert_aborted(status);

    for round in 0..2 {
        // Twice: finishing the interrupted dead-letter must itself be idempotent.
        let mq = open(dir.path(), CRASH_CONN);
        let copies = all_records(&mq, DLQ).await;
        assert_eq!(copies.len(), 1, "routed exactly once (round {round})");
        let h = copies[0].headers();
        assert_eq!(h.get(X_ORIGINAL_OFFSET).map(String::as_str), Some("0"));
        assert_eq!(h.get(X_DELIVERY_ATTEMPTS).map(String::as_str), Some("3"));
        assert_eq!(h.get(X_CONSUMER_GROUP).map(String::as_str), Some(GROUP));
        assert_eq!(
            h.get(X_DEAD_LETTER_REASON).map(String::as_str),
            Some(format!("{point} #3").as_str())
        );
        assert_eq!(&copies[0].payload()[..], b"m0");
        let info = mq.group_info(TOPIC, GROUP).unwrap();
        assert_eq!(info.cursor, 1, "the cursor moved past the message");
        assert_eq!(info.dead_lettered, 1);
        assert!(info.pending.is_empty(), "{:?}", info.pending);
        mq.close().await.unwrap();
    }
    let mq = open(dir.path(), CRASH_CONN);
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (1, 1));
    d.ack().await.unwrap();
    let d = recv(&mut c).await;
    assert_eq!(d.offset(), 2);
    d.ack().await.unwrap();
    assert_nothing(&mut c).await;
    assert_eq!(all_records(&mq, DLQ).await.len(), 1);
}

#[tokio::test]
async fn a_crash_after_the_copy_before_the_cursor_move_routes_once() {
    crash_while_dead_lettering("dead_letter.after_copy").await;
}

#[tokio::test]
async fn a_crash_after_the_intent_before_the_copy_routes_once() {
    crash_while_dead_lettering("dead_letter.after_intent").await;
}

/// A message published at both hard limits (`Max Message Bytes` and `Max Header Bytes` at
/// their ceilings) gets a dead-letter copy that reads back, before and after a reopen: the
/// `x-*` headers (a reason up to 64 KiB) must not push the copy past what a log reads.
#[tokio::test]
async fn a_message_at_both_limits_is_dead_lettered_into_a_readable_copy() {
    // The hard ceilings of the two options (API.md, Connection string).
    const MAX_MESSAGE: usize = 256 << 20;
    const MAX_HEADERS: usize = 16 << 20;
    let dir = tempfile::tempdir().unwrap();
    let open = |dir: &std::path::Path| {
        Spool::open(&format!(
            "Data Source={};Max Message Bytes={};Max Header Bytes={};Max Delivery Attempts=1",
            dir.display(),
            MAX_MESSAGE,
            MAX_HEADERS
        ))
        .expect("open")
    };
    let mq = open(dir.path());
    let mut h = Headers::new();
    // Headers at exactly the limit: postcard's map and string length prefixes take 7 bytes.
    h.insert("h".into(), "v".repeat(MAX_HEADERS - 7));
    let payload = vec![7u8; MAX_MESSAGE];
    assert_eq!(mq.publish(TOPIC, payload, &h).await.unwrap(), 0);
    mq.publish(TOPIC, b"small".to_vec(), &Headers::new())
        .await
        .unwrap();
    let mut c = mq.consumer(TOPIC, GROUP).manual_ack().build().unwrap();
    let reason = "r".repeat(spool::consts::MAX_NACK_REASON_BYTES);
    for offset in 0..2 {
        let d = c.recv().await.unwrap();
        assert_eq!(d.offset(), offset);
        assert!(d.nack(&reason).await.unwrap().dead_lettered);
    }
    drop(c);
    let check = |copies: Vec<spool::Record>| {
        assert_eq!(copies.len(), 2, "both copies read back");
        assert_eq!(copies[0].payload().len(), MAX_MESSAGE);
        assert_eq!(copies[0].headers()["h"].len(), MAX_HEADERS - 7);
        assert_eq!(copies[0].headers()[X_ORIGINAL_OFFSET], "0");
        assert_eq!(&copies[1].payload()[..], b"small");
    };
    check(mq.fetch(DLQ, 0, 10).await.expect("the copies read back"));
    mq.close().await.unwrap();
    let mq = open(dir.path());
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 2);
    check(
        mq.fetch(DLQ, 0, 10)
            .await
            .expect("the copies read back after a reopen"),
    );
    mq.close().await.unwrap();
}

/// A message whose handler panics every time is a poison message like one nacked every
/// time: each panic counts an attempt (`PANICKED_REASON`), and at `Max Delivery Attempts`
/// the next hand-out dead-letters it, for auto-ack and manual-ack consumers alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_panics_its_handler_every_time_is_dead_lettered_at_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "Max Delivery Attempts=3");
    publish_poison_then_good(&mq).await;
    for (round, manual) in [false, true, false].into_iter().enumerate() {
        let mq2 = mq.clone();
        panics(async move {
            let b = mq2.consumer(TOPIC, GROUP);
            let mut c = if manual { b.manual_ack() } else { b }.build().unwrap();
            let d = recv(&mut c).await;
            assert_eq!((d.offset(), d.attempt()), (0, round as u32 + 1));
            panic!("the handler cannot take {:?}", d.payload());
        })
        .await;
    }
    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    assert_eq!(
        recv(&mut c).await.offset(),
        1,
        "the poison message is out of the way"
    );
    let copies = all_records(&mq, DLQ).await;
    assert_eq!(copies.len(), 1);
    let h = copies[0].headers();
    assert_eq!(h[X_DEAD_LETTER_REASON], spool::consts::PANICKED_REASON);
    assert_eq!(h[X_DELIVERY_ATTEMPTS], "3");
    assert_eq!(h[X_ORIGINAL_OFFSET], "0");
    assert_eq!(&copies[0].payload()[..], b"poison");
    c.close().await.unwrap();
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 2);
}

/// A message panics took to the limit and a close came before the next hand-out: the
/// reopened group dead-letters it at its first hand-out (the attempts are in the catalog),
/// instead of handing it out past the limit.
#[tokio::test]
async fn a_message_charged_to_the_limit_before_a_close_is_dead_lettered_after_the_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let conn = "Max Delivery Attempts=2";
    let mq = open(dir.path(), conn);
    publish_poison_then_good(&mq).await;
    let mut c = mq.consumer(TOPIC, GROUP).manual_ack().build().unwrap();
    for attempt in 1..=2 {
        let d = recv(&mut c).await;
        assert_eq!((d.offset(), d.attempt()), (0, attempt));
        panic_with(d);
    }
    drop(c);
    mq.close().await.unwrap();
    let mq = open(dir.path(), conn);
    let mut c = mq.consumer(TOPIC, GROUP).manual_ack().build().unwrap();
    let d = recv(&mut c).await;
    assert_eq!(
        (d.offset(), d.attempt()),
        (1, 1),
        "offset 0 went to the DLQ"
    );
    let copies = all_records(&mq, DLQ).await;
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].headers()[X_ORIGINAL_OFFSET], "0");
    assert_eq!(
        copies[0].headers()[X_DEAD_LETTER_REASON],
        spool::consts::PANICKED_REASON
    );
}

/// The same poison message when each panic drops the consumer before the delivery (the
/// delivery declared first): the consumer's drop leaves the delivery to its own drop,
/// which charges it, so the attempts still count up to the dead-letter topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_that_drops_the_consumer_first_still_counts_the_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "Max Delivery Attempts=2");
    publish_poison_then_good(&mq).await;
    for attempt in 1..=2u32 {
        let mq2 = mq.clone();
        panics(async move {
            let d;
            let mut c = mq2.consumer(TOPIC, GROUP).build().unwrap();
            d = recv(&mut c).await;
            assert_eq!((d.offset(), d.attempt()), (0, attempt));
            panic!("the handler of offset {} failed", d.offset());
        })
        .await;
    }
    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    assert_eq!(recv(&mut c).await.offset(), 1, "offset 0 went to the DLQ");
    assert_eq!(all_records(&mq, DLQ).await.len(), 1);
}

/// A handled auto-ack delivery that outlives its consumer, dropped by a panic elsewhere
/// (the delivery moved out of the panicking task): it is acked as it is dropped, the last
/// of its consumer's deliveries, so it is neither delivered again nor left out for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_handled_after_its_consumer_panicked_away_is_acked() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_poison_then_good(&mq).await;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let mq2 = mq.clone();
    panics(async move {
        let mut c = mq2.consumer(TOPIC, GROUP).build().unwrap();
        tx.send(recv(&mut c).await).unwrap();
        panic!("the consumer's task failed after handing its delivery on");
    })
    .await;
    let d = rx.await.unwrap();
    assert_eq!(d.offset(), 0);
    drop(d); // handled
    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    assert_eq!(
        recv(&mut c).await.offset(),
        1,
        "offset 0 was acked by its drop"
    );
    c.close().await.unwrap();
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 2);
}

/// A consumer already waiting on the dead-letter topic gets a copy as soon as it lands:
/// the dead-letter append wakes that topic's consumers (before, only a publish to the
/// dead-letter topic did, so a replayer slept through every copy until one came).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_waiting_on_the_dead_letter_topic_gets_the_copy_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "Max Delivery Attempts=1");
    publish_n(&mq, TOPIC, 1).await;
    let mut replayer = mq.consumer(DLQ, "replayer").build().unwrap();
    let waiting = tokio::spawn(async move { recv(&mut replayer).await.offset() });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let out = mq.nack(TOPIC, GROUP, 0, "broken").await.unwrap();
    assert!(out.dead_lettered);
    assert_eq!(waiting.await.expect("the replayer got the copy"), 0);
    mq.close().await.unwrap();
}
