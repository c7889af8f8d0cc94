//! The catalog: one redb file holding topics, group state, attempt counters and
//! dead-letter intents. **Invariants:** the only module importing redb and postcard for
//! catalog values; never reads segments; every commit is `Durability::Immediate`, so a
//! commit that returned survives a power cut.
//!
//! Group commit: every write goes through one committer thread, which takes all queued
//! change sets, applies them in queue order in one transaction and answers them all.
//!
//! Durable acks go a cheaper way: an ack queues its group's [`Snapshotter`] (once until
//! the committer takes it) and gets a *ticket*; the committer takes the group's image
//! itself when it writes, one image per commit however many acks came meanwhile, and then
//! moves the durable watermark of [`AckWatch`] over every ticket the commit covers. Every
//! group image carries the sequence number it was taken with, and an image older than one
//! already written is skipped, so images reach the catalog newest-last whichever path
//! wrote them.
//!
//! Files, by role:
//! - `mod.rs`: the tables, the records stored in them, `Catalog` (open and reads).
//! - `committer.rs`: the committer thread, group images, the ack watermark.
//! - `storage.rs`: redb's storage backend over the crate's file seam.
//! - `copy.rs`: a copy of every table as of one instant (snapshots).

mod committer;
mod copy;
mod storage;

pub use committer::{AckWatch, Done, Queued, Snapshotter};
use committer::{Job, Msg, run_committer};
use storage::FileStorage;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::task::Waker;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::io::{FileIo, Fs};
use crate::parked::Parked;

/// Bumped on any incompatible change to the tables below.
pub const CATALOG_FORMAT_VERSION: u32 = 1;

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const TOPICS: TableDefinition<&str, &[u8]> = TableDefinition::new("topics");
const GROUPS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("groups");
const ATTEMPTS: TableDefinition<(&str, &str, u64), &[u8]> = TableDefinition::new("attempts");
const DEAD_LETTER_INTENTS: TableDefinition<(&str, &str, u64), &[u8]> =
    TableDefinition::new("dead_letter_intents");
/// Per topic, the first offset readers may see (`delete_records_before`); a topic without
/// a row starts at its first segment. Added later: an older catalog gets it at open.
const TOPIC_STARTS: TableDefinition<&str, u64> = TableDefinition::new("topic_starts");
/// Per topic, its overrides (`TopicConfigRecord`, postcard); added like `TOPIC_STARTS`.
const TOPIC_CONFIGS: TableDefinition<&str, &[u8]> = TableDefinition::new("topic_configs");

const META_FORMAT: &str = "format_version";
const META_CLEAN: &str = "clean_shutdown";

/// A topic known to the instance.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicRecord {
    pub created_ms: u64,
}

/// A topic's overrides of the instance's retention settings (`None`: the instance's).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicConfigRecord {
    pub retention_bytes: Option<u64>,
    pub retention_ms: Option<u64>,
    /// 0 `Limits`, 1 `Acked`.
    pub retention_policy: Option<u8>,
}

/// A consumer group's durable state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRecord {
    /// The next offset not yet finished (acked or dead-lettered).
    pub cursor: u64,
    /// Bumped by every reset; deliveries of older epochs are stale.
    pub epoch: u64,
    /// Offsets above the cursor already finished (out-of-order acks), ascending.
    pub done_above: Vec<u64>,
    /// Offsets handed out and not finished when this record was written.
    pub in_flight: Vec<u64>,
    /// No offset at or above this was ever handed out (see `queue::group`).
    pub lease_end: u64,
    pub dead_lettered: u64,
    pub skipped: u64,
}

/// Delivery attempts of one offset that were nacked (or cut short by a crash).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub attempts: u32,
    pub last_reason: String,
    /// Not delivered again before this wall-clock time (ms since the Unix epoch; 0: at
    /// once). Written by a nack with a delay or a `Nack Backoff`.
    pub not_before_ms: u64,
}

