//! One topic's log: a directory of segments, appended by one writer, read by many readers.
//!
//! **Invariants:** the log knows records and offsets, never groups or the catalog. Offsets
//! are dense from the first segment's base to `next`. Only the last segment is written;
//! a segment is synced before the next one is created, so a sealed segment is always
//! durable. Readers never see bytes past a segment's published `end`.

pub mod segment;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use crate::Headers;
use crate::error::{Error, Result};
use crate::format::record::{self, Record};
use crate::format::segment::{
    FLAG_FOLLOWS_UNSYNCED, FLAG_SPARE, FOOTER_LEN, INDEX_ENTRY_LEN, IndexEntry, SEGMENT_HEADER_LEN,
    SegmentSummary, decode_footer, encode_entry, encode_footer,
};
use crate::io::{DataFile, FileStat, Fs};
pub use segment::MESSAGE_ID_HEADER;
use segment::{Poison, Segment, Visibility, read_lock, wants_entry, write_lock};

/// Sealed segments whose index stays in memory (least recently used are unloaded).
const LOADED_INDEXES_MAX: usize = 8;

/// Unloads the least recently used sealed indexes beyond `LOADED_INDEXES_MAX`: a reader
/// going through a large log must not keep every segment's index (512 KiB per 64 MiB).
fn evict_indexes(segs: &[Arc<Segment>]) {
    release_least_recent(
        segs,
        LOADED_INDEXES_MAX,
        Segment::loaded_index_used,
        Segment::unload_index,
    );
}

/// Sealed segments whose file stays open (least recently used are closed, see
/// `Segment::close_file`): descriptors per topic stay bounded however long the log.
const OPEN_SEALED_MAX: usize = 8;

/// Closes the least recently used sealed files beyond `OPEN_SEALED_MAX`.
fn close_files(segs: &[Arc<Segment>]) {
    release_least_recent(
        segs,
        OPEN_SEALED_MAX,
        Segment::open_file_used,
        Segment::close_file,
    );
}

/// Of the segments holding something (`used`: when it was last used), releases what the
/// least recently used hold beyond `max`.
fn release_least_recent(
    segs: &[Arc<Segment>],
    max: usize,
    used: impl Fn(&Segment) -> Option<u64>,
    release: impl Fn(&Segment),
) {
    let mut held: Vec<(u64, &Arc<Segment>)> = segs
        .iter()
        .filter_map(|s| used(s).map(|u| (u, s)))
        .collect();
    if held.len() <= max {
        return;
    }
    held.sort_unstable_by_key(|(u, _)| *u);
    for (_, s) in &held[..held.len() - max] {
        release(s);
    }
}

/// Background write-back granularity when appends are not synced one by one.
const WRITE_BACK_BYTES: u64 = 8 << 20;

/// Segments a `Sync=None` writer may have sealed whose background sync has not finished:
/// how far publishing may run ahead of the disk, and how many segments before the active
/// one recovery must check for records a power cut took away.
const MAX_SEALING: usize = 2;
/// In a topic's directory: the `boot_mark` of the last open that checked the log in full.
pub(crate) const BOOT_MARK_FILE: &str = "boot.mark";

/// In a topic's directory: the summaries of its sealed segments, appended as each is
/// sealed (a cache, never synced; each entry crc'd like an index footer, see `Summaries`).
pub(crate) const SUMMARIES_FILE: &str = "sealed.sum";

/// The most bytes of records `append_held` keeps in memory: a bigger batch is written
/// by its publisher (its own write, as big as one cohort's).
const HOLD_MAX_BYTES: usize = 256 << 10;

/// The most records a read reserves room for up front.
const READ_CAPACITY_MAX: usize = 4096;

/// Zeros written ahead of the records at a time.
const PREALLOCATE_BYTES: u64 = 1 << 20;
/// Zeros past each write into a reused file (`stale_until`): a frame's length field and
/// crc, so that a scan stops there ("frame shorter than a record body").
const TERMINATOR_BYTES: u64 = record::FRAME_HEADER_LEN as u64;
/// What `write_zeros` writes, a chunk at a time (static: no allocation per chunk).
static ZEROS: [u8; PREALLOCATE_BYTES as usize] = [0; PREALLOCATE_BYTES as usize];
/// The page cache's unit: the zeros ahead of records into a reused file go to its end.
const PAGE_BYTES: u64 = 4096;
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
    /// `segment::LOADS` when this log last unloaded indexes and closed files.
    swept: Arc<AtomicU64>,
    cfg: LogConfig,
}

/// `SUMMARIES_FILE`: per sealed segment, its index footer's 64 bytes and its data file's
/// identity (`FileStat::identity`), appended after the footer (so after the data was
/// synced: an entry vouches for a segment as its footer does). Open takes a sealed
/// segment's summary from here when the data file's length and identity are the entry's
/// (one read per topic, a `statx` per segment), instead of opening and reading each
/// segment's index. A file made anew (a cut-back's bases written again, by this build or
/// an older one, a restore, a repair) has another identity, so an older incarnation's
/// entry is never believed; open also deletes the file before it cuts the log back.
#[derive(Debug)]
struct Summaries {
    path: PathBuf,
    /// Two sealing threads may append at once.
    lock: Mutex<()>,
}

/// One entry of `SUMMARIES_FILE`.
const SUMMARY_LEN: usize = FOOTER_LEN + 16;

/// Entries the cache may hold beyond the log's sealed segments (retention leaves them)
/// before open rewrites it.
const SUMMARIES_STALE_MAX: usize = 64;

/// A sealed segment's summary as the cache holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cached {
    summary: SegmentSummary,
    identity: [u64; 2],
}

