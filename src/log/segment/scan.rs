//! Scanning a segment's records from a known boundary: where recovery finds the end, and
//! how indexes are rebuilt.
//!
//! **Invariant:** a scan stops at the first frame that is short, corrupt, out of sequence
//! or older than the one before, and says why.

use super::*;

/// Where a scan starts: a record boundary and what is known before it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScanStart {
    pub position: u64,
    pub offset: u64,
    pub ids_before: u64,
}

impl ScanStart {
    /// At the record an index entry points to.
    pub(super) fn at(e: &IndexEntry) -> Self {
        ScanStart {
            position: e.position,
            offset: e.offset,
            ids_before: e.ids_before,
        }
    }

    pub(super) fn header(base: u64) -> Self {
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
    /// Counts `record`, found at `position`, into the result (and an index entry, where
    /// one is due); or says why the scan stops before it.
    fn admit(
        &mut self,
        record: &Record,
        position: u64,
        interval: u64,
        last_entry: &mut Option<u64>,
    ) -> std::result::Result<(), &'static str> {
        if record.offset != self.next {
            return Err("record offset out of sequence");
        }
        if record.timestamp_ms < self.last_ts {
            return Err("record timestamp goes backwards");
        }
        if wants_entry(*last_entry, position, interval) {
            self.entries.push(IndexEntry {
                offset: record.offset,
                position,
                timestamp_ms: record.timestamp_ms,
                ids_before: self.ids,
            });
            *last_entry = Some(position);
        }
        if record.headers.contains_key(MESSAGE_ID_HEADER) {
            self.ids += 1;
        }
        self.last_ts = record.timestamp_ms;
        self.next += 1;
        Ok(())
    }

    pub(super) fn summary(&self, base: u64) -> SegmentSummary {
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
pub(super) fn scan_all(
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
                    let position = r.end + cur as u64;
                    if let Err(why) = r.admit(&record, position, interval, &mut last_entry) {
                        r.end += cur as u64;
                        r.stop = Some(why);
                        return Ok(r);
                    }
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
