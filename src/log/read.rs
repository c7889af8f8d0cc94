//! Reading a log: batches of records across segments, time lookups, and the message ids
//! the de-duplication window is rebuilt from.
//!
//! **Invariant:** a batch never skips an offset; a segment retention deleted mid-read ends
//! the batch (or, if it is empty, the read goes on from the log's new start).

use super::eviction::{close_files, evict_indexes};
use super::*;

/// The most records a read reserves room for up front.
const READ_CAPACITY_MAX: usize = 4096;

impl LogReader {
    pub(super) fn snapshot(&self) -> Vec<Arc<Segment>> {
        read_lock(&self.segments).clone()
    }

    pub fn stats(&self) -> LogStats {
        let segs = read_lock(&self.segments);
        LogStats {
            earliest: self.earliest_of(&segs),
            next: segs.last().map_or(0, |s| s.next()),
            bytes: segs.iter().map(|s| s.end()).sum(),
            segments: segs.len(),
        }
    }

    /// The first offset readers may see of `segs`: the first segment's base, or the
    /// start `delete_before` set, whichever is later.
    pub(super) fn earliest_of(&self, segs: &[Arc<Segment>]) -> u64 {
        let base = segs.first().map_or(0, |s| s.base);
        base.max(self.start.load(Ordering::Acquire))
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
    pub(super) fn read_part(
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
    pub(super) fn segment_with(&self, at: &mut u64) -> Option<Arc<Segment>> {
        let segs = read_lock(&self.segments);
        segs.first()?;
        *at = (*at).max(self.earliest_of(&segs));
        let start = segs.partition_point(|s| s.base <= *at).saturating_sub(1);
        segs[start..].iter().find(|s| *at < s.next()).cloned()
    }

    /// The first offset whose record has a timestamp `>= ts_ms`; the log end if none.
    pub fn offset_for_time(&self, ts_ms: u64) -> Result<u64> {
        loop {
            if let Some(o) = self.offset_for_time_in(&self.snapshot(), ts_ms)? {
                // Records `delete_before` took away are not found by time either.
                return Ok(o.max(self.earliest()));
            }
        }
    }

    /// `offset_for_time` in a snapshot of the segments; `None` if one of them was deleted
    /// by retention since (look again in what is left).
    pub(super) fn offset_for_time_in(
        &self,
        segs: &[Arc<Segment>],
        ts_ms: u64,
    ) -> Result<Option<u64>> {
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
pub(super) enum Part {
    Read,
    Nothing,
    /// Deleted by retention since it was looked up.
    Gone,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::test_support::*;

    /// A log of `n` records in `dir`, opened again: its sealed segments come from disk
    /// (files closed, indexes unloaded) as after a restart.
    fn reopened_log_in(dir: &Path, n: usize) -> TopicLog {
        let mut log = log_in(dir);
        append(&mut log, n);
        drop(log);
        log_in(dir)
    }

    /// A log of 40 records in several segments, and its first segment as a reader holds it.
    fn log_and_first_segment(dir: &Path) -> (TopicLog, Arc<Segment>) {
        let mut log = log_in(dir);
        append(&mut log, 40);
        let mut at = 0;
        let first = log.reader().segment_with(&mut at).expect("first segment");
        (log, first)
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
        assert!(log.apply_retention(0, 1, 0, None).expect("retention") > 0);
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
                log.apply_retention(0, 2_000_000, 0, None)
                    .expect("retention");
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

    /// A reader that looked a segment up just before retention deleted it (its file closed
    /// by then) goes on from the log's new start instead of failing.
    #[test]
    fn a_read_racing_retention_goes_on_from_the_new_start() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (mut log, first) = log_and_first_segment(tmp.path());
        let reader = log.reader().clone();
        first.close_file();
        let removed = log.apply_retention(0, 1, 0, None).expect("retention");
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
        let removed = log.apply_retention(0, 1, 0, None).expect("retention");
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
}
