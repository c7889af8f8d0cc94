//! Bytes <-> structs. **Invariant:** nothing here does I/O or knows about files, topics or
//! groups; every length read from bytes is bounded before it is used.
//!
//! Files, by role:
//! - `record.rs`: the record frame (length, crc, offset, timestamp, headers, payload).
//! - `segment.rs`: the segment header, index entries and the sealed index's footer.
//! - `journal.rs`: the shared journal's header and entries (`Sync=Always`).

pub mod journal;
pub mod record;
pub mod segment;

/// Message headers: ordered string pairs. `message-id` is used for de-duplication.
pub type Headers = std::collections::BTreeMap<String, String>;
