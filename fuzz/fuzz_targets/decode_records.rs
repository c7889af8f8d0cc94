//! Record frames, segment headers, index entries and sealed-index footers decoded from
//! arbitrary bytes: never a panic, and every record that decodes re-encodes to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    spool::fuzzing::decode_records(data);
});
