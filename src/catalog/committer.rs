//! The catalog's committer thread: group commit of change sets and of group images,
//! and the watermark that tells an ack when it is durable.
//!
//! **Invariant:** a ticket is decided durable only after a commit that holds its state's
//! image returned; a failed commit fails every ticket it may have covered.

use super::*;

/// State the committer snapshots itself, when it writes (see the module docs).
///
/// Contract with [`Catalog::ack_ticket`]: the caller changes the state and asks for its
/// ticket under the state's lock, queuing the snapshotter unless it is already queued;
/// `try_ops` marks it no longer queued under that same lock, just before taking the image.
pub trait Snapshotter: Send + Sync + std::fmt::Debug {
    /// The ops that persist the current state; `None` while its lock is held (the holder
    /// may be waiting for this very committer, so the committer must never block on it).
    fn try_ops(&self) -> Option<Vec<Op>>;
    /// The ops `try_ops` last returned are durable: called by the committer once the
    /// commit that carried them succeeded, before the acks it decides are told.
    fn landed(&self) {}
    /// The same for every snapshotter of the same state: one snapshot serves them all.
    fn key(&self) -> usize;
}

/// Which ack tickets are durable. Tickets are handed out in increasing order; every
/// ticket up to `durable` is decided, and failed unless it lies in a recorded failure.
pub struct AckWatch {
    pub(super) issued: AtomicU64,
    durable: AtomicU64,
    failed: AtomicBool,
    failures: Mutex<Vec<(u64, u64, String)>>,
    /// Acks waiting for their ticket, woken when it is decided.
    waiters: Parked<u64>,
    /// Durable acks made whose futures have not been polled yet (`AckMade`): the
    /// application is still making acks it will await together (a `join_all`), so the
    /// committer waits a little for them before it takes the group images (`linger`).
    unpolled: AtomicUsize,
    /// Acks counted by `ack_made` ever: a round lingers only if some were made since the
    /// last, so a future held unpolled for long (or forgotten) costs one round's wait,
    /// not every round's.
    made: AtomicU64,
    /// Commits that succeeded (doc-hidden `Spool::catalog_commits`, for tests).
    commits: AtomicU64,
}

impl std::fmt::Debug for AckWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AckWatch")
            .field("issued", &self.issued)
            .field("durable", &self.durable)
            .finish_non_exhaustive()
    }
}

impl AckWatch {
    pub(super) fn new() -> AckWatch {
        AckWatch {
            issued: AtomicU64::new(0),
            durable: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            failures: Mutex::new(Vec::new()),
            waiters: Parked::default(),
            unpolled: AtomicUsize::new(0),
            made: AtomicU64::new(0),
            commits: AtomicU64::new(0),
        }
    }

    /// Counts a durable ack about to be made whose future is not polled yet, until the
    /// returned guard is dropped (at the future's first poll, or with the future).
    pub fn ack_made(self: &Arc<Self>) -> AckMade {
        // Relaxed: the ack then queues its group's image through the committer's channel,
        // which orders these before the committer's look.
        self.unpolled.fetch_add(1, Ordering::Relaxed);
        self.made.fetch_add(1, Ordering::Relaxed);
        AckMade {
            watch: self.clone(),
            counted: true,
        }
    }

    /// Commits that succeeded since the catalog was opened.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Waits until every ack counted by `ack_made` is polled, while the count moves (acks
    /// being made or polled: at most `LINGER_QUIET` between two moves) and until `until`.
    /// Futures awaited one at a time (the first, then the rest) stop the wait after one
    /// quiet spell: the rest are polled only once the first is decided.
    fn linger(&self, until: Instant) {
        let mut seen = self.unpolled.load(Ordering::Acquire);
        let mut moved = Instant::now();
        while seen > 0 {
            // Gaps are microseconds: yielding (not parking, whose wake-up alone can take
            // 50 us) lets the thread making the acks run on this CPU if it shares it.
            std::thread::yield_now();
            let now = Instant::now();
            let n = self.unpolled.load(Ordering::Acquire);
            if n != seen {
                (seen, moved) = (n, now);
            } else if now >= until || now - moved >= LINGER_QUIET {
                break;
            }
        }
    }

