//! Group commit: one thread makes appends durable for every waiting publisher at once.
//!
//! Publishers write under the topic lock, release it, then park their waker here (one
//! list, `crate::parked`; no channel or allocation per publish) until the segment is
//! durable up to their end, and raise a flag that unparks the thread if it was down. The
//! thread lowers the flag, makes each segment a parked waiter waits on durable once
//! (skipping those a previous sync already covered; several segments through one sync of
//! the shared journal, `crate::journal`) and wakes every waiter its round covered. While
//! it syncs, new waiters park and share the next sync: N concurrent publishers cost far
//! fewer than N fsyncs. Before its next round it waits a little for the publishers it
//! woke (see `run`), so they share one sync instead of taking turns. No topic lock is
//! held across the fsync, so readers and writers go on.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::journal::Journal;
use crate::log::segment::Segment;
use crate::parked::Parked;
use crate::queue::Topic;

/// Publishers waiting for a sync, and the flags between them and the thread.
#[derive(Default)]
struct Waiters {
    /// `(segment, end, waiter id)`: the id tells two waiters on one end apart (a
    /// de-duplication hit waits on the end of the publish that appended last), so a
    /// repeated poll replaces its own waker, never another waiter's.
    parked: Parked<(Arc<Segment>, u64, u64)>,
    /// The next waiter id.
    next_id: std::sync::atomic::AtomicU64,
    /// A waiter parked since the thread last looked at the list.
    requested: AtomicBool,
    /// Waiters parked since the thread's last wake-up round began, and how many it woke
    /// (the publishers it expects back): the waiter that brings `arrived` to `expected`
    /// unparks the thread, which lingers for them (see `run`).
    arrived: AtomicUsize,
    expected: AtomicUsize,
    /// `stop` was called: the thread answers what is parked, then ends.
    stopping: AtomicBool,
    /// The thread has ended: nobody syncs any more.
    stopped: AtomicBool,
    /// Topics whose publishes left records in memory (`Syncer::hold`): the thread writes
    /// them at the start of its next round, so that round's syncs cover them.
    held: Mutex<Vec<Arc<Topic>>>,
}

impl Waiters {
    /// Whether `segment` is durable to `end` (or can never be): checked under the list's
    /// lock by waiters, after the sync by the thread, so no wake-up is lost.
    fn outcome(&self, segment: &Segment, end: u64) -> Option<Result<()>> {
        // Durable first: a roll can write and seal held records, then fail and poison the
        // topic; those publishes succeeded (an error would make a retry append twice).
        // Records a failure dropped are never synced (the file stops growing at it).
        if segment.is_synced_to(end) {
            return Some(Ok(()));
        }
        if let Some(reason) = segment.poisoned() {
            return Some(Err(Error::Poisoned { reason }));
        }
        self.stopped
            .load(Ordering::Acquire)
            .then_some(Err(Error::Closed))
    }

    /// Wakes every waiter that has its outcome (all of them once stopped); returns how
    /// many.
    fn wake_decided(&self) -> usize {
        self.parked
            .wake_where(|(seg, end, _)| self.outcome(seg, *end).is_some())
    }
}

pub(crate) struct Syncer {
    join: Mutex<Option<JoinHandle<()>>>,
    /// The sync thread, to unpark (harmless once it has ended).
    thread: std::thread::Thread,
    waiters: Arc<Waiters>,
}

impl Syncer {
    /// Starts the thread; with `journal`, a round over several segments syncs once
    /// through it (`journal/`).
    pub fn start(journal: Option<Arc<Journal>>) -> Result<Syncer> {
        let waiters = Arc::new(Waiters::default());
        let join = {
            let waiters = waiters.clone();
            std::thread::Builder::new()
                .name("spool-sync".into())
                .spawn(move || run(&waiters, journal.as_deref()))
                .map_err(|e| Error::io("starting the sync thread", e))?
        };
        Ok(Syncer {
            thread: join.thread().clone(),
            join: Mutex::new(Some(join)),
            waiters,
        })
    }

