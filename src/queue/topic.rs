//! Topics: each one's log writer (with its de-duplication window), its reader and its
//! groups, and the engine's map of them.
//! **Invariant:** every topic in the map has a valid name, and a new topic's catalog
//! entry is committed before its directory is made; a creation that fails leaves neither.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLockReadGuard, RwLockWriteGuard};

use super::dedup::Dedup;
use super::engine::lock;
use super::group_cell::GroupCell;
use super::produce::rebuild_dedup;
use super::topic_config::TopicConfig;
use super::{Engine, dead_letter};
use crate::catalog::{Op, TopicConfigRecord, TopicRecord};
use crate::error::{Error, Result};
use crate::format::record::{self, Record};
use crate::io::Fs;
use crate::log::segment::Segment;
use crate::log::{LogConfig, LogReader, TopicLog};
use crate::names;
use crate::options::{MAX_HEADER_BYTES_LIMIT, MAX_MESSAGE_BYTES_LIMIT, SyncPolicy};

/// The longest record body a log writes and reads: the hard limits, not today's options
/// (records written under larger limits are data, and recovery must not mistake them for
/// damage), plus a dead-letter copy's headers.
pub(super) const MAX_BODY: usize = record::BODY_FIXED_LEN
    + MAX_MESSAGE_BYTES_LIMIT
    + MAX_HEADER_BYTES_LIMIT
    + dead_letter::DEAD_LETTER_HEADER_BYTES;

/// A topic's write side, behind its lock: the log and the window of message ids.
pub(super) struct Writer {
    pub(super) log: TopicLog,
    pub(super) dedup: Dedup,
}

impl Writer {
    /// After a failed write: the held records it dropped (`TopicLog::write_held`) lose
    /// their ids too, or a retry would be a de-duplication hit on a record never written
    /// (its offset given to another record after a reopen).
    pub(super) fn forget_dropped(&mut self) {
        self.dedup.forget_from(self.log.next());
    }
}

/// One topic: its log's writer and reader, and its consumer groups.
pub struct Topic {
    pub(super) name: String,
    pub(super) writer: Mutex<Writer>,
    pub(super) reader: LogReader,
    pub(super) groups: Mutex<BTreeMap<String, Arc<GroupCell>>>,
    /// Overrides of the instance's settings (`set_topic_config`).
    pub(super) config: Mutex<TopicConfig>,
}

impl std::fmt::Debug for Topic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topic").field("name", &self.name).finish()
    }
}

impl Topic {
    /// A topic on `log`, with no groups yet.
    fn new(name: &str, log: TopicLog, dedup: Dedup, config: TopicConfig) -> Arc<Topic> {
        Arc::new(Topic {
            name: name.to_owned(),
            reader: log.reader().clone(),
            writer: Mutex::new(Writer { log, dedup }),
            groups: Mutex::new(BTreeMap::new()),
            config: Mutex::new(config),
        })
    }

    /// Writes the records publishes left in memory (`Published::held`); returns the
    /// segment a sync must cover to make them (and records written without being held)
    /// visible. A failure poisons the topic, which the publishes waiting on them see.
    pub fn write_held(&self) -> Arc<Segment> {
        let mut w = lock(&self.writer);
        if let Err(e) = w.log.write_held() {
            tracing::debug!(topic = %self.name, error = %e, "writing held records failed");
            w.forget_dropped();
        }
        w.log.active().clone()
    }

