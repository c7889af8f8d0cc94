//! Bounds on what sealed segments hold: open files and loaded indexes, least recently
//! used released first, so a log of thousands of segments stays within a few descriptors.
//! (Across logs, every segment's files, the active one's too, are under the instance's
//! bound on open files: `io::OpenFiles`, and `segment/files.rs` for what closes when.)
//!
//! **Invariant:** only sealed segments are released here.

use super::*;

/// Sealed segments whose index stays in memory (least recently used are unloaded).
const LOADED_INDEXES_MAX: usize = 8;

/// Unloads the least recently used sealed indexes beyond `LOADED_INDEXES_MAX`: a reader
/// going through a large log must not keep every segment's index (512 KiB per 64 MiB).
pub(super) fn evict_indexes(segs: &[Arc<Segment>]) {
    release_least_recent(
        segs,
        LOADED_INDEXES_MAX,
        Segment::loaded_index_used,
        Segment::unload_index,
    );
}

/// Sealed segments whose file stays open (least recently used are closed, see
/// `Segment::close_file`): descriptors per topic stay bounded however long the log.
pub(super) const OPEN_SEALED_MAX: usize = 8;

/// Closes the least recently used sealed files beyond `OPEN_SEALED_MAX`.
pub(super) fn close_files(segs: &[Arc<Segment>]) {
    release_least_recent(
        segs,
        OPEN_SEALED_MAX,
        Segment::open_file_used,
        Segment::close_file,
    );
}

