//! Guards issue 27 point 7 (the blocking facade): `spool::blocking` publishes, delivers,
//! acks, nacks and waits from plain threads with no async runtime; a thread blocked in
//! `recv` holds up neither a publisher on another thread nor the instance's close.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use spool::blocking::{Delivery, Spool};
use spool::{Error, Headers, NackOutcome};

/// Long enough never to pass on a loaded machine: a failure is a hang, not a time-out.
const WAIT: Duration = Duration::from_secs(30);

fn open(dir: &std::path::Path) -> Spool {
    Spool::open(&format!("Data Source={};Sync=Always", dir.display())).expect("open")
}

#[test]
fn a_blocking_handle_is_clone_send_and_sync_like_the_async_one() {
    fn shareable<T: Clone + Send + Sync + 'static>() {}
    shareable::<Spool>();
    fn sendable<T: Send + 'static>() {}
    sendable::<spool::blocking::Consumer>();
    sendable::<Delivery>();
}

#[test]
fn publish_recv_ack_and_nack_without_a_runtime() {
    let dir = tempfile::tempdir().expect("dir");
    let mq = open(dir.path());
    let first = mq
        .publish("t", b"one".to_vec(), &Headers::new())
        .expect("publish");
    let offsets = mq
        .publish_batch("t", vec![(b"two".to_vec(), Headers::new())])
        .expect("batch");
    assert_eq!((first, offsets), (0, vec![1]));

    let mut c = mq
        .consumer("t", "g")
        .manual_ack()
        .build()
        .expect("consumer");
    let d = c.recv().expect("recv");
    assert_eq!(
        (d.offset(), &d.payload()[..], d.attempt()),
        (0, &b"one"[..], 1)
    );
    let r: NackOutcome = d.nack("retry").expect("nack");
    assert!(!r.dead_lettered);
    let d = c.recv().expect("redelivery");
    assert_eq!((d.offset(), d.attempt()), (0, 2), "a nack redelivers");
    d.ack().expect("ack");
    let d = c.recv().expect("recv");
    assert_eq!(d.offset(), 1);
    d.ack().expect("ack");
    assert!(c.try_recv().expect("try_recv").is_none());
    assert!(
        c.recv_timeout(Duration::from_millis(20))
            .expect("recv_timeout")
            .is_none(),
        "nothing left: a time-out is Ok(None)"
    );
    let info = mq.group_info("t", "g").expect("info");
    assert_eq!((info.cursor, info.in_flight), (2, 0));
    assert_eq!(mq.topics().expect("topics"), ["t"]);
    assert_eq!(mq.fetch("t", 1, 10).expect("fetch").len(), 1);
    drop(c);
    mq.close().expect("close");
}

#[test]
fn a_thread_waiting_in_recv_gets_what_another_thread_publishes() {
    let dir = tempfile::tempdir().expect("dir");
    let mq = open(dir.path());
    let mut c = mq.consumer("t", "g").build().expect("consumer");
    let (tx, rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        // Auto-ack: each `recv` acks the one before.
        for d in c.iter().take(3) {
            tx.send(d.expect("delivery").offset()).expect("send");
        }
        c.close().expect("close consumer");
    });
    for i in 0..3u8 {
        // The consumer's thread is blocked in `recv` meanwhile: a publish must not wait
        // for it (both use the handle's one runtime).
        mq.publish("t", vec![i], &Headers::new()).expect("publish");
    }
    let got: Vec<u64> = (0..3)
        .map(|_| rx.recv_timeout(WAIT).expect("delivered"))
        .collect();
    assert_eq!(got, [0, 1, 2]);
    waiter.join().expect("consumer thread");
    assert_eq!(mq.group_info("t", "g").expect("info").cursor, 3);
    mq.close().expect("close");
}

#[test]
fn close_wakes_a_thread_blocked_in_recv_with_closed() {
    let dir = tempfile::tempdir().expect("dir");
    let mq = open(dir.path());
    let mut c = mq.consumer("t", "g").build().expect("consumer");
    let (tx, rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        tx.send(c.recv().map(|d| d.offset())).expect("send");
    });
    // Whether the waiter is already blocked or not, it must end with `Closed`.
    thread::sleep(Duration::from_millis(20));
    mq.close().expect("close");
    let r = rx.recv_timeout(WAIT).expect("the waiter ended");
    assert!(matches!(r, Err(Error::Closed)), "{r:?}");
    waiter.join().expect("thread");
}
