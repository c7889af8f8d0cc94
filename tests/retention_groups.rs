//! Guards issue 3 point 7 (retention interplay): a group whose cursor fell behind retention
//! resumes at the earliest retained offset, and `group_info.skipped` reports exactly the
//! unfinished records it lost (acked ones above the floor are not counted), durably.

mod common_groups;

use common_groups::{open, recv};
use spool::{Headers, Spool};

const TOPIC: &str = "retained.events";
const GROUP: &str = "slow";
/// Tiny segments, a small byte budget, no background retention: the test applies it.
const CONN: &str = "Segment Bytes=1024;Retention Bytes=2048;Retention Check Ms=3600000";

async fn fill(mq: &Spool, n: u64) {
    let body = vec![b'z'; 100];
    for _ in 0..n {
        mq.publish(TOPIC, body.clone(), &Headers::new())
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_group_behind_retention_resumes_at_the_earliest_and_counts_the_skip() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), CONN);
    fill(&mq, 60).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    for o in 0..3 {
        let d = recv(&mut c).await;
        assert_eq!(d.offset(), o);
        d.ack().await.unwrap();
    }
    mq.apply_retention().unwrap();
    let earliest = mq.topic_info(TOPIC).unwrap().earliest;
    assert!(
        earliest > 3,
        "retention deleted records the group had not read"
    );

    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(info.cursor, earliest);
    assert_eq!(info.skipped, earliest - 3);
    assert_eq!(info.lag, 60 - earliest);
    let d = recv(&mut c).await;
    assert_eq!(d.offset(), earliest);
    d.ack().await.unwrap();

    // The count is durable and not counted twice.
    drop(c);
    mq.close().await.unwrap();
    let mq = open(dir.path(), CONN);
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.skipped), (earliest + 1, earliest - 3));
}

#[tokio::test]
async fn a_group_noticed_behind_retention_only_after_a_reopen_counts_the_skip() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), CONN);
    fill(&mq, 60).await;
    mq.ack(TOPIC, GROUP, 0).await.unwrap();
    mq.close().await.unwrap();
    let mq = open(dir.path(), CONN);
    mq.apply_retention().unwrap();
    let earliest = mq.topic_info(TOPIC).unwrap().earliest;
    assert!(earliest > 1);
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    assert_eq!(recv(&mut c).await.offset(), earliest);
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().skipped, earliest - 1);
}

#[tokio::test]
async fn acked_offsets_above_the_floor_are_not_counted_as_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), CONN);
    fill(&mq, 60).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 10);
    let mut ds = Vec::new();
    for _ in 0..10 {
        ds.push(recv(&mut c).await);
    }
    // 0..=4 stay unfinished (one nacked, the others out); 5..=9 are acked above the floor.
    let later = ds.split_off(5);
    for d in later {
        d.ack().await.unwrap();
    }
    let mut ds = ds.into_iter();
    ds.next().unwrap().nack("bad").await.unwrap();
    let still_out: Vec<_> = ds.collect();
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().pending.len(), 1);

    mq.apply_retention().unwrap();
    let earliest = mq.topic_info(TOPIC).unwrap().earliest;
    assert!(
        earliest > 10,
        "retention passed everything the group touched"
    );
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(info.cursor, earliest);
    assert_eq!(
        info.skipped,
        earliest - 5,
        "0..=4 and 10..earliest were lost; 5..=9 were acked"
    );
    assert!(info.pending.is_empty(), "counters of deleted records go");
    assert_eq!(
        info.in_flight, 0,
        "deliveries of deleted records are no longer out"
    );

    // Finishing a delivery of a deleted record changes nothing.
    for d in still_out {
        let _ = d.ack().await;
    }
    let after = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((after.cursor, after.skipped), (earliest, earliest - 5));
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (earliest, 1));
}

#[tokio::test]
async fn a_group_that_kept_up_skips_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), CONN);
    fill(&mq, 60).await;
    let mut c = mq.consumer(TOPIC, GROUP).build().unwrap();
    for o in 0..60 {
        assert_eq!(recv(&mut c).await.offset(), o);
    }
    c.close().await.unwrap();
    mq.apply_retention().unwrap();
    assert!(mq.topic_info(TOPIC).unwrap().earliest > 0);
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.skipped, info.lag), (60, 0, 0));
}

#[tokio::test]
async fn low_level_ack_after_retention_expects_the_earliest() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), CONN);
    fill(&mq, 60).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    recv(&mut c).await.ack().await.unwrap();
    mq.apply_retention().unwrap();
    let earliest = mq.topic_info(TOPIC).unwrap().earliest;
    let r = mq.ack(TOPIC, GROUP, 1).await;
    assert!(
        matches!(r, Err(spool::Error::NotAtCursor { expected, actual: 1 }) if expected == earliest),
        "{r:?}"
    );
    mq.ack(TOPIC, GROUP, earliest).await.unwrap();
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.skipped), (earliest + 1, earliest - 1));
}

/// A `tracing` writer that keeps what it is given.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn the_skip_is_logged() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), CONN);
    fill(&mq, 60).await;
    mq.ack(TOPIC, GROUP, 0).await.unwrap();
    mq.apply_retention().unwrap();
    let earliest = mq.topic_info(TOPIC).unwrap().earliest;
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // `group_info` notices the skip on this thread, synchronously.
    let info =
        tracing::subscriber::with_default(subscriber, || mq.group_info(TOPIC, GROUP).unwrap());
    assert_eq!(info.skipped, earliest - 1);
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("WARN"), "{text}");
    assert!(
        text.contains(&format!("skipped={}", earliest - 1)),
        "the log names the count: {text}"
    );
}

