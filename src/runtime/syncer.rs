//! Group commit: one thread makes appends durable for every waiting publisher at once.
//!
//! Publishers write under the topic lock, release it, then queue a request here and wait
//! until the segment is durable up to their end (no channel of their own: their wakers
//! are parked in one list, `crate::parked`). The thread takes every queued request,
//! syncs each segment once (skipping those a previous sync already covered) and wakes
//! every waiter its sync covered. While it syncs, new requests queue up and share the
//! next sync: N concurrent publishers cost far fewer than N fsyncs. No topic lock is held
//! across the fsync, so readers and writers go on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::thread::JoinHandle;

use crate::error::{Error, Result};
use crate::log::segment::Segment;
use crate::parked::Parked;

struct Request {
    segment: Arc<Segment>,
    end: u64,
}

/// Publishers waiting for a sync.
#[derive(Default)]
struct Waiters {
    parked: Parked<(Arc<Segment>, u64)>,
    stopped: AtomicBool,
}

impl Waiters {
    /// Whether `segment` is durable to `end` (or can never be): checked under the list's
    /// lock by waiters, after the sync by the thread, so no wake-up is lost.
    fn outcome(&self, segment: &Segment, end: u64) -> Option<Result<()>> {
        if let Some(reason) = segment.poisoned() {
            return Some(Err(Error::Poisoned { reason }));
        }
        if segment.is_synced_to(end) {
            return Some(Ok(()));
        }
        self.stopped
            .load(Ordering::Acquire)
            .then_some(Err(Error::Closed))
    }

    /// Wakes every waiter that has its outcome (all of them once stopped).
    fn wake_decided(&self) {
        self.parked
            .wake_where(|(seg, end)| self.outcome(seg, *end).is_some());
    }
}

pub(crate) struct Syncer {
    tx: Mutex<Option<mpsc::Sender<Request>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    waiters: Arc<Waiters>,
}

impl Syncer {
    pub fn start() -> Result<Syncer> {
        let (tx, rx) = mpsc::channel::<Request>();
        let waiters = Arc::new(Waiters::default());
        let thread = {
            let waiters = waiters.clone();
            std::thread::Builder::new()
                .name("spool-sync".into())
                .spawn(move || run(&rx, &waiters))
                .map_err(|e| Error::io("starting the sync thread", e))?
        };
        Ok(Syncer {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            waiters,
        })
    }

    /// Waits until `segment` is durable up to `end`.
    pub async fn sync(&self, segment: Arc<Segment>, end: u64) -> Result<()> {
        if segment.is_synced_to(end) {
            return Ok(());
        }
        let sent = {
            let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
            let request = Request {
                segment: segment.clone(),
                end,
            };
            tx.as_ref().is_some_and(|tx| tx.send(request).is_ok())
        };
        if !sent {
            return Err(Error::Closed);
        }
        let w = &self.waiters;
        let mut again = false;
        std::future::poll_fn(|cx| {
            let seen = std::mem::replace(&mut again, true);
            match w.parked.poll(
                cx.waker(),
                seen,
                || w.outcome(&segment, end),
                || (segment.clone(), end),
                |(s, e)| Arc::ptr_eq(s, &segment) && *e == end,
            ) {
                Some(o) => Poll::Ready(o),
                None => Poll::Pending,
            }
        })
        .await
    }

    /// Answers what is queued, then stops the thread.
    pub fn stop(&self) {
        drop(self.tx.lock().unwrap_or_else(|e| e.into_inner()).take());
        // The thread answers every waiter as it ends (see `run`).
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

fn run(rx: &mpsc::Receiver<Request>, waiters: &Waiters) {
    // However the thread ends (a panic included), no publisher may wait for it forever.
    struct Stopped<'a>(&'a Waiters);
    impl Drop for Stopped<'_> {
        fn drop(&mut self) {
            self.0.stopped.store(true, Ordering::Release);
            self.0.wake_decided();
        }
    }
    let _stopped = Stopped(waiters);
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        batch.extend(rx.try_iter());
        // One sync per distinct segment; `Segment::sync` skips work already covered, and
        // a failure poisons the segment, which its waiters see.
        let mut synced: Vec<*const Segment> = Vec::new();
        for req in &batch {
            let key = Arc::as_ptr(&req.segment);
            if !synced.contains(&key) {
                synced.push(key);
                let _ = req.segment.sync();
            }
            debug_assert!(req.segment.poisoned().is_some() || req.segment.is_synced_to(req.end));
        }
        waiters.wake_decided();
    }
}
