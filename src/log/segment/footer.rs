//! A sealed index's footer: read, matched to its segment, and checked against the data
//! before open trusts it.
//!
//! **Invariant:** a footer is believed only if its crc holds and it names this segment.

use super::*;

/// What still has to be checked of a footer's summary before open trusts it.
#[derive(Clone, Copy, Debug)]
pub(super) enum Unchecked {
    /// Nothing: its own crc matched.
    No,
    /// A footer from before the summary crc: its first and last entries, to check the
    /// summary against the data (`footer_agrees`).
    Ends(IndexEntry, IndexEntry),
}

/// Reads a sealed index's footer (and, for a footer without a summary crc, its first and
/// last entries). Open reads nothing else of it; the entries are checked against the
/// footer's crc when first used.
pub(super) fn read_footer(
    fs: &Fs,
    index_path: &Path,
) -> Result<Option<(SegmentSummary, Unchecked)>> {
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
pub(super) fn footer_for(
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
pub(super) fn footer_agrees(
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
