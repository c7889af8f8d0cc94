//! One segment file and its sparse index: scanning, recovery of a torn tail, reads.
//!
//! **Invariant:** a `Segment` is shared by the writer and readers; readers see records
//! only up to its published `end`, and only the writer moves it.
//!
//! Files, by role:
//! - `mod.rs`: `Segment`, its progress and sync, `Visibility` (`Sync=Always`).
//! - `open.rs`: making and opening segment files, the header check, the spare file.
//! - `files.rs`: its open files under the bound on open files: opened on demand, closed
//!   when idle and synced.
//! - `journaled.rs`: records made durable through the shared journal instead of a sync
//!   of the file (`Sync=Always`, several topics at once).
//! - `index.rs`: the sparse index: loading, checking, rebuilding, sealed writes.
//! - `read.rs`: reads, time lookups, the whole-segment check before sealing.
//! - `scan.rs`: scanning records from a known boundary.
//! - `footer.rs`: a sealed index's footer and when to believe it.
//! - `wholeness.rs`: whether a segment that was syncing at a crash lost records.

mod files;
mod footer;
mod index;
mod journaled;
mod open;
mod read;
mod scan;
mod wholeness;

use files::Held;
use footer::Unchecked;
use footer::{footer_agrees, footer_for, read_footer};
pub(crate) use index::{FromIndex, write_sealed_index};
use index::{entry_points_at_record, load_index_entries, starts_segment};
pub(crate) use journaled::Journaling;
use open::check_header;
pub(crate) use open::{RECYCLED_SUFFIX, header_flags, make_spare};
use read::read_chunk;
use scan::scan_all;
pub(crate) use scan::{ScanResult, ScanStart, scan, wants_entry};
pub(crate) use wholeness::{Known, Whole, wholeness};
use wholeness::{Probe, is_zero};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use bytes::{Bytes, BytesMut};

use crate::error::{Error, Result};
use crate::format::record::{self, Frame, Record};
use crate::format::segment::{
    self as fmt, FOOTER_LEN, INDEX_ENTRY_LEN, IndexEntry, SEGMENT_HEADER_LEN, SegmentSummary,
};
use crate::io::{DataFile, Fs, Holder, Seen};

/// Orders index uses across all segments (for unloading the least recently used).
static INDEX_CLOCK: AtomicU64 = AtomicU64::new(1);
/// Sealed indexes loaded and sealed files opened on demand, by every log: a log looks for
/// something to unload or close only when this moved since it last looked.
pub(crate) static LOADS: AtomicU64 = AtomicU64::new(0);

/// Bytes read per syscall when reading or scanning a segment.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Bytes read per syscall during recovery and index rebuilds.
const SCAN_CHUNK_BYTES: usize = 1024 * 1024;

/// The header a message-id lives in (the log only counts them).
pub const MESSAGE_ID_HEADER: &str = "message-id";

pub fn segment_file_name(base: u64) -> String {
    format!("{base:020}.log")
}
pub fn index_file_name(base: u64) -> String {
    format!("{base:020}.idx")
}

/// Set once, by the first failed write or sync of a topic: every later append fails.
pub type Poison = Arc<OnceLock<String>>;

/// `Err(Poisoned)` once `poison` is set.
pub fn check_poison(poison: &Poison) -> Result<()> {
    match poison.get() {
        Some(reason) => Err(Error::Poisoned {
            reason: reason.clone(),
        }),
        None => Ok(()),
    }
}

