//! Low-level `ack`, `nack` and `nack_with_delay` by offset under `Mode=Kafka`. They
//! address partition 0 (API.md), and, as in embedded mode, only its cursor:
//! - another offset is `NotAtCursor`; the log's end or past it is `OffsetOutOfRange`.
//!
//! Where the change is made:
//! - When this `Spool` has the group's member, in its floor. The record is taken out of
//!   whatever state it was in: a delivery of it that is out becomes stale (its late ack
//!   fails). A nack takes it as a delivery of its own and nacks that, so the attempt, the
//!   backoff, the hold and dead-lettering are the delivery's (`consumer.rs`).
//! - Otherwise, in the group's commit, read and committed from outside the group
//!   (`outside.rs`; a group with members elsewhere refuses it: `GroupInUse`). A nack at
//!   the limit there follows the same three steps as `dead_letter.rs`: intent, copy,
//!   finish; a crash between them is resolved by the next member that reads the record.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::super::floor::Floor;
use super::super::group::{self, Group, State};
use super::super::{Kafka, blocking};
use super::{KafkaDelivery, dead_letter, not_before_ms};
use crate::error::{Error, Result};
use crate::format::record::Record;
use crate::queue::NackOutcome;

/// The partition the offset-addressed calls address.
const P: i32 = 0;

impl Kafka {
    /// Acks the group's cursor on partition 0 (it must equal `offset`).
    pub(crate) async fn ack_offset(&self, topic: &str, group: &str, offset: u64) -> Result<()> {
        let next = self.checked_end(topic, group).await?;
        if let Some(g) = self.live_group(topic, group) {
            let version = {
                let mut st = g.shared.lock();
                take_cursor(&g, &mut st, offset, next)?;
                let part = st.parts.get_mut(&P).expect("taken: assigned");
                part.finish(offset);
                st.counts.acked += 1;
                g.shared.changed(&mut st)
            };
            g.shared.room.notify_waiters();
            return g.shared.durable(version, Some(offset)).await;
        }
        let (k, topic, group) = (self.clone(), topic.to_owned(), group.to_owned());
        blocking(move || {
            let mut floor = k.floor_from_outside(&topic, &group, P)?;
            at_cursor(&floor, offset, next)?;
            floor.finish(offset);
            k.commit_floor(&topic, &group, &floor)
        })
        .await
    }

    /// Nacks the group's cursor on partition 0 (it must equal `offset`); `delay` as a
    /// delivery's nack takes it (`None`: the `Nack Backoff`).
    pub(crate) async fn nack_offset(
        &self,
        topic: &str,
        group: &str,
        offset: u64,
        reason: &str,
        delay: Option<Duration>,
    ) -> Result<NackOutcome> {
        let next = self.checked_end(topic, group).await?;
        // Read first, so that no lock is held across the read: a dead-letter copy needs
        // the record, and a delivery of it is what a live member nacks.
        let record = if offset < next {
            self.record_at(topic, offset).await?
        } else {
            None
        };
        if let Some(g) = self.live_group(topic, group) {
            let d = {
                let mut st = g.shared.lock();
                take_cursor(&g, &mut st, offset, next)?;
                let record = record.ok_or_else(|| missing(topic, offset))?;
                deliver_to_self(&g, &mut st, record)
            };
            return d.nack(reason, delay).await;
        }
        let (k, t, gr) = (self.clone(), topic.to_owned(), group.to_owned());
        let floor = blocking(move || k.floor_from_outside(&t, &gr, P)).await?;
        at_cursor(&floor, offset, next)?;
        let record = record.ok_or_else(|| missing(topic, offset))?;
        self.nack_from_outside(topic, group, floor, record, reason, delay)
            .await
    }

    /// Checks the names and that the instance is open; returns partition 0's end.
    async fn checked_end(&self, topic: &str, group: &str) -> Result<u64> {
        crate::names::check(topic)?;
        crate::names::check(group)?;
        self.check_open()?;
        let (k, topic) = (self.clone(), topic.to_owned());
        blocking(move || {
            if k.partitions(&topic)? == 0 {
                return Ok(0);
            }
            Ok(k.watermarks(&topic, P)?.1)
        })
        .await
    }

    /// The record at `offset` of partition 0, if the topic still holds it.
    async fn record_at(&self, topic: &str, offset: u64) -> Result<Option<Record>> {
        let (k, topic) = (self.clone(), topic.to_owned());
        let found = blocking(move || k.fetch_blocking(&topic, P, offset, 1)).await?;
        Ok(found.into_iter().find(|r| r.offset == offset))
    }

    /// Commits `floor` as partition 0's, from outside the group. Blocking.
    fn commit_floor(&self, topic: &str, group: &str, floor: &Floor) -> Result<()> {
        let floors = [(P, floor.cursor(), floor.metadata())];
        self.commit_from_outside(topic, group, &floors)
    }

