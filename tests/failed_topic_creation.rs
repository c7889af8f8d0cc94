//! A topic creation that fails, at any step, leaves nothing behind: no catalog entry, no
//! directory, in this process and after a reopen; the caller gets an `Err` that says it
//! was undone, and the name can be created later. On the simulated file system a
//! failure is injected at each step (making the directory, syncing its parent, creating
//! the segment, syncing its header, syncing the directory, the catalog entry); in a
//! child process of the test binary the real cause, the descriptor limit, is set just
//! above what the process holds, so that the creation runs out at each step that opens
//! one.

mod common_core;

use std::io::Write;
use std::path::{Path, PathBuf};

use spool::testing::{SimFs, without_background_work};
use spool::{Error, Headers, Options, Spool, SyncPolicy};

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

fn sim_options(sync: SyncPolicy) -> Options {
    let mut o = Options::new("/data");
    o.sync = sync;
    without_background_work(o)
}

/// Where each step of creating topic `t` can be made to fail.
enum Step {
    Fails(PathBuf),
    FailsOnce(PathBuf),
}

fn steps() -> Vec<(&'static str, Step)> {
    let topics = Path::new("/data/topics");
    let dir = topics.join("t");
    let segment = dir.join("00000000000000000000.log");
    vec![
        ("making the directory", Step::Fails(dir.clone())),
        ("syncing its parent", Step::FailsOnce(topics.to_owned())),
        ("creating the segment", Step::Fails(segment.clone())),
        ("syncing the segment's header", Step::FailsOnce(segment)),
        ("syncing the directory", Step::FailsOnce(dir)),
        (
            "the catalog entry",
            Step::FailsOnce(Path::new("/data/catalog.redb").to_owned()),
        ),
    ]
}

/// The topic is nowhere: not listed, no directory, on `fs` as it is.
fn assert_nothing_left(mq: &Spool, fs: &SimFs, step: &str) {
    let topics = mq.topics().expect("topics");
    assert!(!topics.contains(&"t".to_owned()), "{step}: {topics:?}");
    assert!(
        fs.read_file(Path::new("/data/topics/t/00000000000000000000.log"))
            .is_none(),
        "{step}: the segment is left"
    );
}

#[test]
fn a_failed_creation_leaves_nothing_behind_at_any_step() {
    for sync in [SyncPolicy::Always, SyncPolicy::None] {
        for (step, how) in steps() {
            let fs = SimFs::new(7);
            let mq = Spool::open_simulated(sim_options(sync), &fs).expect("open");
            block_on(mq.publish("other", b"x".to_vec(), &Headers::new())).expect("other");
            match &how {
                Step::Fails(p) => fs.fail_writes_to(Some(p)),
                Step::FailsOnce(p) => fs.fail_one_sync_of(p),
            }
            let failed = block_on(mq.publish("t", b"x".to_vec(), &Headers::new()));
            fs.fail_writes_to(None);
            let err = failed.expect_err(step);
            // A file's error says the creation was undone; the catalog's is its own.
            let said = match &err {
                Error::Io { context, .. } => {
                    context.contains("creating topic \"t\" (nothing of it was left behind)")
                }
                e => step == "the catalog entry" && e.to_string().contains("catalog"),
            };
            assert!(said, "{step}: {err}");
            assert_nothing_left(&mq, &fs, step);
            // The catalog stops after its failed sync (redb: "Previous I/O error").
            let closed = block_on(mq.close());
            assert!(
                closed.is_ok() || step == "the catalog entry",
                "{step}: {closed:?}"
            );
            drop(mq);
            // Neither a reopen of this file system nor one after a power cut finds it.
            // (But for a failed catalog sync: a same-boot reopen may read the entry back
            // from redb's pages, a known limit in docs/durability.md.)
            let mut images = vec![fs.crash_now()];
            if step != "the catalog entry" {
                images.push(fs.process_crash_now());
            }
            for image in images {
                let mq = Spool::open_simulated(sim_options(sync), &image).expect("reopen");
                assert_nothing_left(&mq, &image, step);
                assert_eq!(mq.topics().expect("topics"), vec!["other".to_owned()]);
                // The name is free.
                let at = block_on(mq.publish("t", b"y".to_vec(), &Headers::new()));
                assert_eq!(at.expect("created now"), 0, "{step}");
            }
        }
    }
}

// ---- the real cause: running out of descriptors ------------------------------------

const CHILD_DIR_ENV: &str = "SPOOL_TEST_FAILED_CREATION_DIR";
const CHILD_TEST: &str = "child_creates_topics_under_a_limit_just_above_what_it_holds";

/// Descriptors this process has open now.
fn open_descriptors() -> u64 {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count() as u64
}

fn set_soft_limit(soft: u64) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    limit.current = Some(soft);
    setrlimit(Resource::Nofile, limit).expect("setrlimit");
}

/// Not a test of its own: runs only in the child process that
/// `a_creation_out_of_descriptors_leaves_nothing_behind` spawns.
#[test]
fn child_creates_topics_under_a_limit_just_above_what_it_holds() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let options = Options {
        sync: SyncPolicy::None,
        ..Options::new(&dir)
    };
    let (mut failed, mut created) = (0, 0);
    block_on(async {
        let mq = Spool::open_with(options.clone()).expect("open");
        mq.publish("warm", b"x".to_vec(), &Headers::new())
            .await
            .expect("warm");
        for k in 0..6 {
            let topic = format!("c{k}");
            // `read_dir` holds one while it counts.
            set_soft_limit(open_descriptors() - 1 + k);
            let r = mq.publish(&topic, b"x".to_vec(), &Headers::new()).await;
            set_soft_limit(4096);
            match r {
                Ok(_) => created += 1,
                Err(e) => {
                    failed += 1;
                    assert!(
                        e.to_string().contains("nothing of it was left behind"),
                        "{k}: {e}"
                    );
                    assert!(
                        !dir.join("topics").join(&topic).exists(),
                        "{k}: its directory"
                    );
                    assert!(
                        !mq.topics().expect("topics").contains(&topic),
                        "{k}: listed"
                    );
                }
            }
        }
        mq.close().await.expect("close");
    });
    assert!(
        failed >= 2,
        "only {failed} creations ran out of descriptors"
    );
    assert!(created >= 1, "none had enough");
    let mq = Spool::open_with(options).expect("reopen");
    let topics = mq.topics().expect("topics");
    assert_eq!(topics.len(), 1 + created, "{topics:?}");
    let mut out = std::io::stdout().lock();
    writeln!(out, "\nCHILD-OK {failed} failed, {created} created").expect("stdout");
    out.flush().expect("flush");
}

#[test]
fn a_creation_out_of_descriptors_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let env = [(CHILD_DIR_ENV, tmp.path().as_os_str())];
    let (ok, out) = common_core::child_output(CHILD_TEST, &env);
    assert!(ok && out.contains("CHILD-OK"), "{out}");
}