    /// Hands over a topic whose publish left records in memory or wrote them
    /// (`Published::held`): the thread writes them before its next sync and syncs them,
    /// which shows them to readers. Called before the publish awaits.
    pub fn hold(&self, topic: Arc<Topic>) {
        let w = &self.waiters;
        w.held.lock().unwrap_or_else(|e| e.into_inner()).push(topic);
        if !w.requested.swap(true, Ordering::AcqRel) {
            self.thread.unpark();
        }
    }

    /// Waits until `segment` is durable up to `end`.
    pub async fn sync(&self, segment: Arc<Segment>, end: u64) -> Result<()> {
        if segment.is_synced_to(end) {
            return Ok(());
        }
        let w = &self.waiters;
        let id = w.next_id.fetch_add(1, Ordering::Relaxed);
        let mut again = false;
        std::future::poll_fn(|cx| {
            let seen = std::mem::replace(&mut again, true);
            let outcome = w.parked.poll(
                cx.waker(),
                seen,
                || w.outcome(&segment, end),
                || (segment.clone(), end, id),
                |(_, _, i)| *i == id,
            );
            match outcome {
                Some(o) => Poll::Ready(o),
                None => {
                    // Parked first, then flagged: the thread clears the flag before it
                    // reads the list, so it either sees this waiter or is woken again.
                    if !seen {
                        let first = !w.requested.swap(true, Ordering::AcqRel);
                        // SeqCst with the thread's store of `expected` and load of `arrived`:
                        // one of the two sides sees the other's write (no store buffering).
                        let n = w.arrived.fetch_add(1, Ordering::SeqCst) + 1;
                        if first || n == w.expected.load(Ordering::SeqCst) {
                            self.thread.unpark();
                        }
                    }
                    Poll::Pending
                }
            }
        })
        .await
    }

    /// Answers what is parked, then stops the thread.
    pub fn stop(&self) {
        self.waiters.stopping.store(true, Ordering::Release);
        // The thread answers every waiter as it ends (see `run`).
        self.thread.unpark();
        if let Some(t) = self.join.lock().unwrap_or_else(|e| e.into_inner()).take()
            // Not from the thread itself: a waker it runs may drop the last `Spool`. It
            // then ends on its own, after answering what is parked.
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}

fn run(waiters: &Waiters, journal: Option<&Journal>) {
    // However the thread ends (a panic included), no publisher may wait for it forever.
    struct Stopped<'a>(&'a Waiters);
    impl Drop for Stopped<'_> {
        fn drop(&mut self) {
            self.0.stopped.store(true, Ordering::Release);
            self.0.wake_decided();
        }
    }
    let _stopped = Stopped(waiters);
    // Kept across rounds (no allocation per round).
    let mut segments: Vec<Arc<Segment>> = Vec::new();
    let mut held: Vec<Arc<Topic>> = Vec::new();
    // Until when the next round waits for the publishers the last one woke.
    let mut linger: Option<Instant> = None;
    loop {
        if !waiters.requested.load(Ordering::Acquire) {
            if waiters.stopping.load(Ordering::Acquire) {
                // One last look: a waiter that parked before `stop` is still synced.
                if !waiters.requested.load(Ordering::Acquire) {
                    return;
                }
            } else {
                std::thread::park();
                continue;
            }
        }
        // Work is waiting. Publishers the last round woke usually publish again within
        // tens of microseconds: waiting for them lets one sync cover both cohorts, instead
        // of the two taking turns between syncs (a 64 KiB sync costs ~1.3x a 32 KiB one).
        // Bounded by half the last sync, and skipped after a wait that timed out (a
        // deadline already past when work came, after an idle spell, is no time-out).
        let timed_out = linger
            .take()
            .is_some_and(|until| wait_for_cohort(waiters, until));
        // Lowered only now: while it lingers, arrivals do not unpark it one by one.
        waiters.requested.store(false, Ordering::Release);
        collect_segments(waiters, &mut held, &mut segments);
        let synced = Instant::now();
        let syncs = !segments.is_empty();
        match journal {
            Some(j) => j.sync_round(&segments),
            None => {
                for seg in &segments {
                    let _ = seg.sync();
                }
            }
        }
        segments.clear();
        let took = synced.elapsed();
        // Count from before the wake-up: woken publishers can park again at once.
        // (A waiter parking between this reset and the wake-up is counted twice, which
        // only ends the next wait early.)
        waiters.arrived.store(0, Ordering::SeqCst);
        waiters.expected.store(usize::MAX, Ordering::SeqCst);
        let woken = waiters.wake_decided();
        if syncs && woken > 0 && !timed_out {
            waiters.expected.store(woken, Ordering::SeqCst);
            linger = Some(Instant::now() + (took / 2).min(MAX_LINGER));
        }
    }
}

