//! Whether a segment that may have been syncing at a crash holds every record up to its
//! successor's base, judged as cheaply as the evidence allows.
//!
//! **Invariant:** a segment is called whole only on evidence that covers every record.

use super::*;

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
pub(super) struct Probe<'a> {
    fs: &'a Fs,
    file: &'a DataFile,
    index_path: &'a Path,
    base: u64,
    len: u64,
    interval: u64,
    max_body: usize,
}

impl<'a> Probe<'a> {
    pub(super) fn new(
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

    /// The sealed footer's summary, if open may trust it (docs/internals.md, "Sealed segments at open").
    pub(super) fn trusted_footer(&self) -> Result<Option<SegmentSummary>> {
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
    pub(super) fn read_index(&self) -> Result<FromIndex> {
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
pub(super) fn is_zero(file: &DataFile, from: u64, to: u64) -> Result<bool> {
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