impl Cached {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&encode_footer(&[], &self.summary));
        for v in self.identity {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// `None` unless the footer's crc holds (a torn identity only fails to match).
    fn decode(e: &[u8]) -> Option<Cached> {
        let footer = decode_footer(e.get(..FOOTER_LEN)?).filter(|f| f.summary_checked)?;
        let word = |i: usize| {
            let at = FOOTER_LEN + 8 * i;
            e.get(at..at + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
        };
        Some(Cached {
            summary: footer.summary,
            identity: [word(0)?, word(1)?],
        })
    }

    /// The summary, if `stat` is of the data file it describes (the same length and
    /// identity).
    fn for_file(&self, stat: &FileStat) -> Option<SegmentSummary> {
        (stat.len == self.summary.bytes && stat.identity == self.identity).then_some(self.summary)
    }
}

impl Summaries {
    fn new(dir: &Path) -> Summaries {
        Summaries {
            path: dir.join(SUMMARIES_FILE),
            lock: Mutex::new(()),
        }
    }

    /// The entries that hold up (crc), by base; the last one of a base wins. Missing,
    /// unreadable or oversized: none (the footers are read instead).
    fn read(&self, fs: &Fs) -> std::collections::HashMap<u64, Cached> {
        let mut out = std::collections::HashMap::new();
        let Ok(f) = fs.open(&self.path) else {
            return out;
        };
        // Far more than any log's segments: a damaged length is not allocated.
        const MAX_BYTES: u64 = (SUMMARY_LEN as u64) << 20;
        let Ok(Some(bytes)) = f.read_all(MAX_BYTES) else {
            return out;
        };
        for c in bytes.chunks_exact(SUMMARY_LEN).filter_map(Cached::decode) {
            out.insert(c.summary.base, c);
        }
        out
    }

    /// Appends the summary of the sealed segment whose data file is `path` (over a torn
    /// last entry, if a crash left one). A failure only costs the next open the footer
    /// read.
    fn append(&self, fs: &Fs, s: &SegmentSummary, path: &Path) {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let written = fs.file_stat(path).and_then(|stat| {
            let mut entry = Vec::with_capacity(SUMMARY_LEN);
            Cached {
                summary: *s,
                identity: stat.identity,
            }
            .encode(&mut entry);
            let f = fs.open_or_create(&self.path)?;
            let len = f.len()?;
            f.write_all_at(&entry, len - len % SUMMARY_LEN as u64)
        });
        if let Err(e) = written {
            tracing::warn!(error = %e, "could not append to the sealed summaries");
        }
    }

    /// Replaces the file with `all`.
    fn rewrite(&self, fs: &Fs, all: &[Cached]) {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut bytes = Vec::with_capacity(all.len() * SUMMARY_LEN);
        for c in all {
            c.encode(&mut bytes);
        }
        let written = fs.open_or_create(&self.path).and_then(|f| {
            f.write_all_at(&bytes, 0)?;
            f.set_len(bytes.len() as u64)
        });
        if let Err(e) = written {
            tracing::warn!(error = %e, "could not rewrite the sealed summaries");
        }
    }
}

/// The single writer of a topic's log. Callers serialise access (one `&mut`).
#[derive(Debug)]
pub struct TopicLog {
    fs: Fs,
    dir: PathBuf,
    cfg: LogConfig,
    reader: LogReader,
    active: Arc<Segment>,
    index_file: DataFile,
    /// Position of the active segment's last index entry.
    last_entry: Option<u64>,
    /// Entries in the active segment's index file.
    index_count: u64,
    /// Length of the active segment file: zeros are written ahead of the records so that
    /// a sync after an append only flushes data, not a size change (see `flush`).
    allocated: u64,
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
    spare: Option<std::thread::JoinHandle<Result<DataFile>>>,
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
    /// Opens (or creates) the log in `dir`. Reads sealed segments' index footers and
    /// scans only the active segment's tail.
    pub fn open(fs: &Fs, dir: &Path, cfg: LogConfig, now_ms: u64) -> Result<TopicLog> {
        fs.create_dir_all(dir)?;
        // Before anything is read: a file whose sync failed may show records the disk lacks.
        fs.rewrite_unsynced(dir)?;
        let mut bases: Vec<u64> = Vec::new();
        let mut stray_indexes: Vec<u64> = Vec::new();
        let mut recycled: Vec<PathBuf> = Vec::new();
        for name in fs.list_dir(dir)? {
            if let Some(b) = name.strip_suffix(".log").and_then(parse_base) {
                bases.push(b);
            } else if let Some(b) = name.strip_suffix(".idx").and_then(parse_base) {
                stray_indexes.push(b);
            } else if name.ends_with(segment::RECYCLED_SUFFIX) {
                recycled.push(dir.join(name));
            }
        }
        bases.sort_unstable();
        recycled.sort_unstable();
        // Kept only where rolls reuse them (a log opened under another policy since), and
        // only from below the log's first segment, as retention leaves them: the old
        // records in one must all have offsets below every new segment's base (a log whose
        // segments were deleted by hand starts again at 0).
        let first = bases.first().copied();
        let (mut keep, mut gone): (Vec<PathBuf>, Vec<PathBuf>) =
            recycled.into_iter().partition(|p| {
                let base = p
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.strip_suffix(segment::RECYCLED_SUFFIX))
                    .and_then(|n| n.strip_suffix(".log"))
                    .and_then(parse_base);
                cfg.preallocate && matches!((base, first), (Some(b), Some(f)) if b < f)
            });
        gone.extend(keep.split_off(MAX_RECYCLED.min(keep.len())));
        for path in &gone {
            fs.remove_file(path)?;
        }
        let mut recycled = keep;
        for b in stray_indexes {
            if bases.binary_search(&b).is_err() {
                // Left behind by retention stopped half-way.
                fs.remove_file(&dir.join(segment::index_file_name(b)))?;
            }
        }
        let poison: Poison = Arc::new(OnceLock::new());
        let summaries = Arc::new(Summaries::new(dir));
        // A last segment torn during creation (shorter than its header) holds nothing:
        // the previous segment is the active one.
        while bases.len() > 1 {
            let last = *bases.last().unwrap_or(&0);
            let path = dir.join(segment::segment_file_name(last));
            let len = fs.open(&path)?.len()?;
            if len >= SEGMENT_HEADER_LEN as u64 {
                break;
            }
            tracing::warn!(segment = %path.display(), "removing a segment torn during creation");
            fs.remove_file(&path)?;
            fs.remove_file(&dir.join(segment::index_file_name(last)))?;
            bases.pop();
        }
        let interval = cfg.index_interval_bytes;
        // Written by the last open that checked the log in full: if it names this boot and
        // this directory, every write since is still in the page cache (only a process
        // died, not the machine), so nothing written can be missing (see ARCHITECTURE).
        let mark = fs.boot_mark(dir);
        let same_boot = mark.as_ref().is_some_and(|m| {
            fs.open(&dir.join(BOOT_MARK_FILE))
                .and_then(|f| f.read_all(m.len() as u64))
                .is_ok_and(|b| b.as_deref() == Some(m.as_bytes()))
        });
        // A segment whose successor says it was still being synced when the successor was
        // created (`seal_in_background`; at most `MAX_SEALING` before the active one) may
        // have lost records to a power cut: then everything after it came after the loss,
        // and the log is cut back to it (it becomes the active segment, whose torn tail
        // open truncates): the log stays a prefix, without a gap.
        let from = bases.len().saturating_sub(MAX_SEALING + 1);
        let mut cached = summaries.read(fs);
        // The cache file was removed by a cut-back (its entries still serve this open).
        let mut cache_removed = false;
        let mut known = std::collections::HashMap::new();
        // The active segment's header says it was rolled under `seal_in_background` (read
        // here once, as the last pair's successor).
        let mut active_flagged = false;
        for i in from..bases.len().saturating_sub(1) {
            let (prev, next) = (bases[i], bases[i + 1]);
            let next_path = dir.join(segment::segment_file_name(next));
            let prev_path = dir.join(segment::segment_file_name(prev));
            let flags = segment::header_flags(fs, &next_path, next);
            if i + 2 == bases.len() {
                active_flagged = flags & FLAG_FOLLOWS_UNSYNCED != 0;
            }
            // `Some(valid)`: records were lost; `valid` as in `Whole::No`.
            let lost = if flags & FLAG_SPARE != 0 {
                // Renamed from a spare at a roll whose real header never reached the disk:
                // nothing in it (or after it) was synced.
                Some(None)
            } else if flags & FLAG_FOLLOWS_UNSYNCED == 0 {
                None
            } else {
                match segment::wholeness(
                    fs,
                    &prev_path,
                    prev,
                    next,
                    cfg.max_body,
                    interval,
                    // Sealed inline (`Always`/`Interval`) the segment is read whole and
                    // synced in this open anyway: the full check costs nothing more there.
                    same_boot && cfg.seal_in_background,
                    fs.file_stat(&prev_path)
                        .ok()
                        .and_then(|stat| cached.get(&prev)?.for_file(&stat))
                        .as_ref(),
                )? {
                    segment::Whole::Yes(k) => {
                        // Sealed inline by this open (its footer rebuilt below): in the same
                        // boot `next`'s real header may be in the page cache only (see the
                        // background case at the end), so it is made durable first.
                        if same_boot && matches!(k, segment::Known::Scan(_)) {
                            fs.open(&next_path)?.sync_data()?;
                            fs.sync_dir(dir)?;
                        }
                        known.insert(prev, k);
                        None
                    }
                    segment::Whole::No { valid } => Some(valid),
                }
            };
            if let Some(valid) = lost {
                // First (a crash now repeats this open's decision): a record after a lost
                // one must not stay in what becomes the active segment, whose recovery
                // trusts its index and would not find the hole.
                if let Some(valid) = valid {
                    let f = fs.open(&prev_path)?;
                    if f.len()? > valid {
                        f.set_len(valid)?;
                        f.sync_data()?;
                    }
                }
                tracing::warn!(
                    segment = %prev_path.display(),
                    dropped = bases.len() - i - 1,
                    "unsynced records were lost (power cut while segments were being \
                     synced); the log is cut back to them"
                );
                // First: the bases deleted now may be written again, differently.
                fs.remove_file(&summaries.path)?;
                cache_removed = true;
                cached.retain(|&b, _| b < prev);
                for &b in &bases[i + 1..] {
                    fs.remove_file(&dir.join(segment::segment_file_name(b)))?;
                    fs.remove_file(&dir.join(segment::index_file_name(b)))?;
                }
                fs.sync_dir(dir)?;
                // Synced just now: every name left is durable.
                active_flagged = false;
                bases.truncate(i + 1);
                known.remove(&prev);
                break;
            }
        }
        let mut segments: Vec<Arc<Segment>> = Vec::with_capacity(bases.len().max(1));
        // The sealed segments' data files as the loop found them (for the cache).
        let mut stats: Vec<FileStat> = Vec::with_capacity(bases.len());
        for (i, &base) in bases.iter().enumerate() {
            let path = dir.join(segment::segment_file_name(base));
            let seg = if i + 1 == bases.len() {
                // After a power cut the unsynced part may have lost a page and kept a later
                // one, which a scan after the last index entry would not see.
                Segment::open_active(
                    fs,
                    path,
                    base,
                    cfg.max_body,
                    interval,
                    poison.clone(),
                    !same_boot,
                )?
            } else {
                // One `statx` serves the cache, the footer check and the cache's rewrite.
                let stat = fs.file_stat(&path)?;
                let k = known.remove(&base).or_else(|| {
                    let s = cached.get(&base)?.for_file(&stat)?;
                    Some(segment::Known::Footer(s))
                });
                stats.push(stat);
                Segment::open_sealed(
                    fs,
                    path,
                    base,
                    stat.len,
                    cfg.max_body,
                    interval,
                    poison.clone(),
                    k,
                )?
            };
            if let Some(prev) = segments.last()
                && prev.next() != base
            {
                return Err(Error::corrupt(
                    &seg.path,
                    format!(
                        "gap in the log: previous segment ends at offset {}, this one starts at {base}",
                        prev.next()
                    ),
                ));
            }
            segments.push(Arc::new(seg));
        }
        // A new log: `Segment::create` syncs the directory itself.
        let created = segments.is_empty();
        if created {
            segments.push(Arc::new(Segment::create(
                fs,
                dir,
                0,
                now_ms,
                cfg.max_body,
                poison.clone(),
                0,
            )?));
        }
        let active = segments
            .last()
            .cloned()
            .ok_or_else(|| Error::corrupt(dir, "log has no segment after open (internal error)"))?;
        // A power cut between a rename and its directory sync can keep both names of the
        // file where renames are not atomic across crashes (ext4's are; `SimFs`'s are not):
        // a kept file that is also a segment must never be overwritten.
        if !recycled.is_empty() {
            let mut segment_files: Vec<u64> = stats.iter().map(|s| s.identity[0]).collect();
            segment_files.push(fs.file_stat(&active.path)?.identity[0]);
            let mut kept = Vec::with_capacity(recycled.len());
            for path in recycled {
                if segment_files.contains(&fs.file_stat(&path)?.identity[0]) {
                    tracing::warn!(file = %path.display(), "a kept segment file is also a segment; dropping the kept name");
                    fs.remove_file(&path)?;
                } else {
                    kept.push(path);
                }
            }
            recycled = kept;
        }
        let index_file = fs.open_or_create(&active.index_path)?;
        let allocated = active.with_file(|f| f.len())?;
        let entries = active.index(interval)?;
        let last_entry = entries.last().map(|e| e.position);
        // With their successors: see the sealing below.
        let unsealed: Vec<(Arc<Segment>, Arc<Segment>)> = segments
            .windows(2)
            .filter(|w| !w[0].is_sealed())
            .map(|w| (w[0].clone(), w[1].clone()))
            .collect();
        // Sealed segments the cache lacks (a log from before it, lost appends, files made
        // anew) or many entries retention left behind: rewritten (before any sealing
        // thread appends), with what was checked at this open.
        let sealed: Vec<Cached> = segments
            .iter()
            .zip(&stats)
            .filter(|(s, _)| s.is_sealed() && s.summary_trusted())
            .map(|(s, stat)| Cached {
                summary: s.summary(),
                identity: stat.identity,
            })
            .collect();
        let lacking = sealed
            .iter()
            .any(|c| cached.get(&c.summary.base) != Some(c));
        if lacking || cache_removed || cached.len() > sealed.len() + SUMMARIES_STALE_MAX {
            summaries.rewrite(fs, &sealed);
        }
        // The largest, not the last segment's: a log written before `newest_ts` existed
        // may have gone back at a roll.
        let newest_ts = segments
            .iter()
            .map(|s| s.summary().last_ts)
            .max()
            .unwrap_or(0);
        let bounds = Arc::new([
            AtomicU64::new(segments.first().map_or(0, |s| s.base)),
            AtomicU64::new(active.next()),
        ]);
        let visibility = cfg
            .visible_when_synced
            .then(|| Arc::new(Visibility::new(bounds.clone())));
        if let Some(v) = &visibility {
            active.defer_visibility(v.clone());
            // What recovery found may be unsynced (a killed process's last writes, read
            // back in the same boot): durable before any reader can see it.
            active.sync_after_resize()?;
        }
        let mut log = TopicLog {
            fs: fs.clone(),
            dir: dir.to_owned(),
            cfg,
            reader: LogReader {
                bounds,
                segments: Arc::new(RwLock::new(segments)),
                swept: Arc::new(AtomicU64::new(0)),
                cfg,
            },
            active,
            index_file,
            last_entry,
            index_count: entries.len() as u64,
            allocated,
            // Open truncated any old records off the active segment (its scan stops at
            // the zeros after the last write).
            stale_until: 0,
            zeroed_to: 0,
            buf: Vec::new(),
            index_buf: Vec::new(),
            entries: Vec::new(),
            held: None,
            newest_ts,
            poison,
            sealing: std::collections::VecDeque::new(),
            spare: None,
            recycled,
            summaries,
            visibility,
        };
        // A segment made from a spare has its name made durable by its sealing thread
        // (`seal_after`), which a killed process may not have run: records published into
        // it from now on (acknowledged under `Always`) would go with the name at a power
        // cut. Every segment rolled under `seal_in_background` carries the flag. And once
        // per boot (the first open that checks in full, of a log it did not just create):
        // an earlier open may have cut the
        // log back and failed before its directory sync, so that the deleted segments are
        // gone from the page cache but not from the disk, where a power cut would bring
        // them back behind what is appended from now on.
        if active_flagged || (!same_boot && !created) {
            fs.sync_dir(dir)?;
        }
        // Found whole from their index entries (`same_boot`): read whole, synced and sealed
        // as the interrupted sealing would have, oldest first, still at most `MAX_SEALING`,
        // and, as that sealing would have, after making the successor durable: a killed
        // process may have left its real header (a roll from the spare) in the page cache
        // only, and no footer may vouch for a segment whose successor's header a power cut
        // could still turn back into the spare's (open would not know the segment).
        debug_assert!(unsealed.len() <= MAX_SEALING);
        debug_assert!(unsealed.is_empty() || cfg.seal_in_background);
        // Started by `resume_sealing` once the caller's open is done (its syncs would
        // slow the open's own), or run inline by whatever waits for them first.
        for (seg, successor) in unsealed {
            let fresh = Some((successor, dir.to_owned()));
            log.sealing
                .push_back((seg.base, Sealing::Deferred(seg, fresh)));
        }
        if let Some(m) = mark.filter(|_| !same_boot) {
            // Not synced: a power cut that loses it also starts another boot.
            let written = fs.open_or_create(&dir.join(BOOT_MARK_FILE)).and_then(|f| {
                f.write_all_at(m.as_bytes(), 0)
                    .and(f.set_len(m.len() as u64))
            });
            if let Err(e) = written {
                tracing::warn!(error = %e, "could not write the boot mark; the next open checks the log in full");
            }
        }
        Ok(log)
    }

    /// Starts making the spare file for the next roll (`seal_in_background`): at a roll
    /// (it has a whole segment's time to get ready, measured better than starting later),
    /// and in a process's first segment once it is half full (topics that never roll
    /// never make one).
    fn start_spare(&mut self) {
        if !self.cfg.seal_in_background || self.spare.is_some() {
            return;
        }
        let (fs, dir) = (self.fs.clone(), self.dir.clone());
        self.spare = std::thread::Builder::new()
            .name("spool-spare".into())
            .spawn(move || segment::make_spare(&fs, &dir))
            .ok();
    }

    /// The spare file if it is ready now (never waits for it).
    fn take_spare(&mut self) -> Option<DataFile> {
        if !self.spare.as_ref()?.is_finished() {
            return None;
        }
        match self.spare.take()?.join() {
            Ok(Ok(file)) => Some(file),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not make a spare segment file; the roll creates one");
                None
            }
            Err(_) => None,
        }
    }

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

    /// Appends `msgs` (already validated) with timestamps `max(now, previous)`. Returns
    /// the first offset; the rest follow densely. One `write` per segment touched.
    pub fn append(&mut self, msgs: &[Append<'_>], now_ms: u64) -> Result<u64> {
        self.append_inner(msgs, now_ms, false)
    }

    /// `append`, but the records stay in memory (`write_held`) unless they reach
    /// `HOLD_MAX_BYTES` or a roll: when every append is synced, the sync thread writes a
    /// cohort's records in one write just before its sync, so no write lands in the file
    /// while a sync runs (each cost the sync time, see benches/FINDINGS.md).
    pub fn append_held(&mut self, msgs: &[Append<'_>], now_ms: u64) -> Result<u64> {
        self.append_inner(msgs, now_ms, true)
    }

    /// Writes the records `append_held` left in memory (readers see them now, or under
    /// `visible_when_synced` after the sync that covers them). After a failure (which
    /// poisons the log) they are dropped.
    pub fn write_held(&mut self) -> Result<()> {
        let Some(mut p) = self.held.take() else {
            return Ok(());
        };
        let written = match self.check_poison() {
            Ok(()) => self.flush(&mut p),
            Err(e) => {
                self.buf.clear();
                self.index_buf.clear();
                Err(e)
            }
        };
        p.entries.clear();
        self.entries = p.entries;
        written
    }

    fn append_inner(&mut self, msgs: &[Append<'_>], now_ms: u64, hold: bool) -> Result<u64> {
        self.check_poison()?;
        // A record over the ceiling would be written but never read back (every read and
        // recovery takes it for damage): refuse the batch before any of it is written.
        for m in msgs {
            let body = record::BODY_FIXED_LEN + m.headers_len + m.payload.len();
            if body > self.cfg.max_body {
                return Err(Error::MessageTooLarge {
                    size: body,
                    max: self.cfg.max_body,
                });
            }
        }
        let mut pending = match self.held.take() {
            Some(p) => p,
            None => Pending::start(
                &self.active,
                std::mem::take(&mut self.entries),
                self.newest_ts,
            ),
        };
        let first = pending.next;
        for m in msgs {
            let hlen = m.headers_len;
            debug_assert_eq!(hlen, record::headers_len(m.headers));
            let frame = (record::RECORD_OVERHEAD + hlen + m.payload.len()) as u64;
            if pending.next > self.active.base && pending.end + frame > self.cfg.segment_bytes {
                self.flush(&mut pending)?;
                self.roll(now_ms)?;
                let entries = std::mem::take(&mut pending.entries);
                pending = Pending::start(&self.active, entries, self.newest_ts);
            }
            let ts = now_ms.max(pending.last_ts);
            let position = pending.end;
            if wants_entry(self.last_entry, position, self.cfg.index_interval_bytes) {
                let e = IndexEntry {
                    offset: pending.next,
                    position,
                    timestamp_ms: ts,
                    ids_before: pending.ids,
                };
                encode_entry(&e, &mut self.index_buf);
                pending.entries.push(e);
                self.last_entry = Some(position);
            }
            let n = record::encode(&mut self.buf, pending.next, ts, m.headers, m.payload);
            debug_assert_eq!(n as u64, frame);
            if pending.next == self.active.base {
                pending.first_ts = ts;
            }
            pending.end += frame;
            pending.next += 1;
            pending.last_ts = ts;
            if m.headers.contains_key(MESSAGE_ID_HEADER) {
                pending.ids += 1;
            }
        }
        if hold && self.buf.len() < HOLD_MAX_BYTES {
            self.held = Some(pending);
        } else {
            self.flush(&mut pending)?;
            self.entries = pending.entries;
        }
        Ok(first)
    }

    /// Writes the buffered records and index entries; readers see them now, or under
    /// `visible_when_synced` after the sync that covers them.
    fn flush(&mut self, p: &mut Pending) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let at = self.active.written().bytes;
        let need = at + self.buf.len() as u64;
        if self.cfg.preallocate
            && need > self.allocated
            && let Err(e) = self.preallocate(need)
        {
            let _ = self.poison.set(format!("write failed: {e}"));
            self.buf.clear();
            self.index_buf.clear();
            return Err(e);
        }
        // Old bytes below `stale_until`: zeros first, over the records' range and a frame
        // header past it, then the records. A kill can cut a write short at any page (the
        // kernel stops copying at a fatal signal), so only zeros may follow the whole
        // records that such a write leaves (a power cut tearing the unsynced writes is
        // README's known limit). To the end of a page: that page is written back with the
        // records anyway, and the next records into it need no zeros of their own.
        debug_assert!(at >= self.stale_until || self.zeroed_to >= at);
        let want = (need + TERMINATOR_BYTES).min(self.stale_until);
        let zeroed = if want > self.zeroed_to {
            let to = want.next_multiple_of(PAGE_BYTES).min(self.stale_until);
            let from = std::mem::replace(&mut self.zeroed_to, to);
            write_zeros(&self.active, from, to)
        } else {
            Ok(())
        };
        if let Err(e) =
            zeroed.and_then(|()| self.active.with_file(|f| f.write_all_at(&self.buf, at)))
        {
            let _ = self.poison.set(format!("write failed: {e}"));
            self.buf.clear();
            self.index_buf.clear();
            return Err(e);
        }
        self.buf.clear();
        if !self.index_buf.is_empty() {
            // The index is a cache: if this write is lost, open rebuilds the tail.
            let at = self.index_count * INDEX_ENTRY_LEN as u64;
            self.index_count += p.entries.len() as u64;
            let r = self.index_file.write_all_at(&self.index_buf, at);
            self.index_buf.clear();
            if let Err(e) = r {
                tracing::warn!(error = %e, "index write failed; it will be rebuilt on open");
            }
        }
        let written = SegmentSummary {
            base: self.active.base,
            next: p.next,
            bytes: p.end,
            first_ts: p.first_ts,
            last_ts: p.last_ts,
            id_count: p.ids,
        };
        if self.active.written_to(written, &p.entries) {
            self.reader.bounds[1].store(p.next, Ordering::Release);
        }
        // Here, where every record is written: a batch whose roll failed after its first
        // part was written still sets the floor of what comes next.
        debug_assert!(p.last_ts >= self.newest_ts);
        self.newest_ts = p.last_ts;
        p.entries.clear();
        if p.end >= self.cfg.segment_bytes / 2 {
            self.start_spare();
        }
        // Under Sync=Interval (no sync per append, a sync in the roll), write back in the
        // background every few MiB, so that the sync at the roll finds little left and does
        // not stall the writer for a whole segment's worth of dirty pages. Under Sync=None
        // the roll does not sync (`seal_in_background`), and these syncs only competed with
        // the writer (measured: 6.0-6.7 M msg/s with them, 7.2-7.5 M without).
        if !self.cfg.preallocate
            && !self.cfg.seal_in_background
            && p.end / WRITE_BACK_BYTES > at / WRITE_BACK_BYTES
        {
            let seg = self.active.clone();
            let spawned = std::thread::Builder::new()
                .name("spool-writeback".into())
                .spawn(move || {
                    if let Err(e) = seg.sync() {
                        tracing::error!(error = %e, "background write-back failed");
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "could not start a write-back thread; the roll will sync");
            }
        }
        Ok(())
    }

    /// Extends the active segment with zeros past `need` (up to the segment size). An
    /// in-place overwrite with `fdatasync` skips the metadata journal commit that an
    /// append with `fdatasync` pays (measured on ext4: see benches/FINDINGS.md).
    /// Recovery treats a zero tail as free space, not damage.
    fn preallocate(&mut self, need: u64) -> Result<()> {
        let target = need
            .max((need + PREALLOCATE_BYTES).min(self.cfg.segment_bytes))
            .max(self.allocated);
        write_zeros(&self.active, self.allocated, target)?;
        self.allocated = target;
        Ok(())
    }

    /// Seals the active segment (trimmed to its records, synced, index footer written;
    /// with `seal_in_background` the sync and index on a thread) and starts a new one.
    fn roll(&mut self, now_ms: u64) -> Result<()> {
        // Recovery checks only the `MAX_SEALING` segments before the active one, so none
        // older may still be unsynced when the next is created: every sealing older than
        // the last `MAX_SEALING - 1` before the active one is waited for. By position, not
        // count: sealings finish out of order, and a reopened process may have one pending
        // for an older segment than the sealed ones after it (a killed process's leftover).
        let keep_from = {
            let segs = read_lock(&self.reader.segments);
            segs[segs.len().saturating_sub(MAX_SEALING)].base
        };
        while let Some(&(oldest, _)) = self.sealing.front()
            && oldest < keep_from
        {
            self.finish_oldest_sealing()?;
        }
        // With the active one's about to be added: `MAX_SEALING` at most.
        debug_assert!(self.sealing.len() < MAX_SEALING);
        // The writer's end: records written and not yet synced are part of the segment.
        self.active
            .with_file(|f| f.set_len(self.active.written().bytes))?;
        let background = self.cfg.seal_in_background;
        if !background {
            seal(
                &self.fs,
                &self.active,
                self.cfg.index_interval_bytes,
                &self.summaries,
            )?;
        }
        let s = self.active.written();
        debug_assert!(
            background || s == self.active.summary(),
            "sealed, so synced"
        );
        // Before the new segment takes a descriptor (a writer nobody reads behind leaves a
        // sealed file open at every roll).
        close_files(&read_lock(&self.reader.segments));
        let spare = if background { self.take_spare() } else { None };
        let from_spare = spare.is_some();
        let mut allocated = SEGMENT_HEADER_LEN as u64;
        let mut stale_until = 0;
        // Only where nothing is zeroed ahead (`preallocate`, never with `background`).
        let reuse = if background {
            None
        } else {
            self.recycled.pop()
        };
        let recycled = match reuse {
            Some(path) => match Segment::from_recycled(
                &self.fs,
                &self.dir,
                &path,
                s.next,
                now_ms,
                self.cfg.max_body,
                self.poison.clone(),
            ) {
                Ok((seg, len)) => {
                    allocated = len;
                    stale_until = len;
                    Some(seg)
                }
                Err(e) => {
                    // Nothing was renamed yet (or `create` below finds the name taken).
                    tracing::warn!(error = %e, file = %path.display(), "could not reuse a recycled segment file; creating one");
                    let _ = self.fs.remove_file(&path);
                    None
                }
            },
            None => None,
        };
        let created = match (spare, recycled) {
            (_, Some(seg)) => Ok(seg),
            (Some(file), None) => Segment::from_spare(
                &self.fs,
                &self.dir,
                file,
                s.next,
                now_ms,
                self.cfg.max_body,
                self.poison.clone(),
            ),
            (None, None) => Segment::create(
                &self.fs,
                &self.dir,
                s.next,
                now_ms,
                self.cfg.max_body,
                self.poison.clone(),
                if background { FLAG_FOLLOWS_UNSYNCED } else { 0 },
            ),
        };
        let seg = match created {
            Ok(seg) => Arc::new(seg),
            Err(e) => {
                let _ = self.poison.set(format!("could not start a segment: {e}"));
                return Err(e);
            }
        };
        // The new segment's file exists: records appended to the sealed one instead would
        // overlap its base.
        self.index_file = match self.fs.open_or_create(&seg.index_path) {
            Ok(f) => f,
            Err(e) => {
                let _ = self
                    .poison
                    .set(format!("could not start a segment's index: {e}"));
                return Err(e);
            }
        };
        self.last_entry = None;
        self.index_count = 0;
        self.allocated = allocated;
        self.stale_until = stale_until;
        // The old records start right after the new header.
        self.zeroed_to = SEGMENT_HEADER_LEN as u64;
        if let Some(v) = &self.visibility {
            seg.defer_visibility(v.clone());
        }
        write_lock(&self.reader.segments).push(seg.clone());
        let old = std::mem::replace(&mut self.active, seg);
        if background {
            // A segment made from a spare has its header and name synced by the sealing
            // (first, so that recovery rarely meets a header that still says "spare").
            let fresh = from_spare.then(|| (self.active.clone(), self.dir.clone()));
            self.seal_in_background(old, fresh)?;
            self.start_spare();
        }
        Ok(())
    }

    /// Has `seg` sealed on a thread (after making `fresh`, a segment made from a spare,
    /// durable under its name); sealed here if no thread can be started.
    fn seal_in_background(
        &mut self,
        seg: Arc<Segment>,
        fresh: Option<(Arc<Segment>, PathBuf)>,
    ) -> Result<()> {
        match self.spawn_sealing(&seg, &fresh) {
            Some(h) => {
                debug_assert!(self.sealing.back().is_none_or(|&(b, _)| b < seg.base));
                self.sealing.push_back((seg.base, Sealing::Running(h)));
            }
            // No thread: seal here; the segment is no less sealed for it.
            None => self.seal_here(&seg, fresh.as_ref())?,
        }
        Ok(())
    }

    /// `seal_after` on this thread.
    fn seal_here(&self, seg: &Segment, fresh: Option<&(Arc<Segment>, PathBuf)>) -> Result<()> {
        let interval = self.cfg.index_interval_bytes;
        seal_after(&self.fs, fresh, seg, interval, &self.summaries)
    }

    /// Starts the sealings this log's open found interrupted (a killed process's), which
    /// it left for after the caller's open. One that gets no thread stays for whatever
    /// waits for it to run inline.
    pub fn resume_sealing(&mut self) {
        for i in 0..self.sealing.len() {
            if let Sealing::Deferred(seg, fresh) = &self.sealing[i].1 {
                match self.spawn_sealing(seg, fresh) {
                    Some(h) => self.sealing[i].1 = Sealing::Running(h),
                    None => tracing::warn!(
                        segment = %seg.path.display(),
                        "could not start a sealing thread; the segment is sealed when \
                         something next waits for it (a roll, sync or close)"
                    ),
                }
            }
        }
    }

    /// A thread sealing `seg` (`seal_after`), if one can be started.
    fn spawn_sealing(
        &self,
        seg: &Arc<Segment>,
        fresh: &Option<(Arc<Segment>, PathBuf)>,
    ) -> Option<std::thread::JoinHandle<Result<()>>> {
        let job = {
            let (fs, interval, seg, fresh, summaries) = (
                self.fs.clone(),
                self.cfg.index_interval_bytes,
                seg.clone(),
                fresh.clone(),
                self.summaries.clone(),
            );
            move || seal_after(&fs, fresh.as_ref(), &seg, interval, &summaries)
        };
        std::thread::Builder::new()
            .name("spool-seal".into())
            .spawn(job)
            .ok()
    }

    /// Waits for every background thread of this log (sealings and the spare file): at
    /// close, so that nothing writes in the directory after the instance let it go.
    pub fn quiesce(&mut self) -> Result<()> {
        let held = self.write_held();
        if let Some(h) = self.spare.take() {
            // A spare made now is still a spare: the next open makes its own.
            let _ = h.join();
        }
        held.and(self.finish_sealing())
    }

    /// Waits for every background sealing; a failure poisons the topic (the records may
    /// not be durable).
    pub fn finish_sealing(&mut self) -> Result<()> {
        // Every one, also after one failed (a poisoned topic fails them all): none may
        // still be running when this returns (at close, nothing writes in the directory).
        let mut first = Ok(());
        while !self.sealing.is_empty() {
            first = first.and(self.finish_oldest_sealing());
        }
        first
    }

    fn finish_oldest_sealing(&mut self) -> Result<()> {
        let Some((_, sealing)) = self.sealing.pop_front() else {
            return Ok(());
        };
        let r = match sealing {
            Sealing::Running(h) => h.join().unwrap_or_else(|_| {
                Err(Error::Poisoned {
                    reason: "the sealing thread panicked".into(),
                })
            }),
            Sealing::Deferred(seg, fresh) => self.seal_here(&seg, fresh.as_ref()),
        };
        if let Err(e) = &r {
            let _ = self.poison.set(format!("sealing a segment failed: {e}"));
        }
        r
    }

    /// Makes everything appended so far durable (the segment being sealed included).
    pub fn sync(&mut self) -> Result<()> {
        self.write_held()?;
        self.finish_sealing()?;
        self.active.sync()
    }

    /// Deletes whole sealed segments, oldest first, while the log keeps at least
    /// `max_bytes` without them (0 = no limit) or their newest record is older than
    /// `max_age_ms` (0 = no limit). Never the active segment. Returns the segments removed.
    pub fn apply_retention(
        &mut self,
        now_ms: u64,
        max_bytes: u64,
        max_age_ms: u64,
    ) -> Result<usize> {
        let mut removed = Vec::new();
        {
            let mut segs = write_lock(&self.reader.segments);
            let mut total: u64 = segs.iter().map(|s| s.end()).sum();
            while segs.len() > 1 {
                let oldest = &segs[0];
                // Still being sealed in the background (its index not written yet): kept
                // until the next check rather than waited for under the writer's lock.
                if !oldest.is_sealed() {
                    debug_assert!(segs.len() <= MAX_SEALING + 1, "only the last few");
                    break;
                }
                let by_bytes = max_bytes > 0 && total - oldest.end() >= max_bytes;
                let by_age =
                    max_age_ms > 0 && now_ms.saturating_sub(oldest.summary().last_ts) > max_age_ms;
                if !(by_bytes || by_age) {
                    break;
                }
                total -= oldest.end();
                let seg = segs.remove(0);
                seg.mark_removed();
                removed.push(seg);
            }
            if let Some(first) = segs.first() {
                self.reader.bounds[0].store(first.base, Ordering::Release);
            }
        }
        for seg in &removed {
            tracing::info!(segment = %seg.path.display(), next = seg.next(), "retention deleted a segment");
            // Kept for a roll to overwrite (every block of it written once, so no zeros
            // ahead), unless a reader still holds it: its open descriptor would then read
            // the new records where it expects the old ones.
            if self.cfg.preallocate
                && self.recycled.len() < MAX_RECYCLED
                && Arc::strong_count(seg) == 1
            {
                seg.close_file();
                let mut name = seg.path.clone().into_os_string();
                name.push(segment::RECYCLED_SUFFIX);
                let to = PathBuf::from(name);
                self.fs.rename(&seg.path, &to)?;
                self.recycled.push(to);
            } else {
                self.fs.remove_file(&seg.path)?;
            }
            self.fs.remove_file(&seg.index_path)?;
            // Durable before the next deletion, oldest first: a power cut must not keep a
            // later segment's deletion and lose an earlier one's (open would find a gap).
            self.fs.sync_dir(&self.dir)?;
        }
        Ok(removed.len())
    }
}

impl Drop for TopicLog {
    fn drop(&mut self) {
        // Without `quiesce` (a dropped engine): still no thread outlives the log.
        let _ = self.quiesce();
    }
}

/// A segment's background sealing (`seal_after`), in `TopicLog::sealing`.
#[derive(Debug)]
enum Sealing {
    Running(std::thread::JoinHandle<Result<()>>),
    /// Found interrupted at open, not started yet (`TopicLog::resume_sealing`).
    Deferred(Arc<Segment>, Option<(Arc<Segment>, PathBuf)>),
}

/// `seal`, after making a segment made from a spare (`fresh`: it and its directory)
/// durable under its name and header.
fn seal_after(
    fs: &Fs,
    fresh: Option<&(Arc<Segment>, PathBuf)>,
    seg: &Segment,
    interval: u64,
    summaries: &Summaries,
) -> Result<()> {
    if let Some((new, dir)) = fresh {
        // Poisons on failure: the new segment's header may be gone, and the topic's
        // writes go there next.
        new.sync_after_resize()?;
        fs.sync_dir(dir)?;
    }
    seal(fs, seg, interval, summaries)
}

/// Syncs `seg` (trimmed already), writes its sealed index and marks it sealed. Marked only
/// after the index is written: until then its in-memory index stays (a sealed segment's
/// index may be dropped and reread from the file).
fn seal(fs: &Fs, seg: &Segment, interval: u64, summaries: &Summaries) -> Result<()> {
    seg.sync_after_resize()?;
    seg.check_whole(interval)?;
    seg.verify_before_sealing(interval)?;
    // Not sealed if the topic was poisoned since the sync (while the segment was read
    // whole): a poisoned topic vouches for nothing more, and open checks an unsealed
    // segment record by record instead of trusting a sealed index.
    seg.check_poison()?;
    let s = seg.summary();
    let entries = seg.index(interval)?;
    segment::write_sealed_index(fs, &seg.index_path, &entries, &s)?;
    seg.mark_sealed();
    summaries.append(fs, &s, &seg.path);
    Ok(())
}

/// The active segment's state while a batch is being encoded.
#[derive(Debug)]
struct Pending {
    end: u64,
    next: u64,
    first_ts: u64,
    last_ts: u64,
    ids: u64,
    entries: Vec<IndexEntry>,
}

impl Pending {
    /// `entries`: an empty list to fill (its capacity is reused). `newest_ts`: the log's
    /// newest timestamp (`TopicLog::newest_ts`), the floor of the records' stamps; it is
    /// not the segment's `last_ts` until a record of it is written.
    fn start(seg: &Segment, entries: Vec<IndexEntry>, newest_ts: u64) -> Pending {
        debug_assert!(entries.is_empty());
        let s = seg.written();
        Pending {
            end: s.bytes,
            next: s.next,
            first_ts: s.first_ts,
            last_ts: s.last_ts.max(newest_ts),
            ids: s.id_count,
            entries,
        }
    }
}

/// Writes zeros over `[from, to)` of `seg`'s file (not synced).
fn write_zeros(seg: &Segment, from: u64, to: u64) -> Result<()> {
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZEROS.len() as u64) as usize;
        seg.with_file(|f| f.write_all_at(&ZEROS[..n], at))?;
        at += n as u64;
    }
    Ok(())
}

