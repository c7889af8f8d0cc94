//! One consumer group's state: the ack floor, what is out, what waits for redelivery.
//!
//! **Invariants** (checked by `check` in debug builds):
//! - `cursor <= read_pos`; every offset in `[cursor, read_pos)` is in exactly one of
//!   `in_flight`, `redeliver` and `done_above`; `cursor` itself is never in `done_above`.
//! - The cursor moves only over offsets that are acked or dead-lettered (no skipping),
//!   except when retention deleted them (counted in `skipped`).
//! - The catalog's `lease_end` is above every offset handed out since the group's last
//!   reset (earlier deliveries are fenced by the epoch), so after an unclean stop the
//!   offsets that might have been out are bounded (`careful_until`): hand-outs
//!   stay below `lease_durable`, which only a durable image raises, and every image
//!   carries `lease_end >= lease_durable` (the lease is extended ahead of need, without
//!   waiting, half a lease before it runs out).
//!
//! Pure state: no I/O. The engine persists `record()` and attempt rows.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::info::GroupCounts;
use super::key_order::KeyOrder;
use crate::catalog::{AttemptRecord, GroupRecord};
use crate::format::record::Record;

/// Records handed out under one durable lease commit, at first.
pub const LEASE_RECORDS: u64 = 4096;

/// The most a lease grows to (see [`Group::lease_step`]): a crash's careful window
/// (`careful_until`) is at most about this much above the durable cursor.
pub const LEASE_RECORDS_MAX: u64 = 8 * LEASE_RECORDS;

/// A lease that took this long to need its next extension is larger than its consumer
/// needs: it halves (see [`Group::lease_step`]). Fifty times a catalog commit, so a
/// consumer on the edge of outrunning the commits does not swing between two sizes.
pub const LEASE_SHRINK_AFTER: Duration = Duration::from_millis(50);

/// What a hand-out needs from the group's lease first (see [`Group::lease_for`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// Commit an image carrying this lease and wait for it before handing out.
    Wait(u64),
    /// Hand out now; commit an image carrying this (larger) lease without waiting.
    Extend(u64),
    /// Hand out now; the group's memory now holds a larger lease for the next commit of
    /// its image to carry, the ticker's or a durable ack's (mark the group dirty; see
    /// [`Group::extend_deferred`]).
    Defer,
    /// The hand-out is below the durable lease and far from its end.
    Covered,
}

/// Set in [`Lent::next`] when the group takes its records back.
pub const LENT_TAKEN_BACK: u64 = 1 << 63;

/// Fresh offsets `[first, end)` lent to one auto-ack consumer, which hands them out
/// without the group lock: handing out `x` auto-acks `x - 1`, as `recv` does. `next` is
/// the offset the consumer hands out next (it moves it with a compare-and-swap, which
/// fails once `LENT_TAKEN_BACK` is set). `first` was handed out when the loan was made.
///
/// The loan never outlives the group lock being taken by anybody else: `reclaim` runs
/// first on every lock, so every other operation sees an ordinary state.
#[derive(Debug)]
pub struct Lent {
    pub first: u64,
    pub end: u64,
    pub token: u64,
    pub next: Arc<AtomicU64>,
}