/// Waits until `until` for the publishers the last round woke to park again; returns
/// whether the wait timed out (a deadline already past when work came, after an idle
/// spell, is no time-out).
fn wait_for_cohort(waiters: &Waiters, until: Instant) -> bool {
    let mut waited = false;
    while waiters.arrived.load(Ordering::SeqCst) < waiters.expected.load(Ordering::SeqCst)
        && !waiters.stopping.load(Ordering::Acquire)
    {
        let now = Instant::now();
        if now >= until {
            return waited;
        }
        std::thread::park_timeout(until - now);
        waited = true;
    }
    false
}

/// Fills `segments` with this round's work: each distinct segment with a waiter, after
/// writing the held records of every topic in `waiters.held` (`held` is kept across
/// rounds, so no allocation per round).
fn collect_segments(
    waiters: &Waiters,
    held: &mut Vec<Arc<Topic>>,
    segments: &mut Vec<Arc<Segment>>,
) {
    // Held records first, in one write per topic: this round's syncs cover them (and
    // show them to readers, also if their publishes were cancelled).
    std::mem::swap(
        held,
        &mut waiters.held.lock().unwrap_or_else(|e| e.into_inner()),
    );
    for t in held.drain(..) {
        let seg = t.write_held();
        if !segments.iter().any(|s| Arc::ptr_eq(s, &seg)) {
            segments.push(seg);
        }
    }
    // One sync per distinct segment with a waiter; `Segment::sync` skips work already
    // covered, and a failure poisons the segment, which its waiters see.
    waiters.parked.for_each_key(|(seg, _, _)| {
        if !segments.iter().any(|s| Arc::ptr_eq(s, seg)) {
            segments.push(seg.clone());
        }
    });
}

