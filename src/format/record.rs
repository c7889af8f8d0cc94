//! Record frames: `len u32 | crc32 u32 | body`, body = `offset u64 | timestamp_ms u64 |
//! headers_len u32 | headers (postcard) | payload`. All integers little-endian.
//!
//! The crc covers the length field and the body, so a torn length is caught as well as a
//! torn body. Each record carries its own offset so a misdirected read is caught.

use bytes::Bytes;

use super::Headers;

/// `len u32 | crc32 u32`.
pub const FRAME_HEADER_LEN: usize = 8;
/// `offset u64 | timestamp_ms u64 | headers_len u32`.
pub const BODY_FIXED_LEN: usize = 8 + 8 + 4;
/// Bytes a record costs beyond its encoded headers and payload.
pub const RECORD_OVERHEAD: usize = FRAME_HEADER_LEN + BODY_FIXED_LEN;
const _: () = assert!(RECORD_OVERHEAD == 28);

/// Milliseconds since the Unix epoch (the on-disk time unit); 0 before the epoch.
pub fn system_time_ms(t: std::time::SystemTime) -> u64 {
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
        Err(_) => 0,
    }
}

/// A decoded record; the payload shares the buffer it was read into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub(crate) offset: u64,
    pub(crate) timestamp_ms: u64,
    pub(crate) headers: Headers,
    pub(crate) payload: Bytes,
}

impl Record {
    /// The record's offset in its topic.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// When the record was appended (monotonic within a topic).
    pub fn timestamp(&self) -> std::time::SystemTime {
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(self.timestamp_ms)
    }
    /// Milliseconds since the Unix epoch, as stored.
    pub fn timestamp_ms(&self) -> u64 {
        self.timestamp_ms
    }
    /// The message body. Cloning it is cheap: it shares the buffer it was read into.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }
    /// The headers it was published with.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }
}

/// Encoded size of `headers` (postcard), without allocating.
pub fn headers_len(headers: &Headers) -> usize {
    if headers.is_empty() {
        // postcard writes an empty map as its length, the varint 0.
        return 1;
    }
    postcard::experimental::serialized_size(headers).unwrap_or(usize::MAX)
}

/// Appends one framed record to `buf`. `headers_len` must be `headers_len(headers)`.
pub fn encode(
    buf: &mut Vec<u8>,
    offset: u64,
    timestamp_ms: u64,
    headers: &Headers,
    payload: &[u8],
) -> usize {
    // One reservation for all but non-empty headers (fewer capacity checks on the publish
    // path; callgrind in 455c0b6).
    buf.reserve(RECORD_OVERHEAD + 1 + payload.len());
    let start = encode_fixed(buf, offset, timestamp_ms, headers);
    buf.extend_from_slice(payload);
    // The body in one piece: two crc updates, not three (the crc of a small record is
    // a fifth of a 16 B batch publish's instructions).
    seal_frame(buf, start, &[])
}

/// Appends one framed record to `buf` without its payload: the frame's bytes up to where
/// the payload starts, with the length and crc of the whole frame (payload included).
/// The caller writes `payload` right after them (`log/append.rs` hands a big one to the
/// kernel as it is, instead of copying it into `buf`). Returns the bytes appended.
pub fn encode_head(
    buf: &mut Vec<u8>,
    offset: u64,
    timestamp_ms: u64,
    headers: &Headers,
    payload: &[u8],
) -> usize {
    let start = encode_fixed(buf, offset, timestamp_ms, headers);
    seal_frame(buf, start, payload) - payload.len()
}

/// Appends the frame's fixed part and encoded headers (length and crc left zero);
/// returns where the frame starts.
fn encode_fixed(buf: &mut Vec<u8>, offset: u64, timestamp_ms: u64, headers: &Headers) -> usize {
    let start = buf.len();
    // The fixed part in one piece.
    let mut fixed = [0u8; RECORD_OVERHEAD];
    fixed[FRAME_HEADER_LEN..FRAME_HEADER_LEN + 8].copy_from_slice(&offset.to_le_bytes());
    fixed[FRAME_HEADER_LEN + 8..FRAME_HEADER_LEN + 16].copy_from_slice(&timestamp_ms.to_le_bytes());
    buf.extend_from_slice(&fixed);
    let hlen_at = buf.len() - 4;
    if headers.is_empty() {
        // postcard's empty map, the varint 0 (see `headers_len`).
        buf.push(0);
    } else {
        let taken = std::mem::take(buf);
        // Serialising a BTreeMap<String, String> into a Vec cannot fail (only a full
        // fixed-size buffer can), so the buffer always comes back.
        *buf = match postcard::to_extend(headers, taken) {
            Ok(b) => b,
            Err(_) => unreachable!("postcard into a Vec does not fail"),
        };
    }
    let hlen = (buf.len() - hlen_at - 4) as u32;
    buf[hlen_at..hlen_at + 4].copy_from_slice(&hlen.to_le_bytes());
    start
}

/// Fills in the length and crc of the frame at `start` of `buf`, whose body is the rest
/// of `buf` followed by `after` (not in `buf`). Returns the frame's length.
fn seal_frame(buf: &mut [u8], start: usize, after: &[u8]) -> usize {
    let body_len = (buf.len() - start - FRAME_HEADER_LEN + after.len()) as u32;
    buf[start..start + 4].copy_from_slice(&body_len.to_le_bytes());
    // The same bytes as ever: the length field, then the body, payload last.
    let mut h = crc_hasher();
    h.update(&buf[start..start + 4]);
    h.update(&buf[start + FRAME_HEADER_LEN..]);
    if !after.is_empty() {
        h.update(after);
    }
    let crc = h.finalize();
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    buf.len() - start + after.len()
}

