//! Segment header, sparse index entries and the sealed-index footer. Bytes only, no I/O.

/// `b"SPL"` + format version 1: a reader of another version refuses the file.
pub const SEGMENT_MAGIC: [u8; 4] = [b'S', b'P', b'L', 1];
/// `magic[4] | flags u32 | base_offset u64 | created_ms u64 | reserved u32 (0) | crc32 u32`.
pub const SEGMENT_HEADER_LEN: usize = 32;

/// Header flag: when this segment was created, the one before it was still being synced
/// in the background (`Sync=None`), so after a power cut that one may have lost its tail,
/// and everything from the loss on (this segment included) is cut off at open.
pub const FLAG_FOLLOWS_UNSYNCED: u32 = 1;
/// Header flag: a spare file made ready for the next roll (base 0, not yet a segment). A
/// segment file whose header still says so was renamed at a roll whose real header never
/// reached the disk: nothing in it was synced.
pub const FLAG_SPARE: u32 = 2;
const KNOWN_FLAGS: u32 = FLAG_FOLLOWS_UNSYNCED | FLAG_SPARE;

/// What a segment header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    pub base: u64,
    pub flags: u32,
}

/// Sparse index entry: `offset u64 | position u64 | timestamp_ms u64 | ids_before u64`. One
/// list serves as the offset index (offset -> position), the time index (timestamp ->
/// offset) and the id index (how many `message-id`s the segment holds before the entry),
/// because all three are sampled at the same records.
pub const INDEX_ENTRY_LEN: usize = 32;

/// `b"SPX"` + version 1, at the start of the sealed-index footer.
pub const FOOTER_MAGIC: [u8; 4] = [b'S', b'P', b'X', 1];
/// `magic[4] | entry_count u32 | base u64 | next u64 | bytes u64 | first_ts u64 | last_ts u64 |
/// id_count u64 | summary_crc u32 | crc32 u32`: `summary_crc` covers footer bytes 0..56 (0 in
/// footers written before it existed), the last crc all entries and footer bytes 0..60.
pub const FOOTER_LEN: usize = 64;

/// A sealed-index footer on its own (without the entries its last crc covers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footer {
    pub entry_count: u64,
    pub summary: SegmentSummary,
    /// The summary's own crc matched: it was written whole, so open may trust it without
    /// checking it against the data. `false` for footers from before that crc existed.
    pub summary_checked: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub offset: u64,
    pub position: u64,
    pub timestamp_ms: u64,
    /// Records with a `message-id` in this segment before `offset`.
    pub ids_before: u64,
}

/// What a sealed segment holds, so that opening a log never has to scan a sealed segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentSummary {
    pub base: u64,
    /// Offset after the last record.
    pub next: u64,
    /// File length in bytes, header included.
    pub bytes: u64,
    pub first_ts: u64,
    pub last_ts: u64,
    /// Records carrying a `message-id` header (so de-duplication rebuild can skip the rest).
    pub id_count: u64,
}

pub(super) fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}
pub(super) fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

