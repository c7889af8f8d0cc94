//! Bytes <-> structs. **Invariant:** nothing here does I/O or knows about files, topics or
//! groups; every length read from bytes is bounded before it is used.

pub mod record;
pub mod segment;
