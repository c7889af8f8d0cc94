//! How spool's figures move as an application grows (issue 31 point 7). Four curves, each
//! point measured with the pattern a user writes first:
//! - topics (1 → 5,000): one producer publishing 100 B one at a time round-robin over the
//!   topics under `Sync=None`, beside a raw `pwrite` round-robin over as many files; and
//!   64 concurrent publishers of 1 KiB spread over the topics under `Sync=Always`;
//! - groups (1 → 1,000) on one topic: one auto-ack `recv` loop per group, each task
//!   reading the whole topic; the deliveries of all groups together per second;
//! - payload (16 B → 1 MiB): `publish_batch` of up to 1,000 under `Sync=None`, in MB/s,
//!   beside a raw buffered append of the same records;
//! - consumers per group (1 → 32): manual-ack consumers of one group, each a task on one
//!   current-thread runtime, acks not awaited; the total rate and the least and most
//!   served consumer's share of the records (1 = a fair share).
//!
//! `cargo bench --bench curves` prints each point as an absolute figure and as a ratio to
//! its curve's smallest point, then a table of the ratios, then draws the curves into one
//! SVG of four panels: `$SPOOL_BENCH_PLOT` (relative to the package root), or
//! `curves.svg` under `$CARGO_TARGET_DIR` (else `target/`).
//! `cargo bench --bench curves -- topics` runs only the curves whose name contains `topics`.
//! Each point runs `SPOOL_BENCH_RUNS` times (default 3) and its median is kept.
//! `SPOOL_BENCH_SCALE` scales every count and every timed window (default 1: about three
//! minutes on 2 cores). Speed is measured here, never asserted.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use plotters::coord::Shift;
use plotters::prelude::*;
use spool::{Headers, SyncPolicy};

mod common;
use common::{fill, n, open, raw_append, rt, runs_or, scale};

fn runs() -> usize {
    // Three: enough to drop one slow round of a shared machine; the whole bench then
    // takes about three minutes on 2 cores.
    runs_or(3)
}

/// How long a timed point publishes: one second at scale 1.
fn window() -> Duration {
    Duration::from_secs_f64(scale().max(0.05))
}

/// One figure of a series at one point, and what is printed beside it.
#[derive(Clone, Default)]
struct Reading {
    value: f64,
    note: String,
}

impl Reading {
    fn of(value: f64) -> Reading {
        Reading {
            value,
            note: String::new(),
        }
    }
}

struct Series {
    name: &'static str,
    unit: &'static str,
    points: Vec<(usize, Reading)>,
}

struct Curve {
    title: &'static str,
    x_name: &'static str,
    x_fmt: fn(usize) -> String,
    series: Vec<Series>,
}

impl Curve {
    fn new(
        title: &'static str,
        x_name: &'static str,
        x_fmt: fn(usize) -> String,
        series: &[(&'static str, &'static str)],
    ) -> Curve {
        println!("\n-- {title}");
        let series = series
            .iter()
            .map(|&(name, unit)| Series {
                name,
                unit,
                points: Vec::new(),
            })
            .collect();
        Curve {
            title,
            x_name,
            x_fmt,
            series,
        }
    }

    /// Runs `f` `runs()` times at `x` (it returns one reading per series), keeps each
    /// series' median reading and prints it with its ratio to the series' first point.
    fn measure(&mut self, x: usize, mut f: impl FnMut() -> Vec<Reading>) {
        let rounds: Vec<Vec<Reading>> = (0..runs()).map(|_| f()).collect();
        let label = format!("{} {}", (self.x_fmt)(x), self.x_name);
        for (i, s) in self.series.iter_mut().enumerate() {
            let mut r: Vec<Reading> = rounds.iter().map(|round| round[i].clone()).collect();
            r.sort_by(|a, b| a.value.total_cmp(&b.value));
            let m = r.swap_remove(r.len() / 2);
            let first = s.points.first().map_or(m.value, |p| p.1.value);
            println!(
                "  {:<54} {label:>14} {:>10} {:<7} {:>8}  {}",
                s.name,
                value(m.value, s.unit),
                s.unit,
                ratio(m.value / first),
                m.note
            );
            s.points.push((x, m));
        }
    }