#[derive(Debug)]
pub struct Group {
    pub cursor: u64,
    pub read_pos: u64,
    pub epoch: u64,
    /// offset -> token of the delivery that holds it.
    pub in_flight: BTreeMap<u64, u64>,
    pub done_above: BTreeSet<u64>,
    pub redeliver: BTreeSet<u64>,
    pub attempts: BTreeMap<u64, AttemptRecord>,
    pub dead_lettered: u64,
    pub skipped: u64,
    /// The lease every image carries (requested; may not be durable yet).
    pub lease_end: u64,
    /// The lease known durable: offsets below it may be handed out. Raised by the catalog
    /// commit that carried it (from the committer thread, hence atomic).
    pub lease_durable: Arc<AtomicU64>,
    /// The lease the last extension made without waiting asked for: while `lease_durable`
    /// is below it, that commit is still under way.
    pub lease_requested: u64,
    /// Records one lease extension covers: doubled (up to [`LEASE_RECORDS_MAX`]) whenever
    /// hand-outs catch up with an extension still being committed. A consumer faster than
    /// the catalog's commits would otherwise be held to half a lease per commit (measured:
    /// 4.5-8.5 M msg/s with 4,096, 8.0-8.5 M with 32,768). Halved (down to 4,096) when an
    /// extension comes [`LEASE_SHRINK_AFTER`] or more after the last one, so a consumer
    /// that was fast once (a backlog drained) and is slow now does not keep a large
    /// careful window. In memory only: every open starts at 4,096.
    pub lease_step: u64,
    /// When the lease was last extended without waiting.
    pub lease_extended_at: Option<Instant>,
    /// The last extension was left for the next commit of the group's image, the ticker's
    /// or a durable ack's ([`Lease::Defer`]): its consumer was at the log's end, about to
    /// park, and a catalog thread woken from it takes its CPU for the commit's few hundred
    /// microseconds (measured: every extension made the next delivery of a paced 10 k/s
    /// consumer 300-480 µs late).
    /// An eighth of a lease before the durable one runs out it is committed at once after
    /// all: the ticker commits every 100 ms by default, and from half a lease (2,048
    /// records) to an eighth, a consumer at 10 k/s has 150 ms for it.
    pub extend_deferred: bool,
    /// After an unclean stop: hand-outs below this are committed first (exact crash blame).
    pub careful_until: u64,
    pub max_in_flight: usize,
    /// Memory is ahead of the catalog (auto-acks, hand-outs). Set with
    /// [`Group::mark_dirty`], which also tells the ticker (`dirty_signal`).
    pub dirty: bool,
    /// Shared by every group of the instance: some group became dirty since the ticker's
    /// last look, so its commit tick walks the groups only then (`commit_groups`).
    pub dirty_signal: Arc<AtomicBool>,
    /// Attempt rows to delete at the next commit (offsets auto-acked after a nack).
    pub stale_attempts: Vec<u64>,
    /// Redeliveries a panic charge took to the attempt limit: dead-lettered by the next
    /// hand-out (so hand-outs need not look through every redelivery's attempts).
    pub charged_out: Vec<u64>,
    pub next_token: u64,
    /// Records from `read_pos` on, read ahead in batches.
    pub prefetch: VecDeque<Record>,
    /// Deleted (`Engine::delete_group`): its images persist nothing, and no delivery
    /// of it is held any more (a late ack or nack is stale).
    pub deleted: bool,
    /// The catalog's committer has this group's snapshotter queued (see `Catalog::ack_ticket`).
    pub snapshot_queued: bool,
    /// Records lent to an auto-ack consumer (only between two locks, see [`Lent`]).
    pub lent: Option<Lent>,
    /// Waiting offsets (a subset of `redeliver`) not to be delivered before a wall-clock
    /// time (ms since the Unix epoch): a nack with a delay or a backoff. Durable in their
    /// attempt rows. Empty in a group that never delays, so its hand-outs never look.
    pub delayed: BTreeMap<u64, u64>,
    /// Offsets out (a subset of `in_flight`) with an ack deadline. In memory only: after
    /// an unclean stop every delivery that was out is charged anyway.
    pub deadlines: BTreeMap<u64, Instant>,
    /// The keys of what is out or waiting, in a key-ordered group.
    pub keys: Option<KeyOrder>,
    /// Open key-ordered consumers: the group orders by key while there is one.
    pub key_ordered_consumers: usize,
    /// What the group did since the instance opened (`GroupInfo::counts`); the records
    /// of a loan are counted when it is taken back, which every look at the group (its
    /// cell's lock) does first.
    pub counts: GroupCounts,
}

/// What the waiting offsets offer a hand-out (see [`Group::pick_waiting`]).
enum Waiting {
    /// This one may go now.
    Ready(u64),
    /// The first one waits for its time, and with `max_in_flight(1)` so does everything.
    Blocked,
    /// Nothing waiting may go: fresh records may.
    Nothing,
}

impl Group {
    pub fn new(cursor: u64) -> Group {
        Group::from_record(&GroupRecord {
            cursor,
            lease_end: cursor,
            ..GroupRecord::default()
        })
    }

    /// Rebuilds a group from its durable image. Everything between the cursor and the
    /// highest offset known to be done or out is queued for (re)delivery, in order.
    pub fn from_record(r: &GroupRecord) -> Group {
        let done_above: BTreeSet<u64> = r
            .done_above
            .iter()
            .copied()
            .filter(|&o| o > r.cursor)
            .collect();
        let top = [
            done_above.last().map(|o| o + 1),
            r.in_flight.iter().max().map(|o| o + 1),
        ]
        .into_iter()
        .flatten()
        .fold(r.cursor, u64::max);
        let redeliver = (r.cursor..top)
            .filter(|o| !done_above.contains(o))
            .collect();
        Group {
            cursor: r.cursor,
            read_pos: top,
            epoch: r.epoch,
            in_flight: BTreeMap::new(),
            done_above,
            redeliver,
            attempts: BTreeMap::new(),
            dead_lettered: r.dead_lettered,
            skipped: r.skipped,
            lease_end: r.lease_end.max(r.cursor),
            // A new group's lease is in no catalog yet; a stored one is durable.
            lease_durable: Arc::new(AtomicU64::new(r.lease_end)),
            lease_requested: 0,
            lease_step: LEASE_RECORDS,
            lease_extended_at: None,
            extend_deferred: false,
            careful_until: 0,
            max_in_flight: 1,
            dirty: false,
            dirty_signal: Arc::default(),
            stale_attempts: Vec::new(),
            charged_out: Vec::new(),
            next_token: 1,
            prefetch: VecDeque::new(),
            deleted: false,
            snapshot_queued: false,
            lent: None,
            delayed: BTreeMap::new(),
            deadlines: BTreeMap::new(),
            keys: None,
            key_ordered_consumers: 0,
            counts: GroupCounts::default(),
        }
    }

