//! Group commit: one thread makes appends durable for every waiting publisher at once.
//!
//! Publishers write under the topic lock, release it, then queue a request here and await
//! a oneshot. The thread takes every queued request, syncs each segment once (skipping
//! those a previous sync already covered) and answers them all. While it syncs, new
//! requests queue up and share the next sync: N concurrent publishers cost far fewer
//! than N fsyncs. No topic lock is held across the fsync, so readers and writers go on.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::log::segment::Segment;

struct Request {
    segment: Arc<Segment>,
    end: u64,
    done: oneshot::Sender<Result<(), String>>,
}

pub(crate) struct Syncer {
    tx: Mutex<Option<mpsc::Sender<Request>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Syncer {
    pub fn start() -> Result<Syncer> {
        let (tx, rx) = mpsc::channel::<Request>();
        let thread = std::thread::Builder::new()
            .name("spool-sync".into())
            .spawn(move || run(rx))
            .map_err(|e| Error::io("starting the sync thread", e))?;
        Ok(Syncer {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Waits until `segment` is durable up to `end`.
    pub async fn sync(&self, segment: Arc<Segment>, end: u64) -> Result<()> {
        if segment.is_synced_to(end) {
            return Ok(());
        }
        let (done, wait) = oneshot::channel();
        let sent = {
            let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
            match tx.as_ref() {
                Some(tx) => tx.send(Request { segment, end, done }).is_ok(),
                None => false,
            }
        };
        if !sent {
            return Err(Error::Closed);
        }
        match wait.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(reason)) => Err(Error::Poisoned { reason }),
            Err(_) => Err(Error::Closed),
        }
    }

    /// Answers what is queued, then stops the thread.
    pub fn stop(&self) {
        drop(self.tx.lock().unwrap_or_else(|e| e.into_inner()).take());
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

fn run(rx: mpsc::Receiver<Request>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        batch.extend(rx.try_iter());
        // One sync per distinct segment; `Segment::sync` skips work already covered.
        let mut results: Vec<(*const Segment, Result<(), String>)> = Vec::new();
        for req in batch {
            let key = Arc::as_ptr(&req.segment);
            let r = match results.iter().find(|(k, _)| *k == key) {
                Some((_, r)) => r.clone(),
                None => {
                    let r = req.segment.sync().map_err(|e| e.to_string());
                    results.push((key, r.clone()));
                    r
                }
            };
            debug_assert!(r.is_err() || req.segment.is_synced_to(req.end));
            let _ = req.done.send(r);
        }
    }
}
