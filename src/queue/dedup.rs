//! Bounded message-id de-duplication: the last N ids appended to a topic, first in,
//! first out. Memory is O(window), whatever the log's size.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

#[derive(Debug, Default)]
pub struct Dedup {
    window: usize,
    /// id -> offset of the newest record carrying it.
    map: HashMap<Arc<str>, u64>,
    /// Ids in append order (so also offset order), with the offset they were appended at.
    order: VecDeque<(Arc<str>, u64)>,
}

impl Dedup {
    pub fn new(window: usize) -> Self {
        Dedup {
            window,
            map: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.window > 0
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// The original offset of `id`, if it is in the window.
    pub fn lookup(&self, id: &str) -> Option<u64> {
        if !self.enabled() {
            return None;
        }
        self.map.get(id).copied()
    }

    /// The original offset of `id` if it is still in the window after `inserts` more ids
    /// are appended (the earlier ids of the same batch).
    pub fn lookup_after(&self, id: &str, inserts: usize) -> Option<u64> {
        let offset = self.lookup(id)?;
        let evicted = (self.order.len() + inserts).saturating_sub(self.window);
        // `order` is in offset order, so an id's place in it is a binary search away.
        let place = self.order.partition_point(|(_, o)| *o < offset);
        (place >= evicted).then_some(offset)
    }

    /// Records that `id` was appended at `offset`. A hit never comes here, so an id's
    /// place is never refreshed.
    pub fn insert(&mut self, id: &str, offset: u64) {
        if !self.enabled() {
            return;
        }
        let id: Arc<str> = Arc::from(id);
        self.map.insert(id.clone(), offset);
        self.order.push_back((id, offset));
        while self.order.len() > self.window {
            self.evict_front();
        }
        debug_assert!(self.map.len() <= self.order.len());
    }

    /// Forgets the ids of records below `earliest` (deleted by retention).
    pub fn forget_below(&mut self, earliest: u64) {
        while self.order.front().is_some_and(|(_, o)| *o < earliest) {
            self.evict_front();
        }
    }

    /// Forgets the ids of records at or after `next`: held records a failed write
    /// dropped (`Writer::forget_dropped`), whose offsets the next appends get again.
    pub fn forget_from(&mut self, next: u64) {
        while self.order.back().is_some_and(|(_, o)| *o >= next) {
            if let Some((id, offset)) = self.order.pop_back()
                && self.map.get(&id) == Some(&offset)
            {
                self.map.remove(&id);
            }
        }
    }

    fn evict_front(&mut self) {
        if let Some((id, offset)) = self.order.pop_front() {
            // Only if the map still points at this entry (an id may be re-appended after
            // its record was deleted by retention).
            if self.map.get(&id) == Some(&offset) {
                self.map.remove(&id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Dedup;

    #[test]
    fn fifo_by_count_without_refresh() {
        let mut d = Dedup::new(2);
        d.insert("a", 0);
        d.insert("b", 1);
        assert_eq!(d.lookup("a"), Some(0));
        d.insert("c", 2);
        assert_eq!(d.lookup("a"), None);
        assert_eq!(d.lookup("b"), Some(1));
        d.forget_below(2);
        assert_eq!(d.lookup("b"), None);
        assert_eq!(d.lookup("c"), Some(2));
        assert_eq!(Dedup::new(0).lookup("x"), None);
    }

    #[test]
    fn forget_from_drops_the_newest_ids_only() {
        let mut d = Dedup::new(4);
        d.insert("a", 0);
        d.insert("b", 1);
        d.insert("c", 2);
        d.forget_from(1);
        assert_eq!(d.lookup("a"), Some(0));
        assert_eq!((d.lookup("b"), d.lookup("c")), (None, None));
        assert_eq!(d.len(), 1);
        d.insert("b", 1);
        assert_eq!(d.lookup("b"), Some(1));
    }
}
