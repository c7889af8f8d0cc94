//! How long syncs take: a histogram of every `fdatasync` of a segment or index file and
//! every directory sync, process-wide (all instances of the process share it), read by
//! `Spool::metrics` and shown as `spool_fsync_seconds` by `spool serve`.
//!
//! **Invariant:** recording is a few relaxed atomic adds, never a lock: it sits on the
//! path of every durable publish.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets, in microseconds (Prometheus's `le`); a last bucket
/// (`+Inf`) holds the rest. From a fast NVMe flush to a stalled disk.
pub const SYNC_BUCKETS_US: [u64; 12] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000, 1_000_000, 10_000_000,
];

struct Histogram {
    /// Per bucket, not cumulative; the last is `+Inf`.
    counts: [AtomicU64; SYNC_BUCKETS_US.len() + 1],
    sum_ns: AtomicU64,
}

static SYNCS: Histogram = Histogram {
    counts: [const { AtomicU64::new(0) }; SYNC_BUCKETS_US.len() + 1],
    sum_ns: AtomicU64::new(0),
};

/// Notes one sync that took `took`.
pub fn record(took: Duration) {
    // In nanoseconds: 100.9 µs is above the 100 µs bound, not in it.
    let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
    let i = SYNC_BUCKETS_US.partition_point(|&le| le.saturating_mul(1000) < ns);
    SYNCS.counts[i].fetch_add(1, Ordering::Relaxed);
    SYNCS.sum_ns.fetch_add(ns, Ordering::Relaxed);
}

/// The sync latencies of this process so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SyncLatency {
    /// `(upper bound in µs, syncs that took at most that)`, cumulative, for each of
    /// [`SYNC_BUCKETS_US`]; syncs above the last bound count only in `count`.
    pub buckets: Vec<(u64, u64)>,
    /// Syncs in all.
    pub count: u64,
    /// Their total time.
    pub sum: Duration,
}

/// What [`record`] has noted so far.
pub fn snapshot() -> SyncLatency {
    let mut buckets = Vec::with_capacity(SYNC_BUCKETS_US.len());
    let mut running = 0u64;
    for (i, &le) in SYNC_BUCKETS_US.iter().enumerate() {
        running += SYNCS.counts[i].load(Ordering::Relaxed);
        buckets.push((le, running));
    }
    let count = running + SYNCS.counts[SYNC_BUCKETS_US.len()].load(Ordering::Relaxed);
    let sum = Duration::from_nanos(SYNCS.sum_ns.load(Ordering::Relaxed));
    SyncLatency {
        buckets,
        count,
        sum,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sync_lands_in_the_first_bucket_that_holds_it_and_counts_are_cumulative() {
        let before = snapshot();
        record(Duration::from_micros(100)); // at a bound: in that bucket
        record(Duration::from_nanos(100_900)); // just above it: in the next
        record(Duration::from_secs(60)); // past every bound: in count only
        let after = snapshot();
        let grew = |le: u64| {
            let at = |s: &SyncLatency| s.buckets.iter().find(|b| b.0 == le).expect("bucket").1;
            at(&after) - at(&before)
        };
        // Other tests of the process may sync meanwhile: at least ours are there.
        assert!(grew(50) <= grew(100) && grew(100) <= grew(250));
        assert!(grew(100) >= 1 && grew(250) >= 2);
        assert!(after.count - before.count >= 3);
        assert!(after.count > after.buckets.last().expect("last").1);
        assert!(after.sum - before.sum >= Duration::from_secs(60));
    }
}
