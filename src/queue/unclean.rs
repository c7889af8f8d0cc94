//! Unclean stops and panicking handlers: a delivery that might have been out when its
//! process or handler died is charged a failed attempt, so a message that keeps crashing
//! its consumer reaches the attempt limit and is dead-lettered.
//! **Invariant:** an unclean open charges each unfinished offset in flight in its group's
//! last durable image once, and hand-outs below the old lease are then committed one by
//! one (careful), so the blame for a crash is exact.

use super::deadline::wall_ms;
use super::group::Group;
use super::group_cell::group_ops;
use super::{Engine, GroupRef, Ticket};
use crate::catalog::{AttemptRecord, GroupRecord, Op};

/// The reason recorded for deliveries that were out when the process stopped uncleanly.
pub const UNCLEAN_STOP_REASON: &str = "in flight when the process stopped without closing";
/// The reason recorded for a delivery dropped while its handler panicked.
pub const PANICKED_REASON: &str = "dropped while its handler panicked";

impl Engine {
    /// A delivery dropped while its thread panics: its handler failed, so it counts as a
    /// nacked attempt (`PANICKED_REASON`) and comes again. Runs inside a `Drop`, so the
    /// attempt is committed without waiting (a crash before that commit forgets it, as it
    /// forgets any unfinished delivery's hand-out), and a message that reached the limit is
    /// dead-lettered by the group's next hand-out (`dead_letter_charged_out`), not here.
    pub fn charge_panicked(&self, r: &GroupRef, ticket: Ticket) {
        let mut g = r.group.lock();
        let offset = ticket.offset;
        if !g.holds(offset, ticket.epoch, ticket.token) {
            return;
        }
        g.take_out(offset);
        let attempts = g.attempt_of(offset);
        let rec = AttemptRecord {
            attempts,
            last_reason: PANICKED_REASON.to_owned(),
            not_before_ms: self.not_before_ms(attempts, None, wall_ms()),
        };
        if rec.attempts >= self.opts.max_delivery_attempts {
            g.charged_out.push(offset);
        }
        g.attempts.insert(offset, rec.clone());
        g.wait_again(offset, rec.not_before_ms);
        g.mark_dirty();
        g.check();
        let (topic, group) = (r.topic.name.clone(), r.name.to_string());
        let mut ops = group_ops(&topic, &group, &mut g);
        ops.push(Op::PutAttempt(topic, group, offset, rec));
        self.catalog.commit_then(ops, Box::new(|_| {}));
    }
}

/// At an unclean open: charges an attempt to each unfinished offset below the log's end
/// `next` that was in flight in the group's last image `rec`, and makes hand-outs careful
/// up to the old lease. `not_before` gives the n-th failed attempt's redelivery time (the
/// backoff). Returns the attempt rows to commit.
pub(super) fn charge_unclean_stop(
    topic: &str,
    group: &str,
    rec: &GroupRecord,
    g: &mut Group,
    next: u64,
    not_before: impl Fn(u32) -> u64,
) -> Vec<Op> {
    let mut ops = Vec::new();
    for &o in rec.in_flight.iter().filter(|&&o| o < next) {
        if g.unfinished(o) {
            let a = g.attempts.entry(o).or_default();
            a.attempts = a.attempts.saturating_add(1);
            a.last_reason = UNCLEAN_STOP_REASON.to_owned();
            a.not_before_ms = not_before(a.attempts);
            ops.push(Op::PutAttempt(
                topic.to_owned(),
                group.to_owned(),
                o,
                a.clone(),
            ));
        }
    }
    g.careful_until = g.lease_end;
    tracing::warn!(topic = %topic, group = %group, charged = rec.in_flight.len(),
        careful_until = g.careful_until, "unclean stop: charged deliveries that were out");
    ops
}

/// At open: puts the unfinished offsets below `next` whose attempt rows say they wait
/// (a nack with a delay or a backoff) back to waiting, so a reopen inside the wait still
/// waits. A waiting offset may sit at the read position (nothing after it was out).
pub(super) fn restore_delays(g: &mut Group, next: u64) {
    let waiting: Vec<(u64, u64)> = g
        .attempts
        .iter()
        .filter(|(o, a)| a.not_before_ms > 0 && **o < next && g.unfinished(**o))
        .map(|(o, a)| (*o, a.not_before_ms))
        .collect();
    for (o, at) in waiting {
        g.materialize_to(o);
        g.delayed.insert(o, at);
    }
    g.check();
}

/// At open: queues the unfinished offsets below `next` whose attempts reached the limit
/// `max` for the group's next hand-out to dead-letter.
pub(super) fn queue_charged_to_limit(g: &mut Group, max: u32, next: u64) {
    // Charged to the limit (a panicking handler) and not dead-lettered before the
    // stop: the first hand-out dead-letters them (they may sit at the read position,
    // not queued for redelivery, when nothing after them was out).
    if max == 0 {
        return;
    }
    let due: Vec<u64> = g
        .attempts
        .iter()
        .filter(|(o, a)| a.attempts >= max && **o < next && g.unfinished(**o))
        .map(|(o, _)| *o)
        .collect();
    for o in due.into_iter().rev() {
        g.materialize_to(o);
        g.charged_out.push(o);
    }
}
