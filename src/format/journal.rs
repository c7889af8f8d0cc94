//! The shared journal's bytes (`journal/`): a header, then entries. Bytes only, no I/O.
//!
//! Header (32 bytes): `magic[4] | reserved u32 (0) | generation u64 | reserved[12] (0) |
//! crc32 u32` (crc of bytes 0..28).
//!
//! Entry: `len u32 | crc32 u32 | generation u64 | position u64 | base u64 |
//! segment_header_crc u32 | name_len u16 | reserved u16 (0) | name | data`.
//! - `len` is the whole entry's; the crc covers bytes 8..len.
//! - `name` is the topic's, `base` names its segment file, `position` is where `data`
//!   goes in that file.
//! - `segment_header_crc` is the crc stored in that segment's header: a file of the same
//!   name made later (retention reused the name, a topic was made again) has another.
//!
//! **Invariant:** an entry counts only if its generation is the header's and its crc
//! matches; the first one that does not ends the journal.

use super::segment::{le_u32, le_u64};

/// `b"SPJ"` + format version 1.
pub const JOURNAL_MAGIC: [u8; 4] = [b'S', b'P', b'J', 1];
pub const JOURNAL_HEADER_LEN: usize = 32;
/// An entry's fixed part, before its name.
pub const ENTRY_HEAD_LEN: usize = 40;
/// The longest name an entry carries (topic names are shorter: `names.rs`).
pub const NAME_MAX: usize = 255;

/// The header of a journal of `generation`.
pub fn encode_header(generation: u64) -> [u8; JOURNAL_HEADER_LEN] {
    let mut h = [0u8; JOURNAL_HEADER_LEN];
    h[0..4].copy_from_slice(&JOURNAL_MAGIC);
    h[8..16].copy_from_slice(&generation.to_le_bytes());
    let crc = crc32fast::hash(&h[0..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The generation a header names; `None` if it is not a whole journal header.
pub fn decode_header(h: &[u8]) -> Option<u64> {
    let h = h.get(..JOURNAL_HEADER_LEN)?;
    if h[0..4] != JOURNAL_MAGIC || crc32fast::hash(&h[0..28]) != le_u32(h, 28) {
        return None;
    }
    Some(le_u64(h, 8))
}

/// Where an entry's bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target<'a> {
    pub topic: &'a str,
    pub base: u64,
    pub segment_header_crc: u32,
    pub position: u64,
}

/// An entry read back.
#[derive(Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    pub target: Target<'a>,
    pub data: &'a [u8],
}

/// Appends an entry of `generation` to `out`: its head, then `data_len` bytes that
/// `fill` writes into the slice it is given; then seals the entry's length and crc.
/// Returns `fill`'s error, leaving `out` as it was.
pub fn append_entry<E>(
    out: &mut Vec<u8>,
    generation: u64,
    target: Target<'_>,
    data_len: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<(), E> {
    debug_assert!(target.topic.len() <= NAME_MAX, "topic names are shorter");
    let start = out.len();
    let name = &target.topic.as_bytes()[..target.topic.len().min(NAME_MAX)];
    let len = ENTRY_HEAD_LEN + name.len() + data_len;
    out.resize(start + len, 0);
    let e = &mut out[start..];
    e[0..4].copy_from_slice(&(len as u32).to_le_bytes());
    e[8..16].copy_from_slice(&generation.to_le_bytes());
    e[16..24].copy_from_slice(&target.position.to_le_bytes());
    e[24..32].copy_from_slice(&target.base.to_le_bytes());
    e[32..36].copy_from_slice(&target.segment_header_crc.to_le_bytes());
    e[36..38].copy_from_slice(&(name.len() as u16).to_le_bytes());
    e[ENTRY_HEAD_LEN..ENTRY_HEAD_LEN + name.len()].copy_from_slice(name);
    if let Err(err) = fill(&mut e[ENTRY_HEAD_LEN + name.len()..]) {
        out.truncate(start);
        return Err(err);
    }
    let crc = crc32fast::hash(&e[8..]);
    e[4..8].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// The entry of `generation` at the start of `b`, and its length; `None` where the
/// journal ends (zeros, another generation, a torn or damaged entry).
pub fn decode_entry(b: &[u8], generation: u64) -> Option<(Entry<'_>, usize)> {
    let head = b.get(..ENTRY_HEAD_LEN)?;
    let len = le_u32(head, 0) as usize;
    if len < ENTRY_HEAD_LEN || len > b.len() || le_u64(head, 8) != generation {
        return None;
    }
    let e = &b[..len];
    if crc32fast::hash(&e[8..]) != le_u32(e, 4) {
        return None;
    }
    let name_len = usize::from(u16::from_le_bytes([e[36], e[37]]));
    if name_len > NAME_MAX || ENTRY_HEAD_LEN + name_len > len || e[38..40] != [0, 0] {
        return None;
    }
    let topic = std::str::from_utf8(&e[ENTRY_HEAD_LEN..ENTRY_HEAD_LEN + name_len]).ok()?;
    let target = Target {
        topic,
        base: le_u64(e, 24),
        segment_header_crc: le_u32(e, 32),
        position: le_u64(e, 16),
    };
    let data = &e[ENTRY_HEAD_LEN + name_len..];
    Some((Entry { target, data }, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(topic: &str) -> Target<'_> {
        Target {
            topic,
            base: 42,
            segment_header_crc: 0xdead_beef,
            position: 4096,
        }
    }

    fn entry(generation: u64, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        append_entry::<()>(&mut out, generation, target("orders"), data.len(), |d| {
            d.copy_from_slice(data);
            Ok(())
        })
        .expect("fill");
        out
    }

    #[test]
    fn a_header_and_entries_read_back_and_the_journal_ends_at_the_first_other() {
        assert_eq!(decode_header(&encode_header(7)), Some(7));
        let mut torn = encode_header(7);
        torn[9] ^= 1;
        assert_eq!(decode_header(&torn), None);

        let mut j = entry(7, b"abc");
        j.extend(entry(7, b""));
        j.extend(entry(6, b"older generation"));
        let (first, n) = decode_entry(&j, 7).expect("first");
        assert_eq!(first.target, target("orders"));
        assert_eq!(first.data, b"abc");
        let (second, m) = decode_entry(&j[n..], 7).expect("second");
        assert_eq!(second.data, b"");
        assert_eq!(
            decode_entry(&j[n + m..], 7),
            None,
            "another generation ends it"
        );
        assert_eq!(decode_entry(&[0u8; 64], 7), None, "zeros end it");
    }

    #[test]
    fn a_damaged_or_cut_entry_ends_the_journal() {
        let e = entry(1, b"payload bytes");
        for cut in 0..e.len() {
            assert_eq!(decode_entry(&e[..cut], 1), None, "cut at {cut}");
        }
        for i in 0..e.len() {
            let mut bad = e.clone();
            bad[i] ^= 0x40;
            assert_eq!(decode_entry(&bad, 1), None, "byte {i} flipped");
        }
    }

    #[test]
    fn a_failed_fill_leaves_the_buffer_as_it_was() {
        let mut out = b"kept".to_vec();
        let r = append_entry(&mut out, 1, target("t"), 10, |_| Err("read failed"));
        assert_eq!(r, Err("read failed"));
        assert_eq!(out, b"kept");
    }
}
