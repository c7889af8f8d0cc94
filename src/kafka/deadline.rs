//! Ack deadlines under `Mode=Kafka` (API.md: `Ack Deadline Ms` applies as in embedded
//! mode; `ack_deadline()` on the builder wins over it).
//!
//! - A consumer with a deadline gives each delivery it hands out a [`Deadline`]. The
//!   delivery and its group's member share it, so an extension moves both.
//! - The member keeps the deliveries out with a deadline in [`Deadlines`], each with a
//!   copy of its record (a `Bytes` clone), so that taking it back needs no read.
//! - `recv` takes back each delivery whose deadline passed, as a nack with the reason
//!   `ACK_DEADLINE_REASON` would: the attempt counted, the backoff, a redelivery or the
//!   dead-letter copy (`consumer.rs`).
//! - A late ack, nack or extension fails with `DeliveryExpired` and changes nothing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::format::record::Record;

/// The instant deadlines count from (an `Instant` does not fit an atomic).
static BASE: OnceLock<Instant> = OnceLock::new();

fn base() -> Instant {
    *BASE.get_or_init(Instant::now)
}

/// The longest deadline counted: past it, a deadline is "never" (no overflow).
const MAX_AFTER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// One delivery's ack deadline.
#[derive(Clone, Debug)]
pub(super) struct Deadline {
    /// Nanoseconds after `BASE`.
    at_ns: Arc<AtomicU64>,
    after: Duration,
}

impl Deadline {
    /// A deadline `after` from now.
    pub fn start(after: Duration) -> Deadline {
        let d = Deadline {
            at_ns: Arc::new(AtomicU64::new(0)),
            after: after.min(MAX_AFTER),
        };
        d.restart(Instant::now());
        d
    }

    /// When it passes.
    pub fn at(&self) -> Instant {
        base() + Duration::from_nanos(self.at_ns.load(Ordering::Acquire))
    }

    pub fn passed(&self, now: Instant) -> bool {
        self.at() <= now
    }

    /// Starts it again from `now`. The caller holds the member's lock, so the expiry
    /// check cannot run between its own check and this.
    pub fn restart(&self, now: Instant) {
        let ns = (now.saturating_duration_since(base()) + self.after).as_nanos();
        let ns = u64::try_from(ns).unwrap_or(u64::MAX);
        self.at_ns.store(ns, Ordering::Release);
    }
}

/// A delivery out with a deadline: its hand-out's ticket, the deadline, the record.
struct Out {
    ticket: u64,
    deadline: Deadline,
    record: Record,
}

/// One member's deliveries out with a deadline, by (partition, offset).
#[derive(Default)]
pub(super) struct Deadlines {
    out: BTreeMap<(i32, u64), Out>,
}

impl Deadlines {
    pub fn is_empty(&self) -> bool {
        self.out.is_empty()
    }

    /// Keeps the delivery of `record` (partition `p`, hand-out `ticket`) until it is
    /// settled or expires.
    pub fn insert(&mut self, p: i32, ticket: u64, deadline: &Deadline, record: Record) {
        let out = Out {
            ticket,
            deadline: deadline.clone(),
            record,
        };
        self.out.insert((p, out.record.offset), out);
    }

    /// Forgets the delivery of (`p`, `offset`) with `ticket` (acked, nacked, released).
    pub fn remove(&mut self, p: i32, offset: u64, ticket: u64) {
        if self
            .out
            .get(&(p, offset))
            .is_some_and(|o| o.ticket == ticket)
        {
            self.out.remove(&(p, offset));
        }
    }

    /// Takes the first delivery whose deadline passed by `now` and that `still_out`
    /// (partition, offset, ticket) says is still out: its partition, ticket and record.
    /// Entries no longer out (a reset, a revoke) are dropped on the way.
    pub fn take_expired(
        &mut self,
        now: Instant,
        still_out: impl Fn(i32, u64, u64) -> bool,
    ) -> Option<(i32, u64, Record)> {
        self.out.retain(|(p, o), out| still_out(*p, *o, out.ticket));
        let key = self
            .out
            .iter()
            .find(|(_, out)| out.deadline.passed(now))
            .map(|(k, _)| *k)?;
        let out = self.out.remove(&key)?;
        Some((key.0, out.ticket, out.record))
    }

    /// The earliest deadline of the deliveries out.
    pub fn next_at(&self) -> Option<Instant> {
        self.out.values().map(|o| o.deadline.at()).min()
    }

    /// Whether the delivery of (`p`, `offset`) with `ticket` is kept here.
    pub fn holds(&self, p: i32, offset: u64, ticket: u64) -> bool {
        self.out
            .get(&(p, offset))
            .is_some_and(|o| o.ticket == ticket)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use bytes::Bytes;

    use super::{Deadline, Deadlines};
    use crate::format::Headers;
    use crate::format::record::Record;

    fn record(offset: u64) -> Record {
        Record {
            offset,
            timestamp_ms: 0,
            headers: Headers::new(),
            payload: Bytes::from_static(b"x"),
        }
    }

    #[test]
    fn a_deadline_passes_after_its_time_and_restarts_from_now() {
        let d = Deadline::start(Duration::from_secs(60));
        let now = Instant::now();
        assert!(!d.passed(now));
        assert!(d.passed(now + Duration::from_secs(61)));
        let shared = d.clone();
        shared.restart(now + Duration::from_secs(30));
        assert!(
            !d.passed(now + Duration::from_secs(61)),
            "the clone moved both"
        );
        assert!(d.passed(now + Duration::from_secs(91)));
    }

    #[test]
    fn a_huge_deadline_is_never_an_overflow() {
        let d = Deadline::start(Duration::MAX);
        assert!(!d.passed(Instant::now() + Duration::from_secs(3600 * 24 * 365)));
    }

    #[test]
    fn only_expired_deliveries_still_out_are_taken() {
        let mut ds = Deadlines::default();
        let late = Deadline::start(Duration::ZERO);
        let later = Deadline::start(Duration::from_secs(60));
        ds.insert(0, 7, &late, record(1));
        ds.insert(0, 8, &later, record(2));
        ds.insert(1, 9, &late, record(1));
        let now = Instant::now() + Duration::from_millis(1);
        // Partition 1's delivery was revoked meanwhile: dropped, not taken.
        let got = ds.take_expired(now, |p, _, _| p == 0);
        let (p, ticket, rec) = got.expect("one expired");
        assert_eq!((p, ticket, rec.offset), (0, 7, 1));
        assert!(
            ds.take_expired(now, |_, _, _| true).is_none(),
            "the other is in time"
        );
        assert!(!ds.holds(1, 1, 9), "the revoked one is gone");
        assert_eq!(ds.next_at(), Some(later.at()));
    }

    #[test]
    fn a_settled_delivery_is_forgotten_only_by_its_own_ticket() {
        let mut ds = Deadlines::default();
        let d = Deadline::start(Duration::from_secs(1));
        ds.insert(0, 7, &d, record(3));
        ds.remove(0, 3, 6);
        assert!(ds.holds(0, 3, 7), "an older delivery's settle leaves it");
        ds.remove(0, 3, 7);
        assert!(ds.is_empty());
    }
}
