//! `Mode=Kafka` where it could go wrong (from review): a nack whose commit fails, a nack
//! delay too large to add, two auto-ack consumers of one member, the commit metadata's
//! bound, conflicting or spool-owned librdkafka properties, a missing dead-letter topic,
//! a Kafka key without the `message-key` header.
#![cfg(feature = "kafka")]

use std::time::Duration;

use common_kafka::{Cluster, publish_n, recv};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use spool::{Delivery, Error, Spool};

mod common_kafka;

/// The record is back in place before the attempt's commit is awaited: a failed commit
/// fails the nack, and the record still comes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_whose_commit_fails_still_redelivers() {
    let cluster = Cluster::new(&["s"]);
    let mq = cluster.open("Max Delivery Attempts=0;Kafka Timeout Ms=1000");
    publish_n(&mq, "s", 3).await;
    let mut c = mq
        .consumer("s", "g")
        .manual_ack()
        .build()
        .expect("consumer");
    let d = recv(&mut c).await;
    assert_eq!(d.offset(), 0);
    let refuse = [RDKafkaRespErr::RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE; 64];
    cluster
        .mock
        .request_errors(RDKafkaApiKey::OffsetCommit, &refuse);
    assert!(
        d.nack("x").await.is_err(),
        "the attempt's commit was refused"
    );
    cluster
        .mock
        .clear_request_errors(RDKafkaApiKey::OffsetCommit);
    let again = recv(&mut c).await;
    assert_eq!(
        (again.offset(), again.attempt()),
        (0, 2),
        "0 comes back, its attempt counted"
    );
    again.ack().await.expect("ack once commits pass again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_nack_delay_is_capped_not_a_panic() {
    let cluster = Cluster::new(&["h"]);
    let mq = cluster.open("Max Delivery Attempts=0");
    publish_n(&mq, "h", 2).await;
    let mut c = mq
        .consumer("h", "g")
        .manual_ack()
        .max_in_flight(2)
        .build()
        .expect("consumer");
    let d = recv(&mut c).await;
    let out = d.nack_with_delay("x", Duration::MAX).await.expect("nack");
    assert!(!out.dead_lettered);
    let next = recv(&mut c).await;
    assert_eq!(next.offset(), 1, "0 waits; 1 goes on (max_in_flight 2)");
}

/// Two auto-ack consumers share the group's member: A's bookkeeping copy of record 0
/// must not ack 0 once B received it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_ack_does_not_finish_another_consumers_redelivery() {
    let cluster = Cluster::new(&["x"]);
    let mq = cluster.open("Max Delivery Attempts=0");
    publish_n(&mq, "x", 2).await;
    let mut a = mq.consumer("x", "g").max_in_flight(4).build().expect("a");
    let mut b = mq.consumer("x", "g").max_in_flight(4).build().expect("b");
    let da = recv(&mut a).await;
    assert_eq!(da.offset(), 0);
    da.nack("retry").await.expect("nack");
    let db = recv(&mut b).await;
    assert_eq!((db.offset(), db.attempt()), (0, 2));
    // A's next recv auto-acks what A had: not B's redelivery of 0.
    let _ = tokio::time::timeout(Duration::from_secs(3), a.recv()).await;
    db.ack().await.expect("B's ack of 0 is B's to make");
}

