//! A segment's sparse index: loaded on first use, checked against the records it points
//! at, rebuilt from a scan when it is wrong, written sealed with a footer.
//!
//! **Invariant:** the index is a cache; a wrong or missing entry costs a scan, never a
//! wrong read.

use super::*;

impl Segment {
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
    pub(super) fn entry_for_offset(
        &self,
        offset: u64,
        interval: u64,
    ) -> Result<Option<IndexEntry>> {
        self.checked_entry(interval, |e| e.offset <= offset)
    }

    /// The last index entry whose timestamp is before `ts_ms`.
    pub(super) fn entry_before_time(
        &self,
        ts_ms: u64,
        interval: u64,
    ) -> Result<Option<IndexEntry>> {
        self.checked_entry(interval, |e| e.timestamp_ms < ts_ms)
    }

    /// The last entry for which `before` holds (the index is sorted by it), checked against
    /// its record if it came from the index file unchecked (`unverified`). One that points
    /// elsewhere has the index rebuilt from the records (`reindex`) and is looked up again.
    /// Only the entry a lookup ends on needs checking: the ones after it hold `before` false
    /// whatever they are, so starting at a checked entry never starts past what is sought.
    pub(super) fn checked_entry(
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
    pub(super) fn reindex(&self, interval: u64, wrong: &IndexEntry) -> Result<()> {
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
    pub(super) fn set_unverified(&self, n: usize) {
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
    pub(super) fn adopt(&self, scan: ScanResult) {
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
        let entries = if self.is_sealed() {
            self.sealed_index_entries(interval)?
        } else {
            let (entries, unverified) = self.unsealed_index_entries(interval)?;
            self.set_unverified(unverified);
            entries
        };
        *guard = entries;
        self.index_loaded.store(true, Ordering::Release);
        LOADS.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The entries of a segment opened from its index's ends (`Known::Indexed`), not
    /// sealed yet, with how many of them are unverified: checked as the active segment's
    /// are, and they must reach the same end.
    fn unsealed_index_entries(&self, interval: u64) -> Result<(Vec<IndexEntry>, usize)> {
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
        Ok((r.entries, r.unchanged))
    }

    /// The entries of a sealed segment's index file; rebuilt from a scan (and written
    /// again) if the file is missing or damaged.
    fn sealed_index_entries(&self, interval: u64) -> Result<Vec<IndexEntry>> {
        // Too long to be its index: damaged, rebuilt below like any damaged index.
        let raw = match self.fs.open(&self.index_path) {
            Ok(f) => f.read_all(index_bytes_max(self.end()))?.unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        Ok(match fmt::decode_sealed_index(&raw) {
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
        })
    }
}

/// The most bytes the index of a segment file of `data_len` bytes can take: an entry
/// (32 bytes) per record (at least 29 bytes) at most, and a footer.
fn index_bytes_max(data_len: u64) -> u64 {
    data_len.saturating_mul(2).saturating_add(FOOTER_LEN as u64)
}

/// The entries of the index of a segment file of `data_len` bytes (none if it is too long
/// to be one: damaged; the records after the last entry are scanned anyway).
pub(super) fn load_index_entries(
    fs: &Fs,
    index_path: &Path,
    data_len: u64,
) -> Result<Vec<IndexEntry>> {
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

pub(super) fn entry_points_at_record(
    file: &DataFile,
    e: &IndexEntry,
    max_body: usize,
) -> Result<bool> {
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
pub(super) fn starts_segment(e: &IndexEntry, base: u64) -> bool {
    e.offset == base && e.position == SEGMENT_HEADER_LEN as u64 && e.ids_before == 0
}
