//! Opening a log: recovery. Sealed segments are trusted by their footers (or the
//! summaries cache); only the active segment's tail is scanned.
//!
//! **Invariant:** after open the log is a prefix of what was appended, without a gap.

use super::summaries::{Cached, SUMMARIES_STALE_MAX};
use super::*;

impl TopicLog {
    /// Opens (or creates) the log in `dir`. Reads sealed segments' index footers and
    /// scans only the active segment's tail.
    pub fn open(fs: &Fs, dir: &Path, cfg: LogConfig, now_ms: u64) -> Result<TopicLog> {
        let found = Recovered::find(fs, dir, &cfg, now_ms)?;
        TopicLog::start(fs, dir, cfg, found)
    }
}

/// The read handle over `segments`, and under `visible_when_synced` what the active
/// segment shows readers through.
fn reader_over(
    segments: Vec<Arc<Segment>>,
    active: &Segment,
    cfg: LogConfig,
) -> Result<(LogReader, Option<Arc<Visibility>>)> {
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
    let reader = LogReader {
        bounds,
        segments: Arc::new(RwLock::new(segments)),
        start: Arc::new(AtomicU64::new(0)),
        swept: Arc::new(AtomicU64::new(0)),
        cfg,
    };
    Ok((reader, visibility))
}

/// What recovery found and left on disk: the log's segments, ready for a writer.
struct Recovered {
    segments: Vec<Arc<Segment>>,
    active: Arc<Segment>,
    recycled: Vec<PathBuf>,
    poison: Poison,
    summaries: Arc<Summaries>,
    checked: TailCheck,
    /// This boot's mark, if the file system has one.
    mark: Option<String>,
    same_boot: bool,
    /// The log was new: its first segment was created by this open.
    created: bool,
}

impl Recovered {
    /// Recovers the log in `dir` (creating it if new): the steps run in this order on
    /// purpose, since each file operation's place decides what a crash in the middle of an
    /// open leaves for the next one.
    fn find(fs: &Fs, dir: &Path, cfg: &LogConfig, now_ms: u64) -> Result<Recovered> {
        fs.create_dir_all(dir)?;
        // Before anything is read: a file whose sync failed may show records the disk lacks.
        fs.rewrite_unsynced(dir)?;
        let Listing {
            mut bases,
            stray_indexes,
            recycled,
        } = Listing::read(fs, dir)?;
        let recycled = keep_recycled(fs, cfg, recycled, bases.first().copied())?;
        remove_stray_indexes(fs, dir, &bases, stray_indexes)?;
        let poison: Poison = Arc::new(OnceLock::new());
        let summaries = Arc::new(Summaries::new(dir));
        remove_torn_last_segments(fs, dir, &mut bases)?;
        // Written by the last open that checked the log in full: if it names this boot and
        // this directory, every write since is still in the page cache (only a process
        // died, not the machine), so nothing written can be missing (docs/internals.md, "Same-boot opens").
        let mark = fs.boot_mark(dir);
        let same_boot = mark.as_ref().is_some_and(|m| {
            fs.open(&dir.join(BOOT_MARK_FILE))
                .and_then(|f| f.read_all(m.len() as u64))
                .is_ok_and(|b| b.as_deref() == Some(m.as_bytes()))
        });
        let mut cached = summaries.read(fs);
        let mut checked =
            check_unsynced_tail(fs, dir, cfg, &mut bases, &mut cached, &summaries, same_boot)?;
        let Opened {
            mut segments,
            stats,
        } = open_segments(
            fs,
            dir,
            cfg,
            &bases,
            std::mem::take(&mut checked.known),
            &cached,
            &poison,
            same_boot,
        )?;
        // A new log: `Segment::create` syncs the directory itself.
        let created = segments.is_empty();
        if created {
            segments.push(
                Segment::create(fs, dir, 0, now_ms, cfg.max_body, poison.clone(), 0)?.shared(),
            );
        }
        let active = segments
            .last()
            .cloned()
            .ok_or_else(|| Error::corrupt(dir, "log has no segment after open (internal error)"))?;
        let recycled = drop_recycled_that_are_segments(fs, recycled, &stats, &active)?;
        rewrite_stale_summaries(
            fs,
            &summaries,
            &segments,
            &stats,
            &cached,
            checked.cache_removed,
        );
        Ok(Recovered {
            segments,
            active,
            recycled,
            poison,
            summaries,
            checked,
            mark,
            same_boot,
            created,
        })
    }
}

