//! Futures of the async API cancelled (dropped after a poll) or polled again while
//! waiting keep the contract: no delivery lost in flight, a dropped ack or nack still
//! done, a cancelled publish retried with its message id appended once, and every
//! publisher waiting for a sync woken when it lands (from a review of cancellation
//! safety).
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use spool::SyncPolicy;
use spool::testing::SimFs;
use spool::{Headers, Options, Spool};

struct Count(AtomicUsize);
impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}
fn counting() -> (Arc<Count>, Waker) {
    let c = Arc::new(Count(AtomicUsize::new(0)));
    (c.clone(), Waker::from(c))
}
fn poll<F: Future + ?Sized>(f: Pin<&mut F>, w: &Waker) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(w))
}
fn eventually(mut f: impl FnMut() -> bool, within: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < within {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    f()
}
fn id(s: &str) -> Headers {
    let mut h = Headers::new();
    h.insert("message-id".into(), s.into());
    h
}
fn open(fs: &SimFs) -> Spool {
    Spool::open_simulated(
        Options {
            sync: SyncPolicy::Always,
            ..spool::testing::without_background_work(Options::new("/data"))
        },
        fs,
    )
    .expect("open")
}

/// Publish A waits for its fsync (held: a slow disk); publish B, a de-duplication hit,
/// appends nothing and waits on the log's end, which is A's end too; B's task is polled
/// again before the fsync ends (woken by something else: `select!`, `join!`). When the
/// fsync lands, A must be woken: its waker must not have been replaced by B's (found by
/// review: the waiters were keyed by (segment, end), so A's task hung forever although
/// its record was durable).
fn both_waiters_on_one_end_are_woken(seed: u64, a_headers: &Headers, b_headers: &Headers) {
    let fs = SimFs::new(seed);
    let mq = open(&fs);
    let (_, noop) = counting();
    let old = id("old");
    let mut warm = Box::pin(mq.publish("t", b"old".to_vec(), &old));
    assert!(eventually(
        || poll(warm.as_mut(), &noop).is_ready(),
        Duration::from_secs(5)
    ));

    fs.hold_syncs(true);
    let (ca, wa) = counting();
    let (cb, wb) = counting();
    let mut a = Box::pin(mq.publish("t", b"x".to_vec(), a_headers));
    assert!(poll(a.as_mut(), &wa).is_pending());
    let mut b = Box::pin(mq.publish("t", b"x".to_vec(), b_headers));
    assert!(poll(b.as_mut(), &wb).is_pending());
    assert!(poll(b.as_mut(), &wb).is_pending());
    fs.hold_syncs(false);

    assert!(
        eventually(|| cb.0.load(Ordering::SeqCst) > 0, Duration::from_secs(5)),
        "B woken"
    );
    let a_woken = eventually(|| ca.0.load(Ordering::SeqCst) > 0, Duration::from_secs(2));
    let a_ready = matches!(poll(a.as_mut(), &wa), Poll::Ready(Ok(1)));
    assert!(
        a_woken,
        "publish A is durable (a re-poll is Ready: {a_ready}) but was never woken"
    );
}

/// B retries A's message id while A still waits.
#[test]
fn a_retry_of_a_publish_still_waiting_for_its_sync_does_not_steal_its_wake_up() {
    let h = id("order-1");
    both_waiters_on_one_end_are_woken(1, &h, &h);
}

/// B resends an older id while an unrelated publish A waits.
#[test]
fn a_dedup_hit_does_not_steal_the_wake_up_of_an_unrelated_publish() {
    both_waiters_on_one_end_are_woken(2, &Headers::new(), &id("old"));
}

/// The same on a tokio runtime, B's retry inside a `select!` with a ticker: A returns.
#[test]
fn a_retry_inside_select_lets_the_original_publish_return() {
    let fs = SimFs::new(3);
    let mq = open(&fs);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        mq.publish("t", b"warm".to_vec(), &Headers::new())
            .await
            .unwrap();
        fs.hold_syncs(true);
        let h = id("order-1");
        let (m1, h1) = (mq.clone(), h.clone());
        let a = tokio::spawn(async move { m1.publish("t", b"x".to_vec(), &h1).await });
        let f2 = fs.clone();
        tokio::task::spawn_blocking(move || {
            eventually(|| f2.syncs_waiting() > 0, Duration::from_secs(5))
        })
        .await
        .unwrap();
        let (m2, f3) = (mq.clone(), fs.clone());
        let b = tokio::spawn(async move {
            let p = m2.publish("t", b"x".to_vec(), &h);
            tokio::pin!(p);
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            let mut ticks = 0;
            loop {
                tokio::select! {
                    r = &mut p => return r,
                    _ = tick.tick() => { ticks += 1; if ticks == 3 { f3.hold_syncs(false); } }
                }
            }
        });
        assert_eq!(b.await.unwrap().unwrap(), 1);
        let r = tokio::time::timeout(Duration::from_secs(3), a).await;
        assert!(r.is_ok(), "publish A (offset 1, durable) never returned");
    });
}

