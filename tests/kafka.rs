//! `Mode=Kafka` against librdkafka's mock cluster (no broker install), what only Kafka
//! has: the connection string's `Kafka.*` keys, publish and the figures, dead-lettering
//! once across a crash (a child process, the same test binary, aborts at a crash point of
//! the dead-letter path), rebalances, resets from outside the group, `message-id`
//! de-duplication across a restart. The consumer-group rules both modes keep are in
//! tests/group_rules.rs.
//!
//! The mock's limits (issue 30): a first group join takes about 3 s and a new member
//! after one left about 5 s (hence `session.timeout.ms=6000`); topics are created with
//! `MockCluster::create_topic` (auto-created ones get 4 partitions). Each test has its own
//! cluster, so the tests run in parallel.
#![cfg(feature = "kafka")]

use std::time::Duration;

use common_kafka::{Cluster, WAIT, publish_n, publish_n_from, recv};
use spool::{Error, Headers, Spool};

mod common_child;
mod common_kafka;

#[test]
fn connection_string_properties_are_checked_at_open() {
    let cluster = Cluster::new(&[]);
    for (extra, key) in [
        ("Kafka.no.such.property=1", "Kafka.no.such.property"),
        ("Kafka.linger.ms=soon", "Kafka.linger.ms"),
        ("Kafka.enable.auto.commit=true", "Kafka.enable.auto.commit"),
        ("Data Source=./x", "Data Source"),
    ] {
        match Spool::open(&cluster.connection(extra)) {
            Err(Error::InvalidConnectionString { key: k, .. }) => assert_eq!(k, key, "{extra}"),
            other => panic!("{extra}: expected InvalidConnectionString, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_consume_ack_and_the_figures() {
    let cluster = Cluster::new(&["orders"]);
    let mq = cluster.open("");
    publish_n(&mq, "orders", 3).await;
    let batch = vec![
        (b"b0".to_vec(), Headers::new()),
        (b"b1".to_vec(), Headers::new()),
    ];
    assert_eq!(
        mq.publish_batch("orders", batch).await.expect("batch"),
        vec![3, 4]
    );
    assert!(mq.topics().expect("topics").contains(&"orders".to_owned()));
    let info = mq.topic_info("orders").expect("topic_info");
    assert_eq!((info.earliest, info.next, info.messages), (0, 5, 5));
    let fetched = mq.fetch("orders", 1, 2).await.expect("fetch");
    assert_eq!(
        fetched.iter().map(|r| r.offset()).collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert_eq!(&fetched[0].payload()[..], b"m1");

    let mut c = mq
        .consumer("orders", "g")
        .manual_ack()
        .build()
        .expect("consumer");
    for i in 0..5u64 {
        let d = recv(&mut c).await;
        assert_eq!((d.offset(), d.attempt(), d.partition()), (i, 1, 0));
        d.ack().await.expect("ack is durable");
    }
    let gi = mq.group_info("orders", "g").expect("group_info");
    assert_eq!(
        (gi.cursor, gi.next, gi.lag),
        (5, 5, 0),
        "after finishing 4 the cursor is 5"
    );
    assert_eq!(gi.counts.acked, 5);
    drop(c);
    mq.close().await.expect("close");
}

// ---- a crash while dead-lettering: a child process aborts at a crash point ----------

/// The variable that makes `child_nacks_to_the_limit` act: the connection string of the
/// parent's mock cluster.
const CHILD: &str = "SPOOL_KAFKA_CHILD";
const CRASH_CONN: &str = "Max Delivery Attempts=2";

/// Child role of `crash_while_dead_lettering`: nacks record 0 of `t` to the limit, so
/// `SPOOL_CRASH_AT` aborts the process on the way. Does nothing in an ordinary run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_nacks_to_the_limit() {
    let Some(conn) = common_child::role(CHILD) else {
        return;
    };
    let mq = Spool::open(&conn).expect("open Mode=Kafka");
    let mut c = mq
        .consumer("t", "g")
        .manual_ack()
        .build()
        .expect("consumer");
    for n in 1..=2 {
        let d = recv(&mut c).await;
        assert_eq!((d.offset(), d.attempt()), (0, n));
        tokio::time::timeout(WAIT, d.nack(&format!("bad #{n}")))
            .await
            .expect("the nack returns within the wait")
            .expect("nack");
    }
    panic!("the crash point was not reached");
}

/// A child process nacks record 0 to the limit and aborts at `point`; a new instance in
/// the same group then finds exactly one copy, with the provenance headers (the
/// reason is `reason`: a copy made after the crash cannot know the nack's), record 0
/// finished (not delivered again), and the group going on.
async fn crash_while_dead_lettering(point: &str, reason: &str) {
    let cluster = Cluster::new(&["t", "t.dlq"]);
    let mq = cluster.open(CRASH_CONN);
    let mut h = Headers::new();
    h.insert("message-key".into(), "k0".into());
    h.insert("trace".into(), "abc".into());
    assert_eq!(mq.publish("t", b"m0".to_vec(), &h).await.expect("m0"), 0);
    publish_n_from(&mq, "t", 1, 2).await;
    let published_ms = ms(mq.fetch("t", 0, 1).await.expect("fetch")[0].timestamp());
    mq.close().await.expect("close");

    let env = [
        (CHILD, cluster.connection(CRASH_CONN)),
        ("SPOOL_CRASH_AT", point.to_owned()),
    ];
    let status = tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        common_child::run("child_nacks_to_the_limit", &env)
    })
    .await
    .expect("the child ran");
    common_child::assert_aborted(status);

    // A new instance in the group (it waits out the dead member's session).
    let mq = cluster.open(CRASH_CONN);
    let mut c = mq
        .consumer("t", "g")
        .manual_ack()
        .build()
        .expect("consumer");
    let d = recv(&mut c).await;
    assert_eq!(
        (d.offset(), d.attempt()),
        (1, 1),
        "0 was dead-lettered: finished, not delivered again"
    );
    d.ack().await.expect("ack 1");
    let copies = mq
        .fetch("t.dlq", 0, 10)
        .await
        .expect("fetch the dead-letter topic");
    assert_eq!(copies.len(), 1, "exactly one copy");
    assert_eq!(&copies[0].payload()[..], b"m0");
    let ch = copies[0].headers();
    let header = |k: &str| ch.get(k).map(String::as_str);
    assert_eq!(header("x-original-topic"), Some("t"));
    assert_eq!(header("x-original-partition"), Some("0"));
    assert_eq!(header("x-original-offset"), Some("0"));
    let published_ms = published_ms.to_string();
    assert_eq!(header("x-original-timestamp"), Some(published_ms.as_str()));
    assert_eq!(header("x-consumer-group"), Some("g"));
    assert_eq!(header("x-delivery-attempts"), Some("2"));
    assert_eq!(header("x-dead-letter-reason"), Some(reason));
    assert_eq!(
        (header("message-key"), header("trace")),
        (Some("k0"), Some("abc"))
    );
    let gi = mq.group_info("t", "g").expect("info");
    assert_eq!(gi.cursor, 2, "the group moved past 0 and 1");
    assert!(gi.pending.is_empty(), "no attempt left: {:?}", gi.pending);
    assert_eq!(gi.dead_lettered, 1);
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (2, 1));
    d.ack().await.expect("ack 2");
    assert_eq!(mq.group_info("t", "g").expect("info").cursor, 3);
    assert_eq!(mq.fetch("t.dlq", 0, 10).await.expect("fetch").len(), 1);
}