    /// Each series' points as `absolute (ratio)`, a Markdown table.
    fn print_table(&self) {
        let Some(first) = self.series.first() else {
            return;
        };
        let xs: Vec<String> = first.points.iter().map(|p| (self.x_fmt)(p.0)).collect();
        println!("\n{} ({}):\n", self.title, self.x_name);
        println!("| series | {} |", xs.join(" | "));
        println!("| --- |{}", " --- |".repeat(xs.len()));
        for s in &self.series {
            let base = s.points.first().map_or(1.0, |p| p.1.value);
            let cells: Vec<String> = s
                .points
                .iter()
                .map(|(_, r)| format!("{} ({})", value(r.value, s.unit), ratio(r.value / base)))
                .collect();
            println!("| {}, {} | {} |", s.name, s.unit, cells.join(" | "));
        }
    }
}

/// `v` for printing in `unit`: rates with k and M, shares with two decimals.
fn value(v: f64, unit: &str) -> String {
    match unit {
        "msg/s" if v >= 1e6 => format!("{:.2} M", v / 1e6),
        "msg/s" if v >= 1e3 => format!("{:.1} k", v / 1e3),
        "msg/s" | "MB/s" => format!("{v:.0}"),
        _ => format!("{v:.2}"),
    }
}

/// A ratio with two significant digits or more: 0.0031x, 0.52x, 1.30x, 40x.
fn ratio(y: f64) -> String {
    if y >= 10.0 {
        return format!("{y:.0}x");
    }
    let decimals = (1.0 - y.log10().floor()).clamp(2.0, 6.0) as usize;
    format!("{y:.decimals$}x")
}

