//! A group's state behind its lock, how an image of it is persisted, and the ticker's
//! commit of every group whose memory is ahead of the catalog.
//! **Invariant:** a group is only locked through `GroupCell`, which takes back records
//! lent to an auto-ack consumer first; a group's ops are queued while its lock is held,
//! so its commits land in lock order.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use super::engine::lock;
use super::group::Group;
use super::key_order::KeyOrder;
use super::{Engine, Topic};
use crate::catalog::Op;
use crate::error::{Error, Result};
use crate::names;

/// The ops that persist `g` as it is now (its image and the attempt rows it dropped).
pub(super) fn group_ops(topic: &str, group: &str, g: &mut Group) -> Vec<Op> {
    if g.deleted {
        // Its rows are gone: an image now (a late ack's, the ticker's) would bring the
        // group back.
        g.dirty = false;
        g.stale_attempts.clear();
        return Vec::new();
    }
    let mut ops: Vec<Op> = g
        .stale_attempts
        .drain(..)
        .map(|o| Op::DeleteAttempt(topic.to_owned(), group.to_owned(), o))
        .collect();
    let (rec, seq) = g.snapshot();
    ops.push(Op::PutGroup(topic.to_owned(), group.to_owned(), rec, seq));
    g.dirty = false;
    ops
}

/// A group's state behind its lock. Locking takes back records lent to an auto-ack
/// consumer first (`Group::reclaim`), so every operation sees the whole state.
#[derive(Debug)]
pub struct GroupCell {
    group: Mutex<Group>,
    /// Consumers of the group open in this instance (`OpenConsumer`s alive): a group is
    /// not deleted while one is. Changed under the topic's groups map lock.
    consumers: AtomicUsize,
}

impl GroupCell {
    /// A cell for `g`, shared by the topic's map and the group's consumers.
    pub(super) fn new(g: Group) -> Arc<GroupCell> {
        Arc::new(GroupCell {
            group: Mutex::new(g),
            consumers: AtomicUsize::new(0),
        })
    }

    /// Locks the group, taking back what it lent first.
    pub(super) fn lock(&self) -> MutexGuard<'_, Group> {
        let mut g = lock(&self.group);
        g.reclaim();
        g
    }

    /// `None` while somebody else holds the lock.
    pub(super) fn try_lock(&self) -> Option<MutexGuard<'_, Group>> {
        let mut g = match self.group.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        g.reclaim();
        Some(g)
    }
}

/// An open consumer of a group: counted while it lives, so the group is not deleted
/// under it (`Engine::delete_group`). A key-ordered one also keeps the group's key order
/// on (`Group::key_ordered_consumers`).
#[derive(Debug)]
pub struct OpenConsumer {
    cell: Arc<GroupCell>,
    key_ordered: bool,
}

impl OpenConsumer {
    /// Counts this consumer as key-ordered: the group orders by key until it is dropped.
    pub(super) fn keep_key_order(&mut self, g: &mut Group) {
        debug_assert!(!self.key_ordered);
        self.key_ordered = true;
        g.key_ordered_consumers += 1;
        g.keys.get_or_insert_with(KeyOrder::default);
    }
}

