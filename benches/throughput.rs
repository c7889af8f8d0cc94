//! spool against the disk's limits and its peers, in one run, as ratios.
//!
//! `cargo bench --bench throughput` runs everything at the default scale;
//! `cargo bench --bench throughput -- publish` runs the workloads whose name contains
//! `publish`. `SPOOL_BENCH_SCALE=0.1` shrinks every count (quick look), `=4` grows them.
//! The open-after-crash workload uses logs of 10 MB and 1 GB, plus `SPOOL_BENCH_BIG_MB`
//! (for example 10240) when set. Each workload runs `SPOOL_BENCH_RUNS` times (default 5) and the
//! median is printed. A target's workloads (spool's and its baselines') run round-robin,
//! one run of each per round, and its ratio is the median of the per-round ratios, so a
//! shared machine that speeds up or slows down during the bench moves both sides alike.
//!
//! Baselines use each library's ordinary API: (a) raw: length-prefixed crc'd records
//! through a `BufWriter` (and one `fdatasync` per message for the durable case); (b) a redb
//! table (u64 -> bytes, cursor in a second table); (c) SQLite in WAL mode (rusqlite).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use spool::{Headers, Options, Spool, SyncPolicy};

mod common;
use common::{Stat, fill, n, open, raw_append, rt, runs_or, scale, stat};

fn runs() -> usize {
    // Five: on this shared machine a slow phase often spans a round or two.
    runs_or(5)
}

/// `(steal, total)` CPU ticks from the first line of `/proc/stat`, if it can be read.
fn cpu_ticks() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = text
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    Some((*fields.get(7)?, fields.iter().sum()))
}

/// "; host steal X% in that round", or nothing where steal is not known.
fn steal_note(s: &Stat) -> String {
    s.steal_pct
        .map(|p| format!("; host steal {p:.1}% in that round"))
        .unwrap_or_default()
}

/// Runs `f` and notes the steal time during it.
fn with_steal(f: impl FnOnce() -> Stat) -> Stat {
    let before = cpu_ticks();
    let s = f();
    let steal_pct = match (before, cpu_ticks()) {
        (Some((s0, t0)), Some((s1, t1))) if t1 > t0 => {
            Some(s1.saturating_sub(s0) as f64 * 100.0 / (t1 - t0) as f64)
        }
        _ => None,
    };
    Stat { steal_pct, ..s }
}

/// A workload: its name and how to run it once.
type Workload<'a> = (String, Box<dyn FnMut() -> Stat + 'a>);

struct Report {
    filter: Option<String>,
    /// Every run of every workload, in run order.
    runs: BTreeMap<String, Vec<Stat>>,
}

impl Report {
    fn wants(&self, name: &str) -> bool {
        self.filter.as_deref().is_none_or(|f| name.contains(f))
    }

    /// Runs `f` `runs()` times; prints the run with the median throughput.
    fn run(&mut self, name: &str, f: impl FnMut() -> Stat) {
        self.round_robin(vec![(name.to_owned(), Box::new(f))]);
    }

    /// Runs the workloads in turn, `runs()` rounds of one run each, so that a workload
    /// and the baselines it is compared with run next to each other: a ratio is then
    /// taken within each round (see `ratio`) and a machine that speeds up or slows down
    /// between rounds moves both sides of it alike.
    /// A workload already measured (in a target's rounds) is not run again.
    fn round_robin(&mut self, mut workloads: Vec<Workload<'_>>) {
        workloads.retain(|(name, _)| self.wants(name) && !self.runs.contains_key(name));
        for _ in 0..runs() {
            for (name, f) in &mut workloads {
                let s = with_steal(f);
                self.runs.entry(name.clone()).or_default().push(s);
            }
        }
        for (name, _) in &workloads {
            self.print(name);
        }
    }

    /// Runs `f`, which measures the workloads `names` together and returns a figure for
    /// each, `runs()` times (see `interleaved`).
    fn together(&mut self, names: &[&str], mut f: impl FnMut() -> Vec<Stat>) {
        if !names.iter().any(|n| self.wants(n)) || self.runs.contains_key(names[0]) {
            return;
        }
        for _ in 0..runs() {
            let stats = f();
            debug_assert_eq!(stats.len(), names.len());
            for (name, s) in names.iter().zip(stats) {
                self.runs.entry((*name).to_owned()).or_default().push(s);
            }
        }
        for name in names {
            self.print(name);
        }
    }

    /// Prints the run with the median throughput.
    fn print(&self, name: &str) {
        let s = self.median(name).unwrap_or_default();
        let mut lat = if s.p50_us > 0.0 {
            format!(
                "  p50 {:>8.1} µs  p99 {:>8.1} µs  p99.9 {:>8.1} µs",
                s.p50_us, s.p99_us, s.p999_us
            )
        } else {
            String::new()
        };
        if let (true, Some(steal)) = (s.paced, s.steal_pct) {
            lat.push_str(&format!("  host steal {steal:.1}%"));
        }
        println!(
            "{name:<48} {:>12.0} msg/s {:>9.1} MB/s{lat}",
            s.msgs_per_s, s.mb_per_s
        );
    }

    /// The run with the median throughput, or for a paced workload the median p99 (by
    /// throughput, its rounds all ran at the set rate: the "median" was whichever round
    /// happened to end a few microseconds sooner).
    fn median(&self, name: &str) -> Option<Stat> {
        let mut all = self.runs.get(name)?.clone();
        if all.iter().all(|s| s.paced) {
            all.sort_by(|a, b| a.p99_us.total_cmp(&b.p99_us));
        } else {
            all.sort_by(|a, b| a.msgs_per_s.total_cmp(&b.msgs_per_s));
        }
        all.get(all.len() / 2).copied()
    }

    /// The lowest and highest p99 over the rounds of `name`.
    fn p99_range(&self, name: &str) -> Option<(f64, f64)> {
        let all = self.runs.get(name)?;
        let lo = all.iter().map(|s| s.p99_us).min_by(f64::total_cmp)?;
        let hi = all.iter().map(|s| s.p99_us).max_by(f64::total_cmp)?;
        Some((lo, hi))
    }

    /// `ours / base` within each round (both ran in the same `round_robin`); prints the
    /// median over the rounds and the lowest and highest.
    fn ratio(&self, what: &str, ours: &str, base: &str, target: f64) {
        let (Some(a), Some(b)) = (self.runs.get(ours), self.runs.get(base)) else {
            return;
        };
        let mut r: Vec<f64> = a
            .iter()
            .zip(b)
            .map(|(a, b)| a.msgs_per_s / b.msgs_per_s)
            .collect();
        if r.is_empty() {
            return;
        }
        r.sort_by(f64::total_cmp);
        let median = r[r.len() / 2];
        let verdict = if median >= target { "meets" } else { "MISSES" };
        println!(
            "  {what:<62} {median:>7.2}x  ({:.2}x-{:.2}x; target >= {target}x: {verdict})",
            r[0],
            r[r.len() - 1]
        );
    }
}

/// `s`, of a workload whose rate is set (see `Stat::paced`).
fn paced(s: Stat) -> Stat {
    Stat { paced: true, ..s }
}