/// An attempt row as written before delays existed (postcard is not self-describing: a
/// row without the trailing field fails to decode as [`AttemptRecord`]).
#[derive(Deserialize)]
struct AttemptRecordV1 {
    attempts: u32,
    last_reason: String,
}

/// Decodes an attempt row of either format.
fn dec_attempt(path: &Path, b: &[u8]) -> Result<AttemptRecord> {
    dec(path, b).or_else(|e| {
        let old: AttemptRecordV1 = dec(path, b).map_err(|_| e)?;
        Ok(AttemptRecord {
            attempts: old.attempts,
            last_reason: old.last_reason,
            not_before_ms: 0,
        })
    })
}

/// Written before a dead-letter copy is appended: the copy, if it exists, is at or after
/// `dlq_from` in the dead-letter topic.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterIntent {
    /// The group's epoch when the intent was written (a reset makes it stale).
    pub epoch: u64,
    pub dlq_topic: String,
    pub dlq_from: u64,
    pub attempts: u32,
    pub reason: String,
}

/// One change; a slice of them commits atomically.
#[derive(Clone, Debug)]
pub enum Op {
    PutTopic(String, TopicRecord),
    /// Forgets a topic whose creation failed (its entry, start and overrides; it has no
    /// group yet).
    DeleteTopic(String),
    /// A group image and its snapshot sequence number (per group, increasing with its
    /// state): an image older than one already written is not written.
    PutGroup(String, String, GroupRecord, u64),
    PutAttempt(String, String, u64, AttemptRecord),
    DeleteAttempt(String, String, u64),
    ClearAttempts(String, String),
    /// Forgets a group: its image, attempt rows and dead-letter intents.
    DeleteGroup(String, String),
    /// Sets the first offset readers of a topic may see (`delete_records_before`).
    SetTopicStart(String, u64),
    /// Sets a topic's overrides.
    PutTopicConfig(String, TopicConfigRecord),
    PutIntent(String, String, u64, DeadLetterIntent),
    DeleteIntent(String, String, u64),
    SetClean(bool),
}

pub struct Catalog {
    db: Arc<Database>,
    path: std::path::PathBuf,
    tx: Mutex<Option<mpsc::Sender<Msg>>>,
    acks: Arc<AckWatch>,
    committer: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Catalog {
    fn drop(&mut self) {
        drop(self.tx.lock().unwrap_or_else(|e| e.into_inner()).take());
        if let Some(t) = self
            .committer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog").field("path", &self.path).finish()
    }
}

fn cat_err(context: &str, e: impl std::fmt::Display) -> Error {
    Error::Catalog {
        context: context.to_owned(),
        detail: e.to_string(),
    }
}

fn enc<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    postcard::to_allocvec(v).map_err(|e| cat_err("encoding a value", e))
}

fn dec<T: for<'a> Deserialize<'a>>(path: &Path, b: &[u8]) -> Result<T> {
    postcard::from_bytes(b).map_err(|e| Error::corrupt(path, format!("catalog value: {e}")))
}