fn parse_base(stem: &str) -> Option<u64> {
    if stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()) {
        stem.parse().ok()
    } else {
        None
    }
}

impl LogReader {
    fn snapshot(&self) -> Vec<Arc<Segment>> {
        read_lock(&self.segments).clone()
    }

    pub fn stats(&self) -> LogStats {
        let segs = read_lock(&self.segments);
        LogStats {
            earliest: segs.first().map_or(0, |s| s.base),
            next: segs.last().map_or(0, |s| s.next()),
            bytes: segs.iter().map(|s| s.end()).sum(),
            segments: segs.len(),
        }
    }

    pub fn earliest(&self) -> u64 {
        self.bounds[0].load(Ordering::Acquire)
    }

    pub fn next(&self) -> u64 {
        self.bounds[1].load(Ordering::Acquire)
    }

    /// Records from `from` (clamped to the earliest retained offset), at most `max_records`
    /// and about `max_bytes` (at least one record is returned if any exists).
    pub fn read(&self, from: u64, max_records: usize, max_bytes: usize) -> Result<Vec<Record>> {
        // Sized once for what the log holds (a batch read grew it ~10 times).
        let held = usize::try_from(self.next().saturating_sub(from)).unwrap_or(usize::MAX);
        let mut out = Vec::with_capacity(max_records.min(held).min(READ_CAPACITY_MAX));
        let mut at = from;
        let mut bytes = 0usize;
        while out.len() < max_records && bytes < max_bytes {
            let Some(seg) = self.segment_with(&mut at) else {
                break;
            };
            // Retention deleted what followed the records read so far (`at` moved up to the
            // log's new start): a batch never skips over offsets, so it ends here.
            if out.last().is_some_and(|r: &Record| r.offset + 1 != at) {
                break;
            }
            let before = out.len();
            let part = self.read_part(&seg, at, max_records - before, max_bytes - bytes, &mut out);
            // After each segment: a read across many segments keeps the bounds too.
            self.sweep();
            match part? {
                Part::Read => {}
                Part::Nothing => break,
                // Deleted by retention since it was looked up: a batch never skips over
                // offsets, so one that has records ends here; an empty one goes on from
                // the log's new start.
                Part::Gone if out.is_empty() => continue,
                Part::Gone => break,
            }
            bytes += out[before..].iter().map(|r| r.payload.len()).sum::<usize>();
            at = out.last().map_or(at, |r| r.offset + 1);
        }
        Ok(out)
    }

