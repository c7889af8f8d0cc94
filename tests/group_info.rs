//! Guards issue 3 point 8 (inspection): `group_info` reports cursor, log end, lag,
//! in-flight count, pending attempt counters, dead-lettered and skipped counts, and the
//! empty state (not an error) for a topic or group that does not exist yet.

mod common_groups;

use common_groups::{open, publish_n, recv};
use spool::{Error, GroupInfo};

const TOPIC: &str = "inspect.events";
const GROUP: &str = "workers";

#[tokio::test]
async fn unknown_topic_or_group_is_the_empty_state() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    assert_eq!(mq.group_info("nope", GROUP).unwrap(), GroupInfo::default());
    assert!(
        !mq.topics().unwrap().contains(&"nope".to_owned()),
        "asking creates nothing"
    );
    publish_n(&mq, TOPIC, 4).await;
    let info = mq.group_info(TOPIC, "never-consumed").unwrap();
    assert_eq!(
        (info.cursor, info.next, info.lag, info.in_flight),
        (0, 4, 4, 0)
    );
    assert!(info.pending.is_empty());
    assert_eq!((info.dead_lettered, info.skipped), (0, 0));
}

#[tokio::test]
async fn group_info_checks_names() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    let r = mq.group_info("bad name", GROUP);
    assert!(matches!(r, Err(Error::InvalidTopicName { .. })), "{r:?}");
    let r = mq.group_info(TOPIC, "a/b");
    assert!(matches!(r, Err(Error::InvalidTopicName { .. })), "{r:?}");
}

#[tokio::test]
async fn every_field_follows_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "Max Delivery Attempts=2");
    publish_n(&mq, TOPIC, 6).await;
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 4);
    let d0 = recv(&mut c).await;
    let d1 = recv(&mut c).await;
    let d2 = recv(&mut c).await;
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(
        (info.cursor, info.next, info.lag, info.in_flight),
        (0, 6, 6, 3)
    );

    d0.ack().await.unwrap(); // acked: no longer out
    d1.nack("first").await.unwrap(); // nacked: no longer out, pending
    drop(d2); // released: no longer out
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.lag, info.in_flight), (1, 5, 0));
    assert_eq!(info.pending.len(), 1);
    assert_eq!((info.pending[0].offset, info.pending[0].attempts), (1, 1));
    assert_eq!(info.pending[0].last_reason, "first");

    let d1 = recv(&mut c).await;
    assert_eq!(d1.offset(), 1);
    assert!(d1.nack("second").await.unwrap().dead_lettered);
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!((info.cursor, info.lag, info.dead_lettered), (2, 4, 1));
    assert!(info.pending.is_empty());

    publish_n(&mq, TOPIC, 2).await;
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(
        (info.next, info.lag),
        (8, 6),
        "the log end moves with publishes"
    );
}

/// `group_info` of a group that does not exist yet, racing rolls and retention: the log's
/// start is read before its end, so the lag never underflows (it panicked with overflow
/// checks, and was ~2^64 without them).
#[test]
fn group_info_of_a_missing_group_racing_retention_has_a_sane_lag() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    let dir = common_groups::tmpfs_tempdir();
    let mq = open(
        dir.path(),
        "Sync=None;Segment Bytes=1024;Retention Bytes=1;Retention Check Ms=3600000;Dedup Window=0",
    );
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let producer = {
        let (mq, stop) = (mq.clone(), stop.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            while !stop.load(Ordering::Relaxed) {
                let batch: Vec<(Vec<u8>, spool::Headers)> = (0..3)
                    .map(|_| (vec![7u8; 400], spool::Headers::new()))
                    .collect();
                rt.block_on(mq.publish_batch(TOPIC, batch)).unwrap();
                mq.apply_retention().unwrap();
            }
        })
    };
    let askers: Vec<_> = (0..2)
        .map(|_| {
            let mq = mq.clone();
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(3);
                let mut calls = 0u64;
                while Instant::now() < deadline {
                    let g = mq.group_info(TOPIC, "nobody-yet").unwrap();
                    assert!(
                        g.cursor <= g.next && g.lag == g.next - g.cursor,
                        "after {calls} calls: {g:?}"
                    );
                    calls += 1;
                }
            })
        })
        .collect();
    let asked: Vec<_> = askers.into_iter().map(|a| a.join()).collect();
    stop.store(true, Ordering::Relaxed);
    producer.join().unwrap();
    for a in asked {
        a.expect("group_info stayed sane");
    }
}