    /// `None` while `ticket` is not decided; then whether its commit succeeded.
    pub fn outcome(&self, ticket: u64) -> Option<Result<(), String>> {
        if self.durable.load(Ordering::Acquire) < ticket {
            return None;
        }
        if self.failed.load(Ordering::Acquire) {
            let f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((_, _, why)) = f.iter().find(|(a, b, _)| *a < ticket && ticket <= *b) {
                return Some(Err(why.clone()));
            }
        }
        Some(Ok(()))
    }

    /// The outcome of `ticket` if decided; otherwise `waker` is woken once it is.
    /// `again`: this ticket may be registered already (a repeated poll).
    pub fn poll_outcome(
        &self,
        ticket: u64,
        waker: &Waker,
        again: bool,
    ) -> Option<Result<(), String>> {
        self.waiters.poll(
            waker,
            again,
            || self.outcome(ticket),
            || ticket,
            |t| *t == ticket,
        )
    }

    pub(super) fn decide(&self, upto: u64, result: &Result<(), String>) {
        let from = self.durable.load(Ordering::Acquire);
        if upto <= from {
            return;
        }
        if let Err(why) = result {
            self.failures
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((from, upto, why.clone()));
            self.failed.store(true, Ordering::Release);
        }
        self.durable.store(upto, Ordering::Release);
        self.waiters.wake_where(|t| *t <= upto);
    }
}

/// A durable ack made whose future has not been polled yet (see [`AckWatch::ack_made`]);
/// also the ack's way to the watch it waits on (one `Arc` per ack).
#[derive(Debug)]
pub struct AckMade {
    watch: Arc<AckWatch>,
    counted: bool,
}

impl AckMade {
    /// The ack's future was polled: no longer counted. Returns the watch to wait on.
    pub fn polled(&mut self) -> &AckWatch {
        if std::mem::replace(&mut self.counted, false) {
            self.watch.unpolled.fetch_sub(1, Ordering::Release);
        }
        &self.watch
    }
}

impl Drop for AckMade {
    fn drop(&mut self) {
        self.polled();
    }
}

/// Called once a submitted change set is durable (or failed).
pub type Done = Box<dyn FnOnce(Result<(), String>) + Send>;

pub(super) struct Job {
    pub(super) ops: Vec<Op>,
    pub(super) done: Done,
}

pub(super) enum Msg {
    Job(Job),
    Snapshot(Arc<dyn Snapshotter>),
}

/// How long the committer waits before asking a busy snapshotter again.
const SNAPSHOT_RETRY: Duration = Duration::from_micros(50);

/// The longest a round waits for acks made and not yet awaited (`AckWatch::linger`):
/// half the last commit, within these bounds. A commit under `Sync=Always` is an fsync
/// (120-250 us on the VM of docs/performance.md), so the wait costs less than the second
/// commit it saves; the floor covers a loop of a few hundred acks where commits are cheap.
const LINGER_MIN: Duration = Duration::from_micros(50);
const LINGER_MAX: Duration = Duration::from_micros(250);
/// The wait ends when no ack was made or polled for this long.
const LINGER_QUIET: Duration = Duration::from_micros(20);

