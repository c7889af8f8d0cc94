//! Held records (`Sync=Always`: a publish's records stay in memory until the sync thread
//! writes them, just before its sync) and what the rest of the API sees of them. Found by
//! a review of the change that brought them: a failed held write left its message ids in
//! the de-duplication window, a dead-letter append that wrote held records woke nobody,
//! and `topic_info` counted held records while `group_info` and `reset` did not.

use std::path::Path;
use std::time::{Duration, Instant};

use spool::testing::SimFs;
use spool::{Headers, OffsetReset, Options, Spool, SyncPolicy};

fn open(fs: &SimFs) -> Spool {
    let o = Options {
        sync: SyncPolicy::Always,
        max_delivery_attempts: 1,
        ..spool::testing::without_background_work(Options::new("/data"))
    };
    Spool::open_simulated(o, fs).expect("open")
}

fn first_segment(topic: &str) -> String {
    format!("/data/topics/{topic}/{:020}.log", 0)
}

fn with_id(id: &str) -> Headers {
    [("message-id".to_string(), id.to_string())].into()
}

fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

fn spawn_publish(
    mq: &Spool,
    topic: &'static str,
    headers: Headers,
) -> tokio::task::JoinHandle<spool::Result<u64>> {
    let mq = mq.clone();
    tokio::spawn(async move { mq.publish(topic, &b"x"[..], &headers).await })
}

/// A consumer of `topic` that took and acked its record 0 and now waits in `recv` (on a
/// task of its own, given time to get there): the offset it gets next.
async fn waiting_consumer(mq: &Spool, topic: &str) -> tokio::task::JoinHandle<spool::Result<u64>> {
    let mut c = mq
        .consumer(topic, "g")
        .manual_ack()
        .build()
        .expect("consumer");
    c.recv().await.expect("record 0").ack().await.expect("ack");
    let waiting = tokio::spawn(async move { c.recv().await.map(|d| d.offset()) });
    tokio::time::sleep(Duration::from_millis(50)).await;
    waiting
}

/// Lets held syncs go when dropped, a failed assertion included (no test hangs in close).
struct Release(SimFs);
impl Drop for Release {
    fn drop(&mut self) {
        self.0.hold_syncs_of(None);
    }
}

/// Keeps the sync thread inside a held sync of topic `a`: records published to other
/// topics meanwhile stay held in memory.
async fn block_the_sync_thread(
    mq: &Spool,
    fs: &SimFs,
) -> (Release, tokio::task::JoinHandle<spool::Result<u64>>) {
    mq.publish("a", &b"warm"[..], &Headers::new())
        .await
        .expect("warm");
    fs.hold_syncs_of(Some(Path::new(&first_segment("a"))));
    let release = Release(fs.clone());
    let blocker = spawn_publish(mq, "a", Headers::new());
    assert!(eventually(|| fs.syncs_waiting() == 1), "a's sync is held");
    (release, blocker)
}

/// A held write that fails drops its records: their message ids must leave the window,
/// or the retry is a de-duplication hit that returns `Ok` for a record never written (and
/// after a reopen its offset goes to another message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_failed_held_write_is_not_a_hit_on_a_record_never_written() {
    let fs = SimFs::new(5);
    let mq = open(&fs);
    let none = Headers::new();
    assert_eq!(mq.publish("t", &b"first"[..], &none).await.expect("p"), 0);
    fs.fail_writes_to(Some(Path::new(&first_segment("t"))));
    let h = with_id("order-1");
    assert!(mq.publish("t", &b"order"[..], &h).await.is_err(), "failed");
    fs.fail_writes_to(None);
    assert_eq!(mq.topic_info("t").expect("info").dedup_ids, 0);
    let retry = mq.publish("t", &b"order"[..], &h).await;
    assert!(
        retry.is_err(),
        "the topic is poisoned, not a hit: {retry:?}"
    );
    let image = fs.process_crash_now();
    drop(mq);
    let mq = open(&image);
    assert_eq!(mq.fetch("t", 0, 10).await.expect("fetch").len(), 1);
    assert_eq!(mq.publish("t", &b"order"[..], &h).await.expect("p"), 1);
    assert_eq!(mq.publish("t", &b"order"[..], &h).await.expect("p"), 1);
    mq.close().await.expect("close");
}

