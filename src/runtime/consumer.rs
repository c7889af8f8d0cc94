//! The embedded backend's consumers and deliveries: waiting without polling, auto-ack,
//! release on drop.

use std::future::Future;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{Embedded, Wakeup, now_ms};
use crate::error::{Error, Result};
use crate::format::Headers;
use crate::format::record::Record;
use std::sync::Arc;

use crate::queue::{GroupRef, Handling, LentRecords, NackOutcome, OpenConsumer, Ticket};
use std::sync::atomic::Ordering;

/// How a consumer takes deliveries (`ConsumerBuilder`'s settings).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConsumerConfig {
    /// Every ack and nack is the application's (else auto-ack).
    pub manual_ack: bool,
    /// Deliveries the group may have out at once, across its consumers (at least 1).
    pub max_in_flight: usize,
    /// How long `recv` spins before it parks its thread (zero: it parks at once).
    pub busy_poll: Duration,
    /// Each delivery is taken back this long after its hand-out (`None`: the instance's
    /// `Ack Deadline Ms`; zero: no deadline).
    pub ack_deadline: Option<Duration>,
    /// At most one delivery per `message-key` out at a time.
    pub key_ordered: bool,
}

impl EmbeddedConsumer {
    /// Checks the names, creates the topic and group if needed.
    pub(crate) fn build(
        spool: Embedded,
        topic: &str,
        group: &str,
        cfg: ConsumerConfig,
    ) -> Result<EmbeddedConsumer> {
        let engine = spool.engine()?;
        let how = Handling {
            max_in_flight: cfg.max_in_flight.max(1),
            ack_deadline: cfg.ack_deadline.or(Some(Duration::from_millis(
                engine.options().ack_deadline_ms,
            ))),
            key_ordered: cfg.key_ordered,
        };
        let (group, open) = engine.open_consumer(topic, group, how, now_ms(), true)?;
        let wakeup = spool.notifier(topic);
        // The group's bound may have grown (a larger `max_in_flight`): a consumer waiting
        // for a slot may have one now.
        wakeup.wake();
        Ok(EmbeddedConsumer {
            shared: Arc::new(Shared {
                spool,
                group,
                wakeup,
                orphan: std::sync::Mutex::new(None),
            }),
            manual_ack: cfg.manual_ack,
            busy_poll: cfg.busy_poll,
            previous: None,
            lent: None,
            _open: open,
        })
    }
}

/// The embedded backend's consumer (see [`crate::Consumer`] for the rules it keeps).
#[derive(Debug)]
pub(crate) struct EmbeddedConsumer {
    shared: Arc<Shared>,
    manual_ack: bool,
    /// How long `recv` spins before it parks (`ConsumerConfig::busy_poll`).
    busy_poll: Duration,
    /// Auto-ack: the delivery to ack when the next one is asked for.
    previous: Option<Ticket>,
    /// Auto-ack: records the group lent, handed out without its lock (see `group::Lent`).
    lent: Option<Lent>,
    /// Keeps the group from being deleted while this consumer is open.
    _open: Option<OpenConsumer>,
}

#[derive(Debug)]
struct Lent {
    records: LentRecords,
    epoch: u64,
    token: u64,
}

/// What a consumer and its deliveries share (one `Arc` per delivery).
#[derive(Debug)]
struct Shared {
    spool: Embedded,
    group: GroupRef,
    wakeup: Arc<Wakeup>,
    /// Auto-ack: the previous delivery of a consumer a panic dropped while deliveries of
    /// it were still alive (one of them may be that delivery, in a handler the panic
    /// unwinds after the consumer). Acked when the last of them is gone (`Drop`): by then
    /// it was handled, or a panic dropped it and charged it (the ack then finds it no
    /// longer held). Only this rare path takes the lock; a hand-out and a drop touch
    /// nothing here.
    orphan: std::sync::Mutex<Option<Ticket>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let orphan = self
            .orphan
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(t) = orphan {
            let acked = self
                .spool
                .with_engine(|e| e.ack_delivery(&self.group, t, false).map(|_| ()));
            if acked.is_ok() {
                self.wakeup.wake();
            }
        }
    }
}

impl EmbeddedConsumer {
    /// The topic this consumer reads.
    pub fn topic(&self) -> &str {
        self.shared.group.topic()
    }
    /// The consumer group it belongs to.
    pub fn group(&self) -> &str {
        self.shared.group.group()
    }

    fn ack_previous(&mut self) -> Result<()> {
        if let Some(t) = self.previous.take() {
            let sh = &self.shared;
            sh.spool
                .with_engine(|e| e.ack_delivery(&sh.group, t, false))?;
            sh.wakeup.wake();
        }
        Ok(())
    }