impl Drop for OpenConsumer {
    fn drop(&mut self) {
        if self.key_ordered {
            let mut g = self.cell.lock();
            g.key_ordered_consumers -= 1;
            if g.key_ordered_consumers == 0 {
                g.keys = None;
            }
        }
        self.cell.consumers.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Engine {
    /// The group, created at the earliest retained offset if new.
    pub(super) fn group(&self, t: &Topic, name: &str) -> Result<Arc<GroupCell>> {
        Ok(self.group_opened(t, name, false)?.0)
    }

    /// `group`, and with `consumer` an `OpenConsumer` of it, counted under the map's lock
    /// (so that a delete sees every consumer that can still reach the cell).
    pub(super) fn group_opened(
        &self,
        t: &Topic,
        name: &str,
        consumer: bool,
    ) -> Result<(Arc<GroupCell>, Option<OpenConsumer>)> {
        names::check(name)?;
        let mut groups = lock(&t.groups);
        let cell = groups
            .entry(name.to_owned())
            .or_insert_with(|| {
                let mut g = Group::new(t.reader.earliest());
                g.dirty_signal = self.groups_dirty.clone();
                g.mark_dirty();
                GroupCell::new(g)
            })
            .clone();
        let open = consumer.then(|| {
            cell.consumers.fetch_add(1, Ordering::AcqRel);
            OpenConsumer {
                cell: cell.clone(),
                key_ordered: false,
            }
        });
        Ok((cell, open))
    }

    /// The groups of `topic` with state, sorted by name (none for an unknown topic).
    pub fn groups(&self, topic: &str) -> Result<Vec<String>> {
        names::check(topic)?;
        let Some(t) = self.topic(topic) else {
            return Ok(Vec::new());
        };
        let mut names: Vec<String> = lock(&t.groups).keys().cloned().collect();
        names.sort_unstable();
        Ok(names)
    }

    /// Forgets the group: its cursor, attempt counters, epoch and dead-letter intents,
    /// durably. `GroupInUse` while a consumer of it is open; a missing group is `Ok`.
    /// Deliveries still out become stale: their late acks and nacks change nothing.
    pub fn delete_group(&self, topic: &str, group: &str) -> Result<()> {
        names::check(topic)?;
        names::check(group)?;
        let Some(t) = self.topic(topic) else {
            return Ok(());
        };
        let mut groups = lock(&t.groups);
        let Some(cell) = groups.get(group).cloned() else {
            return Ok(());
        };
        if cell.consumers.load(Ordering::Acquire) > 0 {
            return Err(Error::GroupInUse {
                topic: topic.to_owned(),
                group: group.to_owned(),
            });
        }
        let mut g = cell.lock();
        // Durable first: a failed commit leaves the group as it was.
        self.catalog
            .commit(&[Op::DeleteGroup(topic.to_owned(), group.to_owned())])?;
        g.deleted = true;
        groups.remove(group);
        tracing::info!(topic, group, "group deleted");
        Ok(())
    }

    /// The topic and group a reset or a low-level call names, created if new.
    pub(super) fn existing_group(
        &self,
        topic: &str,
        group: &str,
    ) -> Result<(Arc<Topic>, Arc<GroupCell>)> {
        names::check(topic)?;
        names::check(group)?;
        let t = self.topic_or_create(topic, 0)?;
        let g = self.group(&t, group)?;
        Ok((t, g))
    }

    /// Persists every group whose memory is ahead of the catalog (usually one transaction:
    /// the committer takes what is queued together).
    /// `closing`: deliveries still out are released, not recorded as in flight.
    pub fn commit_groups(&self, closing: bool) -> Result<()> {
        // Each group's image queued under its lock: a change another thread commits after
        // the lock is released must land after it (ops taken for all groups and queued at
        // the end could undo a reset and a nack committed in between).
        // No group turned dirty since the last look: nothing to walk (an idle instance
        // with thousands of topics costs nothing per tick). A loan of records to an
        // auto-ack consumer marks its group dirty when made, so the tick that follows
        // still takes it back and persists its auto-acks.
        if !closing && !self.groups_dirty.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let mut queued = self.catalog.queue();
        // Each image carries its group's lease: once durable, hand-outs may use it (a
        // deferred extension, `Lease::Defer`, lands this way).
        let mut leases = Vec::new();
        for t in self.all_topics() {
            for (name, g) in t.groups_snapshot() {
                let mut g = g.lock();
                if g.dirty || closing {
                    if closing {
                        let out: Vec<u64> = g.in_flight.keys().copied().collect();
                        for o in out {
                            g.take_out(o);
                            g.wait_again(o, 0);
                        }
                    }
                    queued.push(group_ops(&t.name, &name, &mut g));
                    leases.push((g.lease_durable.clone(), g.lease_end));
                }
            }
        }
        queued.wait()?;
        for (durable, end) in leases {
            durable.fetch_max(end, Ordering::AcqRel);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::test_support::{hand_out, publish_records, sim_engine};

    /// The ticker's commit of dirty groups takes each group's ops under its lock but
    /// queues them only after the last group: a reset and a nack of a group already
    /// passed, committed meanwhile, must not be undone by its older ops (found by review:
    /// an attempt-row deletion queued before a reset removed the row a nack after the
    /// reset wrote, so after a crash the poison message got its attempts back).
    #[test]
    fn the_tickers_commit_does_not_undo_a_later_nack_of_a_group_it_passed() {
        let fs = crate::io::sim::SimFs::new(13);
        let e = Arc::new(sim_engine(&fs));
        publish_records(&e, 10);
        let r1 = e.register_consumer("t", "g1", 1, 1).expect("consumer");
        let r2 = e.register_consumer("t", "g2", 1, 1).expect("consumer");
        // Offset 0: nacked once, then redelivered and auto-acked by the next hand-out, so
        // g1 is dirty with its attempt row to delete.
        let first = hand_out(&e, &r1, None);
        e.nack_delivery(&r1, first, "once", None, 1).expect("nack");
        let again = hand_out(&e, &r1, None);
        assert_eq!(again.offset, 0);
        hand_out(&e, &r1, Some(again));
        assert!(r1.group.lock().dirty);

        // The ticker passes g1 and waits for g2's lock.
        let g2 = r2.group.lock();
        let ticker = {
            let e = e.clone();
            std::thread::spawn(move || e.commit_groups(false))
        };
        let start = std::time::Instant::now();
        while r1.group.lock().dirty {
            assert!(start.elapsed().as_secs() < 30, "the ticker never took g1");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        e.reset("t", "g1", crate::queue::OffsetReset::Earliest)
            .expect("reset");
        let replay = hand_out(&e, &r1, None);
        assert_eq!(replay.offset, 0);
        e.nack_delivery(&r1, replay, "after the reset", None, 1)
            .expect("nack");
        drop(g2);
        ticker.join().expect("ticker").expect("commit");

        let rows = e.catalog.attempts("t", "g1").expect("attempts");
        assert_eq!(
            rows.get(&0).map(|a| a.attempts),
            Some(1),
            "the nack after the reset is durable"
        );
    }
}