/// Of the segments holding something (`used`: when it was last used), releases what the
/// least recently used hold beyond `max`.
fn release_least_recent(
    segs: &[Arc<Segment>],
    max: usize,
    used: impl Fn(&Segment) -> Option<u64>,
    release: impl Fn(&Segment),
) {
    let mut held: Vec<(u64, &Arc<Segment>)> = segs
        .iter()
        .filter_map(|s| used(s).map(|u| (u, s)))
        .collect();
    if held.len() <= max {
        return;
    }
    held.sort_unstable_by_key(|(u, _)| *u);
    for (_, s) in &held[..held.len() - max] {
        release(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::test_support::*;

    /// However many segments a log has, a read through all of them leaves at most
    /// `OPEN_SEALED_MAX` sealed files open, and open opens none for good.
    #[test]
    fn sealed_files_are_opened_on_demand_and_few_stay_open() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut log = log_in(tmp.path());
        append(&mut log, 200);
        let open_sealed = |log: &TopicLog| {
            read_lock(&log.reader().segments)
                .iter()
                .filter(|s| s.open_file_used().is_some())
                .count()
        };
        assert!(
            open_sealed(&log) <= OPEN_SEALED_MAX,
            "closed as the writer rolls"
        );
        drop(log);
        let log = log_in(tmp.path());
        let segments = log.reader().stats().segments;
        assert!(segments > 4 * OPEN_SEALED_MAX, "{segments}");
        assert_eq!(open_sealed(&log), 0, "open keeps no sealed file open");
        let mut at = 0;
        while let Ok(batch) = log.reader().read(at, 3, 1 << 20) {
            let Some(last) = batch.last() else { break };
            assert_eq!(batch[0].offset, at);
            at = last.offset + 1;
            assert!(open_sealed(&log) <= OPEN_SEALED_MAX);
        }
        assert_eq!(at, 200);
        // One record read from the start of every segment leaves bytes read ahead in each;
        // closing a file lets them go too.
        for seg in log.reader().snapshot() {
            let got = log.reader().read(seg.base, 1, 1 << 20).expect("read");
            assert_eq!(got.len(), 1);
        }
        let holding = log
            .reader()
            .snapshot()
            .iter()
            .filter(|s| s.holds_read_ahead())
            .count();
        assert!(holding > 0 && holding <= OPEN_SEALED_MAX + 1, "{holding}");
    }

    /// However many logs share a file system, the files they keep open stay within its
    /// bound: idle logs close their active segment and index, and appends and reads open
    /// them again. Under `Sync=None`'s and `Interval`'s layouts a file closes with writes
    /// no sync covered (the sweep does not sync), and the syncs the promises need still
    /// come: a power cut keeps every sealed segment, and after a sync of each log (what
    /// close and the interval thread do) every record. Under `Always`'s a file closes only
    /// once the sync of its records, which follows each append here, covered them.
    #[test]
    fn many_logs_stay_within_the_bound_on_open_files() {
        use crate::io::sim::SimFs;
        const MAX: usize = 6;
        let interval_cfg = LogConfig {
            seal_in_background: false,
            ..sim_cfg()
        };
        for (name, cfg) in [
            ("none", sim_cfg()),
            ("interval", interval_cfg),
            ("always", always_cfg()),
        ] {
            let sim = SimFs::new(5);
            sim.limit_open_files(MAX);
            let fs = Fs::new(Arc::new(sim.clone()));
            let dir = |i: usize| Path::new("/t").join(i.to_string());
            let mut logs: Vec<TopicLog> = (0..20)
                .map(|i| TopicLog::open(&fs, &dir(i), cfg, 0).expect("open"))
                .collect();
            // In use at once: one log's active segment and index, a sealing's file.
            let bound = MAX + 3;
            for _ in 0..3 {
                for log in &mut logs {
                    append(log, 3);
                    if cfg.visible_when_synced {
                        log.sync().expect("sync");
                    }
                    assert!(
                        fs.open_files().open() <= bound,
                        "{name}: {}",
                        fs.open_files().open()
                    );
                }
            }
            for log in &mut logs {
                log.finish_sealing().expect("sealed");
                let n = log.reader().read(0, 100, usize::MAX).expect("read").len();
                assert_eq!(n, 9, "{name}: read across closes");
                assert!(fs.open_files().open() <= bound, "{name}");
            }
            let closed = logs.iter().filter(|l| l.active().holds_files() == 0);
            assert!(closed.clone().count() >= logs.len() - MAX, "{name}");
            let unsynced = closed
                .filter(|l| !l.active().is_synced_to(l.active().written().bytes))
                .count();
            if cfg.visible_when_synced {
                assert_eq!(unsynced, 0, "{name}: closed only once synced");
            } else {
                assert!(unsynced > 0, "{name}: closed with unsynced writes");
            }
            let reopen = |cut: &SimFs, i: usize| {
                let log = TopicLog::open(&Fs::new(Arc::new(cut.clone())), &dir(i), cfg, 0)
                    .expect("reopen after a power cut");
                assert_dense(&log, 0);
                log.next()
            };
            // Cut now: every sealed segment is there (under `Always` every record).
            let cut = sim.crash_now();
            for (i, log) in logs.iter().enumerate() {
                let least = if cfg.visible_when_synced {
                    9
                } else {
                    log.active().base
                };
                assert!(reopen(&cut, i) >= least, "{name}: log {i}");
            }
            // Each log synced (the closed files opened again for it): every record.
            for log in &mut logs {
                log.sync().expect("sync");
            }
            let cut = sim.crash_now();
            drop(logs);
            for i in 0..20 {
                assert_eq!(reopen(&cut, i), 9, "{name}: log {i} synced");
            }
        }
    }

    /// A sync that must open a closed file again and cannot (out of descriptors) fails as
    /// a failed sync does: its caller gets the error, and the topic stops (`Poisoned`).
    /// No page was dropped, so the stopped topic's next sync (close's) still makes the
    /// records durable once the file opens again.
    #[test]
    fn a_sync_that_cannot_open_a_closed_file_again_stops_the_topic() {
        use crate::io::sim::SimFs;
        let sim = SimFs::new(3);
        sim.limit_open_files(2);
        let fs = Fs::new(Arc::new(sim.clone()));
        let cfg = LogConfig {
            seal_in_background: false,
            ..sim_cfg()
        };
        let mut a = TopicLog::open(&fs, Path::new("/t/a"), cfg, 0).expect("open a");
        append(&mut a, 1);
        let mut b = TopicLog::open(&fs, Path::new("/t/b"), cfg, 0).expect("open b");
        append(&mut b, 1);
        let active = a.active().clone();
        assert_eq!(active.holds_files(), 0, "b's files closed a's");
        assert!(!active.is_synced_to(active.written().bytes), "unsynced");
        sim.fail_opens_of(Some(&active.path));
        let failed = a.sync();
        assert!(
            matches!(&failed, Err(e) if !matches!(e, Error::Poisoned { .. })),
            "the open's error: {failed:?}"
        );
        assert!(active.poisoned().is_some(), "the topic stopped");
        sim.fail_opens_of(None);
        let stopped = active.sync(); // as `close` does, also in a stopped topic
        assert!(
            matches!(stopped, Err(Error::Poisoned { .. })),
            "{stopped:?}"
        );
        b.sync().expect("b goes on");
        let cut = sim.crash_now();
        let a = TopicLog::open(&Fs::new(Arc::new(cut)), Path::new("/t/a"), cfg, 0)
            .expect("reopen after a power cut");
        assert_eq!(a.next(), 1, "synced by the stopped topic's sync");
    }

    /// A writer appending, a reader tailing the active segment and a sync thread go on
    /// while another thread keeps asking the active segment to close its files (as a
    /// sweep does): every record is read once, in order, and none is lost by a reopen.
    #[test]
    fn a_tailing_reader_and_the_writer_go_on_while_their_files_close() {
        use crate::io::Holder;
        use std::sync::atomic::{AtomicBool, AtomicUsize};
        for cfg in [
            always_cfg(),
            LogConfig {
                segment_bytes: 16 << 10,
                ..sim_cfg()
            },
        ] {
            let tmp = tempfile::tempdir().expect("tempdir");
            let mut log = TopicLog::open(&Fs::real(), tmp.path(), cfg, 0).expect("open");
            let reader = log.reader().clone();
            let done = Arc::new(AtomicBool::new(false));
            let closes = Arc::new(AtomicUsize::new(0));
            let closer = {
                let (reader, done, closes) = (reader.clone(), done.clone(), closes.clone());
                std::thread::spawn(move || {
                    while !done.load(Ordering::Acquire) {
                        for seg in reader.snapshot() {
                            seg.release();
                            if seg.holds_files() == 0 {
                                closes.fetch_add(1, Ordering::AcqRel);
                            }
                        }
                        std::thread::yield_now();
                    }
                })
            };
            let tail = {
                let (reader, done) = (reader.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut at = 0u64;
                    loop {
                        let finished = done.load(Ordering::Acquire);
                        let batch = reader.read(at, 64, 1 << 20).expect("read");
                        for r in &batch {
                            assert_eq!(r.offset, at);
                            at += 1;
                        }
                        if finished && batch.is_empty() {
                            return at;
                        }
                    }
                })
            };
            for i in 0..300 {
                append(&mut log, 1);
                log.sync().expect("sync");
                // Every 50 records, until the closer has closed the files once more: the
                // closes interleave with the writes however the threads are scheduled (a
                // loaded machine may not run the closer at all otherwise).
                if i % 50 == 49 {
                    let seen = closes.load(Ordering::Acquire);
                    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
                    while closes.load(Ordering::Acquire) == seen {
                        assert!(std::time::Instant::now() < until, "the closer never closed");
                        std::thread::yield_now();
                    }
                }
            }
            done.store(true, Ordering::Release);
            closer.join().expect("closer");
            assert_eq!(tail.join().expect("reader"), 300);
            assert!(
                closes.load(Ordering::Acquire) >= 6,
                "the files were closed at times"
            );
            drop(log);
            let log = TopicLog::open(&Fs::real(), tmp.path(), cfg, 0).expect("reopen");
            assert_eq!(log.next(), 300);
            assert_dense(&log, 0);
        }
    }
}
