//! Helpers of the command-line tests: running the built `spool` binary, preparing a data
//! directory with the library (publish, consume, nack to dead-letter), and a fingerprint
//! of everything stored, to show that a command changed nothing.
#![allow(
    dead_code,
    reason = "each test file uses a different subset of the helpers"
)]

use std::path::Path;
use std::process::{Command, Output, Stdio};

use spool::blocking::Spool;
use spool::{Headers, Options};

/// What one run of the binary gave.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The stdout parsed as one JSON document.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {}", self.stdout))
    }

    /// The stdout parsed as JSON Lines.
    pub fn json_lines(&self) -> Vec<serde_json::Value> {
        self.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
}

fn finish(out: Output) -> Run {
    Run {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(out.stdout).expect("utf-8 stdout"),
        stderr: String::from_utf8(out.stderr).expect("utf-8 stderr"),
    }
}

/// Runs `spool --data <data> <args>` with no stdin.
pub fn spool(data: &Path, args: &[&str]) -> Run {
    spool_raw(&[&["--data", data.to_str().expect("utf-8 path")], args].concat())
}

/// Runs `spool <args>` (no `--data` added; `SPOOL_DATA` cleared).
pub fn spool_raw(args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(args)
        .env_remove("SPOOL_DATA")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run spool");
    finish(out)
}

/// Runs `spool --data <data> <args>` with `input` on stdin.
pub fn spool_stdin(data: &Path, args: &[&str], input: &str) -> Run {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args([&["--data", data.to_str().expect("utf-8 path")], args].concat())
        .env_remove("SPOOL_DATA")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run spool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write stdin");
    finish(child.wait_with_output().expect("wait"))
}

/// Asserts the exit code, showing the output when it differs.
pub fn expect_code(run: &Run, code: i32) {
    assert_eq!(
        run.code, code,
        "stdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
}

/// The quickstart's poison-message story, closed: `orders` holds m0..m5 (m5 with
/// `message-id: id-5`); group `workers` (2 attempts) acked m0, dead-lettered m1
/// ("validation failed") and m2 ("upstream 503"), and nacked m3 once ("timeout"), so its
/// cursor is 3; `orders.dlq` holds the two copies.
pub fn prepare(dir: &Path) {
    let mq = Spool::open_with(Options {
        max_delivery_attempts: 2,
        ..Options::new(dir)
    })
    .expect("open");
    for i in 0..6 {
        let mut h = Headers::new();
        if i == 5 {
            h.insert("message-id".into(), "id-5".into());
        }
        mq.publish("orders", format!("m{i}").into_bytes(), &h)
            .expect("publish");
    }
    let mut c = mq
        .consumer("orders", "workers")
        .manual_ack()
        .build()
        .expect("consumer");
    c.recv().expect("m0").ack().expect("ack");
    for reason in ["validation failed", "upstream 503"] {
        for _ in 0..2 {
            c.recv().expect("recv").nack(reason).expect("nack");
        }
    }
    c.recv().expect("m3").nack("timeout").expect("nack");
    c.close().expect("close consumer");
    mq.close().expect("close");
}

/// Everything a command could change, as seen through the library: each topic's offsets,
/// a hash of its records (offset, time, headers, payload), and every group's state
/// (`None` if the directory does not open).
pub fn fingerprint(dir: &Path) -> Option<String> {
    let mq = Spool::open_with(Options::new(dir)).ok()?;
    let mut out = String::new();
    for t in mq.topics().expect("topics") {
        let i = mq.topic_info(&t).expect("topic_info");
        let records = records_hash(&mq, &t, i.earliest, i.next);
        out += &format!("{t} {} {} {} {records:x}\n", i.earliest, i.next, i.segments);
        for g in mq.groups(&t).expect("groups") {
            out += &format!("  {g} {:?}\n", mq.group_info(&t, &g).expect("group_info"));
        }
    }
    mq.close().expect("close");
    Some(out)
}

/// A hash of every record of `topic` in `from..end`.
fn records_hash(mq: &Spool, topic: &str, from: u64, end: u64) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut next = from;
    while next < end {
        let records = mq.fetch(topic, next, 1000).expect("fetch");
        let Some(last) = records.last() else { break };
        next = last.offset() + 1;
        for r in &records {
            (r.offset(), r.timestamp_ms(), r.headers(), &r.payload()[..]).hash(&mut h);
        }
    }
    h.finish()
}