/// The nack that reaches the limit for a record retention deleted while it was out has
/// nothing to copy: it is counted `skipped`, like every unfinished record retention took,
/// not `dead_lettered`, its outcome says so, and the dead-letter topic stays empty.
#[tokio::test]
async fn a_last_nack_of_a_record_retention_took_counts_it_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), CONN);
    fill(&mq, 60).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    for _ in 1..5 {
        let d = recv(&mut c).await;
        assert_eq!(d.offset(), 0);
        d.nack("bad").await.unwrap();
    }
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (0, 5));
    mq.apply_retention().unwrap();
    let earliest = mq.topic_info(TOPIC).unwrap().earliest;
    assert!(
        earliest > 0,
        "retention took the record out for its last try"
    );

    let out = d.nack("still bad").await.unwrap();
    assert!(!out.dead_lettered, "nothing was copied");
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(info.dead_lettered, 0);
    let dlq = format!("{TOPIC}.dlq");
    assert_eq!(mq.topic_info(&dlq).unwrap().next, 0, "no copy");
    let d = recv(&mut c).await;
    assert_eq!(d.offset(), earliest);
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(
        (info.skipped, info.dead_lettered),
        (earliest, 0),
        "offset 0 and the rest below the earliest were skipped"
    );
}

/// A consumer waiting in `recv` is woken by a publish whose first record retention then
/// deletes before the hand-out reads it (a race at the log's start): the hand-out goes on
/// from the new start at once, instead of waiting for a publish that may never come.
/// (Timing-driven: the retention pass is delayed by a spun amount adjusted each round to
/// land on the boundary; it stalled within a few hundred rounds before the fix.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_racing_a_hand_out_does_not_stall_a_waiting_consumer() {
    use std::time::{Duration, Instant};
    let dir = common_groups::tmpfs_tempdir();
    let mq = open(
        dir.path(),
        "Sync=Interval:100000;Segment Bytes=1024;Retention Bytes=1;Retention Check Ms=3600000;Dedup Window=0",
    );
    let mut c = mq.consumer(TOPIC, GROUP).manual_ack().build().unwrap();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<u64>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let producer = {
        let mq = mq.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            for spin_ns in go_rx {
                // Rolls after its first record; retention then deletes that record.
                let batch: Vec<(Vec<u8>, Headers)> =
                    (0..4).map(|_| (vec![7u8; 300], Headers::new())).collect();
                rt.block_on(mq.publish_batch(TOPIC, batch)).unwrap();
                let t = Instant::now();
                while (t.elapsed().as_nanos() as u64) < spin_ns {
                    std::hint::spin_loop();
                }
                mq.apply_retention().unwrap();
                done_tx.send(()).unwrap();
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut rounds, mut spin_ns) = (0u64, 20_000u64);
    while Instant::now() < deadline {
        rounds += 1;
        let cursor = mq.group_info(TOPIC, GROUP).unwrap().cursor;
        let waiter = tokio::spawn(async move {
            let r = c.recv_timeout(Duration::from_secs(2)).await.unwrap();
            (r, c)
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        go_tx.send(spin_ns).unwrap();
        let (got, back) = waiter.await.unwrap();
        c = back;
        done_rx.recv().unwrap();
        let Some(d) = got else {
            let g = mq.group_info(TOPIC, GROUP).unwrap();
            panic!(
                "round {rounds}: recv waited 2 s with records available (cursor {}, lag {})",
                g.cursor, g.lag
            );
        };
        // Keeps retention landing near the hand-out's read.
        if d.offset() == cursor {
            spin_ns = spin_ns.saturating_sub(53);
        } else {
            spin_ns += 53;
        }
        d.ack().await.unwrap();
        while let Some(d) = c.try_recv().unwrap() {
            d.ack().await.unwrap();
        }
    }
    drop(go_tx);
    producer.join().unwrap();
}

/// Review 30: a reset counts the records retention deleted under the cursor before it
/// moves it, whether or not anything looked at the group since the retention.
#[tokio::test]
async fn a_reset_counts_the_skip_retention_made_before_it() {
    let mut seen = Vec::new();
    for look_first in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let mq = open(dir.path(), CONN);
        fill(&mq, 60).await;
        for o in 0..3 {
            mq.ack(TOPIC, GROUP, o).await.unwrap();
        }
        mq.apply_retention().unwrap();
        let earliest = mq.topic_info(TOPIC).unwrap().earliest;
        assert!(earliest > 3);
        if look_first {
            mq.group_info(TOPIC, GROUP).unwrap();
        }
        let to = mq
            .reset_offset(TOPIC, GROUP, spool::OffsetReset::Earliest)
            .await
            .unwrap();
        assert_eq!(to, earliest);
        seen.push((earliest, mq.group_info(TOPIC, GROUP).unwrap().skipped));
        mq.close().await.unwrap();
    }
    let (earliest, _) = seen[0];
    assert_eq!(
        seen,
        vec![(earliest, earliest - 3); 2],
        "(earliest, skipped) with and without a group_info before the reset"
    );
}
