//! Wake-ups of waiting consumers and what a closed instance hands out (review 32): a
//! consumer parked in `recv` is woken by every change that makes a record deliverable to
//! it (a larger `max_in_flight`, retention freeing a slot, a nack or ack that failed
//! after it freed one), and a failed `close` still ends every auto-ack loan. Plus a random
//! schedule of mixed consumers of one group (`SPOOL_CONSUMER_SCHEDULES` seeds, 20).

mod common_groups;

use std::time::Duration;

use common_groups::{Rng, WAIT, open, parked_waiter, publish_n, recv};

const TOPIC: &str = "r32.events";

/// A consumer waits because the group's only slot is out; a later `build` of the same group
/// raises `max_in_flight`, so a record is available to the waiter now. It must get it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_that_raises_max_in_flight_wakes_a_waiting_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 3).await;
    let mut a = common_groups::manual(&mq, TOPIC, "g", 1);
    let d0 = recv(&mut a).await;
    let b = common_groups::manual(&mq, TOPIC, "g", 1);
    let waiter = parked_waiter(b).await;
    // Raises the group's bound to 4: offset 1 is deliverable now.
    let _c = common_groups::manual(&mq, TOPIC, "g", 4);
    let got = tokio::time::timeout(WAIT, waiter).await.unwrap().unwrap();
    assert_eq!(got, Some(1), "the parked consumer was never woken");
    drop(d0);
}

/// The group's only slot is held by a delivery whose record retention then deletes:
/// retention frees the slot (group_info says in_flight 0, lag > 0), so a consumer parked
/// in `recv` has a record available. Nothing publishes afterwards (a quiet topic).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_that_frees_the_groups_slot_wakes_a_waiting_consumer() {
    const CONN: &str = "Segment Bytes=1024;Retention Bytes=2048;Retention Check Ms=3600000";
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), CONN);
    let body = vec![b'z'; 100];
    for _ in 0..60 {
        mq.publish(TOPIC, body.clone(), &spool::Headers::new())
            .await
            .unwrap();
    }
    let mut a = common_groups::manual(&mq, TOPIC, "g", 1);
    let d0 = recv(&mut a).await; // a stuck handler holds offset 0
    let b = common_groups::manual(&mq, TOPIC, "g", 1);
    let waiter = parked_waiter(b).await;
    mq.apply_retention().unwrap();
    let earliest = mq.topic_info(TOPIC).unwrap().earliest;
    assert!(earliest > 0);
    let info = mq.group_info(TOPIC, "g").unwrap();
    assert_eq!(
        (info.cursor, info.in_flight),
        (earliest, 0),
        "the slot is free"
    );
    let got = tokio::time::timeout(WAIT, waiter).await.unwrap().unwrap();
    assert_eq!(got, Some(earliest), "the parked consumer was never woken");
    drop(d0);
}

// ---------------------------------------------------------------------------------------
// Random schedules: several consumers (auto-ack and manual) of one group.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Book {
    /// offset -> consumer id holding it
    out: BTreeMap<u64, usize>,
    /// offsets whose finishing op was started
    finished: BTreeMap<u64, usize>,
    errors: Vec<String>,
}

fn quiet_handler_panics() {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .unwrap_or_default();
        if msg != "r32 handler failed" {
            prev(info);
        }
    }));
}

fn panic_drop(d: spool::Delivery) {
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _held = d;
        std::panic::panic_any("r32 handler failed");
    }));
    assert!(caught.is_err());
}

fn take_out(book: &Mutex<Book>, o: u64, id: usize) {
    let mut b = book.lock().unwrap();
    if b.out.get(&o) == Some(&id) {
        b.out.remove(&o);
    }
}

fn hand(book: &Mutex<Book>, o: u64, id: usize, max_in_flight: usize) {
    let mut b = book.lock().unwrap();
    if b.out.len() >= max_in_flight {
        let out = format!("{:?}", b.out);
        b.errors.push(format!(
            "offset {o} handed to {id} while {out} are out (max {max_in_flight})"
        ));
    }
    if let Some(other) = b.out.insert(o, id) {
        b.errors
            .push(format!("offset {o} handed to {id} while {other} holds it"));
    }
    if b.finished.contains_key(&o) {
        b.errors
            .push(format!("offset {o} handed to {id} after it was finished"));
    }
}

fn finish(book: &Mutex<Book>, o: u64) {
    *book.lock().unwrap().finished.entry(o).or_default() += 1;
}

