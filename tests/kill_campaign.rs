//! A real process publishing and consuming (with random nacks to dead-letter) is
//! SIGKILLed at random instants, again and again on the same data directory; after each
//! kill every promise it was given still holds: acknowledged publishes are there with their
//! payloads, offsets are dense, the cursor is at or past every durable ack and never past
//! the log end, and no message has two dead-letter copies.
//!
//! Every other child runs with retention (three segments kept, checked every 5 ms), so
//! that rolls reuse the files retention deleted (`Sync=Always`): promises are then checked
//! from the earliest retained offset on.
//!
//! The default run does `SPOOL_KILLS` kills (default 25); the long campaign is
//! `SPOOL_KILLS=500 cargo test --release --test kill_campaign -- --ignored`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use spool::{Headers, Options, Spool, SyncPolicy};

const CHILD_ENV: &str = "SPOOL_KILL_CHILD_DIR";
const SEED_ENV: &str = "SPOOL_KILL_CHILD_SEED";
const TOPIC: &str = "jobs";
const GROUP: &str = "workers";

fn options(dir: &Path, retention: bool) -> Options {
    let mut o = Options::new(dir);
    o.sync = SyncPolicy::Always;
    o.segment_bytes = 16 * 1024;
    o.max_delivery_attempts = 3;
    o.commit_interval_ms = 5;
    if retention {
        o.retention_bytes = 3 * o.segment_bytes;
        o.retention_check_ms = 5;
    }
    o
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The child: publishes and consumes until killed, printing each acknowledged fact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_child_entry() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let seed: u64 = std::env::var(SEED_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let mut rng = Rng(seed | 1);
    let mq =
        Spool::open_with(options(Path::new(&dir), seed.is_multiple_of(2))).expect("child open");
    let mut c = mq
        .consumer(TOPIC, GROUP)
        .manual_ack()
        .build()
        .expect("consumer");
    let mut out = std::io::stdout().lock();
    use std::io::Write;
    for i in 0u64.. {
        let id = format!("{seed}-{i}");
        if rng.below(4) == 0 {
            // Now and then a batch too big to be held for the sync thread (256 KiB): its
            // publisher writes it, the payloads from where they lie (`pwritev`).
            let pad = if rng.below(16) == 0 { 100 << 10 } else { 0 };
            let batch: Vec<(Vec<u8>, Headers)> = (0..3)
                .map(|k| {
                    let mut body = format!("m-{id}-{k}-").into_bytes();
                    body.resize(body.len() + pad, b'.');
                    (body, Headers::new())
                })
                .collect();
            let offsets = mq.publish_batch(TOPIC, batch).await.expect("batch");
            for (k, o) in offsets.iter().enumerate() {
                // The dots as a count: a line under 4 KiB reaches the pipe whole.
                writeln!(out, "P {o} m-{id}-{k}- {pad}").expect("stdout");
            }
        } else {
            let o = mq
                .publish(TOPIC, format!("m-{id}").into_bytes(), &Headers::new())
                .await
                .expect("publish");
            writeln!(out, "P {o} m-{id}").expect("stdout");
        }
        out.flush().expect("flush");
        if let Some(d) = c
            .recv_timeout(Duration::from_millis(1))
            .await
            .expect("recv")
        {
            let offset = d.offset();
            if rng.below(5) == 0 {
                let r = d.nack("random failure").await.expect("nack");
                if r.dead_lettered {
                    writeln!(out, "D {offset} {}", r.next_offset).expect("stdout");
                }
            } else {
                d.ack().await.expect("ack");
                writeln!(out, "A {offset}").expect("stdout");
            }
            out.flush().expect("flush");
        }
    }
}

#[derive(Default)]
struct Promises {
    published: BTreeMap<u64, String>,
    cursor: u64,
}

/// Runs one child for a random time, kills it, and returns how many facts it printed.
fn run_and_kill(dir: &Path, seed: u64, run_ms: u64, p: &mut Promises) -> usize {
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args([
            "--exact",
            "kill_child_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir)
        .env(SEED_ENV, seed.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    let deadline = Instant::now() + Duration::from_millis(run_ms);
    while Instant::now() < deadline {
        if child.try_wait().expect("try_wait").is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("wait");
    let lines = reader.join().expect("reader");
    let mut facts = 0;
    for line in lines {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["P", o, body] => {
                p.published
                    .insert(o.parse().expect("offset"), (*body).to_owned());
                facts += 1;
            }
            ["P", o, body, dots] => {
                let dots = ".".repeat(dots.parse().expect("dots"));
                p.published
                    .insert(o.parse().expect("offset"), format!("{body}{dots}"));
                facts += 1;
            }
            ["A", o] => {
                p.cursor = p.cursor.max(o.parse::<u64>().expect("offset") + 1);
                facts += 1;
            }
            ["D", _, next] => {
                p.cursor = p.cursor.max(next.parse().expect("offset"));
                facts += 1;
            }
            _ => {}
        }
    }
    facts
}

async fn verify(dir: &Path, p: &Promises, kill: usize) {
    let mq = Spool::open_with(options(dir, false))
        .unwrap_or_else(|e| panic!("kill {kill}: reopen failed: {e}"));
    let info = mq.topic_info(TOPIC).expect("info");
    let earliest = info.earliest;
    let records = mq.fetch(TOPIC, earliest, usize::MAX).await.expect("fetch");
    assert_eq!(
        records.len() as u64,
        info.next - earliest,
        "kill {kill}: offsets are dense from {earliest}"
    );
    for (r, want) in records.iter().zip(earliest..) {
        assert_eq!(r.offset(), want, "kill {kill}: dense offsets");
    }
    for (o, body) in p.published.range(earliest..) {
        let r = records
            .get((o - earliest) as usize)
            .unwrap_or_else(|| panic!("kill {kill}: acknowledged offset {o} is missing"));
        assert_eq!(&r.payload()[..], body.as_bytes(), "kill {kill}: offset {o}");
    }
    let g = mq.group_info(TOPIC, GROUP).expect("group");
    assert!(g.cursor <= g.next, "kill {kill}: cursor past the log end");
    assert!(
        g.cursor >= p.cursor,
        "kill {kill}: cursor {} behind the durable cursor {}",
        g.cursor,
        p.cursor
    );
    let mut copies: BTreeMap<String, usize> = BTreeMap::new();
    for r in mq.fetch("jobs.dlq", 0, usize::MAX).await.expect("dlq") {
        let o = r
            .headers()
            .get("x-original-offset")
            .cloned()
            .expect("x-original-offset");
        *copies.entry(o).or_default() += 1;
    }
    for (o, n) in copies {
        assert_eq!(n, 1, "kill {kill}: offset {o} dead-lettered {n} times");
    }
    mq.close().await.expect("close");
}

async fn campaign(kills: usize) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    let mut p = Promises::default();
    let mut rng = Rng(0x6b69_6c6c);
    let mut facts = 0;
    for kill in 0..kills {
        let run_ms = 20 + rng.below(80);
        facts += run_and_kill(&dir, kill as u64 + 1, run_ms, &mut p);
        verify(&dir, &p, kill).await;
    }
    eprintln!(
        "kill campaign: {kills} kills survived, {facts} acknowledged facts checked, {} records published",
        p.published.len()
    );
    assert!(
        facts > kills,
        "the children did too little work to mean anything"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promises_hold_across_random_sigkills() {
    let kills = std::env::var("SPOOL_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(25);
    campaign(kills).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: SPOOL_KILLS=500 cargo test --release --test kill_campaign -- --ignored"]
async fn long_kill_campaign() {
    let kills = std::env::var("SPOOL_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    campaign(kills).await;
}