fn ms(t: std::time::SystemTime) -> u128 {
    t.duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis()
}

/// The copy was produced, the record not yet finished: the new member finds the copy
/// in the dead-letter topic's tail and makes no second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_copy_before_the_commit_dead_letters_once() {
    crash_while_dead_lettering("kafka.dead_letter.after_copy", "bad #2").await;
}

/// The intent was committed, no copy produced: the new member makes exactly one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_intent_before_the_copy_dead_letters_once() {
    crash_while_dead_lettering(
        "kafka.dead_letter.after_intent",
        "dead-lettered across a restart (the first copy was not found)",
    )
    .await;
}

/// What the rebalance test saw: per record, deliveries and successful acks.
#[derive(Default)]
struct Seen {
    deliveries: std::collections::HashMap<(u32, u64), u32>,
    acked: std::collections::HashMap<(u32, u64), u32>,
    stale: std::collections::HashSet<(u32, u64)>,
}

/// One member's loop: handle and ack until every record is acked. Returns how many
/// this member acked.
async fn work(mq: Spool, seen: std::sync::Arc<std::sync::Mutex<Seen>>, total: usize) -> usize {
    let mut mine = 0;
    let mut c = mq
        .consumer("r", "g")
        .manual_ack()
        .max_in_flight(8)
        .build()
        .expect("consumer");
    loop {
        if seen.lock().expect("lock").acked.len() == total {
            break;
        }
        let Some(d) = c
            .recv_timeout(Duration::from_millis(500))
            .await
            .expect("recv")
        else {
            continue;
        };
        let key = (d.partition(), d.offset());
        *seen
            .lock()
            .expect("lock")
            .deliveries
            .entry(key)
            .or_default() += 1;
        tokio::time::sleep(Duration::from_millis(2)).await; // a handler at work
        match d.ack().await {
            Ok(()) => {
                mine += 1;
                *seen.lock().expect("lock").acked.entry(key).or_default() += 1;
            }
            Err(Error::StaleDelivery { .. }) => {
                seen.lock().expect("lock").stale.insert(key);
            }
            Err(e) => panic!("ack of {key:?}: {e}"),
        }
    }
    c.close().await.expect("close");
    mine
}

