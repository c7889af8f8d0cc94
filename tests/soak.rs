//! Guards load without loss: every message acked or dead-lettered exactly once, flat memory.
//!
//! Exact accounting: none missing, none delivered again after its ack returned, every
//! dead-letter copy carrying its payload and original offset; peak RSS is reported.
//!
//! `soak_short` (20,000 messages) runs in the default suite; `soak_long` is the real soak:
//! `cargo test --release --test soak -- --ignored` (size from `SPOOL_SOAK_MESSAGES`,
//! default 2,000,000). Both print duration, throughput and peak RSS on stderr.
//!
//! Durability policy: the long soak runs with `Sync=None`. It measures accounting and
//! memory under load, not power-loss durability (that is `power_loss.rs`), and `None` keeps
//! publishes from waiting on fsyncs so that millions of messages fit in minutes; acks and
//! nacks still commit the catalog durably under every policy, so the consumer side does its
//! real work. The short version runs with `Sync=Always` because it stays fast.
//!
//! Workload: 4 producer tasks claim ids from a shared counter and publish them one at a
//! time or in batches of 2..=64 (every message carries a unique `message-id`, so the
//! de-duplication window is full and working). 4 consumer tasks of one group (manual ack,
//! `max_in_flight` 64) check every delivery against its id, then ack it or nack it: 5% of
//! deliveries at random, and every delivery of a "poison" id (1 in 997), so with
//! `Max Delivery Attempts=3` some messages are dead-lettered in any run.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spool::{Headers, Spool};

/// Counts live heap bytes, so that a leak (live bytes grow) can be told from allocator
/// fragmentation (RSS grows, live bytes do not).
struct CountingAlloc;

