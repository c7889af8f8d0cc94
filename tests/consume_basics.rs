//! Guards issue 3 point 1 (consuming): `recv`, `recv_timeout` and `pull` deliver in offset
//! order, a waiting `recv` wakes on a publish, a new group starts at the earliest retained
//! offset, consumers and deliveries move into spawned tasks, and consumers of one group
//! share it so that no delivery is ever out to two of them at once.

mod common_groups;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use common_groups::{WAIT, assert_nothing, open, payload_of, publish_n, recv};
use futures_util::StreamExt;
use spool::{Delivery, Error, Headers};

const TOPIC: &str = "basics.events";

#[tokio::test]
async fn recv_delivers_in_offset_order_with_payload_and_attempt_one() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    let h = common_groups::headers(&[("content-type", "text/plain")]);
    for i in 0..3u64 {
        mq.publish(TOPIC, payload_of(i), &h).await.unwrap();
    }
    let mut c = common_groups::manual(&mq, TOPIC, "g", 1);
    for i in 0..3u64 {
        let d = recv(&mut c).await;
        assert_eq!(d.offset(), i);
        assert_eq!(&d.payload()[..], &payload_of(i)[..]);
        assert_eq!(d.headers(), &h);
        assert_eq!(d.attempt(), 1);
        assert_eq!(d.topic(), TOPIC);
        assert_eq!(d.group(), "g");
        d.ack().await.unwrap();
    }
    assert_nothing(&mut c).await;
    let info = mq.group_info(TOPIC, "g").unwrap();
    assert_eq!(
        (info.cursor, info.next, info.lag, info.in_flight),
        (3, 3, 0, 0)
    );
}

#[tokio::test]
async fn try_recv_never_waits_and_hands_out_what_is_there() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    let mut c = common_groups::manual(&mq, TOPIC, "g", 2);
    assert!(c.try_recv().unwrap().is_none(), "nothing published yet");
    publish_n(&mq, TOPIC, 3).await;
    let a = c.try_recv().unwrap().expect("offset 0 is there");
    let b = c.try_recv().unwrap().expect("offset 1 is there");
    assert_eq!((a.offset(), b.offset()), (0, 1));
    assert!(
        c.try_recv().unwrap().is_none(),
        "max_in_flight 2 is reached"
    );
    a.ack().await.unwrap();
    assert_eq!(c.try_recv().unwrap().expect("a slot is free").offset(), 2);
    drop(b);
    drop(c);
    mq.close().await.unwrap();
    assert!(matches!(
        mq.consumer(TOPIC, "g").build(),
        Err(Error::Closed)
    ));
}

#[tokio::test]
async fn an_ack_is_made_when_called_even_if_its_future_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 2).await;
    let mut c = common_groups::manual(&mq, TOPIC, "g", 1);
    let d = recv(&mut c).await;
    let pending = d.ack();
    // The slot is free before the future is polled: the next delivery comes at once.
    assert_eq!(
        c.try_recv()
            .unwrap()
            .expect("slot freed by the ack")
            .offset(),
        1
    );
    drop(pending);
    assert_eq!(mq.group_info(TOPIC, "g").unwrap().cursor, 1);
    drop(c);
    mq.close().await.unwrap();
    // Durable all the same: the close commits it.
    let mq = open(dir.path(), "");
    assert_eq!(mq.group_info(TOPIC, "g").unwrap().cursor, 1);
}

#[tokio::test]
async fn recv_timeout_returns_none_when_empty_and_some_when_available() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    let mut c = common_groups::manual(&mq, TOPIC, "g", 1);
    assert_nothing(&mut c).await;
    publish_n(&mq, TOPIC, 1).await;
    let d = c
        .recv_timeout(WAIT)
        .await
        .unwrap()
        .expect("a published record is delivered");
    assert_eq!(d.offset(), 0);
    d.ack().await.unwrap();
    assert_nothing(&mut c).await;
}

