//! Structured inputs shared by the fuzz targets and the seed generator
//! (`tests/make_seeds.rs`), so that both agree on how raw fuzzer bytes are split.

use std::collections::BTreeMap;

use arbitrary::Arbitrary;

/// Input of `recover_segment`.
#[derive(Arbitrary, Debug, PartialEq, Eq)]
pub struct RecoverInput<'a> {
    /// The index file's bytes (entries, possibly followed by a sealed footer).
    pub index: &'a [u8],
    /// The segment file's bytes. When the first byte is even, a valid segment header
    /// (base 0) is prepended, so that half the inputs reach the record scan at once (see
    /// `spool::fuzzing::recover_active_segment`).
    pub segment: &'a [u8],
}

/// Input of `headers`.
#[derive(Arbitrary, Debug, PartialEq, Eq)]
pub struct HeadersInput<'a> {
    pub headers: BTreeMap<String, String>,
    pub payload: &'a [u8],
}
