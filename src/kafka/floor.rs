//! One partition's ack floor under `Mode=Kafka`, and how it rides in Kafka's offset
//! commit.
//!
//! The committed offset is the group's cursor: the next unfinished offset. Acks above it
//! wait in `acked`; failed attempts wait in `failed`. Both travel in the commit's metadata
//! string, so a restart forgets neither (Kafka's own clients forget both).
//!
//! Metadata format (`v1`), offsets relative to the committed cursor (so they stay short),
//! fields separated by `|`:
//! `spool1|a:<o>,<o>-<o>|f:<o>=<n>@<not-before-ms>,…|d:<o>,…`
//! - `a`: acked offsets above the cursor, as ranges;
//! - `f`: failed attempts by offset, with the time before which it is not delivered again;
//! - `d`: offsets whose dead-letter copy may have been produced (an intent).
//!
//! Metadata that does not parse (written by another client) reads as "no acks above the
//! cursor": the safe side, as records are delivered again rather than lost.
//!
//! Offsets may have no record (`skip`): retention or a DeleteRecords took them before they
//! were read, compaction removed them, or they hold a transaction's marker. The poll
//! thread finds them as gaps between the offsets it reads. They count as finished, in
//! memory only: a restart reads past them again and finds them again.

use std::collections::{BTreeMap, BTreeSet};

const VERSION: &str = "spool1";

/// The metadata of `delete_group`'s tombstone (`delete_group.rs`). It does not parse as
/// a floor, so it reads as one with nothing above its cursor.
pub(super) const DELETED: &str = "spool1|deleted";

/// Kafka's default `offset.metadata.max.bytes`: a commit with longer metadata is refused.
pub(super) const METADATA_MAX_BYTES: usize = 4096;

/// A floor may record at most this many offsets above its cursor (gaps between acked
/// ranges, failures, intents): `MAX_RECORDED` of the longest entries fit in
/// `METADATA_MAX_BYTES` (a test checks it). Consumers' `max_in_flight` is bounded by it.
pub(super) const MAX_RECORDED: usize = 100;

/// Offsets expanded from one metadata string, at most: metadata that any client of the
/// group can write must not make spool allocate without bound.
const MAX_EXPANDED: u64 = 1 << 22;

/// A failed message's attempts so far and when it may be delivered again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Failed {
    pub attempts: u32,
    /// Milliseconds since the epoch; 0: at once.
    pub not_before_ms: u64,
}

/// One partition's finished and failed offsets around its cursor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Floor {
    cursor: u64,
    acked: BTreeSet<u64>,
    failed: BTreeMap<u64, Failed>,
    intents: BTreeSet<u64>,
    /// Offsets with no record above the cursor, as ranges: start -> end (exclusive).
    gone: BTreeMap<u64, u64>,
}

impl Floor {
    /// The floor of a committed `cursor` with its `metadata`.
    pub fn from_commit(cursor: u64, metadata: &str) -> Floor {
        let mut f = Floor {
            cursor,
            ..Floor::default()
        };
        if f.parse(metadata).is_none() {
            f = Floor {
                cursor,
                ..Floor::default()
            };
        }
        f.normalise();
        f
    }

    /// The next unfinished offset.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Whether `offset` is finished (acked or dead-lettered).
    pub fn is_done(&self, offset: u64) -> bool {
        offset < self.cursor || self.acked.contains(&offset) || self.is_gone(offset)
    }

    fn is_gone(&self, offset: u64) -> bool {
        self.gone
            .range(..=offset)
            .next_back()
            .is_some_and(|(_, end)| offset < *end)
    }

    /// Offsets `from..to` have no record (see the module's notes): they count as
    /// finished. Returns whether the cursor moved.
    pub fn skip(&mut self, from: u64, to: u64) -> bool {
        let from = from.max(self.cursor);
        if from >= to {
            return false;
        }
        let before = self.cursor;
        self.gone.insert(from, to);
        self.normalise();
        self.cursor != before
    }

    /// The failed attempts recorded for `offset`.
    pub fn failed(&self, offset: u64) -> Option<Failed> {
        self.failed.get(&offset).copied()
    }