#[tokio::test]
async fn pull_streams_every_record_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 20).await;
    let mut c = mq.consumer(TOPIC, "g").build().unwrap();
    let got: Vec<u64> = {
        let stream = c.pull();
        let items: Vec<spool::Result<Delivery>> =
            tokio::time::timeout(WAIT, stream.take(20).collect())
                .await
                .expect("twenty deliveries");
        items.into_iter().map(|d| d.unwrap().offset()).collect()
    };
    assert_eq!(got, (0..20).collect::<Vec<_>>());
    c.close().await.unwrap();
    assert_eq!(mq.group_info(TOPIC, "g").unwrap().cursor, 20);
}

#[tokio::test]
async fn pull_ends_with_closed_when_the_instance_closes() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    let mut c = mq.consumer(TOPIC, "g").build().unwrap();
    let closer = mq.clone();
    let task = tokio::spawn(async move {
        let mut stream = c.pull();
        let first = stream.next().await;
        let after = stream.next().await;
        (first.map(|r| r.map(|d| d.offset())), after.is_none())
    });
    tokio::task::yield_now().await;
    closer.close().await.unwrap();
    let (first, ended) = tokio::time::timeout(WAIT, task)
        .await
        .expect("the waiting stream wakes on close")
        .unwrap();
    assert!(matches!(first, Some(Err(Error::Closed))), "got {first:?}");
    assert!(ended, "the stream ends after an error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_recv_wakes_when_another_task_publishes() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    let mut c = common_groups::manual(&mq, TOPIC, "g", 1);
    let recv = c.recv();
    tokio::pin!(recv);
    // The recv is registered and waiting before anything is published.
    assert!(futures_util::poll!(recv.as_mut()).is_pending());
    let producer = mq.clone();
    tokio::spawn(async move {
        producer
            .publish(TOPIC, b"wake up".to_vec(), &Headers::new())
            .await
            .unwrap()
    })
    .await
    .unwrap();
    let d = tokio::time::timeout(WAIT, recv)
        .await
        .expect("the waiting recv completes after the publish")
        .unwrap();
    assert_eq!(d.offset(), 0);
    assert_eq!(&d.payload()[..], b"wake up");
    d.ack().await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_waiting_recv_wakes_on_a_current_thread_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    let mut c = mq.consumer(TOPIC, "g").build().unwrap();
    let waiter = tokio::spawn(async move { c.recv().await.map(|d| d.offset()) });
    // Let the waiter register before publishing.
    tokio::task::yield_now().await;
    mq.publish(TOPIC, b"x".to_vec(), &Headers::new())
        .await
        .unwrap();
    let got = tokio::time::timeout(WAIT, waiter)
        .await
        .expect("woken")
        .unwrap();
    assert_eq!(got.unwrap(), 0);
}

/// A busy-polling `recv` (`ConsumerBuilder::busy_poll`: it spins before it parks) takes a
/// record published while it spins without waiting out its budget (here far longer than
/// the test waits), and one whose short budget ran out long ago is woken from its park.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_polling_recv_sees_a_publish_while_it_spins_and_after_it_parked() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    let (tx, rx) = std::sync::mpsc::channel();
    for (group, budget) in [("long", 600_000), ("short", 1)] {
        let mut c = mq
            .consumer(TOPIC, group)
            .busy_poll(std::time::Duration::from_millis(budget))
            .build()
            .unwrap();
        let tx = tx.clone();
        // A thread of its own: a spinning recv holds its runtime's thread.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            for _ in 0..2 {
                let got = rt.block_on(c.recv()).map(|d| d.offset());
                let _ = tx.send((c.group().to_owned(), got));
            }
        });
    }
    let mut got = BTreeMap::new();
    for i in 0..2u64 {
        // Both are waiting (the short one parked) before the record is published.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        mq.publish(TOPIC, payload_of(i), &Headers::new())
            .await
            .unwrap();
        for _ in 0..2 {
            let rx_wait = tokio::task::block_in_place(|| rx.recv_timeout(WAIT));
            let (group, offset) = rx_wait.expect("each consumer gets the record");
            got.entry(group)
                .or_insert_with(Vec::new)
                .push(offset.unwrap());
        }
    }
    let want: BTreeMap<String, Vec<u64>> =
        [("long".into(), vec![0, 1]), ("short".into(), vec![0, 1])].into();
    assert_eq!(got, want);
}

