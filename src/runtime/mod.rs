//! The embedded backend: the instance on a data directory, its consumers and deliveries,
//! and the threads it owns.
//!
//! **Invariants:**
//! - Only tokio's runtime-agnostic `sync` and `time` parts are used, so every `async fn`
//!   works under any tokio runtime.
//! - No std lock is held across an `.await`.
//!
//! Files, by role:
//! - `mod.rs`: `Embedded` (publish, admin calls, close), consumer wake-ups, the ticker and
//!   interval-sync threads.
//! - `consumer.rs`: `EmbeddedConsumer` and `EmbeddedDelivery`: waiting, auto-ack, release
//!   on drop.
//! - `syncer.rs`: the sync thread that group-commits publishes under `Sync=Always`.
//! - `admin.rs`: the instance's side of the admin endpoint (`crate::admin`): each request
//!   answered by the calls below.
//! - `timer.rs`: one thread per process that wakes a waiting consumer when a delayed
//!   record comes due or an ack deadline passes (so `recv` needs no runtime timer).

mod admin;
mod consumer;
mod syncer;
mod timer;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use tokio::sync::Notify;

pub(crate) use consumer::{ConsumerConfig, EmbeddedConsumer, EmbeddedDelivery, ack_all, nack_all};

use crate::error::{Error, Result};
use crate::format::Headers;
use crate::format::record::Record;
use crate::io::Fs;
use crate::options::{Options, SyncPolicy};
use crate::queue::{
    Engine, GroupInfo, NackOutcome, OffsetReset, SnapshotInfo, TopicConfig, TopicInfo, VerifyReport,
};
use syncer::Syncer;

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_ms() -> u64 {
    crate::format::record::system_time_ms(SystemTime::now())
}

/// The embedded backend: an open instance on a data directory. Cheap to clone; every
/// clone shares the instance (see [`crate::Spool`] for what each call promises).
#[derive(Clone)]
pub(crate) struct Embedded {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded").finish_non_exhaustive()
    }
}

struct Inner {
    /// `None` once closed. Calls clone the `Arc` for their duration. Shared with the
    /// ticker thread, which never holds the `Inner` itself: so the last handle's drop runs
    /// here, joins the ticker and releases the directory before it returns.
    engine: Arc<RwLock<Option<Arc<Engine>>>>,
    /// Woken on every publish to a topic and every change that frees a delivery (shared
    /// with the engine, which wakes a topic's consumers when records become visible other
    /// than by a publish: under `Sync=Always`, after the sync that covers them).
    notify: Arc<Notifiers>,
    syncer: Syncer,
    ticker: Ticker,
    sync: SyncPolicy,
    /// The admin endpoint, while it serves (`Admin=On` on the real file system).
    admin: Mutex<Option<crate::admin::server::Server>>,
}

impl Inner {
    /// Stops the admin endpoint (before the directory is released: its socket must be gone
    /// before a next owner makes its own).
    fn stop_admin(&self) {
        let server = self.admin.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut server) = server {
            server.stop();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop_admin();
        self.ticker.stop(true);
        let engine = self
            .engine
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(engine) = engine
            && let Err(e) = engine.close()
        {
            tracing::error!(error = %e, "closing spool on drop failed");
        }
        self.syncer.stop();
    }
}

impl Embedded {
    /// Opens the instance on `fs` (the real file system, or the power-loss tests'
    /// simulated one).
    pub(crate) fn open_on(fs: Fs, options: Options) -> Result<Embedded> {
        let sync = options.sync;
        let ticking = options.clone();
        let serve_admin = options.admin && fs.is_real();
        let engine = Arc::new(Engine::open(fs, options, now_ms())?);
        let notify = Arc::new(Notifiers::default());
        // Records readable other than by a returning publish (the engine's, and under
        // `Sync=Always` every sync's that shows records).
        let wake = {
            let notify = notify.clone();
            move |topic: &str| notify.wake(topic)
        };
        engine.set_on_visible(wake);
        let journal = engine.journal();
        let inner = Arc::new(Inner {
            engine: Arc::new(RwLock::new(Some(engine))),
            notify,
            syncer: Syncer::start(journal)?,
            ticker: Ticker::default(),
            sync,
            admin: Mutex::new(None),
        });
        inner.ticker.start(inner.engine.clone(), &ticking)?;
        if serve_admin {
            let server = admin::start(&inner, &ticking.data_source);
            *inner.admin.lock().unwrap_or_else(|e| e.into_inner()) = server;
        }
        Ok(Embedded { inner })
    }

