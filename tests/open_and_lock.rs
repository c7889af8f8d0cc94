//! Guards opening: the connection-string grammar, creating the data directory, the
//! one-owner lock (in-process and across processes), and `close` (releases the lock,
//! every clone then fails with `Error::Closed`).

mod common_core;

use std::path::Path;
use std::process::{Command, Stdio};

use common_core::{fetch_all, with_id};
use spool::{Error, Headers, Options, Spool, SyncPolicy};

/// Asserts `r` is `InvalidConnectionString` naming `key` (compared ignoring case and spaces).
fn assert_names_key<T: std::fmt::Debug>(r: Result<T, Error>, key: &str, input: &str) {
    let norm = |s: &str| -> String {
        s.chars()
            .filter(|c| !c.is_whitespace())
            .flat_map(char::to_lowercase)
            .collect()
    };
    match r {
        Err(Error::InvalidConnectionString { key: got, .. }) => {
            assert_eq!(norm(&got), norm(key), "wrong key named for {input:?}");
        }
        other => {
            panic!("{input:?}: expected InvalidConnectionString naming {key:?}, got {other:?}")
        }
    }
}

#[test]
fn keys_are_case_insensitive_and_whitespace_is_trimmed() {
    let o = Options::parse(
        "  dAtA sOuRcE =  ./some dir  ;MODE = EMBEDDED ;  sync = interval:25 ; \
         SEGMENT BYTES=4096;retention bytes = 10 ;Retention MS=20; max message bytes= 100 ; \
         DEDUP WINDOW = 0 ; index interval bytes = 64 ; Retention Check Ms = 7 ;",
    )
    .expect("valid connection string");
    assert_eq!(o.data_source, Path::new("./some dir"));
    assert_eq!(
        o.sync,
        SyncPolicy::Interval(std::time::Duration::from_millis(25))
    );
    assert_eq!(o.segment_bytes, 4096);
    assert_eq!(o.retention_bytes, 10);
    assert_eq!(o.retention_ms, 20);
    assert_eq!(o.max_message_bytes, 100);
    assert_eq!(o.dedup_window, 0);
    assert_eq!(o.index_interval_bytes, 64);
    assert_eq!(o.retention_check_ms, 7);

    for (s, want) in [
        ("Data Source=d;Sync=ALWAYS", SyncPolicy::Always),
        ("Data Source=d;sync=none", SyncPolicy::None),
        ("Data Source=d", SyncPolicy::Always),
    ] {
        assert_eq!(Options::parse(s).expect(s).sync, want, "{s}");
    }
}

#[test]
fn defaults_match_the_contract() {
    let o = Options::parse("Data Source=./x").expect("minimal connection string");
    assert_eq!(o.sync, SyncPolicy::Always);
    assert_eq!(o.max_message_bytes, 1024 * 1024);
    assert_eq!(o.dedup_window, 100_000);
    assert_eq!(o.max_delivery_attempts, 5);
    assert_eq!(o.dead_letter_suffix, ".dlq");
}

#[test]
fn unknown_key_is_invalid_and_named() {
    for (s, key) in [
        ("Data Source=./x;Colour=blue", "Colour"),
        ("Data Source=./x; Segment Bites = 4096", "Segment Bites"),
        ("Data Source=./x;Server=localhost", "Server"),
    ] {
        assert_names_key(Options::parse(s), key, s);
        assert_names_key(Spool::open(s), key, s);
    }
}

#[test]
fn malformed_values_are_invalid_and_name_their_key() {
    for (s, key) in [
        ("Data Source=./x;Segment Bytes=abc", "Segment Bytes"),
        ("Data Source=./x;Segment Bytes=-1", "Segment Bytes"),
        ("Data Source=./x;Segment Bytes=10", "Segment Bytes"),
        ("Data Source=./x;Segment Bytes=", "Segment Bytes"),
        ("Data Source=./x;Retention Bytes=1e6", "Retention Bytes"),
        ("Data Source=./x;Retention Ms=1.5", "Retention Ms"),
        ("Data Source=./x;Max Message Bytes=0", "Max Message Bytes"),
        (
            "Data Source=./x;Max Message Bytes=99999999999999999999999",
            "Max Message Bytes",
        ),
        ("Data Source=./x;Dedup Window=many", "Dedup Window"),
        ("Data Source=./x;Sync=Sometimes", "Sync"),
        ("Data Source=./x;Sync=Interval:", "Sync"),
        ("Data Source=./x;Sync=Interval:0", "Sync"),
        ("Data Source=./x;Sync=Interval:soon", "Sync"),
        (
            "Data Source=./x;Index Interval Bytes=0",
            "Index Interval Bytes",
        ),
        ("Data Source=./x;Retention Check Ms=0", "Retention Check Ms"),
        ("Data Source=", "Data Source"),
        ("Data Source=./x;Mode=", "Mode"),
    ] {
        assert_names_key(Options::parse(s), key, s);
    }
}