/// A close ends a busy-polling `recv` (here with a budget far longer than the test waits)
/// at once, with `Closed`. Found by review: close woke only parked consumers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_ends_a_busy_polling_recv() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    let mut c = mq
        .consumer(TOPIC, "g")
        .busy_poll(std::time::Duration::from_secs(600))
        .build()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let _ = tx.send(rt.block_on(c.recv()).map(|d| d.offset()));
    });
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    mq.close().await.unwrap();
    let got = tokio::task::block_in_place(|| rx.recv_timeout(WAIT)).expect("recv ended");
    assert!(matches!(got, Err(Error::Closed)), "{got:?}");
}

/// The spin budget is per `recv` call: a consumer that cannot take a record (its one
/// slot is out) parks once its budget is spent although every publish to the topic rings
/// it, so `recv_timeout` returns while records keep coming. Found by review: the budget
/// restarted at every ring, and the consumer spun for as long as the producer ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_polling_consumer_with_no_free_slot_parks_while_records_keep_coming() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    mq.publish(TOPIC, payload_of(0), &Headers::new())
        .await
        .unwrap();
    let mut c = mq
        .consumer(TOPIC, "g")
        .manual_ack()
        .max_in_flight(1)
        .busy_poll(std::time::Duration::from_millis(20))
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let gave_up = Arc::new(AtomicBool::new(false));
    let producer = {
        let (mq, stop, gave_up) = (mq.clone(), stop.clone(), gave_up.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let until = std::time::Instant::now() + WAIT;
            let mut i = 1;
            while !stop.load(Ordering::Acquire) {
                if std::time::Instant::now() >= until {
                    gave_up.store(true, Ordering::Release);
                    break;
                }
                rt.block_on(mq.publish(TOPIC, payload_of(i), &Headers::new()))
                    .unwrap();
                i += 1;
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        })
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let held = rt.block_on(c.recv()).unwrap();
        let r = rt.block_on(c.recv_timeout(std::time::Duration::from_millis(50)));
        let _ = tx.send((held.offset(), r.map(|d| d.map(|d| d.offset()))));
    });
    let got = tokio::task::block_in_place(|| rx.recv_timeout(WAIT * 2)).expect("recv ended");
    stop.store(true, Ordering::Release);
    producer.join().unwrap();
    assert!(matches!(got, (0, Ok(None))), "{got:?}");
    assert!(
        !gave_up.load(Ordering::Acquire),
        "recv_timeout returned only when the records stopped coming"
    );
}

#[tokio::test]
async fn a_new_group_starts_at_the_earliest_retained_offset() {
    let dir = tempfile::tempdir().unwrap();
    // Tiny segments and a small byte budget so that retention deletes the oldest ones.
    let mq = open(
        dir.path(),
        "Segment Bytes=1024;Retention Bytes=2048;Retention Check Ms=3600000",
    );
    let filler = vec![b'x'; 100];
    for _ in 0..60 {
        mq.publish(TOPIC, filler.clone(), &Headers::new())
            .await
            .unwrap();
    }
    mq.apply_retention().unwrap();
    let earliest = mq.topic_info(TOPIC).unwrap().earliest;
    assert!(earliest > 0, "retention deleted something");

    // Inspection of a group that does not exist yet reports where it would start.
    let info = mq.group_info(TOPIC, "fresh").unwrap();
    assert_eq!(info.cursor, earliest);
    assert_eq!(info.skipped, 0);

    let mut c = common_groups::manual(&mq, TOPIC, "fresh", 1);
    let d = recv(&mut c).await;
    assert_eq!(d.offset(), earliest);
    d.ack().await.unwrap();
    let info = mq.group_info(TOPIC, "fresh").unwrap();
    assert_eq!(info.cursor, earliest + 1);
    assert_eq!(info.skipped, 0, "a new group skipped nothing");
}

#[tokio::test]
async fn a_new_group_on_an_empty_topic_gets_the_first_publish() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    let mut c = common_groups::manual(&mq, TOPIC, "g", 1);
    let info = mq.group_info(TOPIC, "g").unwrap();
    assert_eq!((info.cursor, info.next, info.lag), (0, 0, 0));
    publish_n(&mq, TOPIC, 2).await;
    assert_eq!(recv(&mut c).await.offset(), 0);
}