/// Two instances in one group on a topic of 4 partitions, the second joining mid-way:
/// every record is handled and acked exactly once; a record is delivered twice only when
/// its first delivery was cut off by the rebalance (its ack failed as stale).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_loses_nothing_and_fences_the_lost_partitions() {
    let cluster = Cluster::new(&[]);
    cluster.mock.create_topic("r", 4, 1).expect("topic");
    let a = cluster.open("");
    let total = 400;
    for i in 0..total {
        let mut h = Headers::new();
        h.insert("message-key".into(), format!("k{}", i % 37));
        a.publish("r", format!("m{i}").into_bytes(), &h)
            .await
            .expect("publish");
    }
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Seen::default()));
    let first = tokio::spawn(work(a.clone(), seen.clone(), total));
    tokio::time::timeout(WAIT, async {
        while seen.lock().expect("lock").acked.len() < 50 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the first member handles records");
    let b = cluster.open("");
    let second = tokio::spawn(work(b.clone(), seen.clone(), total));
    let (by_a, by_b) = tokio::time::timeout(Duration::from_secs(120), async {
        (
            first.await.expect("first member"),
            second.await.expect("second member"),
        )
    })
    .await
    .expect("both members finish");
    assert!(
        by_a > 50 && by_b > 0,
        "the second member got partitions: {by_a} + {by_b}"
    );
    let s = seen.lock().expect("lock");
    assert_eq!(s.acked.len(), total, "every record acked");
    assert!(s.acked.values().all(|n| *n == 1), "no record acked twice");
    for (key, n) in &s.deliveries {
        if *n > 1 {
            assert!(
                s.stale.contains(key),
                "{key:?} delivered {n} times without being cut off"
            );
        }
    }
    let info = a.group_info("r", "g").expect("group_info");
    assert_eq!(
        (info.cursor, info.lag),
        (total as u64, 0),
        "the floors add up"
    );
}

/// A reset through this instance's own member moves it: a delivery out is stale, and
/// consumption goes on from the new cursor. From outside, on a group never joined, the
/// offsets are committed. A group with a member elsewhere refuses it (and a low-level
/// ack or nack): `GroupInUse`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_moves_own_members_and_refuses_groups_in_use_elsewhere() {
    let cluster = Cluster::new(&["rs"]);
    let mq = cluster.open("");
    publish_n(&mq, "rs", 6).await;
    // From outside, before anyone joined.
    let to = spool::OffsetReset::Explicit(4);
    assert_eq!(mq.reset_offset("rs", "fresh", to).await.expect("reset"), 4);
    assert_eq!(mq.group_info("rs", "fresh").expect("info").cursor, 4);
    // Through this instance's member.
    let mut c = mq
        .consumer("rs", "g")
        .manual_ack()
        .max_in_flight(2)
        .build()
        .expect("consumer");
    let d0 = recv(&mut c).await;
    let d1 = recv(&mut c).await;
    assert_eq!((d0.offset(), d1.offset()), (0, 1));
    let to = spool::OffsetReset::Explicit(3);
    assert_eq!(mq.reset_offset("rs", "g", to).await.expect("reset"), 3);
    assert!(matches!(
        d0.ack().await,
        Err(Error::StaleDelivery { offset: 0 })
    ));
    assert!(matches!(
        d1.nack("x").await,
        Err(Error::StaleDelivery { offset: 1 })
    ));
    let d = recv(&mut c).await;
    assert_eq!(d.offset(), 3, "consumption goes on from the new cursor");
    d.ack().await.expect("ack");
    assert_eq!(mq.group_info("rs", "g").expect("info").cursor, 4);
    assert_eq!(
        mq.reset_offset("rs", "g", spool::OffsetReset::Earliest)
            .await
            .expect("r"),
        0
    );
    assert_eq!(recv(&mut c).await.offset(), 0, "and back to the start");
    // `groups` needs ListGroups, which the mock cluster lacks: not tested here.
    // Another instance, no member of its own: the group is in use.
    let other = cluster.open("");
    match other
        .reset_offset("rs", "g", spool::OffsetReset::Latest)
        .await
    {
        Err(Error::GroupInUse { topic, group }) => {
            assert_eq!((topic.as_str(), group.as_str()), ("rs", "g"))
        }
        r => panic!("expected GroupInUse, got {r:?}"),
    }
    // So are the low-level ack and nack of its cursor, for the same reason.
    let cursor = other.group_info("rs", "g").expect("info").cursor;
    assert!(
        matches!(
            other.ack("rs", "g", cursor).await,
            Err(Error::GroupInUse { .. })
        ),
        "ack by offset from outside"
    );
    assert!(
        matches!(
            other.nack("rs", "g", cursor, "x").await,
            Err(Error::GroupInUse { .. })
        ),
        "nack by offset from outside"
    );
}