    /// The groups of this topic, so that each can be locked without holding the map.
    pub(super) fn groups_snapshot(&self) -> Vec<(String, Arc<GroupCell>)> {
        lock(&self.groups)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// Removes a topic directory a failed creation made: its files (it holds only what the
/// creation wrote), then the directory. Needs no descriptor when the directory is still
/// empty (a creation that failed for want of one). Its parent is synced if it can be: if
/// not (that too needs a descriptor), a power cut may bring the empty directory back,
/// which the next open adopts as an empty topic.
fn remove_topic_dir(fs: &Fs, dir: &Path) -> Result<()> {
    if fs.is_dir(dir).is_none() {
        return Ok(());
    }
    if fs.remove_dir(dir).is_err() {
        for name in fs.list_dir(dir)? {
            fs.remove_file(&dir.join(name))?;
        }
        fs.remove_dir(dir)?;
    }
    if let Some(parent) = dir.parent()
        && let Err(e) = fs.sync_dir(parent)
    {
        tracing::warn!(error = %e, dir = %dir.display(),
            "the removal of a failed topic's directory is not durable yet");
    }
    Ok(())
}

impl Engine {
    /// The topic map, to read. A panic elsewhere leaves it whole (as `lock` says).
    pub(super) fn topics_read(&self) -> RwLockReadGuard<'_, BTreeMap<String, Arc<Topic>>> {
        self.topics.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The topic map, to change.
    fn topics_write(&self) -> RwLockWriteGuard<'_, BTreeMap<String, Arc<Topic>>> {
        self.topics.write().unwrap_or_else(|e| e.into_inner())
    }

    fn topic_dir(&self, name: &str) -> PathBuf {
        self.opts.data_source.join("topics").join(name)
    }

    fn log_config(&self) -> LogConfig {
        LogConfig {
            segment_bytes: self.opts.segment_bytes,
            index_interval_bytes: self.opts.index_interval_bytes,
            max_body: MAX_BODY,
            preallocate: self.opts.sync == SyncPolicy::Always,
            visible_when_synced: self.opts.sync == SyncPolicy::Always,
            seal_in_background: self.opts.sync == SyncPolicy::None,
        }
    }

    /// The topic's log, telling `on_visible` when a sync shows records (`Sync=Always`).
    fn open_log(&self, name: &str, now_ms: u64) -> Result<TopicLog> {
        let log = TopicLog::open(&self.fs, &self.topic_dir(name), self.log_config(), now_ms)?;
        let (on_visible, topic) = (self.on_visible.clone(), name.to_owned());
        log.set_on_visible(Box::new(move || {
            if let Some(f) = on_visible.get() {
                f(&topic);
            }
        }));
        Ok(log)
    }

    /// Opens a topic the catalog lists, its de-duplication window rebuilt from its log;
    /// `start` and `config` are its rows of the catalog's `topic_starts` and
    /// `topic_configs` (0 and empty where it has none).
    pub(super) fn open_topic(
        &self,
        name: &str,
        now_ms: u64,
        start: u64,
        config: &TopicConfigRecord,
    ) -> Result<Arc<Topic>> {
        debug_assert!(
            names::check(name).is_ok(),
            "{name:?}: publish trusts the map"
        );
        let mut log = self.open_log(name, now_ms)?;
        // Records deleted before this start (`delete_records_before`) stay deleted.
        let mut start = start;
        if start > log.next() {
            // The records up to it were lost to a power cut (`Sync=None` deletes up to an
            // end not yet synced): the log goes on from its end, and what it appends from
            // now on must not stay hidden behind the old start after the next open.
            start = log.next();
            self.catalog
                .commit(&[Op::SetTopicStart(name.to_owned(), start)])?;
        }
        log.set_start(start);
        let mut dedup = Dedup::new(self.opts.dedup_window);
        if dedup.enabled() {
            rebuild_dedup(log.reader(), &mut dedup, self.opts.dedup_window)?;
            dedup.forget_below(log.reader().earliest());
        }
        let t = Topic::new(name, log, dedup, TopicConfig::from_record(config));
        self.topics_write().insert(name.to_owned(), t.clone());
        Ok(t)
    }

    /// An existing topic.
    pub fn topic(&self, name: &str) -> Option<Arc<Topic>> {
        self.topics_read().get(name).cloned()
    }

    /// An existing topic, or a new one (catalog entry first, then its directory). A
    /// creation that fails at any step is undone (`undo_creation`) before its error is
    /// returned.
    pub fn topic_or_create(&self, name: &str, now_ms: u64) -> Result<Arc<Topic>> {
        names::check(name)?;
        if let Some(t) = self.topic(name) {
            return Ok(t);
        }
        let mut map = self.topics_write();
        if let Some(t) = map.get(name) {
            return Ok(t.clone());
        }
        // A directory there already is not this creation's to remove (open adopts it).
        let existed = self.fs.is_dir(&self.topic_dir(name)).is_some();
        let created = self
            .catalog
            .commit(&[Op::PutTopic(
                name.to_owned(),
                TopicRecord { created_ms: now_ms },
            )])
            .and_then(|()| self.open_log(name, now_ms));
        let mut log = match created {
            Ok(log) => log,
            Err(e) => return Err(self.undo_creation(name, existed, e)),
        };
        // A leftover directory may hold an interrupted sealing.
        log.resume_sealing();
        let dedup = Dedup::new(self.opts.dedup_window);
        let t = Topic::new(name, log, dedup, TopicConfig::default());
        map.insert(name.to_owned(), t.clone());
        Ok(t)
    }

    /// After a topic creation failed with `e` (the log's files are closed by now): removes
    /// what it made, its directory (unless `existed`) and then its catalog entry, and
    /// returns `e` saying so. In this order: a crash in between leaves an entry without a
    /// directory, which the next open makes into an empty topic, as it would adopt a
    /// directory without an entry. If the undoing fails too, `e` says what is left.
    fn undo_creation(&self, name: &str, existed: bool, e: Error) -> Error {
        let dir = self.topic_dir(name);
        let removed = if existed {
            Ok(())
        } else {
            remove_topic_dir(&self.fs, &dir)
        };
        let undone =
            removed.and_then(|()| self.catalog.commit(&[Op::DeleteTopic(name.to_owned())]));
        let what = match &undone {
            Ok(()) => "nothing of it was left behind".to_owned(),
            Err(u) => {
                tracing::error!(topic = %name, error = %u, "could not undo a failed topic creation");
                format!("undoing it failed too ({u}); the next open adopts what is left")
            }
        };
        match e {
            Error::Io { context, source } => Error::Io {
                context: format!("creating topic {name:?} ({what}): {context}"),
                source,
            },
            other => {
                tracing::warn!(topic = %name, error = %other, "creating a topic failed; {what}");
                other
            }
        }
    }

    /// The names of every topic, in order.
    pub fn topic_names(&self) -> Vec<String> {
        self.topics_read().keys().cloned().collect()
    }

    /// Every topic, so that each can be worked on without holding the map.
    pub fn all_topics(&self) -> Vec<Arc<Topic>> {
        self.topics_read().values().cloned().collect()
    }

    /// Up to `max` records of `topic` from `from` on (none if the topic does not exist).
    pub fn fetch(&self, topic: &str, from: u64, max: usize) -> Result<Vec<Record>> {
        names::check(topic)?;
        match self.topic(topic) {
            Some(t) => t.reader.read(from, max, usize::MAX),
            None => Ok(Vec::new()),
        }
    }
}