/// A dead-letter copy is readable at once and wakes the dead-letter topic's consumers,
/// with any records held on that topic that its append wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_append_wakes_the_consumers_of_its_topic() {
    let fs = SimFs::new(7);
    let mq = open(&fs);
    let none = Headers::new();
    mq.publish("t", &b"bad"[..], &none).await.expect("p");
    mq.publish("t.dlq", &b"old"[..], &none).await.expect("p");
    let waiting = waiting_consumer(&mq, "t.dlq").await;

    let (release, blocker) = block_the_sync_thread(&mq, &fs).await;
    let user = spawn_publish(&mq, "t.dlq", with_id("replay"));
    assert!(
        eventually(|| mq.topic_info("t.dlq").expect("info").dedup_ids == 1),
        "the publish to t.dlq is appended (held)"
    );
    let nacked = mq.nack("t", "workers", 0, "broken").await.expect("nack");
    assert!(nacked.dead_lettered, "at the limit (1)");
    let woken = tokio::time::timeout(Duration::from_secs(3), waiting).await;
    drop(release);
    assert_eq!(blocker.await.expect("task").expect("p"), 1);
    assert_eq!(user.await.expect("task").expect("p"), 1);
    let woken = woken.expect("the waiting consumer is woken");
    assert_eq!(woken.expect("task").expect("recv"), 1);
    mq.close().await.expect("close");
}

/// `topic_info`, `group_info` and `reset` agree on the log's end: the records readers
/// see, without records held for an unfinished publish; once written, all count them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_info_group_info_and_reset_agree_on_the_log_end() {
    let fs = SimFs::new(9);
    let mq = open(&fs);
    mq.publish("t", &b"zero"[..], &Headers::new())
        .await
        .expect("p");
    let (release, blocker) = block_the_sync_thread(&mq, &fs).await;
    let held = spawn_publish(&mq, "t", with_id("one"));
    assert!(
        eventually(|| mq.topic_info("t").expect("info").dedup_ids == 1),
        "appended (held)"
    );
    let ends = |mq: &Spool| {
        (
            mq.topic_info("t").expect("info").next,
            mq.group_info("t", "g").expect("group").next,
        )
    };
    assert_eq!(ends(&mq), (1, 1), "the held record is not in the log yet");
    let explicit = mq.reset_offset("t", "g", OffsetReset::Explicit(5)).await;
    assert_eq!(explicit.expect("reset"), 1, "clamped to the same end");
    drop(release);
    assert_eq!(blocker.await.expect("task").expect("p"), 1);
    assert_eq!(held.await.expect("task").expect("p"), 1);
    assert_eq!(ends(&mq), (2, 2));
    let latest = mq.reset_offset("t", "g", OffsetReset::Latest).await;
    assert_eq!(latest.expect("reset"), 2);
    mq.close().await.expect("close");
}

