//! An `ack_all`'s own commit: sent from the acking task, its answer awaited there.
//!
//! The committer thread makes every other commit. Handing a batch's commit to it cost two
//! hand-overs between threads per batch (the ack to the committer, the answer back to the
//! task), 12-38 µs each on a 2-core VM: most of spool's overhead against a plain rdkafka
//! consumer committing every 100 (issue 30 point 7, `benches/kafka.rs`).
//!
//! - The task sends the commit when none is being made (`Shared::commit_soon`). Else the
//!   committer commits the batch after the commit under way, as before.
//! - librdkafka's own thread wakes the task when the answer comes (`commit::Wake`).
//! - The task handles a success: it gives the commit turn back and tells the acks waiting.
//! - A failure, a time-out, or a task that went away (its future dropped) leaves the
//!   commit to the committer, which answers for it as for its own (`Pending::watched`).
//!   So does a task that stops polling: the committer takes over after the time-out, or
//!   at once when anyone else waits for the commit turn (a later change, the revoke, the
//!   close), as a future held unpolled (a `select!`'s) must block no other ack.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, ConsumerContext};

use super::commit::{self, Wake};
use super::group::{GroupContext, Shared, commit_list};
use super::kafka_err;
use crate::error::{Error, Result};

/// A commit an `ack_all` sent, its answer not handled yet (`State::pending`). The commit
/// turn is held meanwhile.
pub(super) struct Pending {
    pub version: u64,
    pub issued: Issued,
    pub sent_at: Instant,
    /// Its task waits for the answer: the committer leaves it alone, unless that takes
    /// longer than `Kafka Timeout Ms`.
    pub watched: bool,
}

/// A commit sent, or what kept it from being sent.
pub(super) enum Issued {
    Sent(commit::Sent),
    Done(Result<()>),
}

impl Issued {
    /// The commit's outcome, waited for at most `timeout`.
    pub(super) fn answer(self, timeout: Duration) -> Result<()> {
        match self {
            Issued::Sent(sent) => sent
                .wait(timeout)
                .map_err(|e| kafka_err("committing the group's offsets", e)),
            Issued::Done(result) => result,
        }
    }
}

/// Sends the commit of `floors` without waiting for its answer; `wake`, if given, is
/// told when the answer comes. The committer's and the revoke's commits are this, then
/// `Issued::answer` (`group::commit`).
pub(super) fn send<C: ConsumerContext, K: rdkafka::consumer::Consumer<C>>(
    consumer: &K,
    topic: &str,
    floors: &[(i32, u64, String)],
    wake: Option<Arc<Wake>>,
) -> Issued {
    if floors.is_empty() {
        return Issued::Done(Ok(()));
    }
    let sent = commit_list(topic, floors).and_then(|tpl| {
        commit::start(consumer, &tpl, wake)
            .map_err(|e| kafka_err("committing the group's offsets", e))
    });
    match sent {
        Ok(sent) => Issued::Sent(sent),
        Err(e) => Issued::Done(Err(e)),
    }
}

impl Shared {
    /// After the `bump` of a whole batch (`ack_all`), made without the state lock held:
    /// sends the commit from here if none is being made, and returns the watch over it
    /// (dropped unawaited, it leaves the commit to the committer). Else wakes the
    /// committer, which commits the batch.
    pub fn commit_soon(self: &Arc<Self>, consumer: &BaseConsumer<GroupContext>) -> Option<Watch> {
        let mut st = self.lock();
        if st.turn || st.turn_wanted > 0 || st.closing || st.version == st.taken {
            drop(st);
            self.dirty.notify_one();
            return None;
        }
        let (version, floors) = self.snapshot(&mut st);
        drop(st);
        let wake = Arc::new(Wake::default());
        let issued = send(consumer, &self.topic, &floors, Some(wake.clone()));
        let watched = matches!(issued, Issued::Sent(_));
        let mut st = self.lock();
        st.pending = Some(Pending {
            version,
            issued,
            sent_at: Instant::now(),
            watched,
        });
        // Others that came while it was sent wait for it: the committer answers for it.
        let wake_committer = !watched || st.others_wait();
        drop(st);
        if wake_committer {
            self.dirty.notify_one();
        }
        watched.then(|| Watch {
            shared: self.clone(),
            version,
            wake,
            done: false,
        })
    }
}

/// A task's watch over the commit it sent; dropped unfinished (its future dropped, or
/// never polled), it leaves the commit to the committer.
pub(super) struct Watch {
    shared: Arc<Shared>,
    version: u64,
    wake: Arc<Wake>,
    done: bool,
}

impl Watch {
    /// Waits for the commit's answer, at most `Kafka Timeout Ms`. Handles a success;
    /// leaves anything else to the committer.
    pub async fn answer(mut self) {
        let wake = self.wake.clone();
        let came = poll_fn(|cx| match wake.came(cx) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        });
        let timed_out = tokio::time::timeout(self.shared.timeout(), came)
            .await
            .is_err();
        self.finish(timed_out);
    }

    fn finish(&mut self, timed_out: bool) {
        self.done = true;
        let shared = &*self.shared;
        let mut st = shared.lock();
        let Some(p) = st
            .pending
            .as_mut()
            .filter(|p| p.version == self.version && p.watched)
        else {
            return; // The committer took it over.
        };
        let answer = match &p.issued {
            Issued::Sent(sent) if !timed_out => sent.try_answer(),
            _ => None,
        };
        match answer {
            Some(Ok(())) => {
                st.pending = None;
                st.failing_since = None;
                drop(st);
                // Told before the turn passes, as the committer does.
                shared.committed(self.version, Ok(()), false);
                shared.give_turn();
            }
            Some(Err(e)) => {
                p.issued = Issued::Done(Err(kafka_err("committing the group's offsets", e)));
                p.watched = false;
                drop(st);
                shared.dirty.notify_one();
            }
            // Timed out: a failed commit, as the committer's own (its late answer is
            // dropped with its queue). Under the lock, as every other drop of a `Sent`:
            // the member may stop once the committer handled it (its task's future need
            // not hold this member: an `ack_all` through another member's consumer), and
            // `Group::stop` orders the consumer's end after this lock only.
            None if timed_out => {
                p.issued = Issued::Done(Err(Error::Kafka {
                    context: "committing the group's offsets".to_owned(),
                    detail: "no answer within Kafka Timeout Ms".to_owned(),
                }));
                p.watched = false;
                drop(st);
                shared.dirty.notify_one();
            }
            // Woken without the answer there (not expected: the wake comes with it).
            None => {
                p.watched = false;
                drop(st);
                shared.dirty.notify_one();
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut st = self.shared.lock();
        if let Some(p) = st.pending.as_mut().filter(|p| p.version == self.version) {
            p.watched = false;
            drop(st);
            self.shared.dirty.notify_one();
        }
    }
}
