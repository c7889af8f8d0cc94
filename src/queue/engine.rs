//! The engine: the data directory's lock, the catalog and the map of topics; opening
//! (recovery), syncing and closing.
//! **Invariant:** an open finishes recovery (tails, groups cut back to their logs,
//! unclean-stop charges, interrupted dead-letters) before anything is handed out, and
//! only a close that committed every group records a clean stop.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use super::Topic;
use super::deadline::wall_ms;
use super::group::Group;
use super::group_cell::{GroupCell, group_ops};
use super::unclean::{charge_unclean_stop, queue_charged_to_limit, restore_delays};
use crate::catalog::{Catalog, Op, TopicRecord};
use crate::error::{Error, Result};
use crate::io::{DirLock, Fs};
use crate::journal::Journal;
use crate::names;
use crate::options::Options;

/// Locks `m`, also after a panic elsewhere poisoned it.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Group and writer state is kept consistent between statements that can fail, so a
    // panic elsewhere does not leave it half-changed.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `Engine::set_on_visible`'s callback.
type OnVisible = Box<dyn Fn(&str) + Send + Sync>;

/// The embedded engine behind a `Spool`.
pub struct Engine {
    pub(super) fs: Fs,
    pub(super) opts: Options,
    pub(super) catalog: Catalog,
    pub(super) topics: RwLock<BTreeMap<String, Arc<Topic>>>,
    /// Told a topic's name when records became readable other than by a publish that
    /// returns (a dead-letter copy, held records written with it or by a publish that then
    /// failed; under `Sync=Always` every record, once a sync made it visible): the runtime
    /// wakes its consumers. Shared with each topic's log (`TopicLog::set_on_visible`).
    pub(super) on_visible: Arc<std::sync::OnceLock<OnVisible>>,
    /// Held to read by whatever deletes segment files (retention, `delete_records_before`),
    /// to write by a snapshot: the files it plans to link or copy stay until it has.
    /// Taken before any other lock.
    pub(super) deletions: RwLock<()>,
    /// Some group turned dirty since the ticker last looked (`Group::dirty_signal`, shared
    /// by every group): the commit tick walks the groups only then.
    pub(super) groups_dirty: Arc<std::sync::atomic::AtomicBool>,
    /// Under `Sync=Always`: the journal the sync thread shares across topics.
    journal: Option<Arc<Journal>>,
    _lock: DirLock,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("data_source", &self.opts.data_source)
            .finish()
    }
}

impl Engine {
    /// Locks the directory, opens the catalog and every topic (tail recovery), finishes
    /// interrupted dead-letters, and after an unclean stop charges the deliveries that
    /// were out.
    pub fn open(fs: Fs, opts: Options, now_ms: u64) -> Result<Engine> {
        opts.validate()?;
        let dir = opts.data_source.clone();
        if fs.is_dir(&dir) == Some(false) {
            return Err(Error::io(
                format!("opening data directory {}", dir.display()),
                std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory"),
            ));
        }
        if fs
            .is_dir(&dir.join(super::snapshot::INCOMPLETE_MARKER))
            .is_some()
        {
            return Err(Error::IncompleteSnapshot { path: dir });
        }
        fs.create_dir_all(&dir)?;
        let dir_lock = DirLock::acquire(&fs, &dir)?;
        fs.create_dir_all(&dir.join("topics"))?;
        // Before any log opens: what a crash left durable only in the journal goes back
        // into its segments, whatever the sync policy is now.
        let next_generation = crate::journal::replay(&fs, &dir)?;
        let journal = matches!(opts.sync, crate::options::SyncPolicy::Always)
            .then(|| Arc::new(Journal::new(&fs, &dir, next_generation)));
        let catalog = Catalog::open(&fs, &dir.join("catalog.redb"))?;
        let clean = catalog.was_clean()?;
        let engine = Engine {
            fs,
            opts,
            catalog,
            topics: RwLock::new(BTreeMap::new()),
            on_visible: Arc::new(std::sync::OnceLock::new()),
            deletions: RwLock::new(()),
            groups_dirty: Arc::default(),
            journal,
            _lock: dir_lock,
        };
        // Each table read once, not once per topic (thousands of topics open at once).
        let mut starts = engine.catalog.topic_starts()?;
        let mut configs = engine.catalog.topic_configs()?;
        for name in engine.topics_to_open()? {
            let start = starts.remove(&name).unwrap_or(0);
            let config = configs.remove(&name).unwrap_or_default();
            engine.open_topic(&name, now_ms, start, &config)?;
        }
        engine.load_groups(clean)?;
        engine.finish_intents(now_ms)?;
        if !clean {
            engine.dead_letter_exhausted(now_ms)?;
        }
        engine.catalog.commit(&[Op::SetClean(false)])?;
        // Only now: their syncs would otherwise slow this open's own (measured: the last
        // commit's `fdatasync` took 1.2 ms beside them, 0.45 ms without).
        for t in engine.topics_read().values() {
            lock(&t.writer).log.resume_sealing();
        }
        Ok(engine)
    }