async fn run_schedule(seed: u64, total: u64, consumers: usize, max_in_flight: usize) {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "Max Delivery Attempts=0;Sync=None");
    let book: Arc<Mutex<Book>> = Arc::default();
    let producer = {
        let mq = mq.clone();
        tokio::spawn(async move {
            let mut rng = Rng(seed ^ 0x9e37_79b9_7f4a_7c15);
            let mut i = 0;
            while i < total {
                let n = 1 + rng.below(40).min(total - i - 1);
                let batch: Vec<(Vec<u8>, spool::Headers)> = (0..n)
                    .map(|_| (b"x".to_vec(), spool::Headers::new()))
                    .collect();
                mq.publish_batch(TOPIC, batch).await.unwrap();
                i += n;
                if rng.below(3) == 0 {
                    tokio::task::yield_now().await;
                }
            }
        })
    };
    let mut tasks = Vec::new();
    for id in 0..consumers {
        let mq = mq.clone();
        let book = book.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(seed.wrapping_mul(31).wrapping_add(id as u64 + 1) | 1);
            let manual = id % 2 == 1;
            let build = |mq: &spool::Spool| {
                let mut b = mq.consumer(TOPIC, "g").max_in_flight(max_in_flight);
                if manual {
                    b = b.manual_ack();
                }
                b.build().unwrap()
            };
            let mut c = build(&mq);
            // auto-ack: the previous delivery, if the next recv will finish it
            let mut prev: Option<u64> = None;
            let mut held: Vec<spool::Delivery> = Vec::new();
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            loop {
                if book.lock().unwrap().finished.len() as u64 >= total {
                    break;
                }
                if std::time::Instant::now() > deadline {
                    book.lock().unwrap().errors.push(format!("{id}: timed out"));
                    break;
                }
                // Occasionally: drop and rebuild the consumer.
                if rng.below(50) == 0 {
                    if let Some(p) = prev.take() {
                        take_out(&book, p, id);
                        finish(&book, p);
                    }
                    // Manual deliveries survive the consumer; auto ones too (stale after).
                    for d in held.drain(..) {
                        take_out(&book, d.offset(), id);
                        drop(d);
                    }
                    drop(c);
                    c = build(&mq);
                    continue;
                }
                // The next recv finishes `prev` (auto-ack): out of the book first.
                let p = prev.take();
                if let Some(p) = p {
                    take_out(&book, p, id);
                    finish(&book, p);
                }
                let got = match rng.below(4) {
                    0 => c.try_recv().unwrap(),
                    1 => {
                        // A recv cancelled by a short timeout.
                        match tokio::time::timeout(Duration::from_micros(rng.below(300)), c.recv())
                            .await
                        {
                            Ok(r) => Some(r.unwrap()),
                            Err(_) => None,
                        }
                    }
                    _ => c.recv_timeout(Duration::from_millis(20)).await.unwrap(),
                };
                let Some(d) = got else {
                    if manual {
                        // Finish something held so the group can move on.
                        if let Some(d) = held.pop() {
                            take_out(&book, d.offset(), id);
                            finish(&book, d.offset());
                            d.ack().await.unwrap();
                        }
                    }
                    continue;
                };
                let o = d.offset();
                hand(&book, o, id, max_in_flight);
                if rng.below(3) == 0 {
                    tokio::task::yield_now().await;
                }
                if rng.below(40) == 0 {
                    // The whole handler task panics with the consumer (and what it holds).
                    take_out(&book, o, id);
                    for h in &held {
                        take_out(&book, h.offset(), id);
                    }
                    let hs = std::mem::take(&mut held);
                    let order = rng.below(2);
                    let dead = std::mem::replace(&mut c, build(&mq));
                    let j = tokio::spawn(async move {
                        if order == 0 {
                            let _c = dead;
                            let _d = d;
                            let _h = hs;
                            std::panic::panic_any("r32 handler failed");
                        } else {
                            let _d = d;
                            let _h = hs;
                            let _c = dead;
                            std::panic::panic_any("r32 handler failed");
                        }
                    })
                    .await;
                    assert!(j.unwrap_err().is_panic());
                    continue;
                }
                match rng.below(10) {
                    0 => {
                        take_out(&book, o, id);
                        d.nack("r32").await.unwrap();
                    }
                    1 => {
                        take_out(&book, o, id);
                        panic_drop(d);
                    }
                    2 if manual => {
                        take_out(&book, o, id);
                        drop(d); // released
                    }
                    3 if !manual => {
                        take_out(&book, o, id);
                        finish(&book, o);
                        d.ack().await.unwrap();
                    }
                    4 | 5 if manual && held.len() + 1 < max_in_flight => held.push(d),
                    _ if manual => {
                        take_out(&book, o, id);
                        finish(&book, o);
                        d.ack().await.unwrap();
                    }
                    _ => {
                        // auto-ack: handled; finished by the next recv.
                        drop(d);
                        prev = Some(o);
                    }
                }
            }
            if let Some(p) = prev.take() {
                take_out(&book, p, id);
                finish(&book, p);
            }
            for d in held.drain(..) {
                take_out(&book, d.offset(), id);
                finish(&book, d.offset());
                let _ = d.ack().await;
            }
            c.close().await.unwrap();
        }));
    }
    producer.await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let b = book.lock().unwrap();
    assert!(
        b.errors.is_empty(),
        "seed {seed}: {:?}",
        &b.errors[..b.errors.len().min(10)]
    );
    let dup: Vec<_> = b.finished.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        dup.is_empty(),
        "seed {seed}: finished more than once: {dup:?}"
    );
    assert_eq!(b.finished.len() as u64, total, "seed {seed}");
    let info = mq.group_info(TOPIC, "g").unwrap();
    assert_eq!(
        (info.cursor, info.in_flight),
        (total, 0),
        "seed {seed}: {info:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn random_schedules_of_mixed_consumers_of_one_group() {
    quiet_handler_panics();
    let seeds: u64 = std::env::var("SPOOL_CONSUMER_SCHEDULES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    for seed in 1..=seeds {
        let mif = [1, 2, 3, 8][(seed % 4) as usize];
        run_schedule(seed, 400, 4, mif).await;
    }
}