    /// Runs `f` on the engine under the read lock (no `Arc` traffic: hot paths use this).
    /// A close waits for it; `f` must not call back into this `Spool`.
    pub(crate) fn with_engine<R>(&self, f: impl FnOnce(&Engine) -> Result<R>) -> Result<R> {
        let guard = self.inner.engine.read().unwrap_or_else(|e| e.into_inner());
        f(guard.as_deref().ok_or(Error::Closed)?)
    }

    pub(crate) fn engine(&self) -> Result<Arc<Engine>> {
        self.inner
            .engine
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(Error::Closed)
    }

    pub(crate) fn notifier(&self, topic: &str) -> Arc<Wakeup> {
        let mut map = self.inner.notify.lock();
        if let Some(n) = map.get(topic) {
            return n.clone();
        }
        let n = Arc::new(Wakeup::default());
        map.insert(topic.to_owned(), n.clone());
        n
    }

    pub(crate) fn wake(&self, topic: &str) {
        self.inner.notify.wake(topic);
    }

    /// Flushes everything, records a clean stop and releases the directory. Every clone
    /// then fails with [`Error::Closed`].
    pub async fn close(&self) -> Result<()> {
        self.inner.stop_admin();
        let engine = self
            .inner
            .engine
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or(Error::Closed)?;
        self.inner.ticker.stop(true);
        let result = engine.close();
        // Calls that started before the close hold the engine briefly; the directory lock
        // and the catalog are released when the last of them ends.
        let mut engine = engine;
        for _ in 0..10_000 {
            match Arc::try_unwrap(engine) {
                Ok(e) => {
                    drop(e);
                    break;
                }
                Err(e) => {
                    engine = e;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        let waiters: Vec<Arc<Wakeup>> = self.inner.notify.lock().values().cloned().collect();
        for n in waiters {
            n.wake_all();
        }
        result
    }

    /// Appends one message; returns its offset (the original one on a de-duplication hit).
    pub async fn publish(
        &self,
        topic: &str,
        payload: impl Into<Bytes>,
        headers: &Headers,
    ) -> Result<u64> {
        let payload: Bytes = payload.into();
        let published =
            self.with_engine(|e| e.publish(topic, &[(&payload[..], headers)], now_ms()))?;
        self.published(topic, &published);
        self.durable(&published.segment, published.end).await?;
        published.offsets.first().ok_or_else(|| Error::Unsupported {
            what: "empty publish (internal error)".into(),
        })
    }

    /// Appends messages in one write (and one sync); all or nothing.
    pub async fn publish_batch<P: Into<Bytes>>(
        &self,
        topic: &str,
        messages: Vec<(P, Headers)>,
    ) -> Result<Vec<u64>> {
        // In place when `P` is `Bytes` (same layout): no second list.
        let owned: Vec<(Bytes, Headers)> =
            messages.into_iter().map(|(p, h)| (p.into(), h)).collect();
        let published = self.with_engine(|e| e.publish(topic, &owned, now_ms()))?;
        self.published(topic, &published);
        self.durable(&published.segment, published.end).await?;
        Ok(published.offsets.into_vec())
    }

    /// After a publish, before any `.await` (so that a cancelled publish leaves nothing
    /// behind): wakes the topic's consumers, or, under `Sync=Always`, hands the topic to
    /// the sync thread, which writes what is held and syncs, and the sync that shows the
    /// records wakes them (`Engine::set_on_visible`, as for a failed publish that wrote
    /// records).
    fn published(&self, topic: &str, published: &crate::queue::Published) {
        if published.visible {
            self.wake(topic);
        }
        if let Some(t) = &published.held {
            self.inner.syncer.hold(t.clone());
        }
    }

    async fn durable(
        &self,
        segment: &Option<Arc<crate::log::segment::Segment>>,
        end: u64,
    ) -> Result<()> {
        match (self.inner.sync, segment) {
            (SyncPolicy::Always, Some(segment)) => {
                self.inner.syncer.sync(segment.clone(), end).await
            }
            (SyncPolicy::Always, None) => Err(Error::Unsupported {
                what: "a publish under Sync=Always without its segment (internal error)".into(),
            }),
            (SyncPolicy::Interval(_) | SyncPolicy::None, _) => Ok(()),
        }
    }

    /// Acks the group's cursor (must equal `offset`).
    pub async fn ack(&self, topic: &str, group: &str, offset: u64) -> Result<()> {
        let r = self.engine()?.ack_cursor(topic, group, offset);
        // Also after a failure: what failed may be the commit after the change was made.
        self.wake(topic);
        r
    }

    /// Nacks the group's cursor (must equal `offset`).
    pub async fn nack(
        &self,
        topic: &str,
        group: &str,
        offset: u64,
        reason: &str,
        delay: Option<Duration>,
    ) -> Result<NackOutcome> {
        let r = self
            .engine()?
            .nack_cursor(topic, group, offset, reason, delay, now_ms());
        self.wake(topic);
        r
    }

    /// Moves the group's cursor; returns the new cursor.
    pub async fn reset_offset(&self, topic: &str, group: &str, to: OffsetReset) -> Result<u64> {
        let r = self.engine()?.reset(topic, group, to);
        self.wake(topic);
        r
    }

    /// Reads up to `max_records` from `from` (clamped to the earliest retained offset).
    pub async fn fetch(&self, topic: &str, from: u64, max_records: usize) -> Result<Vec<Record>> {
        self.engine()?.fetch(topic, from, max_records)
    }

    /// The topic's offsets, size and segment count. An unknown topic reads as all zeros
    /// and is not created.
    pub fn topic_info(&self, topic: &str) -> Result<TopicInfo> {
        self.engine()?.topic_info(topic)
    }

    /// The group's cursor, lag, deliveries out and recorded failed attempts. An unknown
    /// group reads as a new one would start (at the earliest retained offset) and is not created.
    pub fn group_info(&self, topic: &str, group: &str) -> Result<GroupInfo> {
        self.engine()?.group_info(topic, group)
    }

    /// The topic's groups with state, sorted by name.
    pub fn groups(&self, topic: &str) -> Result<Vec<String>> {
        self.engine()?.groups(topic)
    }

    /// Forgets a group (see [`crate::Spool::delete_group`]).
    pub async fn delete_group(&self, topic: &str, group: &str) -> Result<()> {
        let r = self.engine()?.delete_group(topic, group);
        // Its waiting consumers are none (it is not in use); a wake costs nothing.
        self.wake(topic);
        r
    }

    /// Deletes the records before `offset` (see [`crate::Spool::delete_records_before`]).
    pub async fn delete_records_before(&self, topic: &str, offset: u64) -> Result<u64> {
        self.engine()?.delete_records_before(topic, offset)
    }

    /// Sets a topic's overrides (see [`crate::Spool::set_topic_config`]).
    pub async fn set_topic_config(&self, topic: &str, config: TopicConfig) -> Result<()> {
        self.engine()?.set_topic_config(topic, config, now_ms())
    }

    /// Every topic, sorted by name.
    pub fn topics(&self) -> Result<Vec<String>> {
        Ok(self.engine()?.topic_names())
    }

    /// Every topic's and group's figures (see [`crate::Spool::metrics`]).
    pub fn metrics(&self) -> Result<crate::queue::Metrics> {
        crate::queue::Metrics::gather(
            self.topics()?,
            |t| self.topic_info(t),
            |t| self.groups(t),
            |t, g| self.group_info(t, g),
        )
    }

    /// Applies retention now (the background thread also does every `Retention Check Ms`).
    pub fn apply_retention(&self) -> Result<()> {
        self.engine()?.apply_retention(now_ms(), true)
    }

    /// Catalog commits that succeeded since the instance was opened (0 once closed).
    pub fn catalog_commits(&self) -> u64 {
        self.with_engine(|e| Ok(e.catalog_commits())).unwrap_or(0)
    }

    /// Persists auto-acked cursors now (the background thread also does every
    /// `Commit Interval Ms`).
    pub fn commit(&self) -> Result<()> {
        self.engine()?.commit_groups(false)
    }

    /// Copies the instance into `dest` (see [`crate::Spool::snapshot`]). The copy runs on
    /// a thread of its own (`spool-snapshot`): it can take long, and no runtime thread
    /// should block that long. A dropped future leaves it running to its end.
    pub async fn snapshot(&self, dest: &std::path::Path) -> Result<SnapshotInfo> {
        let engine = self.engine()?;
        let dest = dest.to_owned();
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("spool-snapshot".into())
            .spawn(move || {
                let _ = tx.send(engine.snapshot(&dest));
            })
            .map_err(|e| Error::io("starting the snapshot thread", e))?;
        rx.await.unwrap_or_else(|_| {
            Err(Error::io(
                "taking a snapshot",
                std::io::Error::other("the snapshot thread panicked"),
            ))
        })
    }

    /// Reads back every log (or `topic`'s) and checks the catalog against them (see
    /// `queue/verify.rs`), on a thread of its own (`spool-verify`) like a snapshot.
    pub async fn verify(&self, topic: Option<&str>) -> Result<VerifyReport> {
        let engine = self.engine()?;
        let topic = topic.map(str::to_owned);
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("spool-verify".into())
            .spawn(move || {
                let _ = tx.send(engine.verify(topic.as_deref()));
            })
            .map_err(|e| Error::io("starting the verify thread", e))?;
        rx.await.unwrap_or_else(|_| {
            Err(Error::io(
                "verifying",
                std::io::Error::other("the verify thread panicked"),
            ))
        })
    }
}

/// Each topic's `Wakeup`, created by its first consumer.
#[derive(Default)]
pub(crate) struct Notifiers(Mutex<HashMap<String, Arc<Wakeup>>>);

impl Notifiers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Wakeup>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes `topic`'s waiting consumers, if it has any.
    fn wake(&self, topic: &str) {
        let n = self.lock().get(topic).cloned();
        if let Some(n) = n {
            n.wake();
        }
    }
}

/// Wakes the consumers of one topic that wait for a record or a free delivery slot.
///
/// Waking is skipped when nobody waits (the common case on a busy queue). A waiter counts
/// itself before it looks at the state, and a waker looks at the count after changing the
/// state; the two `SeqCst` fences make sure at least one of them sees the other.
#[derive(Debug, Default)]
pub(crate) struct Wakeup {
    pub(crate) notify: Notify,
    waiting: AtomicUsize,
    /// Counts the wakes that found a waiter: a busy-polling `recv` spins on it (one load,
    /// no lock) instead of parking its thread.
    rings: AtomicU64,
}

impl Wakeup {
    pub(crate) fn wake(&self) {
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            // After the state changed: a spinner that sees the new count sees the state.
            self.rings.fetch_add(1, Ordering::Release);
            self.notify.notify_waiters();
        }
    }

    /// Wakes every waiter, spinning ones included, whether or not it counted itself
    /// (`Spool::close`: they all find the instance closed).
    pub(crate) fn wake_all(&self) {
        self.rings.fetch_add(1, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// The count of wakes, read by a waiter before it looks at the state.
    pub(crate) fn rings(&self) -> u64 {
        self.rings.load(Ordering::Acquire)
    }

    /// Spins until a wake after `seen` (`true`) or until `deadline` (`false`).
    pub(crate) fn spin_until_rung(&self, seen: u64, deadline: Instant) -> bool {
        loop {
            // The clock is read only every so many loads: it costs more than a load.
            for _ in 0..64 {
                if self.rings.load(Ordering::Acquire) != seen {
                    return true;
                }
                std::hint::spin_loop();
            }
            if Instant::now() >= deadline {
                return false;
            }
        }
    }

    /// Counts a waiter until the guard drops.
    pub(crate) fn waiting(&self) -> WaitGuard<'_> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        WaitGuard(self)
    }
}

pub(crate) struct WaitGuard<'a>(&'a Wakeup);

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The background threads: `spool-ticker` (auto-ack commits, retention) and, under
/// `Sync=Interval`, `spool-interval-sync` (its own thread, so that a slow commit or
/// retention pass never delays a sync past its interval).
#[derive(Default)]
struct Ticker {
    stop: Arc<(Mutex<bool>, Condvar)>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Ticker {
    fn start(&self, engine: Arc<RwLock<Option<Arc<Engine>>>>, options: &Options) -> Result<()> {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        let (slot, stop) = (engine.clone(), self.stop.clone());
        let commit = Duration::from_millis(options.commit_interval_ms.max(1));
        let retention = Duration::from_millis(options.retention_check_ms.max(1));
        threads.push(
            std::thread::Builder::new()
                .name("spool-ticker".into())
                .spawn(move || ticker_loop(&slot, &stop, commit, retention))
                .map_err(|e| Error::io("starting the background thread", e))?,
        );
        if let SyncPolicy::Interval(every) = options.sync {
            let stop = self.stop.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("spool-interval-sync".into())
                    .spawn(move || interval_sync_loop(&engine, &stop, every))
                    .map_err(|e| Error::io("starting the interval sync thread", e))?,
            );
        }
        Ok(())
    }

