//! Acks and releases of deliveries. An explicit ack is made durable by the catalog's
//! committer, which takes one image of the group for every ack queued meanwhile
//! (`GroupSnapshotter`); an auto-ack waits for the group's next commit.
//! **Invariant:** only the ticket that holds an offset finishes it (a reset or a
//! redelivery makes older tickets stale), and a durable image carries the group's lease.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::engine::lock;
use super::group::Group;
use super::group_cell::{GroupCell, group_ops};
use super::{Engine, GroupRef, Ticket};
use crate::catalog::{AckWatch, Op, Snapshotter};
use crate::error::{Error, Result};

/// Finishes `ticket`'s offset in memory if the ticket still holds it (an ack).
pub(super) fn finish_held(g: &mut Group, ticket: Ticket) -> bool {
    let held = g.holds(ticket.offset, ticket.epoch, ticket.token);
    if held {
        g.take_out(ticket.offset);
        g.finish(ticket.offset);
        g.counts.acked += 1;
    }
    held
}

/// Lets the catalog's committer take a group's image itself, once per commit, for the
/// explicit acks queued since the last one.
#[derive(Debug)]
pub(super) struct GroupSnapshotter {
    topic: String,
    name: Arc<str>,
    group: Arc<GroupCell>,
    /// The lease the last image taken carries, and the cell it makes durable once landed
    /// (a reset replaces the cell: an image from before it raises the old one).
    lease: Mutex<Option<(Arc<AtomicU64>, u64)>>,
}

impl GroupSnapshotter {
    /// The snapshotter of group `name` of `topic`.
    pub(super) fn new(topic: String, name: Arc<str>, group: Arc<GroupCell>) -> Self {
        GroupSnapshotter {
            topic,
            name,
            group,
            lease: Mutex::new(None),
        }
    }
}

impl Snapshotter for GroupSnapshotter {
    fn try_ops(&self) -> Option<Vec<Op>> {
        let mut g = self.group.try_lock()?;
        // Under the lock, with the image: an ack after this queues the snapshotter again.
        g.snapshot_queued = false;
        *lock(&self.lease) = Some((g.lease_durable.clone(), g.lease_end));
        Some(group_ops(&self.topic, &self.name, &mut g))
    }

    // Every durable image carries the group's lease: an ack's commit lands a deferred
    // extension (`Lease::Defer`) as the ticker's would.
    fn landed(&self) {
        if let Some((durable, end)) = lock(&self.lease).take() {
            durable.fetch_max(end, Ordering::AcqRel);
        }
    }

    fn key(&self) -> usize {
        Arc::as_ptr(&self.group) as usize
    }
}

impl Engine {
    /// Acks a delivery. With `durable` (explicit ack), returns the catalog ticket that
    /// says when it is on disk (see `Catalog::ack_ticket`; one commit serves concurrent
    /// acks); without, the next periodic commit persists it (auto-ack). A stale delivery
    /// fails with `StaleDelivery` when explicit and is ignored when automatic.
    pub fn ack_delivery(&self, r: &GroupRef, ticket: Ticket, durable: bool) -> Result<Option<u64>> {
        let mut g = r.group.lock();
        self.ack_locked(r, &mut g, ticket, durable)
    }

    /// Where durable acks learn that their ticket is on disk.
    pub fn ack_watch(&self) -> &Arc<AckWatch> {
        self.catalog.ack_watch()
    }

    /// [`Engine::ack_delivery`] under the group's lock.
    fn ack_locked(
        &self,
        r: &GroupRef,
        g: &mut Group,
        ticket: Ticket,
        durable: bool,
    ) -> Result<Option<u64>> {
        let offset = ticket.offset;
        if !g.deadlines.is_empty() {
            // An expired delivery finishes nothing; an auto-ack of one is ignored, as a
            // stale one is.
            match self.refuse_expired(r, g, ticket) {
                Err(e) if durable => return Err(e),
                Err(_) => return Ok(None),
                Ok(()) => {}
            }
        }
        if !finish_held(g, ticket) {
            return if durable {
                Err(Error::StaleDelivery { offset })
            } else {
                Ok(None)
            };
        }
        match durable {
            true => return self.durable_ticket(r, g).map(Some),
            // In careful mode every step is committed, so a crash blames exactly one delivery.
            false if offset < g.careful_until => {
                let ops = group_ops(&r.topic.name, &r.name, g);
                self.catalog.commit(&ops)?;
            }
            false => {}
        }
        Ok(None)
    }