/// A publish whose batch rolls writes the records held before it into the old segment,
/// which the roll seals; when starting the next segment then fails, that publish fails,
/// but the held records are readable (and durable) and must wake the waiting consumer
/// (found by a second review: the failed publish returned before waking anyone, the sync
/// thread found nothing held, and the poisoned topic took no more publishes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_records_written_by_a_publish_that_then_failed_wake_the_waiting_consumer() {
    let fs = SimFs::new(11);
    let mq = Spool::open_simulated(
        Options {
            sync: SyncPolicy::Always,
            segment_bytes: 1024,
            ..spool::testing::without_background_work(Options::new("/data"))
        },
        &fs,
    )
    .expect("open");
    let none = Headers::new();
    assert_eq!(mq.publish("t", &b"zero"[..], &none).await.expect("p"), 0);
    let waiting = waiting_consumer(&mq, "t").await;

    let (release, blocker) = block_the_sync_thread(&mq, &fs).await;
    let held = {
        let mq = mq.clone();
        tokio::spawn(async move { mq.publish("t", vec![1u8; 300], &with_id("one")).await })
    };
    assert!(
        eventually(|| mq.topic_info("t").expect("info").dedup_ids == 1),
        "appended (held)"
    );
    // The next segment (base 2) cannot be made: the batch's roll fails after it wrote
    // the held record into segment 0 and sealed it.
    let next_segment = format!("/data/topics/t/{:020}.log", 2);
    fs.fail_writes_to(Some(Path::new(&next_segment)));
    let batch = mq
        .publish_batch("t", vec![(vec![2u8; 800], Headers::new())])
        .await;
    fs.fail_writes_to(None);
    assert!(batch.is_err(), "the roll failed: {batch:?}");
    assert_eq!(mq.fetch("t", 1, 10).await.expect("fetch").len(), 1);
    let woken = tokio::time::timeout(Duration::from_secs(3), waiting).await;
    drop(release);
    let _ = blocker.await;
    // Its record was written and synced (the roll sealed it) before the topic failed.
    let held = held.await.expect("task");
    assert_eq!(held.expect("the held publish is durable"), 1);
    let woken = woken.expect("the waiting consumer is woken for the readable record");
    assert_eq!(woken.expect("task").expect("recv"), 1);
}

/// Under `Always` a record is visible only once it is durable (review 31): a consumer
/// that saw a record a power cut then lost would have processed a message whose offset
/// goes to another one. Here the sync thread has written record 1 and waits in its sync:
/// no read, count or consumer sees the record until the sync ends, and the sync that
/// shows it wakes the waiting consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_is_invisible_until_its_sync_ends_and_the_sync_wakes_the_consumer() {
    let fs = SimFs::new(13);
    let mq = open(&fs);
    mq.publish("t", &b"zero"[..], &Headers::new())
        .await
        .expect("p");
    let waiting = waiting_consumer(&mq, "t").await;
    fs.hold_syncs_of(Some(Path::new(&first_segment("t"))));
    let release = Release(fs.clone());
    let publish = spawn_publish(&mq, "t", Headers::new());
    // The sync thread wrote the record before this sync.
    assert!(eventually(|| fs.syncs_waiting() == 1), "its sync is held");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(mq.fetch("t", 0, 10).await.expect("fetch").len(), 1);
    assert_eq!(mq.topic_info("t").expect("info").next, 1);
    assert!(
        !waiting.is_finished(),
        "the consumer saw an unsynced record"
    );
    assert!(!publish.is_finished());
    drop(release);
    assert_eq!(publish.await.expect("task").expect("p"), 1);
    let woken = tokio::time::timeout(Duration::from_secs(3), waiting).await;
    let woken = woken.expect("the sync that showed the record woke the consumer");
    assert_eq!(woken.expect("task").expect("recv"), 1);
    mq.close().await.expect("close");
}

/// A publish cancelled while its record is held: the sync thread still writes and syncs
/// it, and that sync shows it and wakes the waiting consumer (no later publish needed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_publish_under_always_becomes_visible_at_the_next_round() {
    let fs = SimFs::new(17);
    let mq = open(&fs);
    mq.publish("t", &b"zero"[..], &Headers::new())
        .await
        .expect("p");
    let waiting = waiting_consumer(&mq, "t").await;
    let (release, blocker) = block_the_sync_thread(&mq, &fs).await;
    let cancelled = spawn_publish(&mq, "t", with_id("one"));
    assert!(
        eventually(|| mq.topic_info("t").expect("info").dedup_ids == 1),
        "appended (held)"
    );
    cancelled.abort();
    assert!(cancelled.await.is_err(), "cancelled");
    drop(release);
    assert_eq!(blocker.await.expect("task").expect("p"), 1);
    let woken = tokio::time::timeout(Duration::from_secs(3), waiting).await;
    let woken = woken.expect("the record of the cancelled publish became visible");
    assert_eq!(woken.expect("task").expect("recv"), 1);
    mq.close().await.expect("close");
}