#[test]
fn repeated_key_is_invalid() {
    for (s, key) in [
        ("Data Source=./a;Data Source=./b", "Data Source"),
        ("Data Source=./a;data source=./b", "data source"),
        ("Data Source=./a;Sync=None;SYNC=Always", "SYNC"),
    ] {
        assert_names_key(Options::parse(s), key, s);
    }
}

#[test]
fn missing_data_source_is_invalid() {
    for s in ["", "Mode=Embedded", ";;", "Sync=None"] {
        assert_names_key(Options::parse(s), "Data Source", s);
        assert_names_key(Spool::open(s), "Data Source", s);
    }
}

#[test]
fn an_unknown_mode_is_unsupported_and_creates_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("never-created");
    for mode in ["Server", "Cluster"] {
        let s = format!("Data Source={};Mode={mode}", dir.display());
        let r = Spool::open(&s);
        assert!(matches!(r, Err(Error::Unsupported { .. })), "{s}: {r:?}");
    }
    // Mode=Kafka exists and has no data directory: `Data Source` is refused by name.
    for mode in ["Kafka", "kafka"] {
        let s = format!("Data Source={};Mode={mode}", dir.display());
        assert_names_key(Spool::open(&s), "Data Source", &s);
    }
    assert!(
        !dir.exists(),
        "a refused open must not create the directory"
    );
    let ok = Spool::open(&format!("Data Source={};Mode=eMbEdDeD", dir.display()));
    assert!(ok.is_ok(), "{ok:?}");
}

#[tokio::test]
async fn missing_data_directory_is_created() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("a").join("b").join("c");
    assert!(!dir.exists());
    let mq = Spool::open(&format!("Data Source={};Mode=Embedded", dir.display())).expect("open");
    assert!(dir.is_dir());
    assert!(
        dir.join("catalog.redb").is_file(),
        "catalog.redb is created"
    );
    mq.publish("t", b"x".to_vec(), &Headers::new())
        .await
        .expect("publish");
    assert!(
        dir.join("topics")
            .join("t")
            .join("00000000000000000000.log")
            .is_file(),
        "the first segment is <dir>/topics/<topic>/<20-digit base>.log"
    );
    mq.close().await.expect("close");
}

#[tokio::test]
async fn a_data_source_that_is_a_file_is_an_error_not_a_panic() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("plain-file");
    std::fs::write(&file, b"not a directory").expect("write");
    let r = Spool::open(&format!("Data Source={}", file.display()));
    assert!(r.is_err(), "{r:?}");
    assert_eq!(std::fs::read(&file).expect("read"), b"not a directory");
}

#[tokio::test]
async fn second_open_in_the_same_process_is_locked() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let conn = format!("Data Source={}", tmp.path().display());
    let mq = Spool::open(&conn).expect("first open");
    let second = Spool::open(&conn);
    assert!(matches!(second, Err(Error::Locked { .. })), "{second:?}");
    // The same directory spelled differently is still the same directory.
    let other_spelling = Spool::open_with(Options::new(tmp.path().join(".")));
    assert!(
        matches!(other_spelling, Err(Error::Locked { .. })),
        "{other_spelling:?}"
    );
    // The refused opens did not disturb the owner.
    assert_eq!(
        mq.publish("t", b"still mine".to_vec(), &Headers::new())
            .await
            .expect("publish"),
        0
    );
    mq.close().await.expect("close");
}

#[tokio::test]
async fn close_releases_the_lock_and_data_survives() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let conn = format!("Data Source={}", tmp.path().display());
    let mq = Spool::open(&conn).expect("open");
    mq.publish("t", b"one".to_vec(), &with_id("m-1"))
        .await
        .expect("publish");
    mq.close().await.expect("close");

    let mq = Spool::open(&conn).expect("reopen after close");
    let records = fetch_all(&mq, "t").await;
    assert_eq!(records.len(), 1);
    assert_eq!(&records[0].payload()[..], b"one");
    assert_eq!(mq.topics().expect("topics"), vec!["t".to_owned()]);
    mq.close().await.expect("close again");
    let mq = Spool::open(&conn).expect("third open");
    mq.close().await.expect("close");
}

#[tokio::test]
async fn dropping_the_last_handle_releases_the_lock() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let conn = format!("Data Source={}", tmp.path().display());
    let mq = Spool::open(&conn).expect("open");
    let clone = mq.clone();
    mq.publish("t", b"kept".to_vec(), &Headers::new())
        .await
        .expect("publish");
    drop(mq);
    let still = Spool::open(&conn);
    assert!(
        matches!(still, Err(Error::Locked { .. })),
        "a live clone keeps the lock: {still:?}"
    );
    drop(clone);
    let mq = Spool::open(&conn).expect("reopen after drop");
    assert_eq!(fetch_all(&mq, "t").await.len(), 1);
    mq.close().await.expect("close");
}

