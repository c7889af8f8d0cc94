//! Helpers shared by the consumer-group tests (issue 3): opening an instance on a
//! temporary directory, publishing numbered messages, receiving with a hang guard, and
//! running a helper test of the same binary as a child process (for crash tests).
#![allow(
    dead_code,
    reason = "each test file uses a different subset of these helpers"
)]

use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::Duration;

use spool::{Consumer, Delivery, Headers, Record, Spool};

/// Only a guard against hangs: no test asserts how long anything takes.
pub const WAIT: Duration = Duration::from_secs(20);

/// How long `recv_timeout` waits when a test asserts that nothing is deliverable. A
/// deliverable record is handed out without waiting, so a short window is enough.
pub const NOTHING: Duration = Duration::from_millis(30);

/// Env var naming the child role of a helper test; absent in ordinary runs.
pub const CHILD_ROLE: &str = "SPOOL_TEST_CHILD_ROLE";
/// Env var carrying the data directory to a child.
pub const CHILD_DIR: &str = "SPOOL_TEST_CHILD_DIR";

pub fn conn(dir: &Path, extra: &str) -> String {
    format!("Data Source={};{extra}", dir.display())
}

/// Opens `dir` with extra connection-string settings (`""` for the defaults). (Children
/// forked by sibling tests briefly hold a just-released `LOCK`; `Spool::open` itself
/// waits that out, see `lock_release_vs_spawn.rs`.)
pub fn open(dir: &Path, extra: &str) -> Spool {
    Spool::open(&conn(dir, extra)).unwrap_or_else(|e| panic!("open spool: {e:?}"))
}

/// A manual-ack consumer with `max_in_flight` deliveries out at most.
pub fn manual(mq: &Spool, topic: &str, group: &str, max_in_flight: usize) -> Consumer {
    mq.consumer(topic, group)
        .manual_ack()
        .max_in_flight(max_in_flight)
        .build()
        .expect("build consumer")
}

/// The next `n` deliveries, in order.
pub async fn take(c: &mut Consumer, n: usize) -> Vec<Delivery> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(recv(c).await);
    }
    v
}

/// A data directory holding `n` records of `topic` (published, then closed cleanly) on
/// which the helper test `test` ran as a child in `role` and aborted.
pub async fn publish_then_abort_child(
    topic: &str,
    n: u64,
    test: &str,
    role: &str,
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mq = open(dir.path(), "");
        publish_n(&mq, topic, n).await;
        mq.close().await.expect("close");
    }
    assert_aborted(run_child(test, role, dir.path(), &[]));
    dir
}

pub fn headers(pairs: &[(&str, &str)]) -> Headers {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The payload `publish_n` gives the record at `offset`.
pub fn payload_of(offset: u64) -> Vec<u8> {
    format!("m{offset}").into_bytes()
}

/// Publishes `n` messages whose payload names their offset (`m<offset>`).
pub async fn publish_n(mq: &Spool, topic: &str, n: u64) -> Vec<u64> {
    let mut out = Vec::new();
    for _ in 0..n {
        let next = mq.topic_info(topic).expect("topic_info").next;
        let o = mq
            .publish(topic, payload_of(next), &Headers::new())
            .await
            .expect("publish");
        assert_eq!(o, next, "offsets are dense");
        out.push(o);
    }
    out
}

/// `recv` with a guard against hanging forever.
pub async fn recv(c: &mut Consumer) -> Delivery {
    tokio::time::timeout(WAIT, c.recv())
        .await
        .expect("a delivery was expected but none came")
        .expect("recv failed")
}

/// Asserts that no delivery is available to `c` now.
pub async fn assert_nothing(c: &mut Consumer) {
    let d = c.recv_timeout(NOTHING).await.expect("recv_timeout failed");
    assert!(
        d.is_none(),
        "expected no delivery, got offset {:?}",
        d.map(|d| d.offset())
    );
}

/// Every record of `topic`.
pub async fn all_records(mq: &Spool, topic: &str) -> Vec<Record> {
    mq.fetch(topic, 0, usize::MAX).await.expect("fetch")
}

/// Runs the test named `test` of the current test binary in a child process with the
/// given role, data directory and extra environment; returns its exit status.
pub fn run_child(test: &str, role: &str, dir: &Path, env: &[(&str, &str)]) -> ExitStatus {
    let exe = std::env::current_exe().expect("current test binary");
    let mut cmd = Command::new(exe);
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ROLE, role)
        .env(CHILD_DIR, dir)
        .env_remove("SPOOL_CRASH_AT")
        // The child's test-harness chatter is noise; its stderr (panics, crash points) is kept.
        .stdout(std::process::Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.status().expect("spawn child test process")
}

/// In a helper test: the role and data directory given by `run_child`, or `None` in an
/// ordinary test run (the helper then does nothing).
pub fn child_role() -> Option<(String, std::path::PathBuf)> {
    let role = std::env::var(CHILD_ROLE).ok()?;
    let dir = std::env::var_os(CHILD_DIR)?;
    Some((role, dir.into()))
}

/// Asserts that a child process died by `std::process::abort` (not a panic, not a clean
/// exit), so a crash test really crashed where it meant to.
pub fn assert_aborted(status: ExitStatus) {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(6),
            "child should abort (SIGABRT): {status:?}"
        );
    }
    #[cfg(not(unix))]
    assert!(!status.success(), "child should abort: {status:?}");
}

/// A temporary directory in memory where there is a tmpfs (`/dev/shm`): faster rolls and
/// deletes make the races some tests provoke likelier.
pub fn tmpfs_tempdir() -> tempfile::TempDir {
    let base = std::path::Path::new("/dev/shm");
    if base.is_dir() {
        tempfile::tempdir_in(base)
    } else {
        tempfile::tempdir()
    }
    .expect("tempdir")
}

/// Runs `task` on the runtime and checks that it panicked (a handler that failed, its
/// task dying with the consumer and the delivery it held).
pub async fn panics(task: impl std::future::Future<Output = ()> + Send + 'static) {
    let joined = tokio::spawn(task).await;
    assert!(joined.expect_err("the task panics").is_panic());
}

/// Drops `d` while this thread panics (a handler that failed, the panic caught).
pub fn panic_with(d: Delivery) {
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _held = d;
        panic!("the handler failed");
    }));
    assert!(caught.is_err());
}

/// A xorshift generator for seeded random schedules.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `c` waiting in `recv` (up to 3 s) on a task of its own, given 200 ms to park: the
/// offset it gets, if any. Ordering only: a waiter woken correctly gets its record
/// whatever the machine's speed, and one never woken times out.
pub async fn parked_waiter(mut c: Consumer) -> tokio::task::JoinHandle<Option<u64>> {
    let waiter = tokio::spawn(async move {
        let d = c
            .recv_timeout(Duration::from_secs(3))
            .await
            .expect("recv_timeout");
        d.map(|d| d.offset())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    waiter
}
