//! `message-id` de-duplication under `Mode=Kafka`: a publish whose id is in the topic's
//! window returns the original record's offset and produces nothing.
//!
//! - The window holds the ids of the last `Dedup Window` records this instance produced
//!   or found, per topic.
//! - It is rebuilt from the topic's tail when this instance first publishes an id to the
//!   topic: a restart keeps retries de-duplicated.
//! - Publishes carrying an id take the topic's window in turn (an async lock), so two
//!   retries racing in one instance produce once.
//! - Across producers in different processes it is not promised (API.md).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::{Kafka, blocking};
use crate::error::Result;
use crate::queue::MESSAGE_ID_HEADER;

/// One topic's remembered ids and the offsets they were produced at.
#[derive(Default)]
pub(super) struct Window {
    loaded: bool,
    offsets: HashMap<String, u64>,
    order: VecDeque<String>,
}

impl Window {
    pub fn get(&self, id: &str) -> Option<u64> {
        self.offsets.get(id).copied()
    }

    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    /// Remembers `id` at `offset`, forgetting the oldest past `cap`.
    pub fn insert(&mut self, id: &str, offset: u64, cap: usize) {
        if cap == 0 || self.offsets.insert(id.to_owned(), offset).is_some() {
            return;
        }
        self.order.push_back(id.to_owned());
        while self.order.len() > cap {
            if let Some(old) = self.order.pop_front() {
                self.offsets.remove(&old);
            }
        }
    }
}

pub(super) type Shared = Arc<tokio::sync::Mutex<Window>>;

impl Kafka {
    /// The window of `topic`, loaded from the topic's tail on first use.
    pub(super) async fn dedup_window(
        &self,
        topic: &str,
    ) -> Result<tokio::sync::OwnedMutexGuard<Window>> {
        let w: Shared = {
            let mut all = self.inner.dedup.lock().unwrap_or_else(|e| e.into_inner());
            all.entry(topic.to_owned()).or_default().clone()
        };
        let mut guard = w.lock_owned().await;
        if !guard.loaded {
            let (k, t) = (self.clone(), topic.to_owned());
            let found = blocking(move || k.tail_ids(&t)).await?;
            let cap = self.options().dedup_window;
            for (id, offset) in found {
                guard.insert(&id, offset, cap);
            }
            guard.loaded = true;
        }
        Ok(guard)
    }

    /// Ids currently remembered for `topic` (0 before its first publish with an id).
    pub(super) fn dedup_len(&self, topic: &str) -> usize {
        let all = self.inner.dedup.lock().unwrap_or_else(|e| e.into_inner());
        all.get(topic)
            .and_then(|w| w.try_lock().ok().map(|w| w.len()))
            .unwrap_or(0)
    }

    /// The `message-id`s of the last `Dedup Window` records of each partition, oldest
    /// first. Blocking.
    fn tail_ids(&self, topic: &str) -> Result<Vec<(String, u64)>> {
        let window = self.options().dedup_window as u64;
        let mut out = Vec::new();
        for p in 0..self.partitions(topic)? {
            let (lo, hi) = self.watermarks(topic, p)?;
            let from = lo.max(hi.saturating_sub(window));
            let count = usize::try_from(hi - from).unwrap_or(usize::MAX);
            for r in self.read_range(topic, p, from, hi, count)? {
                if let Some(id) = r.headers.get(MESSAGE_ID_HEADER) {
                    out.push((id.clone(), r.offset));
                }
            }
        }
        Ok(out)
    }
}
