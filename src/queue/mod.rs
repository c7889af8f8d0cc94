//! The semantics: produce with de-duplication, consumer groups, ack/nack, dead-letter,
//! reset, retention. **Invariants:** synchronous and deterministic given `now_ms`; never
//! awaits (tokio lives in `runtime`); the effect is made durable before the catalog
//! commit that depends on it (a dead-letter copy is synced before the cursor moves).
//!
//! Lock order: `topics` map, then a topic's `groups` map, then one group, then a topic
//! writer (a group may append to its dead-letter topic while locked). A writer lock is
//! never held while taking a group lock.

mod ack;
#[cfg(test)]
mod committer_window;
mod cursor;
mod dead_letter;
pub mod dedup;
mod deliver;
#[cfg(test)]
mod explore;
pub mod group;
mod group_cell;
mod info;
mod nack;
pub mod names;
mod produce;
mod reset;
mod retention;
#[cfg(test)]
mod test_support;
mod topic;

use std::collections::BTreeMap;

use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use crate::catalog::{AttemptRecord, Catalog, Op, TopicRecord};
use crate::error::{Error, Result};
use crate::io::{DirLock, Fs};
use crate::options::Options;
use ack::{GroupSnapshotter, finish_held};
pub use deliver::{GroupRef, LentRecords, Ticket};
use group::Group;
pub use group_cell::GroupCell;
use group_cell::group_ops;
pub use info::{
    GroupInfo, NackOutcome, OffsetReset, PendingAttempt, TopicInfo, X_CONSUMER_GROUP,
    X_DEAD_LETTER_REASON, X_DELIVERY_ATTEMPTS, X_ORIGINAL_OFFSET, X_ORIGINAL_TIMESTAMP,
    X_ORIGINAL_TOPIC,
};
pub use produce::Published;
use produce::rebuild_dedup;
pub use topic::Topic;
use topic::Writer;

/// Reason recorded for deliveries that were out when the process stopped uncleanly.
pub const UNCLEAN_STOP_REASON: &str = "in flight when the process stopped without closing";
/// The reason of an attempt charged to a delivery dropped while its handler panicked.
pub const PANICKED_REASON: &str = "dropped while its handler panicked";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Group and writer state is kept consistent between statements that can fail, so a
    // panic elsewhere does not leave it half-changed.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `Engine::set_on_visible`'s callback.
type OnVisible = Box<dyn Fn(&str) + Send + Sync>;

/// The embedded engine behind a `Spool`.
pub struct Engine {
    fs: Fs,
    opts: Options,
    catalog: Catalog,
    topics: RwLock<BTreeMap<String, Arc<Topic>>>,
    /// Told a topic's name when records became readable other than by a publish that
    /// returns (a dead-letter copy, held records written with it or by a publish that then
    /// failed; under `Sync=Always` every record, once a sync made it visible): the runtime
    /// wakes its consumers. Shared with each topic's log (`TopicLog::set_on_visible`).
    on_visible: Arc<std::sync::OnceLock<OnVisible>>,
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
        fs.create_dir_all(&dir)?;
        let dir_lock = DirLock::acquire(&fs, &dir)?;
        fs.create_dir_all(&dir.join("topics"))?;
        let catalog = Catalog::open(&fs, &dir.join("catalog.redb"))?;
        let clean = catalog.was_clean()?;
        let engine = Engine {
            fs,
            opts,
            catalog,
            topics: RwLock::new(BTreeMap::new()),
            on_visible: Arc::new(std::sync::OnceLock::new()),
            _lock: dir_lock,
        };
        let mut names: Vec<String> = engine.catalog.topics()?.into_keys().collect();
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
        for name in engine.fs.list_dir(&dir.join("topics"))? {
            // Only directories are topics: a stray file (`.DS_Store`, a note) is not ours.
            if names::check(&name).is_ok()
                && !names.contains(&name)
                && engine.fs.is_dir(&dir.join("topics").join(&name)) == Some(true)
            {
                tracing::warn!(topic = %name, "topic directory not in the catalog; adopting it");
                engine
                    .catalog
                    .commit(&[Op::PutTopic(name.clone(), TopicRecord::default())])?;
                names.push(name);
            }
        }
        for name in names {
            engine.open_topic(&name, now_ms)?;
        }
        let mut ops = Vec::new();
        for ((topic, group), rec) in engine.catalog.groups()? {
            let Some(t) = engine.topic(&topic) else {
                continue;
            };
            let mut g = Group::from_record(&rec);
            g.attempts = engine.catalog.attempts(&topic, &group)?;
            let next = t.reader.next();
            if g.cut_back_to(next) {
                tracing::warn!(topic = %topic, group = %group, next,
                    "the log lost records the group had seen (power cut under Sync=None); the group resumes at the log's end");
            }
            if !clean {
                for &o in rec.in_flight.iter().filter(|&&o| o < next) {
                    if g.unfinished(o) {
                        let a = g.attempts.entry(o).or_default();
                        a.attempts = a.attempts.saturating_add(1);
                        a.last_reason = UNCLEAN_STOP_REASON.to_owned();
                        ops.push(Op::PutAttempt(topic.clone(), group.clone(), o, a.clone()));
                    }
                }
                g.careful_until = g.lease_end;
                tracing::warn!(topic = %topic, group = %group, charged = rec.in_flight.len(),
                    careful_until = g.careful_until, "unclean stop: charged deliveries that were out");
            }
            // Charged to the limit (a panicking handler) and not dead-lettered before the
            // stop: the first hand-out dead-letters them (they may sit at the read position,
            // not queued for redelivery, when nothing after them was out).
            let max = engine.opts.max_delivery_attempts;
            if max > 0 {
                let due: Vec<u64> = g
                    .attempts
                    .iter()
                    .filter(|(o, a)| a.attempts >= max && **o < next && g.unfinished(**o))
                    .map(|(o, _)| *o)
                    .collect();
                for o in due.into_iter().rev() {
                    g.materialize_to(o);
                    g.charged_out.push(o);
                }
            }
            // With the attempt rows of records the log lost (`cut_back_to`): a record
            // published later at such an offset must not inherit their count.
            ops.extend(group_ops(&topic, &group, &mut g));
            lock(&t.groups).insert(group, GroupCell::new(g));
        }
        engine.catalog.commit(&ops)?;
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