/// A segment shared between the topic's writer and its readers.
#[derive(Debug)]
pub struct Segment {
    pub base: u64,
    pub path: PathBuf,
    pub index_path: PathBuf,
    /// The open file, opened again on demand when closed. A sealed segment's is closed
    /// when the log has more open than `OPEN_SEALED_MAX` (least recently used first,
    /// `close_file`): a log of thousands of segments must not hold a descriptor for each
    /// (the default limit is often 1,024). Any segment's, the active one's too, is closed
    /// when the instance's files are over their bound and it is idle (the `Holder` impl,
    /// `files.rs`; under `Always` only once clean): thousands of topics must not hold one
    /// each either.
    file: RwLock<Option<Held>>,
    /// The active segment's index file, appended by the writer (`write_index`); closed
    /// like `file`, and for good at the seal (a sealed index is read whole, then closed).
    index_file: RwLock<Option<Held>>,
    /// When the file was last used (`INDEX_CLOCK`).
    file_used: AtomicU64,
    /// Set by every use of a file, cleared by the sweep of `OpenFiles` (its CLOCK mark).
    used: AtomicBool,
    /// Writes (and truncations) through `file`, counted after each returns, and how many
    /// of them the last successful sync began after: a file closed with writes no sync
    /// covered is opened again by the next sync (`sync_file`, see `files.rs`).
    writes: AtomicU64,
    synced_writes: AtomicU64,
    /// Itself, for `OpenFiles` to ask it to close its files (set by `shared`).
    me: std::sync::Weak<Segment>,
    /// Its key in `OpenFiles`.
    key: u64,
    /// Taken out of the log by retention (its files are being deleted): a read that fails
    /// to open it goes on from the log's new start.
    removed: AtomicBool,
    /// Sparse entries; for a sealed segment loaded on first use (`index_loaded`).
    index: RwLock<Vec<IndexEntry>>,
    index_loaded: AtomicBool,
    /// When the index was last used (`INDEX_CLOCK`), to unload the least recently used.
    index_used: AtomicU64,
    /// Bytes readers may read (header included). Stored after the data is written.
    end: AtomicU64,
    /// Offset after the last visible record.
    next: AtomicU64,
    first_ts: AtomicU64,
    last_ts: AtomicU64,
    id_count: AtomicU64,
    sealed: AtomicBool,
    /// Opened from its index's ends (`Known::Indexed`): not read whole yet (`check_whole`).
    unchecked: AtomicBool,
    /// How many leading index entries came from the index file unchecked: open checks an
    /// unsealed index's order and bounds and its last entry only, and the file is never
    /// synced, so damage from outside may leave a middle entry pointing elsewhere. A lookup
    /// checks such an entry against its record before it is used (`checked_entry`).
    unverified: AtomicUsize,
    /// Which of the `unverified` entries a lookup has checked since (one bit each): each is
    /// read against its record once, not at every cold read until the roll.
    passed: Mutex<Vec<u64>>,
    /// The summary's `id_count` and `first_ts` came from the index file unchecked (with
    /// `unverified` entries; a `reindex` fixes only the entries): recounted by the sealing.
    counts_unverified: AtomicBool,
    /// Its summary is a damaged segment's footer kept for want of better: never cached.
    doubtful: AtomicBool,
    /// Bytes known durable in the file itself (everything below was covered by a
    /// completed sync of it). Rolls, seals and close rely on it: only a sync of the file
    /// moves it.
    synced: AtomicU64,
    /// Bytes known durable through the shared journal (`journaled.rs`): publishers may
    /// return, readers may see them; the file is synced later (the journal's checkpoint).
    journaled: AtomicU64,
    /// The crc its header holds, read once for the journal (names this file in its
    /// entries: `format::journal`).
    header_crc: OnceLock<u32>,
    /// Under `Sync=Always` (`defer_visibility`): what the writer wrote that no sync has
    /// covered yet. Readers see a record only once it is durable: one a consumer saw and
    /// a power cut then lost would give its offset to another record.
    staged: OnceLock<Mutex<Staged>>,
    /// Held across each sync of the file and what it concludes (the poison or `synced`):
    /// Linux reports a writeback error to one `fsync` only, so a sync that succeeds
    /// beside a failing one must see the poison that one sets.
    sync_lock: Mutex<()>,
    /// A sync of this file failed: its dirty pages may be marked clean unwritten, so no
    /// later sync of it proves anything (the next open writes it again).
    sync_failed: AtomicBool,
    max_body: usize,
    poison: Poison,
    fs: Fs,
    /// Where the last read stopped: a read continuing from there (a consumer's next batch)
    /// skips the index lookup, the records between the index entry and its start, and the
    /// file read of what the last read had already read past it. Records never move, so it
    /// stays true.
    resume: Mutex<Resume>,
}

/// How a segment's records become visible once synced (`Segment::defer_visibility`),
/// shared by a log's segments.
pub(crate) struct Visibility {
    /// The log's `[earliest, next)` (`LogReader::bounds`): `next` moves with the segment's.
    bounds: Arc<[AtomicU64; 2]>,
    /// Wakes the topic's consumers (set once the engine has the runtime's wake-up).
    on_visible: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl Visibility {
    pub(crate) fn new(bounds: Arc<[AtomicU64; 2]>) -> Visibility {
        Visibility {
            bounds,
            on_visible: OnceLock::new(),
        }
    }

    /// Sets what runs after records became visible (once).
    pub(crate) fn set_on_visible(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.on_visible.set(f);
    }
}

impl std::fmt::Debug for Visibility {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Visibility")
            .field("bounds", &self.bounds)
            .finish_non_exhaustive()
    }
}

/// A stage taken out to be made durable: what was written, its index entries, and how to
/// show them.
type TakenStage = (SegmentSummary, Vec<IndexEntry>, Arc<Visibility>);