impl Catalog {
    /// Opens or creates `catalog.redb`; refuses a catalog of a newer format. A new catalog
    /// is built under a temporary name and renamed into place, so a stop during its
    /// creation never leaves a half-made file behind. On a simulated file system the file
    /// goes through [`crate::io::FileIo`].
    pub fn open(fs: &Fs, path: &Path) -> Result<Catalog> {
        let tmp = path.with_extension("redb.new");
        fs.remove_file(&tmp)?;
        if fs.is_dir(path).is_none() {
            init(&open_db(fs, &tmp)?, &tmp)?;
            fs.rename(&tmp, path)?;
            if let Some(dir) = path.parent() {
                fs.sync_dir(dir)?;
            }
        } else if fs.open(path)?.len()? == 0 {
            // A catalog is only ever renamed into place whole, so an empty one was damaged
            // from outside; redb would quietly start a new one and every cursor would be lost.
            return Err(Error::corrupt(
                path,
                "the catalog file is empty (truncated from outside?); restore it from a backup",
            ));
        }
        let db = open_db(fs, path)?;
        init(&db, path)?;
        let db = Arc::new(db);
        let (tx, rx) = mpsc::channel::<Msg>();
        let acks = Arc::new(AckWatch::new());
        let committer = {
            let db = db.clone();
            let acks = acks.clone();
            std::thread::Builder::new()
                .name("spool-catalog".into())
                .spawn(move || run_committer(&db, &rx, &acks))
                .map_err(|e| Error::io("starting the catalog thread", e))?
        };
        Ok(Catalog {
            db,
            path: path.to_owned(),
            tx: Mutex::new(Some(tx)),
            acks,
            committer: Mutex::new(Some(committer)),
        })
    }

    /// Queues `ops`; `done` runs once they are durable (shared with concurrent commits).
    pub fn commit_then(&self, ops: Vec<Op>, done: Done) {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let msg = Msg::Job(Job { ops, done });
        let unsent = match tx.as_ref() {
            Some(tx) => tx.send(msg).err().map(|mpsc::SendError(m)| m),
            None => Some(msg),
        };
        if let Some(Msg::Job(job)) = unsent {
            (job.done)(Err("the catalog is closed".into()));
        }
    }

