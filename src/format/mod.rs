//! Bytes <-> structs. **Invariant:** nothing here does I/O or knows about files, topics or
//! groups; every length read from bytes is bounded before it is used.

pub mod record;
pub mod segment;

/// Message headers: ordered string pairs. `message-id` is used for de-duplication.
pub type Headers = std::collections::BTreeMap<String, String>;
