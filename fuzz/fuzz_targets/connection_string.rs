//! The connection-string parser on arbitrary UTF-8: an `Err` or options that validate,
//! never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|s: &str| {
    spool::fuzzing::parse_connection_string(s);
});