    /// A ticket for a change already made to the state of `snapshotter`, which is queued
    /// when `queue` (it was not queued yet); the ticket is durable once [`AckWatch`] says
    /// so. Call under the state's lock (see [`Snapshotter`]).
    pub fn ack_ticket(&self, snapshotter: &Arc<dyn Snapshotter>, queue: bool) -> Result<u64> {
        if queue {
            let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
            let sent = tx
                .as_ref()
                .is_some_and(|tx| tx.send(Msg::Snapshot(snapshotter.clone())).is_ok());
            if !sent {
                return Err(cat_err("committing", "the catalog is closed"));
            }
        }
        Ok(self.acks.issued.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// Where durable acks learn that their ticket is decided.
    pub fn ack_watch(&self) -> &Arc<AckWatch> {
        &self.acks
    }

    /// Applies `ops` durably, waiting for the commit (which may cover other callers' ops).
    pub fn commit(&self, ops: &[Op]) -> Result<()> {
        let mut q = self.queue();
        q.push(ops.to_vec());
        q.wait()
    }

    /// Change sets queued one at a time, each while its caller holds the lock that orders
    /// it against other commits of the same state, and waited for together.
    pub fn queue(&self) -> Queued<'_> {
        let (tx, rx) = mpsc::channel();
        Queued {
            catalog: self,
            tx,
            rx,
            count: 0,
        }
    }

    /// Whether the last instance closed cleanly.
    pub fn was_clean(&self) -> Result<bool> {
        let txn = self.db.begin_read().map_err(|e| cat_err("reading", e))?;
        let meta = txn.open_table(META).map_err(|e| cat_err("reading", e))?;
        match meta.get(META_CLEAN).map_err(|e| cat_err("reading", e))? {
            Some(v) => dec(&self.path, v.value()),
            None => Ok(true),
        }
    }

    pub fn topics(&self) -> Result<BTreeMap<String, TopicRecord>> {
        let txn = self.db.begin_read().map_err(|e| cat_err("reading", e))?;
        let t = txn.open_table(TOPICS).map_err(|e| cat_err("reading", e))?;
        let mut out = BTreeMap::new();
        for row in t.iter().map_err(|e| cat_err("reading", e))? {
            let (k, v) = row.map_err(|e| cat_err("reading", e))?;
            out.insert(k.value().to_owned(), dec(&self.path, v.value())?);
        }
        Ok(out)
    }

    /// Per topic, the first offset readers may see, where records before its first
    /// segment's were deleted (`Op::SetTopicStart`). One read for every topic at open.
    pub fn topic_starts(&self) -> Result<HashMap<String, u64>> {
        let txn = self.db.begin_read().map_err(|e| cat_err("reading", e))?;
        let t = txn
            .open_table(TOPIC_STARTS)
            .map_err(|e| cat_err("reading", e))?;
        let mut out = HashMap::new();
        for row in t.iter().map_err(|e| cat_err("reading", e))? {
            let (k, v) = row.map_err(|e| cat_err("reading", e))?;
            out.insert(k.value().to_owned(), v.value());
        }
        Ok(out)
    }

    /// Per topic, its overrides (`Op::PutTopicConfig`); topics without any are absent.
    pub fn topic_configs(&self) -> Result<HashMap<String, TopicConfigRecord>> {
        let txn = self.db.begin_read().map_err(|e| cat_err("reading", e))?;
        let t = txn
            .open_table(TOPIC_CONFIGS)
            .map_err(|e| cat_err("reading", e))?;
        let mut out = HashMap::new();
        for row in t.iter().map_err(|e| cat_err("reading", e))? {
            let (k, v) = row.map_err(|e| cat_err("reading", e))?;
            out.insert(k.value().to_owned(), dec(&self.path, v.value())?);
        }
        Ok(out)
    }

    /// Every group of every topic: `(topic, group) -> record`.
    pub fn groups(&self) -> Result<BTreeMap<(String, String), GroupRecord>> {
        let txn = self.db.begin_read().map_err(|e| cat_err("reading", e))?;
        let t = txn.open_table(GROUPS).map_err(|e| cat_err("reading", e))?;
        let mut out = BTreeMap::new();
        for row in t.iter().map_err(|e| cat_err("reading", e))? {
            let (k, v) = row.map_err(|e| cat_err("reading", e))?;
            let (topic, group) = k.value();
            out.insert(
                (topic.to_owned(), group.to_owned()),
                dec(&self.path, v.value())?,
            );
        }
        Ok(out)
    }

    pub fn attempts(&self, topic: &str, group: &str) -> Result<BTreeMap<u64, AttemptRecord>> {
        let txn = self.db.begin_read().map_err(|e| cat_err("reading", e))?;
        let t = txn
            .open_table(ATTEMPTS)
            .map_err(|e| cat_err("reading", e))?;
        let mut out = BTreeMap::new();
        for row in t
            .range((topic, group, 0)..=(topic, group, u64::MAX))
            .map_err(|e| cat_err("reading", e))?
        {
            let (k, v) = row.map_err(|e| cat_err("reading", e))?;
            out.insert(k.value().2, dec_attempt(&self.path, v.value())?);
        }
        Ok(out)
    }

    /// The dead-letter intent of `(topic, group, offset)`, if one is recorded.
    pub fn intent(
        &self,
        topic: &str,
        group: &str,
        offset: u64,
    ) -> Result<Option<DeadLetterIntent>> {
        let txn = self.db.begin_read().map_err(|e| cat_err("reading", e))?;
        let t = txn
            .open_table(DEAD_LETTER_INTENTS)
            .map_err(|e| cat_err("reading", e))?;
        match t
            .get((topic, group, offset))
            .map_err(|e| cat_err("reading", e))?
        {
            Some(v) => dec(&self.path, v.value()).map(Some),
            None => Ok(None),
        }
    }

    /// Dead-letter intents left by a stop between the intent and its completion.
    pub fn intents(&self) -> Result<Vec<(String, String, u64, DeadLetterIntent)>> {
        let txn = self.db.begin_read().map_err(|e| cat_err("reading", e))?;
        let t = txn
            .open_table(DEAD_LETTER_INTENTS)
            .map_err(|e| cat_err("reading", e))?;
        let mut out = Vec::new();
        for row in t.iter().map_err(|e| cat_err("reading", e))? {
            let (k, v) = row.map_err(|e| cat_err("reading", e))?;
            let (topic, group, offset) = k.value();
            out.push((
                topic.to_owned(),
                group.to_owned(),
                offset,
                dec(&self.path, v.value())?,
            ));
        }
        Ok(out)
    }
}

fn open_db(fs: &Fs, path: &Path) -> Result<Database> {
    let deadline = std::time::Instant::now() + crate::io::LOCK_WAIT;
    let db = loop {
        let db = if fs.is_real() {
            Database::create(path)
        } else {
            redb::Builder::new().create_with_backend(FileStorage(fs.open_or_create_raw(path)?))
        };
        // redb's file lock has the same fork window as the directory lock.
        match db {
            Err(redb::DatabaseError::DatabaseAlreadyOpen)
                if std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            other => break other,
        }
    };
    db.map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => Error::Locked {
            path: path.to_owned(),
        },
        redb::DatabaseError::Storage(redb::StorageError::Io(io)) => {
            Error::io(format!("opening {}", path.display()), io)
        }
        other => Error::corrupt(path, format!("cannot open the catalog: {other}")),
    })
}

