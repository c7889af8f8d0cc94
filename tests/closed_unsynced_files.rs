//! Under `Sync=None` the bound on open files closes an idle topic's files without
//! syncing them: publishing round-robin over more topics than fit costs no `fdatasync`
//! (it cost one per publish when the sweep synced what it closed). The syncs the
//! promises need still come: `close` opens each closed file again and syncs it, so a
//! power cut after it keeps every record. On the simulated file system, eight topics
//! with room for four open files.

use spool::testing::{SimFs, without_background_work};
use spool::{Headers, Options, Spool, SyncPolicy};

const TOPICS: usize = 8;
const ROUNDS: usize = 5;

/// Segments large enough that no round rolls one or makes a spare (which sync).
fn options() -> Options {
    let mut o = Options::new("/data");
    o.sync = SyncPolicy::None;
    o.segment_bytes = 64 << 10;
    o.dedup_window = 0;
    without_background_work(o)
}

fn payload(t: usize, round: usize) -> Vec<u8> {
    format!("topic {t}, round {round}").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_idle_files_does_not_sync_them_and_close_still_does() {
    let fs = SimFs::new(11);
    fs.limit_open_files(4);
    let mq = Spool::open_simulated(options(), &fs).expect("open");
    let publish_round = async |round: usize| {
        for t in 0..TOPICS {
            mq.publish(&format!("t{t}"), payload(t, round), &Headers::new())
                .await
                .expect("publish");
        }
    };
    // Creating a topic syncs its first segment and directory, and commits the catalog.
    publish_round(0).await;
    let (syncs, opens) = (fs.sync_points().len(), fs.opens());
    for round in 1..ROUNDS {
        publish_round(round).await;
    }
    assert!(
        fs.opens() >= opens + (TOPICS * (ROUNDS - 1) / 2) as u64,
        "files were closed and opened again: {} opens",
        fs.opens() - opens
    );
    assert_eq!(
        fs.sync_points().len(),
        syncs,
        "no sync while publishing under Sync=None"
    );
    // A process crash keeps every returned publish (the page cache outlives descriptors).
    let killed = fs.process_crash_now();
    // Close syncs every topic, its closed files opened again for it.
    mq.close().await.expect("close");
    assert!(fs.sync_points().len() >= syncs + TOPICS, "close synced");
    let cut = fs.crash_now();
    drop(mq);
    for (what, image) in [
        ("a process crash", killed),
        ("a power cut after close", cut),
    ] {
        let mq = Spool::open_simulated(options(), &image).expect("reopen");
        for t in 0..TOPICS {
            let got = mq.fetch(&format!("t{t}"), 0, 100).await.expect("fetch");
            let got: Vec<Vec<u8>> = got.iter().map(|r| r.payload().to_vec()).collect();
            let want: Vec<Vec<u8>> = (0..ROUNDS).map(|r| payload(t, r)).collect();
            assert_eq!(got, want, "{what}: topic t{t}");
        }
        mq.close().await.expect("close");
    }
}