#[test]
fn max_in_flight_is_bounded_by_the_commit_metadata() {
    let cluster = Cluster::new(&["m"]);
    let mq = cluster.open("");
    match mq
        .consumer("m", "g")
        .manual_ack()
        .max_in_flight(101)
        .build()
    {
        Err(Error::Unsupported { what }) => assert!(what.contains("at most 100"), "{what}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn spool_owned_and_conflicting_properties_are_refused_by_name() {
    let cluster = Cluster::new(&[]);
    for (extra, key) in [
        ("Kafka.transactional.id=t", "Kafka.transactional.id"),
        ("Kafka.auto.offset.reset=latest", "Kafka.auto.offset.reset"),
        (
            "Kafka.enable.partition.eof=true",
            "Kafka.enable.partition.eof",
        ),
    ] {
        match Spool::open(&cluster.connection(extra)) {
            Err(Error::InvalidConnectionString { key: k, .. }) => assert_eq!(k, key, "{extra}"),
            other => panic!("{extra}: expected InvalidConnectionString, got {other:?}"),
        }
    }
    // Valid alone, refused with idempotence: librdkafka names no key, spool says which.
    let extra = "Kafka.max.in.flight.requests.per.connection=10";
    match Spool::open(&cluster.connection(extra)) {
        Err(Error::InvalidConnectionString { key, reason }) => {
            assert!(key.starts_with("Kafka."), "{key}: {reason}");
        }
        other => panic!("expected InvalidConnectionString, got {other:?}"),
    }
}

/// A missing dead-letter topic is created before the copy. The mock cluster cannot
/// create topics (it has no CreateTopics): the failure is logged and the copy produced
/// all the same, and the mock makes the topic on first use. (The creation with the
/// source's partition count is unit-tested in `src/kafka/topics.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_dead_letter_topic_does_not_stop_dead_lettering() {
    let cluster = Cluster::new(&["nd"]);
    let mq = cluster.open("Max Delivery Attempts=1;Kafka Timeout Ms=1000");
    publish_n(&mq, "nd", 2).await;
    let mut c = mq
        .consumer("nd", "g")
        .manual_ack()
        .build()
        .expect("consumer");
    let d = recv(&mut c).await;
    let out = d.nack("bad").await.expect("nack");
    assert!(out.dead_lettered);
    // The mock makes the topic with its default 4 partitions: the copy may be in any,
    // and its metadata reaches this instance's reader a little later.
    let start = std::time::Instant::now();
    loop {
        match mq.topic_info("nd.dlq") {
            Ok(t) if t.messages == 1 => break,
            r if start.elapsed() > Duration::from_secs(30) => panic!("no copy: {r:?}"),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    assert_eq!(recv(&mut c).await.offset(), 1, "the group goes on");
}

/// A record `nack_all` dead-letters is in no state while the batch waits for the commit
/// of its other attempts (neither out, held nor with an intent yet). The others' seek
/// back re-reads it meanwhile: it must not be handed out (it was, to another consumer of
/// the member, and then dead-lettered all the same).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_being_dead_lettered_is_not_handed_out_meanwhile() {
    let cluster = Cluster::new(&["bd", "bd.dlq"]);
    let mq = cluster.open("Max Delivery Attempts=2;Kafka Timeout Ms=20000");
    publish_n(&mq, "bd", 2).await;
    let mut c = mq
        .consumer("bd", "g")
        .manual_ack()
        .max_in_flight(2)
        .build()
        .expect("consumer");
    let d0 = recv(&mut c).await;
    let d1 = recv(&mut c).await;
    assert_eq!((d0.offset(), d1.offset()), (0, 1));
    d1.nack("x").await.expect("nack 1");
    let d1 = recv(&mut c).await;
    assert_eq!((d1.offset(), d1.attempt()), (1, 2), "1 is at the limit");
    let mut other = mq
        .consumer("bd", "g")
        .manual_ack()
        .max_in_flight(2)
        .build()
        .expect("a second consumer of the member");
    // The commits are refused for a while: the batch waits for 0's attempt meanwhile.
    let refuse = [RDKafkaRespErr::RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE; 8];
    cluster
        .mock
        .request_errors(RDKafkaApiKey::OffsetCommit, &refuse);
    let watcher = tokio::spawn(async move {
        let mut got = Vec::new();
        let until = tokio::time::Instant::now() + Duration::from_secs(4);
        while let Ok(Ok(d)) = tokio::time::timeout_at(until, other.recv()).await {
            got.push(d);
        }
        got.iter()
            .map(spool::Delivery::offset)
            .collect::<Vec<u64>>()
    });
    let outs = c.nack_all(vec![d0, d1], "x").await.expect("nack_all");
    let seen: Vec<(u32, bool)> = outs
        .iter()
        .map(|o| (o.delivery_attempt, o.dead_lettered))
        .collect();
    assert_eq!(seen, [(1, false), (2, true)]);
    let offsets = watcher.await.expect("watcher");
    assert!(
        !offsets.contains(&1),
        "1 was handed out while it was dead-lettered: {offsets:?}"
    );
    assert_eq!(offsets, [0], "0 comes again");
}

/// A low-level nack of the cursor while a delivery's nack at the limit is dead-lettering
/// it (waiting for the intent's commit): the record is finished for the group, as the
/// embedded nack leaves it at once. It must not be dead-lettered a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_level_nack_during_a_dead_letter_makes_no_second_copy() {
    let cluster = Cluster::new(&["ld", "ld.dlq"]);
    let mq = cluster.open("Max Delivery Attempts=1;Kafka Timeout Ms=20000");
    publish_n(&mq, "ld", 2).await;
    let mut c = mq
        .consumer("ld", "g")
        .manual_ack()
        .build()
        .expect("consumer");
    let d = recv(&mut c).await;
    assert_eq!(d.offset(), 0);
    let refuse = [RDKafkaRespErr::RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE; 8];
    cluster
        .mock
        .request_errors(RDKafkaApiKey::OffsetCommit, &refuse);
    let nack = tokio::spawn(async move { d.nack("x").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let low = mq.nack("ld", "g", 0, "low").await;
    assert!(
        matches!(low, Err(Error::NotAtCursor { actual: 0, .. })),
        "the record is being dead-lettered: {low:?}"
    );
    let out = nack.await.expect("join").expect("nack");
    assert!(out.dead_lettered);
    let copies = mq.fetch("ld.dlq", 0, 10).await.expect("fetch the dlq");
    assert_eq!(copies.len(), 1, "one copy");
    assert_eq!(recv(&mut c).await.offset(), 1, "the group goes on");
}

/// A cluster gone away does not hang the application: acks fail within
/// `Kafka Timeout Ms`, and dropping the consumer and closing return. (librdkafka's own
/// synchronous commit waits for a coordinator without end.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_while_the_cluster_is_down_returns() {
    let cluster = Cluster::new(&["gone"]);
    let mq = cluster.open("Kafka Timeout Ms=2000");
    publish_n(&mq, "gone", 3).await;
    let mut c = mq
        .consumer("gone", "g")
        .manual_ack()
        .max_in_flight(3)
        .build()
        .expect("consumer");
    let d0 = recv(&mut c).await;
    c.ack_all(vec![d0])
        .await
        .expect("ack while the cluster is up");
    let d1 = recv(&mut c).await;
    let d2 = recv(&mut c).await;
    cluster.mock.broker_down(1).expect("broker down");
    let bound = Duration::from_secs(60);
    let acked = tokio::time::timeout(bound, d1.ack()).await;
    assert!(
        matches!(acked, Ok(Err(_))),
        "the ack fails in time: {acked:?}"
    );
    // `ack_all` sends its own commit and waits for the answer on its task.
    let acked = tokio::time::timeout(bound, c.ack_all(vec![d2])).await;
    assert!(
        matches!(acked, Ok(Err(_))),
        "the batch's ack fails in time: {acked:?}"
    );
    let dropped = tokio::task::spawn_blocking(move || drop(c));
    tokio::time::timeout(bound, dropped)
        .await
        .expect("dropping the consumer returns")
        .expect("no panic");
    tokio::time::timeout(bound, mq.close())
        .await
        .expect("close returns")
        .expect("close");
}

/// An `ack_all` dropped while it waits for its commit's answer (a `select!` that gave
/// up) still acks its batch, and leaves the commit to the committer at once: a later ack
/// does not wait for `Kafka Timeout Ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_all_dropped_while_it_waits_blocks_no_later_ack() {
    let (_cluster, mq, c, batch, d2) = three_out("dropped").await;
    {
        // Polled once (the batch is acked and its commit sent), then dropped.
        poll_once(std::pin::pin!(c.ack_all(batch)));
    }
    tokio::time::timeout(Duration::from_secs(15), d2.ack())
        .await
        .expect("a later ack does not wait for the dropped one's time-out")
        .expect("ack");
    let info = mq.group_info("dropped", "g").expect("group_info");
    assert_eq!(info.cursor, 3, "the dropped batch was acked and committed");
}

/// A record another client produced with a Kafka key and no `message-key` header reads
/// with that header, and `key_ordered()` orders it by that key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_key_without_the_header_is_the_message_key() {
    use rdkafka::ClientConfig;
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let cluster = Cluster::new(&["keyed"]);
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", cluster.mock.bootstrap_servers())
        .create()
        .expect("producer");
    for (i, key) in ["a", "a", "b"].into_iter().enumerate() {
        let payload = format!("m{i}");
        let record = FutureRecord::to("keyed").key(key).payload(&payload);
        producer
            .send(record, Duration::from_secs(10))
            .await
            .expect("produce");
    }
    let mq = cluster.open("");
    let mut c = mq
        .consumer("keyed", "g")
        .manual_ack()
        .max_in_flight(3)
        .key_ordered()
        .build()
        .expect("consumer");
    let d0 = recv(&mut c).await;
    assert_eq!(d0.offset(), 0);
    assert_eq!(
        d0.headers().get("message-key").map(String::as_str),
        Some("a")
    );
    let d2 = recv(&mut c).await;
    assert_eq!(d2.offset(), 2, "record 1 waits for its key's turn");
    let none = c
        .recv_timeout(Duration::from_secs(1))
        .await
        .expect("recv_timeout");
    assert!(
        none.is_none(),
        "key a has a record out: {:?}",
        none.map(|d| d.offset())
    );
    d0.ack().await.expect("ack");
    let d1 = recv(&mut c).await;
    assert_eq!(d1.offset(), 1, "key a's turn");
}