fn policies() -> [(&'static str, SyncPolicy); 3] {
    [
        ("none", SyncPolicy::None),
        (
            "interval100",
            SyncPolicy::Interval(Duration::from_millis(100)),
        ),
        ("always", SyncPolicy::Always),
    ]
}

// ---------------------------------------------------------------- baselines

/// `raw_append`, but into 64 MiB files, each synced on a thread of its own once the next
/// one starts, with at most two such syncs running (a new file waits for the sync before
/// its predecessor): what `Sync=None`'s promise (every rolled segment synced soon after
/// its roll) costs any log on this disk, without spool.
fn raw_append_synced_behind(count: usize, size: usize) -> Stat {
    const FILE_BYTES: usize = 64 << 20;
    let dir = tempfile::tempdir().expect("tempdir");
    let payload = vec![7u8; size];
    let per_file = (FILE_BYTES / (size + 8)).max(1);
    let mut syncs: std::collections::VecDeque<std::thread::JoinHandle<()>> = Default::default();
    let start = Instant::now();
    let mut done = 0;
    while done < count {
        let file = std::fs::File::create(dir.path().join(format!("{done}.log"))).expect("create");
        let mut w = std::io::BufWriter::new(file);
        let k = per_file.min(count - done);
        for _ in 0..k {
            w.write_all(&(size as u32).to_le_bytes()).expect("write");
            w.write_all(&crc32fast::hash(&payload).to_le_bytes())
                .expect("write");
            w.write_all(&payload).expect("write");
        }
        done += k;
        let file = w.into_inner().expect("flush");
        if syncs.len() == 2
            && let Some(h) = syncs.pop_front()
        {
            h.join().expect("sync thread");
        }
        syncs.push_back(std::thread::spawn(move || file.sync_data().expect("sync")));
    }
    let elapsed = start.elapsed();
    for h in syncs {
        h.join().expect("sync thread");
    }
    stat(count, size, elapsed, Vec::new())
}

/// One side of `interleaved`: publishes `k` messages one at a time, pushing each one's
/// latency in µs.
type Side<'a> = Box<dyn FnMut(usize, &mut Vec<f64>) + 'a>;

/// Runs `sides` in turn, `CHUNK` messages of one, then of the next, until each has done
/// `count`; each side's figure counts only its own time. The disk's fast and slow phases
/// come and go within a fraction of a second here (one-at-a-time `fdatasync` p50 56 µs
/// in one chunk, 88 µs in the next), so sides measured one after another (`round_robin`)
/// can land in different phases; interleaved, every side meets them alike.
fn interleaved(count: usize, size: usize, sides: &mut [Side<'_>]) -> Vec<Stat> {
    const CHUNK: usize = 50;
    let mut lat: Vec<Vec<f64>> = sides.iter().map(|_| Vec::with_capacity(count)).collect();
    let mut took = vec![Duration::ZERO; sides.len()];
    let mut done = 0;
    while done < count {
        let k = CHUNK.min(count - done);
        for (i, side) in sides.iter_mut().enumerate() {
            let start = Instant::now();
            side(k, &mut lat[i]);
            took[i] += start.elapsed();
        }
        done += k;
    }
    lat.into_iter()
        .zip(took)
        .map(|(l, t)| stat(count, size, t, l))
        .collect()
}

/// A length-prefixed crc'd record of `payload`.
fn record(payload: &[u8]) -> Vec<u8> {
    let mut rec = Vec::with_capacity(payload.len() + 8);
    rec.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    rec.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    rec.extend_from_slice(payload);
    rec
}

/// Durable one at a time, `size` bytes, interleaved (see `interleaved`): raw append +
/// `fdatasync`; raw overwrite + `fdatasync` into a file whose blocks were written (zeros)
/// beforehand, what preallocation buys over appending; SQLite `synchronous=FULL`, one row
/// per transaction; spool's `publish().await` under `Sync=Always`.
fn durable_one_interleaved(count: usize, size: usize) -> Vec<Stat> {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let payload = vec![7u8; size];
    let mut appended = std::fs::File::create(dir.path().join("append.log")).expect("create");
    let over_path = dir.path().join("overwrite.log");
    std::fs::write(&over_path, vec![0u8; count * (size + 8)]).expect("preallocate");
    let over = std::fs::OpenOptions::new()
        .write(true)
        .open(&over_path)
        .expect("open");
    over.sync_all().expect("sync");
    let mut over_at = 0u64;
    let sqlite_dir = tempfile::tempdir().expect("tempdir");
    let mut c = sqlite(sqlite_dir.path(), "FULL");
    let spool_dir = tempfile::tempdir().expect("tempdir");
    let rt = rt();
    let mq = open(spool_dir.path(), SyncPolicy::Always);
    let body = bytes::Bytes::from(payload.clone());
    let timed = |lat: &mut Vec<f64>, f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    };
    let stats = interleaved(
        count,
        size,
        &mut [
            Box::new(|k, lat: &mut Vec<f64>| {
                for _ in 0..k {
                    timed(lat, &mut || {
                        appended.write_all(&record(&payload)).expect("write");
                        appended.sync_data().expect("sync");
                    });
                }
            }),
            Box::new(|k, lat: &mut Vec<f64>| {
                for _ in 0..k {
                    timed(lat, &mut || {
                        let rec = record(&payload);
                        over.write_all_at(&rec, over_at).expect("write");
                        over_at += rec.len() as u64;
                        over.sync_data().expect("sync");
                    });
                }
            }),
            Box::new(|k, lat: &mut Vec<f64>| {
                for _ in 0..k {
                    timed(lat, &mut || {
                        let tx = c.transaction().expect("txn");
                        tx.prepare_cached("INSERT INTO q (body) VALUES (?1)")
                            .expect("prepare")
                            .execute([&payload])
                            .expect("insert");
                        tx.commit().expect("commit");
                    });
                }
            }),
            Box::new(|k, lat: &mut Vec<f64>| publish_timed(&rt, &mq, &body, k, lat)),
        ],
    );
    rt.block_on(mq.close()).expect("close");
    stats
}

/// `count` writes of `size` bytes in place, each followed by `fdatasync`: into a file
/// zeroed and synced whole before the clock starts (`zeros_ahead` false), or one that gets
/// 1 MiB of zeros written whenever the writes reach its end, as spool's active segment
/// does under `Sync=Always` (those zeros are flushed by the next sync). What one group
/// commit of `size` bytes costs the disk, without spool.
fn raw_sync_writes(count: usize, size: usize, zeros_ahead: bool) -> Stat {
    use std::os::unix::fs::FileExt;
    const CHUNK: usize = 1 << 20;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("raw.log");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .expect("open");
    let zeros = vec![0u8; CHUNK];
    let mut allocated = 0;
    let whole = if zeros_ahead { CHUNK } else { count * size };
    while allocated < whole {
        f.write_all_at(&zeros, allocated as u64).expect("zeros");
        allocated += CHUNK;
    }
    f.sync_all().expect("sync");
    let payload = vec![7u8; size];
    let mut lat = Vec::with_capacity(count);
    let start = Instant::now();
    for i in 0..count {
        let t = Instant::now();
        let at = i * size;
        if at + size > allocated {
            f.write_all_at(&zeros, allocated as u64).expect("zeros");
            allocated += CHUNK;
        }
        f.write_all_at(&payload, at as u64).expect("write");
        f.sync_data().expect("sync");
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    stat(count, size, start.elapsed(), lat)
}

fn sqlite(dir: &Path, sync: &str) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(dir.join("q.sqlite")).expect("sqlite");
    c.pragma_update(None, "journal_mode", "WAL").expect("wal");
    c.pragma_update(None, "synchronous", sync).expect("sync");
    c.execute_batch(
        "CREATE TABLE IF NOT EXISTS q (id INTEGER PRIMARY KEY, body BLOB NOT NULL);
         CREATE TABLE IF NOT EXISTS cursor (grp TEXT PRIMARY KEY, pos INTEGER NOT NULL);",
    )
    .expect("schema");
    c
}

fn sqlite_insert(count: usize, size: usize, per_txn: usize, sync: &str) -> Stat {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = sqlite(dir.path(), sync);
    let payload = vec![7u8; size];
    let mut lat = Vec::new();
    let start = Instant::now();
    let mut done = 0;
    while done < count {
        let t = Instant::now();
        let tx = c.transaction().expect("txn");
        {
            let mut st = tx
                .prepare_cached("INSERT INTO q (body) VALUES (?1)")
                .expect("prepare");
            for _ in 0..per_txn.min(count - done) {
                st.execute([&payload]).expect("insert");
            }
        }
        tx.commit().expect("commit");
        done += per_txn;
        if per_txn == 1 {
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    stat(count, size, start.elapsed(), lat)
}

/// Reads 100-row ranges and updates the cursor once per range.
fn sqlite_consume(count: usize, size: usize, sync: &str) -> Stat {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = sqlite(dir.path(), "OFF");
    let payload = vec![7u8; size];
    {
        let tx = c.transaction().expect("txn");
        {
            let mut st = tx
                .prepare_cached("INSERT INTO q (body) VALUES (?1)")
                .expect("prepare");
            for _ in 0..count {
                st.execute([&payload]).expect("insert");
            }
        }
        tx.commit().expect("commit");
    }
    c.pragma_update(None, "synchronous", sync).expect("sync");
    let start = Instant::now();
    let mut pos: i64 = 0;
    let mut seen = 0usize;
    while seen < count {
        let tx = c.transaction().expect("txn");
        let mut last = pos;
        {
            let mut st = tx
                .prepare_cached("SELECT id, body FROM q WHERE id > ?1 ORDER BY id LIMIT 100")
                .expect("prepare");
            let mut rows = st.query([pos]).expect("query");
            while let Some(r) = rows.next().expect("row") {
                let id: i64 = r.get(0).expect("id");
                let body: Vec<u8> = r.get(1).expect("body");
                std::hint::black_box(body);
                last = id;
                seen += 1;
            }
            tx.execute(
                "INSERT INTO cursor (grp, pos) VALUES ('g', ?1)
                 ON CONFLICT(grp) DO UPDATE SET pos = excluded.pos",
                [last],
            )
            .expect("cursor");
        }
        tx.commit().expect("commit");
        pos = last;
    }
    stat(count, size, start.elapsed(), Vec::new())
}

const REDB_Q: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("q");

fn redb_insert(count: usize, size: usize, per_txn: usize) -> Stat {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = redb::Database::create(dir.path().join("q.redb")).expect("redb");
    let payload = vec![7u8; size];
    let start = Instant::now();
    let mut id = 0u64;
    while (id as usize) < count {
        let mut tx = db.begin_write().expect("txn");
        tx.set_durability(redb::Durability::None)
            .expect("durability");
        {
            let mut t = tx.open_table(REDB_Q).expect("table");
            for _ in 0..per_txn.min(count - id as usize) {
                t.insert(id, payload.as_slice()).expect("insert");
                id += 1;
            }
        }
        tx.commit().expect("commit");
    }
    stat(count, size, start.elapsed(), Vec::new())
}

// ---------------------------------------------------------------- spool

fn spool_publish_batch(count: usize, size: usize, batch: usize, sync: SyncPolicy) -> Stat {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = rt();
    let mq = open(dir.path(), sync);
    let payload = bytes::Bytes::from(vec![7u8; size]);
    let start = Instant::now();
    rt.block_on(async {
        let mut done = 0;
        while done < count {
            let msgs: Vec<(bytes::Bytes, Headers)> = (0..batch.min(count - done))
                .map(|_| (payload.clone(), Headers::new()))
                .collect();
            done += msgs.len();
            mq.publish_batch("bench", msgs).await.expect("publish");
        }
    });
    let elapsed = start.elapsed();
    rt.block_on(mq.close()).expect("close");
    stat(count, size, elapsed, Vec::new())
}

/// Batches of 100 × 64 KiB (6.5 MB): about one in ten crosses a 64 MiB roll.
const ROLL_CROSSED: &str =
    "payloads: publish_batch100 64KiB sync=none, the batches that cross a roll";
const ROLL_NOT_CROSSED: &str =
    "payloads: publish_batch100 64KiB sync=none, the batches that do not";

/// Issue 31 point 3: the payload sizes of the big-payload rows, each with its label.
const PAYLOAD_SIZES: [(usize, &str); 6] = [
    (16, "16B"),
    (256, "256B"),
    (1 << 10, "1KiB"),
    (4 << 10, "4KiB"),
    (64 << 10, "64KiB"),
    (1 << 20, "1MiB"),
];

/// How many records of `size` bytes a big-payload row writes: about 1 GiB (a batch of
/// 1,000 × 1 MiB, as in the issue, crosses 16 rolls of 64 MiB), at most 2 M records.
fn payload_count(size: usize) -> usize {
    (n(1 << 30) / size).min(n(2_000_000)).max(10)
}

/// `publish_batch` of `batch` × `size` bytes under `Sync=None`, each batch's latency in
/// µs: `.0` of the batches that crossed a roll (the topic's segments grew), `.1` of the
/// others (p50/p99 of each in the `Stat`s).
fn spool_batches_across_rolls(count: usize, size: usize, batch: usize) -> (Stat, Stat) {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = rt();
    let mq = open(dir.path(), SyncPolicy::None);
    let payload = bytes::Bytes::from(vec![7u8; size]);
    let (mut rolled, mut plain) = (Vec::new(), Vec::new());
    let (mut t_rolled, mut t_plain) = (Duration::ZERO, Duration::ZERO);
    let (mut n_rolled, mut n_plain) = (0, 0);
    rt.block_on(async {
        let mut done = 0;
        let mut segments = 0;
        while done < count {
            let msgs: Vec<(bytes::Bytes, Headers)> = (0..batch.min(count - done))
                .map(|_| (payload.clone(), Headers::new()))
                .collect();
            let k = msgs.len();
            done += k;
            let t = Instant::now();
            mq.publish_batch("bench", msgs).await.expect("publish");
            let took = t.elapsed();
            let now = mq.topic_info("bench").expect("info").segments;
            if segments != 0 && now > segments {
                rolled.push(took.as_secs_f64() * 1e6);
                t_rolled += took;
                n_rolled += k;
            } else {
                plain.push(took.as_secs_f64() * 1e6);
                t_plain += took;
                n_plain += k;
            }
            segments = now;
        }
    });
    rt.block_on(mq.close()).expect("close");
    (
        stat(n_rolled.max(1), size, t_rolled, rolled),
        stat(n_plain.max(1), size, t_plain, plain),
    )
}

/// `k` publishes of `payload` to topic `bench`, one at a time, each one's latency pushed
/// to `lat` in µs.
fn publish_timed(
    rt: &tokio::runtime::Runtime,
    mq: &Spool,
    payload: &bytes::Bytes,
    k: usize,
    lat: &mut Vec<f64>,
) {
    let h = Headers::new();
    rt.block_on(async {
        for _ in 0..k {
            let t = Instant::now();
            mq.publish("bench", payload.clone(), &h)
                .await
                .expect("publish");
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
    });
}

fn spool_publish_one(count: usize, size: usize, sync: SyncPolicy) -> Stat {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = rt();
    let mq = open(dir.path(), sync);
    let payload = bytes::Bytes::from(vec![7u8; size]);
    let mut lat = Vec::with_capacity(count);
    let start = Instant::now();
    publish_timed(&rt, &mq, &payload, count, &mut lat);
    let elapsed = start.elapsed();
    rt.block_on(mq.close()).expect("close");
    stat(count, size, elapsed, lat)
}

fn spool_publish_concurrent(count: usize, size: usize, producers: usize) -> Stat {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = rt();
    let mq = open(dir.path(), SyncPolicy::Always);
    publish_concurrent(&rt, mq, count, size, producers)
}

/// `spool_publish_concurrent` on a topic in the steady state of a long-lived one whose
/// consumers keep up: retention deleted its old segments and kept their files for the
/// rolls to overwrite (no zeros ahead, see benches/FINDINGS.md). Untimed before the run:
/// three rolls (the last one into a kept file, which the run then fills) and retention
/// twice.
/// Retention deletes every sealed segment (`Retention Bytes=1`); no roll during the run
/// (as in the fresh topic's).
fn spool_publish_concurrent_steady(count: usize, size: usize, producers: usize) -> Stat {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = rt();
    let mut o = Options::new(dir.path());
    o.sync = SyncPolicy::Always;
    o.dedup_window = 0;
    o.retention_bytes = 1;
    let mq = Spool::open_with(o).expect("open");
    let payload = bytes::Bytes::from(vec![7u8; 64 * 1024]);
    rt.block_on(async {
        // Batches of 4 MiB, 15 to a segment: two segments and one batch, retention, the
        // rest of that segment and one more batch (its roll takes a kept file).
        for batches in [31, 15] {
            for _ in 0..batches {
                let msgs: Vec<(bytes::Bytes, Headers)> =
                    (0..64).map(|_| (payload.clone(), Headers::new())).collect();
                mq.publish_batch("bench", msgs).await.expect("publish");
            }
            mq.apply_retention().expect("retention");
        }
        let info = mq.topic_info("bench").expect("info");
        assert_eq!(info.segments, 1, "the kept file is the active segment");
    });
    publish_concurrent(&rt, mq, count, size, producers)
}

fn publish_concurrent(
    rt: &tokio::runtime::Runtime,
    mq: Spool,
    count: usize,
    size: usize,
    producers: usize,
) -> Stat {
    let payload = bytes::Bytes::from(vec![7u8; size]);
    let per = count / producers;
    let start = Instant::now();
    let lat: Vec<f64> = rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..producers {
            let mq = mq.clone();
            let payload = payload.clone();
            tasks.push(tokio::spawn(async move {
                let h = Headers::new();
                let mut lat = Vec::with_capacity(per);
                for _ in 0..per {
                    let t = Instant::now();
                    mq.publish("bench", payload.clone(), &h)
                        .await
                        .expect("publish");
                    lat.push(t.elapsed().as_secs_f64() * 1e6);
                }
                lat
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("task"));
        }
        all
    });
    let elapsed = start.elapsed();
    rt.block_on(mq.close()).expect("close");
    stat(per * producers, size, elapsed, lat)
}

fn spool_consume_auto(count: usize, size: usize, in_flight: usize) -> Stat {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = rt();
    let mq = open(dir.path(), SyncPolicy::None);
    fill(&mq, &rt, "bench", count, size);
    let start = Instant::now();
    rt.block_on(async {
        let mut c = mq
            .consumer("bench", "g")
            .max_in_flight(in_flight)
            .build()
            .expect("consumer");
        for _ in 0..count {
            let d = c.recv().await.expect("recv");
            std::hint::black_box(d.payload());
        }
    });
    let elapsed = start.elapsed();
    rt.block_on(mq.close()).expect("close");
    stat(count, size, elapsed, Vec::new())
}

/// Issue 31's plain auto-ack pattern: a `recv()` loop on a current-thread runtime on a
/// thread of its own hands the payloads, 100 at a time, over a std channel to the thread
/// that handles them (here the bench's own, which only looks at them).
fn spool_consume_auto_handoff(count: usize, size: usize) -> Stat {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = rt();
    let mq = open(dir.path(), SyncPolicy::None);
    fill(&mq, &rt, "bench", count, size);
    let (tx, rx) = std::sync::mpsc::channel::<Vec<bytes::Bytes>>();
    let start = Instant::now();
    let consumer = {
        let mq = mq.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let mut c = mq.consumer("bench", "g").build().expect("consumer");
                let mut batch = Vec::with_capacity(100);
                for _ in 0..count {
                    let d = c.recv().await.expect("recv");
                    batch.push(d.payload().clone());
                    if batch.len() == 100 {
                        tx.send(std::mem::replace(&mut batch, Vec::with_capacity(100)))
                            .expect("send");
                    }
                }
                tx.send(batch).expect("send");
            });
        })
    };
    let mut seen = 0;
    while seen < count {
        let batch = rx.recv().expect("a batch");
        seen += batch.len();
        std::hint::black_box(batch);
    }
    let elapsed = start.elapsed();
    consumer.join().expect("consumer thread");
    rt.block_on(mq.close()).expect("close");
    stat(count, size, elapsed, Vec::new())
}