/// Each round: wait for a message, note the last issued ticket, drain the queue, take the
/// queued snapshots, commit, and decide every ticket up to the noted one. A ticket issued
/// before the note had its snapshotter queued before it (by its ack or an earlier one
/// not yet taken), so the snapshot covering it was taken in this round or an earlier one,
/// unless it is still waiting for its lock: then no ticket is decided this round.
pub(super) fn run_committer(db: &Database, rx: &mpsc::Receiver<Msg>, acks: &AckWatch) {
    // However the thread ends (a panic included), no ack may wait for it forever.
    struct Stopped<'a>(&'a AckWatch);
    impl Drop for Stopped<'_> {
        fn drop(&mut self) {
            self.0
                .decide(u64::MAX, &Err("the catalog thread stopped".into()));
        }
    }
    let _stopped = Stopped(acks);
    let mut c = Committer::default();
    let mut open = true;
    loop {
        let undecided = acks.issued.load(Ordering::SeqCst) > acks.durable.load(Ordering::SeqCst);
        let mut msgs = Vec::new();
        if open {
            match c.first_message(rx, undecided) {
                Ok(m) => msgs.push(m),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => open = false,
            }
        } else if c.waiting.is_empty() && !undecided {
            return;
        } else if !c.waiting.is_empty() {
            std::thread::sleep(SNAPSHOT_RETRY);
        }
        // Acks made back to back (a loop, a `join_all`) share this round's commit: their
        // futures are polled right after the last is made, so wait (briefly) for that
        // before the images are taken. The publish path's sync thread waits likewise for
        // the publishers it woke (`runtime/syncer.rs`).
        let made = acks.made.load(Ordering::Relaxed);
        if made != c.made_seen && acks.unpolled.load(Ordering::Acquire) > 0 {
            acks.linger(Instant::now() + c.linger_bound());
        }
        c.made_seen = made;
        let noted = acks.issued.load(Ordering::SeqCst);
        msgs.extend(rx.try_iter());
        c.round(db, rx, acks, msgs, noted);
    }
}

/// The committer thread's state between rounds.
#[derive(Default)]
struct Committer {
    /// Newest group image written, per group: an older one arriving later is skipped.
    written: HashMap<(String, String), u64>,
    /// Snapshotters whose state was locked when asked: asked again next round.
    waiting: Vec<Arc<dyn Snapshotter>>,
    /// A failed commit while a snapshot was still waiting: the tickets are decided later,
    /// and as failed (some of them were covered by the failed commit).
    carried: Option<String>,
    /// With `carried`: every ticket up to here is decided as failed. An image is taken
    /// after `noted` is read, so it can hold the change of a ticket issued in between (its
    /// state was still queued); once that commit fails, no later round may call it
    /// durable. A ticket issued after its state's image was taken queued the state again
    /// and is failed too: a false failure (the ack is reported as maybe not durable) is
    /// safe.
    failed_upto: u64,
    /// How long the last commit took (`None` before the first).
    last_commit: Option<Duration>,
    /// `AckWatch::made` as the last round saw it.
    made_seen: u64,
}

impl Committer {
    /// How long a round waits for acks not yet awaited (see `LINGER_MIN`).
    fn linger_bound(&self) -> Duration {
        self.last_commit
            .map_or(LINGER_MAX, |t| (t / 2).clamp(LINGER_MIN, LINGER_MAX))
    }

