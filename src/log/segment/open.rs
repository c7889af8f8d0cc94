//! Making and opening segment files: a new segment, one renamed from the spare or a kept
//! file, a sealed one trusted by its footer, the active one with its tail scanned.
//!
//! **Invariant:** a segment's header is checked against its file name's base before
//! anything in it is believed.

use super::*;

impl Segment {
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
        base: u64,
        now_ms: u64,
        max_body: usize,
        poison: Poison,
    ) -> Result<Segment> {
        let path = dir.join(segment_file_name(base));
        fs.rename(&dir.join(SPARE_FILE_NAME), &path)?;
        let file = fs.open(&path)?;
        file.write_all_at(
            &fmt::encode_header(base, now_ms, fmt::FLAG_FOLLOWS_UNSYNCED),
            0,
        )?;
        let seg = Segment::fresh(fs, dir, file, base, max_body, poison)?;
        // Its header's sync is the sealing's (which opens the file again if it closed).
        seg.note_unsynced_write();
        Ok(seg)
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
            return Ok(Segment::summarised(fs, path, base, s, max_body, poison));
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
            return Ok(Segment::summarised(fs, path, base, s, max_body, poison));
        }
        tracing::warn!(segment = %path.display(), "sealed segment has no valid index; rebuilding it");
        let scan = match known {
            Some(Known::Scan(scan)) => scan,
            _ => scan_all(&file, base, len, interval, max_body)?,
        };
        Segment::sealed_from_scan(fs, path, &file, base, len, scan, max_body, poison)
    }

    /// A sealed segment whose summary `s` is trusted; its file and index are opened
    /// when first used.
    fn summarised(
        fs: &Fs,
        path: PathBuf,
        base: u64,
        s: SegmentSummary,
        max_body: usize,
        poison: Poison,
    ) -> Segment {
        let index_path = path.with_extension("idx");
        let seg = Segment::from_parts(fs, path, index_path, None, base, s, true, max_body, poison);
        seg.index_loaded.store(false, Ordering::Release);
        seg
    }

    /// A sealed segment known only from a scan of its records: its index is written anew
    /// from the scan, or, if the scan found damage, its old footer is kept (if it names
    /// this file) and reads of the damaged range fail.
    #[expect(clippy::too_many_arguments, reason = "open's view of one segment")]
    fn sealed_from_scan(
        fs: &Fs,
        path: PathBuf,
        file: &DataFile,
        base: u64,
        len: u64,
        scan: ScanResult,
        max_body: usize,
        poison: Poison,
    ) -> Result<Segment> {
        let index_path = path.with_extension("idx");
        if let Some(why) = scan.stop {
            let footer = read_footer(fs, &index_path)?
                .filter(|(s, _)| s.base == base && s.bytes == len && s.next >= base);
            if let Some((s, _)) = footer {
                // The data itself is damaged, so the footer could not be confirmed; it is
                // still the best summary there is. Reads of the damaged range fail with
                // `Error::Corrupt`, as they would have with an intact footer.
                tracing::error!(segment = %path.display(), at = scan.end, reason = why,
                    "sealed segment is damaged; keeping its index");
                let seg = Segment::summarised(fs, path, base, s, max_body, poison);
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
        // What recovery found in an unsealed segment may not be durable yet (an unsynced
        // tail): one unsynced write, so that a sync opens the file again if it closed.
        let unsynced = !sealed && s.bytes > SEGMENT_HEADER_LEN as u64;
        Segment {
            base,
            path,
            index_path,
            file: RwLock::new(file.map(|f| Segment::held(fs, f))),
            index_file: RwLock::new(None),
            file_used: AtomicU64::new(0),
            used: AtomicBool::new(true),
            writes: AtomicU64::new(u64::from(unsynced)),
            synced_writes: AtomicU64::new(0),
            me: std::sync::Weak::new(),
            key: fs.open_files().next_key(),
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
            journaled: AtomicU64::new(0),
            header_crc: OnceLock::new(),
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
}

/// Checks the header against the file name's base offset; returns its flags.
pub(super) fn check_header(file: &DataFile, base: u64) -> Result<u32> {
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
const SPARE_FILE_NAME: &str = "spare.log.next";

/// Appended to a segment file's name when retention keeps it for a later roll to reuse
/// (`Sync=Always`: see `TopicLog::apply_retention`). Not a `.log` file: open never takes it
/// for a segment.
pub(crate) const RECYCLED_SUFFIX: &str = ".recycled";

/// Makes a spare file for the next roll, header synced (off the roll, on a thread), and
/// closes it (the roll opens it again by name: no descriptor is held until then).
pub(crate) fn make_spare(fs: &Fs, dir: &Path) -> Result<()> {
    let path = dir.join(SPARE_FILE_NAME);
    fs.remove_file(&path)?;
    let file = fs.create_new(&path)?;
    file.write_all_at(
        &fmt::encode_header(0, 0, fmt::FLAG_SPARE | fmt::FLAG_FOLLOWS_UNSYNCED),
        0,
    )?;
    file.sync_data()
}