/// Regression: the background thread briefly holds the instance while it syncs, commits
/// or applies retention; when the application dropped its last handle during such a tick,
/// the directory stayed locked until the thread finished, so an immediate reopen failed
/// with `Locked`. A drop must release the directory before it returns.
#[tokio::test]
async fn dropping_the_last_handle_releases_the_lock_before_drop_returns() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // A busy background thread: it wakes every millisecond for each of its jobs.
    let conn = format!(
        "Data Source={};Sync=Interval:1;Commit Interval Ms=1;Retention Check Ms=1",
        tmp.path().display()
    );
    for i in 0..40u64 {
        let mq = Spool::open(&conn).unwrap_or_else(|e| panic!("open {i} after a drop: {e}"));
        assert_eq!(
            mq.publish("t", b"x".to_vec(), &Headers::new())
                .await
                .expect("publish"),
            i
        );
        tokio::task::yield_now().await;
        drop(mq);
    }
}

#[tokio::test]
async fn after_close_every_clone_fails_with_closed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = Spool::open(&format!("Data Source={}", tmp.path().display())).expect("open");
    mq.publish("t", b"x".to_vec(), &Headers::new())
        .await
        .expect("publish");
    let clone = mq.clone();
    let clone_in_task = mq.clone();
    mq.close().await.expect("close");

    for h in [&mq, &clone] {
        let r = h.publish("t", b"y".to_vec(), &Headers::new()).await;
        assert!(matches!(r, Err(Error::Closed)), "publish: {r:?}");
        let r = h
            .publish_batch("t", vec![(b"y".to_vec(), Headers::new())])
            .await;
        assert!(matches!(r, Err(Error::Closed)), "publish_batch: {r:?}");
        let r = h.fetch("t", 0, 10).await;
        assert!(matches!(r, Err(Error::Closed)), "fetch: {r:?}");
        let r = h.topic_info("t");
        assert!(matches!(r, Err(Error::Closed)), "topic_info: {r:?}");
        let r = h.topics();
        assert!(matches!(r, Err(Error::Closed)), "topics: {r:?}");
        let r = h.group_info("t", "g");
        assert!(matches!(r, Err(Error::Closed)), "group_info: {r:?}");
        let r = h.apply_retention();
        assert!(matches!(r, Err(Error::Closed)), "apply_retention: {r:?}");
        let r = h.commit();
        assert!(matches!(r, Err(Error::Closed)), "commit: {r:?}");
        let r = h.close().await;
        assert!(matches!(r, Err(Error::Closed)), "second close: {r:?}");
    }
    let r = tokio::spawn(async move {
        clone_in_task
            .publish("t", b"z".to_vec(), &Headers::new())
            .await
    })
    .await
    .expect("task");
    assert!(
        matches!(r, Err(Error::Closed)),
        "clone moved to a task: {r:?}"
    );

    // Nothing was appended by the refused calls.
    let mq = Spool::open(&format!("Data Source={}", tmp.path().display())).expect("reopen");
    assert_eq!(mq.topic_info("t").expect("info").next, 1);
    mq.close().await.expect("close");
}

// ---- the other-process lock check -------------------------------------------------------

const CHILD_DIR_ENV: &str = "SPOOL_TEST_LOCK_CHILD_DIR";
const CHILD_TEST: &str = "child_process_opens_the_directory_named_by_env";

/// Not a test of its own: the body runs only inside the child process spawned by
/// `second_open_from_another_process_is_locked`. It tries to open the directory and prints
/// the outcome on stdout.
#[test]
fn child_process_opens_the_directory_named_by_env() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let outcome = match Spool::open(&format!("Data Source={dir}")) {
        Ok(mq) => {
            drop(mq);
            "OPENED".to_owned()
        }
        Err(Error::Locked { .. }) => "LOCKED".to_owned(),
        Err(e) => format!("ERROR {e}"),
    };
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    // libtest prints its own text on the same line first: start a fresh line.
    writeln!(out, "\nCHILD-OUTCOME {outcome}").expect("stdout");
    out.flush().expect("flush");
}

fn open_in_child(dir: &Path) -> String {
    let out = Command::new(std::env::current_exe().expect("current exe"))
        .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR_ENV, dir)
        .stdin(Stdio::null())
        .output()
        .expect("spawn child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.split_once("CHILD-OUTCOME ").map(|(_, o)| o.trim()))
        .unwrap_or_else(|| panic!("child printed no outcome: {stdout}"))
        .to_owned()
}

#[tokio::test]
async fn second_open_from_another_process_is_locked() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = Spool::open(&format!("Data Source={}", tmp.path().display())).expect("open");
    mq.publish("t", b"x".to_vec(), &Headers::new())
        .await
        .expect("publish");
    assert_eq!(open_in_child(tmp.path()), "LOCKED");
    // The refused open left the owner working.
    assert_eq!(
        mq.publish("t", b"y".to_vec(), &Headers::new())
            .await
            .expect("publish"),
        1
    );
    mq.close().await.expect("close");
    assert_eq!(
        open_in_child(tmp.path()),
        "OPENED",
        "close releases the lock for other processes too"
    );
    let mq = Spool::open(&format!("Data Source={}", tmp.path().display())).expect("reopen");
    assert_eq!(mq.topic_info("t").expect("info").next, 2);
    mq.close().await.expect("close");
}
