//! Copying the shared journal back at open (`journal::replay`) under a low descriptor
//! limit (spool keeps its segment files under half the soft limit). A journal can name
//! more segment files than that (one per topic written since the last checkpoint);
//! replay must not hold them all open at once, or the directory cannot be opened after a
//! crash (found by review).
//! Its own binary: it lowers the process's soft limit on open files, before the first
//! open (spool reads the limit once).

use spool::{Headers, Options, Spool, SyncPolicy};

const TOPICS: usize = 700;
/// Enough for an instance of `TOPICS` topics (its segment files are bounded at half of
/// it), not for one descriptor per topic.
const SOFT_LIMIT: u64 = 640;

fn topic(i: usize) -> String {
    format!("t{i}")
}

async fn publish_to_all(mq: &Spool, tag: &str) {
    let mut tasks = Vec::new();
    for i in 0..TOPICS {
        let (mq, body) = (mq.clone(), format!("{tag}-{i}"));
        tasks.push(tokio::spawn(async move {
            mq.publish(&topic(i), body.into_bytes(), &Headers::new())
                .await
                .expect("publish")
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
}

/// The journal as a crash before any checkpoint leaves it, naming every topic's segment,
/// is copied back at open under a soft limit below one descriptor per named file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_opens_a_journal_naming_more_files_than_the_descriptor_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    limit.current = Some(SOFT_LIMIT.min(limit.current.unwrap_or(u64::MAX)));
    setrlimit(Resource::Nofile, limit).expect("setrlimit");
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut o = Options::new(tmp.path());
    o.sync = SyncPolicy::Always;
    let mq = Spool::open_with(o.clone()).expect("open");
    // The topics made first; then one publish to each at once: the sync thread's rounds
    // cover many topics, each copied into the journal.
    publish_to_all(&mq, "made").await;
    publish_to_all(&mq, "journaled").await;
    let files: Vec<(std::path::PathBuf, Vec<u8>)> = ["journal.0.wal", "journal.1.wal"]
        .iter()
        .map(|n| tmp.path().join(n))
        .filter_map(|p| std::fs::read(&p).ok().map(|b| (p, b)))
        .collect();
    assert!(!files.is_empty(), "the rounds went through the journal");
    mq.close().await.expect("close");
    drop(mq);
    // As if the process had died before close's checkpoint: the same entries again (the
    // files hold the same bytes, so copying them back changes nothing but the files it
    // opens).
    for (path, bytes) in &files {
        std::fs::write(path, bytes).expect("journal back");
    }

    let again = Spool::open_with(o).expect("reopen with the journal to copy back");
    for i in [0, TOPICS / 2, TOPICS - 1] {
        let recs = again.fetch(&topic(i), 0, 10).await.expect("fetch");
        assert_eq!(recs.len(), 2, "topic {i}");
        assert_eq!(recs[1].payload(), format!("journaled-{i}").as_bytes());
    }
    again.close().await.expect("close");
}