#[tokio::test]
async fn groups_are_independent() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 3).await;
    let mut a = common_groups::manual(&mq, TOPIC, "a", 1);
    let mut b = common_groups::manual(&mq, TOPIC, "b", 1);
    for i in 0..3 {
        recv(&mut a).await.ack().await.unwrap();
        let d = recv(&mut b).await;
        assert_eq!(d.offset(), i, "group b sees every record too");
        d.ack().await.unwrap();
    }
    assert_eq!(mq.group_info(TOPIC, "a").unwrap().cursor, 3);
    assert_eq!(mq.group_info(TOPIC, "b").unwrap().cursor, 3);
}

#[tokio::test]
async fn max_in_flight_bounds_what_the_group_has_out() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 10).await;
    let mut c1 = common_groups::manual(&mq, TOPIC, "g", 3);
    let mut c2 = common_groups::manual(&mq, TOPIC, "g", 3);
    let d0 = recv(&mut c1).await;
    let d1 = recv(&mut c2).await;
    let d2 = recv(&mut c1).await;
    assert_eq!((d0.offset(), d1.offset(), d2.offset()), (0, 1, 2));
    assert_eq!(mq.group_info(TOPIC, "g").unwrap().in_flight, 3);
    assert_nothing(&mut c1).await;
    assert_nothing(&mut c2).await;
    d1.ack().await.unwrap();
    assert_eq!(recv(&mut c2).await.offset(), 3);
    drop((d0, d2));
}

#[tokio::test]
async fn with_the_default_max_in_flight_a_second_consumer_waits() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 2).await;
    let mut c1 = common_groups::manual(&mq, TOPIC, "g", 1);
    let mut c2 = common_groups::manual(&mq, TOPIC, "g", 1);
    let d = recv(&mut c1).await;
    assert_nothing(&mut c2).await;
    d.ack().await.unwrap();
    assert_eq!(recv(&mut c2).await.offset(), 1);
}

