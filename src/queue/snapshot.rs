//! Snapshots: a consistent copy of the whole instance, taken while it runs.
//!
//! **Invariant:** the copy is a state a crash could have left. The catalog is copied as
//! of one read transaction (instant T); then each log is copied up to what its readers
//! see (T' >= T). Every catalog row refers only to records written before its commit
//! (the effect first, then the commit), so each row of T finds its records in the copy:
//! cursors, attempts and leases lie below the logs' ends; a dead-letter intent may or may
//! not find its copy, as after a crash, and the copy's open finishes it. Topics created
//! after T are left out; a topic the copy names is always there. Retention and record
//! deletion wait from before T until every file is linked or copied, so no file the plan
//! names goes away.
//!
//! Order on disk: the marker `SNAPSHOT-INCOMPLETE` first (synced), then the catalog, then
//! the logs (each file synced, then its directory), and the marker's removal last. A
//! copy cut short keeps its marker, and `open` refuses it.

use std::path::Path;

use super::Engine;
use super::engine::lock;
use crate::error::{Error, Result};
use crate::log::CopyStats;
use crate::names;

/// In a snapshot's directory while it is being made: `open` refuses a directory with it.
pub const INCOMPLETE_MARKER: &str = "SNAPSHOT-INCOMPLETE";

/// What [`Spool::snapshot`](crate::Spool::snapshot) copied.
///
/// `bytes` is `linked_bytes + copied_bytes`. Sealed segments are hard-linked (their bytes
/// are not copied, and take no new space on the same file system); the rest is copied:
/// the active segments up to their visible end, the index files and the catalog.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotInfo {
    /// Topics in the snapshot (dead-letter topics included).
    pub topics: usize,
    /// Consumer groups with durable state in the snapshot.
    pub groups: usize,
    /// Bytes linked or copied: `linked_bytes + copied_bytes`.
    pub bytes: u64,
    /// Bytes of the segment files hard-linked.
    pub linked_bytes: u64,
    /// Bytes copied: segments that are not sealed yet, index files, the catalog.
    pub copied_bytes: u64,
    /// Files hard-linked.
    pub linked_files: usize,
    /// Files copied (the catalog counts as one).
    pub copied_files: usize,
}

impl Engine {
    /// Copies the instance into `dest` (see the module docs); returns what it copied.
    /// `dest` must not exist, or be an empty directory, outside the data directory;
    /// otherwise nothing is written there.
    pub fn snapshot(&self, dest: &Path) -> Result<SnapshotInfo> {
        // Checked under the lock: two snapshots into one destination are one after the
        // other, and the second finds it taken.
        let _files = self.deletions.write().unwrap_or_else(|e| e.into_inner());
        self.check_destination(dest)?;
        let fs = &self.fs;
        fs.create_dir_all(dest)?;
        let marker = dest.join(INCOMPLETE_MARKER);
        fs.create_new(&marker)?;
        fs.sync_dir(dest)?;
        let topics_dir = dest.join("topics");
        fs.create_dir_all(&topics_dir)?;
        // Instant T.
        let catalog = self.catalog.copy_to(fs, &dest.join("catalog.redb"))?;
        let mut stats = CopyStats::default();
        for name in &catalog.topics {
            // Each becomes a directory's name (as at open).
            names::check(name).map_err(|e| {
                Error::corrupt(self.opts.data_source.join("catalog.redb"), e.to_string())
            })?;
            let dir = topics_dir.join(name);
            fs.create_dir_all(&dir)?;
            // A topic the catalog names is in the map once its creation's lock is let go.
            let Some(t) = self.topic(name) else {
                continue;
            };
            // The writer's lock only to read the segments and the active one's end.
            let plan = lock(&t.writer).log.copy_plan();
            stats.add(plan.write(fs, &dir)?);
        }
        fs.sync_dir(&topics_dir)?;
        fs.remove_file(&marker)?;
        fs.sync_dir(dest)?;
        let copied_bytes = stats.copied_bytes + catalog.bytes;
        Ok(SnapshotInfo {
            topics: catalog.topics.len(),
            groups: catalog.groups,
            bytes: stats.linked_bytes + copied_bytes,
            linked_bytes: stats.linked_bytes,
            copied_bytes,
            linked_files: stats.linked_files,
            copied_files: stats.copied_files + 1,
        })
    }

    /// `Err(SnapshotDestination)` unless `dest` is missing or an empty directory, outside
    /// the data directory.
    fn check_destination(&self, dest: &Path) -> Result<()> {
        let refuse = |reason: &str| {
            Err(Error::SnapshotDestination {
                path: dest.to_owned(),
                reason: reason.to_owned(),
            })
        };
        match self.fs.is_dir(dest) {
            Some(false) => return refuse("it is a file, not a directory"),
            Some(true) if !self.fs.list_dir(dest)?.is_empty() => {
                return refuse("the directory is not empty");
            }
            _ => {}
        }
        let (Some(source), Some(to)) = (
            self.fs.resolve(&self.opts.data_source),
            self.fs.resolve(dest),
        ) else {
            return refuse("cannot tell where it is (`..` after a directory that does not exist)");
        };
        if to.starts_with(&source) {
            return refuse("it is inside the data directory");
        }
        Ok(())
    }
}
