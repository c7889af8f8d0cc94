//! Crash points for tests: when the environment variable `SPOOL_CRASH_AT` names a point,
//! the process aborts there (no unwinding, no destructors: like a kill at that instant).
//! Production runs never set it; the check is one cached load.

use std::sync::OnceLock;

static CRASH_AT: OnceLock<Option<String>> = OnceLock::new();

/// Aborts the process if `SPOOL_CRASH_AT` equals `point`.
pub(crate) fn hit(point: &str) {
    let at = CRASH_AT.get_or_init(|| std::env::var("SPOOL_CRASH_AT").ok());
    if at.as_deref() == Some(point) {
        eprintln!("spool: crash point {point} reached (SPOOL_CRASH_AT)");
        std::process::abort();
    }
}