/// Spawns `consumers` tasks of one group with `max_in_flight`; each records what it holds
/// in a shared set (asserting nobody else holds it) and acks. Returns how often each offset
/// was finished.
async fn share_one_group(total: u64, consumers: usize, max_in_flight: usize, manual: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    let out: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    let finished: Arc<Mutex<BTreeMap<u64, usize>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..consumers {
        let mut b = mq.consumer(TOPIC, "shared").max_in_flight(max_in_flight);
        if manual {
            b = b.manual_ack();
        }
        let mut c = b.build().unwrap();
        let out = out.clone();
        let finished = finished.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                if finished.lock().unwrap().len() as u64 == total {
                    break;
                }
                let Some(d) = c.recv_timeout(common_groups::NOTHING).await.unwrap() else {
                    continue;
                };
                let o = d.offset();
                assert!(
                    out.lock().unwrap().insert(o),
                    "offset {o} was handed to two consumers at once"
                );
                tokio::task::yield_now().await;
                assert!(out.lock().unwrap().remove(&o));
                *finished.lock().unwrap().entry(o).or_default() += 1;
                if manual {
                    d.ack().await.unwrap();
                }
                // Auto-ack: acked by the next recv, or by dropping the consumer.
            }
            c.close().await.unwrap();
        }));
    }
    let producer = mq.clone();
    let publish = tokio::spawn(async move {
        for i in 0..total {
            producer
                .publish(TOPIC, payload_of(i), &Headers::new())
                .await
                .unwrap();
        }
    });
    tokio::time::timeout(WAIT, publish).await.unwrap().unwrap();
    for t in tasks {
        tokio::time::timeout(WAIT, t).await.unwrap().unwrap();
    }
    let finished = finished.lock().unwrap().clone();
    assert_eq!(finished.len() as u64, total);
    assert!(
        finished.values().all(|&n| n == 1),
        "each offset is delivered once when every delivery is acked: {finished:?}"
    );
    let info = mq.group_info(TOPIC, "shared").unwrap();
    assert_eq!((info.cursor, info.in_flight), (total, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumers_of_one_group_never_hold_the_same_delivery_manual_ack() {
    share_one_group(300, 4, 8, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumers_of_one_group_never_hold_the_same_delivery_auto_ack() {
    share_one_group(300, 4, 8, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumers_of_one_group_share_strict_order_with_max_in_flight_one() {
    share_one_group(100, 3, 1, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_and_delivery_move_into_spawned_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 5).await;
    let c = common_groups::manual(&mq, TOPIC, "g", 1);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Delivery>(1);
    // The consumer lives in one task, the deliveries are acked in another.
    let receiver = tokio::spawn(async move {
        let mut c = c;
        for _ in 0..5 {
            let d = c.recv().await.unwrap();
            tx.send(d).await.unwrap();
        }
    });
    let acker = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(d) = rx.recv().await {
            seen.push(d.offset());
            tokio::spawn(async move { d.ack().await.unwrap() })
                .await
                .unwrap();
        }
        seen
    });
    tokio::time::timeout(WAIT, receiver).await.unwrap().unwrap();
    let seen = tokio::time::timeout(WAIT, acker).await.unwrap().unwrap();
    assert_eq!(seen, vec![0, 1, 2, 3, 4]);
    assert_eq!(mq.group_info(TOPIC, "g").unwrap().cursor, 5);
}

#[tokio::test]
async fn consumer_names_are_checked_at_build() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    let r = mq.consumer("bad topic", "g").build();
    assert!(matches!(r, Err(Error::InvalidTopicName { .. })), "{r:?}");
    let r = mq.consumer(TOPIC, "..").build();
    assert!(matches!(r, Err(Error::InvalidTopicName { .. })), "{r:?}");
}

/// Like `share_one_group`, but deliveries are also nacked and dropped (released) along the
/// way: a redelivery must also go to one consumer at a time, and in the end every offset is
/// acked exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumers_of_one_group_never_hold_the_same_delivery_with_nacks_and_releases() {
    const TOTAL: u64 = 200;
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "Max Delivery Attempts=0");
    publish_n(&mq, TOPIC, TOTAL).await;
    let out: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    let acked: Arc<Mutex<BTreeMap<u64, usize>>> = Arc::default();
    let released: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let mut c = common_groups::manual(&mq, TOPIC, "churn", 6);
        let out = out.clone();
        let acked = acked.clone();
        let released = released.clone();
        tasks.push(tokio::spawn(async move {
            while (acked.lock().unwrap().len() as u64) < TOTAL {
                let Some(d) = c.recv_timeout(common_groups::NOTHING).await.unwrap() else {
                    continue;
                };
                let (o, attempt) = (d.offset(), d.attempt());
                assert!(
                    out.lock().unwrap().insert(o),
                    "offset {o} was handed to two consumers at once"
                );
                tokio::task::yield_now().await;
                assert!(out.lock().unwrap().remove(&o));
                if o % 7 == 0 && attempt < 3 {
                    let r = d.nack("churn").await.unwrap();
                    assert_eq!(r.delivery_attempt, attempt);
                } else if o % 5 == 0 && released.lock().unwrap().insert(o) {
                    drop(d); // released once; a release does not count as an attempt
                } else {
                    d.ack().await.unwrap();
                    *acked.lock().unwrap().entry(o).or_default() += 1;
                }
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(WAIT, t).await.unwrap().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert_eq!(acked.len() as u64, TOTAL);
    assert!(acked.values().all(|&n| n == 1), "{acked:?}");
    let info = mq.group_info(TOPIC, "churn").unwrap();
    assert_eq!((info.cursor, info.in_flight), (TOTAL, 0));
    assert!(info.pending.is_empty());
}

/// `max_in_flight(usize::MAX)` means no limit: the group's span (4 × n) saturates instead of
/// overflowing when added to the cursor (the suite runs with overflow checks on).
#[tokio::test]
async fn an_unbounded_max_in_flight_hands_out_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 5).await;
    let mut c = mq
        .consumer(TOPIC, "unbounded")
        .max_in_flight(usize::MAX)
        .build()
        .unwrap();
    for offset in 0..3 {
        assert_eq!(recv(&mut c).await.offset(), offset);
        // Takes the read-ahead loan back, so the next hand-out reads again.
        mq.group_info(TOPIC, "unbounded").unwrap();
    }
}