/// Whom to wake once records were shown (after the sync lock is released: a wake-up may
/// run a consumer's read of this segment).
pub(crate) struct Shown(Option<Arc<Visibility>>);

impl Shown {
    pub(crate) fn wake(self) {
        if let Some(f) = self.0.as_ref().and_then(|v| v.on_visible.get()) {
            f();
        }
    }
}

/// What the writer wrote past what readers see, until a sync covers it.
#[derive(Debug)]
struct Staged {
    written: SegmentSummary,
    /// Index entries of the records past `end`.
    entries: Vec<IndexEntry>,
    visibility: Arc<Visibility>,
}

/// The record after the last read, and the bytes read past it (below the segment's end as
/// it was then; without copying: a slice of the chunk that read).
#[derive(Debug)]
struct Resume {
    offset: u64,
    position: u64,
    ahead: Bytes,
}

impl Segment {
    pub fn end(&self) -> u64 {
        self.end.load(Ordering::Acquire)
    }
    pub fn next(&self) -> u64 {
        self.next.load(Ordering::Acquire)
    }
    pub fn is_sealed(&self) -> bool {
        self.sealed.load(Ordering::Acquire)
    }
    pub fn is_empty(&self) -> bool {
        self.next() == self.base
    }
    pub fn summary(&self) -> SegmentSummary {
        SegmentSummary {
            base: self.base,
            next: self.next(),
            bytes: self.end(),
            first_ts: self.first_ts.load(Ordering::Acquire),
            last_ts: self.last_ts.load(Ordering::Acquire),
            id_count: self.id_count.load(Ordering::Acquire),
        }
    }

    /// Readers see this segment's records only once a sync covered them (`Sync=Always`).
    /// Called before anything is appended to it.
    pub(crate) fn defer_visibility(&self, visibility: Arc<Visibility>) {
        let staged = Staged {
            written: self.summary(),
            entries: Vec::new(),
            visibility,
        };
        debug_assert!(self.staged.get().is_none(), "deferred once");
        let _ = self.staged.set(Mutex::new(staged));
    }

    /// The segment as its writer wrote it: ahead of `summary` (what readers see) while a
    /// sync is due under `defer_visibility`.
    pub(crate) fn written(&self) -> SegmentSummary {
        match self.staged.get() {
            Some(s) => lock_staged(s).written,
            None => self.summary(),
        }
    }

    /// Makes everything written so far durable. A failure poisons the topic: the kernel
    /// may have dropped the dirty pages, so a retry could report success falsely.
    pub fn sync(&self) -> Result<()> {
        if let Err(stopped) = self.check_poison() {
            self.sync_written();
            return Err(stopped);
        }
        let end = self.written().bytes;
        if self.synced.load(Ordering::Acquire) >= end {
            return Ok(());
        }
        self.sync_to(end)
    }

    /// In a stopped topic: the records below `end` were written whole before it stopped
    /// (a failed write never moves `end`), and under `Interval` their publishes returned
    /// as durable within the interval, so they are still synced (by the interval thread
    /// and by close), unless a sync of this file failed already. Vouches for nothing
    /// (`synced` stays): the topic answers `Poisoned` all the same.
    fn sync_written(&self) {
        let _one = self.sync_lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.sync_failed.load(Ordering::Acquire)
            || self.synced.load(Ordering::Acquire) >= self.written().bytes
        {
            return;
        }
        if let Err(e) = self.with_file(|f| f.sync_data()) {
            self.sync_failed.store(true, Ordering::Release);
            tracing::warn!(segment = %self.path.display(), error = %e,
                "syncing the records of a stopped topic failed");
        }
    }

    /// Syncs unconditionally (after a resize, which `sync` would not see as new data);
    /// never after a failure: a sync that succeeds then proves nothing (see `sync`).
    pub fn sync_after_resize(&self) -> Result<()> {
        self.sync_to(self.end())
    }

    /// Syncs the file and marks `end` (read before) durable, one sync at a time: a failed
    /// one has set the poison before the next looks (that one's success may only mean the
    /// error was reported already). Blocks other syncs of this segment, never its reads
    /// or appends. Under `defer_visibility` it then shows readers what it covered.
    fn sync_to(&self, end: u64) -> Result<()> {
        let one = self.sync_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.sync_holding(one, end)
    }

    /// `sync_to` with its lock taken (`one`).
    fn sync_holding(&self, one: std::sync::MutexGuard<'_, ()>, end: u64) -> Result<()> {
        self.check_poison()?;
        // Taken before the sync: all of it was written before, so the sync covers it.
        let staged = self.take_staged();
        self.sync_taken(one, end, staged)
    }