    /// The next lent record, unless the group took them back. Handing it out acks the
    /// previous delivery (the group counts it as finished when it takes the loan back).
    fn next_lent(&mut self) -> Option<EmbeddedDelivery> {
        let l = self.lent.as_mut()?;
        let Some(offset) = l.records.records.front().map(|r| r.offset()) else {
            self.lent = None;
            return None;
        };
        let next = &l.records.next;
        if next
            .compare_exchange(offset, offset + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            self.lent = None;
            return None;
        }
        let record = l.records.records.pop_front()?;
        let ticket = Ticket {
            offset,
            epoch: l.epoch,
            token: l.token,
        };
        self.previous = Some(ticket);
        Some(EmbeddedDelivery {
            shared: self.shared.clone(),
            record,
            attempt: 1,
            ticket,
            release_on_drop: false,
            deadline: std::sync::Mutex::new(None),
        })
    }

    /// Hands out the next delivery if one is available now (acking the previous one).
    fn try_next(&mut self) -> Result<Option<EmbeddedDelivery>> {
        if let Some(d) = self.next_lent() {
            return Ok(Some(d));
        }
        let sh = &self.shared;
        // The previous auto-ack delivery is acked under the same lock as the hand-out.
        let previous = self.previous.take();
        let lend = !self.manual_ack;
        let handout = sh
            .spool
            .with_engine(|e| e.next_delivery(&sh.group, previous, lend));
        if previous.is_some() {
            // A slot or a redelivery may have opened for the group's other consumers (also
            // when the hand-out after the ack failed).
            sh.wakeup.wake();
        }
        Ok(handout?.map(|h| {
            let ticket = h.ticket();
            if !self.manual_ack {
                self.previous = Some(ticket);
            }
            if let Some(records) = h.lent {
                self.lent = Some(Lent {
                    records,
                    epoch: h.epoch,
                    token: h.token,
                });
            }
            EmbeddedDelivery {
                shared: self.shared.clone(),
                record: h.record,
                attempt: h.attempt,
                ticket,
                release_on_drop: self.manual_ack,
                deadline: std::sync::Mutex::new(h.deadline),
            }
        }))
    }

    /// Waits for the next delivery.
    pub async fn recv(&mut self) -> Result<EmbeddedDelivery> {
        // A ready `recv` takes part in tokio's cooperative budget, as tokio's own channels
        // do: without it, a consumer task that always finds a record never yields, and the
        // other consumers of the group on its runtime thread get nothing. The budget is
        // taken before the hand-out, so a yield here leaves nothing handed out (an
        // auto-ack consumer would count a delivery dropped in between as acked).
        let budget = std::future::poll_fn(tokio::task::coop::poll_proceed).await;
        if let Some(d) = self.try_next()? {
            budget.made_progress();
            return Ok(d);
        }
        drop(budget);
        let shared = self.shared.clone();
        let _waiting = shared.wakeup.waiting();
        // One budget per call: every publish to the topic and every ack of any group rings,
        // and a consumer that cannot take a record (its slots are out) must still park.
        let spin_until = (!self.busy_poll.is_zero())
            .then(|| std::time::Instant::now().checked_add(self.busy_poll))
            .flatten();
        loop {
            // Registered before looking again, so a publish in between is not missed.
            let notified = shared.wakeup.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let seen = shared.wakeup.rings();
            if let Some(d) = self.try_next()? {
                return Ok(d);
            }
            if let Some(until) = spin_until
                && shared.wakeup.spin_until_rung(seen, until)
            {
                continue;
            }
            // A record waiting out its delay, or a delivery whose deadline runs: look
            // again then, even if nothing rings before.
            if let Some(at) = shared.spool.with_engine(|e| Ok(e.wake_at(&shared.group)))? {
                super::timer::ring_at(at, &shared.wakeup);
            }
            notified.await;
        }
    }

    /// The next delivery if one is available now, without waiting (and without a runtime
    /// timer: the cheap way to fill a window of deliveries after a `recv`).
    pub fn try_recv(&mut self) -> Result<Option<EmbeddedDelivery>> {
        self.try_next()
    }

    /// Acks the previous delivery (auto-ack) and stops.
    pub async fn close(mut self) -> Result<()> {
        self.ack_previous()
    }
}

impl Drop for EmbeddedConsumer {
    fn drop(&mut self) {
        // Dropped by a panic while deliveries of it are alive (a handler the panic unwinds
        // may hold the last one, dropped after the consumer): not acked now, but when the
        // last of them is gone (`Shared`'s drop), after its own drop charged it if a panic
        // dropped it.
        if std::thread::panicking()
            && Arc::strong_count(&self.shared) > 1
            && let Some(t) = self.previous.take()
        {
            *self.shared.orphan.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
            return;
        }
        if let Err(e) = self.ack_previous() {
            tracing::debug!(error = %e, "auto-ack on consumer drop failed");
        }
    }
}

/// The embedded backend's delivery (see [`crate::Delivery`] for the rules it keeps).
#[derive(Debug)]
pub(crate) struct EmbeddedDelivery {
    shared: Arc<Shared>,
    record: Record,
    attempt: u32,
    ticket: Ticket,
    release_on_drop: bool,
    /// When the ack deadline passes (`None`: no deadline); `extend_deadline` moves it.
    deadline: std::sync::Mutex<Option<Instant>>,
}

