//! Guards that `Spool::close` releases the data directory for an immediate reopen even
//! while another thread of the process spawns child processes.
//!
//! Regression (found by the issue-3 tests): the directory lock is a `flock` on
//! `<dir>/LOCK`. A child process forked by any other thread duplicates every descriptor,
//! `LOCK` included, and keeps the lock until it execs (the descriptor is `O_CLOEXEC`, so
//! only that window). A `close()` followed at once by `open()` failed with
//! `Error::Locked` although no other instance existed (99 of 100 immediate reopens with one
//! thread spawning `/bin/true` in a loop). Opening now retries for `LOCK_WAIT` (250 ms).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use spool::{Error, Spool};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_then_open_succeeds_while_other_threads_spawn_processes() {
    let stop = Arc::new(AtomicBool::new(false));
    let spawning = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = std::process::Command::new("true").status();
            }
        })
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = format!("Data Source={}", dir.path().display());
    let mut locked = 0;
    for _ in 0..200 {
        match Spool::open(&conn) {
            Ok(mq) => mq.close().await.unwrap(),
            Err(Error::Locked { .. }) => locked += 1,
            Err(e) => panic!("{e:?}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    spawning.join().unwrap();
    assert_eq!(
        locked, 0,
        "{locked} of 200 reopens right after close() were Locked"
    );
}
