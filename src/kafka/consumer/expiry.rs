//! Ack deadlines on the consumer side under `Mode=Kafka` (the member's bookkeeping is
//! `kafka/deadline.rs`):
//! - `recv` takes back each delivery past its deadline as a nack of its own
//!   (`take_expired`), and waits no longer than the next deadline;
//! - `try_recv` does it without waiting (`take_back_expired_now`);
//! - a delivery's `deadline`, `extend_deadline`, and the `DeliveryExpired` it fails with.

use std::time::{Duration, Instant};

use super::super::deadline::Deadline;
use super::{KafkaConsumer, KafkaDelivery, Nacked, Then, dead_letter};
use crate::error::{Error, Result};
use crate::queue::ACK_DEADLINE_REASON;

impl KafkaConsumer {
    /// A delivery of this group out past its deadline, taken back: made a delivery of
    /// the caller's own, for `next` to nack (the expired one goes stale).
    pub(super) fn take_expired(&self) -> Option<KafkaDelivery> {
        let g = &self.group;
        let mut guard = g.shared.lock();
        let st = &mut *guard;
        if st.deadlines.is_empty() {
            return None;
        }
        let (p, ticket, record) = {
            let parts = &st.parts;
            let still_out = |p: i32, o: u64, t: u64| {
                parts
                    .get(&p)
                    .is_some_and(|part| part.out.get(&o) == Some(&t))
            };
            st.deadlines.take_expired(Instant::now(), still_out)?
        };
        debug_assert!(st.parts.contains_key(&p), "taken only while out");
        st.counts.expired += 1;
        let part = st.parts.get_mut(&p)?;
        let o = record.offset;
        let mine = super::super::group::new_epoch();
        debug_assert_eq!(part.out.get(&o), Some(&ticket));
        part.out.insert(o, mine);
        let attempt = part
            .floor
            .failed(o)
            .map_or(1, |f| f.attempts.saturating_add(1));
        Some(KafkaDelivery {
            group: g.clone(),
            partition: p,
            epoch: part.epoch,
            ticket: mine,
            record,
            attempt,
            settled: false,
            auto: false,
            deadline: None,
        })
    }

    /// How long until the group's next ack deadline passes.
    pub(super) fn until_next_deadline(&self) -> Option<Duration> {
        let at = self.group.shared.lock().deadlines.next_at()?;
        Some(at.saturating_duration_since(Instant::now()) + Duration::from_millis(1))
    }

    /// `next`'s take-back of the deliveries past their deadline, without waiting (so an
    /// expired delivery frees its slot for `try_recv` too): each is nacked under the lock,
    /// its attempt committed with the next commit. One at the attempt limit is
    /// dead-lettered on the caller's tokio runtime; with none, it is put back, and its
    /// next nack or expiry dead-letters it.
    pub(super) fn take_back_expired_now(&self) {
        while let Some(mut d) = self.take_expired() {
            let epoch = d.epoch;
            match d.fail(None) {
                Ok(Nacked {
                    then: Then::DeadLetter(dlq, back),
                    attempts,
                    ..
                }) => {
                    let Ok(rt) = tokio::runtime::Handle::try_current() else {
                        drop(back);
                        continue;
                    };
                    let (topic, group) = (self.group.topic.clone(), self.group.name.clone());
                    rt.spawn(async move {
                        let r = dead_letter::dead_letter(
                            back,
                            epoch,
                            attempts,
                            ACK_DEADLINE_REASON,
                            &dlq,
                        )
                        .await;
                        if let Err(e) = r {
                            tracing::warn!(%topic, %group, error = %e,
                                "dead-lettering a delivery whose ack deadline passed failed");
                        }
                    });
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(topic = %self.group.topic, group = %self.group.name, error = %e,
                        "taking back a delivery whose ack deadline passed failed");
                }
            }
        }
    }
}

impl KafkaDelivery {
    /// When its ack deadline passes (`None`: its consumer has none).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.deadline.as_ref().map(Deadline::at)
    }

    /// Restarts the ack deadline from now: `DeliveryExpired` if it passed, `StaleDelivery`
    /// if the delivery is no longer out (settled, reset, revoked).
    pub(crate) fn extend_deadline(&self) -> Result<()> {
        let Some(deadline) = &self.deadline else {
            return Ok(());
        };
        // Under the lock: the expiry check cannot run between this check and the restart.
        let st = self.group.shared.lock();
        let now = Instant::now();
        if deadline.passed(now) {
            return Err(self.expired());
        }
        let o = self.record.offset;
        if !st.deadlines.holds(self.partition, o, self.ticket) {
            return Err(Error::StaleDelivery { offset: o });
        }
        deadline.restart(now);
        Ok(())
    }

    pub(super) fn expired(&self) -> Error {
        Error::DeliveryExpired {
            topic: self.group.topic.clone(),
            group: self.group.name.clone(),
            offset: self.record.offset,
        }
    }
}