/// Checks the format version (writing it into a new catalog) and creates missing tables.
fn init(db: &Database, path: &Path) -> Result<()> {
    let txn = db.begin_write().map_err(|e| cat_err("opening", e))?;
    {
        let mut meta = txn.open_table(META).map_err(|e| cat_err("opening", e))?;
        let found = meta
            .get(META_FORMAT)
            .map_err(|e| cat_err("reading the format", e))?
            .map(|v| dec::<u32>(path, v.value()))
            .transpose()?;
        match found {
            Some(v) if v > CATALOG_FORMAT_VERSION => {
                return Err(Error::Unsupported {
                    what: format!(
                        "catalog format version {v} was written by a newer spool (this one reads {CATALOG_FORMAT_VERSION})"
                    ),
                });
            }
            Some(_) => {}
            None => {
                meta.insert(META_FORMAT, enc(&CATALOG_FORMAT_VERSION)?.as_slice())
                    .map_err(|e| cat_err("writing the format", e))?;
                meta.insert(META_CLEAN, enc(&true)?.as_slice())
                    .map_err(|e| cat_err("writing the format", e))?;
            }
        }
        txn.open_table(TOPICS).map_err(|e| cat_err("opening", e))?;
        txn.open_table(GROUPS).map_err(|e| cat_err("opening", e))?;
        txn.open_table(ATTEMPTS)
            .map_err(|e| cat_err("opening", e))?;
        txn.open_table(DEAD_LETTER_INTENTS)
            .map_err(|e| cat_err("opening", e))?;
        txn.open_table(TOPIC_STARTS)
            .map_err(|e| cat_err("opening", e))?;
        txn.open_table(TOPIC_CONFIGS)
            .map_err(|e| cat_err("opening", e))?;
    }
    txn.commit().map_err(|e| cat_err("creating tables", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attempt rows written before delays existed (no `not_before_ms`) still decode, as
    /// "at once"; new rows keep their delay.
    #[test]
    fn an_attempt_row_of_either_format_decodes() {
        #[derive(Serialize)]
        struct V1 {
            attempts: u32,
            last_reason: String,
        }
        let path = Path::new("catalog.redb");
        let old = enc(&V1 {
            attempts: 3,
            last_reason: "boom".into(),
        })
        .expect("encode");
        let got = dec_attempt(path, &old).expect("an old row decodes");
        assert_eq!((got.attempts, got.not_before_ms), (3, 0));
        assert_eq!(got.last_reason, "boom");
        let new = AttemptRecord {
            not_before_ms: 77,
            ..got
        };
        let back = dec_attempt(path, &enc(&new).expect("encode")).expect("decodes");
        assert_eq!(back, new);
        assert!(
            dec_attempt(path, &[0xff]).is_err(),
            "damage is still an error"
        );
    }
}