    /// Unloads indexes and closes files beyond their bounds, if anything was loaded or
    /// opened (by any log) since this log last looked.
    fn sweep(&self) {
        let loads = segment::LOADS.load(Ordering::Relaxed);
        // Read first: readers of one log would otherwise all write one cache line.
        if self.swept.load(Ordering::Relaxed) != loads
            && self.swept.swap(loads, Ordering::Relaxed) != loads
        {
            let segs = read_lock(&self.segments);
            evict_indexes(&segs);
            close_files(&segs);
        }
    }

    /// `seg`'s part of a read, from `at`. A segment that retention deleted since it was
    /// looked up (its file closed, so it could not be opened again) is `Gone`: what it held
    /// is gone, the log goes on from its new start.
    fn read_part(
        &self,
        seg: &Segment,
        at: u64,
        max_records: usize,
        max_bytes: usize,
        out: &mut Vec<Record>,
    ) -> Result<Part> {
        let before = out.len();
        match seg.read(
            at,
            max_records,
            max_bytes,
            self.cfg.index_interval_bytes,
            out,
        ) {
            Err(_) if seg.is_removed() => Ok(Part::Gone),
            Err(e) => Err(e),
            Ok(()) if out.len() > before => Ok(Part::Read),
            Ok(()) => Ok(Part::Nothing),
        }
    }

    /// The segment holding `at` or the first record after it (`at` moved up to the log's
    /// start if retention deleted it); one `Arc` taken, not the whole list.
    fn segment_with(&self, at: &mut u64) -> Option<Arc<Segment>> {
        let segs = read_lock(&self.segments);
        *at = (*at).max(segs.first()?.base);
        let start = segs.partition_point(|s| s.base <= *at).saturating_sub(1);
        segs[start..].iter().find(|s| *at < s.next()).cloned()
    }

    /// The first offset whose record has a timestamp `>= ts_ms`; the log end if none.
    pub fn offset_for_time(&self, ts_ms: u64) -> Result<u64> {
        loop {
            if let Some(o) = self.offset_for_time_in(&self.snapshot(), ts_ms)? {
                return Ok(o);
            }
        }
    }

