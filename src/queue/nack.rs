//! Nacks: a failed attempt is counted, and at the attempt limit the message is
//! dead-lettered instead of redelivered.
//! **Invariant:** an attempt counts only once its commit succeeded (a failed nack takes
//! it back), and a message whose nack failed stays deliverable.

use super::group::Group;
use super::group_cell::group_ops;
use super::{Engine, GroupRef, NackOutcome, Ticket, Topic};
use crate::catalog::{AttemptRecord, Op};
use crate::error::{Error, Result};
use crate::options::MAX_NACK_REASON_BYTES;

impl Engine {
    /// Nacks a delivery: counts a failed attempt with `reason`, or dead-letters the
    /// message at the limit. A stale delivery fails with `StaleDelivery`.
    pub fn nack_delivery(
        &self,
        r: &GroupRef,
        ticket: Ticket,
        reason: &str,
        now_ms: u64,
    ) -> Result<NackOutcome> {
        let mut g = r.group.lock();
        if !g.holds(ticket.offset, ticket.epoch, ticket.token) {
            return Err(Error::StaleDelivery {
                offset: ticket.offset,
            });
        }
        g.in_flight.remove(&ticket.offset);
        self.nack_taken(&r.topic, &r.name, &mut g, ticket.offset, reason, now_ms)
    }

    /// Nacks `offset`, already taken out of `in_flight`/`redeliver`.
    pub(super) fn nack_taken(
        &self,
        t: &Topic,
        group: &str,
        g: &mut Group,
        offset: u64,
        reason: &str,
        now_ms: u64,
    ) -> Result<NackOutcome> {
        let reason = bounded_reason(reason);
        let topic = t.name.as_str();
        let attempts = g.attempt_of(offset);
        let rec = AttemptRecord {
            attempts,
            last_reason: reason.to_owned(),
        };
        let dlq = self.dead_letter_topic(topic);
        if let Some(dlq) = dlq.filter(|_| attempts >= self.opts.max_delivery_attempts) {
            let copied = match self.dead_letter(t, group, g, offset, Some(rec), &dlq, now_ms) {
                Ok(copied) => copied,
                Err(e) => {
                    if g.unfinished(offset) {
                        // Not finished: it must stay deliverable.
                        g.redeliver.insert(offset);
                    }
                    return Err(e);
                }
            };
            return Ok(NackOutcome {
                delivery_attempt: attempts,
                dead_lettered: copied,
                next_offset: g.cursor,
            });
        }
        g.attempts.insert(offset, rec.clone());
        g.redeliver.insert(offset);
        g.check();
        let mut ops = group_ops(topic, group, g);
        ops.push(Op::PutAttempt(
            topic.to_owned(),
            group.to_owned(),
            offset,
            rec,
        ));
        if let Err(e) = self.catalog.commit(&ops) {
            // Not durable, so not counted: put the counter back.
            if let Some(a) = g.attempts.get_mut(&offset) {
                a.attempts -= 1;
                if a.attempts == 0 {
                    g.attempts.remove(&offset);
                }
            }
            return Err(e);
        }
        Ok(NackOutcome {
            delivery_attempt: attempts,
            dead_lettered: false,
            next_offset: g.cursor,
        })
    }
}

/// `reason` cut to [`MAX_NACK_REASON_BYTES`] at a character boundary.
fn bounded_reason(reason: &str) -> &str {
    let mut end = reason.len().min(MAX_NACK_REASON_BYTES);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}
