//! Arbitrary headers and payload encoded into a record frame and decoded back unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spool_fuzz::HeadersInput;

fuzz_target!(|input: HeadersInput<'_>| {
    spool::fuzzing::headers_round_trip(&input.headers, input.payload);
});
