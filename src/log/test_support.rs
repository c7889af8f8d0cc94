//! Helpers shared by the log module's unit tests (test only).

use super::*;

pub(crate) fn append(log: &mut TopicLog, n: usize) {
    let headers = Headers::new();
    for _ in 0..n {
        let m = Append {
            payload: &[7u8; 200],
            headers: &headers,
            headers_len: record::headers_len(&headers),
        };
        log.append(&[m], 0).expect("append");
    }
}

/// `Sync=Always`'s layout: zeros ahead, sealed inline.
pub(crate) fn always_cfg() -> LogConfig {
    LogConfig {
        segment_bytes: 64 * 1024,
        index_interval_bytes: 4096,
        max_body: 1 << 16,
        preallocate: true,
        visible_when_synced: true,
        seal_in_background: false,
    }
}

pub(crate) fn ino(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).expect("meta").ino()
}

/// Every record from `from` on is there once, in order, up to `next`.
pub(crate) fn assert_dense(log: &TopicLog, from: u64) {
    // Under `visible_when_synced` readers see the last records once synced.
    log.active().sync().expect("sync");
    let recs = log
        .reader()
        .read(from, usize::MAX, usize::MAX)
        .expect("read");
    assert_eq!(recs.len() as u64, log.next() - from);
    for (r, want) in recs.iter().zip(from..) {
        assert_eq!(r.offset, want);
        assert_eq!(&r.payload[..], &[7u8; 200][..]);
    }
}

/// Appends `payloads` as one batch (no headers); the first one's offset.
pub(crate) fn append_all(log: &mut TopicLog, payloads: &[Vec<u8>]) -> u64 {
    let headers = Headers::new();
    log.append(&batch_of(payloads, &headers), 0)
        .expect("append")
}

/// One `Append` per payload, all with `headers`.
pub(crate) fn batch_of<'a>(payloads: &'a [Vec<u8>], headers: &'a Headers) -> Vec<Append<'a>> {
    payloads
        .iter()
        .map(|p| Append {
            payload: p,
            headers,
            headers_len: record::headers_len(headers),
        })
        .collect()
}

pub(crate) fn append_one(log: &mut TopicLog, payload: &[u8]) -> u64 {
    let headers = Headers::new();
    let m = Append {
        payload,
        headers: &headers,
        headers_len: record::headers_len(&headers),
    };
    log.append(&[m], 0).expect("append")
}

pub(crate) fn log_in(dir: &Path) -> TopicLog {
    let cfg = LogConfig {
        segment_bytes: 1024,
        index_interval_bytes: 4096,
        max_body: 1 << 16,
        preallocate: false,
        visible_when_synced: false,
        seal_in_background: false,
    };
    TopicLog::open(&Fs::real(), dir, cfg, 0).expect("open")
}

/// Appends until the log has `segments` segments; `false` if an append failed first.
pub(crate) fn append_until_segments(log: &mut TopicLog, segments: usize) -> bool {
    let headers = Headers::new();
    while log.reader().snapshot().len() < segments {
        let m = Append {
            payload: &[7u8; 200],
            headers: &headers,
            headers_len: record::headers_len(&headers),
        };
        if log.append(&[m], 0).is_err() {
            return false;
        }
    }
    true
}

pub(crate) fn wait_for(what: &str, done: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(start.elapsed().as_secs() < 30, "waited too long for {what}");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

pub(crate) fn sim_cfg() -> LogConfig {
    LogConfig {
        segment_bytes: 1024,
        index_interval_bytes: 128,
        max_body: 1 << 16,
        preallocate: false,
        visible_when_synced: false,
        seal_in_background: true,
    }
}

/// A log in `/t` on `SimFs::new(seed)` (`sim_cfg`) rolled once, its first segment
/// sealed.
pub(crate) fn rolled_once(seed: u64) -> (crate::io::sim::SimFs, TopicLog) {
    let fs = crate::io::sim::SimFs::new(seed);
    let mut log = TopicLog::open(
        &Fs::new(Arc::new(fs.clone())),
        Path::new("/t"),
        sim_cfg(),
        0,
    )
    .expect("open");
    assert!(append_until_segments(&mut log, 2));
    log.finish_sealing().expect("the first segment sealed");
    (fs, log)
}

/// A log on `SimFs::new(seed)` (`sim_cfg`) rolled once, its first segment sealed, then
/// rolled again from the ready spare file while every sync is held: that roll's
/// sealing has synced nothing yet. The caller lets the syncs go (`hold_syncs(false)`).
pub(crate) fn rolled_twice_with_syncs_held(seed: u64) -> (crate::io::sim::SimFs, TopicLog) {
    let (fs, mut log) = rolled_once(seed);
    wait_for_spare(&mut log);
    fs.hold_syncs(true);
    assert!(append_until_segments(&mut log, 3));
    (fs, log)
}

/// Reopens every power-cut image of `fs` (`cuts` of them) and checks it opens dense.
pub(crate) fn every_power_cut_opens(fs: &crate::io::sim::SimFs, cuts: usize, dir: &Path) {
    for cut in 0..cuts {
        let after = fs.crash_now();
        let log = TopicLog::open(&Fs::new(Arc::new(after)), dir, sim_cfg(), 0)
            .unwrap_or_else(|e| panic!("power cut {cut}: reopen failed: {e}"));
        let records = log.reader().read(0, usize::MAX, usize::MAX).expect("read");
        assert_eq!(
            records.len() as u64,
            log.next() - log.reader().earliest(),
            "power cut {cut}: dense"
        );
    }
}

/// Appends until the spare file is being made, then waits until it is ready.
pub(crate) fn wait_for_spare(log: &mut TopicLog) {
    let headers = Headers::new();
    while log.spare.is_none() {
        let m = Append {
            payload: &[7u8; 200],
            headers: &headers,
            headers_len: record::headers_len(&headers),
        };
        log.append(&[m], 0).expect("append");
    }
    wait_for("the spare file", || {
        log.spare.as_ref().is_some_and(|h| h.is_finished())
    });
}
