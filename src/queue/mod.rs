//! The semantics: produce with de-duplication, consumer groups, ack/nack, dead-letter,
//! reset, retention. **Invariants:** synchronous and deterministic given `now_ms`; never
//! awaits (tokio lives in `runtime`); the effect is made durable before the catalog
//! commit that depends on it (a dead-letter copy is synced before the cursor moves).
//!
//! Lock order: `topics` map, then a topic's `groups` map, then one group, then a topic
//! writer (a group may append to its dead-letter topic while locked). A writer lock is
//! never held while taking a group lock.

mod ack;
#[cfg(test)]
mod committer_window;
mod cursor;
mod dead_letter;
pub mod dedup;
mod deliver;
mod engine;
#[cfg(test)]
mod explore;
pub mod group;
mod group_cell;
mod info;
mod nack;
pub mod names;
mod produce;
mod reset;
mod retention;
#[cfg(test)]
mod test_support;
mod topic;
mod unclean;

use ack::{GroupSnapshotter, finish_held};
pub use deliver::{GroupRef, LentRecords, Ticket};
pub use engine::Engine;
use engine::lock;
pub use group_cell::GroupCell;
use group_cell::group_ops;
pub use info::{
    GroupInfo, NackOutcome, OffsetReset, PendingAttempt, TopicInfo, X_CONSUMER_GROUP,
    X_DEAD_LETTER_REASON, X_DELIVERY_ATTEMPTS, X_ORIGINAL_OFFSET, X_ORIGINAL_TIMESTAMP,
    X_ORIGINAL_TOPIC,
};
pub use produce::Published;
use produce::rebuild_dedup;
pub use topic::Topic;
use topic::Writer;
pub use unclean::{PANICKED_REASON, UNCLEAN_STOP_REASON};