    /// Memory is now ahead of the catalog: the ticker's next commit takes this group.
    /// The shared signal is touched only when the group turns dirty (once per tick at
    /// most), not per hand-out.
    pub fn mark_dirty(&mut self) {
        if !self.dirty {
            self.dirty = true;
            self.dirty_signal.store(true, Ordering::Release);
        }
    }

    /// The durable image of this group and its sequence number: a later image has a
    /// higher one, so the catalog never lets an older image overwrite a newer one. The
    /// numbers are shared by every group of the process, so a group deleted and made
    /// anew under the same name starts above every image of the old one.
    pub fn snapshot(&mut self) -> (GroupRecord, u64) {
        static IMAGES: AtomicU64 = AtomicU64::new(0);
        (self.record(), IMAGES.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// The durable image of this group.
    pub fn record(&self) -> GroupRecord {
        GroupRecord {
            cursor: self.cursor,
            epoch: self.epoch,
            done_above: self.done_above.iter().copied().collect(),
            in_flight: self.in_flight.keys().copied().collect(),
            lease_end: self.lease_end,
            dead_lettered: self.dead_lettered,
            skipped: self.skipped,
        }
    }

    /// What handing out `offset` (outside careful mode) needs from the lease. Grows the
    /// lease's step when hand-outs have caught up with an extension still being committed,
    /// shrinks it when they took long to need the next one. `now` is asked only when the
    /// lease is extended (not a clock read per hand-out).
    /// `at_end`: nothing is readable after `offset` yet, so the consumer will likely park
    /// next and the extension may wait for the ticker ([`Lease::Defer`]).
    pub fn lease_for(&mut self, offset: u64, at_end: bool, now: impl FnOnce() -> Instant) -> Lease {
        let durable = self.lease_durable.load(Ordering::Acquire);
        // The last extension made without waiting has not landed yet.
        let outran = durable < self.lease_requested;
        if offset >= durable {
            if outran {
                self.grow_lease_step();
            }
            self.extend_deferred = false;
            Lease::Wait(self.lease_end.max(offset + self.lease_step))
        } else if self.extend_deferred && offset + self.lease_step / 8 >= durable {
            // No ticker commit carried the deferred extension in time: commit it now,
            // still an eighth of a lease ahead of need.
            self.extend_deferred = false;
            Lease::Extend(self.lease_end)
        } else if offset + self.lease_step / 2 >= self.lease_end {
            let now = now();
            if outran {
                self.grow_lease_step();
            } else if self
                .lease_extended_at
                .is_some_and(|at| now.saturating_duration_since(at) >= LEASE_SHRINK_AFTER)
            {
                self.lease_step = (self.lease_step / 2).max(LEASE_RECORDS);
            }
            self.lease_extended_at = Some(now);
            // Half a lease ahead of need, so the commit usually lands before it is needed.
            let lease_end = offset + self.lease_step;
            self.lease_end = lease_end;
            self.lease_requested = lease_end;
            self.extend_deferred = at_end;
            if at_end {
                Lease::Defer
            } else {
                Lease::Extend(lease_end)
            }
        } else {
            Lease::Covered
        }
    }

    fn grow_lease_step(&mut self) {
        self.lease_step = (self.lease_step * 2).min(LEASE_RECORDS_MAX);
        debug_assert!(self.lease_step.is_power_of_two() && self.lease_step >= LEASE_RECORDS);
    }

    /// How far the ack floor may trail the read position: bounds `done_above`.
    pub fn span_max(&self) -> u64 {
        (self.max_in_flight as u64).saturating_mul(4).max(1024)
    }

    /// After a power cut under `Sync=None` took records the group had already seen (its
    /// acks are durable, the log's tail was not): forgets everything at or above `next`,
    /// the log's new end, so the records published there from now on are new to it.
    /// Returns whether anything changed.
    pub fn cut_back_to(&mut self, next: u64) -> bool {
        let beyond = self.cursor > next
            || self.read_pos > next
            || self.in_flight.range(next..).next().is_some()
            || self.done_above.range(next..).next().is_some()
            || self.attempts.range(next..).next().is_some();
        if !beyond {
            return false;
        }
        self.cursor = self.cursor.min(next);
        self.read_pos = self.read_pos.min(next);
        self.in_flight.retain(|&o, _| o < next);
        self.redeliver.retain(|&o| o < next);
        self.done_above.retain(|&o| o < next);
        self.delayed.retain(|&o, _| o < next);
        self.deadlines.retain(|&o, _| o < next);
        self.forget_keys();
        let gone: Vec<u64> = self.attempts.range(next..).map(|(o, _)| *o).collect();
        for o in gone {
            self.attempts.remove(&o);
            self.stale_attempts.push(o);
        }
        self.prefetch.retain(|r| r.offset < next);
        self.mark_dirty();
        true
    }

    /// Moves a cursor that retention left behind up to `earliest`; returns how many
    /// unfinished records were skipped.
    pub fn clamp_to(&mut self, earliest: u64) -> u64 {
        if self.cursor >= earliest {
            return 0;
        }
        let done_below = self.done_above.range(..earliest).count() as u64;
        let skipped = earliest - self.cursor - done_below;
        self.cursor = earliest;
        self.read_pos = self.read_pos.max(earliest);
        self.in_flight.retain(|&o, _| o >= earliest);
        self.redeliver.retain(|&o| o >= earliest);
        self.done_above.retain(|&o| o >= earliest);
        self.delayed.retain(|&o, _| o >= earliest);
        self.deadlines.retain(|&o, _| o >= earliest);
        self.forget_keys();
        let gone: Vec<u64> = self.attempts.range(..earliest).map(|(o, _)| *o).collect();
        for o in gone {
            self.attempts.remove(&o);
            self.stale_attempts.push(o);
        }
        while self
            .prefetch
            .front()
            .is_some_and(|r| r.offset < self.read_pos)
        {
            self.prefetch.pop_front();
        }
        self.skipped += skipped;
        self.mark_dirty();
        self.advance();
        skipped
    }

    /// The offset the next delivery would take, if any, given the log end. `now_ms` (the
    /// wall clock) is asked only when something waits for its time or keys are ordered.
    pub fn next_offset(&mut self, log_next: u64, now_ms: impl FnOnce() -> u64) -> Option<u64> {
        if self.in_flight.len() >= self.max_in_flight {
            return None;
        }
        if self.delayed.is_empty() && self.keys.is_none() {
            if let Some(&o) = self.redeliver.first() {
                return Some(o);
            }
        } else {
            match self.pick_waiting(now_ms()) {
                Waiting::Ready(o) => return Some(o),
                Waiting::Blocked => return None,
                Waiting::Nothing => {}
            }
        }
        self.next_fresh(log_next)
    }

    /// The read position, if a fresh record may be handed out there (skipping offsets
    /// already done above it). Not the waiting ones: see [`Group::next_offset`].
    pub fn next_fresh(&mut self, log_next: u64) -> Option<u64> {
        if self.in_flight.len() >= self.max_in_flight {
            return None;
        }
        while self.done_above.contains(&self.read_pos) {
            self.read_pos += 1;
        }
        if self.read_pos >= log_next || self.read_pos - self.cursor >= self.span_max() {
            return None;
        }
        Some(self.read_pos)
    }

    /// The first waiting offset whose time has come and whose key is free. With
    /// `max_in_flight(1)` (strict order) nothing passes a waiting offset.
    fn pick_waiting(&self, now_ms: u64) -> Waiting {
        let strict = self.max_in_flight == 1;
        for &o in &self.redeliver {
            let due = self.delayed.get(&o).is_none_or(|&at| at <= now_ms);
            let free = self.keys.as_ref().is_none_or(|k| k.may_redeliver(o));
            if due && free {
                return Waiting::Ready(o);
            }
            if strict {
                return Waiting::Blocked;
            }
        }
        Waiting::Nothing
    }

    /// A fresh record at the read position whose key has an earlier record out or
    /// waiting: it waits too (behind that one), and the read position moves on.
    pub fn hold_back(&mut self, offset: u64, key: Option<super::key_order::Key>) {
        self.read_past(offset);
        self.redeliver.insert(offset);
        if let Some(k) = &mut self.keys {
            k.add(offset, key);
        }
        self.check();
    }

    /// When the group next has something to do on its own: the earliest time (wall
    /// clock, ms, after `now_ms`) a waiting offset becomes due and could then go, and the
    /// earliest deadline of one out. A due time that could not go (the slots are full,
    /// an earlier one waits in strict order, its key is out) is not one: an ack or the
    /// earlier one's turn wakes the consumer then.
    pub fn next_due(&self, now_ms: u64) -> (Option<u64>, Option<Instant>) {
        let deadline = self.deadlines.values().min().copied();
        if self.in_flight.len() >= self.max_in_flight {
            return (None, deadline);
        }
        let strict = self.max_in_flight == 1;
        let may_go = |o: &u64| self.keys.as_ref().is_none_or(|k| k.may_redeliver(*o));
        let due = if strict {
            self.redeliver
                .first()
                .and_then(|o| self.delayed.get(o))
                .copied()
        } else {
            self.delayed
                .iter()
                .filter(|(o, _)| may_go(o))
                .map(|(_, &at)| at)
                .min()
        };
        (due.filter(|&at| at > now_ms), deadline)
    }

    /// Offsets out whose ack deadline has passed at `now`.
    pub fn expired(&self, now: Instant) -> Vec<u64> {
        self.deadlines
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(o, _)| *o)
            .collect()
    }

    /// Takes `offset` out of `in_flight` (and its deadline); whether it was there.
    pub fn take_out(&mut self, offset: u64) -> bool {
        self.deadlines.remove(&offset);
        self.in_flight.remove(&offset).is_some()
    }

    /// Queues `offset` (taken out) for redelivery, not before `not_before_ms` (0: at once).
    pub fn wait_again(&mut self, offset: u64, not_before_ms: u64) {
        self.redeliver.insert(offset);
        if not_before_ms > 0 {
            self.delayed.insert(offset, not_before_ms);
        }
    }

    /// Takes `offset` out of the waiting set (and its delay); whether it was there.
    fn take_waiting(&mut self, offset: u64) -> bool {
        self.delayed.remove(&offset);
        self.redeliver.remove(&offset)
    }

    /// Bulk changes: a key-ordered group reads the keys of what is out or waiting again.
    fn forget_keys(&mut self) {
        if let Some(k) = &mut self.keys {
            k.invalidate();
        }
    }

    /// Moves the read position past `offset`, the next fresh offset, and drops the
    /// read-ahead below it.
    fn read_past(&mut self, offset: u64) {
        debug_assert_eq!(offset, self.read_pos);
        self.read_pos = offset + 1;
        while self
            .prefetch
            .front()
            .is_some_and(|r| r.offset < self.read_pos)
        {
            self.prefetch.pop_front();
        }
    }

    /// Records `offset` as handed out; returns the delivery's token.
    pub fn hand_out(&mut self, offset: u64) -> u64 {
        let again = self.take_waiting(offset);
        if !again {
            self.read_past(offset);
        }
        self.counts.delivered += 1;
        self.counts.redelivered += u64::from(again);
        let token = self.next_token;
        self.next_token += 1;
        self.in_flight.insert(offset, token);
        self.mark_dirty();
        self.check();
        token
    }

    /// Lends `offset` (the read position, handed out now) and the fresh offsets after it
    /// up to `end` (exclusive) to one consumer; returns the token and the shared position.
    pub fn lend(&mut self, offset: u64, end: u64) -> (u64, Arc<AtomicU64>) {
        debug_assert!(self.lent.is_none() && self.redeliver.is_empty());
        debug_assert_eq!(offset, self.read_pos);
        debug_assert!(offset < end && end <= self.lease_durable.load(Ordering::Acquire));
        debug_assert!(self.attempts.range(offset..end).next().is_none());
        self.read_pos = end;
        while self.prefetch.front().is_some_and(|r| r.offset < end) {
            self.prefetch.pop_front();
        }
        let token = self.next_token;
        self.next_token += 1;
        let next = Arc::new(AtomicU64::new(offset + 1));
        self.lent = Some(Lent {
            first: offset,
            end,
            token,
            next: next.clone(),
        });
        self.mark_dirty();
        self.check();
        (token, next)
    }

    /// Takes lent records back: those the consumer moved past are finished (auto-acked),
    /// the one it handed out last is in flight under the loan's token, and the rest are
    /// fresh again (the read position moves back to them).
    pub fn reclaim(&mut self) {
        let Some(l) = self.lent.take() else {
            return;
        };
        let next = l.next.fetch_or(LENT_TAKEN_BACK, Ordering::AcqRel) & !LENT_TAKEN_BACK;
        debug_assert!(l.first < next && next <= l.end);
        debug_assert_eq!(
            self.read_pos, l.end,
            "nothing moves the read position during a loan"
        );
        self.read_pos = next;
        let out = next - 1;
        self.counts.delivered += next - l.first;
        self.counts.acked += out - l.first;
        for o in l.first..out {
            if o == self.cursor {
                self.cursor += 1;
                self.advance();
            } else {
                self.done_above.insert(o);
            }
        }
        self.in_flight.insert(out, l.token);
        self.mark_dirty();
        self.check();
    }

    /// The attempt number a delivery of `offset` carries.
    pub fn attempt_of(&self, offset: u64) -> u32 {
        self.attempts
            .get(&offset)
            .map_or(0, |a| a.attempts)
            .saturating_add(1)
    }

    /// Whether `token` still holds `offset` in `epoch`.
    pub fn holds(&self, offset: u64, epoch: u64, token: u64) -> bool {
        !self.deleted && epoch == self.epoch && self.in_flight.get(&offset) == Some(&token)
    }

    /// Takes the cursor offset out of whatever state it is in (for low-level ack/nack),
    /// so that it can be finished or nacked. Returns false if it is past the log end.
    pub fn take_cursor(&mut self, log_next: u64) -> bool {
        let o = self.cursor;
        if o >= log_next {
            return false;
        }
        if !self.take_out(o) && !self.take_waiting(o) {
            self.read_past(o);
            // A fresh record not seen by the key order: it may be nacked back.
            self.forget_keys();
        }
        true
    }

    /// Whether `offset` is still to be finished: at or above the cursor, and not done.
    pub fn unfinished(&self, offset: u64) -> bool {
        offset >= self.cursor && !self.done_above.contains(&offset)
    }

    /// Finishes `offset` (out or waiting) as the attempt that reached the limit. It counts
    /// as dead-lettered if it was `copied`, else as skipped (retention had deleted it:
    /// there was nothing to copy, as for every unfinished record retention takes).
    pub fn finish_past_limit(&mut self, offset: u64, copied: bool) {
        self.take_waiting(offset);
        self.take_out(offset);
        self.finish(offset);
        if copied {
            self.dead_lettered += 1;
        } else {
            self.skipped += 1;
        }
    }

    /// Marks `offset` (already taken out of `in_flight`/`redeliver`) as finished and
    /// advances the floor over every finished offset in a row.
    pub fn finish(&mut self, offset: u64) {
        debug_assert!(offset >= self.cursor && offset < self.read_pos);
        if self.attempts.remove(&offset).is_some() {
            self.stale_attempts.push(offset);
        }
        if let Some(k) = &mut self.keys {
            k.remove(offset);
        }
        if offset > self.cursor {
            self.done_above.insert(offset);
        } else {
            self.cursor += 1;
            self.advance();
        }
        self.mark_dirty();
        self.check();
    }

    fn advance(&mut self) {
        while self.done_above.remove(&self.cursor) {
            self.cursor += 1;
        }
        self.read_pos = self.read_pos.max(self.cursor);
    }

    /// Makes `offset` (and everything before it) part of `[cursor, read_pos)`, queuing
    /// the offsets not yet handed out for delivery, so that `offset` can be finished.
    pub fn materialize_to(&mut self, offset: u64) {
        while self.read_pos <= offset {
            if !self.done_above.contains(&self.read_pos) {
                self.redeliver.insert(self.read_pos);
            }
            self.read_pos += 1;
        }
        self.prefetch.clear();
        self.forget_keys();
        self.check();
    }

    /// Resets to `to`: a new epoch, nothing out, no attempts.
    pub fn reset(&mut self, to: u64) {
        self.epoch += 1;
        // Nothing handed out before the reset can be acked or blamed into the new state
        // (the epoch fences it), so the lease starts over at `to`: otherwise a crash after
        // a reset to Earliest made the whole replay up to the old lease careful (one
        // commit per record). A new cell, so that an extension of the old lease still
        // being committed raises that one, not this.
        self.lease_end = to;
        self.lease_durable = Arc::new(AtomicU64::new(to));
        self.lease_requested = 0;
        self.extend_deferred = false;
        self.cursor = to;
        self.read_pos = to;
        self.in_flight.clear();
        self.done_above.clear();
        self.redeliver.clear();
        self.delayed.clear();
        self.deadlines.clear();
        self.forget_keys();
        self.attempts.clear();
        self.stale_attempts.clear();
        self.prefetch.clear();
        self.careful_until = 0;
        self.mark_dirty();
        self.check();
    }

    /// Debug-build check of the partition invariant (lent offsets count as out).
    pub fn check(&self) {
        let lent = self.lent.as_ref().map_or(0, |l| l.end - l.first);
        debug_assert!(self.cursor <= self.read_pos, "cursor past read position");
        debug_assert!(!self.done_above.contains(&self.cursor));
        debug_assert!(
            self.in_flight
                .keys()
                .all(|&o| o >= self.cursor && o < self.read_pos)
        );
        debug_assert!(
            self.redeliver
                .iter()
                .all(|&o| o >= self.cursor && o < self.read_pos)
        );
        debug_assert!(
            self.done_above
                .iter()
                .all(|&o| o > self.cursor && o < self.read_pos)
        );
        debug_assert_eq!(
            self.read_pos - self.cursor,
            (self.in_flight.len() + self.redeliver.len() + self.done_above.len()) as u64 + lent,
            "every offset between cursor and read position is out, waiting or done"
        );
        debug_assert!(self.delayed.keys().all(|o| self.redeliver.contains(o)));
        debug_assert!(
            self.deadlines
                .keys()
                .all(|o| self.in_flight.contains_key(o))
        );
        if let Some(k) = &self.keys {
            k.check(|o| self.in_flight.contains_key(&o) || self.redeliver.contains(&o));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out `offsets` the way the engine does, with extensions landing when `lands`
    /// says (a `Wait` always lands, with every extension committed before it); checks
    /// that each hand-out is below the durable lease. Returns the steps seen at each `Wait`.
    fn hand_out_all(
        g: &mut Group,
        offsets: std::ops::Range<u64>,
        lands: impl Fn(u64) -> bool,
    ) -> Vec<u64> {
        hand_out_timed(g, offsets, lands, Instant::now(), Duration::ZERO)
    }

    /// `hand_out_all` on a clock that reads `start` at the first hand-out and moves
    /// `per_record` per hand-out.
    fn hand_out_timed(
        g: &mut Group,
        offsets: std::ops::Range<u64>,
        lands: impl Fn(u64) -> bool,
        start: Instant,
        per_record: Duration,
    ) -> Vec<u64> {
        let first = offsets.start;
        let mut waits = Vec::new();
        for offset in offsets {
            let now = start + per_record * u32::try_from(offset - first).expect("small");
            match g.lease_for(offset, false, || now) {
                Lease::Wait(end) => {
                    g.lease_end = end;
                    g.lease_durable.fetch_max(end, Ordering::AcqRel);
                    waits.push(g.lease_step);
                }
                Lease::Extend(end) if lands(offset) => {
                    g.lease_durable.fetch_max(end, Ordering::AcqRel);
                }
                Lease::Extend(_) | Lease::Covered => {}
                Lease::Defer => unreachable!("never at the log's end here"),
            }
            let durable = g.lease_durable.load(Ordering::Acquire);
            assert!(
                offset < durable,
                "{offset} handed out at durable lease {durable}"
            );
            assert!(g.lease_end >= durable);
        }
        waits
    }

    /// A consumer at the log's end defers its extensions to the ticker's commit; when
    /// a ticker commit (it writes the group's image, lease included) lands, nothing is
    /// committed from the hand-out path; when none does, the extension is committed a
    /// eighth of a lease ahead of need, and no hand-out is ever above the durable lease.
    #[test]
    fn at_the_logs_end_an_extension_waits_for_the_ticker_but_never_past_need() {
        for ticker_lands in [true, false] {
            let mut g = Group::new(0);
            let (mut defers, mut extends, mut waits) = (0, 0, 0);
            for offset in 0..10 * LEASE_RECORDS {
                match g.lease_for(offset, true, Instant::now) {
                    Lease::Wait(end) => {
                        waits += 1;
                        g.lease_end = end;
                        g.lease_durable.fetch_max(end, Ordering::AcqRel);
                    }
                    Lease::Extend(end) => {
                        extends += 1;
                        assert!(end == g.lease_end && !g.extend_deferred);
                        let left = g.lease_durable.load(Ordering::Acquire) - offset;
                        assert_eq!(
                            left,
                            g.lease_step / 8,
                            "committed an eighth of a lease ahead"
                        );
                        g.lease_durable.fetch_max(end, Ordering::AcqRel);
                    }
                    Lease::Defer => {
                        defers += 1;
                        assert!(g.extend_deferred && g.lease_requested == g.lease_end);
                        if ticker_lands {
                            g.lease_durable.fetch_max(g.lease_end, Ordering::AcqRel);
                        }
                    }
                    Lease::Covered => {}
                }
                assert!(offset < g.lease_durable.load(Ordering::Acquire));
            }
            assert_eq!(waits, 1, "only the first hand-out waits");
            assert!(defers >= 10);
            if ticker_lands {
                assert_eq!(extends, 0);
            } else {
                assert_eq!(
                    extends, defers,
                    "each deferral committed before it was needed"
                );
            }
            assert_eq!(g.lease_step, LEASE_RECORDS, "deferring is not outrunning");
        }
    }

    #[test]
    fn a_grown_lease_shrinks_back_once_its_consumer_is_slow() {
        let mut g = Group::new(0);
        let t0 = Instant::now();
        let (l, never, always) = (LEASE_RECORDS, |_| false, |_| true);
        hand_out_timed(&mut g, 0..40 * l, never, t0, Duration::ZERO);
        assert_eq!(g.lease_step, LEASE_RECORDS_MAX);
        // Still fast (1 µs a record: half a lease in ~16 ms): it keeps its size.
        let fast = Duration::from_micros(1);
        hand_out_timed(&mut g, 40 * l..80 * l, always, t0, fast);
        assert_eq!(g.lease_step, LEASE_RECORDS_MAX);
        // Slow (100 µs a record): each extension halves it, down to where it started.
        let t1 = t0 + fast * u32::try_from(40 * l).expect("small");
        let slow = Duration::from_micros(100);
        hand_out_timed(&mut g, 80 * l..120 * l, always, t1, slow);
        assert_eq!(g.lease_step, LEASE_RECORDS);
    }

    #[test]
    fn the_lease_stays_small_while_its_commits_keep_up() {
        let mut g = Group::new(0);
        let waits = hand_out_all(&mut g, 0..20 * LEASE_RECORDS, |_| true);
        // Only the first hand-out waits; every extension landed before it was needed.
        assert_eq!(waits, vec![LEASE_RECORDS]);
        assert_eq!(g.lease_step, LEASE_RECORDS);
        assert!(g.lease_end <= 20 * LEASE_RECORDS + LEASE_RECORDS);
    }

    #[test]
    fn the_lease_grows_while_hand_outs_outrun_its_commits_up_to_its_bound() {
        let mut g = Group::new(0);
        // No extension lands on its own: each time hand-outs reach the durable lease they
        // wait, and the lease doubles, until it stops at its bound.
        let waits = hand_out_all(&mut g, 0..40 * LEASE_RECORDS, |_| false);
        assert_eq!(
            &waits[..4],
            &[
                LEASE_RECORDS,
                2 * LEASE_RECORDS,
                4 * LEASE_RECORDS,
                LEASE_RECORDS_MAX
            ]
        );
        assert!(waits.iter().all(|&w| w <= LEASE_RECORDS_MAX));
        assert_eq!(g.lease_step, LEASE_RECORDS_MAX);
        // The careful window a crash would leave stays bounded by the largest lease.
        assert!(g.lease_end <= 40 * LEASE_RECORDS + LEASE_RECORDS_MAX);
        // Once commits keep up again it stays where it is (in memory until the next open).
        let waits = hand_out_all(&mut g, 40 * LEASE_RECORDS..80 * LEASE_RECORDS, |_| true);
        assert!(waits.len() <= 1, "{waits:?}");
        assert_eq!(g.lease_step, LEASE_RECORDS_MAX);
    }

    #[test]
    fn cut_back_forgets_everything_at_or_past_the_new_log_end() {
        // Durable state of a group that acked 0..10 and 12, had 10 and 11 out and a nack
        // count on 11, when a power cut took the log back to 8 records.
        let r = GroupRecord {
            cursor: 10,
            done_above: vec![12],
            in_flight: vec![10, 11],
            lease_end: 14,
            ..GroupRecord::default()
        };
        let mut g = Group::from_record(&r);
        g.attempts.insert(11, AttemptRecord::default());
        g.attempts.insert(7, AttemptRecord::default());
        assert!(g.cut_back_to(8));
        assert_eq!((g.cursor, g.read_pos), (8, 8));
        assert!(g.done_above.is_empty() && g.in_flight.is_empty() && g.redeliver.is_empty());
        assert_eq!(g.attempts.keys().copied().collect::<Vec<_>>(), vec![7]);
        assert_eq!(g.stale_attempts, vec![11], "the catalog row is deleted too");
        assert!(g.dirty);
        // Nothing at or past the end: nothing changes.
        let mut h = Group::from_record(&GroupRecord {
            cursor: 5,
            ..GroupRecord::default()
        });
        assert!(!h.cut_back_to(8));
        assert_eq!((h.cursor, h.read_pos), (5, 5));
    }

    /// Found by review: a waiting consumer was rung every millisecond for a record that
    /// was due but could not go (the slots full, or an earlier one waiting in strict
    /// order). `next_due` gives only times at which something could go.
    #[test]
    fn next_due_names_only_what_could_go_then() {
        let mut g = Group::new(0);
        g.max_in_flight = 2;
        for o in 0..2 {
            assert_eq!(g.next_offset(3, || 0), Some(o));
            g.hand_out(o);
        }
        // 0 waits until 100; 1 is out; the fresh 2 goes out: the slots are full.
        g.take_out(0);
        g.wait_again(0, 100);
        assert_eq!(g.next_offset(3, || 10), Some(2));
        g.hand_out(2);
        assert_eq!(
            g.next_due(10),
            (None, None),
            "no slot: an ack wakes the consumer"
        );
        g.take_out(2);
        g.finish(2);
        assert_eq!(g.next_due(10).0, Some(100));
        assert_eq!(
            g.next_due(100).0,
            None,
            "due already: no timer, it goes now"
        );
        // Strict order: only the first waiting one's time counts.
        let mut s = Group::new(0);
        for o in 0..2 {
            s.hand_out(o);
            s.take_out(o);
        }
        s.wait_again(0, 500);
        s.wait_again(1, 50);
        assert_eq!(s.next_due(10).0, Some(500));
        assert_eq!(s.next_offset(2, || 60), None, "1 is due but waits behind 0");
        s.check();
    }

    fn grp_attempts(g: &Group) -> Vec<u64> {
        g.attempts.keys().copied().collect()
    }

    #[test]
    fn out_of_order_acks_wait_above_the_floor() {
        let mut g = Group::new(0);
        g.max_in_flight = 10;
        for o in 0..5 {
            assert_eq!(g.next_offset(5, || 0), Some(o));
            g.hand_out(o);
        }
        for o in [1, 2, 4] {
            g.in_flight.remove(&o);
            g.finish(o);
        }
        assert_eq!(g.cursor, 0);
        g.in_flight.remove(&0);
        g.finish(0);
        assert_eq!(g.cursor, 3);
        assert!(grp_attempts(&g).is_empty());
        let r = g.record();
        let back = Group::from_record(&GroupRecord {
            in_flight: vec![],
            ..r
        });
        assert_eq!(back.cursor, 3);
        assert_eq!(back.redeliver.iter().copied().collect::<Vec<_>>(), vec![3]);
        back.check();
    }
}