/// Manual acks under `Sync=Always`: up to `max_in_flight` deliveries taken, then acked
/// concurrently (`join_all`, no task per ack); each ack is durable when it returns, and
/// concurrent acks share one catalog commit.
fn spool_consume_manual(count: usize, size: usize, in_flight: usize) -> Stat {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = rt();
    let mq = open(dir.path(), SyncPolicy::Always);
    fill(&mq, &rt, "bench", count, size);
    let start = Instant::now();
    rt.block_on(async {
        let mut c = mq
            .consumer("bench", "g")
            .manual_ack()
            .max_in_flight(in_flight)
            .build()
            .expect("consumer");
        let mut done = 0;
        // The acks of one window are awaited in a task of their own while the next window
        // is taken (their slots free up as soon as the acks are made, before they are
        // durable): commits and hand-outs overlap.
        let mut pending: std::collections::VecDeque<tokio::task::JoinHandle<()>> =
            std::collections::VecDeque::new();
        while done < count {
            let mut window = vec![c.recv().await.expect("recv")];
            while window.len() < in_flight {
                match c.try_recv().expect("recv") {
                    Some(d) => window.push(d),
                    None => break,
                }
            }
            done += window.len();
            let acks: Vec<_> = window.into_iter().map(|d| d.ack()).collect();
            pending.push_back(tokio::spawn(async move {
                // In order: once the first is durable, the rest of the window usually is.
                for a in acks {
                    a.await.expect("ack");
                }
            }));
            while pending.len() > 2 {
                if let Some(h) = pending.pop_front() {
                    h.await.expect("acks");
                }
            }
        }
        for h in pending {
            h.await.expect("acks");
        }
    });
    let elapsed = start.elapsed();
    rt.block_on(mq.close()).expect("close");
    stat(count, size, elapsed, Vec::new())
}