/// 5000 → "5,000".
fn count(x: usize) -> String {
    let s = x.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// 65536 → "64 KiB".
fn size(x: usize) -> String {
    match x {
        x if x >= 1 << 20 && x.is_multiple_of(1 << 20) => format!("{} MiB", x >> 20),
        x if x >= 1 << 10 && x.is_multiple_of(1 << 10) => format!("{} KiB", x >> 10),
        x => format!("{x} B"),
    }
}

// ---------------------------------------------------------------- topics

const TOPICS: [usize; 5] = [1, 10, 100, 1_000, 5_000];
const PUBLISHERS: usize = 64;

fn topics_curve() -> Curve {
    let mut c = Curve::new(
        "Topics",
        "topics",
        count,
        &[
            ("Sync=None, one producer round-robin, 100 B", "msg/s"),
            ("raw pwrite round-robin over as many files, 100 B", "msg/s"),
            ("Sync=Always, 64 publishers over the topics, 1 KiB", "msg/s"),
        ],
    );
    for topics in TOPICS {
        let dir = tempfile::tempdir().expect("tempdir");
        let names: Vec<String> = (0..topics).map(|i| format!("t{i}")).collect();
        let t = Instant::now();
        create_topics(dir.path(), &names);
        println!(
            "  ({} topics created in {:.1} s, untimed)",
            count(topics),
            t.elapsed().as_secs_f64()
        );
        let mut files = RawFiles::new(topics);
        c.measure(topics, || {
            let none = spool_round_robin(dir.path(), &names);
            let raw = files.round_robin();
            let always = spool_spread(dir.path(), &names);
            let note = format!("{} the raw round-robin", ratio(none / raw));
            vec![
                Reading { value: none, note },
                Reading::of(raw),
                Reading::of(always),
            ]
        });
    }
    c
}

/// Creates each topic of `names` by publishing one 100 B record to it, from
/// `PUBLISHERS` tasks at once (creations then share what they can).
fn create_topics(dir: &Path, names: &[String]) {
    let mq = open(dir, SyncPolicy::None);
    let rt = rt();
    let names = Arc::new(names.to_vec());
    rt.block_on(async {
        let tasks: Vec<_> = (0..PUBLISHERS.min(names.len()))
            .map(|p| {
                let (mq, names) = (mq.clone(), names.clone());
                tokio::spawn(async move {
                    for topic in names.iter().skip(p).step_by(PUBLISHERS) {
                        mq.publish(topic, vec![7u8; 100], &Headers::new())
                            .await
                            .expect("publish");
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("creator");
        }
    });
    rt.block_on(mq.close()).expect("close");
}

/// msg/s of one producer publishing 100 B one at a time to `names` in turn under
/// `Sync=None`, over `window()`.
fn spool_round_robin(dir: &Path, names: &[String]) -> f64 {
    let mq = open(dir, SyncPolicy::None);
    let rt = rt();
    let payload = bytes::Bytes::from(vec![7u8; 100]);
    let h = Headers::new();
    let start = Instant::now();
    let done = rt.block_on(async {
        let mut i = 0;
        while start.elapsed() < window() {
            for _ in 0..64 {
                let topic = &names[i % names.len()];
                mq.publish(topic, payload.clone(), &h)
                    .await
                    .expect("publish");
                i += 1;
            }
        }
        i
    });
    let rate = done as f64 / start.elapsed().as_secs_f64();
    rt.block_on(mq.close()).expect("close");
    rate
}

/// msg/s of `PUBLISHERS` tasks publishing 1 KiB under `Sync=Always`, publisher `p`'s
/// `k`-th publish to topic `(p + PUBLISHERS * k) % topics`.
fn spool_spread(dir: &Path, names: &[String]) -> f64 {
    let mq = open(dir, SyncPolicy::Always);
    let rt = rt();
    let rate = common::publish_spread(&rt, &mq, &Arc::new(names.to_vec()), window());
    rt.block_on(mq.close()).expect("close");
    rate
}

/// The raw baseline of the round-robin: one file per topic, all open, each appended to
/// by a `pwrite` of a length-prefixed crc'd 100 B record.
struct RawFiles {
    _dir: tempfile::TempDir,
    files: Vec<(std::fs::File, u64)>,
}

impl RawFiles {
    fn new(count: usize) -> RawFiles {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = (0..count)
            .map(|i| {
                let f = std::fs::File::create(dir.path().join(format!("{i}.log")))
                    .expect("create a raw file (raise `ulimit -n`)");
                (f, 0)
            })
            .collect();
        RawFiles { _dir: dir, files }
    }

    /// msg/s of the round-robin over `window()`.
    fn round_robin(&mut self) -> f64 {
        use std::os::unix::fs::FileExt;
        let payload = [7u8; 100];
        let mut rec = Vec::with_capacity(108);
        rec.extend_from_slice(&100u32.to_le_bytes());
        rec.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        rec.extend_from_slice(&payload);
        let start = Instant::now();
        let mut i = 0;
        while start.elapsed() < window() {
            for _ in 0..64 {
                let k = i % self.files.len();
                let (f, at) = &mut self.files[k];
                f.write_all_at(&rec, *at).expect("pwrite");
                *at += rec.len() as u64;
                i += 1;
            }
        }
        i as f64 / start.elapsed().as_secs_f64()
    }
}

/// Raises the soft limit on open files to the hard one: the raw baseline keeps 5,000
/// files open at once (spool itself keeps at most 512).
fn raise_open_files_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    l.current = l.maximum;
    if let Err(e) = setrlimit(Resource::Nofile, l) {
        eprintln!("could not raise the limit on open files: {e}");
    }
}

// ---------------------------------------------------------------- groups

const GROUPS: [usize; 4] = [1, 10, 100, 1_000];

fn groups_curve() -> Curve {
    let mut c = Curve::new(
        "Groups",
        "groups",
        count,
        &[("auto-ack recv loop per group, 100 B, all groups", "msg/s")],
    );
    for groups in GROUPS {
        // About 2,000,000 deliveries in all, at least 1,000 records per group.
        let records = (n(2_000_000) / groups).max(1_000);
        c.measure(groups, || vec![consume_groups(groups, records)]);
    }
    c
}

/// Deliveries per second of `groups` auto-ack consumers (a task each, on `rt()`), each
/// of its own group, each reading all `records` of one topic.
fn consume_groups(groups: usize, records: usize) -> Reading {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = rt();
    let mq = open(dir.path(), SyncPolicy::None);
    fill(&mq, &rt, "bench", records, 100);
    let consumers: Vec<spool::Consumer> = (0..groups)
        .map(|g| {
            mq.consumer("bench", &format!("g{g}"))
                .build()
                .expect("consumer")
        })
        .collect();
    let start = Instant::now();
    rt.block_on(async {
        let tasks: Vec<_> = consumers
            .into_iter()
            .map(|mut c| {
                tokio::spawn(async move {
                    for _ in 0..records {
                        let d = c.recv().await.expect("recv");
                        std::hint::black_box(d.payload());
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("consumer");
        }
    });
    let secs = start.elapsed().as_secs_f64();
    rt.block_on(mq.close()).expect("close");
    Reading {
        value: (groups * records) as f64 / secs,
        note: format!("{} records per group, {:.2} s", count(records), secs),
    }
}

// ---------------------------------------------------------------- payload

const PAYLOADS: [usize; 5] = [16, 256, 4 << 10, 64 << 10, 1 << 20];

/// Records of `size` bytes at one point: 256 MiB at scale 1, at most 2 M records.
fn payload_records(size: usize) -> usize {
    (n(256 << 20) / size).clamp(10, n(2_000_000))
}

fn payload_curve() -> Curve {
    let mut c = Curve::new(
        "Payload",
        "payload",
        size,
        &[
            ("publish_batch of up to 1,000, Sync=None", "MB/s"),
            ("raw buffered append of the same records", "MB/s"),
        ],
    );
    for bytes in PAYLOADS {
        let records = payload_records(bytes);
        c.measure(bytes, || {
            let dir = tempfile::tempdir().expect("tempdir");
            let rt = rt();
            let mq = open(dir.path(), SyncPolicy::None);
            let start = Instant::now();
            fill(&mq, &rt, "bench", records, bytes);
            let spool = (records * bytes) as f64 / start.elapsed().as_secs_f64() / 1e6;
            rt.block_on(mq.close()).expect("close");
            drop(dir);
            let raw = raw_append(records, bytes).mb_per_s;
            let note = format!("{} raw; {} records", ratio(spool / raw), count(records));
            vec![Reading { value: spool, note }, Reading::of(raw)]
        });
    }
    c
}

// ---------------------------------------------------------------- consumers

const CONSUMERS: [usize; 6] = [1, 2, 4, 8, 16, 32];

fn consumers_curve() -> Curve {
    let mut c = Curve::new(
        "Consumers per group",
        "consumers",
        count,
        &[
            ("manual ack, one runtime, acks not awaited, 100 B", "msg/s"),
            ("least-served consumer, share of a fair share", "share"),
            ("most-served consumer, share of a fair share", "share"),
        ],
    );
    let records = n(1_000_000);
    for consumers in CONSUMERS {
        c.measure(consumers, || share_group(consumers, records));
    }
    c
}

/// `consumers` manual-ack consumers of one group, each a task on one current-thread
/// runtime, taking `records` between them; each ack is made and not awaited.
/// Returns the total rate, the lowest and the highest share.
fn share_group(consumers: usize, records: usize) -> Vec<Reading> {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mq = open(dir.path(), SyncPolicy::None);
    fill(&mq, &rt, "bench", records, 100);
    let taken = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(Mutex::new(None));
    let start = Instant::now();
    let counts: Vec<usize> = rt.block_on(async {
        let tasks: Vec<_> = (0..consumers)
            .map(|_| {
                let mut c = mq
                    .consumer("bench", "g")
                    .manual_ack()
                    .max_in_flight(64)
                    .build()
                    .expect("consumer");
                let (taken, finished) = (taken.clone(), finished.clone());
                tokio::spawn(async move {
                    let mut mine = 0;
                    while taken.load(Ordering::Relaxed) < records {
                        match c.recv_timeout(Duration::from_millis(50)).await {
                            Ok(Some(d)) => {
                                drop(d.ack());
                                mine += 1;
                                if taken.fetch_add(1, Ordering::Relaxed) + 1 == records {
                                    *finished.lock().expect("lock") = Some(Instant::now());
                                }
                            }
                            Ok(None) => {}
                            Err(e) => panic!("recv: {e}"),
                        }
                    }
                    mine
                })
            })
            .collect();
        let mut counts = Vec::new();
        for t in tasks {
            counts.push(t.await.expect("consumer"));
        }
        counts
    });
    let end = finished.lock().expect("lock").unwrap_or_else(Instant::now);
    let secs = (end - start).as_secs_f64();
    rt.block_on(mq.close()).expect("close");
    let fair = records as f64 / consumers as f64;
    let lo = *counts.iter().min().unwrap_or(&0) as f64 / fair;
    let hi = *counts.iter().max().unwrap_or(&0) as f64 / fair;
    vec![
        Reading {
            value: records as f64 / secs,
            note: format!("shares {lo:.2}-{hi:.2}"),
        },
        Reading::of(lo),
        Reading::of(hi),
    ]
}

// ---------------------------------------------------------------- the plot

/// `$SPOOL_BENCH_PLOT`, else `curves.svg` under `$CARGO_TARGET_DIR` or `target/`.
fn plot_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SPOOL_BENCH_PLOT") {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into());
    PathBuf::from(target).join("curves.svg")
}

type Plot<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// Draws each curve in a panel of its own, two by two.
fn draw(curves: &[Curve], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1200, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "spool as it grows (issue 31 point 7): each point / its curve's smallest",
        ("sans-serif", 20),
    )?;
    for (area, curve) in root.split_evenly((2, 2)).iter().zip(curves) {
        panel(area, curve)?;
    }
    root.present()?;
    Ok(())
}

/// One curve: x and the ratio to the first point, both on log scales.
fn panel(area: &Plot<'_>, c: &Curve) -> Result<(), Box<dyn std::error::Error>> {
    let ratios: Vec<Vec<(f64, f64)>> = c
        .series
        .iter()
        .map(|s| {
            let base = s.points.first().map_or(1.0, |p| p.1.value);
            s.points
                .iter()
                .map(|(x, r)| (*x as f64, (r.value / base).max(1e-3)))
                .collect()
        })
        .collect();
    let all = || ratios.iter().flatten();
    let (x0, x1) = all().fold((f64::MAX, 0f64), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (y0, y1) = all().fold((1f64, 1f64), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let (y0, y1) = (y0 / 1.6, y1 * 1.6);
    // Room below the lowest point for the legend: a quarter of the panel's height.
    let y0 = y0 / (y1 / y0).powf(1.0 / 3.0);
    let mut chart = ChartBuilder::on(area)
        .caption(c.title, ("sans-serif", 18))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (x0 / 1.5..x1 * 1.5)
                .log_scale()
                .with_key_points(ratios[0].iter().map(|p| p.0).collect()),
            (y0..y1).log_scale(),
        )?;
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .x_desc(c.x_name)
        .y_desc("ratio to the smallest point")
        .x_label_formatter(&|x| (c.x_fmt)(x.round() as usize))
        .y_label_formatter(&|y| ratio(*y))
        .draw()?;
    for (i, (s, pts)) in c.series.iter().zip(&ratios).enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let base = s.points.first().map_or(0.0, |p| p.1.value);
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(format!(
                "{} (1 = {} {})",
                s.name,
                value(base, s.unit),
                s.unit
            ))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .draw()?;
    Ok(())
}

/// Measures one curve.
type CurveFn = fn() -> Curve;

fn main() {
    raise_open_files_limit();
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let wants = |name: &str| {
        filter
            .as_deref()
            .is_none_or(|f| name.to_lowercase().contains(&f.to_lowercase()))
    };
    println!(
        "spool curves bench: median of {} runs, scale {}, window {:.2} s ({} cores)",
        runs(),
        scale(),
        window().as_secs_f64(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let start = Instant::now();
    let mut curves = Vec::new();
    let all: [(&str, CurveFn); 4] = [
        ("topics", topics_curve),
        ("groups", groups_curve),
        ("payload", payload_curve),
        ("consumers", consumers_curve),
    ];
    for (name, curve) in all {
        if wants(name) {
            curves.push(curve());
        }
    }
    println!("\n-- ratios to each curve's smallest point");
    for c in &curves {
        c.print_table();
    }
    let path = plot_path();
    draw(&curves, &path).expect("plot");
    println!("\nplot: {}", path.display());
    println!("took {:.0} s", start.elapsed().as_secs_f64());
}