impl EmbeddedDelivery {
    /// Always 0: an embedded topic has one partition.
    pub fn partition(&self) -> u32 {
        0
    }

    /// When this delivery's ack deadline passes, if its consumer has one.
    pub fn deadline(&self) -> Option<Instant> {
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Restarts the ack deadline from now; `Ok` and nothing to do without one.
    pub fn extend_deadline(&self) -> Result<()> {
        let sh = &self.shared;
        let Some(d) = sh.group.ack_deadline() else {
            return Ok(());
        };
        let at = sh
            .spool
            .with_engine(|e| e.extend_deadline(&sh.group, self.ticket, d))
            .map_err(|e| self.expired_or(e))?;
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
        Ok(())
    }

    /// `StaleDelivery` for a delivery whose deadline passed means the group took it back
    /// as expired: say so (`DeliveryExpired`).
    fn expired_or(&self, e: Error) -> Error {
        match e {
            Error::StaleDelivery { offset }
                if self.deadline().is_some_and(|at| at <= Instant::now()) =>
            {
                Error::DeliveryExpired {
                    topic: self.topic().to_owned(),
                    group: self.group().to_owned(),
                    offset,
                }
            }
            e => e,
        }
    }
    /// The topic the message was read from.
    pub fn topic(&self) -> &str {
        self.shared.group.topic()
    }
    /// The consumer group it was delivered to.
    pub fn group(&self) -> &str {
        self.shared.group.group()
    }
    /// The message's offset in its topic.
    pub fn offset(&self) -> u64 {
        self.record.offset()
    }
    /// The message body. Cloning it is cheap: it shares the buffer it was read into.
    pub fn payload(&self) -> &Bytes {
        self.record.payload()
    }
    /// The headers it was published with.
    pub fn headers(&self) -> &Headers {
        self.record.headers()
    }
    /// When the message was appended (monotonic within a topic).
    pub fn timestamp(&self) -> std::time::SystemTime {
        self.record.timestamp()
    }
    /// 1 on the first delivery; one more after each nack (or unclean stop while out).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Finishes the message; durable when the returned future completes (under
    /// `Sync=Always`, also against power loss). Fails with `StaleDelivery` if the group was
    /// reset since.
    ///
    /// The ack is made when `ack` is called, so the group's slot is free for the next
    /// delivery at once; the future only waits for the catalog commit, which one commit
    /// serves for every ack made meanwhile. Dropping the future does not undo the ack (it
    /// becomes durable with the next commit).
    pub fn ack(mut self) -> impl Future<Output = Result<()>> + Send + 'static {
        self.release_on_drop = false;
        let sh = &self.shared;
        let made = sh
            .spool
            .with_engine(|e| {
                let t = e.ack_delivery(&sh.group, self.ticket, true)?;
                Ok(t.map(|t| (t, e.ack_watch().clone())))
            })
            .map_err(|e| self.expired_or(e));
        // Also after a failure (a failed commit after the ack was made): the slot may be
        // free already, and a wake nobody waits for costs next to nothing.
        sh.wakeup.wake();
        async move {
            let Some((ticket, watch)) = made? else {
                return Ok(());
            };
            let mut again = false;
            let outcome = std::future::poll_fn(|cx| {
                let registered = std::mem::replace(&mut again, true);
                match watch.poll_outcome(ticket, cx.waker(), registered) {
                    Some(o) => Poll::Ready(o),
                    None => Poll::Pending,
                }
            })
            .await;
            outcome.map_err(|detail| Error::Catalog {
                context: "committing an ack".into(),
                detail,
            })
        }
    }

    /// Records a failed attempt (durably) and redelivers (after `delay`, or the
    /// `Nack Backoff` when `None` or zero), or dead-letters at the limit.
    pub async fn nack(mut self, reason: &str, delay: Option<Duration>) -> Result<NackOutcome> {
        self.release_on_drop = false;
        let t = self.ticket;
        let sh = &self.shared;
        let r = sh
            .spool
            .with_engine(|e| e.nack_delivery(&sh.group, t, reason, delay, now_ms()))
            .map_err(|e| self.expired_or(e));
        // Also after a failure: the record may be up for redelivery already (a failed
        // dead-letter copy or attempt commit puts it back first).
        sh.wakeup.wake();
        r
    }
}

impl Drop for EmbeddedDelivery {
    fn drop(&mut self) {
        // Dropped by a panic (auto-ack or manual), the delivery was not handled: a failed
        // attempt, delivered again, so the next `recv` or the consumer's close (which ack
        // what they still hold) find it no longer held.
        let panicking = std::thread::panicking();
        if !self.release_on_drop && !panicking {
            return;
        }
        let t = self.ticket;
        let sh = &self.shared;
        let released = sh.spool.with_engine(|e| {
            if panicking {
                e.charge_panicked(&sh.group, t);
            } else {
                e.release_delivery(&sh.group, t);
            }
            Ok(())
        });
        if released.is_ok() {
            sh.wakeup.wake();
        }
    }
}
