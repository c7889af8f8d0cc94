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
//! This is the crate's one `unsafe` block: rdkafka has no commit with a timeout.
#![allow(unsafe_code)]

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
    let failed = |code: RDKafkaErrorCode| Err(KafkaError::ConsumerCommit(code));
    let rk = consumer.client().native_ptr();
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY:
    // - `rk` and `offsets` stay valid for the whole block: `consumer` and `offsets` are
    //   borrowed for it. librdkafka copies `offsets` before `rd_kafka_commit_queue`
    //   returns (`rd_kafka_commit0`).
    // - The queue is made here and destroyed on every path below, exactly once. The
    //   commit holds its own reference to it (`RD_KAFKA_REPLYQ`), so a reply that comes
    //   after a time-out goes to a queue librdkafka still owns, and is dropped with it.
    // - The event, when one comes, is read and destroyed here, exactly once; the
    //   partition list it lends is only read before that.
    unsafe {
        let queue = rd::rd_kafka_queue_new(rk);
        if queue.is_null() {
            return failed(RDKafkaErrorCode::Fail);
        }
        let err = rd::rd_kafka_commit_queue(rk, offsets.ptr(), queue, None, std::ptr::null_mut());
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            rd::rd_kafka_queue_destroy(queue);
            return failed(err.into());
        }
        let event = rd::rd_kafka_queue_poll(queue, ms);
        if event.is_null() {
            rd::rd_kafka_queue_destroy(queue);
            return failed(RDKafkaErrorCode::OperationTimedOut);
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
        rd::rd_kafka_queue_destroy(queue);
        if code == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            Ok(())
        } else {
            failed(code.into())
        }
    }
}
