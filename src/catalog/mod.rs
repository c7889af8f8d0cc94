//! The catalog: one redb file holding topics, group state, attempt counters and
//! dead-letter intents. **Invariants:** the only module importing redb and postcard for
//! catalog values; never reads segments; every commit is `Durability::Immediate`, so a
//! commit that returned survives a power cut (callers batch to share the fsync).

use std::collections::BTreeMap;
use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Bumped on any incompatible change to the tables below.
pub const CATALOG_FORMAT_VERSION: u32 = 1;

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const TOPICS: TableDefinition<&str, &[u8]> = TableDefinition::new("topics");
const GROUPS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("groups");
const ATTEMPTS: TableDefinition<(&str, &str, u64), &[u8]> = TableDefinition::new("attempts");
const DEAD_LETTER_INTENTS: TableDefinition<(&str, &str, u64), &[u8]> =
    TableDefinition::new("dead_letter_intents");

const META_FORMAT: &str = "format_version";
const META_CLEAN: &str = "clean_shutdown";

/// A topic known to the instance.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicRecord {
    pub created_ms: u64,
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
}

/// Written before a dead-letter copy is appended: the copy, if it exists, is at or after
/// `dlq_from` in the dead-letter topic.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterIntent {
    pub dlq_topic: String,
    pub dlq_from: u64,
    pub attempts: u32,
    pub reason: String,
}

/// One change; a slice of them commits atomically.
#[derive(Clone, Debug)]
pub enum Op {
    PutTopic(String, TopicRecord),
    PutGroup(String, String, GroupRecord),
    PutAttempt(String, String, u64, AttemptRecord),
    DeleteAttempt(String, String, u64),
    ClearAttempts(String, String),
    PutIntent(String, String, u64, DeadLetterIntent),
    DeleteIntent(String, String, u64),
    SetClean(bool),
}

pub struct Catalog {
    db: Database,
    path: std::path::PathBuf,
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
    /// Opens or creates `catalog.redb`; refuses a catalog of a newer format.
    pub fn open(path: &Path) -> Result<Catalog> {
        let db = Database::create(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => Error::Locked {
                path: path.to_owned(),
            },
            redb::DatabaseError::Storage(redb::StorageError::Io(io)) => {
                Error::io(format!("opening {}", path.display()), io)
            }
            other => Error::corrupt(path, format!("cannot open the catalog: {other}")),
        })?;
        let cat = Catalog {
            db,
            path: path.to_owned(),
        };
        let txn = cat.db.begin_write().map_err(|e| cat_err("opening", e))?;
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
        }
        txn.commit().map_err(|e| cat_err("creating tables", e))?;
        Ok(cat)
    }

    /// Applies `ops` in one durable transaction.
    pub fn commit(&self, ops: &[Op]) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let txn = self
            .db
            .begin_write()
            .map_err(|e| cat_err("committing", e))?;
        {
            let mut topics = txn
                .open_table(TOPICS)
                .map_err(|e| cat_err("committing", e))?;
            let mut groups = txn
                .open_table(GROUPS)
                .map_err(|e| cat_err("committing", e))?;
            let mut attempts = txn
                .open_table(ATTEMPTS)
                .map_err(|e| cat_err("committing", e))?;
            let mut intents = txn
                .open_table(DEAD_LETTER_INTENTS)
                .map_err(|e| cat_err("committing", e))?;
            let mut meta = txn.open_table(META).map_err(|e| cat_err("committing", e))?;
            let w = |e: redb::StorageError| cat_err("writing", e);
            for op in ops {
                match op {
                    Op::PutTopic(t, r) => {
                        topics.insert(t.as_str(), enc(r)?.as_slice()).map_err(w)?;
                    }
                    Op::PutGroup(t, g, r) => {
                        groups
                            .insert((t.as_str(), g.as_str()), enc(r)?.as_slice())
                            .map_err(w)?;
                    }
                    Op::PutAttempt(t, g, o, r) => {
                        attempts
                            .insert((t.as_str(), g.as_str(), *o), enc(r)?.as_slice())
                            .map_err(w)?;
                    }
                    Op::DeleteAttempt(t, g, o) => {
                        attempts.remove((t.as_str(), g.as_str(), *o)).map_err(w)?;
                    }
                    Op::ClearAttempts(t, g) => {
                        let (t, g) = (t.as_str(), g.as_str());
                        attempts
                            .retain_in((t, g, 0)..=(t, g, u64::MAX), |_, _| false)
                            .map_err(w)?;
                    }
                    Op::PutIntent(t, g, o, r) => {
                        intents
                            .insert((t.as_str(), g.as_str(), *o), enc(r)?.as_slice())
                            .map_err(w)?;
                    }
                    Op::DeleteIntent(t, g, o) => {
                        intents.remove((t.as_str(), g.as_str(), *o)).map_err(w)?;
                    }
                    Op::SetClean(c) => {
                        meta.insert(META_CLEAN, enc(c)?.as_slice()).map_err(w)?;
                    }
                }
            }
        }
        txn.commit().map_err(|e| cat_err("committing", e))
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
            out.insert(k.value().2, dec(&self.path, v.value())?);
        }
        Ok(out)
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