    /// The round's first message: waited for while nothing is undecided or waiting,
    /// else only looked for (or waited for a little while snapshots wait).
    fn first_message(
        &self,
        rx: &mpsc::Receiver<Msg>,
        undecided: bool,
    ) -> std::result::Result<Msg, mpsc::RecvTimeoutError> {
        if self.waiting.is_empty() && !undecided {
            rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected)
        } else if self.waiting.is_empty() {
            rx.try_recv().map_err(|e| match e {
                mpsc::TryRecvError::Empty => mpsc::RecvTimeoutError::Timeout,
                mpsc::TryRecvError::Disconnected => mpsc::RecvTimeoutError::Disconnected,
            })
        } else {
            rx.recv_timeout(SNAPSHOT_RETRY)
        }
    }

    /// One round: the jobs of `msgs`, one image per waiting state, one commit of both,
    /// then the tickets up to `noted` decided (unless a state is still waiting).
    fn round(
        &mut self,
        db: &Database,
        rx: &mpsc::Receiver<Msg>,
        acks: &AckWatch,
        msgs: Vec<Msg>,
        noted: u64,
    ) {
        let mut jobs = Vec::new();
        for m in msgs {
            match m {
                Msg::Job(j) => jobs.push(j),
                Msg::Snapshot(s) => self.waiting.push(s),
            }
        }
        let (taken, took) = self.take_images();
        // A job queued while the images were taken was made under its state's lock before
        // that state's image (`try_ops` took the lock after): it must land before the
        // image, or an attempt row it writes (a panic charge, not waited for) outlives the
        // deletion the image carries. A job made after its state's image cannot touch what
        // the image deletes (that takes a reset, whose own commit is waited for under the
        // lock). Snapshots queued meanwhile are for tickets issued after `noted` (an ack
        // queues its state before taking its ticket): next round, without holding up
        // this round's decision.
        let mut later = Vec::new();
        for m in rx.try_iter() {
            match m {
                Msg::Job(j) => jobs.push(j),
                Msg::Snapshot(s) => later.push(s),
            }
        }
        if !jobs.is_empty() || !taken.is_empty() {
            let started = Instant::now();
            let result = apply(db, &jobs, &taken, &mut self.written).map_err(|e| e.to_string());
            self.last_commit = Some(started.elapsed());
            if result.is_ok() {
                acks.commits.fetch_add(1, Ordering::Relaxed);
                for s in &took {
                    s.landed();
                }
            }
            for job in jobs {
                (job.done)(result.clone());
            }
            if let Err(e) = &result {
                self.carried = Some(e.clone());
                self.failed_upto = self.failed_upto.max(acks.issued.load(Ordering::SeqCst));
            }
        }
        if self.waiting.is_empty() {
            let upto = if self.carried.is_some() {
                noted.max(self.failed_upto)
            } else {
                noted
            };
            acks.decide(upto, &self.carried.take().map_or(Ok(()), Err));
        }
        self.waiting.extend(later);
    }

    /// One image per waiting state, taken now: after every change its tickets stand for.
    /// Returns the images' ops and the states taken; states whose lock was busy wait for
    /// the next round.
    fn take_images(&mut self) -> (Vec<Op>, Vec<Arc<dyn Snapshotter>>) {
        let mut keys = std::collections::HashSet::new();
        let mut taken = Vec::new();
        let mut took = Vec::new();
        let mut busy = Vec::new();
        for s in self.waiting.drain(..) {
            if !keys.insert(s.key()) {
                continue;
            }
            match s.try_ops() {
                Some(ops) => {
                    taken.extend(ops);
                    took.push(s);
                }
                None => busy.push(s),
            }
        }
        self.waiting = busy;
        (taken, took)
    }
}

/// See [`Catalog::queue`].
pub struct Queued<'a> {
    pub(super) catalog: &'a Catalog,
    pub(super) tx: mpsc::Sender<std::result::Result<(), String>>,
    pub(super) rx: mpsc::Receiver<std::result::Result<(), String>>,
    pub(super) count: usize,
}

impl Queued<'_> {
    /// Queues `ops` now: commits queued after this call are applied after them.
    pub fn push(&mut self, ops: Vec<Op>) {
        if ops.is_empty() {
            return;
        }
        let tx = self.tx.clone();
        self.catalog.commit_then(
            ops,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        self.count += 1;
    }

    /// Waits until everything pushed is durable; the first failure if any was not.
    pub fn wait(self) -> Result<()> {
        let mut result = Ok(());
        for _ in 0..self.count {
            let failed = match self.rx.recv() {
                Ok(Ok(())) => continue,
                Ok(Err(detail)) => cat_err("committing", detail),
                Err(_) => cat_err("committing", "the catalog thread stopped"),
            };
            if result.is_ok() {
                result = Err(failed);
            }
        }
        result
    }
}

/// One transaction for `jobs` in order, then `tail`. Of the group images, only the newest
/// of each group is written, and only if it is newer than the one written before.
fn apply(
    db: &Database,
    jobs: &[Job],
    tail: &[Op],
    written: &mut HashMap<(String, String), u64>,
) -> Result<()> {
    let all = || jobs.iter().flat_map(|j| j.ops.iter()).chain(tail.iter());
    let newest = newest_images(all(), written);
    let txn = db.begin_write().map_err(|e| cat_err("committing", e))?;
    {
        let mut tables = Tables::open(&txn)?;
        for op in all() {
            tables.apply(op, &newest)?;
        }
    }
    txn.commit().map_err(|e| cat_err("committing", e))?;
    for ((t, g), seq) in newest {
        written.insert((t.to_owned(), g.to_owned()), seq);
    }
    Ok(())
}