    /// `offset_for_time` in a snapshot of the segments; `None` if one of them was deleted
    /// by retention since (look again in what is left).
    fn offset_for_time_in(&self, segs: &[Arc<Segment>], ts_ms: u64) -> Result<Option<u64>> {
        // The first segment with a record at or after `ts_ms` holds the first such record
        // (within a segment timestamps never go back). A scan of the summaries in memory,
        // not a binary search: an empty segment (the active one after a roll) breaks the
        // order one needs, and so did a log written before `newest_ts` (whose timestamps
        // could go back at a roll).
        let i = segs
            .iter()
            .position(|s| !s.is_empty() && s.summary().last_ts >= ts_ms)
            .unwrap_or(segs.len());
        for seg in &segs[i..] {
            let found = seg.offset_for_time(ts_ms, self.cfg.index_interval_bytes);
            self.sweep();
            match found {
                Ok(Some(o)) => return Ok(Some(o)),
                Ok(None) => {}
                Err(_) if seg.is_removed() => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        Ok(Some(segs.last().map_or(0, |s| s.next())))
    }

    /// Segments newest first with their id counts, for rebuilding de-duplication state.
    pub fn segments_newest_first(&self) -> Vec<Arc<Segment>> {
        let mut s = self.snapshot();
        s.reverse();
        s
    }

    /// Appends to `ids`, in log order, the message ids of `seg`'s records (with their
    /// offsets) from a point where at least `want_ids` of them follow (or from its start).
    /// On an error, the ids read before it are there (or, if the whole read that a wrong
    /// count of its start entry calls for fails, those read from the entry).
    pub fn last_ids(
        &self,
        seg: &Segment,
        want_ids: u64,
        ids: &mut Vec<(String, u64)>,
    ) -> Result<()> {
        let interval = self.cfg.index_interval_bytes;
        let total = seg.summary().id_count;
        let entries = seg.index(interval)?;
        // The latest entry with at least `want_ids` ids at or after it.
        let start = entries
            .iter()
            .rev()
            .find(|e| total.saturating_sub(e.ids_before) >= want_ids);
        let had = ids.len();
        let ids_from = |from: u64, ids: &mut Vec<(String, u64)>| {
            seg.for_each_from(from, interval, |r| {
                if let Some(id) = r.headers.get(MESSAGE_ID_HEADER) {
                    ids.push((id.clone(), r.offset));
                }
            })
        };
        let mut visited = ids_from(start.map_or(seg.base, |e| e.offset), ids);
        // An entry from an unsynced index (damaged from outside) may count too few ids
        // before it, and the rebuild would start after ids of its window: it must be
        // followed by as many as it says, or the whole segment is read.
        if visited.is_ok()
            && let Some(e) = start
            && (ids.len() - had) as u64 != total.saturating_sub(e.ids_before)
        {
            tracing::warn!(segment = %seg.path.display(), offset = e.offset,
                "index entry counts the message ids before it wrong; reading the whole segment");
            let first_pass = ids.split_off(had);
            visited = ids_from(seg.base, ids);
            if visited.is_err() {
                // Damaged records before the entry: what the first pass read after them is
                // all there is to have.
                ids.truncate(had);
                ids.extend(first_pass);
            }
        }
        self.sweep();
        visited
    }
}

/// What one segment gave a read.
enum Part {
    Read,
    Nothing,
    /// Deleted by retention since it was looked up.
    Gone,
}

#[cfg(test)]
mod explore;
#[cfg(test)]
mod kill_points;

#[cfg(test)]
mod tests {
    use super::*;

    fn append(log: &mut TopicLog, n: usize) {
        let headers = Headers::new();
        for _ in 0..n {
            let m = Append {
                payload: &[7u8; 200],
                headers: &headers,
                headers_len: record::headers_len(&headers),
            };
            log.append(&[m], 0).expect("append");
        }
    }

    /// `Sync=Always`'s layout: zeros ahead, sealed inline.
    fn always_cfg() -> LogConfig {
        LogConfig {
            segment_bytes: 64 * 1024,
            index_interval_bytes: 4096,
            max_body: 1 << 16,
            preallocate: true,
            visible_when_synced: true,
            seal_in_background: false,
        }
    }

    /// The kept files' names, inodes and lengths.
    fn recycled_in(dir: &Path) -> Vec<(String, u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        let mut v: Vec<(String, u64, u64)> = std::fs::read_dir(dir)
            .expect("dir")
            .map(|e| e.expect("entry"))
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .ends_with(segment::RECYCLED_SUFFIX)
            })
            .map(|e| {
                let m = e.metadata().expect("meta");
                (
                    e.file_name().to_string_lossy().into_owned(),
                    m.ino(),
                    m.len(),
                )
            })
            .collect();
        v.sort();
        v
    }

