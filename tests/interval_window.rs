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
