//! Nacks: a failed attempt is counted, and at the attempt limit the message is
//! dead-lettered instead of redelivered.
//! **Invariant:** an attempt counts only once its commit succeeded (a failed nack takes
//! it back), and a message whose nack failed stays deliverable.

use std::time::{Duration, UNIX_EPOCH};

use super::group::Group;
use super::group_cell::group_ops;
use super::{Engine, GroupRef, NackOutcome, Ticket, Topic};
use crate::catalog::{AttemptRecord, Op};
use crate::error::{Error, Result};
use crate::options::{MAX_MS, MAX_NACK_REASON_BYTES};

impl Engine {
    /// Nacks a delivery: counts a failed attempt with `reason`, or dead-letters the
    /// message at the limit. It waits `delay` before it is delivered again (`None` or
    /// zero: the `Nack Backoff`). A stale delivery fails with `StaleDelivery`, an expired
    /// one with `DeliveryExpired`.
    pub fn nack_delivery(
        &self,
        r: &GroupRef,
        ticket: Ticket,
        reason: &str,
        delay: Option<Duration>,
        now_ms: u64,
    ) -> Result<NackOutcome> {
        let mut g = r.group.lock();
        self.check_held(r, &mut g, ticket)?;
        g.take_out(ticket.offset);
        let failure = Failure { reason, delay };
        let outcome = self.nack_taken(&r.topic, &r.name, &mut g, ticket.offset, failure, now_ms);
        // Counted once made: a nack whose commit failed did not happen.
        g.counts.nacked += u64::from(outcome.is_ok());
        outcome
    }

    /// Nacks several deliveries of group `r` with one `reason`, under one lock: every one
    /// that is redelivered in one commit; each one at the attempt limit is then
    /// dead-lettered as a single nack would (the dead-letter copy durable before the
    /// cursor moves). One result per ticket, in order: a stale or expired delivery changes
    /// nothing. Every outcome's `next_offset` is the cursor after the whole batch.
    pub fn nack_deliveries(
        &self,
        r: &GroupRef,
        tickets: &[Ticket],
        reason: &str,
        now_ms: u64,
    ) -> Vec<Result<NackOutcome>> {
        let mut g = r.group.lock();
        // Deadlines once, first: a delivery of the batch that expired is taken back now
        // (its ticket is then stale, reported as expired), never between two tickets,
        // where it could take back one already sorted and have it nacked twice.
        self.expire_due(&r.topic, &r.name, &mut g);
        let mut out: Vec<Result<NackOutcome>> = Vec::with_capacity(tickets.len());
        let (mut redeliver, mut exhausted) = (Vec::new(), Vec::new());
        let dlq = self.dead_letter_topic(&r.topic.name);
        for &t in tickets {
            // Filled in below for those held.
            out.push(Err(Error::StaleDelivery { offset: t.offset }));
            if !g.holds(t.offset, t.epoch, t.token) {
                continue;
            }
            let at_limit = g.attempt_of(t.offset) >= self.opts.max_delivery_attempts;
            match dlq.is_some() && at_limit {
                true => exhausted.push((out.len() - 1, t.offset)),
                false => redeliver.push((out.len() - 1, t.offset)),
            }
        }
        let failure = Failure::backoff(reason);
        // Those redelivered first, in one commit; those at the limit stay out meanwhile
        // (so the cursor cannot pass them), then go as a single nack's would.
        let offsets: Vec<u64> = redeliver.iter().map(|&(_, o)| o).collect();
        for &o in &offsets {
            g.take_out(o);
        }
        match self.redeliver(&r.topic, &r.name, &mut g, &offsets, failure, now_ms) {
            Ok(outcomes) => {
                for (&(i, _), o) in redeliver.iter().zip(outcomes) {
                    out[i] = Ok(o);
                }
            }
            Err(e) => {
                // As after a failed single nack: nothing counted, all stay deliverable.
                for &(i, _) in &redeliver {
                    out[i] = Err(same_failure(&e));
                }
                for &(i, o) in &exhausted {
                    g.take_out(o);
                    g.wait_again(o, 0);
                    out[i] = Err(same_failure(&e));
                }
                g.check();
                return out;
            }
        }
        for (i, o) in exhausted {
            g.take_out(o);
            out[i] = self.nack_taken(&r.topic, &r.name, &mut g, o, failure, now_ms);
        }
        for o in out.iter_mut().flatten() {
            o.next_offset = g.cursor;
        }
        g.counts.nacked += out.iter().filter(|o| o.is_ok()).count() as u64;
        out
    }