    /// What the writer wrote that readers do not see yet, taken out (its index entries
    /// go to whoever makes it durable).
    fn take_staged(&self) -> Option<TakenStage> {
        self.staged.get().map(|s| {
            let mut s = lock_staged(s);
            (
                s.written,
                std::mem::take(&mut s.entries),
                s.visibility.clone(),
            )
        })
    }

    /// `sync_holding` once `staged` is taken: syncs the file, then shows readers what it
    /// covered.
    fn sync_taken(
        &self,
        one: std::sync::MutexGuard<'_, ()>,
        end: u64,
        staged: Option<TakenStage>,
    ) -> Result<()> {
        let end = staged.as_ref().map_or(end, |(w, _, _)| w.bytes.max(end));
        let writes = self.writes_before_sync();
        // Either failure stops the topic (what was to be durable is not), but only a
        // failed sync may have dropped pages: a stopped topic's close still syncs a file
        // that could not be opened again for its sync (`sync_written`).
        self.sync_file().map_err(|(e, ran)| {
            if ran {
                self.sync_failed.store(true, Ordering::Release);
            }
            let _ = self.poison.set(format!("sync failed: {e}"));
            e
        })?;
        // Another file of the topic failed meanwhile: vouch for nothing more (a false
        // failure is safe, a false success is not).
        self.check_poison()?;
        // Visible before `synced` says durable: a publisher that sees its sync done and
        // returns finds its records readable (its consumers' wake-up finds them).
        let shown = self.show(staged);
        self.synced.fetch_max(end, Ordering::AcqRel);
        self.synced_writes(writes);
        drop(one);
        shown.wake();
        Ok(())
    }

    /// Shows readers the taken stage's records (now durable); returns whom to wake once
    /// the sync lock is released.
    fn show(&self, staged: Option<TakenStage>) -> Shown {
        match staged {
            Some((w, entries, visibility)) if w.next > self.next() => {
                self.publish_progress(w, &entries);
                visibility.bounds[1].fetch_max(w.next, Ordering::AcqRel);
                Shown(Some(visibility))
            }
            _ => Shown(None),
        }
    }

    /// Why writes to this segment's topic stopped, if a write or sync failed.
    pub fn poisoned(&self) -> Option<String> {
        self.poison.get().cloned()
    }

    /// `Err(Poisoned)` once a write or sync of this segment's topic failed.
    pub fn check_poison(&self) -> Result<()> {
        check_poison(&self.poison)
    }

    /// Whether the bytes below `end` are already durable (by a sync of the file or
    /// through the journal).
    pub fn is_synced_to(&self, end: u64) -> bool {
        self.durable_bytes() >= end
    }

    /// Called by the writer after appending `entries` and the bytes up to `end`. Under
    /// `defer_visibility` only noted (readers see them after the next sync); returns
    /// whether readers see them now.
    pub(crate) fn written_to(&self, w: SegmentSummary, entries: &[IndexEntry]) -> bool {
        debug_assert_eq!(w.base, self.base);
        let Some(staged) = self.staged.get() else {
            self.publish_progress(w, entries);
            return true;
        };
        let mut s = lock_staged(staged);
        debug_assert!(w.bytes >= s.written.bytes && w.next >= s.written.next);
        s.entries.extend_from_slice(entries);
        s.written = w;
        false
    }

    /// Shows readers the records up to `w`'s end.
    fn publish_progress(&self, w: SegmentSummary, entries: &[IndexEntry]) {
        if !entries.is_empty() {
            write_lock(&self.index).extend_from_slice(entries);
        }
        if self.is_empty() {
            self.first_ts.store(w.first_ts, Ordering::Release);
        }
        self.last_ts.store(w.last_ts, Ordering::Release);
        self.id_count.store(w.id_count, Ordering::Release);
        // `end` before `next`: a reader that sees the new `next` also sees the bytes.
        self.end.store(w.bytes, Ordering::Release);
        self.next.store(w.next, Ordering::Release);
    }

    pub(crate) fn mark_sealed(&self) {
        // Just written: tail readers are likely still on it, so it is not the first file
        // closed (an active segment's appends do not keep its `file_used`).
        self.file_used.store(
            INDEX_CLOCK.fetch_add(1, Ordering::Relaxed),
            Ordering::Relaxed,
        );
        self.sealed.store(true, Ordering::Release);
        // Read whole from now on (the sealed index was written by name).
        self.close_index();
    }
}

fn lock_staged(m: &Mutex<Staged>) -> std::sync::MutexGuard<'_, Staged> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn read_lock<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep serving it.
    l.read().unwrap_or_else(|e| e.into_inner())
}
pub(crate) fn write_lock<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}