pub fn encode_header(base: u64, created_ms: u64, flags: u32) -> [u8; SEGMENT_HEADER_LEN] {
    debug_assert_eq!(flags & !KNOWN_FLAGS, 0);
    let mut h = [0u8; SEGMENT_HEADER_LEN];
    h[0..4].copy_from_slice(&SEGMENT_MAGIC);
    h[4..8].copy_from_slice(&flags.to_le_bytes());
    h[8..16].copy_from_slice(&base.to_le_bytes());
    h[16..24].copy_from_slice(&created_ms.to_le_bytes());
    let crc = crc32fast::hash(&h[0..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Checks and decodes a segment header.
pub fn decode_header(h: &[u8]) -> Result<SegmentHeader, &'static str> {
    if h.len() < SEGMENT_HEADER_LEN {
        return Err("segment shorter than its header");
    }
    if h[0..3] != SEGMENT_MAGIC[0..3] {
        return Err("not a spool segment (bad magic)");
    }
    if h[3] != SEGMENT_MAGIC[3] {
        return Err("segment written by an unsupported format version");
    }
    if crc32fast::hash(&h[0..28]) != le_u32(h, 28) {
        return Err("segment header checksum mismatch");
    }
    if le_u32(h, 4) & !KNOWN_FLAGS != 0 || le_u32(h, 24) != 0 {
        return Err("segment header has unknown flags or reserved fields that are not zero");
    }
    Ok(SegmentHeader {
        base: le_u64(h, 8),
        flags: le_u32(h, 4),
    })
}

pub fn encode_entry(e: &IndexEntry, out: &mut Vec<u8>) {
    out.extend_from_slice(&e.offset.to_le_bytes());
    out.extend_from_slice(&e.position.to_le_bytes());
    out.extend_from_slice(&e.timestamp_ms.to_le_bytes());
    out.extend_from_slice(&e.ids_before.to_le_bytes());
}

pub fn decode_entries(b: &[u8]) -> Vec<IndexEntry> {
    b.chunks_exact(INDEX_ENTRY_LEN)
        .map(|c| IndexEntry {
            offset: le_u64(c, 0),
            position: le_u64(c, 8),
            timestamp_ms: le_u64(c, 16),
            ids_before: le_u64(c, 24),
        })
        .collect()
}

/// The footer appended to a segment's index when the segment is sealed.
pub fn encode_footer(entries_bytes: &[u8], s: &SegmentSummary) -> [u8; FOOTER_LEN] {
    let mut f = [0u8; FOOTER_LEN];
    f[0..4].copy_from_slice(&FOOTER_MAGIC);
    let count = (entries_bytes.len() / INDEX_ENTRY_LEN) as u32;
    f[4..8].copy_from_slice(&count.to_le_bytes());
    for (i, v) in [s.base, s.next, s.bytes, s.first_ts, s.last_ts, s.id_count]
        .into_iter()
        .enumerate()
    {
        f[8 + i * 8..16 + i * 8].copy_from_slice(&v.to_le_bytes());
    }
    let summary_crc = crc32fast::hash(&f[0..56]);
    f[56..60].copy_from_slice(&summary_crc.to_le_bytes());
    let mut h = crc32fast::Hasher::new();
    h.update(entries_bytes);
    h.update(&f[0..60]);
    f[60..64].copy_from_slice(&h.finalize().to_le_bytes());
    f
}

/// Parses a footer alone. `None` if it is not one, or its summary crc is present and wrong.
pub fn decode_footer(f: &[u8]) -> Option<Footer> {
    if f.len() != FOOTER_LEN || f[0..4] != FOOTER_MAGIC {
        return None;
    }
    let summary_crc = le_u32(f, 56);
    let summary_checked = summary_crc != 0 && summary_crc == crc32fast::hash(&f[0..56]);
    if summary_crc != 0 && !summary_checked {
        return None;
    }
    Some(Footer {
        entry_count: u64::from(le_u32(f, 4)),
        summary: SegmentSummary {
            base: le_u64(f, 8),
            next: le_u64(f, 16),
            bytes: le_u64(f, 24),
            first_ts: le_u64(f, 32),
            last_ts: le_u64(f, 40),
            id_count: le_u64(f, 48),
        },
        summary_checked,
    })
}

/// Parses a whole sealed index file (entries + footer). `None` if it is not one, for
/// example because the process stopped before the footer was written: the caller rebuilds.
pub fn decode_sealed_index(file: &[u8]) -> Option<(Vec<IndexEntry>, SegmentSummary)> {
    if file.len() < FOOTER_LEN || !(file.len() - FOOTER_LEN).is_multiple_of(INDEX_ENTRY_LEN) {
        return None;
    }
    let (entries, f) = file.split_at(file.len() - FOOTER_LEN);
    let footer = decode_footer(f)?;
    if footer.entry_count * INDEX_ENTRY_LEN as u64 != entries.len() as u64 {
        return None;
    }
    let mut h = crc32fast::Hasher::new();
    h.update(entries);
    h.update(&f[0..60]);
    if h.finalize() != le_u32(f, 60) {
        return None;
    }
    Some((decode_entries(entries), footer.summary))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_rejects_damage() {
        let h = encode_header(42, 7, 0);
        assert_eq!(decode_header(&h), Ok(SegmentHeader { base: 42, flags: 0 }));
        let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
        // Documented in ARCHITECTURE.md ("Segment header").
        assert_eq!(
            hex,
            "53504c01000000002a00000000000000070000000000000000000000ebb3c42f"
        );
        for i in 0..SEGMENT_HEADER_LEN {
            let mut d = h;
            d[i] ^= 0x10;
            assert!(decode_header(&d).is_err(), "byte {i}");
        }
        let f = encode_header(42, 7, FLAG_FOLLOWS_UNSYNCED);
        assert_eq!(
            decode_header(&f).map(|h| h.flags),
            Ok(FLAG_FOLLOWS_UNSYNCED)
        );
        // A flag this build does not know (a newer writer's) is refused, crc or not.
        let mut unknown = f;
        unknown[4] |= 0x80;
        let crc = crc32fast::hash(&unknown[0..28]);
        unknown[28..32].copy_from_slice(&crc.to_le_bytes());
        assert!(decode_header(&unknown).is_err());
    }

    #[test]
    fn sealed_index_round_trips() {
        let mut entries = Vec::new();
        encode_entry(
            &IndexEntry {
                offset: 1,
                position: 32,
                timestamp_ms: 9,
                ids_before: 0,
            },
            &mut entries,
        );
        let s = SegmentSummary {
            base: 1,
            next: 5,
            bytes: 100,
            first_ts: 9,
            last_ts: 10,
            id_count: 2,
        };
        let mut file = entries.clone();
        file.extend_from_slice(&encode_footer(&entries, &s));
        let (e, got) = decode_sealed_index(&file).expect("valid");
        assert_eq!(got, s);
        assert_eq!(e.len(), 1);
        file[3] ^= 1;
        assert!(decode_sealed_index(&file).is_none());
    }

    #[test]
    fn a_footer_summary_carries_its_own_crc_and_legacy_footers_without_it_still_decode() {
        let s = SegmentSummary {
            base: 7,
            next: 70,
            bytes: 4096,
            first_ts: 1,
            last_ts: 2,
            id_count: 3,
        };
        let f = encode_footer(&[], &s);
        let got = decode_footer(&f).expect("valid");
        assert!(got.summary_checked);
        assert_eq!((got.summary, got.entry_count), (s, 0));
        // Any damaged summary byte is refused (bytes 0..56 are under the summary crc).
        for i in 0..56 {
            let mut d = f;
            d[i] ^= 0x04;
            assert!(
                decode_footer(&d).is_none_or(|d| d.summary != s || !d.summary_checked),
                "byte {i}"
            );
        }
        // A footer from before the summary crc (zero there) decodes, unchecked, and a whole
        // sealed index with it is still valid (the last crc covers the entries).
        let mut legacy = f;
        legacy[56..60].fill(0);
        let mut h = crc32fast::Hasher::new();
        h.update(&legacy[0..60]);
        legacy[60..64].copy_from_slice(&h.finalize().to_le_bytes());
        let got = decode_footer(&legacy).expect("legacy");
        assert!(!got.summary_checked);
        assert_eq!(decode_sealed_index(&legacy).map(|(_, s)| s), Some(s));
    }
}