    /// Counts a failed attempt for each of `offsets` (taken out of `in_flight`), all to be
    /// delivered again, in one commit: the attempt rows with the group's image. On a
    /// failed commit each is put back uncounted (and undelayed), still deliverable.
    fn redeliver(
        &self,
        t: &Topic,
        group: &str,
        g: &mut Group,
        offsets: &[u64],
        failure: Failure<'_>,
        now_ms: u64,
    ) -> Result<Vec<NackOutcome>> {
        if offsets.is_empty() {
            return Ok(Vec::new());
        }
        let topic = t.name.as_str();
        let mut rows = Vec::with_capacity(offsets.len());
        let mut before = Vec::with_capacity(offsets.len());
        for &o in offsets {
            let rec = self.attempt_record(g, o, failure, now_ms);
            before.push(g.attempts.insert(o, rec.clone()));
            g.wait_again(o, rec.not_before_ms);
            rows.push(Op::PutAttempt(topic.to_owned(), group.to_owned(), o, rec));
        }
        g.check();
        let mut ops = group_ops(topic, group, g);
        ops.extend(rows);
        if let Err(e) = self.catalog.commit(&ops) {
            for (&o, b) in offsets.iter().zip(before) {
                match b {
                    Some(b) => g.attempts.insert(o, b),
                    None => g.attempts.remove(&o),
                };
                g.delayed.remove(&o);
            }
            return Err(e);
        }
        let outcomes = offsets.iter().map(|o| {
            let rec = &g.attempts[o];
            tracing::debug!(
                topic,
                group,
                offset = o,
                attempts = rec.attempts,
                reason = rec.last_reason.as_str(),
                not_before_ms = rec.not_before_ms,
                "nacked"
            );
            NackOutcome {
                delivery_attempt: rec.attempts,
                dead_lettered: false,
                next_offset: g.cursor,
                redeliver_at: (rec.not_before_ms > 0)
                    .then(|| UNIX_EPOCH + Duration::from_millis(rec.not_before_ms)),
            }
        });
        Ok(outcomes.collect())
    }

    /// The attempt row a nack of `offset` writes: one more attempt, the reason (bounded)
    /// and the wait before the next delivery.
    fn attempt_record(
        &self,
        g: &Group,
        offset: u64,
        failure: Failure<'_>,
        now_ms: u64,
    ) -> AttemptRecord {
        let attempts = g.attempt_of(offset);
        AttemptRecord {
            attempts,
            last_reason: bounded_reason(failure.reason).to_owned(),
            not_before_ms: self.not_before_ms(attempts, failure.delay, now_ms),
        }
    }

    /// Nacks `offset`, already taken out of `in_flight`/`redeliver`.
    pub(super) fn nack_taken(
        &self,
        t: &Topic,
        group: &str,
        g: &mut Group,
        offset: u64,
        failure: Failure<'_>,
        now_ms: u64,
    ) -> Result<NackOutcome> {
        let attempts = g.attempt_of(offset);
        let dlq = self.dead_letter_topic(&t.name);
        if let Some(dlq) = dlq.filter(|_| attempts >= self.opts.max_delivery_attempts) {
            let rec = self.attempt_record(g, offset, failure, now_ms);
            let copied = match self.dead_letter(t, group, g, offset, Some(rec), &dlq, now_ms) {
                Ok(copied) => copied,
                Err(e) => {
                    if g.unfinished(offset) {
                        // Not finished: it must stay deliverable.
                        g.wait_again(offset, 0);
                    }
                    return Err(e);
                }
            };
            return Ok(NackOutcome {
                delivery_attempt: attempts,
                dead_lettered: copied,
                next_offset: g.cursor,
                redeliver_at: None,
            });
        }
        let outcomes = self.redeliver(t, group, g, &[offset], failure, now_ms)?;
        Ok(outcomes[0])
    }

    /// When a message that failed its `attempt`-th delivery may come again (0: at once):
    /// after `delay` if one was given, else after the `Nack Backoff`'s wait.
    pub(super) fn not_before_ms(&self, attempt: u32, delay: Option<Duration>, now_ms: u64) -> u64 {
        let wait = delay
            .filter(|d| !d.is_zero())
            .unwrap_or_else(|| self.opts.nack_backoff.delay(attempt))
            // Bounded like every time setting (about 10 years).
            .min(Duration::from_millis(MAX_MS));
        if wait.is_zero() {
            0
        } else {
            // `now_ms` is the millisecond's floor: one more, so that a record due at this
            // time (compared with the clock's floor too) never comes before `wait` passed.
            let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
            now_ms.saturating_add(ms).saturating_add(1)
        }
    }
}

/// Why an attempt failed, and how long the message waits (`None` or zero: the backoff).
#[derive(Clone, Copy, Debug)]
pub(super) struct Failure<'a> {
    pub reason: &'a str,
    pub delay: Option<Duration>,
}

impl<'a> Failure<'a> {
    /// A failure that waits what the `Nack Backoff` says.
    pub fn backoff(reason: &'a str) -> Self {
        Failure {
            reason,
            delay: None,
        }
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

/// Another error saying what `e` says, for each delivery of a batch a failed commit failed.
fn same_failure(e: &Error) -> Error {
    match e {
        Error::Catalog { context, detail } => Error::Catalog {
            context: context.clone(),
            detail: detail.clone(),
        },
        other => Error::Catalog {
            context: "committing a batch of nacks".into(),
            detail: other.to_string(),
        },
    }
}