/// The catalog's tables, open for writing in one transaction.
struct Tables<'txn> {
    topics: redb::Table<'txn, &'static str, &'static [u8]>,
    groups: redb::Table<'txn, (&'static str, &'static str), &'static [u8]>,
    attempts: redb::Table<'txn, (&'static str, &'static str, u64), &'static [u8]>,
    intents: redb::Table<'txn, (&'static str, &'static str, u64), &'static [u8]>,
    meta: redb::Table<'txn, &'static str, &'static [u8]>,
    starts: redb::Table<'txn, &'static str, u64>,
    configs: redb::Table<'txn, &'static str, &'static [u8]>,
}

impl<'txn> Tables<'txn> {
    fn open(txn: &'txn redb::WriteTransaction) -> Result<Tables<'txn>> {
        let e = |e| cat_err("committing", e);
        Ok(Tables {
            topics: txn.open_table(TOPICS).map_err(e)?,
            groups: txn.open_table(GROUPS).map_err(e)?,
            attempts: txn.open_table(ATTEMPTS).map_err(e)?,
            intents: txn.open_table(DEAD_LETTER_INTENTS).map_err(e)?,
            meta: txn.open_table(META).map_err(e)?,
            starts: txn.open_table(TOPIC_STARTS).map_err(e)?,
            configs: txn.open_table(TOPIC_CONFIGS).map_err(e)?,
        })
    }

    /// Writes one op; a group image only if it is its group's `newest`.
    fn apply(&mut self, op: &Op, newest: &HashMap<(&str, &str), u64>) -> Result<()> {
        let w = |e: redb::StorageError| cat_err("writing", e);
        match op {
            Op::PutTopic(t, r) => {
                self.topics
                    .insert(t.as_str(), enc(r)?.as_slice())
                    .map_err(w)?;
            }
            Op::PutGroup(t, g, r, seq) => {
                if newest.get(&(t.as_str(), g.as_str())) == Some(seq) {
                    self.groups
                        .insert((t.as_str(), g.as_str()), enc(r)?.as_slice())
                        .map_err(w)?;
                }
            }
            Op::PutAttempt(t, g, o, r) => {
                self.attempts
                    .insert((t.as_str(), g.as_str(), *o), enc(r)?.as_slice())
                    .map_err(w)?;
            }
            Op::DeleteAttempt(t, g, o) => {
                self.attempts
                    .remove((t.as_str(), g.as_str(), *o))
                    .map_err(w)?;
            }
            Op::ClearAttempts(t, g) => self.clear(t, g, false)?,
            Op::DeleteGroup(t, g) => {
                self.groups.remove((t.as_str(), g.as_str())).map_err(w)?;
                self.clear(t, g, true)?;
            }
            Op::DeleteTopic(t) => {
                self.topics.remove(t.as_str()).map_err(w)?;
                self.starts.remove(t.as_str()).map_err(w)?;
                self.configs.remove(t.as_str()).map_err(w)?;
            }
            Op::SetTopicStart(t, start) => {
                self.starts.insert(t.as_str(), *start).map_err(w)?;
            }
            Op::PutTopicConfig(t, c) => {
                self.configs
                    .insert(t.as_str(), enc(c)?.as_slice())
                    .map_err(w)?;
            }
            Op::PutIntent(t, g, o, r) => {
                self.intents
                    .insert((t.as_str(), g.as_str(), *o), enc(r)?.as_slice())
                    .map_err(w)?;
            }
            Op::DeleteIntent(t, g, o) => {
                self.intents
                    .remove((t.as_str(), g.as_str(), *o))
                    .map_err(w)?;
            }
            Op::SetClean(c) => {
                self.meta
                    .insert(META_CLEAN, enc(c)?.as_slice())
                    .map_err(w)?;
            }
        }
        Ok(())
    }

    /// Removes every attempt row of a group (and with `intents`, its dead-letter intents).
    fn clear(&mut self, t: &str, g: &str, intents: bool) -> Result<()> {
        let w = |e: redb::StorageError| cat_err("writing", e);
        let all = (t, g, 0)..=(t, g, u64::MAX);
        self.attempts
            .retain_in(all.clone(), |_, _| false)
            .map_err(w)?;
        if intents {
            self.intents.retain_in(all, |_, _| false).map_err(w)?;
        }
        Ok(())
    }
}

/// Per group, the sequence number of the newest image among `ops`, if it is newer than
/// the one `written` already, and the group is not deleted in the same transaction. (A
/// group deleted in a round has no image of its own there: `delete_group` returns only
/// after that round, and a group made anew under the name comes later; so every image of
/// it in the round is of the deleted group, and a late job's deletion is written before
/// the images taken at the round's start.)
fn newest_images<'a>(
    ops: impl Iterator<Item = &'a Op>,
    written: &HashMap<(String, String), u64>,
) -> HashMap<(&'a str, &'a str), u64> {
    let mut newest: HashMap<(&str, &str), u64> = HashMap::new();
    let mut deleted = Vec::new();
    for op in ops {
        match op {
            Op::PutGroup(t, g, _, seq) => {
                let e = newest.entry((t.as_str(), g.as_str())).or_insert(*seq);
                *e = (*e).max(*seq);
            }
            Op::DeleteGroup(t, g) => deleted.push((t.as_str(), g.as_str())),
            _ => {}
        }
    }
    newest.retain(|&(t, g), seq| {
        !deleted.contains(&(t, g))
            && written
                .get(&(t.to_owned(), g.to_owned()))
                .is_none_or(|w| *w < *seq)
    });
    newest
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn image(cursor: u64) -> GroupRecord {
        GroupRecord {
            cursor,
            ..GroupRecord::default()
        }
    }

    fn put(cursor: u64, seq: u64) -> Op {
        Op::PutGroup("t".into(), "g".into(), image(cursor), seq)
    }

    /// A group image taken at the start of a round, then the group's deletion queued
    /// before the round writes: both land in one transaction, the deletion's job before
    /// the images. The image is of the deleted group and must not bring it back (found by
    /// review).
    #[test]
    fn a_delete_after_an_image_in_one_round_stays_deleted() {
        #[derive(Debug)]
        struct ImageThenDelete(std::sync::OnceLock<Arc<Catalog>>);
        impl Snapshotter for ImageThenDelete {
            fn try_ops(&self) -> Option<Vec<Op>> {
                let catalog = self.0.get().expect("set");
                catalog.commit_then(
                    vec![Op::DeleteGroup("t".into(), "g".into())],
                    Box::new(|_| {}),
                );
                Some(vec![put(7, u64::MAX / 2)])
            }
            fn key(&self) -> usize {
                9
            }
        }
        let dir = tempfile::tempdir().expect("dir");
        let c = Arc::new(Catalog::open(&Fs::real(), &dir.path().join("c.redb")).expect("open"));
        c.commit(&[put(3, 1)]).expect("the group exists");
        let s = Arc::new(ImageThenDelete(std::sync::OnceLock::new()));
        s.0.set(c.clone()).expect("set");
        let s: Arc<dyn Snapshotter> = s;
        let t = c.ack_ticket(&s, true).expect("ticket");
        while c.ack_watch().outcome(t).is_none() {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            !c.groups()
                .expect("groups")
                .contains_key(&("t".to_owned(), "g".to_owned())),
            "the deleted group came back"
        );
    }

    fn cursor(c: &Catalog) -> u64 {
        c.groups().expect("groups")[&("t".to_owned(), "g".to_owned())].cursor
    }

    #[test]
    fn an_older_group_image_never_overwrites_a_newer_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = Catalog::open(&Fs::real(), &dir.path().join("catalog.redb")).expect("open");
        c.commit(&[put(5, 2)]).expect("commit");
        // Taken earlier (seq 1) but queued later: skipped.
        c.commit(&[put(3, 1)]).expect("commit");
        assert_eq!(cursor(&c), 5);
        // In one batch, the newest wins whatever its position.
        c.commit(&[put(9, 4), put(7, 3)]).expect("commit");
        assert_eq!(cursor(&c), 9);
    }

    #[test]
    fn once_the_committer_stops_no_ticket_waits_for_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = Catalog::open(&Fs::real(), &dir.path().join("catalog.redb")).expect("open");
        let watch = c.ack_watch().clone();
        drop(c);
        // A ticket the stopped committer can never cover is decided, as failed.
        assert!(matches!(watch.outcome(1), Some(Err(_))));
    }

    /// Busy (locked) the first `busy` times it is asked, then returns an image.
    #[derive(Debug)]
    struct Busy {
        busy: usize,
        asked: AtomicUsize,
    }

    impl Snapshotter for Busy {
        fn try_ops(&self) -> Option<Vec<Op>> {
            let n = self.asked.fetch_add(1, Ordering::SeqCst);
            (n >= self.busy).then(|| vec![put(42, 100 + n as u64)])
        }
        fn key(&self) -> usize {
            1
        }
    }

    #[test]
    fn a_busy_snapshot_waits_without_holding_up_other_commits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = Catalog::open(&Fs::real(), &dir.path().join("catalog.redb")).expect("open");
        let busy = Arc::new(Busy {
            busy: 3,
            asked: AtomicUsize::new(0),
        });
        let s: Arc<dyn Snapshotter> = busy.clone();
        let ticket = c.ack_ticket(&s, true).expect("ticket");
        // Another change set commits meanwhile (the committer never blocks on the busy one).
        c.commit(&[Op::PutTopic("x".into(), TopicRecord::default())])
            .expect("commit");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let outcome = loop {
            if let Some(o) = c.ack_watch().outcome(ticket) {
                break o;
            }
            assert!(std::time::Instant::now() < deadline, "ticket never decided");
            std::thread::sleep(Duration::from_millis(1));
        };
        outcome.expect("durable");
        assert!(
            busy.asked.load(Ordering::SeqCst) >= 4,
            "asked again until free"
        );
        assert_eq!(cursor(&c), 42);
    }

    /// Takes a ticket for one more change to its state while the committer takes its image
    /// (as an ack made under the group's lock just before `try_ops` would: the state is
    /// still queued, so the ack only takes a ticket), then makes that image's commit fail.
    #[derive(Debug)]
    struct LateAckThenFail {
        catalog: std::sync::OnceLock<Arc<Catalog>>,
        fs: crate::io::sim::SimFs,
        late: Mutex<Option<u64>>,
        /// The state's lock, as `GroupSnapshotter` keeps it: tickets are taken under it and
        /// the image is not taken while it is held (the committer's rule for `noted`).
        state: Mutex<()>,
    }

    impl Snapshotter for LateAckThenFail {
        fn try_ops(&self) -> Option<Vec<Op>> {
            let _state = self.state.try_lock().ok()?;
            let c = self.catalog.get().expect("set");
            let me: Arc<dyn Snapshotter> = Arc::new(Busy {
                busy: 0,
                asked: AtomicUsize::new(0),
            });
            let t = c.ack_ticket(&me, false).expect("ticket");
            *self.late.lock().expect("lock") = Some(t);
            self.fs
                .fail_writes_to(Some(Path::new("/data/catalog.redb")));
            Some(vec![put(2, 1)])
        }
        fn key(&self) -> usize {
            7
        }
    }

    #[test]
    fn an_ack_whose_change_was_only_in_a_failed_commit_is_not_reported_durable() {
        let fs = crate::io::sim::SimFs::new(3);
        let f = Fs::new(Arc::new(fs.clone()));
        f.create_dir_all(Path::new("/data")).expect("dir");
        let c = Arc::new(Catalog::open(&f, Path::new("/data/catalog.redb")).expect("open"));
        let snap = Arc::new(LateAckThenFail {
            catalog: std::sync::OnceLock::new(),
            fs: fs.clone(),
            late: Mutex::new(None),
            state: Mutex::new(()),
        });
        snap.catalog.set(c.clone()).expect("set");
        let s: Arc<dyn Snapshotter> = snap.clone();
        // Under the state's lock, as every ack: without it the committer could take the
        // image and decide before this ticket is issued, and never hear of it again.
        let first = {
            let _state = snap.state.lock().expect("lock");
            c.ack_ticket(&s, true).expect("ticket")
        };
        let wait = |t: u64| {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                if let Some(o) = c.ack_watch().outcome(t) {
                    return o;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "ticket {t} never decided"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        assert!(wait(first).is_err(), "the commit failed");
        let late = snap.late.lock().expect("lock").expect("late ticket taken");
        let outcome = wait(late);
        assert!(
            outcome.is_err(),
            "ticket {late}'s change was only in the failed commit: {outcome:?}"
        );
    }
}
