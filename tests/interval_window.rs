//! Guards the `Sync=Interval:<ms>` promise (API.md, Durability): a power cut loses at most
//! the last `<ms>` milliseconds of publishes. The interval sync runs on its own deadline:
//! on a common tick with the cursor commits (100 ms) an interval of 101 ms synced only
//! every 200 ms, and a cut lost records published ~190 ms before it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spool::{Headers, Spool};

const TOPIC: &str = "interval.events";

#[test]
fn a_power_cut_under_interval_loses_at_most_about_the_interval() {
    const INTERVAL_MS: u64 = 101;
    // Far below the ~100 ms a sync on a common 100 ms tick came late.
    const SLACK_MS: u64 = 50;
    let fs = spool::testing::SimFs::new(15);
    let mut o = spool::Options::new("/data");
    o.sync = spool::SyncPolicy::Interval(Duration::from_millis(INTERVAL_MS));
    let mq = Spool::open_simulated(o.clone(), &fs).unwrap();
    let published: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Power-cut images taken every ~7 ms while a producer publishes every ~2 ms.
    let imager = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut images = Vec::new();
            std::thread::sleep(Duration::from_millis(250));
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                images.push((Instant::now(), fs.crash_now()));
                std::thread::sleep(Duration::from_millis(7));
            }
            images
        })
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(1300) {
            let o = mq
                .publish(TOPIC, vec![1u8; 16], &Headers::new())
                .await
                .unwrap();
            published.lock().unwrap().push((o, Instant::now()));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let images = imager.join().unwrap();
    let published = published.lock().unwrap().clone();
    assert!(images.len() > 50, "{} images", images.len());
    // The oldest record each cut lost: published before the cut, not in its image.
    let mut worst = Duration::ZERO;
    for (at, image) in &images {
        let again = Spool::open_simulated(o.clone(), image).unwrap();
        let kept = rt
            .block_on(again.fetch(TOPIC, 0, usize::MAX))
            .unwrap()
            .len() as u64;
        rt.block_on(again.close()).unwrap();
        if let Some((_, t)) = published.iter().find(|(off, t)| *off >= kept && t < at) {
            worst = worst.max(*at - *t);
        }
    }
    rt.block_on(mq.close()).unwrap();
    assert!(
        worst <= Duration::from_millis(INTERVAL_MS + SLACK_MS),
        "Sync=Interval:{INTERVAL_MS}: a power cut lost a record published {worst:?} before it"
    );
}

/// One topic stopped by a failed write (`Error::Poisoned`) does not stop the interval syncs
/// of the others: each topic is synced on its own, and a failure is reported for that
/// topic only (before, the first failing topic ended every later pass early, so topics
/// after it in name order were never synced again).
#[test]
fn a_poisoned_topic_does_not_stop_the_interval_syncs_of_the_others() {
    let fs = spool::testing::SimFs::new(21);
    let mut o = spool::Options::new("/data");
    o.sync = spool::SyncPolicy::Interval(Duration::from_millis(20));
    let mq = Spool::open_simulated(o.clone(), &fs).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let h = Headers::new();
    rt.block_on(async {
        mq.publish("a", b"a0".to_vec(), &h).await.unwrap();
        mq.publish("b", b"b0".to_vec(), &h).await.unwrap();
    });
    // "a" sorts first: its next write fails and stops it.
    fs.fail_writes_to(Some(std::path::Path::new(
        "/data/topics/a/00000000000000000000.log",
    )));
    let failed = rt.block_on(mq.publish("a", b"a1".to_vec(), &h));
    assert!(failed.is_err(), "{failed:?}");
    rt.block_on(mq.publish("b", b"b1".to_vec(), &h)).unwrap();
    // Ten intervals and more: "b1" is synced by now.
    std::thread::sleep(Duration::from_millis(300));
    let image = fs.crash_now();
    fs.fail_writes_to(None);
    let again = Spool::open_simulated(o, &image).unwrap();
    let kept = rt.block_on(again.fetch("b", 0, 10)).unwrap();
    assert_eq!(kept.len(), 2, "b's records after the cut: {}", kept.len());
    rt.block_on(again.close()).unwrap();
    drop(mq);
}
