//! Resetting a group's cursor (earliest, latest, a time, an offset).
//! **Invariant:** a reset starts a new epoch: nothing handed out before it can be acked,
//! nacked or blamed into the new state, and its attempt rows go in the same commit.

use super::group_cell::group_ops;
use super::{Engine, OffsetReset};
use crate::catalog::Op;
use crate::error::Result;
use crate::format::record;

impl Engine {
    /// Moves the group's cursor to `to`, clamped to the retained log, in a new epoch.
    /// Returns the new cursor.
    pub fn reset(&self, topic: &str, group: &str, to: OffsetReset) -> Result<u64> {
        let (t, g) = self.existing_group(topic, group)?;
        let mut g = g.lock();
        // As every other group operation: records retention deleted under the cursor are
        // counted as skipped before the reset moves it (or the count depends on whether
        // anything looked at the group in between).
        self.clamp(&t, group, &mut g);
        let earliest = t.reader.earliest();
        let next = t.reader.next();
        let target = match to {
            OffsetReset::Earliest => earliest,
            OffsetReset::Latest => next,
            // Rounded down: a record is stamped with its millisecond's floor, so one
            // published at or after `ts` has a stamp of at least `ts`'s floor. A replay by
            // time may repeat the records of `ts`'s own millisecond; it never skips one.
            OffsetReset::Time(ts) => t.reader.offset_for_time(record::system_time_ms(ts))?,
            OffsetReset::Explicit(n) => n,
        }
        .clamp(earliest, next);
        g.reset(target);
        let mut ops = group_ops(topic, group, &mut g);
        ops.push(Op::ClearAttempts(topic.to_owned(), group.to_owned()));
        self.catalog.commit(&ops)?;
        tracing::info!(
            topic,
            group,
            cursor = target,
            epoch = g.epoch,
            "group reset"
        );
        Ok(target)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::format::Headers;
    use crate::io::Fs;
    use crate::options::Options;
    use crate::queue::engine::lock;
    use crate::queue::test_support::HOUR;

    /// An engine on the simulated file system whose rolls seal inline, with 1 KiB
    /// segments (seven 100-byte records each), under `sync`.
    fn small_segments(fs: &crate::io::sim::SimFs, sync: crate::options::SyncPolicy) -> Engine {
        let mut o = Options::new("/data");
        o.sync = sync;
        o.segment_bytes = 1024;
        Engine::open(Fs::new(Arc::new(fs.clone())), o, 1).expect("open")
    }

    /// Publishes a 100-byte record on `t` stamped `now_ms`; its offset and whether it is
    /// held (`Sync=Always`: not written until the sync thread, here nobody, writes it).
    fn publish_at(e: &Engine, now_ms: u64) -> (u64, bool) {
        let body = [7u8; 100];
        let h = Headers::new();
        let p = e.publish("t", &[(&body[..], &h)], now_ms).expect("publish");
        (p.offsets.first().expect("one"), p.held.is_some())
    }

    fn timestamps(e: &Engine) -> Vec<u64> {
        let records = e.fetch("t", 0, usize::MAX).expect("fetch");
        records.iter().map(|r| r.timestamp_ms).collect()
    }

    fn reset_to_time(e: &Engine, ms: u64) -> u64 {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
        e.reset("t", "g", crate::queue::OffsetReset::Time(t))
            .expect("reset")
    }

    /// A record published in the same millisecond as the time a replay starts from, after
    /// it, is stamped with that millisecond's floor: the reset must not skip it (it did
    /// when the time was rounded up; found by following the quickstart).
    #[test]
    fn a_time_reset_never_skips_a_record_of_the_same_millisecond() {
        let fs = crate::io::sim::SimFs::new(25);
        let e = small_segments(&fs, HOUR);
        drop(e.register_consumer("t", "g", 1, 0).expect("group"));
        publish_at(&e, 999);
        let (second, _) = publish_at(&e, 1000);
        let just_before = std::time::UNIX_EPOCH + std::time::Duration::from_micros(1_000_400);
        let cursor = e
            .reset("t", "g", crate::queue::OffsetReset::Time(just_before))
            .expect("reset");
        assert_eq!(
            cursor, second,
            "the record stamped 1000 ms may come after 1000.4 ms"
        );
        assert_eq!(reset_to_time(&e, 1000), second);
        assert_eq!(reset_to_time(&e, 1001), second + 1, "the log end");
    }

    /// Two publishers read the clock (1001, then 1000) and take the writer's lock in the
    /// other order, and the second one's record rolls: it is stamped 1001 too, and a
    /// `Time(1001 ms)` reset finds the first segment (it went to the log end when a new
    /// segment started its stamps from zero). Found by review.
    #[test]
    fn timestamps_never_go_back_at_a_roll() {
        let fs = crate::io::sim::SimFs::new(23);
        let e = small_segments(&fs, HOUR);
        drop(e.register_consumer("t", "g", 1, 0).expect("group"));
        for _ in 0..7 {
            publish_at(&e, 1001);
        }
        publish_at(&e, 1000);
        assert_eq!(e.topic_info("t").expect("info").segments, 2);
        assert_eq!(timestamps(&e), [1001; 8]);
        assert_eq!(reset_to_time(&e, 1001), 0);
    }

    /// The clock steps back an hour: records keep the newest stamp across rolls and a
    /// reopen (whose active segment is empty: killed between a roll and the write of the
    /// held record that rolled), and `Time` resets still find the first record at or
    /// after the time.
    #[test]
    fn timestamps_never_go_back_when_the_clock_does() {
        let fs = crate::io::sim::SimFs::new(24);
        let hour = 3_600_000;
        let before = 10 * hour;
        let e = small_segments(&fs, crate::options::SyncPolicy::Always);
        drop(e.register_consumer("t", "g", 1, 0).expect("group"));
        let (_, held) = publish_at(&e, before);
        assert!(held);
        while e.topic_info("t").expect("info").segments < 3 {
            let t = e.topic("t").expect("topic");
            lock(&t.writer).log.write_held().expect("write");
            publish_at(&e, before - hour);
        }
        // The record that rolled is held: the active segment is empty, now and after a kill.
        let crashed = fs.process_crash_now();
        drop(e);
        let e = small_segments(&crashed, crate::options::SyncPolicy::Always);
        assert_eq!(e.topic_info("t").expect("info").segments, 3);
        let written = timestamps(&e).len();
        assert!(written >= 8, "{written} records");
        assert_eq!(reset_to_time(&e, before - hour / 2), 0);
        assert_eq!(reset_to_time(&e, before), 0);
        assert_eq!(
            reset_to_time(&e, before + 1),
            written as u64,
            "none: the log end"
        );
        // After the reopen too: not older than the newest record before it.
        publish_at(&e, before - 2 * hour);
        e.sync_all().expect("sync");
        assert_eq!(timestamps(&e), vec![before; written + 1]);
    }

    /// A `Time` reset while the active segment is empty to readers (its first record, which
    /// rolled, still held for the sync thread): the search over the segments went to the
    /// log end, past every record of the sealed one. Found by review.
    #[test]
    fn a_time_reset_looks_past_an_empty_active_segment() {
        let fs = crate::io::sim::SimFs::new(26);
        let e = small_segments(&fs, crate::options::SyncPolicy::Always);
        drop(e.register_consumer("t", "g", 1, 0).expect("group"));
        let t = e.topic("t").expect("topic");
        while e.topic_info("t").expect("info").segments < 2 {
            lock(&t.writer).log.write_held().expect("write");
            publish_at(&e, 1000);
        }
        assert!(e.topic_info("t").expect("info").next > 1);
        assert_eq!(reset_to_time(&e, 1), 0);
        assert_eq!(reset_to_time(&e, 1000), 0);
        lock(&t.writer).log.write_held().expect("write");
        e.close().expect("close");
    }
}