/// Records the cluster deleted below the group's committed cursor before the group read
/// them (retention: the mock keeps about 5 MiB a partition) do not hold the floor: the
/// group resumes at the earliest record left and its cursor reaches the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_deleted_before_they_were_read_do_not_hold_the_floor() {
    let cluster = Cluster::new(&["trimmed"]);
    let mq = cluster.open("");
    publish_n(&mq, "trimmed", 1).await;
    {
        let mut c = mq
            .consumer("trimmed", "g")
            .manual_ack()
            .build()
            .expect("consumer");
        recv(&mut c).await.ack().await.expect("ack");
        c.close().await.expect("close");
    }
    // About 7 MiB more: the mock drops the partition's oldest records.
    let big = vec![7u8; 100 << 10];
    for _ in 0..70 {
        mq.publish("trimmed", big.clone(), &spool::Headers::new())
            .await
            .expect("publish");
    }
    let info = mq.topic_info("trimmed").expect("topic_info");
    assert!(
        info.earliest > 1,
        "the mock deleted the first records: {info:?}"
    );
    let mut c = mq
        .consumer("trimmed", "g")
        .manual_ack()
        .build()
        .expect("consumer");
    let mut first = None;
    for _ in info.earliest..info.next {
        let d = recv(&mut c).await;
        first.get_or_insert(d.offset());
        d.ack().await.expect("ack");
    }
    assert_eq!(
        first,
        Some(info.earliest),
        "resumed at the earliest record left"
    );
    let g = mq.group_info("trimmed", "g").expect("group_info");
    assert_eq!(g.cursor, info.next, "the cursor passed the deleted records");
    assert_eq!(g.lag, 0, "nothing left: {g:?}");
}