static LIVE_HEAP: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; it only counts.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        LIVE_HEAP.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        LIVE_HEAP.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        // SAFETY: the caller's contract is passed on unchanged.
        let p = unsafe { std::alloc::System.realloc(ptr, layout, new) };
        if !p.is_null() {
            LIVE_HEAP.fetch_add(new as u64, Ordering::Relaxed);
            LIVE_HEAP.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn live_heap() -> u64 {
    LIVE_HEAP.load(Ordering::Relaxed)
}

const TOPIC: &str = "soak";
const GROUP: &str = "soak-workers";
const DLQ: &str = "soak.dlq";
const PRODUCERS: usize = 4;
const CONSUMERS: usize = 4;
const MAX_IN_FLIGHT: usize = 64;
const MAX_ATTEMPTS: u32 = 3;
const NACK_PERCENT: u64 = 5;
const POISON_EVERY: u64 = 997;
/// Offsets are recorded as `offset + 1`; 0 means "not yet".
const UNSET: u64 = 0;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn soak_short() {
    run(20_000, "Sync=Always").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the long soak: cargo test --release --test soak -- --ignored (SPOOL_SOAK_MESSAGES)"]
async fn soak_long() {
    let n = std::env::var("SPOOL_SOAK_MESSAGES")
        .ok()
        .map(|v| {
            v.replace('_', "")
                .parse()
                .expect("SPOOL_SOAK_MESSAGES: a number")
        })
        .unwrap_or(2_000_000);
    run(n, "Sync=None").await;
}

fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// The payload of message `id`: the id, then filler derived from it (8..=103 bytes more).
fn payload_of(id: u64) -> Vec<u8> {
    let mut p = id.to_le_bytes().to_vec();
    let filler = 8 + (id % 96) as usize;
    p.extend((0..filler).map(|i| (id as usize).wrapping_mul(31).wrapping_add(i) as u8));
    p
}

fn id_of(payload: &[u8]) -> u64 {
    u64::from_le_bytes(payload[..8].try_into().expect("an id"))
}

fn message_id(id: u64) -> String {
    format!("soak-{id}")
}

fn headers_of(id: u64) -> Headers {
    let mut h = Headers::new();
    h.insert("message-id".into(), message_id(id));
    h
}

/// `(VmRSS, VmHWM)` of this process in bytes.
fn rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// What every task records, preallocated so that the bookkeeping does not grow with time.
struct Ledger {
    n: u64,
    /// `offset + 1` once the publish returned.
    offset: Vec<AtomicU64>,
    /// `offset + 1` of the first delivery.
    delivered_at: Vec<AtomicU64>,
    /// Nacks started (counted before the nack is sent, so a redelivery never outruns it).
    nacks: Vec<AtomicU8>,
    /// Acks that returned `Ok`.
    acked: Vec<AtomicU8>,
    /// Nacks that returned `dead_lettered: true`.
    dead: Vec<AtomicU8>,
    /// Acked plus dead-lettered.
    finished: AtomicU64,
    published: AtomicU64,
    deliveries: AtomicU64,
    violations: Mutex<Vec<String>>,
    violation_count: AtomicU32,
}

impl Ledger {
    fn new(n: u64) -> Ledger {
        let v64 = || (0..n).map(|_| AtomicU64::new(UNSET)).collect();
        let v8 = || (0..n).map(|_| AtomicU8::new(0)).collect();
        Ledger {
            n,
            offset: v64(),
            delivered_at: v64(),
            nacks: v8(),
            acked: v8(),
            dead: v8(),
            finished: AtomicU64::new(0),
            published: AtomicU64::new(0),
            deliveries: AtomicU64::new(0),
            violations: Mutex::new(Vec::new()),
            violation_count: AtomicU32::new(0),
        }
    }

    /// Records a broken promise (kept short: the first 20 are shown).
    fn violation(&self, what: String) {
        if self.violation_count.fetch_add(1, Ordering::Relaxed) < 20 {
            self.violations.lock().expect("lock").push(what);
        }
    }
}

async fn produce(mq: Spool, ledger: Arc<Ledger>, next_id: Arc<AtomicU64>, seed: u64) {
    let mut rand = rng(seed);
    loop {
        let want = if rand().is_multiple_of(2) {
            1
        } else {
            2 + rand() % 63
        };
        let first = next_id.fetch_add(want, Ordering::Relaxed);
        if first >= ledger.n {
            return;
        }
        let ids: Vec<u64> = (first..(first + want).min(ledger.n)).collect();
        let offsets = if ids.len() == 1 {
            let id = ids[0];
            vec![
                mq.publish(TOPIC, payload_of(id), &headers_of(id))
                    .await
                    .expect("publish"),
            ]
        } else {
            let batch = ids
                .iter()
                .map(|&id| (payload_of(id), headers_of(id)))
                .collect();
            mq.publish_batch(TOPIC, batch).await.expect("publish_batch")
        };
        assert_eq!(offsets.len(), ids.len());
        for (&id, &o) in ids.iter().zip(&offsets) {
            ledger.offset[id as usize].store(o + 1, Ordering::Release);
        }
        ledger
            .published
            .fetch_add(ids.len() as u64, Ordering::Relaxed);
    }
}

async fn consume(mq: Spool, ledger: Arc<Ledger>, done: Arc<AtomicBool>, seed: u64) {
    let mut rand = rng(seed);
    let mut consumer = mq
        .consumer(TOPIC, GROUP)
        .manual_ack()
        .max_in_flight(MAX_IN_FLIGHT)
        .build()
        .expect("build");
    let mut tasks = tokio::task::JoinSet::new();
    while !done.load(Ordering::Acquire) {
        while let Some(r) = tasks.try_join_next() {
            r.expect("an ack or nack task panicked");
        }
        let d = match consumer.recv_timeout(Duration::from_millis(20)).await {
            Ok(Some(d)) => d,
            Ok(None) => continue,
            Err(e) => panic!("recv: {e}"),
        };
        ledger.deliveries.fetch_add(1, Ordering::Relaxed);
        let id = id_of(d.payload());
        let i = id as usize;
        if id >= ledger.n || d.payload()[..] != payload_of(id)[..] {
            ledger.violation(format!("offset {}: payload of no message", d.offset()));
            continue;
        }
        if d.headers().get("message-id") != Some(&message_id(id)) {
            ledger.violation(format!("id {id}: headers {:?}", d.headers()));
        }
        let first = ledger.delivered_at[i].swap(d.offset() + 1, Ordering::AcqRel);
        if first != UNSET && first != d.offset() + 1 {
            ledger.violation(format!(
                "id {id} delivered at offsets {} and {}",
                first - 1,
                d.offset()
            ));
        }
        if ledger.acked[i].load(Ordering::Acquire) > 0 {
            ledger.violation(format!("id {id} delivered again after its ack returned"));
        }
        if ledger.dead[i].load(Ordering::Acquire) > 0 {
            ledger.violation(format!(
                "id {id} delivered again after it was dead-lettered"
            ));
        }
        let nacked = u32::from(ledger.nacks[i].load(Ordering::Acquire));
        if d.attempt() != nacked + 1 {
            ledger.violation(format!(
                "id {id}: attempt {} after {nacked} nacks",
                d.attempt()
            ));
        }
        let nack = id.is_multiple_of(POISON_EVERY) || rand() % 100 < NACK_PERCENT;
        let ledger = ledger.clone();
        if nack {
            let n = u32::from(ledger.nacks[i].fetch_add(1, Ordering::AcqRel)) + 1;
            tasks.spawn(async move {
                let r = d.nack("soak: random failure").await.expect("nack");
                if r.dead_lettered != (n >= MAX_ATTEMPTS) || r.delivery_attempt != n {
                    ledger.violation(format!("id {id}: nack {n} returned {r:?}"));
                }
                if r.dead_lettered {
                    ledger.dead[i].fetch_add(1, Ordering::AcqRel);
                    ledger.finished.fetch_add(1, Ordering::AcqRel);
                }
            });
        } else {
            tasks.spawn(async move {
                d.ack().await.expect("ack");
                if ledger.acked[i].fetch_add(1, Ordering::AcqRel) > 0 {
                    ledger.violation(format!("id {id} acked twice"));
                }
                ledger.finished.fetch_add(1, Ordering::AcqRel);
            });
        }
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("an ack or nack task panicked");
    }
    consumer.close().await.expect("consumer close");
}

async fn run(n: u64, sync: &str) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let conn = format!(
        "Data Source={};{sync};Segment Bytes={};Max Delivery Attempts={MAX_ATTEMPTS}",
        tmp.path().display(),
        8 << 20
    );
    let ledger = Arc::new(Ledger::new(n));
    let mq = Spool::open(&conn).expect("open");
    let (rss_start, _) = rss();
    let started = Instant::now();
    let done = Arc::new(AtomicBool::new(false));
    let next_id = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for p in 0..PRODUCERS {
        let f = produce(mq.clone(), ledger.clone(), next_id.clone(), 100 + p as u64);
        tasks.push(tokio::spawn(f));
    }
    for c in 0..CONSUMERS {
        let f = consume(mq.clone(), ledger.clone(), done.clone(), 200 + c as u64);
        tasks.push(tokio::spawn(f));
    }

    // Watch progress and memory; fail on a stall instead of hanging.
    let warm_at = (n / 20).max(1);
    let mut rss_warm: Option<u64> = None;
    let mut heap_warm = 0u64;
    let mut rss_max = 0u64;
    let mut last = (0u64, Instant::now());
    let mut last_report = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let finished = ledger.finished.load(Ordering::Acquire);
        let (now_rss, _) = rss();
        rss_max = rss_max.max(now_rss);
        if rss_warm.is_none() && finished >= warm_at {
            rss_warm = Some(now_rss);
            heap_warm = live_heap();
        }
        if finished >= n {
            break;
        }
        if finished != last.0 {
            last = (finished, Instant::now());
        }
        if last.1.elapsed() > Duration::from_secs(60) {
            panic!(
                "stalled: {finished} of {n} finished, {} published, {} deliveries; group {:?}; \
                 violations {:?}",
                ledger.published.load(Ordering::Relaxed),
                ledger.deliveries.load(Ordering::Relaxed),
                mq.group_info(TOPIC, GROUP),
                ledger.violations.lock().expect("lock")
            );
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            last_report = Instant::now();
            eprintln!(
                "soak: {:>5.1}s  published {:>9}  finished {:>9}  RSS {:>7.1} MiB  heap {:>7.1} MiB",
                started.elapsed().as_secs_f64(),
                ledger.published.load(Ordering::Relaxed),
                finished,
                mib(now_rss),
                mib(live_heap())
            );
        }
    }
    done.store(true, Ordering::Release);
    for t in tasks {
        t.await.expect("a producer or consumer panicked");
    }
    let elapsed = started.elapsed();
    let (rss_end, hwm) = rss();
    let heap_end = live_heap();
    let rss_warm = rss_warm.expect("warm-up measured");

    // ---- exact accounting ------------------------------------------------------------
    let violations = ledger.violations.lock().expect("lock").clone();
    assert!(
        violations.is_empty(),
        "{} broken promises, first ones:\n{}",
        ledger.violation_count.load(Ordering::Relaxed),
        violations.join("\n")
    );
    assert_eq!(ledger.published.load(Ordering::Relaxed), n);
    // The dead-letter topic: one copy per dead-lettered message, carrying its payload,
    // its headers and where it came from.
    let mut copies = vec![0u8; n as usize];
    let mut dlq_count = 0u64;
    let mut at = 0;
    loop {
        let batch = mq.fetch(DLQ, at, 10_000).await.expect("fetch dlq");
        let Some(last) = batch.last() else { break };
        at = last.offset() + 1;
        for r in &batch {
            let id = id_of(r.payload());
            let h = r.headers();
            assert_eq!(&r.payload()[..], &payload_of(id)[..], "dlq copy payload");
            let original = ledger.offset[id as usize].load(Ordering::Acquire) - 1;
            assert_eq!(
                h.get("x-original-offset"),
                Some(&original.to_string()),
                "id {id}"
            );
            assert_eq!(h.get("x-original-topic").map(String::as_str), Some(TOPIC));
            assert_eq!(h.get("x-consumer-group").map(String::as_str), Some(GROUP));
            assert_eq!(
                h.get("x-delivery-attempts"),
                Some(&MAX_ATTEMPTS.to_string())
            );
            assert_eq!(h.get("message-id"), Some(&message_id(id)), "headers kept");
            copies[id as usize] += 1;
            dlq_count += 1;
        }
    }
    let mut acked_count = 0u64;
    for (id, &copies) in copies.iter().enumerate() {
        let acked = ledger.acked[id].load(Ordering::Acquire);
        let dead = ledger.dead[id].load(Ordering::Acquire);
        assert!(
            matches!((acked, dead, copies), (1, 0, 0) | (0, 1, 1)),
            "id {id}: acked {acked}, dead-lettered {dead}, copies {copies}"
        );
        let published = ledger.offset[id].load(Ordering::Acquire);
        let delivered = ledger.delivered_at[id].load(Ordering::Acquire);
        assert_eq!(
            published, delivered,
            "id {id}: delivered at the offset it got"
        );
        acked_count += u64::from(acked);
    }
    assert_eq!(acked_count + dlq_count, n);
    assert!(dlq_count > 0, "some messages were dead-lettered");
    // Offsets are dense and unique: every offset below n belongs to exactly one id.
    let mut owner = vec![false; n as usize];
    for id in 0..n as usize {
        let o = ledger.offset[id].load(Ordering::Acquire) - 1;
        assert!(o < n && !owner[o as usize], "offset {o} given twice");
        owner[o as usize] = true;
    }
    let g = mq.group_info(TOPIC, GROUP).expect("group_info");
    assert_eq!(
        (g.cursor, g.next, g.lag, g.in_flight),
        (n, n, 0, 0),
        "{g:?}"
    );
    assert!(
        g.pending.is_empty(),
        "{:?}",
        &g.pending[..g.pending.len().min(5)]
    );
    assert_eq!(g.dead_lettered, dlq_count);
    mq.close().await.expect("close");
    // What was finished stays finished.
    let mq = Spool::open(&conn).expect("reopen");
    let g = mq.group_info(TOPIC, GROUP).expect("group_info");
    assert_eq!((g.cursor, g.dead_lettered), (n, dlq_count));
    assert_eq!(mq.topic_info(DLQ).expect("info").next, dlq_count);
    mq.close().await.expect("close");

    // ---- flat memory -----------------------------------------------------------------
    let secs = elapsed.as_secs_f64();
    eprintln!(
        "soak: {n} messages ({sync}) in {secs:.1}s = {:.0} msgs/s; acked {acked_count}, \
         dead-lettered {dlq_count}, deliveries {}",
        n as f64 / secs,
        ledger.deliveries.load(Ordering::Relaxed),
    );
    eprintln!(
        "soak: RSS start {:.1} MiB, after warm-up {:.1} MiB, max sampled {:.1} MiB, \
         end {:.1} MiB; peak RSS (VmHWM) {:.1} MiB; live heap after warm-up {:.1} MiB, \
         end {:.1} MiB",
        mib(rss_start),
        mib(rss_warm),
        mib(rss_max),
        mib(rss_end),
        mib(hwm),
        mib(heap_warm),
        mib(heap_end)
    );
    // Live heap is what the instance holds; RSS also keeps what the allocator has not
    // handed back to the kernel (glibc keeps freed pages in its arenas), so it may creep
    // while live heap stays level.
    assert!(
        heap_end < heap_warm + heap_warm / 4 + (16 << 20),
        "live heap grew: {:.1} MiB at the end, {:.1} MiB after the warm-up",
        mib(heap_end),
        mib(heap_warm)
    );
    assert!(
        rss_end < 2 * rss_warm + (64 << 20),
        "memory grew: RSS {:.1} MiB at the end, {:.1} MiB after the warm-up",
        mib(rss_end),
        mib(rss_warm)
    );
}