    /// The ticket of the durable acks just made to `g` (under its lock). The committer
    /// takes the group's image when it writes: one for all the acks queued meanwhile
    /// (taken after these were applied, so it includes them).
    fn durable_ticket(&self, r: &GroupRef, g: &mut Group) -> Result<u64> {
        let queue = !std::mem::replace(&mut g.snapshot_queued, true);
        let t = self.catalog.ack_ticket(&r.snapshotter, queue);
        if t.is_err() && queue {
            g.snapshot_queued = false;
        }
        t
    }

    /// Acks several deliveries of group `r` durably under one lock, with one ticket for
    /// all of them (one commit). Each delivery that cannot be acked (stale, expired) is
    /// pushed to `refused` with its index in `tickets` and changes nothing; the others are
    /// acked all the same. `None`: none was acked.
    pub fn ack_deliveries(
        &self,
        r: &GroupRef,
        tickets: &[Ticket],
        refused: &mut Vec<(usize, Error)>,
    ) -> Result<Option<u64>> {
        let mut g = r.group.lock();
        // Deadlines once, first (as `nack_deliveries`): an expired delivery is taken back
        // now, and its ticket is then stale (the caller reports it as expired).
        self.expire_due(&r.topic, &r.name, &mut g);
        let mut acked = false;
        for (i, &ticket) in tickets.iter().enumerate() {
            if finish_held(&mut g, ticket) {
                acked = true;
            } else {
                let offset = ticket.offset;
                refused.push((i, Error::StaleDelivery { offset }));
            }
        }
        if !acked {
            return Ok(None);
        }
        self.durable_ticket(r, &mut g).map(Some)
    }

    /// Commits that succeeded since the instance was opened (tests count them).
    pub fn catalog_commits(&self) -> u64 {
        self.catalog.ack_watch().commits()
    }

    /// Puts an unfinished delivery back for redelivery without counting an attempt (one
    /// whose deadline passed counts as the failed attempt it is).
    pub fn release_delivery(&self, r: &GroupRef, ticket: Ticket) {
        let mut g = r.group.lock();
        if self.refuse_expired(r, &mut g, ticket).is_err() {
            return;
        }
        if g.holds(ticket.offset, ticket.epoch, ticket.token) {
            g.take_out(ticket.offset);
            g.wait_again(ticket.offset, 0);
            g.mark_dirty();
            g.check();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Headers;
    use crate::queue::group::LEASE_RECORDS;
    use crate::queue::test_support::{engine_on_disk, wait_ticket};

    /// A manual-ack consumer at the log's end: its durable acks commit the group's image,
    /// which carries the deferred lease, so an ack's commit lands the extension (no
    /// ticker commit, and none from the hand-out path before it is needed).
    #[test]
    fn an_acks_commit_lands_a_deferred_extension() {
        let (_dir, e) = engine_on_disk();
        let (body, h) = ([1u8; 8], Headers::new());
        let r = e.register_consumer("t", "g", 1, 1).expect("consumer");
        for i in 0..=LEASE_RECORDS / 2 {
            e.publish("t", &[(&body[..], &h)], 1).expect("publish");
            let d = e
                .next_delivery(&r, None, false)
                .expect("hand-out")
                .expect("a record");
            assert_eq!(d.record.offset, i);
            let ticket = e
                .ack_delivery(&r, d.ticket(), true)
                .expect("ack")
                .expect("a durable ack's ticket");
            assert_eq!(wait_ticket(&e, ticket), Ok(()), "ack {i}");
        }
        let g = r.group.lock();
        assert!(
            g.extend_deferred,
            "the extension at the log's end was deferred"
        );
        assert_eq!(
            g.lease_durable.load(Ordering::Acquire),
            LEASE_RECORDS / 2 + LEASE_RECORDS,
            "the ack's commit made the deferred lease durable"
        );
        drop(g);
        e.close().expect("close");
    }
}