    /// Every failed offset not yet finished, in offset order.
    pub fn failures(&self) -> impl Iterator<Item = (u64, Failed)> + '_ {
        self.failed.iter().map(|(o, f)| (*o, *f))
    }

    /// Dead-letter intents not yet finished.
    pub fn intents(&self) -> impl Iterator<Item = u64> + '_ {
        self.intents.iter().copied()
    }

    /// Finishes `offset` (an ack, or a dead-letter copy made); the cursor moves over every
    /// finished offset at its front. Returns whether anything changed.
    pub fn finish(&mut self, offset: u64) -> bool {
        if self.is_done(offset) {
            return false;
        }
        if offset == self.cursor
            && self.acked.is_empty()
            && self.failed.is_empty()
            && self.intents.is_empty()
        {
            // The common case, acks in order and nothing pending: only the cursor moves,
            // as `normalise` would move it, without a set touched.
            self.cursor += 1;
            return true;
        }
        self.acked.insert(offset);
        self.normalise();
        true
    }

    /// Records a failed attempt of `offset`; returns the attempts so far.
    pub fn fail(&mut self, offset: u64, not_before_ms: u64) -> u32 {
        debug_assert!(!self.is_done(offset), "a finished offset cannot fail");
        let f = self.failed.entry(offset).or_insert(Failed {
            attempts: 0,
            not_before_ms: 0,
        });
        f.attempts = f.attempts.saturating_add(1);
        f.not_before_ms = not_before_ms;
        f.attempts
    }

    /// Records that `offset`'s dead-letter copy is about to be produced.
    pub fn intend_dead_letter(&mut self, offset: u64) {
        self.intents.insert(offset);
    }

    /// The offset-commit metadata that carries this floor.
    pub fn metadata(&self) -> String {
        let c = self.cursor;
        let acked = ranges(&self.acked)
            .map(|(a, b)| {
                if a == b {
                    (a - c).to_string()
                } else {
                    format!("{}-{}", a - c, b - c)
                }
            })
            .collect::<Vec<_>>()
            .join(",");
        let failed = self
            .failed
            .iter()
            .map(|(o, f)| format!("{}={}@{}", o - c, f.attempts, f.not_before_ms))
            .collect::<Vec<_>>()
            .join(",");
        let intents = self
            .intents
            .iter()
            .map(|o| (o - c).to_string())
            .collect::<Vec<_>>()
            .join(",");
        format!("{VERSION}|a:{acked}|f:{failed}|d:{intents}")
    }

    fn parse(&mut self, metadata: &str) -> Option<()> {
        let mut parts = metadata.split('|');
        if parts.next()? != VERSION {
            return None;
        }
        let acked = parts.next()?.strip_prefix("a:")?;
        let failed = parts.next()?.strip_prefix("f:")?;
        let intents = parts.next()?.strip_prefix("d:")?;
        let at = |rel: &str| rel.parse::<u64>().ok()?.checked_add(self.cursor);
        let mut expanded = 0u64;
        for range in acked.split(',').filter(|s| !s.is_empty()) {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            let (a, b) = (at(a)?, at(b)?);
            expanded = expanded.checked_add(b.checked_sub(a)? + 1)?;
            if expanded > MAX_EXPANDED {
                return None;
            }
            self.acked.extend(a..=b);
        }
        for entry in failed.split(',').filter(|s| !s.is_empty()) {
            let (o, rest) = entry.split_once('=')?;
            let (n, ms) = rest.split_once('@')?;
            let f = Failed {
                attempts: n.parse().ok()?,
                not_before_ms: ms.parse().ok()?,
            };
            self.failed.insert(at(o)?, f);
        }
        for o in intents.split(',').filter(|s| !s.is_empty()) {
            self.intents.insert(at(o)?);
        }
        Some(())
    }

    /// Moves the cursor over finished offsets and drops what lies below it.
    fn normalise(&mut self) {
        loop {
            if self.acked.remove(&self.cursor) {
                self.failed.remove(&self.cursor);
                self.intents.remove(&self.cursor);
                self.cursor += 1;
            } else if let Some(end) = self
                .gone
                .range(..=self.cursor)
                .next_back()
                .map(|(_, end)| *end)
                .filter(|end| *end > self.cursor)
            {
                self.cursor = end;
            } else {
                break;
            }
        }
        let cursor = self.cursor;
        self.gone.retain(|_, end| *end > cursor);
        self.acked.retain(|o| *o >= cursor);
        self.failed.retain(|o, _| *o >= cursor);
        self.intents.retain(|o| *o >= cursor);
        for o in &self.acked {
            self.failed.remove(o);
            self.intents.remove(o);
        }
    }
}