/// The longest a round waits for the publishers the previous one woke.
const MAX_LINGER: Duration = Duration::from_micros(500);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Headers;
    use crate::io::Fs;
    use crate::log::{Append, LogConfig, TopicLog};

    fn append(log: &mut TopicLog) -> u64 {
        let headers = Headers::new();
        let m = Append {
            payload: b"x",
            headers: &headers,
            headers_len: crate::format::record::headers_len(&headers),
        };
        log.append(&[m], 0).expect("append");
        log.end()
    }

    /// A log of 1 MiB segments (no roll in these tests), a sync thread and a runtime.
    fn setup() -> (
        tempfile::TempDir,
        TopicLog,
        Arc<Syncer>,
        tokio::runtime::Runtime,
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = LogConfig {
            segment_bytes: 1 << 20,
            index_interval_bytes: 4096,
            max_body: 1 << 16,
            preallocate: true,
            visible_when_synced: true,
            seal_in_background: false,
        };
        let log = TopicLog::open(&Fs::real(), dir.path(), cfg, 0).expect("open");
        let syncer = Arc::new(Syncer::start(None).expect("start"));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .expect("runtime");
        (dir, log, syncer, rt)
    }

    #[test]
    fn concurrent_waiters_share_syncs_and_a_stopped_syncer_answers_closed() {
        let (_dir, mut log, syncer, rt) = setup();
        let ends: Vec<u64> = (0..64).map(|_| append(&mut log)).collect();
        let seg = log.active().clone();
        rt.block_on(async {
            let mut tasks = Vec::new();
            for end in ends.iter().copied() {
                let (syncer, seg) = (syncer.clone(), seg.clone());
                tasks.push(tokio::spawn(async move { syncer.sync(seg, end).await }));
            }
            for t in tasks {
                t.await.expect("task").expect("synced");
            }
        });
        assert!(seg.is_synced_to(*ends.last().expect("ends")));
        syncer.stop();
        let end = append(&mut log);
        let late = rt.block_on(syncer.sync(seg, end));
        assert!(matches!(late, Err(Error::Closed)), "{late:?}");
    }

    #[test]
    fn a_round_waits_for_the_publishers_the_last_one_woke_only_so_long() {
        let (_dir, mut log, syncer, rt) = setup();
        let seg = log.active().clone();
        rt.block_on(async {
            for _ in 0..20 {
                // Two waiters, usually woken by one round: the next round expects both back.
                let (e1, e2) = (append(&mut log), append(&mut log));
                let (a, b) =
                    tokio::join!(syncer.sync(seg.clone(), e1), syncer.sync(seg.clone(), e2));
                a.expect("synced");
                b.expect("synced");
                // Only one comes back: its round waits at most its bound, then syncs.
                for _ in 0..3 {
                    let e = append(&mut log);
                    let late = Duration::from_secs(20);
                    tokio::time::timeout(late, syncer.sync(seg.clone(), e))
                        .await
                        .expect("not held back for a publisher that left")
                        .expect("synced");
                }
            }
        });
        syncer.stop();
    }

    /// 64 publishers on one log, a third of their waits cancelled at random (a dropped
    /// future stays counted as a waiter the thread expects back): every wait that is not
    /// cancelled completes, and a stop answers the publishers still parking (found by
    /// review as a stress test).
    #[test]
    fn cancelled_waits_never_hold_up_the_others_and_a_stop_answers_those_parked() {
        let (_dir, log, syncer, rt) = setup();
        let log = Arc::new(std::sync::Mutex::new(log));
        let next = |log: &std::sync::Mutex<TopicLog>| {
            let mut log = log.lock().expect("log");
            let end = append(&mut log);
            (log.active().clone(), end)
        };
        let patience = Duration::from_secs(20);
        rt.block_on(async {
            let mut tasks = Vec::new();
            for i in 0..64u64 {
                let (log, syncer) = (log.clone(), syncer.clone());
                tasks.push(tokio::spawn(async move {
                    let mut rng = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                    for _ in 0..100 {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let (seg, end) = next(&log);
                        let wait = syncer.sync(seg, end);
                        if rng % 3 == 0 {
                            let cancel_after = Duration::from_micros(rng % 300);
                            let _ = tokio::time::timeout(cancel_after, wait).await;
                        } else {
                            tokio::time::timeout(patience, wait)
                                .await
                                .expect("a wait was held up")
                                .expect("synced");
                        }
                    }
                }));
            }
            for t in tasks {
                t.await.expect("task");
            }
            let mut tasks = Vec::new();
            for _ in 0..32 {
                let (log, syncer) = (log.clone(), syncer.clone());
                tasks.push(tokio::spawn(async move {
                    loop {
                        let (seg, end) = next(&log);
                        match tokio::time::timeout(patience, syncer.sync(seg, end))
                            .await
                            .expect("a wait was held up across the stop")
                        {
                            Ok(()) => {}
                            Err(Error::Closed) => return,
                            Err(e) => panic!("{e:?}"),
                        }
                    }
                }));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            let s = syncer.clone();
            tokio::task::spawn_blocking(move || s.stop())
                .await
                .expect("stop");
            for t in tasks {
                t.await.expect("task");
            }
        });
    }
}