/// An `ack_all` polled once (its commit sent) and then held unpolled, as the future of a
/// `select!` whose other branch runs, blocks no other ack: the committer does not wait
/// `Kafka Timeout Ms` for a task that is not looking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_all_held_unpolled_blocks_no_later_ack() {
    let (_cluster, mq, c, batch, d2) = three_out("held").await;
    let mut f = std::pin::pin!(c.ack_all(batch));
    poll_once(f.as_mut());
    tokio::time::timeout(Duration::from_secs(15), d2.ack())
        .await
        .expect("a later ack does not wait for the held one's time-out")
        .expect("ack");
    tokio::time::timeout(Duration::from_secs(15), f)
        .await
        .expect("the held ack_all ends")
        .expect("ack_all");
    let info = mq.group_info("held", "g").expect("group_info");
    assert_eq!(info.cursor, 3, "all acked and committed");
}

/// A consumer dropped while an `ack_all` made through another consumer holds its
/// member's commit (polled once, then held unpolled) closes without waiting
/// `Kafka Timeout Ms` for that task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_while_an_ack_all_is_held_unpolled_returns_soon() {
    let cluster = Cluster::new(&["held_a", "held_b"]);
    let mq = cluster.open("Kafka Timeout Ms=30000");
    publish_n(&mq, "held_b", 2).await;
    let ca = mq
        .consumer("held_a", "g")
        .manual_ack()
        .build()
        .expect("consumer a");
    let mut cb = mq
        .consumer("held_b", "g")
        .manual_ack()
        .max_in_flight(2)
        .build()
        .expect("consumer b");
    let batch = vec![recv(&mut cb).await, recv(&mut cb).await];
    // Acked through `ca`: the future holds `ca`'s member, not `cb`'s.
    let mut f = std::pin::pin!(ca.ack_all(batch));
    poll_once(f.as_mut());
    let dropped = tokio::task::spawn_blocking(move || drop(cb));
    tokio::time::timeout(Duration::from_secs(15), dropped)
        .await
        .expect("the drop does not wait for the held ack_all's time-out")
        .expect("drop");
    let acked = tokio::time::timeout(Duration::from_secs(15), f)
        .await
        .expect("the held ack_all ends");
    assert!(acked.is_ok(), "its commit was made: {acked:?}");
}

/// A member of group `g` on `topic` (`Kafka Timeout Ms=30000`) with its three records
/// out: two for a batch, and one more.
async fn three_out(topic: &str) -> (Cluster, Spool, spool::Consumer, Vec<Delivery>, Delivery) {
    let cluster = Cluster::new(&[topic]);
    let mq = cluster.open("Kafka Timeout Ms=30000");
    publish_n(&mq, topic, 3).await;
    let mut c = mq
        .consumer(topic, "g")
        .manual_ack()
        .max_in_flight(3)
        .build()
        .expect("consumer");
    let batch = vec![recv(&mut c).await, recv(&mut c).await];
    let third = recv(&mut c).await;
    (cluster, mq, c, batch, third)
}

/// Polls an `ack_all` once, with a waker that does nothing: its batch is acked and its
/// commit sent, and the answer cannot be there yet.
fn poll_once<F: Future<Output = spool::Result<()>>>(f: std::pin::Pin<&mut F>) {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(
        f.poll(&mut cx).is_pending(),
        "the commit's answer cannot be there yet"
    );
}