    fn stop(&self, join: bool) {
        let (m, c) = &*self.stop;
        *m.lock().unwrap_or_else(|e| e.into_inner()) = true;
        c.notify_all();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            if join && t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// Waits until `until` or a stop; true if stopped.
fn wait_until(stop: &(Mutex<bool>, Condvar), until: Instant) -> bool {
    let (m, c) = stop;
    let guard = m.lock().unwrap_or_else(|e| e.into_inner());
    let timeout = until.saturating_duration_since(Instant::now());
    let (guard, _) = c
        .wait_timeout_while(guard, timeout, |stopped| !*stopped)
        .unwrap_or_else(|e| e.into_inner());
    *guard
}

/// When the next interval sync starts: `every` after the last one started, less what
/// that one took, so that a record written just after a sync started is durable about
/// `every` later (the promise: a power cut loses at most the last `every`). A sync slower
/// than `every` is followed at once by the next.
fn next_interval_sync(started: Instant, took: Duration, every: Duration) -> Instant {
    started + every.saturating_sub(took)
}

fn interval_sync_loop(
    slot: &RwLock<Option<Arc<Engine>>>,
    stop: &(Mutex<bool>, Condvar),
    every: Duration,
) {
    let mut next = Instant::now() + every;
    loop {
        if wait_until(stop, next) {
            return;
        }
        let Some(engine) = slot.read().unwrap_or_else(|e| e.into_inner()).clone() else {
            return;
        };
        let started = Instant::now();
        if let Err(e) = engine.sync_all() {
            tracing::error!(error = %e, "interval sync failed");
        }
        drop(engine);
        next = next_interval_sync(started, started.elapsed(), every);
    }
}

/// Auto-ack commits every `commit` and retention every `retention`, each at its own
/// deadline (not on a common tick, which would make either run up to a tick late).
fn ticker_loop(
    slot: &RwLock<Option<Arc<Engine>>>,
    stop: &(Mutex<bool>, Condvar),
    commit: Duration,
    retention: Duration,
) {
    let mut next_commit = Instant::now() + commit;
    let mut next_retention = Instant::now() + retention;
    loop {
        if wait_until(stop, next_commit.min(next_retention)) {
            return;
        }
        let Some(engine) = slot.read().unwrap_or_else(|e| e.into_inner()).clone() else {
            return;
        };
        let now = Instant::now();
        if now >= next_commit {
            next_commit = now + commit;
            if let Err(e) = engine.commit_groups(false) {
                tracing::error!(error = %e, "periodic cursor commit failed");
            }
        }
        if now >= next_retention {
            next_retention = now + retention;
            if let Err(e) = engine.apply_retention(now_ms(), false) {
                tracing::error!(error = %e, "retention failed");
            }
        }
        drop(engine);
    }
}
