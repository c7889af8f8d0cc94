//! Dead-lettering: copying a message that reached the attempt limit to its dead-letter
//! topic and finishing it in its group, also when a stop interrupted that.
//! **Invariant:** at most one copy per message and group: the intent is durable before
//! the copy, the copy is synced before the cursor moves, and an open finishes an
//! interrupted one after looking for its copy.

use super::group::Group;
use super::group_cell::group_ops;
use super::{Engine, Topic, X_CONSUMER_GROUP, X_DEAD_LETTER_REASON, X_DELIVERY_ATTEMPTS};
use super::{X_ORIGINAL_OFFSET, X_ORIGINAL_TIMESTAMP, X_ORIGINAL_TOPIC};
use crate::catalog::{AttemptRecord, DeadLetterIntent, Op};
use crate::error::Result;
use crate::format::record;
use crate::names;
use crate::options::MAX_NACK_REASON_BYTES;

/// What the dead-letter headers can add to a message's: the reason (cut to
/// `MAX_NACK_REASON_BYTES`) and five short values (two names, three numbers), with their
/// keys and postcard's length prefixes. So a message published at both limits still gets a
/// copy a log can read back.
pub(super) const DEAD_LETTER_HEADER_BYTES: usize = MAX_NACK_REASON_BYTES + 4096;
const _: () = assert!(
    X_ORIGINAL_TOPIC.len()
        + X_ORIGINAL_OFFSET.len()
        + X_ORIGINAL_TIMESTAMP.len()
        + X_CONSUMER_GROUP.len()
        + X_DELIVERY_ATTEMPTS.len()
        + X_DEAD_LETTER_REASON.len()
        + 2 * crate::names::MAX_NAME_LEN
        + 3 * 20
        + 12 * 5
        + 5
        <= 4096
);

impl Engine {
    /// Where `topic`'s messages go once they reach the attempt limit. `None` when
    /// dead-lettering is off, or `topic` is a dead-letter topic and chains are off.
    pub(super) fn dead_letter_topic(&self, topic: &str) -> Option<String> {
        let o = &self.opts;
        if o.max_delivery_attempts == 0 {
            return None;
        }
        if !o.dead_letter_chain && topic.ends_with(&o.dead_letter_suffix) {
            return None;
        }
        Some(format!("{topic}{}", o.dead_letter_suffix))
    }

    /// Dead-letters the redeliveries whose attempts reached the limit without a nack
    /// finishing them (charged by `charge_panicked`), before anything else is handed out.
    pub(super) fn dead_letter_charged_out(
        &self,
        t: &Topic,
        group: &str,
        g: &mut Group,
    ) -> Result<()> {
        let Some(dlq) = self.dead_letter_topic(&t.name) else {
            g.charged_out.clear();
            return Ok(());
        };
        let max = self.opts.max_delivery_attempts;
        while let Some(&o) = g.charged_out.last() {
            // Finished, or reset, since it was charged: nothing to do.
            let due =
                g.redeliver.contains(&o) && g.attempts.get(&o).is_some_and(|a| a.attempts >= max);
            if due {
                let now_ms = record::system_time_ms(std::time::SystemTime::now());
                // A failed copy (the dead-letter topic stopped by a failed write) must not
                // stop the group's hand-outs: as after a nack whose copy failed, the
                // record stays in its group, delivered again, and its next nack (or the
                // next open) tries the copy again.
                if let Err(e) = self.dead_letter(t, group, g, o, None, &dlq, now_ms) {
                    tracing::warn!(topic = %t.name, group, offset = o, error = %e,
                        "could not dead-letter a record a panic charged; it stays in its group");
                }
            }
            g.charged_out.pop();
        }
        Ok(())
    }

