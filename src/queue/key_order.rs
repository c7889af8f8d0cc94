//! Key-ordered parallelism (`ConsumerBuilder::key_ordered`): at most one delivery of a
//! key is out at a time, and a key's records are delivered in offset order, redeliveries
//! and delayed ones included. Records of other keys flow past a waiting key.
//! **Invariant:** when `complete`, `by_key[k]` holds exactly the offsets with key `k` that
//! are out or waiting (`in_flight` ∪ `redeliver`), and a key's one delivery out, if any,
//! is the lowest of them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::format::Headers;

/// The header that names a message's key: `message-key`.
pub const MESSAGE_KEY_HEADER: &str = "message-key";

/// A message's key (the `message-key` header's value).
pub type Key = Arc<str>;

/// The key of a record with these headers, if it has one.
pub fn key_of(headers: &Headers) -> Option<Key> {
    headers
        .get(MESSAGE_KEY_HEADER)
        .map(|k| Key::from(k.as_str()))
}

/// The keys of a key-ordered group's unfinished offsets that are out or waiting.
#[derive(Debug, Default)]
pub struct KeyOrder {
    key_of: BTreeMap<u64, Key>,
    by_key: HashMap<Key, BTreeSet<u64>>,
    /// Whether every offset out or waiting is known here. Bulk changes of the group (an
    /// open, a reset, a retention clamp, a low-level ack ahead of the read position) clear
    /// this; the next hand-out reads those records' keys again (`Engine::know_keys`).
    complete: bool,
}

impl KeyOrder {
    /// Whether the keys of every offset out or waiting are known.
    pub fn complete(&self) -> bool {
        self.complete
    }

    /// Forgets everything: the next hand-out reads the keys of what is out or waiting.
    pub fn invalidate(&mut self) {
        self.key_of.clear();
        self.by_key.clear();
        self.complete = false;
    }

    /// Starts over from the keys of everything out or waiting, read from the log.
    pub fn rebuild(&mut self, keys: impl IntoIterator<Item = (u64, Option<Key>)>) {
        self.invalidate();
        for (offset, key) in keys {
            self.add(offset, key);
        }
        self.complete = true;
    }

    /// `offset` (with its key, if any) is now out or waiting.
    pub fn add(&mut self, offset: u64, key: Option<Key>) {
        if let Some(k) = key {
            self.by_key.entry(k.clone()).or_default().insert(offset);
            self.key_of.insert(offset, k);
        }
    }

    /// `offset` is finished (or no longer the group's).
    pub fn remove(&mut self, offset: u64) {
        if let Some(k) = self.key_of.remove(&offset)
            && let Some(set) = self.by_key.get_mut(&k)
        {
            set.remove(&offset);
            if set.is_empty() {
                self.by_key.remove(&k);
            }
        }
    }

    /// Whether waiting `offset` may be delivered now: it is the lowest unfinished offset
    /// of its key (so no earlier one of its key is out or waiting), or it has no key.
    pub fn may_redeliver(&self, offset: u64) -> bool {
        self.key_of
            .get(&offset)
            .is_none_or(|k| self.by_key[k].first() == Some(&offset))
    }

    /// Whether an earlier offset than `offset` with `key` is out or waiting (the Kafka
    /// member's test: a record it reads again after a seek back is known already).
    #[cfg(feature = "kafka")]
    pub fn has_earlier(&self, offset: u64, key: Option<&Key>) -> bool {
        key.and_then(|k| self.by_key.get(k))
            .and_then(BTreeSet::first)
            .is_some_and(|&first| first < offset)
    }

    /// Whether a fresh record with `key` must wait behind an earlier one of its key.
    pub fn holds_back(&self, key: Option<&Key>) -> bool {
        key.is_some_and(|k| self.by_key.contains_key(k))
    }

    /// Debug-build check: exactly the offsets `out_or_waiting` are known.
    pub fn check(&self, out_or_waiting: impl Fn(u64) -> bool) {
        if cfg!(debug_assertions) && self.complete {
            debug_assert!(self.key_of.keys().all(|&o| out_or_waiting(o)));
            let in_sets: usize = self.by_key.values().map(BTreeSet::len).sum();
            debug_assert_eq!(in_sets, self.key_of.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> Option<Key> {
        Some(Key::from(s))
    }

    #[test]
    fn a_key_waits_behind_its_lowest_offset_and_other_keys_flow() {
        let mut ko = KeyOrder::default();
        ko.rebuild([(3, k("a")), (5, k("b")), (7, k("a")), (8, None)]);
        assert!(ko.may_redeliver(3) && ko.may_redeliver(5) && ko.may_redeliver(8));
        assert!(!ko.may_redeliver(7), "3 of the same key comes first");
        assert!(ko.holds_back(k("a").as_ref()));
        assert!(!ko.holds_back(k("c").as_ref()) && !ko.holds_back(None));
        ko.remove(3);
        assert!(ko.may_redeliver(7));
        ko.remove(7);
        assert!(
            !ko.holds_back(k("a").as_ref()),
            "a key with nothing left is free"
        );
    }

    #[test]
    fn invalidate_forgets_until_rebuilt() {
        let mut ko = KeyOrder::default();
        ko.rebuild([(1, k("a"))]);
        assert!(ko.complete());
        ko.invalidate();
        assert!(!ko.complete() && !ko.holds_back(k("a").as_ref()));
    }
}
