//! Ack deadlines (JetStream's AckWait, SQS's visibility timeout): a delivery neither acked
//! nor nacked in time is taken back as a failed attempt, so a stuck handler cannot stall
//! its group. Expiry is lazy: the group's next hand-out, ack, nack or inspection takes
//! back what expired, and a waiting consumer is woken at the earliest deadline
//! (`Engine::wake_at`).
//! **Invariant:** a delivery whose deadline passed finishes nothing: its late ack or nack
//! fails with `DeliveryExpired`, and the attempt it failed is counted once.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::group::Group;
use super::nack::Failure;
use super::{Engine, GroupRef, Ticket, Topic};
use crate::error::{Error, Result};

/// The reason recorded for a delivery whose ack deadline passed (and copied into
/// `x-dead-letter-reason` when that dead-letters it).
pub const ACK_DEADLINE_REASON: &str = "ack deadline exceeded";

impl Engine {
    /// Takes back every delivery of the group whose deadline passed by `now`, each as a
    /// failed attempt: redelivered (after the backoff) or dead-lettered at the limit.
    /// A failure is logged and the rest go on (as for `dead_letter_charged_out`): the
    /// caller's own work, an auto-ack for one, must not be lost to it. A failed attempt
    /// commit leaves the offset waiting, uncounted; a failed dead-letter copy leaves it
    /// waiting too.
    /// The clocks are read only for a group with a deadline out: a hand-out of a group
    /// without deadlines reads none.
    pub(super) fn expire_due(&self, t: &Topic, group: &str, g: &mut Group) {
        if g.deadlines.is_empty() {
            return;
        }
        let (now, now_ms) = (Instant::now(), wall_ms());
        for offset in g.expired(now) {
            g.take_out(offset);
            g.counts.expired += 1;
            let failure = Failure::backoff(ACK_DEADLINE_REASON);
            if let Err(e) = self.nack_taken(t, group, g, offset, failure, now_ms) {
                tracing::warn!(topic = %t.name, group = %group, offset, error = %e,
                    "taking back a delivery whose ack deadline passed failed; it stays waiting");
            }
        }
    }

    /// Refuses `ticket` with `DeliveryExpired` if it is still out but its deadline has
    /// passed (taking it back first). Free for a group without deadlines.
    pub(super) fn refuse_expired(&self, r: &GroupRef, g: &mut Group, ticket: Ticket) -> Result<()> {
        let Some(&at) = g.deadlines.get(&ticket.offset) else {
            return Ok(());
        };
        if at > Instant::now() || !g.holds(ticket.offset, ticket.epoch, ticket.token) {
            return Ok(());
        }
        self.expire_due(&r.topic, &r.name, g);
        Err(expired(r, ticket.offset))
    }

    /// Whether `ticket` still holds its offset: `DeliveryExpired` if its deadline passed
    /// (taken back first), `StaleDelivery` if it no longer holds it (a reset, a
    /// redelivery). The one check before an ack, nack or extension changes anything.
    pub(super) fn check_held(&self, r: &GroupRef, g: &mut Group, ticket: Ticket) -> Result<()> {
        self.refuse_expired(r, g, ticket)?;
        match g.holds(ticket.offset, ticket.epoch, ticket.token) {
            true => Ok(()),
            false => Err(Error::StaleDelivery {
                offset: ticket.offset,
            }),
        }
    }

    /// Restarts `ticket`'s deadline: it now ends `deadline` from now. Fails with
    /// `DeliveryExpired` if it passed, `StaleDelivery` if the delivery is no longer out.
    pub fn extend_deadline(
        &self,
        r: &GroupRef,
        ticket: Ticket,
        deadline: Duration,
    ) -> Result<Instant> {
        let mut g = r.group.lock();
        self.check_held(r, &mut g, ticket)?;
        let at = Instant::now() + deadline;
        g.deadlines.insert(ticket.offset, at);
        g.check();
        Ok(at)
    }

    /// When a consumer of the group waiting for a delivery should look again even if
    /// nothing rings: the earliest time a waiting record comes due or a deadline passes.
    pub fn wake_at(&self, r: &GroupRef) -> Option<Instant> {
        let g = r.group.lock();
        // The common case, a group with nothing delayed or timed: no clock read.
        if g.delayed.is_empty() && g.deadlines.is_empty() {
            return None;
        }
        let (due_ms, deadline) = g.next_due(wall_ms());
        let due = due_ms.map(|ms| {
            let due = UNIX_EPOCH + Duration::from_millis(ms);
            let wait = due.duration_since(SystemTime::now()).unwrap_or_default();
            // One millisecond later than due: the record's time is stored in whole ms.
            Instant::now() + wait + Duration::from_millis(1)
        });
        [due, deadline].into_iter().flatten().min()
    }
}

/// The wall clock in ms since the Unix epoch (read only on paths with delays or deadlines).
pub(super) fn wall_ms() -> u64 {
    crate::format::record::system_time_ms(SystemTime::now())
}

/// The error a late ack, nack or extension of an expired delivery gets.
pub(super) fn expired(r: &GroupRef, offset: u64) -> Error {
    Error::DeliveryExpired {
        topic: r.topic().to_owned(),
        group: r.group().to_owned(),
        offset,
    }
}
