//! Recovery of an arbitrary byte string as a topic's active segment, next to an arbitrary
//! index file: opening must not panic, and what it keeps must be dense, readable and
//! appendable. Each input gets a fresh directory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spool_fuzz::RecoverInput;

/// Recovery syncs what it truncates; on tmpfs a sync costs nothing, which makes this
/// target about a hundred times faster than on a disk.
const FAST_TMP: &str = "/dev/shm";

fuzz_target!(|input: RecoverInput<'_>| {
    let dir = if std::path::Path::new(FAST_TMP).is_dir() {
        tempfile::tempdir_in(FAST_TMP)
    } else {
        tempfile::tempdir()
    };
    let Ok(dir) = dir else {
        return;
    };
    spool::fuzzing::recover_active_segment(dir.path(), input.segment, input.index);
});