/// How a batch pattern of issue 31 takes and acks its deliveries.
#[derive(Clone, Copy)]
enum Acking {
    /// What a user writes first: `recv` then `try_recv` up to the batch, then a loop
    /// awaiting each `d.ack()` (one commit per ack).
    OneByOne,
    /// The same deliveries, their acks awaited together with `join_all`.
    JoinAll,
    /// The batch API: `recv_batch`, then `ack_all` (one commit per batch).
    AckAll,
}

/// Issue 31's batch patterns under `Sync=Always`: `max_in_flight(batch)`, take `batch`
/// deliveries, ack them all (`how`), repeat. Each batch's acks are durable before the
/// next batch is taken, as SQLite's range read + cursor update per 100 rows is.
fn spool_consume_batches(count: usize, size: usize, batch: usize, how: Acking) -> Stat {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = rt();
    let mq = open(dir.path(), SyncPolicy::Always);
    fill(&mq, &rt, "bench", count, size);
    let start = Instant::now();
    let mut lat = Vec::with_capacity(count / batch + 1);
    rt.block_on(async {
        let mut c = mq
            .consumer("bench", "g")
            .manual_ack()
            .max_in_flight(batch)
            .build()
            .expect("consumer");
        let mut done = 0;
        while done < count {
            let t = Instant::now();
            let window = match how {
                Acking::AckAll => c.recv_batch(batch).await.expect("recv_batch"),
                _ => recv_window(&mut c, batch).await,
            };
            done += window.len();
            match how {
                Acking::OneByOne => {
                    for d in window {
                        d.ack().await.expect("ack");
                    }
                }
                Acking::JoinAll => {
                    let acks = window.into_iter().map(|d| d.ack());
                    for r in futures_util::future::join_all(acks).await {
                        r.expect("ack");
                    }
                }
                Acking::AckAll => c.ack_all(window).await.expect("ack_all"),
            }
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
    });
    let elapsed = start.elapsed();
    rt.block_on(mq.close()).expect("close");
    stat(count, size, elapsed, lat)
}

/// `recv`, then `try_recv` until `batch` deliveries or none ready.
async fn recv_window(c: &mut spool::Consumer, batch: usize) -> Vec<spool::Delivery> {
    let mut window = vec![c.recv().await.expect("recv")];
    while window.len() < batch {
        match c.try_recv().expect("recv") {
            Some(d) => window.push(d),
            None => break,
        }
    }
    window
}

/// Issue 31's auto-ack pattern, beside SQLite's 100-row ranges (no fsync).
const AUTO_HANDOFF: &str = "consume auto-ack, own thread, 100/send 100B";
/// Issue 31's batch patterns, beside SQLite's 100-row ranges (`FULL`).
const ONE_BY_ONE_100: &str = "consume 100-row batches: recv+ack awaited one by one (always) 100B";
const JOIN_ALL_100: &str = "consume 100-row batches: recv+join_all acks (always) 100B";
const ACK_ALL_100: &str = "consume 100-row batches: recv_batch+ack_all (always) 100B";

/// The latency workloads' consumer that spins up to 1 ms before it parks.
const BUSY_POLL: &str = "busy-poll";
const TOKIO_HANDOFF: &str = "latency tokio handoff 10k/s (consumer awaits a Notify)";

/// Publish -> recv latency at a steady rate under `Sync=None`, payloads of `size` bytes
/// (at least 8: the send time). The producer is its own thread pacing itself on the clock
/// (so it never competes with the consumer's runtime), sleeping until each send is due or
/// (`spin_producer`) spinning; the consumer waits in `recv` on a runtime of its own,
/// spinning up to `busy_poll` before it parks (`ConsumerBuilder::busy_poll`).
fn spool_latency(
    count: usize,
    size: usize,
    rate: u64,
    busy_poll: Duration,
    spin_producer: bool,
) -> Stat {
    // The gigabytes earlier workloads left for the kernel to write back are not this
    // workload's: written back first (`sync`), as before the opens below.
    let _ = std::process::Command::new("sync").status();
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mq = open(dir.path(), SyncPolicy::None);
    let mut c = mq
        .consumer("lat", "g")
        .busy_poll(busy_poll)
        .build()
        .expect("consumer");
    let origin = Instant::now();
    let mqp = mq.clone();
    let producer = std::thread::spawn(move || {
        let prt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let h = Headers::new();
        let period = Duration::from_nanos(1_000_000_000 / rate);
        for i in 0..count {
            wait_until(origin + period * (i as u32 + 1), spin_producer);
            let mut payload = vec![7u8; size.max(8)];
            let sent = origin.elapsed().as_nanos() as u64;
            payload[..8].copy_from_slice(&sent.to_le_bytes());
            prt.block_on(mqp.publish("lat", payload, &h))
                .expect("publish");
        }
    });
    let start = Instant::now();
    let stamps = rt.block_on(async {
        let mut stamps = Vec::with_capacity(count);
        for _ in 0..count {
            let d = c.recv().await.expect("recv");
            let now = Instant::now();
            let mut b = [0u8; 8];
            b.copy_from_slice(&d.payload()[..8]);
            stamps.push((u64::from_le_bytes(b), now));
        }
        stamps
    });
    let elapsed = start.elapsed();
    producer.join().expect("producer");
    let lat = stamps
        .into_iter()
        .map(|(sent_ns, at)| {
            (at.duration_since(origin).as_nanos() as u64).saturating_sub(sent_ns) as f64 / 1e3
        })
        .collect();
    drop(c);
    rt.block_on(mq.close()).expect("close");
    paced(stat(count, size.max(8), elapsed, lat))
}

/// Waits until `due`, spinning or (the default for a paced producer) sleeping.
fn wait_until(due: Instant, spin: bool) {
    if spin {
        while Instant::now() < due {
            std::hint::spin_loop();
        }
    } else if let Some(wait) = due.checked_duration_since(Instant::now()) {
        std::thread::sleep(wait);
    }
}

/// The floor under `spool_latency`: a producer thread sleeping until each send is due
/// stores the send's time in its slot, then the count of sends (and unparks the consumer
/// unless it `spins`); the consumer thread waits for the count to move, parked or
/// spinning, and takes every send's latency from its slot (sends that came while it was
/// away included, as spool's consumer receives each of them).
fn handoff_latency(count: usize, rate: u64, spins: bool) -> Stat {
    use std::sync::atomic::{AtomicU64, Ordering};
    let _ = std::process::Command::new("sync").status();
    let origin = Instant::now();
    let seq = std::sync::Arc::new(AtomicU64::new(0));
    let sent: std::sync::Arc<Vec<AtomicU64>> =
        std::sync::Arc::new((0..count).map(|_| AtomicU64::new(0)).collect());
    let consumer = {
        let (seq, sent) = (seq.clone(), sent.clone());
        std::thread::spawn(move || {
            let mut lat = Vec::with_capacity(count);
            let mut seen = 0;
            while seen < count {
                let now = seq.load(Ordering::Acquire) as usize;
                if now == seen {
                    if spins {
                        std::hint::spin_loop();
                    } else {
                        std::thread::park();
                    }
                    continue;
                }
                received(&mut lat, origin, &sent[seen..now]);
                seen = now;
            }
            lat
        })
    };
    let period = Duration::from_nanos(1_000_000_000 / rate);
    let start = Instant::now();
    for (i, slot) in sent.iter().enumerate() {
        wait_until(origin + period * (i as u32 + 1), false);
        slot.store(origin.elapsed().as_nanos() as u64, Ordering::Relaxed);
        // Release: the consumer that sees the count sees the slots below it.
        seq.store(i as u64 + 1, Ordering::Release);
        if !spins {
            consumer.thread().unpark();
        }
    }
    let lat = consumer.join().expect("consumer");
    paced(stat(lat.len(), 8, start.elapsed(), lat))
}

/// The latencies (µs) of the sends stamped in `slots` (nanoseconds after `origin`),
/// received now.
fn received(lat: &mut Vec<f64>, origin: Instant, slots: &[std::sync::atomic::AtomicU64]) {
    let at = origin.elapsed().as_nanos() as u64;
    for slot in slots {
        let sent = slot.load(std::sync::atomic::Ordering::Relaxed);
        lat.push(at.saturating_sub(sent) as f64 / 1e3);
    }
}

/// The floor under a parked `recv`: `handoff_latency` with the consumer awaiting a tokio
/// `Notify` on the same kind of runtime as `spool_latency`'s (current-thread, IO driver
/// on), so its wake-up goes the same way (the runtime's driver and its eventfd): what a
/// parked `recv` costs without spool's own work.
fn tokio_handoff_latency(count: usize, rate: u64) -> Stat {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let _ = std::process::Command::new("sync").status();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let origin = Instant::now();
    let notify = Arc::new(tokio::sync::Notify::new());
    let seq = Arc::new(AtomicU64::new(0));
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..count).map(|_| AtomicU64::new(0)).collect());
    let producer = {
        let (notify, seq, sent) = (notify.clone(), seq.clone(), sent.clone());
        std::thread::spawn(move || {
            let period = Duration::from_nanos(1_000_000_000 / rate);
            for (i, slot) in sent.iter().enumerate() {
                wait_until(origin + period * (i as u32 + 1), false);
                slot.store(origin.elapsed().as_nanos() as u64, Ordering::Relaxed);
                seq.store(i as u64 + 1, Ordering::Release);
                notify.notify_waiters();
            }
        })
    };
    let start = Instant::now();
    let lat = rt.block_on(async {
        let mut lat = Vec::with_capacity(count);
        let mut seen = 0;
        while seen < count {
            // Registered before looking, as `recv` does, so a send in between is not missed.
            let notified = notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let now = seq.load(Ordering::Acquire) as usize;
            if now == seen {
                notified.await;
                continue;
            }
            received(&mut lat, origin, &sent[seen..now]);
            seen = now;
        }
        lat
    });
    let elapsed = start.elapsed();
    producer.join().expect("producer");
    paced(stat(lat.len(), 8, elapsed, lat))
}

