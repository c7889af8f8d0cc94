//! Child processes for crash tests: the running test binary executed again with one
//! test selected and its role in the environment. The selected test does its part only
//! when the variable is set (it passes at once in an ordinary run).
#![allow(
    dead_code,
    reason = "each test file uses a different subset of these helpers"
)]

use std::process::{Command, ExitStatus, Stdio};

/// Runs the test named `test` of this test binary in a child process with `env` set
/// (and `SPOOL_CRASH_AT` unset unless `env` sets it); returns its exit status. The
/// child's stderr (panics, the crash point's line) is kept, its harness chatter not.
pub fn run(test: &str, env: &[(&str, &str)]) -> ExitStatus {
    let exe = std::env::current_exe().expect("current test binary");
    let mut cmd = Command::new(exe);
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env_remove("SPOOL_CRASH_AT")
        .stdout(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.status().expect("spawn child test process")
}

/// In a child test: the value of `var` that `run` set, or `None` in an ordinary run.
pub fn role(var: &str) -> Option<String> {
    std::env::var(var).ok()
}

/// Asserts that the child died by `std::process::abort` (a crash point, or the test's
/// own abort), not by a panic or a clean exit: the crash happened where it was meant to.
pub fn assert_aborted(status: ExitStatus) {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(6),
            "the child should abort (SIGABRT): {status:?}"
        );
    }
    #[cfg(not(unix))]
    assert!(!status.success(), "the child should abort: {status:?}");
}