impl TopicLog {
    /// The log's writer over what recovery found: the active segment's index, the bounds
    /// readers see, interrupted sealings queued.
    fn start(fs: &Fs, dir: &Path, cfg: LogConfig, found: Recovered) -> Result<TopicLog> {
        let Recovered {
            segments,
            active,
            recycled,
            poison,
            summaries,
            checked,
            mark,
            same_boot,
            created,
        } = found;
        let allocated = active.with_file(|f| f.len())?;
        let entries = active.index(cfg.index_interval_bytes)?;
        // With their successors: see `defer_interrupted_sealings`.
        let unsealed: Vec<(Arc<Segment>, Arc<Segment>)> = segments
            .windows(2)
            .filter(|w| !w[0].is_sealed())
            .map(|w| (w[0].clone(), w[1].clone()))
            .collect();
        // The largest, not the last segment's: a log written before `newest_ts` existed
        // may have gone back at a roll.
        let newest_ts = segments
            .iter()
            .map(|s| s.summary().last_ts)
            .max()
            .unwrap_or(0);
        let (reader, visibility) = reader_over(segments, &active, cfg)?;
        let mut log = TopicLog {
            fs: fs.clone(),
            dir: dir.to_owned(),
            cfg,
            reader,
            active,
            last_entry: entries.last().map(|e| e.position),
            index_count: entries.len() as u64,
            allocated,
            preallocate_step: append::PREALLOCATE_MIN_BYTES,
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
        // an earlier open may have cut the log back and failed before its directory sync,
        // so that the deleted segments are gone from the page cache but not from the disk,
        // where a power cut would bring them back behind what is appended from now on.
        if checked.active_flagged || (!same_boot && !created) {
            fs.sync_dir(dir)?;
        }
        log.defer_interrupted_sealings(unsealed);
        if let Some(m) = mark.filter(|_| !same_boot) {
            write_boot_mark(fs, dir, &m);
        }
        Ok(log)
    }

    /// Queues the sealings a killed process left unfinished. Found whole from their index
    /// entries (`same_boot`): read whole, synced and sealed as the interrupted sealing
    /// would have, oldest first, still at most `MAX_SEALING`, and, as that sealing would
    /// have, after making the successor durable: a killed process may have left its real
    /// header (a roll from the spare) in the page cache only, and no footer may vouch for
    /// a segment whose successor's header a power cut could still turn back into the
    /// spare's (open would not know the segment).
    fn defer_interrupted_sealings(&mut self, unsealed: Vec<(Arc<Segment>, Arc<Segment>)>) {
        debug_assert!(unsealed.len() <= MAX_SEALING);
        debug_assert!(unsealed.is_empty() || self.cfg.seal_in_background);
        // Started by `resume_sealing` once the caller's open is done (its syncs would
        // slow the open's own), or run inline by whatever waits for them first.
        for (seg, successor) in unsealed {
            let fresh = Some((successor, self.dir.clone()));
            self.sealing
                .push_back((seg.base, Sealing::Deferred(seg, fresh)));
        }
    }
}

/// The files of a topic's directory, by kind.
struct Listing {
    /// Segment data files' bases, ascending.
    bases: Vec<u64>,
    /// Index files' bases (those without a data file are strays).
    stray_indexes: Vec<u64>,
    /// Segment files retention kept for rolls to reuse, by name.
    recycled: Vec<PathBuf>,
}

impl Listing {
    fn read(fs: &Fs, dir: &Path) -> Result<Listing> {
        let mut l = Listing {
            bases: Vec::new(),
            stray_indexes: Vec::new(),
            recycled: Vec::new(),
        };
        for name in fs.list_dir(dir)? {
            if let Some(b) = name.strip_suffix(".log").and_then(parse_base) {
                l.bases.push(b);
            } else if let Some(b) = name.strip_suffix(".idx").and_then(parse_base) {
                l.stray_indexes.push(b);
            } else if name.ends_with(segment::RECYCLED_SUFFIX) {
                l.recycled.push(dir.join(name));
            }
        }
        l.bases.sort_unstable();
        l.recycled.sort_unstable();
        Ok(l)
    }
}

/// The kept files a roll may reuse; the rest are removed. Kept only where rolls reuse
/// them (a log opened under another policy since), and only from below the log's first
/// segment, as retention leaves them: the old records in one must all have offsets below
/// every new segment's base (a log whose segments were deleted by hand starts again at 0).
fn keep_recycled(
    fs: &Fs,
    cfg: &LogConfig,
    recycled: Vec<PathBuf>,
    first: Option<u64>,
) -> Result<Vec<PathBuf>> {
    let (mut keep, mut gone): (Vec<PathBuf>, Vec<PathBuf>) = recycled.into_iter().partition(|p| {
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
    Ok(keep)
}

/// Removes index files without a data file: left behind by retention stopped half-way.
fn remove_stray_indexes(fs: &Fs, dir: &Path, bases: &[u64], indexes: Vec<u64>) -> Result<()> {
    for b in indexes {
        if bases.binary_search(&b).is_err() {
            fs.remove_file(&dir.join(segment::index_file_name(b)))?;
        }
    }
    Ok(())
}

/// A last segment torn during creation (shorter than its header) holds nothing: it is
/// removed, and the previous segment is the active one.
fn remove_torn_last_segments(fs: &Fs, dir: &Path, bases: &mut Vec<u64>) -> Result<()> {
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
    Ok(())
}

/// What `check_unsynced_tail` found.
struct TailCheck {
    /// Segments found whole by the check, with what vouches for them.
    known: std::collections::HashMap<u64, segment::Known>,
    /// The active segment's header says it was rolled under `seal_in_background`.
    active_flagged: bool,
    /// The cache file was removed by a cut-back (its entries still serve this open).
    cache_removed: bool,
}

/// Checks the segments that may still have been syncing at a crash, and cuts the log
/// back to the first one that lost records.
///
/// A segment whose successor says it was still being synced when the successor was
/// created (`seal_in_background`; at most `MAX_SEALING` before the active one) may have
/// lost records to a power cut. Then everything after it came after the loss, and the log
/// is cut back to it: it becomes the active segment, whose torn tail open truncates. The
/// log stays a prefix, without a gap.
fn check_unsynced_tail(
    fs: &Fs,
    dir: &Path,
    cfg: &LogConfig,
    bases: &mut Vec<u64>,
    cached: &mut std::collections::HashMap<u64, Cached>,
    summaries: &Summaries,
    same_boot: bool,
) -> Result<TailCheck> {
    let mut out = TailCheck {
        known: std::collections::HashMap::new(),
        active_flagged: false,
        cache_removed: false,
    };
    let from = bases.len().saturating_sub(MAX_SEALING + 1);
    for i in from..bases.len().saturating_sub(1) {
        let (prev, next) = (bases[i], bases[i + 1]);
        let next_path = dir.join(segment::segment_file_name(next));
        let flags = segment::header_flags(fs, &next_path, next);
        // The active segment's header, read here once, as the last pair's successor.
        if i + 2 == bases.len() {
            out.active_flagged = flags & FLAG_FOLLOWS_UNSYNCED != 0;
        }
        let Some(valid) =
            lost_records(fs, dir, cfg, prev, next, flags, cached, same_boot, &mut out)?
        else {
            continue;
        };
        cut_back(fs, dir, bases, i, valid, summaries)?;
        out.cache_removed = true;
        cached.retain(|&b, _| b < prev);
        // Synced just now: every name left is durable.
        out.active_flagged = false;
        out.known.remove(&prev);
        break;
    }
    Ok(out)
}

/// Whether segment `prev` lost records, judged by its successor's header `flags`:
/// `Some(valid)` if it did (`valid` as in `Whole::No`), `None` if it is whole (then it
/// goes in `out.known` when the check read it).
#[expect(
    clippy::too_many_arguments,
    reason = "one step of open, on open's locals"
)]
fn lost_records(
    fs: &Fs,
    dir: &Path,
    cfg: &LogConfig,
    prev: u64,
    next: u64,
    flags: u32,
    cached: &std::collections::HashMap<u64, Cached>,
    same_boot: bool,
    out: &mut TailCheck,
) -> Result<Option<Option<u64>>> {
    if flags & FLAG_SPARE != 0 {
        // Renamed from a spare at a roll whose real header never reached the disk:
        // nothing in it (or after it) was synced.
        return Ok(Some(None));
    }
    if flags & FLAG_FOLLOWS_UNSYNCED == 0 {
        return Ok(None);
    }
    let prev_path = dir.join(segment::segment_file_name(prev));
    let next_path = dir.join(segment::segment_file_name(next));
    let whole = segment::wholeness(
        fs,
        &prev_path,
        prev,
        next,
        cfg.max_body,
        cfg.index_interval_bytes,
        // Sealed inline (`Always`/`Interval`) the segment is read whole and synced in
        // this open anyway: the full check costs nothing more there.
        same_boot && cfg.seal_in_background,
        fs.file_stat(&prev_path)
            .ok()
            .and_then(|stat| cached.get(&prev)?.for_file(&stat))
            .as_ref(),
    )?;
    match whole {
        segment::Whole::Yes(k) => {
            // Sealed inline by this open (its footer rebuilt later): in the same boot
            // `next`'s real header may be in the page cache only (see the background case
            // in `defer_interrupted_sealings`), so it is made durable first.
            if same_boot && matches!(k, segment::Known::Scan(_)) {
                fs.open(&next_path)?.sync_data()?;
                fs.sync_dir(dir)?;
            }
            out.known.insert(prev, k);
            Ok(None)
        }
        segment::Whole::No { valid } => Ok(Some(valid)),
    }
}

/// Cuts the log back to `bases[i]`, which lost records: truncates it to its `valid`
/// length and deletes every segment after it, durably.
fn cut_back(
    fs: &Fs,
    dir: &Path,
    bases: &mut Vec<u64>,
    i: usize,
    valid: Option<u64>,
    summaries: &Summaries,
) -> Result<()> {
    let prev_path = dir.join(segment::segment_file_name(bases[i]));
    // First (a crash now repeats this open's decision): a record after a lost one must
    // not stay in what becomes the active segment, whose recovery trusts its index and
    // would not find the hole.
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
    for &b in &bases[i + 1..] {
        fs.remove_file(&dir.join(segment::segment_file_name(b)))?;
        fs.remove_file(&dir.join(segment::index_file_name(b)))?;
    }
    fs.sync_dir(dir)?;
    bases.truncate(i + 1);
    Ok(())
}

/// The segments `open_segments` opened, with the sealed ones' file stats.
struct Opened {
    segments: Vec<Arc<Segment>>,
    /// The sealed segments' data files as they were found (for the cache).
    stats: Vec<FileStat>,
}

/// Opens every segment in `bases`: the last as the active one (its tail scanned), the
/// rest sealed (trusted by what `known` or the cache vouches for, else their footer).
#[expect(
    clippy::too_many_arguments,
    reason = "one step of open, on open's locals"
)]
fn open_segments(
    fs: &Fs,
    dir: &Path,
    cfg: &LogConfig,
    bases: &[u64],
    mut known: std::collections::HashMap<u64, segment::Known>,
    cached: &std::collections::HashMap<u64, Cached>,
    poison: &Poison,
    same_boot: bool,
) -> Result<Opened> {
    let interval = cfg.index_interval_bytes;
    let mut segments: Vec<Arc<Segment>> = Vec::with_capacity(bases.len().max(1));
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
        segments.push(seg.shared());
    }
    Ok(Opened { segments, stats })
}