// ------------------------------------------------------- open after unclean stop

const CHILD_ENV: &str = "SPOOL_BENCH_CHILD";

/// In a child process: fill `dir` to `mb` megabytes under Sync=None, then abort (unclean).
fn child_fill(dir: &str, mb: usize) -> ! {
    let rt = rt();
    let mut o = Options::new(dir);
    o.sync = SyncPolicy::None;
    o.dedup_window = 0;
    let mq = Spool::open_with(o).expect("open");
    let count = mb * 1024 * 1024 / (1024 + 29);
    fill(&mq, &rt, "big", count, 1024);
    std::process::abort();
}

/// In a child process: open `dir` (after an unclean stop), print how long it took, and
/// stop uncleanly again.
fn child_open(dir: &str) -> ! {
    let t = Instant::now();
    let mq = open(Path::new(dir), SyncPolicy::None);
    println!("{}", t.elapsed().as_micros());
    std::mem::forget(mq);
    std::process::exit(0);
}

/// In a child process: open `dir`, consume everything with auto-ack, print peak RSS.
fn child_consume(dir: &str) -> ! {
    let rt = rt();
    let t = Instant::now();
    let mq = open(Path::new(dir), SyncPolicy::None);
    let opened = t.elapsed();
    let next = mq.topic_info("big").expect("info").next;
    rt.block_on(async {
        let mut c = mq.consumer("big", "rss").build().expect("consumer");
        for _ in 0..next {
            let d = c.recv().await.expect("recv");
            std::hint::black_box(d.payload());
        }
    });
    let hwm = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM"))
        .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_owned())
        .unwrap_or_default();
    println!("{} {} {}", opened.as_micros(), hwm, next);
    std::process::exit(0);
}

