//! One segment file and its sparse index: scanning, recovery of a torn tail, reads.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use bytes::{Bytes, BytesMut};

use crate::error::{Error, Result};
use crate::format::record::{self, Frame, Record};
use crate::format::segment::{
    self as fmt, FOOTER_LEN, INDEX_ENTRY_LEN, IndexEntry, SEGMENT_HEADER_LEN, SegmentSummary,
};
use crate::io::{DataFile, Fs};

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
    /// The open file. A sealed segment's is closed when the log has more open than
    /// `OPEN_SEALED_MAX` (least recently used first, `close_file`) and opened again on
    /// demand: a log of thousands of segments must not hold a descriptor for each (the
    /// default limit is often 1,024). The active or sealing segment's is never closed.
    file: RwLock<Option<DataFile>>,
    /// When the file was last used (`INDEX_CLOCK`).
    file_used: AtomicU64,
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
    /// Bytes known durable (everything below was covered by a completed sync).
    synced: AtomicU64,
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
        self.check_poison()?;
        // Taken before the sync: all of it was written before, so the sync covers it.
        let staged = self.staged.get().map(|s| {
            let mut s = lock_staged(s);
            (
                s.written,
                std::mem::take(&mut s.entries),
                s.visibility.clone(),
            )
        });
        let end = staged.as_ref().map_or(end, |(w, _, _)| w.bytes.max(end));
        self.with_file(|f| f.sync_data()).inspect_err(|e| {
            self.sync_failed.store(true, Ordering::Release);
            let _ = self.poison.set(format!("sync failed: {e}"));
        })?;
        // Another file of the topic failed meanwhile: vouch for nothing more (a false
        // failure is safe, a false success is not).
        self.check_poison()?;
        // Visible before `synced` says durable: a publisher that sees its sync done and
        // returns finds its records readable (its consumers' wake-up finds them).
        let shown = match staged {
            Some((w, entries, visibility)) if w.next > self.next() => {
                self.publish_progress(w, &entries);
                visibility.bounds[1].fetch_max(w.next, Ordering::AcqRel);
                Some(visibility)
            }
            _ => None,
        };
        self.synced.fetch_max(end, Ordering::AcqRel);
        drop(one);
        if let Some(f) = shown.as_ref().and_then(|v| v.on_visible.get()) {
            f();
        }
        Ok(())
    }

    /// Why writes to this segment's topic stopped, if a write or sync failed.
    pub fn poisoned(&self) -> Option<String> {
        self.poison.get().cloned()
    }

    /// `Err(Poisoned)` once a write or sync of this segment's topic failed.
    pub fn check_poison(&self) -> Result<()> {
        check_poison(&self.poison)
    }

    /// Whether the bytes below `end` are already durable.
    pub fn is_synced_to(&self, end: u64) -> bool {
        self.synced.load(Ordering::Acquire) >= end
    }

    /// Creates a new, empty active segment (header written and synced).
    pub(crate) fn create(
        fs: &Fs,
        dir: &Path,
        base: u64,
        now_ms: u64,
        max_body: usize,
        poison: Poison,
        flags: u32,
    ) -> Result<Segment> {
        let path = dir.join(segment_file_name(base));
        let file = fs.create_new(&path)?;
        file.write_all_at(&fmt::encode_header(base, now_ms, flags), 0)?;
        file.sync_data()?;
        let seg = Segment::fresh(fs, dir, file, base, max_body, poison)?;
        fs.sync_dir(dir)?;
        Ok(seg)
    }

    /// Makes a spare file (see `FLAG_SPARE`) the new active segment: renamed, its real
    /// header written, nothing synced (the caller has that done off the roll: under
    /// `Sync=None` a roll must not wait for the disk). Until the header is synced, recovery
    /// takes a segment whose header still says "spare" for one that holds nothing synced.
    pub(crate) fn from_spare(
        fs: &Fs,
        dir: &Path,
        spare: DataFile,
        base: u64,
        now_ms: u64,
        max_body: usize,
        poison: Poison,
    ) -> Result<Segment> {
        let path = dir.join(segment_file_name(base));
        fs.rename(spare.path(), &path)?;
        let file = spare.renamed(&path);
        file.write_all_at(
            &fmt::encode_header(base, now_ms, fmt::FLAG_FOLLOWS_UNSYNCED),
            0,
        )?;
        Segment::fresh(fs, dir, file, base, max_body, poison)
    }

    /// Makes a recycled file (a segment retention deleted, see `RECYCLED_SUFFIX`) the new
    /// active segment: its real header written and synced before the rename (a power cut
    /// never leaves the new name on the old header), then renamed and the directory
    /// synced, as `create` does. The old records behind the header are free space: their
    /// offsets are below `base`, so a scan stops at the first one (see `scan`), the writer
    /// puts zeros ahead of each write of new records over them (`TopicLog::flush`), and a
    /// roll trims what the new records did not overwrite. Returns the segment and the
    /// file's length (all of it written once, so overwriting it needs no zeros ahead).
    pub(crate) fn from_recycled(
        fs: &Fs,
        dir: &Path,
        recycled: &Path,
        base: u64,
        now_ms: u64,
        max_body: usize,
        poison: Poison,
    ) -> Result<(Segment, u64)> {
        let file = fs.open(recycled)?;
        file.write_all_at(&fmt::encode_header(base, now_ms, 0), 0)?;
        file.sync_data()?;
        let len = file.len()?;
        let path = dir.join(segment_file_name(base));
        fs.rename(recycled, &path)?;
        let seg = Segment::fresh(fs, dir, file.renamed(&path), base, max_body, poison)?;
        fs.sync_dir(dir)?;
        Ok((seg, len))
    }

    fn fresh(
        fs: &Fs,
        dir: &Path,
        file: DataFile,
        base: u64,
        max_body: usize,
        poison: Poison,
    ) -> Result<Segment> {
        let path = dir.join(segment_file_name(base));
        let index_path = dir.join(index_file_name(base));
        // A stale index from an earlier life of this base would mislead readers.
        fs.remove_file(&index_path)?;
        let empty = SegmentSummary {
            base,
            next: base,
            bytes: SEGMENT_HEADER_LEN as u64,
            first_ts: 0,
            last_ts: 0,
            id_count: 0,
        };
        Ok(Segment::from_parts(
            fs,
            path,
            index_path,
            Some(file),
            base,
            empty,
            false,
            max_body,
            poison,
        ))
    }

    /// Opens a sealed segment from its index footer, checked against the first index entry
    /// and the few records after the last one (never a whole scan). Falls back to a full
    /// scan, which also rewrites the index, when the footer is missing or disagrees.
    /// `known`: what `wholeness` already found out about it (not read or scanned again).
    /// `len`: the data file's length, as the caller's `statx` found it.
    #[expect(clippy::too_many_arguments, reason = "open's view of one segment")]
    pub(crate) fn open_sealed(
        fs: &Fs,
        path: PathBuf,
        base: u64,
        len: u64,
        max_body: usize,
        interval: u64,
        poison: Poison,
        known: Option<Known>,
    ) -> Result<Segment> {
        let index_path = path.with_extension("idx");
        // The common case: a footer with its summary crc vouches for the data file (checked
        // when the footer was written), so only its length is looked at; the file is opened
        // when first read.
        let trusted = match &known {
            Some(Known::Footer(s)) => Some(*s),
            None => footer_for(fs, &index_path, base, len)?
                .and_then(|(s, unchecked)| matches!(unchecked, Unchecked::No).then_some(s)),
            Some(Known::Scan(_) | Known::Indexed(_)) => None,
        };
        if let Some(s) = trusted {
            let seg =
                Segment::from_parts(fs, path, index_path, None, base, s, true, max_body, poison);
            seg.index_loaded.store(false, Ordering::Release);
            return Ok(seg);
        }
        let file = fs.open(&path)?;
        let len = file.len()?;
        check_header(&file, base)?;
        if let Some(Known::Indexed(s)) = known {
            let seg = Segment::from_parts(
                fs,
                path,
                index_path,
                Some(file),
                base,
                s,
                false,
                max_body,
                poison,
            );
            seg.index_loaded.store(false, Ordering::Release);
            seg.unchecked.store(true, Ordering::Release);
            return Ok(seg);
        }
        let summary = match known {
            Some(Known::Scan(_) | Known::Indexed(_) | Known::Footer(_)) => None,
            None => Probe::new(fs, &file, &index_path, base, len, interval, max_body)
                .trusted_footer()?,
        };
        if let Some(s) = summary {
            let seg =
                Segment::from_parts(fs, path, index_path, None, base, s, true, max_body, poison);
            seg.index_loaded.store(false, Ordering::Release);
            return Ok(seg);
        }
        tracing::warn!(segment = %path.display(), "sealed segment has no valid index; rebuilding it");
        let scan = match known {
            Some(Known::Scan(scan)) => scan,
            _ => scan_all(&file, base, len, interval, max_body)?,
        };
        if let Some(why) = scan.stop {
            let footer = read_footer(fs, &index_path)?
                .filter(|(s, _)| s.base == base && s.bytes == len && s.next >= base);
            if let Some((s, _)) = footer {
                // The data itself is damaged, so the footer could not be confirmed; it is
                // still the best summary there is. Reads of the damaged range fail with
                // `Error::Corrupt`, as they would have with an intact footer.
                tracing::error!(segment = %path.display(), at = scan.end, reason = why,
                    "sealed segment is damaged; keeping its index");
                let seg = Segment::from_parts(
                    fs, path, index_path, None, base, s, true, max_body, poison,
                );
                seg.index_loaded.store(false, Ordering::Release);
                seg.doubtful.store(true, Ordering::Release);
                return Ok(seg);
            }
            return Err(Error::corrupt(
                &path,
                format!("sealed segment damaged at byte {}: {why}", scan.end),
            ));
        }
        let s = scan.summary(base);
        // Data first, then the footer that vouches for it: under `Sync=None` a killed
        // process may have left this segment's background sync undone, and a trusted
        // footer over unsynced data would hide a later power cut's loss.
        file.sync_data()?;
        write_sealed_index(fs, &index_path, &scan.entries, &s)?;
        let seg = Segment::from_parts(fs, path, index_path, None, base, s, true, max_body, poison);
        *write_lock(&seg.index) = scan.entries;
        Ok(seg)
    }

    /// Opens the active (last) segment: loads its index, validates the index against the
    /// file, scans only the tail after the last good index entry (`whole`: all of it), and
    /// truncates a torn or corrupt tail.
    pub(crate) fn open_active(
        fs: &Fs,
        path: PathBuf,
        base: u64,
        max_body: usize,
        interval: u64,
        poison: Poison,
        whole: bool,
    ) -> Result<Segment> {
        let index_path = path.with_extension("idx");
        let file = fs.open(&path)?;
        let len = file.len()?;
        if len < SEGMENT_HEADER_LEN as u64 {
            // Torn during creation: the header was never synced, so no record was written.
            tracing::warn!(segment = %path.display(), "active segment has a torn header; rewriting it");
            file.set_len(0)?;
            file.write_all_at(&fmt::encode_header(base, 0, 0), 0)?;
            file.sync_data()?;
        } else {
            check_header(&file, base)?;
        }
        let len = file.len()?;
        let r = if whole {
            let scan = scan_all(&file, base, len, interval, max_body)?;
            FromIndex {
                summary: scan.summary(base),
                stop: scan.stop,
                entries: scan.entries,
                unchanged: 0,
            }
        } else {
            Probe::new(fs, &file, &index_path, base, len, interval, max_body).read_index()?
        };
        if let Some(why) = r.stop
            && !is_zero(&file, r.summary.bytes, len)?
        {
            tracing::warn!(
                segment = %path.display(),
                valid_bytes = r.summary.bytes,
                file_bytes = len,
                reason = why,
                "truncating the torn or corrupt tail of the active segment"
            );
            file.set_len(r.summary.bytes)?;
            file.sync_data()?;
        }
        let (entries, s) = (r.entries, r.summary);
        // The index file must hold exactly the validated entries. It usually does already
        // (a clean close, or a crash that lost only the tail): only what follows the entries
        // it still has unchanged is written (truncating it to zero and writing it whole
        // cost ~0.5 ms per open).
        let unchanged = r.unchanged.min(entries.len());
        let mut tail = Vec::with_capacity((entries.len() - unchanged) * INDEX_ENTRY_LEN);
        for e in &entries[unchanged..] {
            fmt::encode_entry(e, &mut tail);
        }
        let same = (unchanged * INDEX_ENTRY_LEN) as u64;
        let idx = fs.open_or_create(&index_path)?;
        idx.write_all_at(&tail, same)?;
        let want = same + tail.len() as u64;
        if idx.len()? != want {
            idx.set_len(want)?;
        }
        let seg = Segment::from_parts(
            fs,
            path,
            index_path,
            Some(file),
            base,
            s,
            false,
            max_body,
            poison,
        );
        *write_lock(&seg.index) = entries;
        seg.set_unverified(r.unchanged);
        Ok(seg)
    }

    #[expect(clippy::too_many_arguments, reason = "a private constructor")]
    fn from_parts(
        fs: &Fs,
        path: PathBuf,
        index_path: PathBuf,
        file: Option<DataFile>,
        base: u64,
        s: SegmentSummary,
        sealed: bool,
        max_body: usize,
        poison: Poison,
    ) -> Segment {
        Segment {
            base,
            path,
            index_path,
            file: RwLock::new(file),
            file_used: AtomicU64::new(0),
            removed: AtomicBool::new(false),
            sync_failed: AtomicBool::new(false),
            index: RwLock::new(Vec::new()),
            index_loaded: AtomicBool::new(true),
            index_used: AtomicU64::new(0),
            end: AtomicU64::new(s.bytes),
            next: AtomicU64::new(s.next),
            first_ts: AtomicU64::new(s.first_ts),
            last_ts: AtomicU64::new(s.last_ts),
            id_count: AtomicU64::new(s.id_count),
            sealed: AtomicBool::new(sealed),
            unchecked: AtomicBool::new(false),
            unverified: AtomicUsize::new(0),
            passed: Mutex::new(Vec::new()),
            counts_unverified: AtomicBool::new(false),
            doubtful: AtomicBool::new(false),
            // What recovery found on disk may not be durable yet (an unsynced tail).
            synced: AtomicU64::new(if sealed {
                s.bytes
            } else {
                SEGMENT_HEADER_LEN as u64
            }),
            staged: OnceLock::new(),
            sync_lock: Mutex::new(()),
            max_body,
            poison,
            fs: fs.clone(),
            resume: Mutex::new(Resume {
                offset: base,
                position: SEGMENT_HEADER_LEN as u64,
                ahead: Bytes::new(),
            }),
        }
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
    }

    /// The entries of the index, loading a sealed segment's index on first use.
    pub(crate) fn index(&self, interval: u64) -> Result<Vec<IndexEntry>> {
        self.ensure_index(interval)?;
        Ok(read_lock(&self.index).clone())
    }

    /// For a sealed segment whose index is in memory: when it was last used.
    pub(crate) fn loaded_index_used(&self) -> Option<u64> {
        (self.is_sealed() && self.index_loaded.load(Ordering::Acquire))
            .then(|| self.index_used.load(Ordering::Relaxed))
    }

    /// Drops a sealed segment's in-memory index (it is read again from its file when
    /// needed), so that memory does not grow with the number of segments read.
    pub(crate) fn unload_index(&self) {
        if !self.is_sealed() {
            return;
        }
        let mut guard = write_lock(&self.index);
        self.index_loaded.store(false, Ordering::Release);
        *guard = Vec::new();
    }

    /// The last index entry at or before `offset` (binary search).
    fn entry_for_offset(&self, offset: u64, interval: u64) -> Result<Option<IndexEntry>> {
        self.checked_entry(interval, |e| e.offset <= offset)
    }

    /// The last index entry whose timestamp is before `ts_ms`.
    fn entry_before_time(&self, ts_ms: u64, interval: u64) -> Result<Option<IndexEntry>> {
        self.checked_entry(interval, |e| e.timestamp_ms < ts_ms)
    }

    /// The last entry for which `before` holds (the index is sorted by it), checked against
    /// its record if it came from the index file unchecked (`unverified`). One that points
    /// elsewhere has the index rebuilt from the records (`reindex`) and is looked up again.
    /// Only the entry a lookup ends on needs checking: the ones after it hold `before` false
    /// whatever they are, so starting at a checked entry never starts past what is sought.
    fn checked_entry(
        &self,
        interval: u64,
        before: impl Fn(&IndexEntry) -> bool,
    ) -> Result<Option<IndexEntry>> {
        self.ensure_index(interval)?;
        let last_before = |idx: &[IndexEntry]| {
            let i = idx.partition_point(&before);
            (i > 0).then(|| (i - 1, idx[i - 1]))
        };
        let (i, e, checked) = {
            let idx = read_lock(&self.index);
            let Some((i, e)) = last_before(&idx) else {
                return Ok(None);
            };
            // Under the same guard as the entry: a rebuild in between would have it say
            // "checked" of an entry it took out.
            (
                i,
                e,
                i >= self.unverified.load(Ordering::Acquire) || self.has_passed(i),
            )
        };
        if checked {
            return Ok(Some(e));
        }
        if self.with_file(|file| entry_points_at_record(file, &e, self.max_body))? {
            // Entry `i` stays the same entry until a rebuild, after which no bit is read.
            let mut passed = self.passed.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(word) = passed.get_mut(i / 64) {
                *word |= 1 << (i % 64);
            }
            return Ok(Some(e));
        }
        self.reindex(interval, &e)?;
        Ok(last_before(&read_lock(&self.index)).map(|(_, e)| e))
    }

    /// Whether a lookup checked unverified entry `i` against its record already.
    fn has_passed(&self, i: usize) -> bool {
        let passed = self.passed.lock().unwrap_or_else(|p| p.into_inner());
        passed.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    /// Rebuilds the index entries below the segment's end from its records, after `wrong`
    /// (read from the index file) was found not to point at its record.
    fn reindex(&self, interval: u64, wrong: &IndexEntry) -> Result<()> {
        tracing::warn!(segment = %self.path.display(), offset = wrong.offset,
            position = wrong.position, "index entry does not point at its record; rebuilding the index");
        let end = self.end();
        let scan =
            self.with_file(|file| scan_all(file, self.base, end, interval, self.max_body))?;
        self.take_entries(scan, end)
    }

    /// Replaces the index entries below `end` with those of `scan` (the records from the
    /// header to `end`). After records the scan found damaged (it stopped before `end`),
    /// an entry from the file is kept only if it points at its record: reads of records
    /// after the damage go on from those, and a wrong one is never used again (nor sealed).
    fn take_entries(&self, scan: ScanResult, end: u64) -> Result<()> {
        if let Some(why) = scan.stop {
            tracing::error!(segment = %self.path.display(), valid_bytes = scan.end, reason = why,
                "records damaged; reads through them fail, index entries after them are checked one by one");
        }
        let (old, unverified) = {
            let idx = read_lock(&self.index);
            (idx.clone(), self.unverified.load(Ordering::Acquire))
        };
        if unverified == 0 {
            return Ok(());
        }
        let mut after_damage = Vec::new();
        for (i, e) in old.iter().enumerate() {
            if e.position >= scan.end
                && e.position < end
                && (i >= unverified
                    || self.with_file(|file| entry_points_at_record(file, e, self.max_body))?)
            {
                after_damage.push(*e);
            }
        }
        let mut idx = write_lock(&self.index);
        if self.unverified.load(Ordering::Acquire) == 0 {
            // Another rebuild or the sealing was first (then the index may even have been
            // unloaded and read again from the sealed file since `old`).
            return Ok(());
        }
        // The writer's entries from `end` on (appended since) stay.
        let later = idx.partition_point(|e| e.position < end);
        idx.splice(..later, scan.entries.into_iter().chain(after_damage));
        self.unverified.store(0, Ordering::Release);
        Ok(())
    }

    /// `n` leading entries came from the index file unchecked: each is checked before a
    /// lookup uses it, and the segment is read whole before it is sealed
    /// (`verify_before_sealing`), so a sealed index holds only entries its records gave.
    fn set_unverified(&self, n: usize) {
        *self.passed.lock().unwrap_or_else(|p| p.into_inner()) = vec![0; n.div_ceil(64)];
        self.unverified.store(n, Ordering::Release);
        if n > 0 {
            self.counts_unverified.store(true, Ordering::Release);
        }
    }

    /// Before the sealing of a segment for which open took index entries from the file unchecked
    /// (`counts_unverified`; not after `check_whole`): reads it whole and takes the entries
    /// and the summary's `first_ts`/`id_count` from its records (the last loaded entry's
    /// `ids_before` was not checked either, and a `reindex` since fixed only the entries).
    /// Damaged records are sealed as they are (reads there fail `Corrupt`, as in any
    /// damaged sealed segment; cutting the log back to them would lose what was
    /// acknowledged since open), with only entries that point at their records.
    pub(crate) fn verify_before_sealing(&self, interval: u64) -> Result<()> {
        if !self.counts_unverified.load(Ordering::Acquire) {
            return Ok(());
        }
        let end = self.end();
        let scan =
            self.with_file(|file| scan_all(file, self.base, end, interval, self.max_body))?;
        if scan.stop.is_none() && scan.end == end && scan.next == self.next() {
            self.adopt(scan);
            return Ok(());
        }
        // The first record's stamp, if it is whole; the id count cannot be had past the
        // damage, and stays open's (ARCHITECTURE: known limit).
        if let Some(first) = scan.entries.first() {
            self.first_ts.store(first.timestamp_ms, Ordering::Release);
        }
        self.take_entries(scan, end)
    }

    /// The records read whole have the last word: their entries and summary replace what
    /// open took from the index file.
    fn adopt(&self, scan: ScanResult) {
        let s = scan.summary(self.base);
        let mut idx = write_lock(&self.index);
        self.first_ts.store(s.first_ts, Ordering::Release);
        self.last_ts.store(s.last_ts, Ordering::Release);
        self.id_count.store(s.id_count, Ordering::Release);
        *idx = scan.entries;
        // Under the index's guard: a first `ensure_index` waiting for it then finds the
        // index loaded, and does not put the file's entries back.
        self.unverified.store(0, Ordering::Release);
        self.counts_unverified.store(false, Ordering::Release);
        self.index_loaded.store(true, Ordering::Release);
    }

    fn ensure_index(&self, interval: u64) -> Result<()> {
        self.index_used.store(
            INDEX_CLOCK.fetch_add(1, Ordering::Relaxed),
            Ordering::Relaxed,
        );
        if self.index_loaded.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut guard = write_lock(&self.index);
        if self.index_loaded.load(Ordering::Acquire) {
            return Ok(());
        }
        if !self.is_sealed() {
            // Opened from its index's ends (`Known::Indexed`), not sealed yet: the entries
            // are checked as the active segment's are, and must reach the same end.
            let r = self.with_file(|file| {
                Probe::new(
                    &self.fs,
                    file,
                    &self.index_path,
                    self.base,
                    self.end(),
                    interval,
                    self.max_body,
                )
                .read_index()
            })?;
            if r.stop.is_some() || r.summary.next != self.next() {
                return Err(Error::corrupt(
                    &self.path,
                    format!(
                        "segment changed since open: its records end at offset {}, not {}",
                        r.summary.next,
                        self.next()
                    ),
                ));
            }
            *guard = r.entries;
            self.set_unverified(r.unchanged);
            self.index_loaded.store(true, Ordering::Release);
            LOADS.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        // Too long to be its index: damaged, rebuilt below like any damaged index.
        let raw = match self.fs.open(&self.index_path) {
            Ok(f) => f.read_all(index_bytes_max(self.end()))?.unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        let entries = match fmt::decode_sealed_index(&raw) {
            Some((entries, s)) if s.base == self.base && s.bytes == self.end() => entries,
            _ => {
                if !self.is_removed() {
                    tracing::warn!(segment = %self.path.display(), "index damaged; rebuilding it");
                }
                let scan = self.with_file(|file| {
                    scan_all(file, self.base, self.end(), interval, self.max_body)
                })?;
                if let Some(why) = scan.stop {
                    return Err(Error::corrupt(
                        &self.path,
                        format!("sealed segment damaged at byte {}: {why}", scan.end),
                    ));
                }
                // Retention deleted it (a reader still holding it reads on through its open
                // file): a file written now would be a stray index of no segment.
                if !self.is_removed() {
                    write_sealed_index(
                        &self.fs,
                        &self.index_path,
                        &scan.entries,
                        &scan.summary(self.base),
                    )?;
                }
                scan.entries
            }
        };
        *guard = entries;
        self.index_loaded.store(true, Ordering::Release);
        LOADS.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Runs `f` on the segment's file, opening it again if it was closed (`close_file`).
    pub(crate) fn with_file<R>(&self, f: impl FnOnce(&DataFile) -> Result<R>) -> Result<R> {
        // Only a sealed file is ever closed: the writer's appends touch no shared clock.
        if self.is_sealed() {
            self.file_used.store(
                INDEX_CLOCK.fetch_add(1, Ordering::Relaxed),
                Ordering::Relaxed,
            );
        }
        if let Some(file) = read_lock(&self.file).as_ref() {
            return f(file);
        }
        let mut slot = write_lock(&self.file);
        let file = match slot.take() {
            Some(file) => file,
            None => {
                LOADS.fetch_add(1, Ordering::Relaxed);
                self.fs.open(&self.path)?
            }
        };
        f(slot.insert(file))
    }

    /// When a sealed segment's open file was last used; `None` if it is closed, in use
    /// right now, or the segment is not sealed (its file stays open).
    pub(crate) fn open_file_used(&self) -> Option<u64> {
        let slot = self.file.try_read().ok()?;
        (self.is_sealed() && slot.is_some()).then(|| self.file_used.load(Ordering::Relaxed))
    }

    /// Closes a sealed segment's file (opened again when next used). Never waits: a file
    /// in use right now was used recently.
    pub(crate) fn close_file(&self) {
        if self.is_sealed()
            && let Ok(mut slot) = self.file.try_write()
        {
            *slot = None;
            // And what the last read had read ahead: memory stays bounded like descriptors.
            self.resume.lock().unwrap_or_else(|e| e.into_inner()).ahead = Bytes::new();
        }
    }

    /// Whether the last read left bytes read ahead.
    #[cfg(test)]
    pub(crate) fn holds_read_ahead(&self) -> bool {
        !self
            .resume
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ahead
            .is_empty()
    }

    /// Whether its summary was checked (a crc'd footer, the records, or a cache entry of
    /// one), not a damaged segment's footer kept as it was.
    pub(crate) fn summary_trusted(&self) -> bool {
        !self.doubtful.load(Ordering::Acquire)
    }

    /// Retention took the segment out of the log and deletes its files.
    pub(crate) fn mark_removed(&self) {
        self.removed.store(true, Ordering::Release);
    }

    pub(crate) fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }

    /// Before the sealing of a segment open took from its index's ends (`Known::Indexed`)
    /// writes a footer that vouches for every record: reads it whole, once. The boot mark
    /// said nothing written could be missing; if records are missing after all (an in-place
    /// snapshot rollback, a disk that dropped writes it had accepted), the log open exposed
    /// is not the one on disk (`distrust_boot_mark`).
    pub(crate) fn check_whole(&self, interval: u64) -> Result<()> {
        // Cleared only once checked: a read error (not damage) leaves it for the retry.
        if !self.unchecked.load(Ordering::Acquire) {
            return Ok(());
        }
        let scan =
            self.with_file(|file| scan_all(file, self.base, self.end(), interval, self.max_body))?;
        if scan.stop.is_some() || scan.end != self.end() || scan.next != self.next() {
            let why = format!(
                "records missing although the boot mark said nothing written could be: \
                 they end at offset {} (byte {}), not {}",
                scan.next,
                scan.end,
                self.next()
            );
            self.distrust_boot_mark(&why);
            return Err(Error::corrupt(&self.path, why));
        }
        // The index's ends gave these.
        self.adopt(scan);
        self.unchecked.store(false, Ordering::Release);
        Ok(())
    }

    /// Found damage open's boot mark ruled out: the topic takes no more appends (they would
    /// be cut away with the damage), and the next open checks the log in full, which cuts
    /// it back to the damage.
    fn distrust_boot_mark(&self, why: &str) {
        tracing::error!(segment = %self.path.display(), reason = why,
            "segment damaged since the last full check; reopen the topic to cut the log back");
        let _ = self.poison.set(format!(
            "{} is damaged ({why}); reopen to recover",
            self.path.display()
        ));
        if let Some(dir) = self.path.parent()
            && let Err(e) = self.fs.remove_file(&dir.join(super::BOOT_MARK_FILE))
        {
            tracing::warn!(error = %e, "could not remove the boot mark");
        }
    }

    /// Appends the records with offsets in `[from, ..)` to `out`, up to `max_records`
    /// records and about `max_bytes` bytes. Reads in chunks; checks every crc and offset.
    pub(crate) fn read(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
        interval: u64,
        out: &mut Vec<Record>,
    ) -> Result<()> {
        let end = self.end();
        let resumed = {
            let r = self.resume.lock().unwrap_or_else(|e| e.into_inner());
            (r.offset == from).then(|| (r.position, r.ahead.clone()))
        };
        let (mut pos, mut expected, mut ahead) = match resumed {
            Some((position, ahead)) => (position, from, ahead),
            None => match self.entry_for_offset(from, interval)? {
                Some(e) => (e.position, e.offset, Bytes::new()),
                None => (SEGMENT_HEADER_LEN as u64, self.base, Bytes::new()),
            },
        };
        let mut bytes_out = 0usize;
        // `out` may already hold records of earlier segments: the limits count only ours.
        let limit = out.len().saturating_add(max_records);
        let mut want = READ_CHUNK_BYTES;
        while pos < end && out.len() < limit && bytes_out < max_bytes {
            let chunk = if ahead.is_empty() {
                let len = want.min((end - pos) as usize);
                let chunk = self.with_file(|file| read_chunk(file, pos, len))?;
                if chunk.len() < len {
                    // Cut shorter since open (a sealed file is opened again by name): fail
                    // rather than read the same short chunk forever.
                    return Err(Error::corrupt(
                        &self.path,
                        format!(
                            "the file ends at byte {} but its records at {end}",
                            pos + chunk.len() as u64
                        ),
                    ));
                }
                chunk
            } else {
                std::mem::take(&mut ahead)
            };
            want = READ_CHUNK_BYTES;
            let mut cut_off = false;
            let mut cur = 0usize;
            while cur < chunk.len() && out.len() < limit && bytes_out < max_bytes {
                match record::decode_at(&chunk, cur, self.max_body) {
                    Frame::Complete { record, len } => {
                        if record.offset != expected {
                            return Err(Error::corrupt(
                                &self.path,
                                format!(
                                    "record at byte {} has offset {} where {} was expected",
                                    pos + cur as u64,
                                    record.offset,
                                    expected
                                ),
                            ));
                        }
                        expected += 1;
                        cur += len;
                        if record.offset >= from {
                            bytes_out += len;
                            out.push(record);
                        }
                    }
                    Frame::Incomplete { needed } => {
                        if pos + (cur + needed) as u64 > end {
                            return Err(Error::corrupt(
                                &self.path,
                                format!("record at byte {} runs past the end", pos + cur as u64),
                            ));
                        }
                        want = needed.max(READ_CHUNK_BYTES);
                        cut_off = true;
                        break;
                    }
                    Frame::Corrupt(why) => {
                        return Err(Error::corrupt(
                            &self.path,
                            format!("record at byte {}: {why}", pos + cur as u64),
                        ));
                    }
                }
            }
            pos += cur as u64;
            if !cut_off && cur < chunk.len() {
                // Stopped by a limit with whole records left in the chunk (a record cut off
                // at its end is read again from the file, whole).
                ahead = chunk.slice(cur..);
            }
        }
        *self.resume.lock().unwrap_or_else(|e| e.into_inner()) = Resume {
            offset: expected,
            position: pos,
            ahead,
        };
        Ok(())
    }

    /// The first offset in this segment whose timestamp is `>= ts_ms`, if any.
    pub(crate) fn offset_for_time(&self, ts_ms: u64, interval: u64) -> Result<Option<u64>> {
        if self.is_empty() || self.last_ts.load(Ordering::Acquire) < ts_ms {
            return Ok(None);
        }
        let from = match self.entry_before_time(ts_ms, interval)? {
            Some(e) => e.offset,
            None => self.base,
        };
        let mut batch = Vec::new();
        let mut at = from;
        loop {
            batch.clear();
            self.read(at, 1024, usize::MAX, interval, &mut batch)?;
            let Some(last) = batch.last() else {
                return Ok(None);
            };
            if let Some(r) = batch.iter().find(|r| r.timestamp_ms >= ts_ms) {
                return Ok(Some(r.offset));
            }
            at = last.offset + 1;
        }
    }

    /// Visits every record from the index entry at or before `from` to the end, in order.
    pub(crate) fn for_each_from(
        &self,
        from: u64,
        interval: u64,
        mut f: impl FnMut(&Record),
    ) -> Result<()> {
        let mut batch = Vec::new();
        let mut at = from;
        loop {
            batch.clear();
            self.read(at, 4096, 16 << 20, interval, &mut batch)?;
            let Some(last) = batch.last() else {
                return Ok(());
            };
            at = last.offset + 1;
            batch.iter().for_each(&mut f);
        }
    }
}

/// Checks the header against the file name's base offset; returns its flags.
fn check_header(file: &DataFile, base: u64) -> Result<u32> {
    let found = read_header(file)?;
    if found.base != base {
        return Err(Error::corrupt(
            file.path(),
            format!(
                "header says base offset {}, file name says {base}",
                found.base
            ),
        ));
    }
    Ok(found.flags)
}

/// The flags in the header of the segment at `path` (0 if it cannot be read: open then
/// reports the damage itself). A spare's header (`FLAG_SPARE`) has no base to check.
pub(crate) fn header_flags(fs: &Fs, path: &Path, base: u64) -> u32 {
    match fs.open(path).and_then(|f| read_header(&f)) {
        Ok(h) if h.flags & fmt::FLAG_SPARE != 0 || h.base == base => h.flags,
        _ => 0,
    }
}

/// The segment header at the start of `file`, checked (a damaged one is `Corrupt`).
fn read_header(file: &DataFile) -> Result<fmt::SegmentHeader> {
    let mut h = [0u8; SEGMENT_HEADER_LEN];
    let n = file.read_at(&mut h, 0)?;
    fmt::decode_header(&h[..n]).map_err(|why| Error::corrupt(file.path(), why))
}

/// The name of a topic's spare file (`FLAG_SPARE`).
pub(crate) const SPARE_FILE_NAME: &str = "spare.log.next";

/// Appended to a segment file's name when retention keeps it for a later roll to reuse
/// (`Sync=Always`: see `TopicLog::apply_retention`). Not a `.log` file: open never takes it
/// for a segment.
pub(crate) const RECYCLED_SUFFIX: &str = ".recycled";

/// Makes a spare file for the next roll, header synced (off the roll, on a thread).
pub(crate) fn make_spare(fs: &Fs, dir: &Path) -> Result<DataFile> {
    let path = dir.join(SPARE_FILE_NAME);
    fs.remove_file(&path)?;
    let file = fs.create_new(&path)?;
    file.write_all_at(
        &fmt::encode_header(0, 0, fmt::FLAG_SPARE | fmt::FLAG_FOLLOWS_UNSYNCED),
        0,
    )?;
    file.sync_data()?;
    Ok(file)
}

/// Whether a segment (not the active one) holds every record up to the next segment's
/// base, and how that was found out.
pub(crate) enum Whole {
    /// It does, and this is how that was found out (`open_sealed` builds on it).
    Yes(Known),
    /// Records were lost (cut off at a record boundary or torn) or are damaged. `valid`:
    /// where the whole records from its start end, when a scan found that out (a record
    /// after a lost one is not kept: the log must stay a prefix).
    No { valid: Option<u64> },
}

/// What open already knows of a sealed segment, so it is not read or scanned again.
pub(crate) enum Known {
    /// Its trusted sealed footer's summary.
    Footer(SegmentSummary),
    /// A complete scan of it (no trusted footer).
    Scan(ScanResult),
    /// What its index's first and last entries and a scan after the last one say,
    /// trusted because everything written to it is still in this boot's page cache
    /// (`same_boot`). Not sealed: the caller has it synced and its index written (`seal`);
    /// the entries between are read when first used.
    Indexed(SegmentSummary),
}

/// `same_boot`: the files were last written in this boot (see `TopicLog::open`), so no
/// power cut can have lost a part of them and a full scan is not needed. `cached`: the
/// segment's entry in the sealed-summaries cache, trusted like its footer.
#[expect(clippy::too_many_arguments, reason = "open's view of one segment")]
pub(crate) fn wholeness(
    fs: &Fs,
    path: &Path,
    base: u64,
    next: u64,
    max_body: usize,
    interval: u64,
    same_boot: bool,
    cached: Option<&SegmentSummary>,
) -> Result<Whole> {
    let file = fs.open(path)?;
    let len = file.len()?;
    check_header(&file, base)?;
    let index_path = path.with_extension("idx");
    let p = Probe::new(fs, &file, &index_path, base, len, interval, max_body);
    let cached = cached.filter(|s| s.base == base && s.bytes == len).copied();
    if let Some(s) = cached.map_or_else(|| p.trusted_footer(), |s| Ok(Some(s)))? {
        return Ok(if s.next == next {
            Whole::Yes(Known::Footer(s))
        } else {
            Whole::No { valid: None }
        });
    }
    if same_boot
        && let Some(s) = p.read_index_ends()?
        && s.next == next
    {
        return Ok(Whole::Yes(Known::Indexed(s)));
    }
    let scan = scan_all(&file, base, len, interval, max_body)?;
    Ok(
        if scan.stop.is_none() && scan.end == len && scan.next == next {
            Whole::Yes(Known::Scan(scan))
        } else {
            Whole::No {
                valid: Some(scan.end),
            }
        },
    )
}

/// One segment file as open looks at it: the file and its index, the length open found,
/// and the limits its records are read with.
#[derive(Clone, Copy)]
struct Probe<'a> {
    fs: &'a Fs,
    file: &'a DataFile,
    index_path: &'a Path,
    base: u64,
    len: u64,
    interval: u64,
    max_body: usize,
}

impl<'a> Probe<'a> {
    fn new(
        fs: &'a Fs,
        file: &'a DataFile,
        index_path: &'a Path,
        base: u64,
        len: u64,
        interval: u64,
        max_body: usize,
    ) -> Self {
        Probe {
            fs,
            file,
            index_path,
            base,
            len,
            interval,
            max_body,
        }
    }

    /// Scans from `start` to the length open found.
    fn scan_from(&self, start: ScanStart) -> Result<ScanResult> {
        scan(
            self.file,
            self.base,
            start,
            self.len,
            self.interval,
            self.max_body,
            |_| {},
        )
    }

    /// The sealed footer's summary, if open may trust it (see ARCHITECTURE, sealed indexes).
    fn trusted_footer(&self) -> Result<Option<SegmentSummary>> {
        Ok(
            match footer_for(self.fs, self.index_path, self.base, self.len)? {
                // Its own crc says the summary was written whole, after the data was synced.
                Some((s, Unchecked::No)) => Some(s),
                Some((s, Unchecked::Ends(first, last))) => {
                    footer_agrees(self.file, &s, &first, &last, self.interval, self.max_body)?
                        .then_some(s)
                }
                None => None,
            },
        )
    }

    /// Reads a segment from its index file and scans only after the last entry that holds
    /// up: the longest prefix that is monotonic, inside the file, and whose last entry really
    /// points at its record (the index is never synced, so its tail may be junk).
    fn read_index(&self) -> Result<FromIndex> {
        let mut entries = load_index_entries(self.fs, self.index_path, self.len)?;
        let mut keep = 0;
        let mut prev: Option<&IndexEntry> = None;
        for e in &entries {
            let ok = e.position >= SEGMENT_HEADER_LEN as u64
                && e.position < self.len
                && e.offset >= self.base
                && prev.is_none_or(|p| {
                    e.offset > p.offset
                        && e.position > p.position
                        && e.timestamp_ms >= p.timestamp_ms
                        && e.ids_before >= p.ids_before
                });
            if !ok {
                break;
            }
            keep += 1;
            prev = Some(e);
        }
        entries.truncate(keep);
        while let Some(last) = entries.last() {
            if entry_points_at_record(self.file, last, self.max_body)? {
                break;
            }
            entries.pop();
        }
        if entries
            .first()
            .is_some_and(|e| !starts_segment(e, self.base))
        {
            entries.clear();
        }
        // The last one kept is where the scan starts, which makes its entry again.
        let unchanged = entries.len().saturating_sub(1);
        let start = match entries.pop() {
            Some(e) => ScanStart::at(&e),
            None => ScanStart::header(self.base),
        };
        let mut scan = self.scan_from(start)?;
        entries.append(&mut scan.entries);
        let mut summary = scan.summary(self.base);
        summary.first_ts = entries.first().map_or(0, |e| e.timestamp_ms);
        Ok(FromIndex {
            entries,
            unchanged,
            summary,
            stop: scan.stop,
        })
    }

    /// Only when nothing written can be missing (`same_boot`): a segment as its index's first
    /// and last entries and a scan after the last one say, without reading the entries between.
    /// `None` if they do not hold up (then the caller reads the segment in full).
    fn read_index_ends(&self) -> Result<Option<SegmentSummary>> {
        let Ok(f) = self.fs.open(self.index_path) else {
            return Ok(None);
        };
        let count = f.len()? / INDEX_ENTRY_LEN as u64;
        if count == 0 {
            return Ok(None);
        }
        let mut b = [0u8; INDEX_ENTRY_LEN];
        let mut entry_at = |i: u64| -> Result<Option<IndexEntry>> {
            let n = f.read_at(&mut b, i * INDEX_ENTRY_LEN as u64)?;
            Ok((n == INDEX_ENTRY_LEN).then(|| fmt::decode_entries(&b)[0]))
        };
        let (Some(first), Some(last)) = (entry_at(0)?, entry_at(count - 1)?) else {
            return Ok(None);
        };
        if !starts_segment(&first, self.base)
            || last.offset < first.offset
            || last.position < first.position
            || last.position >= self.len
            || last.timestamp_ms < first.timestamp_ms
            || !entry_points_at_record(self.file, &last, self.max_body)?
        {
            return Ok(None);
        }
        let start = ScanStart::at(&last);
        let tail = self.scan_from(start)?;
        if tail.stop.is_some() || tail.end != self.len {
            return Ok(None);
        }
        let mut s = tail.summary(self.base);
        s.first_ts = first.timestamp_ms;
        Ok(Some(s))
    }
}

/// Whether `[from, to)` of the file holds only zeros: space the writer preallocated after
/// the last record, not damage.
fn is_zero(file: &DataFile, from: u64, to: u64) -> Result<bool> {
    let mut at = from;
    let mut buf = vec![0u8; SCAN_CHUNK_BYTES];
    while at < to {
        let n = file.read_at(&mut buf[..SCAN_CHUNK_BYTES.min((to - at) as usize)], at)?;
        if n == 0 {
            break;
        }
        if buf[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
}

fn read_chunk(file: &DataFile, pos: u64, len: usize) -> Result<Bytes> {
    let mut buf = BytesMut::zeroed(len);
    let n = file.read_at(&mut buf, pos)?;
    buf.truncate(n);
    Ok(buf.freeze())
}

/// What still has to be checked of a footer's summary before open trusts it.
#[derive(Clone, Copy, Debug)]
enum Unchecked {
    /// Nothing: its own crc matched.
    No,
    /// A footer from before the summary crc: its first and last entries, to check the
    /// summary against the data (`footer_agrees`).
    Ends(IndexEntry, IndexEntry),
}

/// Reads a sealed index's footer (and, for a footer without a summary crc, its first and
/// last entries). Open reads nothing else of it; the entries are checked against the
/// footer's crc when first used.
fn read_footer(fs: &Fs, index_path: &Path) -> Result<Option<(SegmentSummary, Unchecked)>> {
    let Ok(f) = fs.open(index_path) else {
        return Ok(None);
    };
    let len = f.len()?;
    if len < (FOOTER_LEN + INDEX_ENTRY_LEN) as u64 {
        return Ok(None);
    }
    // The last entry sits right before the footer: one read for both.
    const TAIL: usize = INDEX_ENTRY_LEN + FOOTER_LEN;
    let mut tail = [0u8; TAIL];
    if f.read_at(&mut tail, len - TAIL as u64)? < TAIL {
        return Ok(None);
    }
    let (last_entry, footer) = tail.split_at(INDEX_ENTRY_LEN);
    let Some(footer) = fmt::decode_footer(footer) else {
        return Ok(None);
    };
    if footer.entry_count * INDEX_ENTRY_LEN as u64 != len - FOOTER_LEN as u64 {
        return Ok(None);
    }
    if footer.summary_checked {
        return Ok(Some((footer.summary, Unchecked::No)));
    }
    let mut entry = [0u8; INDEX_ENTRY_LEN];
    f.read_at(&mut entry, 0)?;
    let first = fmt::decode_entries(&entry)[0];
    let last = fmt::decode_entries(last_entry)[0];
    Ok(Some((footer.summary, Unchecked::Ends(first, last))))
}

/// The sealed index's footer if it names this segment: its base, and a data file of `len`.
fn footer_for(
    fs: &Fs,
    index_path: &Path,
    base: u64,
    len: u64,
) -> Result<Option<(SegmentSummary, Unchecked)>> {
    Ok(read_footer(fs, index_path)?
        .filter(|(s, _)| s.base == base && s.bytes == len && s.next >= base))
}

/// Whether a sealed index's footer tells the truth about its segment, checked from the
/// data at the cost of one short scan: the first entry is the segment's first record, and
/// scanning from the last entry ends exactly at the footer's `bytes`, `next`, `last_ts`
/// and `id_count`. The footer's crc also covers every entry, which open does not read, so
/// without this a damaged footer (the index is never synced) would be believed.
fn footer_agrees(
    file: &DataFile,
    s: &SegmentSummary,
    first: &IndexEntry,
    last: &IndexEntry,
    interval: u64,
    max_body: usize,
) -> Result<bool> {
    if !starts_segment(first, s.base)
        || first.timestamp_ms != s.first_ts
        || last.position < first.position
        || last.position >= s.bytes
        || last.offset < first.offset
    {
        return Ok(false);
    }
    let start = ScanStart::at(last);
    let tail = scan(file, s.base, start, s.bytes, interval, max_body, |_| {})?;
    Ok(tail.stop.is_none()
        && tail.end == s.bytes
        && tail.next == s.next
        && tail.ids == s.id_count
        && tail.last_ts == s.last_ts
        && tail
            .entries
            .first()
            .is_some_and(|e| e.timestamp_ms == last.timestamp_ms))
}

/// The most bytes the index of a segment file of `data_len` bytes can take: an entry
/// (32 bytes) per record (at least 29 bytes) at most, and a footer.
fn index_bytes_max(data_len: u64) -> u64 {
    data_len.saturating_mul(2).saturating_add(FOOTER_LEN as u64)
}

/// The entries of the index of a segment file of `data_len` bytes (none if it is too long
/// to be one: damaged; the records after the last entry are scanned anyway).
fn load_index_entries(fs: &Fs, index_path: &Path, data_len: u64) -> Result<Vec<IndexEntry>> {
    let Ok(f) = fs.open(index_path) else {
        return Ok(Vec::new());
    };
    let Some(raw) = f.read_all(index_bytes_max(data_len))? else {
        return Ok(Vec::new());
    };
    if let Some((entries, _)) = fmt::decode_sealed_index(&raw) {
        // Sealed just before the next segment was created: reopen it as active.
        return Ok(entries);
    }
    Ok(fmt::decode_entries(&raw))
}

/// A segment as its own index entries and a scan after them tell it.
pub(crate) struct FromIndex {
    /// The entries kept and the ones the scan added.
    pub entries: Vec<IndexEntry>,
    /// How many of the first `entries` are the index file's first entries, unchanged.
    pub unchanged: usize,
    /// `bytes`: where the last whole record ends.
    pub summary: SegmentSummary,
    /// Why the scan stopped before the end of the file, if it did.
    pub stop: Option<&'static str>,
}

/// Writes a sealed index (entries + footer). Not synced: the index is a cache, and a torn
/// one fails its crc and is rebuilt.
pub(crate) fn write_sealed_index(
    fs: &Fs,
    index_path: &Path,
    entries: &[IndexEntry],
    s: &SegmentSummary,
) -> Result<()> {
    let mut bytes = Vec::with_capacity(entries.len() * INDEX_ENTRY_LEN + FOOTER_LEN);
    for e in entries {
        fmt::encode_entry(e, &mut bytes);
    }
    let footer = fmt::encode_footer(&bytes, s);
    bytes.extend_from_slice(&footer);
    let f = fs.open_or_create(index_path)?;
    f.write_all_at(&bytes, 0)?;
    f.set_len(bytes.len() as u64)
}

fn entry_points_at_record(file: &DataFile, e: &IndexEntry, max_body: usize) -> Result<bool> {
    let mut want = 4096usize;
    // A damaged length must not make us allocate more than the file still holds.
    let left = file.len()?.saturating_sub(e.position);
    loop {
        let chunk = read_chunk(file, e.position, want)?;
        match record::decode(&chunk, max_body) {
            Frame::Complete { record, .. } => {
                return Ok(record.offset == e.offset && record.timestamp_ms == e.timestamp_ms);
            }
            Frame::Incomplete { needed }
                if needed > want && chunk.len() == want && needed as u64 <= left =>
            {
                want = needed
            }
            _ => return Ok(false),
        }
    }
}

/// Whether an index entry is at a segment's first record (every index starts there).
fn starts_segment(e: &IndexEntry, base: u64) -> bool {
    e.offset == base && e.position == SEGMENT_HEADER_LEN as u64 && e.ids_before == 0
}

/// Where a scan starts: a record boundary and what is known before it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScanStart {
    pub position: u64,
    pub offset: u64,
    pub ids_before: u64,
}

impl ScanStart {
    /// At the record an index entry points to.
    fn at(e: &IndexEntry) -> Self {
        ScanStart {
            position: e.position,
            offset: e.offset,
            ids_before: e.ids_before,
        }
    }

    fn header(base: u64) -> Self {
        ScanStart {
            position: SEGMENT_HEADER_LEN as u64,
            offset: base,
            ids_before: 0,
        }
    }
}

pub(crate) struct ScanResult {
    /// Position after the last valid record.
    pub end: u64,
    pub next: u64,
    /// Index entries for the records scanned (sampled like the writer does).
    pub entries: Vec<IndexEntry>,
    pub last_ts: u64,
    pub ids: u64,
    /// Why the scan stopped before `len`, if it did.
    pub stop: Option<&'static str>,
}

impl ScanResult {
    fn summary(&self, base: u64) -> SegmentSummary {
        SegmentSummary {
            base,
            next: self.next,
            bytes: self.end,
            first_ts: self.entries.first().map_or(0, |e| e.timestamp_ms),
            last_ts: self.last_ts,
            id_count: self.ids,
        }
    }
}

/// Whether the writer (and the scanner) puts an index entry at a record at `position`.
pub(crate) fn wants_entry(last_entry_position: Option<u64>, position: u64, interval: u64) -> bool {
    last_entry_position.is_none_or(|p| position - p >= interval)
}

/// Scans a whole segment from its header to `len`.
fn scan_all(
    file: &DataFile,
    base: u64,
    len: u64,
    interval: u64,
    max_body: usize,
) -> Result<ScanResult> {
    scan(
        file,
        base,
        ScanStart::header(base),
        len,
        interval,
        max_body,
        |_| {},
    )
}

pub(crate) fn scan(
    file: &DataFile,
    base: u64,
    start: ScanStart,
    len: u64,
    interval: u64,
    max_body: usize,
    mut visit: impl FnMut(&Record),
) -> Result<ScanResult> {
    debug_assert!(start.offset >= base);
    let mut r = ScanResult {
        end: start.position,
        next: start.offset,
        entries: Vec::new(),
        last_ts: 0,
        ids: start.ids_before,
        stop: None,
    };
    let mut last_entry: Option<u64> = None;
    let mut want = SCAN_CHUNK_BYTES;
    while r.end < len {
        let chunk = read_chunk(file, r.end, want.min((len - r.end) as usize))?;
        if chunk.is_empty() {
            // The file is shorter than its length said (concurrent truncation).
            r.stop = Some("file ended early");
            return Ok(r);
        }
        want = SCAN_CHUNK_BYTES;
        let mut cur = 0usize;
        while cur < chunk.len() {
            match record::decode_at(&chunk, cur, max_body) {
                Frame::Complete { record, len: n } => {
                    // Stop *at* this record: the ones before it in the chunk are counted
                    // in `next`, so `end` must keep them (a truncation to the chunk start
                    // would lose them while `next` still claimed them).
                    if record.offset != r.next {
                        r.end += cur as u64;
                        r.stop = Some("record offset out of sequence");
                        return Ok(r);
                    }
                    if record.timestamp_ms < r.last_ts {
                        r.end += cur as u64;
                        r.stop = Some("record timestamp goes backwards");
                        return Ok(r);
                    }
                    let position = r.end + cur as u64;
                    if wants_entry(last_entry, position, interval) {
                        r.entries.push(IndexEntry {
                            offset: record.offset,
                            position,
                            timestamp_ms: record.timestamp_ms,
                            ids_before: r.ids,
                        });
                        last_entry = Some(position);
                    }
                    if record.headers.contains_key(MESSAGE_ID_HEADER) {
                        r.ids += 1;
                    }
                    r.last_ts = record.timestamp_ms;
                    r.next += 1;
                    cur += n;
                    visit(&record);
                }
                Frame::Incomplete { needed } => {
                    if r.end + (cur + needed) as u64 > len {
                        r.end += cur as u64;
                        r.stop = Some("record cut short (torn write)");
                        return Ok(r);
                    }
                    want = needed.max(SCAN_CHUNK_BYTES);
                    break;
                }
                Frame::Corrupt(why) => {
                    r.end += cur as u64;
                    r.stop = Some(why);
                    return Ok(r);
                }
            }
        }
        r.end += cur as u64;
    }
    Ok(r)
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
