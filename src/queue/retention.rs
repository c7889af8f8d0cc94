//! Retention: deleting a topic's oldest segments, and what its groups see of that.
//! **Invariant:** a group never hands out or counts a record below the log's earliest:
//! records deleted before the group finished them are counted as `skipped` (`clamp`).

use super::engine::lock;
use super::group::Group;
use super::{Engine, Topic};
use crate::catalog::Op;
use crate::error::Result;
use crate::names;
use crate::options::RetentionPolicy;

impl Engine {
    /// Applies retention to every topic; forgets de-duplication ids of deleted records.
    /// `wait`: a segment still being sealed in the background is waited for (an explicit
    /// call) instead of left for the next check (the background one, which must not hold
    /// a writer's lock across a sync). Every topic is tried; the first failure is returned
    /// after (one poisoned topic must not keep the others' old segments).
    pub fn apply_retention(&self, now_ms: u64, wait: bool) -> Result<()> {
        // Not while a snapshot links files: an explicit call waits for it, the background
        // one leaves the pass for its next check.
        let _files = if wait {
            self.deletions.read().unwrap_or_else(|e| e.into_inner())
        } else {
            match self.deletions.try_read() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return Ok(()),
            }
        };
        let mut first = Ok(());
        for t in self.all_topics() {
            let before = t.reader.earliest();
            let r = self.retention_of(&t);
            if r.keeps_everything() {
                // Nothing to delete: its writer's lock is not taken (the background pass
                // of thousands of such topics costs next to nothing).
                continue;
            }
            // Before the writer's lock: a group's lock comes first.
            let finished = match r.policy {
                RetentionPolicy::Acked => self.finished_by_all(&t),
                RetentionPolicy::Limits => None,
            };
            let mut w = lock(&t.writer);
            if wait && let Err(e) = w.log.finish_sealing() {
                first = first.and(Err(e));
                continue;
            }
            let target = w.log.retention_target(now_ms, r.bytes, r.ms, finished);
            // Against the start under the writer's lock: `before` may be older (another
            // pass ran in between), and a start already durable needs no second commit.
            let removed = if target > t.reader.earliest() {
                // The new start durable first: a deletion that fails half-way (or a power
                // cut) cannot bring deleted records back at the next open.
                self.catalog
                    .commit(&[Op::SetTopicStart(t.name.clone(), target)])
                    .and_then(|()| w.log.delete_before(target))
            } else {
                Ok(before)
            };
            // Also after a failed deletion: the records are gone for readers already.
            let earliest = t.reader.earliest();
            w.dedup.forget_below(earliest);
            drop(w);
            if earliest > before {
                // A group behind the new start has a slot or span freed by its clamp (run
                // by the woken consumer's next try): its waiting consumers must look again.
                self.visible(&t.name);
            }
            first = first.and(removed.map(|_| ()));
        }
        first
    }

    /// Kafka's deleteRecords: the records of `topic` before `offset` (clamped to the log's
    /// end) are gone for every reader, now and after a reopen; whole segments below it are
    /// deleted from disk. Groups behind it resume there and count the skip (`clamp`, at
    /// their next operation). Returns the topic's earliest offset after it; an offset at
    /// or below it changes nothing. An unknown topic is not created (earliest 0).
    pub fn delete_records_before(&self, topic: &str, offset: u64) -> Result<u64> {
        names::check(topic)?;
        let Some(t) = self.topic(topic) else {
            return Ok(0);
        };
        // Waits for a snapshot that is linking files (see `Engine::deletions`).
        let _files = self.deletions.read().unwrap_or_else(|e| e.into_inner());
        let mut w = lock(&t.writer);
        let target = offset.min(t.reader.next());
        let before = t.reader.earliest();
        if target <= before {
            return Ok(before);
        }
        // Durable first: a reopen sets it again before any reader looks.
        self.catalog
            .commit(&[Op::SetTopicStart(topic.to_owned(), target)])?;
        let deleted = w.log.delete_before(target);
        w.dedup.forget_below(t.reader.earliest());
        drop(w);
        tracing::info!(topic, earliest = target, "records deleted");
        // Groups behind the new start have records to skip (and slots to free).
        self.visible(topic);
        deleted.map(|_| t.reader.earliest())
    }

    /// Moves `g` up to the log's earliest record. Records it had not finished count as
    /// skipped, and the loss is logged.
    pub(super) fn clamp(&self, t: &Topic, group: &str, g: &mut Group) {
        let skipped = g.clamp_to(t.reader.earliest());
        if skipped > 0 {
            tracing::warn!(topic = %t.name, group = %group, skipped, cursor = g.cursor,
                "retention deleted records the group had not finished; resuming at the earliest retained");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::error::Error;
    use crate::format::Headers;
    use crate::io::Fs;
    use crate::options::Options;

    /// An explicit retention pass goes on past a topic whose pending sealing failed (the
    /// topic was poisoned while its sealing's sync was in flight). Found by review.
    #[test]
    fn retention_goes_on_past_a_poisoned_topic() {
        let fs = crate::io::sim::SimFs::new(17);
        let mut o = Options::new("/data");
        o.sync = crate::options::SyncPolicy::None;
        o.segment_bytes = crate::options::MIN_SEGMENT_BYTES;
        o.retention_bytes = 1;
        let e = Engine::open(Fs::new(Arc::new(fs.clone())), o, 1).expect("open");
        let body = [1u8; 300];
        let h = Headers::new();
        let publish = |topic: &str| e.publish(topic, &[(&body[..], &h)], 1);
        let rolled = |topic: &str| e.topic_info(topic).expect("info").segments > 1;
        let segment = |topic: &str, base: u64| {
            std::path::Path::new("/data/topics")
                .join(topic)
                .join(crate::log::segment::segment_file_name(base))
        };
        let release = fs.faults_cleared_on_drop();
        // "a" sorts first: its failure comes before "b" is looked at.
        publish("a").expect("a");
        fs.hold_syncs_of(Some(&segment("a", 0)));
        while !rolled("a") {
            publish("a").expect("a");
        }
        // The record that rolled starts the new segment.
        let active = segment("a", e.topic_info("a").expect("info").next - 1);
        while !rolled("b") {
            publish("b").expect("b");
        }
        // a's first segment is sealing, inside its sync; then a write of a fails.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while fs.syncs_waiting() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "a's sealing never synced"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        fs.fail_writes_to(Some(&active));
        assert!(publish("a").is_err(), "a poisoned");
        drop(release);
        let retention = e.apply_retention(1, true);
        assert!(
            matches!(retention, Err(Error::Poisoned { .. })),
            "{retention:?}"
        );
        assert!(
            e.topic_info("b").expect("b").earliest > 0,
            "b's retention ran"
        );
    }
}