/// Checked and fine: recv cancelled while waiting, ack/nack futures dropped after their
/// first poll, publish cancelled then retried (dedup) — each keeps the contract.
#[tokio::test(flavor = "current_thread")]
async fn dropped_futures_keep_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let mq = Spool::open(&format!("Data Source={}", dir.path().display())).unwrap();
    let mut c = mq.consumer("t", "g").manual_ack().build().unwrap();
    // recv cancelled while waiting: nothing out.
    assert!(
        tokio::time::timeout(Duration::from_millis(20), c.recv())
            .await
            .is_err()
    );
    assert_eq!(mq.group_info("t", "g").unwrap().in_flight, 0);
    // publish polled once then dropped; the retry with the same id gets the same offset.
    let h = id("m");
    let (_, noop) = counting();
    {
        let mut p = Box::pin(mq.publish("t", b"a".to_vec(), &h));
        let _ = poll(p.as_mut(), &noop);
    }
    assert_eq!(mq.publish("t", b"a".to_vec(), &h).await.unwrap(), 0);
    assert_eq!(mq.topic_info("t").unwrap().next, 1);
    // nack future polled once and dropped: done; redelivered with attempt 2.
    let d = c.recv().await.unwrap();
    {
        let mut n = Box::pin(d.nack("r"));
        let _ = poll(n.as_mut(), &noop);
    }
    let d = c.recv().await.unwrap();
    assert_eq!((d.offset(), d.attempt()), (0, 2));
    // ack future dropped unpolled: the ack is made; the slot is free.
    mq.publish("t", b"b".to_vec(), &Headers::new())
        .await
        .unwrap();
    drop(d.ack());
    let d = tokio::time::timeout(Duration::from_secs(2), c.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.offset(), 1);
    drop(d); // released
    let d = c.recv().await.unwrap();
    assert_eq!(d.offset(), 1);
    d.ack().await.unwrap();
    assert_eq!(mq.group_info("t", "g").unwrap().cursor, 2);
    // auto-ack: recv cancelled does not lose the delivery handed out before.
    mq.publish("t", b"c".to_vec(), &Headers::new())
        .await
        .unwrap();
    let mut a = mq.consumer("t", "g2").build().unwrap();
    for want in 0..3 {
        assert_eq!(a.recv().await.unwrap().offset(), want);
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(20), a.recv())
            .await
            .is_err()
    );
    drop(a);
    mq.close().await.unwrap();
}

/// Under `Always` a publish leaves its record in memory for the sync thread, which writes
/// it just before its sync (held records). A publish cancelled while waiting for that
/// sync must still have its record written, with no later publish to write it (the topic
/// is handed to the sync thread before the publish's first `.await`), and made durable by
/// that round's sync: a round that synced before writing would leave it unsynced until
/// some later publish or the close. Readers see it once that sync ends (not before: under
/// `Always` a reader sees only durable records).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_cancelled_while_its_record_is_held_still_has_it_written() {
    let fs = SimFs::new(11);
    let mq = open(&fs);
    mq.publish("t", &b"first"[..], &Headers::new())
        .await
        .expect("publish");
    fs.hold_syncs(true);
    {
        let (_, w) = counting();
        let h = Headers::new();
        let mut p = Box::pin(mq.publish("t", &b"cancelled"[..], &h));
        assert!(poll(p.as_mut(), &w).is_pending(), "waits for its sync");
    }
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until && fs.syncs_waiting() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let in_sync = fs.syncs_waiting();
    let seen = mq.fetch("t", 0, 10).await.expect("fetch").len();
    fs.hold_syncs(false);
    assert_eq!(in_sync, 1, "the sync thread wrote the record and syncs it");
    assert_eq!(seen, 1, "not visible before its sync ends");
    let until = Instant::now() + Duration::from_secs(5);
    let mut seen = 0;
    while Instant::now() < until && seen < 2 {
        seen = mq.fetch("t", 0, 10).await.expect("fetch").len();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        seen, 2,
        "the cancelled publish's record was written and shown"
    );
    let image = open(&fs.crash_now());
    let durable = image.fetch("t", 0, 10).await.expect("fetch").len();
    assert_eq!(durable, 2, "and synced, with nothing else to sync it");
    mq.close().await.expect("close");
}

/// The last `Spool` handle may be dropped by a waker the sync thread runs (a waker that
/// owns a handle: an executor that drops a finished task's state in `wake`). The drop
/// then stops the sync thread from that thread itself: it must not join itself (it
/// panicked there: "Resource deadlock avoided", and the waker never returned).
#[test]
fn the_last_handle_dropped_by_a_waker_on_the_sync_thread_does_not_join_it() {
    struct DropsSpool(std::sync::Mutex<Option<Spool>>, std::sync::mpsc::Sender<()>);
    impl Wake for DropsSpool {
        fn wake(self: Arc<Self>) {
            drop(self.0.lock().unwrap().take());
            let _ = self.1.send(());
        }
    }
    let fs = SimFs::new(17);
    let mq = open(&fs);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    // The topic first: creating it commits the catalog, which would wait for the syncs.
    rt.block_on(mq.publish("t", &b"first"[..], &Headers::new()))
        .expect("publish");
    let (tx, rx) = std::sync::mpsc::channel();
    let waker = Waker::from(Arc::new(DropsSpool(
        std::sync::Mutex::new(Some(mq.clone())),
        tx,
    )));
    fs.hold_syncs(true);
    {
        let publisher = mq.clone();
        let mut p =
            Box::pin(async move { publisher.publish("t", &b"x"[..], &Headers::new()).await });
        assert!(poll(p.as_mut(), &waker).is_pending(), "waits for its sync");
    }
    drop(mq);
    // The waker's handle is the last one; the sync thread drops it when the sync lands.
    fs.hold_syncs(false);
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the waker ran and the drop returned");
}