/// `Spool::close` takes the engine away first; when its final sync fails, `Engine::close`
/// still runs `commit_groups`, which takes every loan back: an auto-ack consumer does not
/// go on handing out its lent records from a closed instance ("every clone then fails
/// with Error::Closed").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_whose_sync_fails_still_ends_every_loan() {
    use spool::testing::{SimFs, without_background_work};
    let fs = SimFs::new(7);
    let o = spool::Options {
        sync: spool::SyncPolicy::None,
        ..without_background_work(spool::Options::new("/data"))
    };
    let mq = spool::Spool::open_simulated(o, &fs).unwrap();
    publish_n(&mq, TOPIC, 50).await;
    let mut c = mq.consumer(TOPIC, "g").build().unwrap();
    assert_eq!(recv(&mut c).await.offset(), 0); // lends 1..50
    fs.fail_syncs_of(Some(std::path::Path::new(&format!(
        "/data/topics/{TOPIC}/{:020}.log",
        0
    ))));
    let closed = mq.close().await;
    assert!(closed.is_err(), "the final sync failed: {closed:?}");
    assert!(matches!(mq.topic_info(TOPIC), Err(spool::Error::Closed)));
    let after = c.try_recv();
    assert!(
        matches!(after, Err(spool::Error::Closed)),
        "handed out after close: {:?}",
        after.map(|d| d.map(|d| d.offset()))
    );
}

/// A nack that fails after it already put its record back up for redelivery (here: the
/// dead-letter copy's write fails) still wakes: a consumer parked for the group's only
/// slot is told that the record is deliverable again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_nack_that_frees_the_slot_wakes_a_waiting_consumer() {
    use spool::testing::{SimFs, without_background_work};
    let fs = SimFs::new(9);
    let _clear = fs.faults_cleared_on_drop();
    let o = spool::Options {
        sync: spool::SyncPolicy::None,
        max_delivery_attempts: 1,
        ..without_background_work(spool::Options::new("/data"))
    };
    let mq = spool::Spool::open_simulated(o, &fs).unwrap();
    publish_n(&mq, TOPIC, 3).await;
    let dlq = format!("{TOPIC}.dlq");
    publish_n(&mq, &dlq, 1).await; // the dead-letter topic exists
    let mut a = common_groups::manual(&mq, TOPIC, "g", 1);
    let d0 = recv(&mut a).await;
    let b = common_groups::manual(&mq, TOPIC, "g", 1);
    let waiter = parked_waiter(b).await;
    fs.fail_writes_to(Some(std::path::Path::new(&format!(
        "/data/topics/{dlq}/{:020}.log",
        0
    ))));
    let r = d0.nack("bad").await;
    assert!(r.is_err(), "the dead-letter copy failed: {r:?}");
    let info = mq.group_info(TOPIC, "g").unwrap();
    assert_eq!(
        (info.cursor, info.in_flight),
        (0, 0),
        "offset 0 is up for redelivery"
    );
    let got = tokio::time::timeout(WAIT, waiter).await.unwrap().unwrap();
    assert_eq!(got, Some(0), "the parked consumer was never woken");
}
