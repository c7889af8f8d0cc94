//! Wakers parked until a durable mark passes their key (durable-ack tickets, synced
//! publishes), instead of a channel per waiter. **Invariant:** a waiter looks at the mark
//! again under the list's lock before it parks, and the thread that moves the mark takes
//! that lock after moving it, so no wake-up is lost. Std only, no I/O.

use std::sync::Mutex;
use std::task::Waker;

pub(crate) struct Parked<K> {
    list: Mutex<Vec<(K, Waker)>>,
    /// The wakers `wake_where` takes out of the list, woken after the list's lock is let
    /// go; kept, like the list, with its capacity (no allocation per wake-up round).
    woken: Mutex<Vec<Waker>>,
}

impl<K> Default for Parked<K> {
    fn default() -> Self {
        Parked {
            list: Mutex::new(Vec::new()),
            woken: Mutex::new(Vec::new()),
        }
    }
}

impl<K> Parked<K> {
    /// `decided()` if it has an answer; otherwise parks `waker` under the key `make_key`
    /// builds and returns `None`. `again`: a repeated poll, so the key may be parked
    /// already (`is_mine` finds it and its waker is replaced, not added twice).
    pub fn poll<R>(
        &self,
        waker: &Waker,
        again: bool,
        decided: impl Fn() -> Option<R>,
        make_key: impl FnOnce() -> K,
        is_mine: impl Fn(&K) -> bool,
    ) -> Option<R> {
        if let Some(r) = decided() {
            return Some(r);
        }
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = decided() {
            return Some(r);
        }
        match list.iter_mut().find(|(k, _)| again && is_mine(k)) {
            Some((_, old)) => old.clone_from(waker),
            None => list.push((make_key(), waker.clone())),
        }
        None
    }

    /// Calls `f` with every parked key (under the list's lock: keep it short).
    pub fn for_each_key(&self, mut f: impl FnMut(&K)) {
        let list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        for (k, _) in list.iter() {
            f(k);
        }
    }

    /// Wakes and forgets every parked waker whose key `due` says is decided, and returns
    /// how many. Call after moving the mark.
    pub fn wake_where(&self, due: impl Fn(&K) -> bool) -> usize {
        let mut woken = self.woken.lock().unwrap_or_else(|e| e.into_inner());
        {
            let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
            woken.extend(list.extract_if(.., |(k, _)| due(k)).map(|(_, w)| w));
        }
        let n = woken.len();
        // Outside the list's lock: a woken task that parks again must not wait for it.
        for w in woken.drain(..) {
            w.wake();
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_parked_waker_is_woken_once_when_its_key_is_passed_and_a_repoll_replaces_it() {
        let mark = AtomicU64::new(0);
        let parked = Parked::<u64>::default();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mark = &mark;
        let decided = |t: u64| move || (mark.load(Ordering::SeqCst) >= t).then_some(t);
        assert_eq!(
            parked.poll(&waker, false, decided(2), || 2, |k| *k == 2),
            None
        );
        // A repeated poll replaces the parked waker instead of adding a second one.
        assert_eq!(
            parked.poll(&waker, true, decided(2), || 2, |k| *k == 2),
            None
        );
        mark.store(1, Ordering::SeqCst);
        parked.wake_where(|k| *k <= 1);
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "key 2 is not passed yet");
        mark.store(2, Ordering::SeqCst);
        parked.wake_where(|k| *k <= 2);
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken exactly once");
        assert_eq!(
            parked.poll(&waker, true, decided(2), || 2, |k| *k == 2),
            Some(2)
        );
    }
}