    /// A nack with no member of the group here: the attempt committed, or at the limit
    /// the intent, the copy, then the record finished.
    async fn nack_from_outside(
        &self,
        topic: &str,
        group: &str,
        mut floor: Floor,
        record: Record,
        reason: &str,
        delay: Option<Duration>,
    ) -> Result<NackOutcome> {
        let o = record.offset;
        let opts = self.options();
        let attempts = floor.failed(o).map_or(0, |f| f.attempts) + 1;
        let delay = delay
            .filter(|d| !d.is_zero())
            .unwrap_or_else(|| opts.nack_backoff.delay(attempts));
        floor.fail(o, not_before_ms(delay));
        let dlq =
            dead_letter::topic_for(opts, topic).filter(|_| attempts >= opts.max_delivery_attempts);
        let Some(dlq) = dlq else {
            self.commit_outside_async(topic, group, &floor).await?;
            return Ok(NackOutcome {
                delivery_attempt: attempts,
                dead_lettered: false,
                next_offset: floor.cursor(),
                redeliver_at: (!delay.is_zero())
                    .then(|| SystemTime::now().checked_add(delay))
                    .flatten(),
            });
        };
        // An intent already there: a crash may have left the copy made.
        let maybe_made = floor.intents().any(|i| i == o);
        floor.intend_dead_letter(o);
        self.commit_outside_async(topic, group, &floor).await?;
        let source = dead_letter::Source {
            kafka: self,
            topic,
            group,
            partition: P,
        };
        if !(maybe_made && source.find_copy(&dlq, o).await?) {
            source.produce_copy(&record, attempts, reason, &dlq).await?;
        }
        floor.finish(o);
        self.commit_outside_async(topic, group, &floor).await?;
        Ok(NackOutcome {
            delivery_attempt: attempts,
            dead_lettered: true,
            next_offset: floor.cursor(),
            redeliver_at: None,
        })
    }

    async fn commit_outside_async(&self, topic: &str, group: &str, floor: &Floor) -> Result<()> {
        let (k, topic, group, floor) = (
            self.clone(),
            topic.to_owned(),
            group.to_owned(),
            floor.clone(),
        );
        blocking(move || k.commit_floor(&topic, &group, &floor)).await
    }
}

/// Refused unless `offset` is `floor`'s cursor and below the log's `next`.
fn at_cursor(floor: &Floor, offset: u64, next: u64) -> Result<()> {
    if offset != floor.cursor() {
        return Err(Error::NotAtCursor {
            expected: floor.cursor(),
            actual: offset,
        });
    }
    if offset >= next {
        return Err(Error::OffsetOutOfRange { offset, next });
    }
    Ok(())
}

/// Takes the live member's cursor on partition 0 out of whatever state it is in: a
/// delivery of it that is out becomes stale, a held one and a buffered read are dropped.
/// `GroupInUse` when partition 0 is another member's; `NotAtCursor` while a nack at the
/// limit is dead-lettering it.
fn take_cursor(g: &Group, st: &mut State, offset: u64, next: u64) -> Result<()> {
    let Some(part) = st.parts.get(&P) else {
        return Err(Error::GroupInUse {
            topic: g.topic.clone(),
            group: g.name.clone(),
        });
    };
    at_cursor(&part.floor, offset, next)?;
    if st.dead_lettering.contains(&(P, offset, part.epoch)) {
        // A nack at the limit is dead-lettering it: finished for the group, as the
        // embedded nack leaves it at once (a second nack would make a second copy).
        return Err(Error::NotAtCursor {
            expected: offset + 1,
            actual: offset,
        });
    }
    let part = st.parts.get_mut(&P).expect("checked above");
    part.held.remove(&offset);
    let was_out = part.out.remove(&offset).is_some();
    if was_out {
        st.in_flight = st.in_flight.saturating_sub(1);
    }
    st.buffer.retain(|(p, r)| *p != P || r.offset != offset);
    Ok(())
}

/// A delivery of `record` (the cursor, just taken) that only the low-level nack holds.
/// The poll thread is moved past it meanwhile: it must not hand the record out while the
/// nack runs (the nack holds it, or a failed dead-letter's seek back brings it back).
fn deliver_to_self(g: &Arc<Group>, st: &mut State, record: Record) -> KafkaDelivery {
    let o = record.offset;
    group::seek(st, P, o + 1, None);
    let part = st.parts.get_mut(&P).expect("taken: assigned");
    // Out from now on: later records of its key wait behind it (`key_order.rs`).
    part.note_key(&record);
    let ticket = group::new_epoch();
    part.out.insert(o, ticket);
    let attempt = part
        .floor
        .failed(o)
        .map_or(1, |f| f.attempts.saturating_add(1));
    let epoch = part.epoch;
    st.in_flight += 1;
    KafkaDelivery {
        group: g.clone(),
        partition: P,
        epoch,
        ticket,
        record,
        attempt,
        settled: false,
        auto: false,
        deadline: None,
    }
}

fn missing(topic: &str, offset: u64) -> Error {
    Error::Kafka {
        context: format!("reading {topic} at offset {offset}"),
        detail: "the record is not in the partition (a gap, or deleted)".to_owned(),
    }
}