/// Consecutive runs of `set` as inclusive ranges.
fn ranges(set: &BTreeSet<u64>) -> impl Iterator<Item = (u64, u64)> + '_ {
    let mut it = set.iter().copied().peekable();
    std::iter::from_fn(move || {
        let start = it.next()?;
        let mut end = start;
        while it.peek() == Some(&(end + 1)) {
            end += 1;
            it.next();
        }
        Some((start, end))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_with_no_record_count_as_finished() {
        let mut f = Floor::from_commit(10, "");
        f.finish(11);
        f.fail(14, 0);
        // 12-13 gone (a marker, compaction): above the cursor, 10 still unfinished.
        assert!(!f.skip(12, 14));
        assert!(f.is_done(12) && f.is_done(13) && !f.is_done(14));
        assert_eq!(f.cursor(), 10);
        assert!(f.finish(10));
        assert_eq!(f.cursor(), 14, "over 11 acked and 12-13 gone");
        // Retention took 14-99 (14 had failed once) before they were read again.
        assert!(f.skip(14, 100));
        assert_eq!(f.cursor(), 100);
        assert_eq!(f.failed(14), None);
        assert_eq!(f.metadata(), "spool1|a:|f:|d:");
        // Below the cursor: nothing to do.
        assert!(!f.skip(50, 90));
    }

    #[test]
    fn out_of_order_acks_wait_above_the_cursor() {
        let mut f = Floor::from_commit(10, "");
        assert!(f.finish(12));
        assert!(f.finish(13));
        assert_eq!(
            f.cursor(),
            10,
            "the floor never passes 10, neither acked nor dead"
        );
        assert!(f.is_done(12) && !f.is_done(11));
        assert!(f.finish(10));
        assert_eq!(f.cursor(), 11);
        assert!(f.finish(11));
        assert_eq!(f.cursor(), 14, "after finishing 13 the cursor is 14");
        assert!(!f.finish(12), "finishing twice changes nothing");
    }

    #[test]
    fn metadata_round_trips_acks_failures_and_intents() {
        let mut f = Floor::from_commit(100, "");
        for o in [102, 103, 104, 107] {
            f.finish(o);
        }
        f.fail(100, 0);
        f.fail(100, 5_000);
        f.fail(101, 0);
        f.intend_dead_letter(105);
        let m = f.metadata();
        assert_eq!(m, "spool1|a:2-4,7|f:0=2@5000,1=1@0|d:5");
        assert_eq!(Floor::from_commit(100, &m), f);
    }

    /// The worst case `MAX_RECORDED` allows, with the longest numbers, fits Kafka's
    /// default limit.
    #[test]
    fn the_recorded_offsets_fit_the_metadata_limit() {
        let cursor = 9_000_000_000_000_000_000;
        let mut f = Floor::from_commit(cursor, "");
        for i in 0..MAX_RECORDED as u64 {
            // A failure, then an acked record, then a gap: the most entries per offset.
            // Not-before times are capped at now + MAX_MS: 13 digits until the year 2286.
            let o = cursor + 1_000_000 + 3 * i;
            f.fail(o, 9_999_999_999_999);
            f.fail(o, 9_999_999_999_999);
            f.finish(o + 1);
            f.intend_dead_letter(o);
        }
        let m = f.metadata();
        assert!(m.len() <= METADATA_MAX_BYTES, "{} bytes", m.len());
        assert_eq!(Floor::from_commit(cursor, &m), f);
    }

    #[test]
    fn metadata_cannot_make_the_floor_allocate_without_bound() {
        let many =
            (0..200u64).map(|i| format!("{}-{}", i * 100_000_000, i * 100_000_000 + 99_999_999));
        let m = format!("spool1|a:{}|f:|d:", many.collect::<Vec<_>>().join(","));
        assert_eq!(Floor::from_commit(0, &m), Floor::from_commit(0, ""));
    }

    #[test]
    fn foreign_or_damaged_metadata_reads_as_nothing_above_the_cursor() {
        for m in [
            "",
            "hello",
            "spool1|a:5-3|f:|d:",
            "spool1|a:1-99999999999|f:|d:",
            "spool1|a:x|f:|d:",
            "spool1|a:|f:1=x@0|d:",
            "spool2|a:1|f:|d:",
        ] {
            let f = Floor::from_commit(0, m);
            assert_eq!(f, Floor::from_commit(0, ""), "{m:?}");
        }
        let top = u64::MAX - 1;
        let overflow = Floor::from_commit(top, "spool1|a:5|f:|d:");
        assert_eq!(overflow, Floor::from_commit(top, ""));
    }
}