/// `message-id` de-duplication: a retry gets the original offset and produces nothing,
/// within a batch too, and after a restart (the window is rebuilt from the topic's tail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_ids_deduplicate_across_a_restart() {
    let cluster = Cluster::new(&["d"]);
    let id = |s: &str| {
        let mut h = Headers::new();
        h.insert("message-id".into(), s.into());
        h
    };
    {
        let mq = cluster.open("");
        assert_eq!(
            mq.publish("d", b"a".to_vec(), &id("a")).await.expect("a"),
            0
        );
        assert_eq!(
            mq.publish("d", b"a".to_vec(), &id("a"))
                .await
                .expect("retry"),
            0
        );
        let batch = vec![
            (b"b".to_vec(), id("b")),
            (b"a".to_vec(), id("a")),
            (b"c".to_vec(), Headers::new()),
            (b"b".to_vec(), id("b")),
        ];
        assert_eq!(
            mq.publish_batch("d", batch).await.expect("batch"),
            vec![1, 0, 2, 1]
        );
        let info = mq.topic_info("d").expect("info");
        assert_eq!((info.next, info.dedup_ids), (3, 2));
        mq.close().await.expect("close");
    }
    let mq = cluster.open("");
    assert_eq!(
        mq.publish("d", b"b".to_vec(), &id("b"))
            .await
            .expect("after restart"),
        1
    );
    assert_eq!(
        mq.publish("d", b"e".to_vec(), &id("e"))
            .await
            .expect("new id"),
        3
    );
    assert_eq!(mq.topic_info("d").expect("info").next, 4);
}
