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

use crate::queue::{AckWatch, GroupRef, Handling, LentRecords, NackOutcome, OpenConsumer, Ticket};

/// `recv_batch` reserves room for at most this many deliveries up front.
const MAX_BATCH_PREALLOC: usize = 1024;
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
                orphan: std::sync::Mutex::new(Vec::new()),
            }),
            manual_ack: cfg.manual_ack,
            busy_poll: cfg.busy_poll,
            previous: None,
            previous_batch: Vec::new(),
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
    /// Auto-ack: the last `recv_batch`'s deliveries, acked when the next one is asked for.
    previous_batch: Vec<Ticket>,
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
    orphan: std::sync::Mutex<Vec<Ticket>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let orphan = std::mem::take(self.orphan.get_mut().unwrap_or_else(|e| e.into_inner()));
        for t in orphan {
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
        self.ack_previous_batch()?;
        if let Some(t) = self.previous.take() {
            let sh = &self.shared;
            sh.spool
                .with_engine(|e| e.ack_delivery(&sh.group, t, false))?;
            sh.wakeup.wake();
        }
        Ok(())
    }

    /// Auto-ack: acks the last `recv_batch`'s deliveries.
    fn ack_previous_batch(&mut self) -> Result<()> {
        if self.previous_batch.is_empty() {
            return Ok(());
        }
        let sh = &self.shared;
        // Every one is acked even if one fails (a careful-mode commit): the first error is
        // returned after, and none is left out until the consumer closes.
        let acked = sh.spool.with_engine(|e| {
            let mut first = Ok(());
            for &t in &self.previous_batch {
                let r = e.ack_delivery(&sh.group, t, false).map(|_| ());
                first = first.and(r);
            }
            first
        });
        self.previous_batch.clear();
        sh.wakeup.wake();
        acked
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
        self.ack_previous_batch()?;
        if let Some(d) = self.next_lent() {
            return Ok(Some(d));
        }
        self.take_next(false)
    }

    /// Hands out the next delivery from the group if one is available now (acking the
    /// previous one). `batch`: one of a `recv_batch`, which an auto-ack consumer acks
    /// with the rest of its batch (so without a loan: handing out a lent record counts
    /// the one before as finished).
    fn take_next(&mut self, batch: bool) -> Result<Option<EmbeddedDelivery>> {
        let sh = &self.shared;
        // The previous auto-ack delivery is acked under the same lock as the hand-out.
        let previous = self.previous.take();
        let lend = !self.manual_ack && !batch;
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
            match (self.manual_ack, batch) {
                (true, _) => {}
                (false, true) => self.previous_batch.push(ticket),
                (false, false) => self.previous = Some(ticket),
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
        self.wait_for(Self::try_next).await
    }

    /// Waits for at least one delivery, then takes what is ready now, up to `max` (and
    /// up to the group's `max_in_flight` room). An auto-ack consumer acks the whole batch
    /// when it asks for the next delivery (or is closed).
    pub async fn recv_batch(&mut self, max: usize) -> Result<Vec<EmbeddedDelivery>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        self.ack_previous_batch()?;
        // The loan's last record is acked by the first hand-out below (`previous`), the
        // others when the group takes the loan back.
        self.lent = None;
        let first = self.wait_for(|c| c.take_next(true)).await?;
        let mut out = Vec::with_capacity(max.min(MAX_BATCH_PREALLOC));
        out.push(first);
        while out.len() < max {
            // A failure after the first hand-out ends the batch: what was handed out is
            // returned, and the next call reports the failure if it lasts.
            match self.take_next(true) {
                Ok(Some(d)) => out.push(d),
                Ok(None) | Err(_) => break,
            }
        }
        Ok(out)
    }

    /// Waits until `take` hands out a delivery.
    async fn wait_for(
        &mut self,
        mut take: impl FnMut(&mut Self) -> Result<Option<EmbeddedDelivery>>,
    ) -> Result<EmbeddedDelivery> {
        // A ready `recv` takes part in tokio's cooperative budget, as tokio's own channels
        // do: without it, a consumer task that always finds a record never yields, and the
        // other consumers of the group on its runtime thread get nothing. The budget is
        // taken before the hand-out, so a yield here leaves nothing handed out (an
        // auto-ack consumer would count a delivery dropped in between as acked).
        let budget = std::future::poll_fn(tokio::task::coop::poll_proceed).await;
        if let Some(d) = take(self)? {
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
            if let Some(d) = take(self)? {
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
            && (self.previous.is_some() || !self.previous_batch.is_empty())
        {
            let mut orphan = self.shared.orphan.lock().unwrap_or_else(|e| e.into_inner());
            orphan.append(&mut self.previous_batch);
            orphan.extend(self.previous.take());
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
                // Counted before the ack queues the group's image: the committer it wakes
                // waits for this future's first poll (a `join_all` polls every ack made
                // before it), so acks made back to back share one commit.
                let unpolled = e.ack_watch().ack_made();
                let t = e.ack_delivery(&sh.group, self.ticket, true)?;
                Ok(t.map(|t| (t, unpolled)))
            })
            .map_err(|e| self.expired_or(e));
        // Also after a failure (a failed commit after the ack was made): the slot may be
        // free already, and a wake nobody waits for costs next to nothing.
        sh.wakeup.wake();
        async move {
            let Some((ticket, mut unpolled)) = made? else {
                return Ok(());
            };
            wait_durable(unpolled.polled(), ticket).await
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

/// Waits until the catalog decides `ticket`: `Ok` once the commit holding it is durable.
async fn wait_durable(watch: &AckWatch, ticket: u64) -> Result<()> {
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

/// The deliveries of `ds` by group: each group's `Shared` and the indices of its
/// deliveries in `ds` (usually one group: a consumer's own).
fn by_group(ds: &[EmbeddedDelivery]) -> Vec<(Arc<Shared>, Vec<usize>)> {
    let mut groups: Vec<(Arc<Shared>, Vec<usize>)> = Vec::new();
    for (i, d) in ds.iter().enumerate() {
        match groups
            .iter_mut()
            .find(|(sh, _)| sh.group.same_group(&d.shared.group))
        {
            Some((_, at)) => at.push(i),
            None => groups.push((d.shared.clone(), vec![i])),
        }
    }
    groups
}

/// The error a batch call returns: a failure of the call itself (a commit) before a
/// delivery that could not be acked or nacked (stale, expired), else the first in order.
fn batch_error(errors: impl IntoIterator<Item = Error>) -> Option<Error> {
    let refusal = |e: &Error| {
        matches!(
            e,
            Error::StaleDelivery { .. } | Error::DeliveryExpired { .. }
        )
    };
    let mut first: Option<Error> = None;
    for e in errors {
        match &first {
            Some(f) if refusal(f) && !refusal(&e) => first = Some(e),
            Some(_) => {}
            None => first = Some(e),
        }
    }
    first
}

/// Acks every delivery of `ds` that can still be acked, durably, with one ticket per
/// group (one commit); see [`crate::Consumer::ack_all`] for the rules.
pub(crate) async fn ack_all(mut ds: Vec<EmbeddedDelivery>) -> Result<()> {
    // Each error with the index of the delivery it concerns: the first in the order given
    // is the one returned, whatever the groups' order.
    let mut errors: Vec<(usize, Error)> = Vec::new();
    let mut tickets = Vec::new();
    for (sh, at) in by_group(&ds) {
        let held: Vec<Ticket> = at.iter().map(|&i| ds[i].ticket).collect();
        for &i in &at {
            ds[i].release_on_drop = false;
        }
        let mut refused = Vec::new();
        let made = sh.spool.with_engine(|e| {
            let t = e.ack_deliveries(&sh.group, &held, &mut refused)?;
            Ok(t.map(|t| (t, e.ack_watch().clone())))
        });
        sh.wakeup.wake();
        errors.extend(
            refused
                .into_iter()
                .map(|(k, e)| (at[k], ds[at[k]].expired_or(e))),
        );
        match made {
            Ok(t) => tickets.extend(t.map(|t| (at[0], t))),
            Err(e) => errors.push((at[0], e)),
        }
    }
    drop(ds);
    for (first, (ticket, watch)) in tickets {
        if let Err(e) = wait_durable(&watch, ticket).await {
            errors.push((first, e));
        }
    }
    errors.sort_by_key(|&(i, _)| i);
    batch_error(errors.into_iter().map(|(_, e)| e)).map_or(Ok(()), Err)
}

/// Nacks every delivery of `ds` that can still be nacked, with one commit per group for
/// those redelivered; see [`crate::Consumer::nack_all`] for the rules.
pub(crate) fn nack_all(mut ds: Vec<EmbeddedDelivery>, reason: &str) -> Result<Vec<NackOutcome>> {
    let mut out: Vec<Option<Result<NackOutcome>>> = (0..ds.len()).map(|_| None).collect();
    for (sh, at) in by_group(&ds) {
        let held: Vec<Ticket> = at.iter().map(|&i| ds[i].ticket).collect();
        for &i in &at {
            ds[i].release_on_drop = false;
        }
        let results = sh
            .spool
            .with_engine(|e| Ok(e.nack_deliveries(&sh.group, &held, reason, now_ms())));
        // Also after a failure: a record may be up for redelivery already.
        sh.wakeup.wake();
        match results {
            Ok(rs) => {
                for (k, r) in rs.into_iter().enumerate() {
                    out[at[k]] = Some(r.map_err(|e| ds[at[k]].expired_or(e)));
                }
            }
            Err(e) => return Err(e),
        }
    }
    let out: Vec<Result<NackOutcome>> = out.into_iter().flatten().collect();
    if out.iter().all(Result::is_ok) {
        return Ok(out.into_iter().flatten().collect());
    }
    Err(batch_error(out.into_iter().filter_map(Result::err)).unwrap_or(Error::Closed))
}