    /// The topics the catalog names, and topic directories it lacks (adopted into it).
    fn topics_to_open(&self) -> Result<Vec<String>> {
        let dir = &self.opts.data_source;
        let mut names: Vec<String> = self.catalog.topics()?.into_keys().collect();
        // Each becomes a directory's name: a damaged catalog must not name one elsewhere.
        if let Some((name, why)) = names
            .iter()
            .find_map(|n| names::check(n).err().map(|e| (n, e)))
        {
            return Err(Error::corrupt(
                dir.join("catalog.redb"),
                format!("it names a topic {name:?}: {why}"),
            ));
        }
        for name in self.fs.list_dir(&dir.join("topics"))? {
            // Only directories are topics: a stray file (`.DS_Store`, a note) is not ours.
            if names::check(&name).is_ok()
                && !names.contains(&name)
                && self.fs.is_dir(&dir.join("topics").join(&name)) == Some(true)
            {
                tracing::warn!(topic = %name, "topic directory not in the catalog; adopting it");
                self.catalog
                    .commit(&[Op::PutTopic(name.clone(), TopicRecord::default())])?;
                names.push(name);
            }
        }
        Ok(names)
    }

    /// Loads the groups of every open topic, each cut back to its log's end, and after an
    /// unclean stop charges the deliveries that were out.
    fn load_groups(&self, clean: bool) -> Result<()> {
        let mut ops = Vec::new();
        for ((topic, group), rec) in self.catalog.groups()? {
            let Some(t) = self.topic(&topic) else {
                continue;
            };
            let mut g = Group::from_record(&rec);
            g.dirty_signal = self.groups_dirty.clone();
            g.attempts = self.catalog.attempts(&topic, &group)?;
            let next = t.reader.next();
            if g.cut_back_to(next) {
                tracing::warn!(topic = %topic, group = %group, next,
                    "the log lost records the group had seen (power cut under Sync=None); the group resumes at the log's end");
            }
            if !clean {
                let now_ms = wall_ms();
                let not_before = |n| self.not_before_ms(n, None, now_ms);
                ops.extend(charge_unclean_stop(
                    &topic, &group, &rec, &mut g, next, not_before,
                ));
            }
            queue_charged_to_limit(&mut g, self.opts.max_delivery_attempts, next);
            restore_delays(&mut g, next);
            // With the attempt rows of records the log lost (`cut_back_to`): a record
            // published later at such an offset must not inherit their count.
            ops.extend(group_ops(&topic, &group, &mut g));
            lock(&t.groups).insert(group, GroupCell::new(g));
        }
        self.catalog.commit(&ops)
    }

    /// The options the instance was opened with.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Sets what `visible` calls (once; the runtime's consumer wake-up).
    pub fn set_on_visible(&self, f: impl Fn(&str) + Send + Sync + 'static) {
        let _ = self.on_visible.set(Box::new(f));
    }

    /// Tells the runtime that records of `topic` became readable (see `on_visible`).
    pub(super) fn visible(&self, topic: &str) {
        if let Some(f) = self.on_visible.get() {
            f(topic);
        }
    }

    /// Syncs every topic's active segment (the `Interval` policy's tick, and close).
    /// Syncs every topic; the first failure is returned after all were tried (one topic
    /// stopped by a failed write must not leave the others unsynced).
    pub fn sync_all(&self) -> Result<()> {
        let mut first = Ok(());
        for t in self.all_topics() {
            // A segment still being sealed in the background is part of "everything".
            let (quiesced, active) = {
                let mut w = lock(&t.writer);
                let quiesced = w.log.quiesce();
                if quiesced.is_err() {
                    w.forget_dropped();
                }
                (quiesced, w.log.active().clone())
            };
            // Also in a topic stopped by a failed write: what it wrote before is synced
            // (`Segment::sync`), as the interval promises; the error is reported after.
            let synced = active.sync();
            let synced = quiesced.and(synced);
            if let Err(e) = synced {
                tracing::debug!(topic = %t.name, error = %e, "sync failed");
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// Flushes everything and records a clean stop.
    /// The journal the sync thread shares across topics (`Sync=Always` only).
    pub fn journal(&self) -> Option<Arc<Journal>> {
        self.journal.clone()
    }

    pub fn close(&self) -> Result<()> {
        let synced = self.sync_all();
        // Before the directory is released: the next owner replays and reuses the file.
        if let Some(j) = &self.journal {
            j.close(synced.is_ok());
        }
        // Also after a topic failed to sync: the clean stop is the groups' (their
        // deliveries out are released, not charged as a crash's), and a log that lost
        // records cuts its groups back at open whatever the flag says. One stopped topic
        // must not have the next open charge every topic's deliveries.
        let released = self
            .commit_groups(true)
            .and_then(|()| self.catalog.commit(&[Op::SetClean(true)]));
        synced.and(released)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::test_support::HOUR;

    /// A topic name in the catalog becomes a directory's name: a damaged catalog naming
    /// `../../outside` is refused, not followed out of the data directory. Found by review.
    #[test]
    fn open_refuses_a_catalog_topic_name_that_is_no_name() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("data");
        let fs = Fs::real();
        fs.create_dir_all(&data).expect("mkdir");
        {
            let c = Catalog::open(&fs, &data.join("catalog.redb")).expect("catalog");
            let bad = Op::PutTopic("../../outside".into(), TopicRecord::default());
            c.commit(&[bad]).expect("commit");
        }
        let mut o = Options::new(&data);
        o.sync = HOUR;
        let opened = Engine::open(fs, o, 1);
        assert!(
            matches!(&opened, Err(Error::Corrupt { detail, .. }) if detail.contains("../../outside")),
            "{:?}",
            opened.as_ref().map(|_| ())
        );
        assert!(!tmp.path().join("outside").exists());
    }
}
