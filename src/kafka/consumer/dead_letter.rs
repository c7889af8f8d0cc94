//! Dead-lettering under `Mode=Kafka`, once also across a crash:
//! 1. the intent (`d:<offset>` in the floor's metadata) is committed;
//! 2. the copy is produced to `<topic><suffix>` with the provenance headers;
//! 3. the record is finished and committed, so the cursor moves past it.
//!
//! A crash after 1 leaves the intent: the next read of the record (`resolve_intent`)
//! looks for the copy in the dead-letter topic's tail and produces it only if it is not
//! there. The copy keeps the record's `message-key`, so it lands on the same partition
//! number when the dead-letter topic has as many partitions as its source.
//!
//! Crash points (`crate::fault`, `SPOOL_CRASH_AT`): `kafka.dead_letter.after_intent`
//! (after 1) and `kafka.dead_letter.after_copy` (after 2); tests/kafka.rs kills a child
//! process at each.

use std::sync::Arc;

use super::super::group::Group;
use super::super::{Kafka, blocking};
use super::PutBack;
use crate::error::{Error, Result};
use crate::format::Headers;
use crate::format::record::Record;
use crate::options::{MAX_NACK_REASON_BYTES, Options};
use crate::queue::{
    NackOutcome, X_CONSUMER_GROUP, X_DEAD_LETTER_REASON, X_DELIVERY_ATTEMPTS, X_ORIGINAL_OFFSET,
    X_ORIGINAL_TIMESTAMP, X_ORIGINAL_TOPIC,
};

/// The partition the record was read from (Kafka only: a topic there has several).
pub(crate) const X_ORIGINAL_PARTITION: &str = "x-original-partition";

/// How far back in each dead-letter partition a copy is looked for after a crash.
const SEARCH_WINDOW: u64 = 10_000;

/// Where `topic`'s records go at the attempt limit (`None`: dead-lettering is off, or
/// `topic` is a dead-letter topic and chains are off), as in embedded mode.
pub(super) fn topic_for(o: &Options, topic: &str) -> Option<String> {
    if o.max_delivery_attempts == 0 {
        return None;
    }
    if !o.dead_letter_chain && topic.ends_with(&o.dead_letter_suffix) {
        return None;
    }
    Some(format!("{topic}{}", o.dead_letter_suffix))
}

/// Steps 1–3 for a record nacked to the limit (its failure already in the floor). On
/// an error or a cancelled future, `back` seeks the partition back to the record, whose
/// next read resolves the intent.
pub(super) async fn dead_letter(
    back: PutBack,
    epoch: u64,
    attempts: u32,
    reason: &str,
    dlq: &str,
) -> Result<NackOutcome> {
    let (g, p) = (back.group.clone(), back.partition);
    let o = back.record().offset;
    let v = {
        let mut st = g.shared.lock();
        if let Some(part) = st.parts.get_mut(&p) {
            part.floor.intend_dead_letter(o);
        }
        g.shared.changed(&mut st)
    };
    g.shared.durable(v, Some(o)).await?;
    // Revoked meanwhile: the new owner resolves the intent; a copy made here could be a
    // second one.
    let current = g
        .shared
        .lock()
        .parts
        .get(&p)
        .is_some_and(|x| x.epoch == epoch);
    if !current {
        back.done();
        return Err(Error::StaleDelivery { offset: o });
    }
    crate::fault::hit("kafka.dead_letter.after_intent");
    Source::of(&g, p)
        .produce_copy(back.record(), attempts, reason, dlq)
        .await?;
    crate::fault::hit("kafka.dead_letter.after_copy");
    let next_offset = finish(&g, p, o).await?;
    back.done();
    Ok(NackOutcome {
        delivery_attempt: attempts,
        dead_lettered: true,
        next_offset,
        redeliver_at: None,
    })
}

/// A record read back with an intent on it: makes the copy unless it is already in the
/// dead-letter topic, then finishes the record.
pub(super) async fn resolve_intent(back: PutBack) -> Result<()> {
    let (g, p) = (back.group.clone(), back.partition);
    let o = back.record().offset;
    let Some(dlq) = topic_for(g.kafka.options(), &g.topic) else {
        finish(&g, p, o).await?;
        back.done();
        return Ok(());
    };
    let found = Source::of(&g, p).find_copy(&dlq, o).await?;
    if !found {
        let attempts = {
            let st = g.shared.lock();
            st.parts
                .get(&p)
                .and_then(|part| part.floor.failed(o))
                .map_or(0, |f| f.attempts)
        };
        let reason = "dead-lettered across a restart (the first copy was not found)";
        Source::of(&g, p)
            .produce_copy(back.record(), attempts, reason, &dlq)
            .await?;
    }
    finish(&g, p, o).await?;
    back.done();
    Ok(())
}