    /// Copies `offset` to `dlq` and finishes it: intent (durable), copy (synced), then
    /// cursor move + intent removal in one commit. A stop anywhere in between is finished
    /// by `finish_intents` on open without a second copy. `false`: retention had deleted
    /// the record, so it is finished as skipped, without a copy. (A retry after an I/O
    /// error cannot add a second copy: a failed copy poisons the dead-letter topic and a
    /// failed commit makes redb refuse every later one, until a reopen finishes the
    /// intent, which keeps the first try's start.)
    #[expect(
        clippy::too_many_arguments,
        reason = "the group's state under its lock, and what a nack adds"
    )]
    pub(super) fn dead_letter(
        &self,
        t: &Topic,
        group: &str,
        g: &mut Group,
        offset: u64,
        counted: Option<AttemptRecord>,
        dlq: &str,
        now_ms: u64,
    ) -> Result<bool> {
        let topic = t.name.as_str();
        // `counted`: the attempt a nack counts, counted in memory only once the intent that
        // carries it is durable (a failure before leaves the count as a reopen finds it).
        let a = counted.unwrap_or_else(|| g.attempts.get(&offset).cloned().unwrap_or_default());
        let dlq_t = self.topic_or_create(dlq, now_ms)?;
        let next = dlq_t.reader.next();
        // A retry keeps the first try's start: its copy may have been written but not
        // synced (which poisons the dead-letter topic), and a reopen in the same boot
        // still holds it; an intent pointing past it would have open copy it again.
        let dlq_from = match self.catalog.intent(topic, group, offset)? {
            Some(first) if first.dlq_topic == dlq => first.dlq_from.min(next),
            _ => next,
        };
        let intent = DeadLetterIntent {
            epoch: g.epoch,
            dlq_topic: dlq.to_owned(),
            dlq_from,
            attempts: a.attempts,
            reason: a.last_reason.clone(),
        };
        self.catalog.commit(&[
            Op::PutAttempt(topic.to_owned(), group.to_owned(), offset, a.clone()),
            Op::PutIntent(topic.to_owned(), group.to_owned(), offset, intent.clone()),
        ])?;
        g.attempts.insert(offset, a.clone());
        crate::fault::hit("dead_letter.after_intent");
        let copied = self
            .append_dead_letter_copy(t, group, offset, &intent, now_ms)?
            .is_some();
        crate::fault::hit("dead_letter.after_copy");
        g.finish_past_limit(offset, copied);
        self.commit_intent_done(topic, group, g, offset)?;
        tracing::info!(
            topic,
            group,
            offset,
            dlq,
            attempts = a.attempts,
            copied,
            "dead-lettered"
        );
        Ok(copied)
    }

    /// Appends `intent`'s copy of `offset` to its dead-letter topic, synced. `None`:
    /// retention had deleted the record, so there is nothing to copy.
    fn append_dead_letter_copy(
        &self,
        t: &Topic,
        group: &str,
        offset: u64,
        intent: &DeadLetterIntent,
        now_ms: u64,
    ) -> Result<Option<u64>> {
        let Some(rec) = t
            .reader
            .read(offset, 1, 1)?
            .pop()
            .filter(|r| r.offset == offset)
        else {
            tracing::warn!(topic = %t.name, offset, "record to dead-letter is gone (retention); nothing copied");
            return Ok(None);
        };
        let mut h = rec.headers.clone();
        h.insert(X_ORIGINAL_TOPIC.into(), t.name.clone());
        h.insert(X_ORIGINAL_OFFSET.into(), offset.to_string());
        h.insert(X_ORIGINAL_TIMESTAMP.into(), rec.timestamp_ms.to_string());
        h.insert(X_CONSUMER_GROUP.into(), group.to_owned());
        h.insert(X_DELIVERY_ATTEMPTS.into(), intent.attempts.to_string());
        h.insert(X_DEAD_LETTER_REASON.into(), intent.reason.clone());
        self.append_durable(&intent.dlq_topic, &rec.payload, &h, now_ms)
            .map(Some)
    }

    /// Completes dead-letters interrupted by a stop: the copy is looked for after the
    /// intent's `dlq_from`, appended only if absent, then the cursor moves.
    pub(super) fn finish_intents(&self, now_ms: u64) -> Result<()> {
        for (topic, group, offset, intent) in self.catalog.intents()? {
            let Some(t) = self.topic(&topic) else {
                self.catalog
                    .commit(&[Op::DeleteIntent(topic, group, offset)])?;
                continue;
            };
            let found = self.find_copy(&intent, &topic, &group, offset)?;
            let g = self.group(&t, &group)?;
            let mut g = g.lock();
            // Finished since (acked after a failed dead-letter) or reset since: the intent is
            // stale, and a copy now would be a copy of a message nobody gave up on.
            // Or the record is gone: a power cut under `Sync=None` took it (and the group
            // was cut back at open), so there is nothing to copy or finish.
            let stale =
                !g.unfinished(offset) || intent.epoch != g.epoch || offset >= t.reader.next();
            if !stale {
                let copied = found
                    || self
                        .append_dead_letter_copy(&t, &group, offset, &intent, now_ms)?
                        .is_some();
                g.materialize_to(offset);
                g.finish_past_limit(offset, copied);
            }
            self.commit_intent_done(&topic, &group, &mut g, offset)?;
            tracing::warn!(topic = %topic, group = %group, offset, copy_existed = found, stale,
                "finished an interrupted dead-letter");
        }
        Ok(())
    }

    /// Whether `intent`'s dead-letter topic holds a copy of `offset` of `topic` for
    /// `group`, at or after the intent's `dlq_from`.
    fn find_copy(
        &self,
        intent: &DeadLetterIntent,
        topic: &str,
        group: &str,
        offset: u64,
    ) -> Result<bool> {
        let Some(d) = self.topic(&intent.dlq_topic) else {
            return Ok(false);
        };
        let mut at = intent.dlq_from;
        loop {
            let batch = d.reader.read(at, 1024, 16 << 20)?;
            let Some(last) = batch.last() else {
                return Ok(false);
            };
            at = last.offset + 1;
            let found = batch.iter().any(|r| {
                r.headers.get(X_ORIGINAL_TOPIC).map(String::as_str) == Some(topic)
                    && r.headers.get(X_CONSUMER_GROUP).map(String::as_str) == Some(group)
                    && r.headers.get(X_ORIGINAL_OFFSET) == Some(&offset.to_string())
            });
            if found {
                return Ok(true);
            }
        }
    }

    /// Commits the group as it is now, with the removal of `offset`'s intent: the last
    /// step of a dead-letter, finished or found stale.
    fn commit_intent_done(
        &self,
        topic: &str,
        group: &str,
        g: &mut Group,
        offset: u64,
    ) -> Result<()> {
        let mut ops = group_ops(topic, group, g);
        ops.push(Op::DeleteIntent(topic.to_owned(), group.to_owned(), offset));
        self.catalog.commit(&ops)
    }

    /// After an unclean stop: dead-letters offsets whose charged attempts reached the limit.
    pub(super) fn dead_letter_exhausted(&self, now_ms: u64) -> Result<()> {
        let max = self.opts.max_delivery_attempts;
        for t in self.all_topics() {
            let Some(dlq) = self.dead_letter_topic(&t.name) else {
                continue;
            };
            if let Err(e) = names::check(&dlq) {
                // A topic whose dead-letter name is too long (dead-lettering turned on, or
                // the suffix changed, since): as a nack does while running, its records stay
                // (an ack still finishes them), and the rest of the directory opens.
                tracing::warn!(topic = %t.name, error = %e,
                    "records at the delivery limit cannot be dead-lettered; they stay in their groups");
                continue;
            }
            for (name, g) in t.groups_snapshot() {
                let mut g = g.lock();
                let due: Vec<u64> = g
                    .attempts
                    .iter()
                    .filter(|(o, a)| a.attempts >= max && g.redeliver.contains(o))
                    .map(|(o, _)| *o)
                    .collect();
                for o in due {
                    self.dead_letter(&t, &name, &mut g, o, None, &dlq, now_ms)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::format::Headers;
    use crate::io::Fs;
    use crate::options::Options;
    use crate::queue::test_support::HOUR;

    /// Dead-lettering was off (`Max Delivery Attempts=0`) for a 249-character topic, whose
    /// dead-letter name would be too long; a record of it has had five nacks; the process
    /// is killed and reopened with dead-lettering on. The unclean open's dead-lettering of
    /// exhausted records failed the whole open, every time. Found by review.
    #[test]
    fn an_unclean_open_leaves_records_it_cannot_dead_letter_in_their_group() {
        let fs = crate::io::sim::SimFs::new(27);
        let long = "x".repeat(249);
        let open = |fs: &crate::io::sim::SimFs, max: u32| {
            let mut o = Options::new("/data");
            o.sync = HOUR;
            o.max_delivery_attempts = max;
            Engine::open(Fs::new(Arc::new(fs.clone())), o, 1)
        };
        let e = open(&fs, 0).expect("open");
        let body = [1u8; 8];
        let h = Headers::new();
        e.publish(&long, &[(&body[..], &h)], 1).expect("publish");
        for n in 1..=5 {
            let out = e.nack_cursor(&long, "g", 0, "bad", None, 1).expect("nack");
            assert_eq!(out.delivery_attempt, n);
        }
        let crashed = fs.process_crash_now();
        drop(e);
        let e = open(&crashed, 5).expect("the unclean open");
        let info = e.group_info(&long, "g").expect("info");
        assert_eq!(info.cursor, 0, "the record stays");
        assert_eq!(
            info.pending.iter().map(|p| p.attempts).collect::<Vec<_>>(),
            [5]
        );
        // An ack still finishes it.
        e.ack_cursor(&long, "g", 0).expect("ack");
        assert_eq!(e.group_info(&long, "g").expect("info").cursor, 1);
    }
}
