//! Entry points for the fuzz targets in `fuzz/` (not part of the stable API). Each one
//! must never panic on any input; a panic is a bug.

use std::path::Path;

use bytes::Bytes;

use crate::format::Headers;
use crate::format::record::{self, Frame};
use crate::format::segment as seg;
use crate::io::Fs;
use crate::log::{LogConfig, TopicLog};

/// Decodes every frame in `data` like a reader does; re-encodes what decodes and checks
/// that the bytes round-trip.
pub fn decode_records(data: &[u8]) {
    let buf = Bytes::copy_from_slice(data);
    let mut at = 0usize;
    while at < buf.len() {
        match record::decode(&buf.slice(at..), 1 << 20) {
            Frame::Complete { record, len } => {
                let mut again = Vec::new();
                record::encode(
                    &mut again,
                    record.offset,
                    record.timestamp_ms,
                    &record.headers,
                    &record.payload,
                );
                match record::decode(&Bytes::from(again), 1 << 20) {
                    Frame::Complete { record: back, .. } => {
                        assert_eq!(back, record, "a decoded record re-encodes to itself");
                    }
                    other => panic!("a re-encoded record does not decode: {other:?}"),
                }
                at += len;
            }
            Frame::Incomplete { .. } | Frame::Corrupt(_) => break,
        }
    }
    let _ = seg::decode_header(data);
    let _ = seg::decode_sealed_index(data);
    let _ = seg::decode_footer(data);
    let _ = seg::decode_entries(data);
}

/// Writes `data` as the active segment (base 0) of a topic in `dir`, with `index` as its
/// index file, opens the log (recovery), and checks what it kept: dense offsets, every
/// record readable, and appends continue densely. `dir` must be empty.
///
/// The same bytes are first recovered without an index (a full scan from the header),
/// which is strict. With an index, open trusts the records before the last valid index
/// entry without reading them (it scans only the tail), so damage there is reported by
/// reads as `Error::Corrupt` instead of by open; that is accepted only when the full scan
/// disagrees about where the log ends, i.e. when there really is such damage.
pub fn recover_active_segment(dir: &Path, data: &[u8], index: &[u8]) {
    let Some(full_next) = recover_and_check(&dir.join("full"), data, &[], None) else {
        return;
    };
    if !index.is_empty() {
        recover_and_check(&dir.join("t"), data, index, Some(full_next));
    }
}

/// One recovery of `data` + `index` in `topic`; returns the recovered `next`, or `None` if
/// open refused the files.
fn recover_and_check(
    topic: &Path,
    data: &[u8],
    index: &[u8],
    full_scan_next: Option<u64>,
) -> Option<u64> {
    let cfg = LogConfig {
        // Above libFuzzer's default input size (4 KiB), yet small: the writer preallocates
        // up to a segment's size and recovery reads that zero tail back, on every input.
        segment_bytes: 16 << 10,
        index_interval_bytes: 64,
        max_body: 1 << 20,
        preallocate: true,
        visible_when_synced: false,
        seal_in_background: false,
    };
    std::fs::create_dir_all(topic).ok()?;
    let mut bytes = seg::encode_header(0, 0, 0).to_vec();
    // Half the inputs get a valid header so the fuzzer reaches the record scan quickly.
    if data.first().is_some_and(|b| b & 1 == 1) {
        bytes.clear();
    }
    bytes.extend_from_slice(data);
    std::fs::write(topic.join("00000000000000000000.log"), &bytes).ok()?;
    std::fs::write(topic.join("00000000000000000000.idx"), index).ok()?;
    let mut log = TopicLog::open(&Fs::real(), topic, cfg, 1).ok()?;
    let next = log.next();
    match log.reader().read(0, usize::MAX, usize::MAX) {
        Ok(records) => {
            assert_eq!(records.len() as u64, next, "recovered offsets are dense");
            for (i, r) in records.iter().enumerate() {
                assert_eq!(r.offset, i as u64);
            }
        }
        Err(crate::error::Error::Corrupt { .. }) if full_scan_next.is_some_and(|f| f != next) => {}
        Err(e) => panic!("a recovered log does not read back: {e:?}"),
    }
    let h = Headers::new();
    let o = log
        .append(
            &[crate::log::Append {
                payload: b"after",
                headers: &h,
                headers_len: 1,
            }],
            2,
        )
        .expect("append after recovery");
    assert_eq!(o, next);
    drop(log);
    let log = TopicLog::open(&Fs::real(), topic, cfg, 3).expect("reopen after recovery");
    assert_eq!(log.next(), next + 1);
    Some(next)
}

/// Parses a connection string; never panics.
pub fn parse_connection_string(s: &str) {
    if let Ok(o) = crate::options::Options::parse(s) {
        assert!(o.validate().is_ok());
    }
}

/// Encodes headers into a frame and decodes them back unchanged.
pub fn headers_round_trip(headers: &Headers, payload: &[u8]) {
    let mut buf = Vec::new();
    let n = record::encode(&mut buf, 1, 2, headers, payload);
    assert_eq!(
        n,
        record::RECORD_OVERHEAD + record::headers_len(headers) + payload.len()
    );
    match record::decode(&Bytes::from(buf), usize::MAX) {
        Frame::Complete { record, .. } => {
            assert_eq!(&record.headers, headers);
            assert_eq!(&record.payload[..], payload);
        }
        other => panic!("encoded frame does not decode: {other:?}"),
    }
}