    fn ino(path: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).expect("meta").ino()
    }

    /// Every record from `from` on is there once, in order, up to `next`.
    fn assert_dense(log: &TopicLog, from: u64) {
        // Under `visible_when_synced` readers see the last records once synced.
        log.active().sync().expect("sync");
        let recs = log
            .reader()
            .read(from, usize::MAX, usize::MAX)
            .expect("read");
        assert_eq!(recs.len() as u64, log.next() - from);
        for (r, want) in recs.iter().zip(from..) {
            assert_eq!(r.offset, want);
            assert_eq!(&r.payload[..], &[7u8; 200][..]);
        }
    }

    /// Under `Sync=Always` retention keeps deleted segment files (at most `MAX_RECYCLED`)
    /// and the next rolls overwrite them instead of zeroing new files ahead; the old
    /// records behind the new ones are never read, also not after a reopen, which trims
    /// them off the active segment.
    #[test]
    fn retention_under_always_keeps_deleted_files_for_the_next_rolls() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut log = TopicLog::open(&Fs::real(), tmp.path(), always_cfg(), 0).expect("open");
        assert!(append_until_segments(&mut log, 5));
        let old: Vec<PathBuf> = log.reader().snapshot()[..3]
            .iter()
            .map(|s| s.path.clone())
            .collect();
        let inodes: Vec<u64> = old.iter().map(|p| ino(p)).collect();
        assert_eq!(log.apply_retention(0, 1, 0).expect("retention"), 4);
        let kept = recycled_in(tmp.path());
        assert_eq!(kept.len(), MAX_RECYCLED, "{kept:?}");
        assert!(
            kept.iter().all(|k| inodes[..2].contains(&k.1)),
            "the oldest two kept"
        );
        assert!(old.iter().all(|p| !p.exists()), "no longer segments");
        let earliest = log.reader().earliest();
        // The next two rolls take the kept files (newest name first), a third creates one.
        for (round, want) in [Some(&kept[1]), Some(&kept[0]), None]
            .into_iter()
            .enumerate()
        {
            let before = log.reader().snapshot().len();
            assert!(append_until_segments(&mut log, before + 1));
            let active = log.active().path.clone();
            let behind = std::fs::read(&active).expect("read")
                [log.active().written().bytes as usize..]
                .iter()
                .any(|&b| b != 0);
            match want {
                Some((_, i, len)) => {
                    assert_eq!(ino(&active), *i, "round {round}: reused");
                    assert_eq!(log.allocated, *len, "round {round}: no zeros ahead");
                    assert!(behind, "round {round}: old records behind the new ones");
                }
                None => assert!(!behind, "round {round}: a new file, zeros ahead"),
            }
            assert_eq!(recycled_in(tmp.path()).len(), 1 - round.min(1));
            assert_dense(&log, earliest);
        }
        // A few records into a reused file, then killed (no close) and opened again.
        assert_eq!(log.apply_retention(0, 1, 0).expect("retention"), 3);
        let before = log.reader().snapshot().len();
        assert!(append_until_segments(&mut log, before + 1));
        append(&mut log, 3);
        let (next, earliest) = (log.next(), log.reader().earliest());
        let active = log.active().path.clone();
        assert!(
            std::fs::metadata(&active).expect("meta").len() > 16 * 1024,
            "old records behind"
        );
        std::mem::forget(log);
        let log = TopicLog::open(&Fs::real(), tmp.path(), always_cfg(), 0).expect("reopen");
        assert_eq!(log.next(), next);
        assert_dense(&log, earliest);
        assert_eq!(
            log.active().end(),
            std::fs::metadata(&active).expect("meta").len(),
            "trimmed"
        );
        assert_eq!(
            recycled_in(tmp.path()).len(),
            MAX_RECYCLED - 1,
            "kept across the reopen"
        );
        drop(log);
        // Opened under a policy that writes no zeros ahead: the kept files go.
        let mut cfg = always_cfg();
        cfg.preallocate = false;
        let log = TopicLog::open(&Fs::real(), tmp.path(), cfg, 0).expect("reopen");
        assert!(recycled_in(tmp.path()).is_empty());
        assert_eq!(log.next(), next);
    }

    /// A power cut between retention's rename of a segment to a kept file and its
    /// directory sync can keep both names on a file system whose renames are not atomic
    /// across crashes (`SimFs`): open drops the kept name, so no roll overwrites a segment.
    #[test]
    fn a_kept_file_that_is_still_a_segment_after_a_power_cut_is_not_reused() {
        use crate::io::sim::SimFs;
        let mut cfg = sim_cfg();
        cfg.preallocate = true;
        cfg.seal_in_background = false;
        let mut both = 0;
        for seed in 1..=40 {
            let fs = SimFs::new(seed);
            let dir = Path::new("/t");
            let mut log =
                TopicLog::open(&Fs::new(Arc::new(fs.clone())), dir, cfg, 0).expect("open");
            assert!(append_until_segments(&mut log, 3));
            log.sync().expect("sync");
            let first = log.reader().snapshot()[0].path.clone();
            let mut kept = first.clone().into_os_string();
            kept.push(segment::RECYCLED_SUFFIX);
            // Just before the first deletion's index removal: after its rename.
            fs.cut_at_op(fs.ops() + 2);
            assert_eq!(log.apply_retention(0, 1, 0).expect("retention"), 2);
            drop(log);
            let image = fs.crash_image().expect("cut");
            if image.read_file(&first).is_none() || image.read_file(Path::new(&kept)).is_none() {
                continue;
            }
            both += 1;
            let mut log =
                TopicLog::open(&Fs::new(Arc::new(image.clone())), dir, cfg, 0).expect("reopen");
            assert!(log.recycled.is_empty(), "seed {seed}: {:?}", log.recycled);
            let earliest = log.reader().earliest();
            assert_eq!(earliest, 0, "seed {seed}: the first segment is back");
            let before = log.reader().snapshot().len();
            assert!(append_until_segments(&mut log, before + 2));
            assert_dense(&log, earliest);
        }
        assert!(both >= 3, "only {both} seeds kept both names");
    }

    /// Appends `payloads` as one batch (no headers); the first one's offset.
    pub(super) fn append_all(log: &mut TopicLog, payloads: &[Vec<u8>]) -> u64 {
        let headers = Headers::new();
        log.append(&batch_of(payloads, &headers), 0)
            .expect("append")
    }

    /// One `Append` per payload, all with `headers`.
    fn batch_of<'a>(payloads: &'a [Vec<u8>], headers: &'a Headers) -> Vec<Append<'a>> {
        payloads
            .iter()
            .map(|p| Append {
                payload: p,
                headers,
                headers_len: record::headers_len(headers),
            })
            .collect()
    }

    pub(super) fn append_one(log: &mut TopicLog, payload: &[u8]) -> u64 {
        let headers = Headers::new();
        let m = Append {
            payload,
            headers: &headers,
            headers_len: record::headers_len(&headers),
        };
        log.append(&[m], 0).expect("append")
    }

    /// A record over `max_body` would be written and then taken for damage by every read
    /// and by recovery: the whole batch is refused before any of it is written.
    #[test]
    fn a_record_over_the_ceiling_is_refused_and_nothing_of_its_batch_is_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = always_cfg();
        let mut log = TopicLog::open(&Fs::real(), dir.path(), cfg, 0).expect("open");
        append_one(&mut log, b"before");
        let headers = Headers::new();
        let payloads = [vec![1u8; 10], vec![2u8; cfg.max_body]];
        let err = log
            .append(&batch_of(&payloads, &headers), 0)
            .expect_err("over the ceiling");
        assert!(matches!(err, Error::MessageTooLarge { .. }), "{err:?}");
        assert_eq!(log.next(), 1, "nothing of the batch appended");
        assert_eq!(append_one(&mut log, b"after"), 1);
        drop(log);
        let log = TopicLog::open(&Fs::real(), dir.path(), cfg, 0).expect("reopen");
        let read = log.reader().read(0, 10, usize::MAX).expect("read");
        let payloads: Vec<&[u8]> = read.iter().map(|r| &r.payload()[..]).collect();
        assert_eq!(payloads, [&b"before"[..], &b"after"[..]]);
    }

    /// Held records (`append_held`) have their offsets and count in `next`/`end`, but
    /// nothing reaches the file until `write_held` (or an append that is not held, or
    /// `sync`), nor a reader until a sync covers it (`visible_when_synced`); a batch of
    /// `HOLD_MAX_BYTES` or more is written at once.
    #[test]
    fn held_records_are_invisible_until_written_and_a_big_batch_is_not_held() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = LogConfig {
            segment_bytes: 4 * HOLD_MAX_BYTES as u64,
            ..always_cfg()
        };
        let mut log = TopicLog::open(&Fs::real(), dir.path(), cfg, 0).expect("open");
        let headers = Headers::new();
        let small = [b"a".to_vec(), b"b".to_vec()];
        assert_eq!(
            log.append_held(&batch_of(&small, &headers), 0)
                .expect("append held"),
            0
        );
        assert_eq!(
            log.append_held(&batch_of(&small[..1], &headers), 0)
                .expect("append held"),
            2
        );
        assert!(log.holds());
        assert_eq!(log.next(), 3, "held records have their offsets");
        assert!(
            log.end() > log.active().end(),
            "and their place in the segment"
        );
        assert_eq!(log.reader().next(), 0, "readers see none of them");
        assert_eq!(
            log.active().end(),
            SEGMENT_HEADER_LEN as u64,
            "nothing written"
        );
        log.write_held().expect("write held");
        assert!(!log.holds());
        assert_eq!(log.end(), log.active().written().bytes);
        assert_eq!(log.written_next(), 3);
        // `visible_when_synced`: written is not enough.
        assert_eq!(log.reader().next(), 0, "readers see them once synced");
        assert_eq!(log.reader().read(0, 10, usize::MAX).expect("read").len(), 0);
        log.active().sync().expect("sync");
        assert_eq!(log.reader().next(), 3);
        assert_eq!(log.active().end(), log.end());
        let read = log.reader().read(0, 10, usize::MAX).expect("read");
        let got: Vec<&[u8]> = read.iter().map(|r| &r.payload()[..]).collect();
        assert_eq!(got, [&b"a"[..], &b"b"[..], &b"a"[..]]);

        log.append_held(&batch_of(&small, &headers), 0)
            .expect("append held");
        log.sync().expect("sync writes what is held");
        assert_eq!(log.reader().next(), 5);
        assert!(log.active().is_synced_to(log.end()));

        let big = vec![vec![7u8; 32 << 10]; HOLD_MAX_BYTES / (32 << 10)];
        assert_eq!(
            log.append_held(&batch_of(&big, &headers), 0)
                .expect("append held"),
            5
        );
        assert!(
            !log.holds(),
            "a batch of HOLD_MAX_BYTES is written by its caller"
        );
        assert_eq!(log.written_next(), 5 + big.len() as u64);
        assert_eq!(log.reader().next(), 5);
        log.active().sync().expect("sync");
        assert_eq!(log.reader().next(), 5 + big.len() as u64);
    }

    /// The offset of the record an old payload forges in `ending_at_a_forged_frame`.
    const FORGED: u64 = 13;

    /// A log in `dir` (`Always`'s layout, records up to 64 KiB) whose active segment is
    /// segment 0's file reused, its new records ending exactly where an old payload holds
    /// a valid frame numbered as the next record (`FORGED`), at the start of the file's
    /// sixth page (returned).
    fn ending_at_a_forged_frame(fs: &Fs, dir: &Path) -> (TopicLog, u64) {
        let cfg = LogConfig {
            max_body: 1 << 17,
            ..always_cfg()
        };
        let mut forged = Vec::new();
        record::encode(
            &mut forged,
            FORGED,
            0,
            &Headers::new(),
            b"FORGED: never appended",
        );
        let mut p0 = vec![b'x'; 40_000];
        let at = 5 * 4096 - SEGMENT_HEADER_LEN - record::RECORD_OVERHEAD - 1;
        p0[at..at + forged.len()].copy_from_slice(&forged);
        let mut log = TopicLog::open(fs, dir, cfg, 0).expect("open");
        assert_eq!(append_one(&mut log, &p0), 0);
        let old = log
            .active()
            .with_file(|f| f.read_all(u64::MAX))
            .expect("read")
            .expect("all");
        let pf = old
            .windows(forged.len())
            .position(|w| w == &forged[..])
            .expect("frame in file");
        assert_eq!(pf, 5 * 4096, "a page boundary");
        assert_eq!(
            append_one(&mut log, &[1u8; 30_000]),
            1,
            "rolls to segment 1"
        );
        assert_eq!(log.apply_retention(0, 1, 0).expect("retention"), 1);
        assert_eq!(log.recycled.len(), 1, "segment 0's file kept");
        assert_eq!(append_one(&mut log, &[2u8; 30_000]), 2);
        // Offset 3 rolls into the kept file; offsets 3..FORGED end exactly at the frame.
        let (small, overhead) = (1000usize, record::RECORD_OVERHEAD + 1);
        let first_len =
            pf - SEGMENT_HEADER_LEN - (FORGED as usize - 4) * (overhead + small) - overhead;
        assert_eq!(append_one(&mut log, &vec![3u8; first_len]), 3);
        assert!(log.recycled.is_empty(), "the roll reused it");
        for _ in 4..FORGED {
            append_one(&mut log, &[4u8; 1000]);
        }
        assert_eq!(log.next(), FORGED);
        assert_eq!(log.active().written().bytes as usize, pf);
        (log, pf as u64)
    }

    /// The bytes behind the records of a reused file are old payloads, which publishers
    /// chose: a frame inside one, numbered as the next record and lying exactly where the
    /// new records end, must not be taken for a record at the next open (zeros are written
    /// ahead of the records into a reused file). Found by review.
    #[test]
    fn a_frame_inside_an_old_payload_is_not_taken_for_a_record_after_a_reopen() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (log, _) = ending_at_a_forged_frame(&Fs::real(), tmp.path());
        let cfg = log.cfg;
        // Killed: nothing trims the active file.
        std::mem::forget(log);
        let mut log = TopicLog::open(&Fs::real(), tmp.path(), cfg, 0).expect("reopen");
        assert_eq!(log.next(), FORGED, "no record nobody appended");
        assert_eq!(append_one(&mut log, &[5u8; 10]), FORGED);
        log.active().sync().expect("sync");
        let last = log.reader().read(FORGED, 1, usize::MAX).expect("read");
        assert_eq!(&last[0].payload[..], &[5u8; 10][..]);
    }

    /// As above, with the process killed inside the write of the last records, after
    /// they were copied but before what was meant to follow them (the kernel copies a write
    /// page by page and stops at a fatal signal): the zeros are written before the records,
    /// so what a cut-short write leaves behind them is zeros, never old bytes. Found by
    /// review.
    #[test]
    fn a_kill_inside_a_write_into_a_reused_file_leaves_no_old_frame_behind_the_records() {
        use crate::io::sim::SimFs;
        let sim = SimFs::new(1);
        let dir = Path::new("/t");
        let (log, pf) = ending_at_a_forged_frame(&Fs::new(Arc::new(sim.clone())), dir);
        let (path, cfg) = (log.active().path.clone(), log.cfg);
        let killed = sim.process_crash_in_last_write(&path, pf);
        drop(log);
        let log = TopicLog::open(&Fs::new(Arc::new(killed)), dir, cfg, 0).expect("reopen");
        assert_eq!(log.next(), FORGED, "no record nobody appended");
    }

    /// A roll whose new segment's index file cannot be opened stops the topic: the
    /// segment file exists already, and records appended to the sealed one instead would
    /// overlap its base (open: "gap in the log"). Found by review.
    #[test]
    fn a_roll_that_cannot_open_the_new_index_poisons_the_topic() {
        use crate::io::sim::SimFs;
        let sim = SimFs::new(3);
        let fs = Fs::new(Arc::new(sim.clone()));
        let dir = Path::new("/t");
        let mut cfg = sim_cfg();
        cfg.seal_in_background = false;
        let mut log = TopicLog::open(&fs, dir, cfg, 0).expect("open");
        let failed = loop {
            // Fails only if this append rolls (its record starts the next segment).
            sim.fail_writes_to(Some(&dir.join(segment::index_file_name(log.next()))));
            let before = log.next();
            if let Err(e) = log.append(
                &[Append {
                    payload: &[7u8; 200],
                    headers: &Headers::new(),
                    headers_len: record::headers_len(&Headers::new()),
                }],
                0,
            ) {
                break (before, e);
            }
        };
        sim.fail_writes_to(None);
        assert!(matches!(failed.1, Error::Io { .. }), "{:?}", failed.1);
        let more = log.append(
            &[Append {
                payload: &[7u8; 10],
                headers: &Headers::new(),
                headers_len: record::headers_len(&Headers::new()),
            }],
            0,
        );
        assert!(matches!(more, Err(Error::Poisoned { .. })), "{more:?}");
        let killed = sim.process_crash_now();
        drop(log);
        let log = TopicLog::open(&Fs::new(Arc::new(killed)), dir, cfg, 0).expect("reopen");
        assert_eq!(log.next(), failed.0);
        assert_dense(&log, 0);
    }

    /// A sealing whose sync succeeds after another sync of the topic failed does not seal:
    /// a poisoned topic vouches for nothing more (a false failure is safe), and a sealed
    /// index would vouch for records a power cut may lose. Found by review. (The same
    /// file's error taken by a sync beside this one: the next test.)
    #[test]
    fn a_sealing_whose_sync_ends_after_the_topic_is_poisoned_does_not_seal() {
        let (sim, mut log) = rolled_once(2);
        let b = log.reader().snapshot()[1].clone();
        let release = sim.faults_cleared_on_drop();
        // B's sealing stops inside its sync (past any check made before it).
        sim.hold_syncs_of(Some(&b.path));
        assert!(append_until_segments(&mut log, 3));
        wait_for("B's sealing inside its sync", || sim.syncs_waiting() == 1);
        // Records in C, then C's sync (as the sync thread's) fails.
        let c = log.active().clone();
        append(&mut log, 1);
        sim.fail_syncs_of(Some(&c.path));
        assert!(c.sync().is_err(), "C's sync fails");
        drop(release);
        let sealed = log.finish_sealing();
        assert!(matches!(sealed, Err(Error::Poisoned { .. })), "{sealed:?}");
        assert!(
            !b.is_sealed(),
            "B is checked record by record at the next open"
        );
    }

    /// Two syncs of one segment at once, the first failing: Linux reports a writeback
    /// error to one `fsync` only, so the second may return success for pages the first
    /// one's failure dropped. The second waits for the first and its poison, and claims
    /// nothing. Found by review (a roll's sealing beside the sync thread's sync).
    #[test]
    fn a_sync_beside_a_failing_one_waits_for_it_and_claims_nothing() {
        let (sim, mut log) = rolled_once(4);
        append(&mut log, 1);
        let b = log.active().clone();
        let end = b.end();
        sim.hold_syncs_of(Some(&b.path));
        sim.fail_one_sync_of(&b.path);
        let first = {
            let b = b.clone();
            std::thread::spawn(move || b.sync())
        };
        wait_for("the first sync inside its fsync", || {
            sim.syncs_waiting() == 1
        });
        let second = {
            let b = b.clone();
            std::thread::spawn(move || b.sync_after_resize())
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        let in_fsync = sim.syncs_waiting();
        sim.hold_syncs_of(None);
        assert_eq!(in_fsync, 1, "the second sync waits outside the fsync");
        let first = first.join().expect("first");
        assert!(matches!(first, Err(Error::Io { .. })), "{first:?}");
        let second = second.join().expect("second");
        assert!(matches!(second, Err(Error::Poisoned { .. })), "{second:?}");
        assert!(!b.is_synced_to(end), "nothing vouched for");
    }

    /// Closing joins every sealing, not only up to the first that failed (once the topic
    /// is poisoned, all those still running fail): nothing may write in the directory
    /// after the log let it go. Found by review.
    #[test]
    fn quiesce_waits_for_every_sealing_after_one_failed() {
        let (fs, mut log) = rolled_once(9);
        let b = log.active().clone();
        let release = fs.faults_cleared_on_drop();
        // B's sealing waits inside B's sync; C's is done but not joined yet.
        fs.hold_syncs_of(Some(&b.path));
        assert!(append_until_segments(&mut log, 4));
        assert_eq!(log.sealing.len(), 2, "B's and C's sealings not joined");
        let active = log.active().path.clone();
        fs.fail_writes_to(Some(&active));
        let headers = Headers::new();
        let m = Append {
            payload: &[7u8; 10],
            headers: &headers,
            headers_len: record::headers_len(&headers),
        };
        assert!(log.append(&[m], 0).is_err(), "the write fails");
        fs.fail_writes_to(None);
        assert!(log.active().poisoned().is_some(), "a failed write poisons");
        drop(release);
        assert!(log.quiesce().is_err(), "B's sealing fails");
        assert!(log.sealing.is_empty(), "every sealing joined");
    }

    /// Kept files are used only below the log's first segment, where retention leaves
    /// them: a log whose segments were deleted by hand starts again at offset 0, and the
    /// old records in a kept file would then carry the offsets of new ones (here a
    /// process killed between a roll into one and the roll's first write: open would take
    /// the old records for new).
    #[test]
    fn kept_files_of_a_log_deleted_by_hand_are_removed() {
        use crate::io::sim::SimFs;
        let mut cfg = sim_cfg();
        cfg.preallocate = true;
        cfg.seal_in_background = false;
        let sim = SimFs::new(1);
        let fs = Fs::new(Arc::new(sim.clone()));
        let dir = Path::new("/t");
        let mut log = TopicLog::open(&fs, dir, cfg, 0).expect("open");
        assert!(append_until_segments(&mut log, 3));
        let second = log.reader().snapshot()[1].base;
        assert_eq!(log.apply_retention(0, 1, 0).expect("retention"), 2);
        assert_eq!(log.recycled.len(), 2);
        drop(log);
        for name in fs.list_dir(dir).expect("list") {
            if name.ends_with(".log") || name.ends_with(".idx") {
                fs.remove_file(&dir.join(name)).expect("rm");
            }
        }
        let mut log = TopicLog::open(&fs, dir, cfg, 0).expect("reopen");
        assert!(log.recycled.is_empty(), "{:?}", log.recycled);
        // The same records again: the roll to `second` would take its old file.
        sim.fail_writes_to(Some(&dir.join(segment::segment_file_name(second))));
        assert!(!append_until_segments(&mut log, 3));
        let killed = sim.process_crash_now();
        drop(log);
        let log = TopicLog::open(&Fs::new(Arc::new(killed)), dir, cfg, 0).expect("reopen");
        assert_eq!(log.next(), second);
        assert_dense(&log, 0);
    }

    /// A segment a reader still holds is deleted, not kept: its open descriptor would
    /// read the new records in place of the old ones.
    #[test]
    fn retention_does_not_keep_a_file_a_reader_holds() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut log = TopicLog::open(&Fs::real(), tmp.path(), always_cfg(), 0).expect("open");
        assert!(append_until_segments(&mut log, 3));
        let held = log.reader().snapshot();
        assert_eq!(log.apply_retention(0, 1, 0).expect("retention"), 2);
        assert!(recycled_in(tmp.path()).is_empty());
        drop(held);
        assert!(append_until_segments(&mut log, 3));
        assert_eq!(log.apply_retention(0, 1, 0).expect("retention"), 2);
        assert_eq!(recycled_in(tmp.path()).len(), 2);
    }

    /// Other policies keep no file: nothing is zeroed ahead there.
    #[test]
    fn retention_without_zeros_ahead_keeps_no_file() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut cfg = always_cfg();
        cfg.preallocate = false;
        let mut log = TopicLog::open(&Fs::real(), tmp.path(), cfg, 0).expect("open");
        assert!(append_until_segments(&mut log, 3));
        assert_eq!(log.apply_retention(0, 1, 0).expect("retention"), 2);
        assert!(recycled_in(tmp.path()).is_empty());
    }

    /// A log of `n` records in `dir`, opened again: its sealed segments come from disk
    /// (files closed, indexes unloaded) as after a restart.
    fn reopened_log_in(dir: &Path, n: usize) -> TopicLog {
        let mut log = log_in(dir);
        append(&mut log, n);
        drop(log);
        log_in(dir)
    }

    fn log_in(dir: &Path) -> TopicLog {
        let cfg = LogConfig {
            segment_bytes: 1024,
            index_interval_bytes: 4096,
            max_body: 1 << 16,
            preallocate: false,
            visible_when_synced: false,
            seal_in_background: false,
        };
        TopicLog::open(&Fs::real(), dir, cfg, 0).expect("open")
    }

    /// Reads that continue where the last one stopped start from the bytes it had read
    /// past that point: with records of every size (some larger than a read chunk), pages
    /// of every size, and appends between the reads, every record comes back whole, in
    /// order, exactly once.
    #[test]
    fn reads_continuing_from_the_last_one_return_every_record_once() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let cfg = LogConfig {
            segment_bytes: 8 << 20,
            index_interval_bytes: 4096,
            max_body: 1 << 20,
            preallocate: false,
            visible_when_synced: false,
            seal_in_background: false,
        };
        let mut log = TopicLog::open(&Fs::real(), tmp.path(), cfg, 0).expect("open");
        let headers = Headers::new();
        let size = |i: u64| match i % 7 {
            0 => 90_000,
            1 | 4 => 3,
            _ => (i as usize * 37) % 2000,
        };
        let append = |log: &mut TopicLog, appended: &mut u64, n: u64| {
            for _ in 0..n {
                let payload = vec![(*appended % 251) as u8; size(*appended)];
                let m = Append {
                    payload: &payload,
                    headers: &headers,
                    headers_len: record::headers_len(&headers),
                };
                log.append(&[m], 0).expect("append");
                *appended += 1;
            }
        };
        let mut appended = 0u64;
        append(&mut log, &mut appended, 300);
        let reader = log.reader().clone();
        for (page, max_bytes) in [(1usize, 1 << 20), (3, 1 << 20), (7, 5000), (1000, 200_000)] {
            let mut at = 0;
            let mut round = 0;
            while at < appended {
                let got = reader.read(at, page, max_bytes).expect("read");
                assert!(!got.is_empty() && got.len() <= page, "page {page} at {at}");
                for r in &got {
                    assert_eq!(r.offset, at, "page {page}");
                    assert_eq!(r.payload.len(), size(at), "page {page} offset {at}");
                    assert!(r.payload.iter().all(|&b| b == (at % 251) as u8));
                    at += 1;
                }
                round += 1;
                if round % 5 == 0 && appended < 2000 {
                    append(&mut log, &mut appended, 11);
                }
            }
        }
    }

    /// A time lookup racing retention (its snapshot still lists a segment retention then
    /// deleted, with its file closed) looks again in what is left instead of failing.
    #[test]
    fn a_time_lookup_racing_retention_looks_again() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut log = reopened_log_in(tmp.path(), 40);
        let reader = log.reader().clone();
        let snapshot = reader.snapshot();
        assert!(log.apply_retention(0, 1, 0).expect("retention") > 0);
        assert!(
            snapshot[0].offset_for_time(0, 4096).is_err(),
            "its file is gone"
        );
        assert_eq!(
            reader.offset_for_time_in(&snapshot, 0).expect("lookup"),
            None
        );
        assert_eq!(
            reader.offset_for_time(0).expect("lookup"),
            reader.earliest()
        );
    }

    /// Readers on four threads (random pages, byte limits and jumps) while the writer
    /// appends records of every size and retention deletes segments: every batch is whole
    /// records, in order, without a gap (found by review: a batch could skip offsets that
    /// retention deleted between two of its segments).
    #[test]
    fn concurrent_readers_racing_retention_never_get_a_gap_in_a_batch() {
        for seal_in_background in [false, true] {
            readers_racing_retention(seal_in_background);
        }
    }

    fn readers_racing_retention(seal_in_background: bool) {
        use std::sync::atomic::AtomicBool;
        const TOTAL: u64 = 12_000;
        let size = |i: u64| match i % 11 {
            0 => 70_000,
            1 | 4 => 9,
            2 => 9_000,
            _ => ((i as usize).wrapping_mul(2_654_435_761) >> 7) % 3000 + 8,
        };
        let tmp = tempfile::tempdir().expect("tempdir");
        let cfg = LogConfig {
            segment_bytes: 300_000,
            index_interval_bytes: 4096,
            max_body: 1 << 20,
            // `Sync=None`'s layout, or `Always`'s (zeros ahead, retention's files reused).
            preallocate: !seal_in_background,
            visible_when_synced: false,
            seal_in_background,
        };
        let mut log = TopicLog::open(&Fs::real(), tmp.path(), cfg, 0).expect("open");
        let done = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..4u64)
            .map(|t| {
                let (reader, done) = (log.reader().clone(), done.clone());
                std::thread::spawn(move || {
                    let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ (t * 7919 + 1);
                    let mut rnd = move || {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        seed
                    };
                    let mut at = 0u64;
                    while !(done.load(Ordering::Acquire) && at >= TOTAL) {
                        let page = [1usize, 3, 17, 1024][(rnd() % 4) as usize];
                        let bytes = [1usize, 5000, 64 << 10, 1 << 20][(rnd() % 4) as usize];
                        let jump = rnd() % 13 == 0;
                        let from = if jump {
                            rnd() % reader.next().max(1)
                        } else {
                            at
                        };
                        let got = reader.read(from, page, bytes).expect("read");
                        assert!(got.len() <= page);
                        let mut o = got.first().map_or(from, |r| r.offset);
                        assert!(o == from || from < reader.earliest(), "{from} -> {o}");
                        for r in &got {
                            assert_eq!(r.offset, o, "gap inside a batch read from {from}");
                            assert_eq!(r.payload.len(), size(o));
                            assert!(r.payload.iter().all(|&b| b == (o % 251) as u8));
                            o += 1;
                        }
                        if !jump {
                            at = o.max(reader.earliest());
                        }
                    }
                })
            })
            .collect();
        let mut i = 0u64;
        while i < TOTAL {
            let n = (i % 5 + 1).min(TOTAL - i);
            let payloads: Vec<Vec<u8>> =
                (i..i + n).map(|k| vec![(k % 251) as u8; size(k)]).collect();
            append_all(&mut log, &payloads);
            i += n;
            if i % 200 < 5 {
                log.apply_retention(0, 2_000_000, 0).expect("retention");
            }
        }
        done.store(true, Ordering::Release);
        for r in readers {
            r.join().expect("reader");
        }
    }

    /// A sealed file cut shorter than its records after open (it is opened again by name
    /// when needed, its length not checked again) fails the read instead of spinning on
    /// the same short chunk (found by review).
    #[test]
    fn a_sealed_file_cut_after_open_fails_the_read() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let log = reopened_log_in(tmp.path(), 40);
        let first = tmp.path().join(segment::segment_file_name(0));
        let len = std::fs::metadata(&first).expect("meta").len();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&first)
            .expect("open file");
        f.set_len(len - 100).expect("cut");
        let reader = log.reader().clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(reader.read(0, 1000, 1 << 30).map(|v| v.len()));
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the read returns");
        assert!(matches!(got, Err(Error::Corrupt { .. })), "{got:?}");
    }

    fn summary(base: u64) -> SegmentSummary {
        SegmentSummary {
            base,
            next: base + 3,
            bytes: 500,
            first_ts: 7,
            last_ts: 9,
            id_count: 1,
        }
    }

    /// The sealed-summaries cache: an append after a torn last entry writes over it,
    /// damaged entries are skipped, and an entry is believed only for the data file it was
    /// written for (the same length and identity: not for a file made anew).
    #[test]
    fn summary_entries_hold_only_for_their_own_file() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let fs = Fs::real();
        let data = tmp.path().join("data.log");
        std::fs::write(&data, [1u8; 500]).expect("data");
        let sums = Summaries::new(tmp.path());
        sums.append(&fs, &summary(0), &data);
        let mut b = std::fs::read(&sums.path).expect("read");
        b.extend_from_slice(&[0xAB; 30]);
        std::fs::write(&sums.path, &b).expect("write");
        sums.append(&fs, &summary(3), &data);
        let len = SUMMARY_LEN as u64;
        assert_eq!(std::fs::metadata(&sums.path).expect("meta").len(), 2 * len);
        let stat = fs.file_stat(&data).expect("stat");
        let got = sums.read(&fs);
        assert_eq!(got[&0].for_file(&stat), Some(summary(0)));
        assert_eq!(got[&3].for_file(&stat), Some(summary(3)));
        // The same path and length, made anew: another file.
        std::fs::remove_file(&data).expect("rm");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let hold = tmp.path().join("hold");
        std::fs::write(&hold, b"keeps the old inode number from coming back").expect("hold");
        std::fs::write(&data, [2u8; 500]).expect("data again");
        let again = fs.file_stat(&data).expect("stat");
        assert_eq!(again.len, 500);
        assert_eq!(
            got[&0].for_file(&again),
            None,
            "an older incarnation's entry"
        );
        let mut b = std::fs::read(&sums.path).expect("read");
        b[SUMMARY_LEN + 20] ^= 1;
        std::fs::write(&sums.path, &b).expect("write");
        let got = sums.read(&fs);
        assert_eq!((got.len(), got.contains_key(&0)), (1, true));
    }

    /// A log of 40 records in several segments, and its first segment as a reader holds it.
    fn log_and_first_segment(dir: &Path) -> (TopicLog, Arc<Segment>) {
        let mut log = log_in(dir);
        append(&mut log, 40);
        let mut at = 0;
        let first = log.reader().segment_with(&mut at).expect("first segment");
        (log, first)
    }

    /// A reader that looked a segment up just before retention deleted it (its file closed
    /// by then) goes on from the log's new start instead of failing.
    #[test]
    fn a_read_racing_retention_goes_on_from_the_new_start() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (mut log, first) = log_and_first_segment(tmp.path());
        let reader = log.reader().clone();
        first.close_file();
        let removed = log.apply_retention(0, 1, 0).expect("retention");
        assert!(removed > 0 && first.is_removed());
        let mut out = Vec::new();
        assert!(
            first.read(0, 10, 1 << 20, 4096, &mut out).is_err(),
            "its file is gone"
        );
        let part = reader.read_part(&first, 0, 10, 1 << 20, &mut out);
        assert!(matches!(part, Ok(Part::Gone)), "gone, not an error");
        let rest = reader.read(0, 1000, 1 << 20).expect("read");
        assert_eq!(rest[0].offset, reader.earliest());
        assert_eq!(rest.last().map(|r| r.offset), Some(39));
    }

    /// A reader still holding a segment retention deleted, its index unloaded, reads on
    /// through its open file and leaves no index file behind for the deleted segment.
    #[test]
    fn a_read_of_a_deleted_segment_writes_no_index_for_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (mut log, first) = log_and_first_segment(tmp.path());
        assert!(first.is_sealed());
        let mut out = Vec::new();
        first
            .read(first.base, 1, 1 << 20, 4096, &mut out)
            .expect("a read opens its file");
        let removed = log.apply_retention(0, 1, 0).expect("retention");
        assert!(removed > 0 && first.is_removed());
        first.unload_index();
        out.clear();
        first
            .read(first.base + 3, 2, 1 << 20, 4096, &mut out)
            .expect("read through the open file");
        assert_eq!(out.first().map(|r| r.offset), Some(first.base + 3));
        assert!(
            !first.index_path.exists(),
            "a stray index for a deleted segment"
        );
    }

    /// However many segments a log has, a read through all of them leaves at most
    /// `OPEN_SEALED_MAX` sealed files open, and open opens none for good.
    #[test]
    fn sealed_files_are_opened_on_demand_and_few_stay_open() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut log = log_in(tmp.path());
        append(&mut log, 200);
        let open_sealed = |log: &TopicLog| {
            read_lock(&log.reader().segments)
                .iter()
                .filter(|s| s.open_file_used().is_some())
                .count()
        };
        assert!(
            open_sealed(&log) <= OPEN_SEALED_MAX,
            "closed as the writer rolls"
        );
        drop(log);
        let log = log_in(tmp.path());
        let segments = log.reader().stats().segments;
        assert!(segments > 4 * OPEN_SEALED_MAX, "{segments}");
        assert_eq!(open_sealed(&log), 0, "open keeps no sealed file open");
        let mut at = 0;
        while let Ok(batch) = log.reader().read(at, 3, 1 << 20) {
            let Some(last) = batch.last() else { break };
            assert_eq!(batch[0].offset, at);
            at = last.offset + 1;
            assert!(open_sealed(&log) <= OPEN_SEALED_MAX);
        }
        assert_eq!(at, 200);
        // One record read from the start of every segment leaves bytes read ahead in each;
        // closing a file lets them go too.
        for seg in log.reader().snapshot() {
            let got = log.reader().read(seg.base, 1, 1 << 20).expect("read");
            assert_eq!(got.len(), 1);
        }
        let holding = log
            .reader()
            .snapshot()
            .iter()
            .filter(|s| s.holds_read_ahead())
            .count();
        assert!(holding > 0 && holding <= OPEN_SEALED_MAX + 1, "{holding}");
    }

    /// Appends until the log has `segments` segments; `false` if an append failed first.
    fn append_until_segments(log: &mut TopicLog, segments: usize) -> bool {
        let headers = Headers::new();
        while log.reader().snapshot().len() < segments {
            let m = Append {
                payload: &[7u8; 200],
                headers: &headers,
                headers_len: record::headers_len(&headers),
            };
            if log.append(&[m], 0).is_err() {
                return false;
            }
        }
        true
    }

    fn wait_for(what: &str, done: impl Fn() -> bool) {
        let start = std::time::Instant::now();
        while !done() {
            assert!(start.elapsed().as_secs() < 30, "waited too long for {what}");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Sealing threads finish out of order: a killed process can leave segment B unsynced
    /// behind a sealed C. The reopened process then has one sealing (B's) pending, and
    /// rolling D and E must still wait for it: open after a power cut checks only the
    /// `MAX_SEALING` segments before the active one, so E beside an unsynced B is a gap
    /// it cannot repair (found as a rare `power_loss_none` failure: "gap in the log").
    #[test]
    fn a_roll_waits_for_an_older_sealing_a_killed_process_left_behind() {
        let (cfg, dir) = (sim_cfg(), Path::new("/t"));
        // B's sealing is slow: its sync of B is still in flight when the process is
        // killed, after C was sealed. (Held, not failed: a failure would poison the log
        // before the roll to D, depending on the threads' timing.)
        let (fs, mut log) = rolled_twice_with_syncs_held(3);
        let b = log.reader().snapshot()[1].path.clone();
        fs.hold_syncs_of(Some(&b));
        fs.hold_syncs(false);
        assert!(append_until_segments(&mut log, 4));
        let c = log.reader().snapshot()[2].clone();
        wait_for("C sealed", || c.is_sealed());
        let image = fs.process_crash_now();
        fs.hold_syncs_of(None);
        drop(log);

        // The same boot: B is found whole in the page cache and its sealing starts again,
        // slow again, then failing (nothing of B reaches the disk). The roll to E must
        // wait for it and get its error; rolling past it returns at once.
        image.hold_syncs_of(Some(&b));
        let mut log = TopicLog::open(&Fs::new(Arc::new(image.clone())), dir, cfg, 0)
            .expect("reopen in the same boot");
        let failing = image.clone();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            failing.fail_writes_to(Some(&b));
            failing.hold_syncs_of(None);
        });
        let rolled_past = append_until_segments(&mut log, 5);
        releaser.join().expect("releaser");
        assert!(
            !rolled_past,
            "the roll to E waited for B's sealing and got its error"
        );
        every_power_cut_opens(&image, 20, dir);
        drop(log);
    }

    /// A reopen in the same boot finds B's sealing interrupted and leaves it for after
    /// the caller's open (its syncs would slow the open's own): B is sealed once
    /// `resume_sealing` starts it, not before.
    #[test]
    fn an_interrupted_sealing_found_at_open_starts_at_resume_sealing() {
        let dir = Path::new("/t");
        let (fs, log) = rolled_twice_with_syncs_held(4);
        // B's sealing still syncs nothing when the process is killed.
        let b = log.reader().snapshot()[1].path.clone();
        fs.hold_syncs_of(Some(&b));
        fs.hold_syncs(false);
        let image = fs.process_crash_now();
        fs.hold_syncs_of(None);
        drop(log);
        image.hold_syncs_of(None);
        let mut log = TopicLog::open(&Fs::new(Arc::new(image)), dir, sim_cfg(), 0)
            .expect("reopen in the same boot");
        let b = log.reader().snapshot()[1].clone();
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!b.is_sealed(), "B's sealing waits for resume_sealing");
        log.resume_sealing();
        wait_for("B sealed", || b.is_sealed());
        log.quiesce().expect("quiesce");
    }

    pub(super) fn sim_cfg() -> LogConfig {
        LogConfig {
            segment_bytes: 1024,
            index_interval_bytes: 128,
            max_body: 1 << 16,
            preallocate: false,
            visible_when_synced: false,
            seal_in_background: true,
        }
    }

    /// A log in `/t` on `SimFs::new(seed)` (`sim_cfg`) rolled once, its first segment
    /// sealed.
    fn rolled_once(seed: u64) -> (crate::io::sim::SimFs, TopicLog) {
        let fs = crate::io::sim::SimFs::new(seed);
        let mut log = TopicLog::open(
            &Fs::new(Arc::new(fs.clone())),
            Path::new("/t"),
            sim_cfg(),
            0,
        )
        .expect("open");
        assert!(append_until_segments(&mut log, 2));
        log.finish_sealing().expect("the first segment sealed");
        (fs, log)
    }

    /// A log on `SimFs::new(seed)` (`sim_cfg`) rolled once, its first segment sealed, then
    /// rolled again from the ready spare file while every sync is held: that roll's
    /// sealing has synced nothing yet. The caller lets the syncs go (`hold_syncs(false)`).
    fn rolled_twice_with_syncs_held(seed: u64) -> (crate::io::sim::SimFs, TopicLog) {
        let (fs, mut log) = rolled_once(seed);
        wait_for_spare(&mut log);
        fs.hold_syncs(true);
        assert!(append_until_segments(&mut log, 3));
        (fs, log)
    }

    /// Reopens every power-cut image of `fs` (`cuts` of them) and checks it opens dense.
    fn every_power_cut_opens(fs: &crate::io::sim::SimFs, cuts: usize, dir: &Path) {
        for cut in 0..cuts {
            let after = fs.crash_now();
            let log = TopicLog::open(&Fs::new(Arc::new(after)), dir, sim_cfg(), 0)
                .unwrap_or_else(|e| panic!("power cut {cut}: reopen failed: {e}"));
            let records = log.reader().read(0, usize::MAX, usize::MAX).expect("read");
            assert_eq!(
                records.len() as u64,
                log.next() - log.reader().earliest(),
                "power cut {cut}: dense"
            );
        }
    }

    /// A process killed right after a roll from the spare file (the real header of C in
    /// the page cache only, B's sealing not run). The reopen in the same boot seals B
    /// (from its index entries in the background, or read whole and synced when it seals
    /// inline), and must make C's header durable before B's footer vouches for B:
    /// retention then deletes A and B, and after a power cut C is the only segment, with
    /// nothing before it to say its header never reached the disk (found by review: open
    /// failed with "header says base offset 0").
    #[test]
    fn a_segment_sealed_by_a_same_boot_reopen_has_its_successors_header_durable() {
        for seal_in_background in [true, false] {
            let (cfg, dir) = (sim_cfg(), Path::new("/t"));
            let (fs, log) = rolled_twice_with_syncs_held(5);
            let image = fs.process_crash_now();
            fs.hold_syncs(false);
            drop(log);

            let reopen = LogConfig {
                seal_in_background,
                ..cfg
            };
            let mut log = TopicLog::open(&Fs::new(Arc::new(image.clone())), dir, reopen, 0)
                .expect("reopen in the same boot");
            log.finish_sealing().expect("B sealed");
            assert_eq!(log.apply_retention(0, 1, 0).expect("retention"), 2);
            drop(log);
            every_power_cut_opens(&image, 20, dir);
        }
    }

    /// As above, one segment further: the reopen in the same boot seals A (`Known::Indexed`)
    /// without syncing B's header (made from the spare, real header in the page cache
    /// only). B's own sealing (its sync still in flight: held here with
    /// `SimFs::hold_syncs_of`) is the oldest the roll to D lets run, so B is the oldest segment
    /// of open's window after a cut: the pair (A, B) that would see B's SPARE header is not
    /// looked at, and `wholeness(B)` fails on B's header.
    #[test]
    fn the_oldest_segment_open_checks_never_has_a_spare_header_on_disk() {
        let (cfg, dir) = (sim_cfg(), Path::new("/t"));
        // Killed right after the roll to B (from the spare), before A's sealing ran.
        let (fs, log) = rolled_twice_with_syncs_held(7);
        let image = fs.process_crash_now();
        fs.hold_syncs(false);
        drop(log);

        // Same boot: A is sealed again (B's header is not synced by that).
        let mut log = TopicLog::open(&Fs::new(Arc::new(image.clone())), dir, cfg, 0)
            .expect("reopen in the same boot");
        log.finish_sealing().expect("A sealed");
        let b = log.reader().snapshot()[2].path.clone();
        // B's own sealing is slow (its sync still in flight at the power cut).
        image.hold_syncs_of(Some(&b));
        wait_for_spare(&mut log);
        assert!(append_until_segments(&mut log, 4), "rolled to C");
        wait_for_spare(&mut log);
        assert!(append_until_segments(&mut log, 5), "rolled to D");
        let c = log.reader().snapshot()[3].clone();
        wait_for("C sealed", || c.is_sealed());
        let result = std::panic::catch_unwind(|| every_power_cut_opens(&image, 50, dir));
        image.hold_syncs_of(None);
        drop(log);
        if let Err(e) = result {
            std::panic::resume_unwind(e);
        }
    }

    /// Appends until the spare file is being made, then waits until it is ready.
    fn wait_for_spare(log: &mut TopicLog) {
        let headers = Headers::new();
        while log.spare.is_none() {
            let m = Append {
                payload: &[7u8; 200],
                headers: &headers,
                headers_len: record::headers_len(&headers),
            };
            log.append(&[m], 0).expect("append");
        }
        wait_for("the spare file", || {
            log.spare.as_ref().is_some_and(|h| h.is_finished())
        });
    }

    /// A power cut took records of the first segment while the next one was durable, so
    /// open cuts the log back to the first segment, but the directory sync that makes the
    /// deletions durable fails. The next open (still this boot's page cache, where they are
    /// gone) must make them durable before the log goes on: else, once the first segment
    /// is filled up to the deleted one's base again, a power cut brings the deleted
    /// segment back and the old records it holds reappear after the new ones (found by
    /// review: only a cut-back to a flagged segment was followed by a directory sync).
    #[test]
    fn a_cut_back_whose_directory_sync_failed_is_made_durable_by_the_next_open() {
        use crate::io::sim::SimFs;
        let (cfg, dir) = (sim_cfg(), Path::new("/t"));
        let mut cut_back = 0;
        for seed in 1..=40 {
            let fs = SimFs::new(seed);
            let mut log =
                TopicLog::open(&Fs::new(Arc::new(fs.clone())), dir, cfg, 0).expect("open");
            let first = log.active().path.clone();
            wait_for_spare(&mut log);
            // S0's sealing makes A durable, then its sync of S0 itself is still in flight
            // at the power cut.
            fs.hold_syncs_of(Some(&first));
            assert!(append_until_segments(&mut log, 2));
            let a = log.active().clone();
            append(&mut log, 2);
            a.sync().expect("A's records durable");
            wait_for("A durable under its name", || fs.syncs_waiting() > 0);
            let image = fs.crash_now();
            fs.hold_syncs_of(None);
            drop(log);

            image.fail_writes_to(Some(dir));
            let failed = TopicLog::open(&Fs::new(Arc::new(image.clone())), dir, cfg, 0);
            image.fail_writes_to(None);
            let failed = failed.is_err();
            let mut log = TopicLog::open(&Fs::new(Arc::new(image.clone())), dir, cfg, 0)
                .expect("reopen after the failed one");
            if !failed || log.next() >= a.base {
                continue; // S0 kept every record: nothing was cut back.
            }
            cut_back += 1;
            let headers = Headers::new();
            let mut appended = Vec::new();
            while log.next() < a.base {
                let payload = format!("new {}", log.next()).into_bytes();
                let m = Append {
                    payload: &payload,
                    headers: &headers,
                    headers_len: record::headers_len(&headers),
                };
                log.append(&[m], 0).expect("append");
                appended.push(payload);
            }
            log.sync().expect("sync");
            assert_eq!(log.next(), a.base);
            drop(log);
            let after = image.crash_now();
            let log = TopicLog::open(&Fs::new(Arc::new(after)), dir, cfg, 0).expect("reopen");
            assert_eq!(
                log.next(),
                a.base,
                "seed {seed}: the deleted segment came back after the power cut"
            );
        }
        assert!(cut_back > 0, "no seed lost records of S0");
    }

    /// A cut-back at open removes the sealed-summaries cache first (the bases it deletes
    /// may be written again); the open then writes it anew from what it checked, or the
    /// next open reads every sealed footer instead (found by review).
    #[test]
    fn a_cut_back_at_open_writes_the_summaries_cache_again() {
        let (cfg, dir) = (sim_cfg(), Path::new("/t"));
        let mut cut_back = 0;
        for seed in 1..=40 {
            let (fs, log) = rolled_twice_with_syncs_held(seed);
            let appended = log.next();
            let image = fs.crash_now();
            fs.hold_syncs(false);
            drop(log);
            let log =
                TopicLog::open(&Fs::new(Arc::new(image.clone())), dir, cfg, 0).expect("reopen");
            if log.next() == appended || log.reader().snapshot().len() < 2 {
                continue; // Nothing lost, or nothing sealed left to cache.
            }
            cut_back += 1;
            let cache = image.read_file(&dir.join(SUMMARIES_FILE));
            assert!(
                cache.is_some_and(|c| !c.is_empty()),
                "seed {seed}: the cache is written again"
            );
        }
        assert!(cut_back > 0, "no seed lost records");
    }
}
