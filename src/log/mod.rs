//! One topic's log: a directory of segments, appended by one writer, read by many readers.
//!
//! **Invariants:**
//! - The log knows records and offsets, never groups or the catalog.
//! - Offsets are dense from the first segment's base to `next`.
//! - Only the last segment is written.
//! - Under `Always` and `Interval` a segment is synced before the next one is created.
//!   Under `None` at most `MAX_SEALING` rolled segments may still be unsynced, and
//!   recovery cuts the log back to the first loss, so it stays a prefix.
//! - Readers never see bytes past a segment's published `end`.
//!
//! Files, by role:
//! - `mod.rs`: `TopicLog` (the writer), `LogReader` (the read handle), their config.
//! - `open.rs`: recovery at open, step by step.
//! - `append.rs`: encoding and writing batches (big payloads not copied), zeros ahead,
//!   held records.
//! - `roll.rs`: starting the next segment (spare, kept file, or new).
//! - `sealing.rs`: sealing segments, inline or in the background.
//! - `read.rs`: batched reads, time lookups, message ids for de-duplication.
//! - `retention.rs`: deleting whole sealed segments.
//! - `snapshot.rs`: the files of a consistent copy of the log (links and copies).
//! - `verify.rs`: reading every record and index entry back, read-only (`spool verify`).
//! - `summaries.rs`: the `sealed.sum` cache that spares open a read per segment.
//! - `eviction.rs`: bounds on open files and loaded indexes.
//! - `segment/`: one segment file and its index.
//! - `explore.rs`, `kill_points.rs`, `test_support.rs`: tests only.
//!
//! Design detail: `docs/internals.md`, section `log/`.

mod append;
mod eviction;
mod open;
mod read;
mod retention;
mod roll;
mod sealing;
pub mod segment;
mod snapshot;
mod summaries;
mod verify;

use append::Pending;
use sealing::Sealing;
pub use snapshot::CopyStats;
use summaries::Summaries;
pub use verify::{Damage, LogCheck, plan_closed};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use crate::error::{Error, Result};
use crate::format::Headers;
use crate::format::record::{self, Record};
use crate::format::segment::{
    FLAG_FOLLOWS_UNSYNCED, FLAG_SPARE, FOOTER_LEN, INDEX_ENTRY_LEN, IndexEntry, SEGMENT_HEADER_LEN,
    SegmentSummary, decode_footer, encode_entry, encode_footer,
};
use crate::io::{DataFile, FileStat, Fs};
pub use segment::MESSAGE_ID_HEADER;
use segment::{Poison, Segment, Visibility, read_lock, wants_entry, write_lock};

/// Segments a `Sync=None` writer may have sealed whose background sync has not finished:
/// how far publishing may run ahead of the disk, and how many segments before the active
/// one recovery must check for records a power cut took away.
const MAX_SEALING: usize = 2;
/// In a topic's directory: the `boot_mark` of the last open that checked the log in full.
pub(crate) const BOOT_MARK_FILE: &str = "boot.mark";

/// In a topic's directory: the summaries of its sealed segments, appended as each is
/// sealed (a cache, never synced; each entry crc'd like an index footer, see `Summaries`).
pub(crate) const SUMMARIES_FILE: &str = "sealed.sum";

/// Segment files retention keeps for later rolls to reuse (`preallocate`), bounding the
/// disk space they hold; a topic that rolls more often than this between two retention
/// checks (64 MiB segments at over 128 MB/s with the 1 s default) makes the rest anew,
/// with zeros ahead.
const MAX_RECYCLED: usize = 2;

/// How a log lays out its files.
#[derive(Clone, Copy, Debug)]
pub struct LogConfig {
    pub segment_bytes: u64,
    pub index_interval_bytes: u64,
    /// Largest record body the reader accepts (bounds allocation on corrupt lengths).
    pub max_body: usize,
    /// Write zeros ahead of the records (pays off only when every append is synced).
    pub preallocate: bool,
    /// Readers see a record only once a sync covered it (`Sync=Always`: a record a
    /// consumer saw is never lost to a power cut; see `Segment::defer_visibility`).
    pub visible_when_synced: bool,
    /// Sync and index a sealed segment in the background instead of in the roll
    /// (`Sync=None`: no publish waits for the disk, and recovery cuts the log back to the
    /// first loss, see `open`).
    pub seal_in_background: bool,
}

/// What the log reports about itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    pub earliest: u64,
    pub next: u64,
    pub bytes: u64,
    pub segments: usize,
}

/// A cheap, clonable read handle.
#[derive(Clone, Debug)]
pub struct LogReader {
    segments: Arc<RwLock<Vec<Arc<Segment>>>>,
    /// `[earliest, next)`: kept beside the list so hot paths need no lock. `next` is
    /// stored after the records are visible in their segment.
    bounds: Arc<[AtomicU64; 2]>,
    /// The first offset readers may see when records before the first segment's end were
    /// deleted (`TopicLog::delete_before`); 0 otherwise. `bounds[0]` is never below it.
    start: Arc<AtomicU64>,
    /// `segment::LOADS` when this log last unloaded indexes and closed files.
    swept: Arc<AtomicU64>,
    cfg: LogConfig,
}