/// The kept files that are not also a segment. A power cut between a rename and its
/// directory sync can keep both names of the file where renames are not atomic across
/// crashes (ext4's are; `SimFs`'s are not): a kept file that is also a segment must never
/// be overwritten, so its kept name is removed.
fn drop_recycled_that_are_segments(
    fs: &Fs,
    recycled: Vec<PathBuf>,
    stats: &[FileStat],
    active: &Segment,
) -> Result<Vec<PathBuf>> {
    if recycled.is_empty() {
        return Ok(recycled);
    }
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
    Ok(kept)
}

/// Rewrites the summaries cache if it lacks sealed segments (a log from before it, lost
/// appends, files made anew), was removed by a cut-back, or holds many entries retention
/// left behind. Before any sealing thread appends, with what was checked at this open.
fn rewrite_stale_summaries(
    fs: &Fs,
    summaries: &Summaries,
    segments: &[Arc<Segment>],
    stats: &[FileStat],
    cached: &std::collections::HashMap<u64, Cached>,
    cache_removed: bool,
) {
    let sealed: Vec<Cached> = segments
        .iter()
        .zip(stats)
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
}

/// Records that this boot checked the log in full. Not synced: a power cut that loses it
/// also starts another boot.
fn write_boot_mark(fs: &Fs, dir: &Path, mark: &str) {
    let written = fs.open_or_create(&dir.join(BOOT_MARK_FILE)).and_then(|f| {
        f.write_all_at(mark.as_bytes(), 0)
            .and(f.set_len(mark.len() as u64))
    });
    if let Err(e) = written {
        tracing::warn!(error = %e, "could not write the boot mark; the next open checks the log in full");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::test_support::*;

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
            assert_eq!(log.apply_retention(0, 1, 0, None).expect("retention"), 2);
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
        assert_eq!(log.apply_retention(0, 1, 0, None).expect("retention"), 2);
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
            assert_eq!(log.apply_retention(0, 1, 0, None).expect("retention"), 2);
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
