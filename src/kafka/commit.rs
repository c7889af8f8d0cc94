//! A synchronous offset commit that waits at most `Kafka Timeout Ms`.
//!
//! librdkafka's own synchronous commit (`rd_kafka_commit`) waits without end while the
//! group has no coordinator: it parks the commit until one is found. With the cluster
//! gone, an ack never returned and dropping a consumer never ended (tests/kafka_edges.rs,
//! `a_close_while_the_cluster_is_down_returns`).
//!
//! So the commit is made with a reply queue of its own (`rd_kafka_commit_queue`), and the
//! reply is awaited on that queue for at most the timeout.
//! - A commit that timed out is reported failed, as any failed commit is: the acks it
//!   carried may not be durable. It may still land later, once a coordinator is back.
//! - Each partition's own error counts too: a commit is a success only if every
//!   partition's offset was stored.
//!
//! An `ack_all` sends its commit itself (`start`, which only queues it) and its task is
//! woken by librdkafka's thread when the answer comes (`Wake`): no thread of spool's
//! stands between the ack and its answer, as none does for rdkafka's synchronous commit
//! (issue 30 point 7: each hand-over between threads cost 12-38 µs per commit here).
//!
//! This is the crate's one module with `unsafe` code: rdkafka has no commit with a
//! timeout.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Waker};
use std::time::Duration;

use rdkafka::TopicPartitionList;
use rdkafka::bindings as rd;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};

/// Commits `offsets` for `consumer`'s group, waiting at most `timeout` for the answer.
pub(super) fn commit_within<C: ConsumerContext, K: Consumer<C>>(
    consumer: &K,
    offsets: &TopicPartitionList,
    timeout: Duration,
) -> KafkaResult<()> {
    start(consumer, offsets, None)?.wait(timeout)
}

/// Tells a task that a commit's answer came: librdkafka calls `answered` when the answer
/// reaches the commit's queue, from its own thread.
#[derive(Default)]
pub(super) struct Wake {
    came: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Wake {
    /// Whether the answer came; if not, `cx` is woken when it does.
    pub(super) fn came(&self, cx: &Context<'_>) -> bool {
        if self.came.load(Ordering::Acquire) {
            return true;
        }
        *self.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
        // Again, after the waker is in place: an answer between the two looks is seen.
        self.came.load(Ordering::Acquire)
    }
}

/// librdkafka's callback when an answer reaches an empty queue (under the queue's lock;
/// it must not call librdkafka, and must not unwind).
unsafe extern "C" fn answered(_rk: *mut rd::rd_kafka_t, opaque: *mut c_void) {
    // SAFETY: `opaque` is the `Arc<Wake>` that `start` leaked, reclaimed only after this
    // callback is disabled under the same lock (`Sent::drop`).
    let wake = unsafe { &*opaque.cast::<Wake>() };
    wake.came.store(true, Ordering::Release);
    let waker = wake.waker.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(w) = waker {
        w.wake();
    }
}

/// A commit sent, its answer not read yet. Dropped unread, its answer is dropped with its
/// queue when it comes.
pub(super) struct Sent {
    queue: *mut rd::rd_kafka_queue_t,
    /// The `Arc<Wake>` lent to librdkafka's callback, if one was asked for.
    wake: Option<*const Wake>,
}

// SAFETY: librdkafka's queues may be polled and destroyed from any thread; `Sent` owns
// its reference to the queue and its lent `Wake` alone.
unsafe impl Send for Sent {}

/// Sends the commit of `offsets` without waiting (librdkafka only queues it): an ack's
/// task sends one from an async worker. `wake`, if given, is told when the answer comes.
pub(super) fn start<C: ConsumerContext, K: Consumer<C>>(
    consumer: &K,
    offsets: &TopicPartitionList,
    wake: Option<Arc<Wake>>,
) -> KafkaResult<Sent> {
    let rk = consumer.client().native_ptr();
    // SAFETY:
    // - `rk` and `offsets` stay valid for the whole block: `consumer` and `offsets` are
    //   borrowed for it. librdkafka copies `offsets` before `rd_kafka_commit_queue`
    //   returns (`rd_kafka_commit0`), and with a queue given it only queues the commit.
    // - The queue made here is destroyed exactly once: by the returned `Sent` (`wait` or
    //   its drop), or here on failure (through `Sent`'s drop too). The commit holds its
    //   own reference to it (`RD_KAFKA_REPLYQ`), so an answer that comes after that goes
    //   to a queue librdkafka still owns, and is dropped with it.
    // - The callback is set before the commit is sent, so it sees the answer.
    unsafe {
        let queue = rd::rd_kafka_queue_new(rk);
        if queue.is_null() {
            return Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::Fail));
        }
        let wake = wake.map(Arc::into_raw);
        let sent = Sent { queue, wake };
        if let Some(w) = wake {
            rd::rd_kafka_queue_cb_event_enable(queue, Some(answered), w.cast_mut().cast());
        }
        let err = rd::rd_kafka_commit_queue(rk, offsets.ptr(), queue, None, std::ptr::null_mut());
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(KafkaError::ConsumerCommit(err.into()));
        }
        Ok(sent)
    }
}

impl Sent {
    /// Waits at most `timeout` for the commit's answer.
    pub(super) fn wait(self, timeout: Duration) -> KafkaResult<()> {
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        self.poll(ms).unwrap_or(Err(KafkaError::ConsumerCommit(
            RDKafkaErrorCode::OperationTimedOut,
        )))
    }

    /// The commit's answer if it came (never waits).
    pub(super) fn try_answer(&self) -> Option<KafkaResult<()>> {
        self.poll(0)
    }

    fn poll(&self, ms: i32) -> Option<KafkaResult<()>> {
        // SAFETY:
        // - `self.queue` is valid until `self` drops.
        // - The event, when one comes, is read and destroyed here, exactly once; the
        //   partition list it lends is only read before that.
        let code = unsafe {
            let event = rd::rd_kafka_queue_poll(self.queue, ms);
            if event.is_null() {
                return None;
            }
            let mut code = rd::rd_kafka_event_error(event);
            let parts = rd::rd_kafka_event_topic_partition_list(event);
            if code == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && !parts.is_null() {
                let list = &*parts;
                let n = usize::try_from(list.cnt).unwrap_or(0);
                if n > 0 && !list.elems.is_null() {
                    let elems = std::slice::from_raw_parts(list.elems, n);
                    if let Some(e) = elems
                        .iter()
                        .find(|e| e.err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR)
                    {
                        code = e.err;
                    }
                }
            }
            rd::rd_kafka_event_destroy(event);
            code
        };
        Some(
            if code == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                Ok(())
            } else {
                Err(KafkaError::ConsumerCommit(code.into()))
            },
        )
    }
}

impl Drop for Sent {
    fn drop(&mut self) {
        // SAFETY:
        // - The queue was made by `start` and is destroyed here only, once.
        // - The callback is disabled under the queue's lock, the lock librdkafka calls it
        //   under (`rd_kafka_q_enq1`, `rd_kafka_q_cb_event_enable`): once that returns,
        //   no call is running or will run, and the lent `Arc` can be taken back.
        unsafe {
            if let Some(w) = self.wake {
                rd::rd_kafka_queue_cb_event_enable(self.queue, None, std::ptr::null_mut());
                drop(Arc::from_raw(w));
            }
            rd::rd_kafka_queue_destroy(self.queue);
        }
    }
}