    /// Sets what `visible` calls (once; the runtime's consumer wake-up).
    pub fn set_on_visible(&self, f: impl Fn(&str) + Send + Sync + 'static) {
        let _ = self.on_visible.set(Box::new(f));
    }

    fn visible(&self, topic: &str) {
        if let Some(f) = self.on_visible.get() {
            f(topic);
        }
    }

    /// A delivery dropped while its thread panics: its handler failed, so it counts as a
    /// nacked attempt (`PANICKED_REASON`) and comes again. Runs inside a `Drop`, so the
    /// attempt is committed without waiting (a crash before that commit forgets it, as it
    /// forgets any unfinished delivery's hand-out), and a message that reached the limit is
    /// dead-lettered by the group's next hand-out (`dead_letter_charged_out`), not here.
    pub fn charge_panicked(&self, r: &GroupRef, ticket: Ticket) {
        let mut g = r.group.lock();
        let offset = ticket.offset;
        if !g.holds(offset, ticket.epoch, ticket.token) {
            return;
        }
        g.in_flight.remove(&offset);
        let rec = AttemptRecord {
            attempts: g.attempt_of(offset),
            last_reason: PANICKED_REASON.to_owned(),
        };
        if rec.attempts >= self.opts.max_delivery_attempts {
            g.charged_out.push(offset);
        }
        g.attempts.insert(offset, rec.clone());
        g.redeliver.insert(offset);
        g.dirty = true;
        g.check();
        let (topic, group) = (r.topic.name.clone(), r.name.to_string());
        let mut ops = group_ops(&topic, &group, &mut g);
        ops.push(Op::PutAttempt(topic, group, offset, rec));
        self.catalog.commit_then(ops, Box::new(|_| {}));
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
    pub fn close(&self) -> Result<()> {
        let synced = self.sync_all();
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
    use crate::catalog::GroupRecord;
    use test_support::*;

    fn grp_attempts(g: &Group) -> Vec<u64> {
        g.attempts.keys().copied().collect()
    }

    #[test]
    fn out_of_order_acks_wait_above_the_floor() {
        let mut g = Group::new(0);
        g.max_in_flight = 10;
        for o in 0..5 {
            assert_eq!(g.next_offset(5), Some(o));
            g.hand_out(o);
        }
        for o in [1, 2, 4] {
            g.in_flight.remove(&o);
            g.finish(o);
        }
        assert_eq!(g.cursor, 0);
        g.in_flight.remove(&0);
        g.finish(0);
        assert_eq!(g.cursor, 3);
        assert!(grp_attempts(&g).is_empty());
        let r = g.record();
        let back = Group::from_record(&GroupRecord {
            in_flight: vec![],
            ..r
        });
        assert_eq!(back.cursor, 3);
        assert_eq!(back.redeliver.iter().copied().collect::<Vec<_>>(), vec![3]);
        back.check();
    }

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
