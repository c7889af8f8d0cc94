//! Retention: deleting whole sealed segments, oldest first, by size, age or acks, and
//! everything before an offset (`delete_before`).
//!
//! **Invariant:** never the active segment, never one still being sealed; each deletion
//! is durable before the next.

use super::*;

impl TopicLog {
    /// Deletes whole sealed segments, oldest first, as `retention_target` picks them.
    /// Returns the segments removed. (The engine goes through `retention_target` and
    /// `delete_before` itself, to make the new start durable in between.)
    #[cfg(test)]
    pub fn apply_retention(
        &mut self,
        now_ms: u64,
        max_bytes: u64,
        max_age_ms: u64,
        finished: Option<u64>,
    ) -> Result<usize> {
        let target = self.retention_target(now_ms, max_bytes, max_age_ms, finished);
        if target > self.reader.earliest() {
            self.set_start(target);
        }
        self.remove_below(target)
    }

    /// The log's earliest offset once retention deleted the sealed segments it may, oldest
    /// first: while the log keeps at least `max_bytes` without them (0 = no limit), while
    /// their newest record is older than `max_age_ms` (0 = no limit), and while every
    /// record in them is below `finished` (under `Retention Policy=Acked`, the offset
    /// every group finished). Segments already below the start (left by a deletion that
    /// failed) go too. Never the active segment, nor one still being sealed.
    pub fn retention_target(
        &self,
        now_ms: u64,
        max_bytes: u64,
        max_age_ms: u64,
        finished: Option<u64>,
    ) -> u64 {
        let segs = read_lock(&self.reader.segments);
        let start = self.reader.start.load(Ordering::Acquire);
        let mut total: u64 = segs.iter().map(|s| s.end()).sum();
        let mut target = self.reader.earliest_of(&segs);
        for (i, oldest) in segs.iter().enumerate() {
            if i + 1 == segs.len() || !oldest.is_sealed() {
                break;
            }
            let by_bytes = max_bytes > 0 && total - oldest.end() >= max_bytes;
            let by_age =
                max_age_ms > 0 && now_ms.saturating_sub(oldest.summary().last_ts) > max_age_ms;
            let by_acks = finished.is_some_and(|f| oldest.next() <= f);
            let hidden = oldest.next() <= start;
            if !(by_bytes || by_age || by_acks || hidden) {
                break;
            }
            total -= oldest.end();
            target = target.max(segs[i + 1].base);
        }
        target
    }

    /// Takes the records before `offset` (clamped to the log's visible end) away from
    /// every reader, and deletes the sealed segments that hold only such records. Returns
    /// the log's earliest offset after it. The caller makes `offset` durable first (the
    /// catalog) and sets it again at every open (`set_start`).
    pub fn delete_before(&mut self, offset: u64) -> Result<u64> {
        let target = offset.min(self.reader.next());
        if target > self.reader.earliest() {
            self.set_start(target);
        }
        self.remove_below(target)?;
        Ok(self.reader.earliest())
    }

    /// Removes the sealed segments whose records are all below `target`, and their files.
    /// Returns how many.
    fn remove_below(&mut self, target: u64) -> Result<usize> {
        let removed = self.take_oldest(|oldest| oldest.next() <= target);
        self.delete_files(&removed)?;
        Ok(removed.len())
    }

    /// Readers see nothing before `start` (at most the log's end: records after it lost
    /// to a power cut are not waited for).
    pub fn set_start(&mut self, start: u64) {
        let start = start.min(self.next());
        self.reader.start.fetch_max(start, Ordering::AcqRel);
        let segs = read_lock(&self.reader.segments);
        self.reader.bounds[0].fetch_max(self.reader.earliest_of(&segs), Ordering::AcqRel);
    }

    /// Takes sealed segments out of the log, oldest first, while `take` says so. Never the
    /// active segment, nor one still being sealed in the background (kept until the next
    /// check rather than waited for under the writer's lock).
    fn take_oldest(&mut self, mut take: impl FnMut(&Segment) -> bool) -> Vec<Arc<Segment>> {
        let mut removed = Vec::new();
        let mut segs = write_lock(&self.reader.segments);
        while segs.len() > 1 {
            let oldest = &segs[0];
            if !oldest.is_sealed() {
                debug_assert!(segs.len() <= MAX_SEALING + 1, "only the last few");
                break;
            }
            if !take(oldest) {
                break;
            }
            let seg = segs.remove(0);
            seg.mark_removed();
            removed.push(seg);
        }
        if !segs.is_empty() {
            let earliest = self.reader.earliest_of(&segs);
            self.reader.bounds[0].store(earliest, Ordering::Release);
        }
        removed
    }

    /// Deletes the files of segments taken out of the log, each deletion durable before
    /// the next.
    fn delete_files(&mut self, removed: &[Arc<Segment>]) -> Result<()> {
        for seg in removed {
            tracing::info!(segment = %seg.path.display(), next = seg.next(), "deleted a segment (retention or deleted records)");
            // Kept for a roll to overwrite (every block of it written once, so no zeros
            // ahead), unless a reader still holds it (its open descriptor would then read
            // the new records where it expects the old ones) or another name does (a
            // snapshot's hard link: overwriting would change the snapshot).
            if self.cfg.preallocate
                && self.recycled.len() < MAX_RECYCLED
                && Arc::strong_count(seg) == 1
                && self.fs.link_count(&seg.path).is_ok_and(|n| n == 1)
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
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::test_support::*;

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
        assert_eq!(log.apply_retention(0, 1, 0, None).expect("retention"), 4);
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
        assert_eq!(log.apply_retention(0, 1, 0, None).expect("retention"), 3);
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

    /// A segment a reader still holds is deleted, not kept: its open descriptor would
    /// read the new records in place of the old ones.
    #[test]
    fn retention_does_not_keep_a_file_a_reader_holds() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut log = TopicLog::open(&Fs::real(), tmp.path(), always_cfg(), 0).expect("open");
        assert!(append_until_segments(&mut log, 3));
        let held = log.reader().snapshot();
        assert_eq!(log.apply_retention(0, 1, 0, None).expect("retention"), 2);
        assert!(recycled_in(tmp.path()).is_empty());
        drop(held);
        assert!(append_until_segments(&mut log, 3));
        assert_eq!(log.apply_retention(0, 1, 0, None).expect("retention"), 2);
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
        assert_eq!(log.apply_retention(0, 1, 0, None).expect("retention"), 2);
        assert!(recycled_in(tmp.path()).is_empty());
    }
}
