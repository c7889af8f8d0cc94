//! Helpers shared by the core-engine integration tests (issue 2): options, headers,
//! deterministic payloads, reading a whole topic back, and looking at segment files.
#![allow(
    dead_code,
    reason = "each test file uses a different subset of the helpers"
)]

use std::path::{Path, PathBuf};

use spool::testing::SimFs;
use spool::{Headers, Options, Record, Spool, SyncPolicy};

/// Options for `dir` with fast, test-friendly settings: `Sync=None` (rolls and close still
/// sync), everything else at its default.
pub fn fast_options(dir: &Path) -> Options {
    Options {
        sync: SyncPolicy::None,
        ..Options::new(dir)
    }
}

/// Options with tiny segments so that a few messages already roll.
pub fn tiny_segments(dir: &Path, segment_bytes: u64) -> Options {
    Options {
        segment_bytes,
        ..fast_options(dir)
    }
}

pub fn open(options: &Options) -> Spool {
    Spool::open_with(options.clone()).expect("open")
}

/// Opens `dir` with a connection string: `Data Source=<dir>;<extra>`.
pub fn open_at(dir: &Path, extra: &str) -> Spool {
    Spool::open(&format!("Data Source={};{extra}", dir.display())).expect("open")
}

/// Publishes `m0`, `m1`, ... `m<n-1>` to `topic`, without headers.
pub async fn publish_n(mq: &Spool, topic: &str, n: usize) {
    for i in 0..n {
        mq.publish(topic, format!("m{i}").into_bytes(), &Headers::new())
            .await
            .expect("publish");
    }
}

/// Headers from `(key, value)` pairs.
pub fn headers(pairs: &[(&str, &str)]) -> Headers {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Headers holding only a `message-id`.
pub fn with_id(id: &str) -> Headers {
    headers(&[("message-id", id)])
}

/// A payload of `len` bytes that encodes `seed`, so a record read back can be matched to
/// the message that produced it.
pub fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Every record of `topic` from `from` to the log end, fetched in pages of `page`.
pub async fn fetch_all_from(mq: &Spool, topic: &str, from: u64, page: usize) -> Vec<Record> {
    let mut out: Vec<Record> = Vec::new();
    let mut at = from;
    loop {
        let batch = mq.fetch(topic, at, page).await.expect("fetch");
        let Some(last) = batch.last() else {
            return out;
        };
        assert!(batch.len() <= page, "fetch returned more than max_records");
        at = last.offset() + 1;
        out.extend(batch);
    }
}

/// Every retained record of `topic`.
pub async fn fetch_all(mq: &Spool, topic: &str) -> Vec<Record> {
    fetch_all_from(mq, topic, 0, 1000).await
}

pub fn topic_dir(data: &Path, topic: &str) -> PathBuf {
    data.join("topics").join(topic)
}

/// The topic's segment files (`*.log`), sorted by name (= by base offset).
pub fn segment_files(data: &Path, topic: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(topic_dir(data, topic))
        .expect("topic dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    v.sort();
    v
}

/// The base offset a segment file is named by (asserts the 20-digit naming rule).
pub fn base_of(path: &Path) -> u64 {
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .expect("utf-8 file name");
    assert_eq!(
        stem.len(),
        20,
        "segment {} is not named by 20 digits",
        path.display()
    );
    assert!(stem.bytes().all(|b| b.is_ascii_digit()), "{stem}");
    stem.parse().expect("base offset")
}

/// Runs `f` on a fresh current-thread runtime (for sync tests such as proptest bodies).
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// Runs `f` with the power cut just before the `k`-th (from 1) file operation it makes.
/// Returns what `f` returned, the disk as the cut left it, and whether the cut fell inside
/// `f`. If `f` made fewer operations, the disk is as a cut right after it returned.
pub fn cut_during<R>(fs: &SimFs, k: u64, f: impl FnOnce() -> R) -> (R, SimFs, bool) {
    fs.cut_at_op(fs.ops() + k);
    let r = f();
    match fs.crash_image() {
        Some(image) => (r, image, true),
        None => (r, fs.crash_now(), false),
    }
}

/// Copies a closed data directory (so one prepared log can be damaged in many ways).
pub fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).expect("create copy");
    for entry in std::fs::read_dir(src).expect("read dir") {
        let entry = entry.expect("entry");
        let to = dst.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &to);
        } else {
            std::fs::copy(entry.path(), &to).expect("copy file");
        }
    }
}

/// Bytes of records (header included) in each segment of `topic`, oldest first. Sealed
/// segments are trimmed to their records; the active one may be preallocated past its
/// records, so its share is what `topic_info().bytes` leaves (checked to fit the file).
pub fn segment_data_sizes(data: &Path, topic: &str, info_bytes: u64) -> Vec<u64> {
    let files = segment_files(data, topic);
    let mut sizes: Vec<u64> = files
        .iter()
        .map(|f| std::fs::metadata(f).expect("segment metadata").len())
        .collect();
    let active_file = sizes.pop().expect("an active segment");
    let sealed: u64 = sizes.iter().sum();
    assert!(
        info_bytes > sealed,
        "topic_info.bytes {info_bytes} <= sealed bytes {sealed}"
    );
    let active = info_bytes - sealed;
    assert!(
        (32..=active_file).contains(&active),
        "active segment holds {active} bytes of records in a file of {active_file}"
    );
    sizes.push(active);
    sizes
}

/// Runs the test `test` of this same test binary in a child process, with `env` set (the
/// child test does nothing without it); returns whether it succeeded and its stdout.
pub fn child_output(test: &str, env: &[(&str, &std::ffi::OsStr)]) -> (bool, String) {
    let mut cmd = std::process::Command::new(std::env::current_exe().expect("current exe"));
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .stdin(std::process::Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the child test");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.success(), stdout)
}

/// A temporary directory in memory (`/dev/shm`) where there is one, else the usual:
/// for tests of what does not depend on the disk (descriptors, file counts), which a
/// real disk's syncs would only slow down.
pub fn memory_tempdir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    match shm.is_dir() {
        true => tempfile::tempdir_in(shm).or_else(|_| tempfile::tempdir()),
        false => tempfile::tempdir(),
    }
    .expect("tempdir")
}
