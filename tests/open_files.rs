//! The descriptors an instance holds are bounded whatever the number of topics: a child
//! process of the test binary, under a soft `RLIMIT_NOFILE` of 1,024, creates and
//! publishes to 5,000 topics, closes, reopens and reads and publishes to each again, and
//! never holds more than the bound on open files plus a margin (counted in
//! `/proc/self/fd`). Under `Sync=None` at full scale; under `Always` (every file closed
//! only once synced by the sync thread) and `Interval` (closed unsynced, synced by the
//! interval thread through a descriptor opened again) with 600 topics, which at two
//! descriptors each would need 1,200.

mod common_core;

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use spool::{Headers, Options, Spool, SyncPolicy};

const LIMIT: u64 = 1024;
/// `io::OPEN_FILES_MAX` (512) for segment files, and the rest: the catalog, the lock,
/// the runtime's and the test harness's own, the admin socket, short-lived opens.
const HELD_MAX: u64 = 512 + 64;

const CHILD_ENV: &str = "SPOOL_TEST_OPEN_FILES_CHILD";
const CHILD_TEST: &str = "child_runs_many_topics_under_a_low_limit";

/// Descriptors this process has open now (less the one that counts them).
fn open_descriptors() -> u64 {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count() as u64
        - 1
}

fn assert_within_bound(what: &str) -> u64 {
    let held = open_descriptors();
    assert!(held <= HELD_MAX, "{what}: {held} descriptors open");
    held
}

/// Creates `topics` topics with one record each, closes, reopens, reads each record back
/// and publishes a second; then reopens once more and counts. Returns the most
/// descriptors seen.
async fn many_topics(dir: &Path, sync: SyncPolicy, topics: usize) -> u64 {
    let options = Options {
        sync,
        ..Options::new(dir)
    };
    let name = |i: usize| format!("t{i}");
    let mut most = 0;
    let mq = Spool::open_with(options.clone()).expect("open");
    for i in 0..topics {
        mq.publish(&name(i), format!("first {i}").into_bytes(), &Headers::new())
            .await
            .expect("publish");
        if i % 500 == 0 {
            most = most.max(assert_within_bound("creating"));
        }
    }
    most = most.max(assert_within_bound("created"));
    mq.close().await.expect("close");
    drop(mq);

    let mq = Spool::open_with(options.clone()).expect("reopen");
    most = most.max(assert_within_bound("reopened"));
    for i in 0..topics {
        let got = mq.fetch(&name(i), 0, 10).await.expect("fetch");
        assert_eq!(got.len(), 1, "{}", name(i));
        assert_eq!(&got[0].payload()[..], format!("first {i}").as_bytes());
        let at = mq
            .publish(
                &name(i),
                format!("second {i}").into_bytes(),
                &Headers::new(),
            )
            .await
            .expect("publish again");
        assert_eq!(at, 1);
    }
    most = most.max(assert_within_bound("read and published again"));
    mq.close().await.expect("close");
    drop(mq);

    let mq = Spool::open_with(options).expect("reopen");
    most = most.max(assert_within_bound("reopened again"));
    assert_eq!(mq.topics().expect("topics").len(), topics);
    let last = name(topics - 1);
    assert_eq!(mq.fetch(&last, 0, 10).await.expect("fetch").len(), 2);
    mq.close().await.expect("close");
    most
}

/// Not a test of its own: runs only in the child process that
/// `thousands_of_topics_run_under_the_default_descriptor_limit` spawns.
#[test]
fn child_runs_many_topics_under_a_low_limit() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    limit.current = Some(LIMIT);
    setrlimit(Resource::Nofile, limit).expect("setrlimit");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut out = std::io::stdout().lock();
    for (sync, topics) in [
        (SyncPolicy::None, 5_000),
        (SyncPolicy::Always, 600),
        (
            SyncPolicy::Interval(std::time::Duration::from_millis(200)),
            600,
        ),
    ] {
        let data = Path::new(&dir).join(format!("{sync:?}").replace(['(', ')', ' '], "_"));
        let start = Instant::now();
        let most = runtime.block_on(many_topics(&data, sync, topics));
        writeln!(
            out,
            "{sync:?}: {topics} topics, at most {most} descriptors, {:.1} s",
            start.elapsed().as_secs_f64()
        )
        .expect("stdout");
    }
    writeln!(out, "\nCHILD-OK").expect("stdout");
    out.flush().expect("flush");
}

#[test]
fn thousands_of_topics_run_under_the_default_descriptor_limit() {
    // In memory where it can: what is counted here (descriptors) does not depend on the
    // disk, and 5,000 topic creations' syncs took most of a minute on a loaded machine.
    let tmp = common_core::memory_tempdir();
    let (ok, out) = common_core::child_output(CHILD_TEST, &[(CHILD_ENV, tmp.path().as_os_str())]);
    println!("{out}");
    assert!(ok && out.contains("CHILD-OK"), "{out}");
}
