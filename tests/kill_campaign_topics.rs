//! Issue 31 point 2's kill campaign: a real process with publishers spread over many
//! topics under `Sync=Always` (their rounds share the journal) is SIGKILLed at random
//! instants, again and again on the same data directory. After each kill every
//! acknowledged publish is in its topic with its payload, and every topic's offsets are
//! dense. Each reopen copies the journal back into the topics first, so this also checks
//! that copying back (again and again, over files retention reused) damages nothing.
//!
//! The default run does `SPOOL_KILLS` kills (default 16); the long campaign is
//! `SPOOL_KILLS=300 cargo test --release --test kill_campaign_topics -- --ignored`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use spool::{Headers, Options, Spool, SyncPolicy};

const CHILD_ENV: &str = "SPOOL_KILL_TOPICS_CHILD_DIR";
const SEED_ENV: &str = "SPOOL_KILL_TOPICS_CHILD_SEED";
const TOPICS: u64 = 24;
const TASKS: u64 = 16;

fn options(dir: &Path, retention: bool) -> Options {
    let mut o = Options::new(dir);
    o.sync = SyncPolicy::Always;
    o.segment_bytes = 16 * 1024;
    if retention {
        o.retention_bytes = 3 * o.segment_bytes;
        o.retention_check_ms = 5;
    }
    o
}

fn topic(i: u64) -> String {
    format!("jobs-{}", i % TOPICS)
}

/// The child: `TASKS` tasks publish over the topics until killed, printing each
/// acknowledged publish as `P <topic> <offset> <body>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_topics_child_entry() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let seed: u64 = std::env::var(SEED_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let mq =
        Spool::open_with(options(Path::new(&dir), seed.is_multiple_of(2))).expect("child open");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    for w in 0..TASKS {
        let (mq, tx) = (mq.clone(), tx.clone());
        tokio::spawn(async move {
            for i in 0u64.. {
                let t = topic(w * 7 + i);
                let body = format!("m-{seed}-{w}-{i}");
                if (i + w) % 4 == 0 {
                    let batch: Vec<(Vec<u8>, Headers)> = (0..3)
                        .map(|k| (format!("{body}-{k}").into_bytes(), Headers::new()))
                        .collect();
                    let offsets = mq.publish_batch(&t, batch).await.expect("batch");
                    for (k, o) in offsets.iter().enumerate() {
                        let _ = tx.send(format!("P {t} {o} {body}-{k}"));
                    }
                } else {
                    let o = mq
                        .publish(&t, body.clone().into_bytes(), &Headers::new())
                        .await
                        .expect("publish");
                    let _ = tx.send(format!("P {t} {o} {body}"));
                }
            }
        });
    }
    drop(tx);
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    while let Some(line) = rx.recv().await {
        writeln!(out, "{line}").expect("stdout");
        out.flush().expect("flush");
    }
}

/// Acknowledged publishes: (topic, offset) → body.
type Published = BTreeMap<(String, u64), String>;

/// Runs one child for `run_ms`, kills it, and adds what it printed; returns how many.
fn run_and_kill(dir: &Path, seed: u64, run_ms: u64, p: &mut Published) -> usize {
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args([
            "--exact",
            "kill_topics_child_entry",
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
    let mut facts = 0;
    for line in reader.join().expect("reader") {
        // A line cut by the kill has fewer parts (or a shorter body: not a whole one).
        if let ["P", t, o, body] = line.split_whitespace().collect::<Vec<_>>().as_slice()
            && let Ok(o) = o.parse::<u64>()
        {
            p.insert(((*t).to_owned(), o), (*body).to_owned());
            facts += 1;
        }
    }
    facts
}

async fn verify(dir: &Path, p: &Published, kill: usize) {
    let mq = Spool::open_with(options(dir, false))
        .unwrap_or_else(|e| panic!("kill {kill}: reopen failed: {e}"));
    for i in 0..TOPICS {
        let t = topic(i);
        let Ok(info) = mq.topic_info(&t) else {
            continue;
        };
        let records = mq
            .fetch(&t, info.earliest, usize::MAX)
            .await
            .expect("fetch");
        for (r, want) in records.iter().zip(info.earliest..) {
            assert_eq!(
                r.offset(),
                want,
                "kill {kill}: {t} dense from {}",
                info.earliest
            );
        }
        assert_eq!(
            records.len() as u64,
            info.next - info.earliest,
            "kill {kill}: {t}"
        );
        let from = (t.clone(), info.earliest);
        for ((pt, o), body) in p.range(from..).take_while(|((pt, _), _)| *pt == t) {
            let r = records
                .get((o - info.earliest) as usize)
                .unwrap_or_else(|| panic!("kill {kill}: acknowledged {pt}@{o} is missing"));
            assert_eq!(&r.payload()[..], body.as_bytes(), "kill {kill}: {pt}@{o}");
        }
    }
    mq.close().await.expect("close");
}

async fn campaign(kills: usize) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    let mut p = Published::new();
    let mut facts = 0;
    let mut rng = 0x746f_7069_6373_u64;
    for kill in 0..kills {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        facts += run_and_kill(&dir, kill as u64 + 1, 30 + rng % 120, &mut p);
        verify(&dir, &p, kill).await;
    }
    eprintln!(
        "kill campaign over {TOPICS} topics: {kills} kills, {facts} acknowledged publishes checked"
    );
    assert!(
        facts > kills,
        "the children did too little work to mean anything"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promises_hold_across_random_sigkills_over_many_topics() {
    let kills = std::env::var("SPOOL_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    campaign(kills).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: SPOOL_KILLS=300 cargo test --release --test kill_campaign_topics -- --ignored"]
async fn long_kill_campaign_over_many_topics() {
    let kills = std::env::var("SPOOL_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    campaign(kills).await;
}