/// Finishes `o` and waits for its commit; returns the partition's cursor.
async fn finish(g: &Arc<Group>, p: i32, o: u64) -> Result<u64> {
    let (v, cursor) = {
        let mut st = g.shared.lock();
        let cursor = st.parts.get_mut(&p).map_or(0, |part| {
            part.finish(o);
            part.floor.cursor()
        });
        st.dead_lettered += 1;
        (g.shared.changed(&mut st), cursor)
    };
    g.shared.room.notify_waiters();
    g.shared.durable(v, Some(o)).await?;
    Ok(cursor)
}

/// Where a dead-lettered record came from: the copy's provenance.
pub(super) struct Source<'a> {
    pub kafka: &'a Kafka,
    pub topic: &'a str,
    pub group: &'a str,
    pub partition: i32,
}

impl<'a> Source<'a> {
    fn of(g: &'a Group, partition: i32) -> Source<'a> {
        Source {
            kafka: &g.kafka,
            topic: &g.topic,
            group: &g.name,
            partition,
        }
    }

    /// Produces `record`'s copy to `dlq` with the provenance headers.
    pub async fn produce_copy(
        &self,
        record: &Record,
        attempts: u32,
        reason: &str,
        dlq: &str,
    ) -> Result<()> {
        self.kafka.ensure_dead_letter_topic(self.topic, dlq).await?;
        let mut h: Headers = record.headers.clone();
        h.insert(X_ORIGINAL_TOPIC.into(), self.topic.to_owned());
        h.insert(X_ORIGINAL_PARTITION.into(), self.partition.to_string());
        h.insert(X_ORIGINAL_OFFSET.into(), record.offset.to_string());
        h.insert(X_ORIGINAL_TIMESTAMP.into(), record.timestamp_ms.to_string());
        h.insert(X_CONSUMER_GROUP.into(), self.group.to_owned());
        h.insert(X_DELIVERY_ATTEMPTS.into(), attempts.to_string());
        h.insert(X_DEAD_LETTER_REASON.into(), cut(reason).to_owned());
        self.kafka
            .produce(dlq, &record.payload, &h)
            .await
            .map(|_| ())
    }

    /// Whether `dlq`'s tail holds the copy of offset `o` made for this group.
    pub async fn find_copy(&self, dlq: &str, o: u64) -> Result<bool> {
        let (k, topic, group, p, dlq) = (
            self.kafka.clone(),
            self.topic.to_owned(),
            self.group.to_owned(),
            self.partition,
            dlq.to_owned(),
        );
        blocking(move || find_copy(&k, &topic, &group, &dlq, p, o)).await
    }
}

/// `reason` cut at a character boundary to `MAX_NACK_REASON_BYTES`.
fn cut(reason: &str) -> &str {
    let mut end = reason.len().min(MAX_NACK_REASON_BYTES);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

/// Whether the dead-letter topic's tail holds the copy of (`topic`, `p`, `o`) made for
/// `group`. Blocking.
fn find_copy(k: &Kafka, topic: &str, group: &str, dlq: &str, p: i32, o: u64) -> Result<bool> {
    let (p_s, o_s) = (p.to_string(), o.to_string());
    let is_copy = |r: &Record| {
        let h = &r.headers;
        h.get(X_ORIGINAL_TOPIC).map(String::as_str) == Some(topic)
            && h.get(X_CONSUMER_GROUP).map(String::as_str) == Some(group)
            && h.get(X_ORIGINAL_PARTITION) == Some(&p_s)
            && h.get(X_ORIGINAL_OFFSET) == Some(&o_s)
    };
    for dp in 0..k.partitions(dlq)? {
        let (lo, hi) = k.watermarks(dlq, dp)?;
        let from = lo.max(hi.saturating_sub(SEARCH_WINDOW));
        let count = usize::try_from(hi - from).unwrap_or(usize::MAX);
        if k.read_range(dlq, dp, from, hi, count)?.iter().any(is_copy) {
            return Ok(true);
        }
    }
    Ok(false)
}
