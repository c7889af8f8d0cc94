//! The semantics: produce with de-duplication, consumer groups, ack/nack, dead-letter,
//! reset, retention. **Invariants:** synchronous and deterministic given `now_ms`; never
//! awaits (tokio lives in `runtime`); the effect is made durable before the catalog
//! commit that depends on it (a dead-letter copy is synced before the cursor moves).
//!
//! Lock order: `topics` map, then a topic's `groups` map, then one group, then a topic
//! writer (a group may append to its dead-letter topic while locked). A writer lock is
//! never held while taking a group lock.
//!
//! # Files
//! One role each. Several add an `impl Engine` block for their part of the API.
//! - `engine.rs`: the `Engine` (directory lock, catalog, topic map); open, sync, close.
//!   An open finishes recovery before anything is handed out.
//! - `topic.rs`: a topic's writer, reader and groups; the map of topics. Every topic in
//!   the map has a valid name.
//! - `produce.rs`: publish, message checks, the de-duplication window and its rebuild.
//!   A batch is all or nothing; the window holds the ids of records in the log.
//! - `dedup.rs`: the window of message ids. Memory is O(window), whatever the log's size.
//! - `group.rs`: one group's state, pure (no I/O). Every offset between the cursor and
//!   the read position is out, waiting or done.
//! - `group_cell.rs`: a group behind its lock, its catalog image, the ticker's commit.
//!   Locking takes back lent records first; a group's commits land in lock order.
//! - `deliver.rs`: consumer handles and hand-outs, with read-ahead lent to auto-ack
//!   consumers. Every hand-out is below the group's durable lease.
//! - `ack.rs`: acks and releases; the durable ack's group snapshotter. Only the ticket
//!   that holds an offset finishes it.
//! - `nack.rs`: nacks, with a delay or the backoff. An attempt counts only once its
//!   commit succeeded.
//! - `deadline.rs`: ack deadlines: an expired delivery is taken back as a failed attempt.
//!   Its late ack or nack changes nothing.
//! - `key_order.rs`: key-ordered parallelism. At most one delivery of a key is out.
//! - `dead_letter.rs`: copies to the dead-letter topic, also interrupted ones. At most
//!   one copy per message and group.
//! - `unclean.rs`: charges for what was out at an unclean stop or a handler's panic.
//!   Each such delivery is charged one attempt.
//! - `cursor.rs`: the low-level ack and nack of a group's cursor. A refused call
//!   creates nothing.
//! - `reset.rs`: moving a group's cursor. A reset starts a new epoch.
//! - `retention.rs`: deleting old segments (by limits, by acks, before an offset), and
//!   the clamp. Records deleted before a group finished them count as skipped.
//! - `topic_config.rs`: a topic's overrides of the instance's retention settings.
//!   Durable before they apply.
//! - `snapshot.rs`: a consistent copy of the instance, taken while it runs. The copy is a
//!   state a crash at one instant could have left.
//! - `verify.rs`: every log read back and the catalog checked against the logs
//!   (`spool verify`). Read-only.
//! - `info.rs`: the public types, header names and state queries. `lib.rs` re-exports
//!   every public item.
//! - `names.rs`: topic and group names. A valid name is never a path.
//! - Test only: `test_support.rs` (helpers the tests share), `committer_window.rs`
//!   (interleavings with the catalog's committer), `explore.rs` (a reference model and
//!   its checks) with `explore/driver.rs` (random operations and stops).

mod ack;
#[cfg(test)]
mod committer_window;
mod cursor;
mod dead_letter;
mod deadline;
pub mod dedup;
mod deliver;
mod engine;
#[cfg(test)]
mod explore;
pub mod group;
mod group_cell;
mod info;
pub mod key_order;
mod nack;
mod produce;
mod reset;
mod retention;
mod snapshot;
#[cfg(test)]
mod test_support;
mod topic;
mod topic_config;
mod unclean;
mod verify;

pub use crate::catalog::AckWatch;
#[cfg(feature = "kafka")]
pub(crate) use crate::log::MESSAGE_ID_HEADER;
pub use deadline::ACK_DEADLINE_REASON;
pub use deliver::{GroupRef, Handling, LentRecords, Ticket};
pub use engine::Engine;
pub use group_cell::OpenConsumer;
pub use info::{
    GroupCounts, GroupInfo, GroupMetrics, Metrics, NackOutcome, OffsetReset, PendingAttempt,
    TopicInfo, TopicMetrics, X_CONSUMER_GROUP, X_DEAD_LETTER_REASON, X_DELIVERY_ATTEMPTS,
    X_ORIGINAL_OFFSET, X_ORIGINAL_TIMESTAMP, X_ORIGINAL_TOPIC,
};
pub use key_order::MESSAGE_KEY_HEADER;
pub use produce::Published;
#[cfg(feature = "kafka")]
pub(crate) use produce::check_message;
pub use snapshot::SnapshotInfo;
pub use topic::Topic;
pub use topic_config::TopicConfig;
pub use unclean::{PANICKED_REASON, UNCLEAN_STOP_REASON};
pub use verify::{TopicVerify, VerifyProblem, VerifyReport, verify_closed};
