//! Key-ordered parallelism under `Mode=Kafka` (`ConsumerBuilder::key_ordered`), one
//! partition at a time: a key's records all land on one partition (the `message-key`
//! header is the Kafka key), so a partition's order is the key's order.
//!
//! The rules are embedded mode's (`queue/key_order.rs`):
//! - at most one delivery of a key is out at a time;
//! - a key's records are handed out in offset order, redeliveries and delays included;
//! - records without a key are not ordered among themselves.
//!
//! How, per partition (`Part::keys`):
//! - Every record handed out or held is noted with its key, ordering on or off, and
//!   forgotten when it is finished (`Part::finish`). So turning the order on later
//!   finds every earlier record of a key that is still unfinished.
//! - A record read whose key has an earlier unfinished record waits in `held`.
//!   It keeps a slot of `max_in_flight` there, unlike in embedded mode: the floor's
//!   gaps ride in the commit's metadata, which `max_in_flight` bounds (`floor.rs`).
//! - Such records hold at most all slots but one; past that, the next waits at the read
//!   buffer's front. The free slot is for the record they wait for when it is read
//!   again after a seek back (a cancelled dead-letter): with none, its key would wait
//!   for good.
//! - A held record goes once it is due and its key's earliest unfinished record.
//! - A reset forgets the keys with the rest of the partition's state.
//!
//! The order holds while a consumer of this process's member built with
//! `key_ordered()` is open (`State::key_ordered`). A member in another process follows
//! its own consumers' setting: it owns other partitions, so other keys.

use super::group::Part;
use crate::format::record::Record;
use crate::queue::key_order::key_of;

impl Part {
    /// Finishes `o` (acked or dead-lettered): in the floor, and for its key.
    pub fn finish(&mut self, o: u64) {
        self.floor.finish(o);
        self.keys.remove(o);
    }

    /// `rec` is out or waiting from now on: later records of its key wait behind it.
    pub fn note_key(&mut self, rec: &Record) {
        self.keys.add(rec.offset, key_of(&rec.headers));
    }

    /// Whether `rec` must wait for an earlier unfinished record of its key.
    pub fn waits_for_key(&self, rec: &Record) -> bool {
        self.keys
            .has_earlier(rec.offset, key_of(&rec.headers).as_ref())
    }

    /// Whether held offset `o` is its key's earliest unfinished record (or has no key).
    pub fn key_turn(&self, o: u64) -> bool {
        self.keys.may_redeliver(o)
    }
}
