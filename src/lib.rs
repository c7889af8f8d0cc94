//! # spool
//!
//! An embedded, append-only-log message queue with consumer groups: Kafka's log semantics
//! in a library. Open a data directory, publish to topics, pull deliveries and ack or
//! nack them in-process.
//!
//! ```no_run
//! # async fn demo() -> Result<(), spool::Error> {
//! use spool::{Headers, Spool};
//! let mq = Spool::open("Data Source=./demo-data;Mode=Embedded")?;
//! mq.publish("factory.events", b"order-created".to_vec(), &Headers::new()).await?;
//! let mut consumer = mq.consumer("factory.events", "quality-workers").manual_ack().build()?;
//! let d = consumer.recv().await?;
//! d.ack().await?;
//! mq.close().await
//! # }
//! ```
//!
//! # Layout
//! Dependencies point down this list, never up (`tests/layout.rs` checks it):
//! - `blocking`: the public handles without `.await`, each call a `block_on`.
//! - `spool`, `consumer`, `delivery`: the public handles. Each call forwards to a backend.
//! - `backend`: the seam, one enum variant per backend (`Embedded`, and `Kafka` with the
//!   cargo feature `kafka`).
//! - `kafka`: the `Mode=Kafka` backend, over librdkafka. Beside `runtime`, and like it
//!   above `queue`, whose checks and types it shares.
//! - `runtime`: the embedded backend. Its instance, consumers, deliveries and threads.
//! - `admin`: the live instance's admin endpoint (socket, protocol, client); `runtime`
//!   serves it.
//! - `queue`: the semantics (publish and de-duplication, groups, ack/nack, dead-letter,
//!   reset, retention). Synchronous; takes `now` as an argument.
//! - `log` (one topic's segments; knows no groups) and `catalog` (the redb file; never
//!   reads segments).
//! - `format` (bytes <-> structs, no I/O) and `io` (the only code touching files).
//! - `options`, `names` and `error` are leaves.
//!
//! See ARCHITECTURE.md for the on-disk format and the invariants.
// One exception, with its safety argument: `kafka/commit.rs` (feature `kafka`), a bounded
// offset commit that rdkafka's safe API does not offer.
#![deny(unsafe_code)]
#![warn(missing_docs)]
#![warn(clippy::unwrap_used)]

#[doc(hidden)]
pub mod admin;
mod backend;
pub mod blocking;
mod catalog;
mod consumer;
mod delivery;
mod error;
mod fault;
mod format;
#[doc(hidden)]
pub mod fuzzing;
mod io;
mod journal;
#[cfg(feature = "kafka")]
mod kafka;
mod log;
mod names;
mod options;
mod parked;
mod queue;
mod runtime;
mod spool;

pub use consumer::{Consumer, ConsumerBuilder, Pull};
pub use delivery::Delivery;
pub use error::{Error, Result};
pub use format::Headers;
pub use format::record::Record;
pub use io::sync_stats::{SYNC_BUCKETS_US, SyncLatency};
pub use options::{Mode, NackBackoff, Options, RetentionPolicy, SyncPolicy};
pub use queue::{
    GroupCounts, GroupInfo, GroupMetrics, Metrics, NackOutcome, OffsetReset, PendingAttempt,
    SnapshotInfo, TopicConfig, TopicInfo, TopicMetrics,
};
#[doc(hidden)]
pub use queue::{TopicVerify, VerifyProblem, VerifyReport};
pub use spool::Spool;

/// Test support: the simulated file system of the power-loss tests.
#[doc(hidden)]
pub mod testing {
    pub use crate::io::sim::SimFs;

    /// `o` with no periodic background work (cursor commits, retention checks): in the
    /// power-loss tests the workload alone decides the order of file operations.
    pub fn without_background_work(mut o: crate::options::Options) -> crate::options::Options {
        o.commit_interval_ms = crate::options::MAX_MS;
        o.retention_check_ms = crate::options::MAX_MS;
        o
    }
}

/// Names and limits applications may want to refer to.
pub mod consts {
    pub use crate::log::MESSAGE_ID_HEADER;
    pub use crate::names::MAX_NAME_LEN;
    pub use crate::options::{
        DEFAULT_DEAD_LETTER_SUFFIX, DEFAULT_DEDUP_WINDOW, DEFAULT_KAFKA_TIMEOUT_MS,
        DEFAULT_MAX_DELIVERY_ATTEMPTS, DEFAULT_MAX_MESSAGE_BYTES, MAX_BACKOFF_STEPS,
        MAX_MESSAGE_ID_BYTES, MAX_NACK_REASON_BYTES, REFUSED_KAFKA_PROPERTIES,
    };
    pub use crate::queue::{
        ACK_DEADLINE_REASON, MESSAGE_KEY_HEADER, PANICKED_REASON, UNCLEAN_STOP_REASON,
        X_CONSUMER_GROUP, X_DEAD_LETTER_REASON, X_DELIVERY_ATTEMPTS, X_ORIGINAL_OFFSET,
        X_ORIGINAL_TIMESTAMP, X_ORIGINAL_TOPIC,
    };
}