/// The single writer of a topic's log. Callers serialise access (one `&mut`).
#[derive(Debug)]
pub struct TopicLog {
    fs: Fs,
    dir: PathBuf,
    cfg: LogConfig,
    reader: LogReader,
    active: Arc<Segment>,
    /// Position of the active segment's last index entry.
    last_entry: Option<u64>,
    /// Entries in the active segment's index file.
    index_count: u64,
    /// Length of the active segment file: zeros are written ahead of the records so that
    /// a sync after an append only flushes data, not a size change (see `flush`).
    allocated: u64,
    /// How many zeros the next extension writes ahead: from `PREALLOCATE_MIN_BYTES`,
    /// doubled at each extension up to `PREALLOCATE_BYTES`, so that the zeros ahead of a
    /// quiet topic stay small and a busy one soon gets the full run (see `preallocate`).
    preallocate_step: u64,
    /// Where the old records end in an active segment reused from a kept file (0: none
    /// are left). Below it, each write of records is preceded by zeros over its range and
    /// a frame header past it: the old bytes at the end of the new records could hold a
    /// valid frame (inside an old payload, which a publisher chose) that a scan after a
    /// reopen would take for the next record.
    stale_until: u64,
    /// Below `stale_until`: the bytes from the active segment's end up to here are zeros
    /// (written by `flush`, at least a frame header past the records).
    zeroed_to: u64,
    buf: Vec<u8>,
    index_buf: Vec<u8>,
    /// The index entries of the batch being appended (kept: no allocation per append).
    entries: Vec<IndexEntry>,
    /// Records `append_held` encoded into `buf` and not written yet: `write_held` writes
    /// them, as does the next `append`, `sync` or `quiesce`. Always on the active
    /// segment: a roll writes them first.
    held: Option<Pending>,
    /// The newest timestamp of a written record (held ones are in `held`, whose `last_ts`
    /// the next append goes on from). A new segment's records are
    /// stamped no older, so timestamps never go back across the log: not when the clock
    /// steps back, nor when two publishers read the clock in one order and take the
    /// writer's lock in the other (`offset_for_time` and `Delivery::timestamp` rely on it).
    newest_ts: u64,
    poison: Poison,
    /// Background sealings (`seal_in_background`) by segment base, oldest first: only of
    /// the `MAX_SEALING` segments before the active one, the only ones that can be unsynced.
    sealing: std::collections::VecDeque<(u64, Sealing)>,
    /// The spare file the next roll renames into a segment (`seal_in_background`), being
    /// made on a thread; a roll that finds it unfinished creates the segment itself.
    spare: Option<std::thread::JoinHandle<Result<()>>>,
    /// Files of segments retention deleted, kept (`preallocate`) for rolls to overwrite
    /// instead of writing zeros ahead (`MAX_RECYCLED` at most).
    recycled: Vec<PathBuf>,
    summaries: Arc<Summaries>,
    /// Under `visible_when_synced`: what every active segment shows readers through.
    visibility: Option<Arc<Visibility>>,
}

/// One message to append.
pub struct Append<'a> {
    pub payload: &'a [u8],
    pub headers: &'a Headers,
    /// `record::headers_len(headers)`, computed once by the caller's validation.
    pub headers_len: usize,
}

impl TopicLog {
    pub fn reader(&self) -> &LogReader {
        &self.reader
    }

    /// The segment a publish must sync to be durable.
    pub fn active(&self) -> &Arc<Segment> {
        &self.active
    }

    /// The offset the next append gets (records held included).
    pub fn next(&self) -> u64 {
        self.held
            .as_ref()
            .map_or_else(|| self.active.written().next, |p| p.next)
    }

    /// Where the active segment ends once what is held is written: a publish must sync
    /// it to here to be durable.
    pub fn end(&self) -> u64 {
        self.held
            .as_ref()
            .map_or_else(|| self.active.written().bytes, |p| p.end)
    }

    /// Sets what runs after a sync made records visible (`visible_when_synced`; the
    /// engine wakes the topic's consumers).
    pub fn set_on_visible(&self, f: Box<dyn Fn() + Send + Sync>) {
        if let Some(v) = &self.visibility {
            v.set_on_visible(f);
        }
    }

    /// Whether readers see what an append writes as soon as it is written.
    pub fn visible_when_written(&self) -> bool {
        self.visibility.is_none()
    }

    /// The offset after the last record written to the file (records held excluded;
    /// under `visible_when_synced` ahead of what readers see until the next sync).
    #[cfg(test)]
    pub fn written_next(&self) -> u64 {
        self.active.written().next
    }

    /// Whether records are held (`append_held`) and not written yet.
    pub fn holds(&self) -> bool {
        self.held.is_some()
    }

    fn check_poison(&self) -> Result<()> {
        segment::check_poison(&self.poison)
    }
}

impl Drop for TopicLog {
    fn drop(&mut self) {
        // Without `quiesce` (a dropped engine): still no thread outlives the log.
        let _ = self.quiesce();
    }
}

fn parse_base(stem: &str) -> Option<u64> {
    if stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()) {
        stem.parse().ok()
    } else {
        None
    }
}

#[cfg(test)]
mod explore;
#[cfg(test)]
mod kill_points;

#[cfg(test)]
mod test_support;