fn run_child(args: &[&str]) -> String {
    let out = std::process::Command::new(std::env::current_exe().expect("exe"))
        .env(CHILD_ENV, args.join(" "))
        .output()
        .expect("child");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const OPEN_ROUNDS: usize = 9;

fn open_after_crash(report: &mut Report) {
    if !report.wants("open-after-crash") {
        return;
    }
    let mut sizes = vec![10usize, 1024];
    if let Some(big) = std::env::var("SPOOL_BENCH_BIG_MB")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        sizes.push(big);
    }
    // Every log is filled (and aborted) first, then the opens of all sizes run in turn:
    // an open is mostly the catalog's few syncs, whose latency depends on what the disk
    // was just given (right after a 10 GB fill it is slower), so sizes measured one after
    // the other would compare the disk's states, not spool's opens.
    let dirs: Vec<(usize, tempfile::TempDir)> = sizes
        .iter()
        .map(|&mb| {
            let dir = tempfile::tempdir().expect("tempdir");
            run_child(&["fill", &dir.path().to_string_lossy(), &mb.to_string()]);
            (mb, dir)
        })
        .collect();
    // Let the kernel finish writing back the fills (`sync`): otherwise an open competes
    // with gigabytes of writeback on two cores. The page cache stays warm for all alike.
    let _ = std::process::Command::new("sync").status();
    // Nine rounds of one open of each log, each after an unclean stop (an open is a few
    // milliseconds, mostly syncs whose latency swings 2-3x on this disk: three rounds let
    // one slow phase decide the median). The first open
    // after the fill's abort also takes up what the fill left undone (under Sync=None:
    // the segments whose background sync the abort interrupted; in the same boot they
    // are checked from their index ends and synced and sealed by a background thread,
    // which each open here exits before it is done).
    let mut open_runs: Vec<Vec<f64>> = vec![Vec::new(); dirs.len()];
    for _ in 0..OPEN_ROUNDS {
        for ((_, dir), runs) in dirs.iter().zip(&mut open_runs) {
            let us = run_child(&["open", &dir.path().to_string_lossy()]);
            runs.push(us.trim().parse().unwrap_or(0.0));
        }
    }
    let mut opens = Vec::new();
    for ((mb, dir), mut runs) in dirs.into_iter().zip(open_runs) {
        let first_us = runs[0];
        runs.sort_by(f64::total_cmp);
        let open_us = runs[runs.len() / 2];
        let fastest_us = runs[0];
        let line = run_child(&["consume", &dir.path().to_string_lossy()]);
        let mut it = line.split_whitespace();
        let _first_open_us = it.next();
        let hwm_kb: f64 = it.next().and_then(|s| s.parse().ok()).unwrap_or(0.0);
        let records: u64 = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        println!(
            "open-after-crash {mb:>6} MB log ({records} records): open {:>9.1} ms (first {:.1} ms), peak RSS while consuming all {:>8.1} MB",
            open_us / 1e3,
            first_us / 1e3,
            hwm_kb / 1024.0
        );
        opens.push((mb, open_us, hwm_kb, first_us, fastest_us));
    }
    if let (Some(&(a, oa, ra, fa, ma)), Some(&(b, ob, rb, fb, mb))) = (opens.first(), opens.last())
    {
        // The fastest opens: what each costs when the disk's syncs are at their quickest.
        println!(
            "  open time {b} MB / {a} MB: {:.2}x (target <= 2x; first opens {:.2}x, fastest opens {:.2}x); peak RSS {b} MB / {a} MB: {:.2}x",
            ob / oa.max(1.0),
            fb / fa.max(1.0),
            mb / ma.max(1.0),
            rb / ra.max(1.0)
        );
    }
}