/// A fresh crc hasher. `Hasher::new` probes the CPU's features on every call (5% of the
/// instructions of consuming 100 B records, measured with callgrind); a copy of one made
/// once does not.
fn crc_hasher() -> crc32fast::Hasher {
    static TEMPLATE: std::sync::LazyLock<crc32fast::Hasher> =
        std::sync::LazyLock::new(crc32fast::Hasher::new);
    TEMPLATE.clone()
}

/// What a byte range holds at its start.
#[derive(Debug)]
pub enum Frame {
    /// A whole, checksum-valid record of `len` bytes.
    Complete { record: Record, len: usize },
    /// The frame continues past the end of the buffer (`needed` bytes in all).
    Incomplete { needed: usize },
    /// The bytes are not a valid frame.
    Corrupt(&'static str),
}

/// Checks, then decodes, the frame at the start of `buf`. `max_body` bounds the length
/// field before anything is allocated. `buf` is shared so payloads are zero-copy slices.
pub fn decode(buf: &Bytes, max_body: usize) -> Frame {
    decode_at(buf, 0, max_body)
}

/// As [`decode`], for the frame starting at `at` (no intermediate `Bytes` per record).
pub fn decode_at(buf: &Bytes, at: usize, max_body: usize) -> Frame {
    let b = &buf[at.min(buf.len())..];
    if b.len() < FRAME_HEADER_LEN {
        return Frame::Incomplete {
            needed: FRAME_HEADER_LEN,
        };
    }
    let body_len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
    if body_len < BODY_FIXED_LEN {
        return Frame::Corrupt("frame shorter than a record body");
    }
    if body_len > max_body {
        return Frame::Corrupt("frame length over the configured limit");
    }
    let total = FRAME_HEADER_LEN + body_len;
    if b.len() < total {
        return Frame::Incomplete { needed: total };
    }
    let stored_crc = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let mut h = crc_hasher();
    h.update(&b[0..4]);
    h.update(&b[FRAME_HEADER_LEN..total]);
    if h.finalize() != stored_crc {
        return Frame::Corrupt("checksum mismatch");
    }
    let body = &b[FRAME_HEADER_LEN..total];
    let offset = u64::from_le_bytes(body[0..8].try_into().unwrap_or([0; 8]));
    let timestamp_ms = u64::from_le_bytes(body[8..16].try_into().unwrap_or([0; 8]));
    let hlen = u32::from_le_bytes(body[16..20].try_into().unwrap_or([0; 4])) as usize;
    if hlen > body_len - BODY_FIXED_LEN {
        return Frame::Corrupt("headers length past the end of the record");
    }
    let hstart = FRAME_HEADER_LEN + BODY_FIXED_LEN;
    let hbytes = &b[hstart..hstart + hlen];
    let headers: Headers = if hbytes == [0] {
        Headers::new()
    } else {
        match postcard::from_bytes(hbytes) {
            Ok(h) => h,
            Err(_) => return Frame::Corrupt("headers do not decode"),
        }
    };
    let payload = buf.slice(at + hstart + hlen..at + total);
    Frame::Complete {
        record: Record {
            offset,
            timestamp_ms,
            headers,
            payload,
        },
        len: total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_bytes_of_a_record() {
        let mut h = Headers::new();
        h.insert("k".into(), "v".into());
        let mut buf = Vec::new();
        let n = encode(&mut buf, 7, 1_000, &h, b"hi");
        // body 27 = 20 fixed + 5 headers (map len 1, "k", "v" each len-prefixed) + 2 payload
        assert_eq!(n, buf.len());
        let hex: String = buf.iter().map(|b| format!("{b:02x}")).collect();
        // Documented in ARCHITECTURE.md ("Record frame").
        assert_eq!(
            hex,
            "1b0000008de31ba00700000000000000e8030000000000000500000001016b01766869"
        );
        let bytes = Bytes::from(buf);
        match decode(&bytes, 1 << 20) {
            Frame::Complete { record, len } => {
                assert_eq!(len, n);
                assert_eq!(record.offset, 7);
                assert_eq!(record.timestamp_ms, 1_000);
                assert_eq!(record.headers, h);
                assert_eq!(&record.payload[..], b"hi");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    /// A head followed by its payload is the frame `encode` makes, crc included.
    #[test]
    fn a_head_and_its_payload_are_the_whole_frame() {
        let mut h = Headers::new();
        h.insert("k".into(), "v".into());
        for payload in [&b""[..], b"hi", &[9u8; 5000]] {
            let mut whole = vec![1, 2, 3];
            let n = encode(&mut whole, 7, 1_000, &h, payload);
            let mut split = vec![1, 2, 3];
            let head = encode_head(&mut split, 7, 1_000, &h, payload);
            split.extend_from_slice(payload);
            assert_eq!(head + payload.len(), n);
            assert_eq!(split, whole);
        }
    }

    #[test]
    fn every_truncation_is_incomplete_and_every_bit_flip_is_caught() {
        let mut buf = Vec::new();
        encode(&mut buf, 1, 2, &Headers::new(), b"payload");
        for cut in 0..buf.len() {
            let b = Bytes::copy_from_slice(&buf[..cut]);
            assert!(
                matches!(decode(&b, 1 << 20), Frame::Incomplete { .. }),
                "cut {cut}"
            );
        }
        for bit in 0..buf.len() * 8 {
            let mut c = buf.clone();
            c[bit / 8] ^= 1 << (bit % 8);
            let b = Bytes::from(c);
            assert!(
                !matches!(decode(&b, 1 << 20), Frame::Complete { .. }),
                "bit {bit} flipped yet decoded"
            );
        }
    }
}