fn main() {
    if let Ok(args) = std::env::var(CHILD_ENV) {
        let a: Vec<&str> = args.split(' ').collect();
        match a.as_slice() {
            ["fill", dir, mb] => child_fill(dir, mb.parse().expect("mb")),
            ["consume", dir] => child_consume(dir),
            ["open", dir] => child_open(dir),
            _ => std::process::exit(2),
        }
    }
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let mut r = Report {
        filter,
        runs: BTreeMap::new(),
    };
    println!(
        "spool throughput bench: median of {} rounds, scale {} ({} cores)",
        runs(),
        scale(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    fn w<'a>(name: &str, f: impl FnMut() -> Stat + 'a) -> Workload<'a> {
        (name.to_owned(), Box::new(f))
    }

    // Each target's workloads run round-robin, baselines beside spool (see `round_robin`).
    println!("\n-- publish 100 B, Sync=None, batches of 1,000 (against raw, SQLite, redb)");
    r.round_robin(vec![
        w("raw buffered append 100B", || raw_append(n(2_000_000), 100)),
        w("sqlite batch1000 100B (sync=NORMAL)", || {
            sqlite_insert(n(500_000), 100, 1000, "NORMAL")
        }),
        w("redb batch1000 100B", || redb_insert(n(500_000), 100, 1000)),
        w("publish_batch1000 100B sync=none", || {
            spool_publish_batch(n(2_000_000), 100, 1000, SyncPolicy::None)
        }),
    ]);
    println!("\n-- publish 100 B one at a time, Sync=None (against SQLite NORMAL)");
    r.round_robin(vec![
        w("sqlite row/txn 100B (sync=NORMAL)", || {
            sqlite_insert(n(50_000), 100, 1, "NORMAL")
        }),
        w("publish one-at-a-time 100B sync=none", || {
            spool_publish_one(n(500_000), 100, SyncPolicy::None)
        }),
    ]);
    println!("\n-- durable publish 1 KiB (against fdatasync per message and SQLite FULL)");
    // One at a time: interleaved in chunks of 50 (see `interleaved`).
    r.together(
        &[
            "raw append+fdatasync 1KiB",
            "raw overwrite+fdatasync 1KiB (preallocated)",
            "sqlite row/txn 1KiB (sync=FULL)",
            "publish one-at-a-time 1024B sync=always",
        ],
        || durable_one_interleaved(n(2_000), 1024),
    );
    // Concurrent producers: round-robin (their runs start and end with fewer producers at
    // work, so slicing them finely would understate group commit).
    r.round_robin(vec![
        w("publish 1KiB sync=always 1 producers", || {
            spool_publish_concurrent(n(2_000), 1024, 1)
        }),
        w("publish 1KiB sync=always 64 producers", || {
            spool_publish_concurrent(n(32_000), 1024, 64)
        }),
        w(
            "publish 1KiB sync=always 1 producers (steady state)",
            || spool_publish_concurrent_steady(n(2_000), 1024, 1),
        ),
        w(
            "publish 1KiB sync=always 64 producers (steady state)",
            || spool_publish_concurrent_steady(n(32_000), 1024, 64),
        ),
        // What bounds 64 producers: all 64 share each sync (see benches/FINDINGS.md).
        w(ZEROS_AHEAD, || raw_sync_writes(n(1_000), 64 * 1024, true)),
        w(ZEROED_BEFORE, || {
            raw_sync_writes(n(1_000), 64 * 1024, false)
        }),
    ]);
    println!("\n-- consume 100 B (against SQLite reading 100-row ranges)");
    r.round_robin(vec![
        w("sqlite consume 100-row ranges 100B (sync=OFF)", || {
            sqlite_consume(n(300_000), 100, "OFF")
        }),
        w("consume recv+auto-ack mif=1 100B", || {
            spool_consume_auto(n(500_000), 100, 1)
        }),
        // Issue 31: the pattern a user writes first, on a thread of its own.
        w(AUTO_HANDOFF, || spool_consume_auto_handoff(n(500_000), 100)),
    ]);
    r.round_robin(vec![
        w("sqlite consume 100-row ranges 100B (sync=FULL)", || {
            sqlite_consume(n(300_000), 100, "FULL")
        }),
        w("consume manual ack (always) mif=256 100B", || {
            spool_consume_manual(n(50_000), 100, 256)
        }),
        // Issue 31: batches of 100, each durable before the next is taken.
        w(ONE_BY_ONE_100, || {
            spool_consume_batches(n(10_000), 100, 100, Acking::OneByOne)
        }),
        w(JOIN_ALL_100, || {
            spool_consume_batches(n(50_000), 100, 100, Acking::JoinAll)
        }),
        w(ACK_ALL_100, || {
            spool_consume_batches(n(50_000), 100, 100, Acking::AckAll)
        }),
    ]);

    println!("\n-- big payloads, Sync=None, batches of 1,000 (issue 31 point 3, against raw)");
    for (size, label) in PAYLOAD_SIZES {
        r.round_robin(vec![
            w(
                &format!("payloads: raw buffered append {label}"),
                move || raw_append(payload_count(size), size),
            ),
            w(
                &format!("payloads: raw append, 64 MiB files synced behind {label}"),
                move || raw_append_synced_behind(payload_count(size), size),
            ),
            w(
                &format!("payloads: publish_batch1000 {label} sync=none"),
                move || spool_publish_batch(payload_count(size), size, 1000, SyncPolicy::None),
            ),
        ]);
    }
    // Batches of 100 × 64 KiB (6.5 MB): about one in ten crosses a 64 MiB roll.
    r.together(&[ROLL_CROSSED, ROLL_NOT_CROSSED], || {
        let (rolled, plain) = spool_batches_across_rolls(n(16_384), 64 << 10, 100);
        vec![rolled, plain]
    });

    println!("\n-- spool publish, every policy and size");
    for size in [100usize, 1024] {
        for (pname, p) in policies() {
            let name = format!("publish_batch1000 {size}B sync={pname}");
            let count = if matches!(p, SyncPolicy::Always) {
                200_000
            } else {
                2_000_000
            };
            r.run(&name, || {
                spool_publish_batch(n(count) / if size > 100 { 4 } else { 1 }, size, 1000, p)
            });
        }
        for (pname, p) in policies() {
            let name = format!("publish one-at-a-time {size}B sync={pname}");
            let count = if matches!(p, SyncPolicy::Always) {
                2_000
            } else {
                500_000
            };
            r.run(&name, || {
                spool_publish_one(n(count) / if size > 100 { 2 } else { 1 }, size, p)
            });
        }
    }
    for producers in [4usize, 16] {
        r.run(
            &format!("publish 1KiB sync=always {producers} producers"),
            || spool_publish_concurrent(n(2_000 * producers), 1024, producers),
        );
    }
    for producers in [1usize, 4, 16, 64] {
        r.run(
            &format!("publish 100B sync=always {producers} producers"),
            || spool_publish_concurrent(n(2_000 * producers.min(16)), 100, producers),
        );
    }

    println!("\n-- spool consume, every mode and size");
    for size in [100usize, 1024] {
        // 1 KiB runs use a quarter of the messages (about 2.5x the bytes of the 100 B ones).
        let scale_down = if size > 100 { 4 } else { 1 };
        let label = if size > 100 { "1KiB" } else { "100B" };
        for mif in [1usize, 256] {
            r.run(&format!("consume recv+auto-ack mif={mif} {label}"), || {
                spool_consume_auto(n(500_000) / scale_down, size, mif)
            });
        }
        r.run(
            &format!("consume manual ack (always) mif=1 {label}"),
            || spool_consume_manual(n(2_000), size, 1),
        );
        r.run(
            &format!("consume manual ack (always) mif=256 {label}"),
            || spool_consume_manual(n(50_000) / scale_down, size, 256),
        );
    }
    // Round-robin, with the machine's floor for the same pattern without spool (what its
    // scheduler and its halted CPUs allow any queue): this VM's tails come and go.
    let mut lat: Vec<Workload<'_>> = Vec::new();
    for (size, label) in [(100usize, "100B"), (1024, "1KiB")] {
        lat.push(w(
            &format!("latency publish->recv 10k/s {label} sync=none"),
            move || spool_latency(n(20_000), size, 10_000, Duration::ZERO, false),
        ));
        lat.push(w(
            &format!("latency publish->recv 10k/s {label} sync=none {BUSY_POLL}"),
            move || spool_latency(n(20_000), size, 10_000, Duration::from_millis(1), false),
        ));
    }
    // The producer spinning between sends, as this bench's producer did until 2026-11-30:
    // its CPU never idles, so every wake-up lands on the other CPU, which has halted
    // (see benches/FINDINGS.md: tens of microseconds on a virtual machine without halt
    // polling).
    lat.push(w(
        "latency publish->recv 10k/s 100B sync=none (producer spins)",
        || spool_latency(n(20_000), 100, 10_000, Duration::ZERO, true),
    ));
    lat.push(w("latency bare handoff 10k/s (consumer parks)", || {
        handoff_latency(n(20_000), 10_000, false)
    }));
    lat.push(w("latency bare handoff 10k/s (consumer spins)", || {
        handoff_latency(n(20_000), 10_000, true)
    }));
    lat.push(w(TOKIO_HANDOFF, || {
        tokio_handoff_latency(n(20_000), 10_000)
    }));
    r.round_robin(lat);

    println!("\n-- open after unclean stop");
    open_after_crash(&mut r);

    println!("\n-- ratios (issue 5 targets): median of the per-round ratios (lowest-highest)");
    r.ratio(
        "publish_batch1000 100B none / raw buffered",
        "publish_batch1000 100B sync=none",
        "raw buffered append 100B",
        0.5,
    );
    r.ratio(
        "publish_batch1000 100B none / sqlite batch1000",
        "publish_batch1000 100B sync=none",
        "sqlite batch1000 100B (sync=NORMAL)",
        2.5,
    );
    r.ratio(
        "publish_batch1000 100B none / redb batch1000",
        "publish_batch1000 100B sync=none",
        "redb batch1000 100B",
        4.5,
    );
    // `scale * a / b` within each round: the median and the range, as `ratio` prints them.
    let per_round = |what: &str, a: &str, b: &str, scale: f64| {
        let (Some(a), Some(b)) = (r.runs.get(a), r.runs.get(b)) else {
            return;
        };
        let mut x: Vec<f64> = a
            .iter()
            .zip(b)
            .map(|(a, b)| scale * a.msgs_per_s / b.msgs_per_s)
            .collect();
        if x.is_empty() {
            return;
        }
        x.sort_by(f64::total_cmp);
        println!(
            "{what:<64} {:>7.2}x  ({:.2}x-{:.2}x)",
            x[x.len() / 2],
            x[0],
            x[x.len() - 1]
        );
    };
    r.ratio(
        "publish one 100B none / sqlite row/txn NORMAL",
        "publish one-at-a-time 100B sync=none",
        "sqlite row/txn 100B (sync=NORMAL)",
        10.0,
    );
    r.ratio(
        "publish one 1KiB always / sqlite row/txn FULL",
        "publish one-at-a-time 1024B sync=always",
        "sqlite row/txn 1KiB (sync=FULL)",
        1.2,
    );
    r.ratio(
        "publish one 1KiB always / raw append+fdatasync",
        "publish one-at-a-time 1024B sync=always",
        "raw append+fdatasync 1KiB",
        1.0,
    );
    // The floor under both: a bare overwrite + `fdatasync` (no FUA on this disk, so
    // nothing durable is cheaper). Informational, no target.
    per_round(
        "  publish one 1KiB always / raw overwrite+fdatasync (floor)",
        "publish one-at-a-time 1024B sync=always",
        "raw overwrite+fdatasync 1KiB (preallocated)",
        1.0,
    );
    per_round(
        "  ... the floor / sqlite row/txn FULL",
        "raw overwrite+fdatasync 1KiB (preallocated)",
        "sqlite row/txn 1KiB (sync=FULL)",
        1.0,
    );
    r.ratio(
        "64 producers always / 1 producer always",
        "publish 1KiB sync=always 64 producers",
        "publish 1KiB sync=always 1 producers",
        20.0,
    );
    r.ratio(
        "64 producers always / 1 producer always (steady state)",
        "publish 1KiB sync=always 64 producers (steady state)",
        "publish 1KiB sync=always 1 producers (steady state)",
        20.0,
    );
    // The sync thread waits for the publishers it woke to publish again, so one sync of
    // 64 KiB covers all 64 producers: the disk allows 64 publishes per such sync. Not
    // reachable: while the thread waits for them the disk is idle.
    const ZEROS_AHEAD: &str =
        "raw 64KiB overwrite+fdatasync (zeros 1MiB ahead) 1KiB sync=always bound";
    const ZEROED_BEFORE: &str =
        "raw 64KiB overwrite+fdatasync (zeroed before) 1KiB sync=always bound";
    let one = "publish 1KiB sync=always 1 producers";
    per_round(
        "  bound: 64 x raw 64 KiB syncs (zeros ahead) / 1 producer",
        ZEROS_AHEAD,
        one,
        64.0,
    );
    per_round(
        "  ... if the file were zeroed before",
        ZEROED_BEFORE,
        one,
        64.0,
    );
    // How close spool comes to the bound of its kind of file (1.0 = the raw loop's syncs).
    per_round(
        "  64 producers, fresh topic / bound (zeros ahead)",
        "publish 1KiB sync=always 64 producers",
        ZEROS_AHEAD,
        1.0 / 64.0,
    );
    per_round(
        "  64 producers, steady state / bound (zeroed before)",
        "publish 1KiB sync=always 64 producers (steady state)",
        ZEROED_BEFORE,
        1.0 / 64.0,
    );
    r.ratio(
        "consume auto-ack / sqlite ranges (no fsync)",
        "consume recv+auto-ack mif=1 100B",
        "sqlite consume 100-row ranges 100B (sync=OFF)",
        1.0,
    );
    r.ratio(
        "consume auto-ack, 100 at a time to another thread / sqlite ranges",
        AUTO_HANDOFF,
        "sqlite consume 100-row ranges 100B (sync=OFF)",
        2.0,
    );
    r.ratio(
        "consume manual mif=256 always / sqlite ranges FULL",
        "consume manual ack (always) mif=256 100B",
        "sqlite consume 100-row ranges 100B (sync=FULL)",
        1.5,
    );
    r.ratio(
        "consume 100-row batches, acks one by one / sqlite ranges FULL",
        ONE_BY_ONE_100,
        "sqlite consume 100-row ranges 100B (sync=FULL)",
        2.0,
    );
    for (size, label) in PAYLOAD_SIZES {
        r.ratio(
            &format!("payloads: publish_batch1000 {label} none / raw buffered"),
            &format!("payloads: publish_batch1000 {label} sync=none"),
            &format!("payloads: raw buffered append {label}"),
            if size < 256 { 0.6 } else { 0.8 },
        );
        r.ratio(
            &format!("payloads: publish_batch1000 {label} none / raw synced behind"),
            &format!("payloads: publish_batch1000 {label} sync=none"),
            &format!("payloads: raw append, 64 MiB files synced behind {label}"),
            if size < 256 { 0.6 } else { 0.8 },
        );
    }
    r.ratio(
        "consume 100-row batches, join_all acks / sqlite ranges FULL",
        JOIN_ALL_100,
        "sqlite consume 100-row ranges 100B (sync=FULL)",
        2.0,
    );
    r.ratio(
        "consume 100-row batches, recv_batch+ack_all / sqlite ranges FULL",
        ACK_ALL_100,
        "sqlite consume 100-row ranges 100B (sync=FULL)",
        2.0,
    );
    for label in ["100B", "1KiB"] {
        for how in ["", BUSY_POLL] {
            let name = format!("latency publish->recv 10k/s {label} sync=none {how}");
            if let (Some(l), Some((lo, hi))) =
                (r.median(name.trim_end()), r.p99_range(name.trim_end()))
            {
                let verdict = if l.p99_us < 100.0 { "meets" } else { "MISSES" };
                println!(
                    "  publish->recv {label} p99 at 10k/s, producer sleeps {how:<9}: {:.1} µs ({lo:.1}-{hi:.1}{}; target < 100 µs: {verdict})",
                    l.p99_us,
                    steal_note(&l)
                );
            }
        }
    }
    for how in ["parks", "spins"] {
        if let Some(l) = r.median(&format!("latency bare handoff 10k/s (consumer {how})")) {
            println!(
                "  ... the machine's floor, no spool (bare handoff, consumer {how}): p50 {:.1} µs, p99 {:.1} µs{}",
                l.p50_us,
                l.p99_us,
                steal_note(&l)
            );
        }
    }
    if let Some(l) = r.median(TOKIO_HANDOFF) {
        println!(
            "  ... the floor of a parked recv, no spool (tokio Notify on the same runtime): p50 {:.1} µs, p99 {:.1} µs{}",
            l.p50_us,
            l.p99_us,
            steal_note(&l)
        );
    }
}
