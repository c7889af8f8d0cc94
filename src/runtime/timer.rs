//! Rings a consumer's wake-up at a set time: a consumer parks while a record of its group
//! waits out a delay, or a delivery's ack deadline runs, and must look again then even if
//! nothing is published. A std thread (so `recv` needs no runtime timer), one per
//! process, started by the first wait with a time.
//! **Invariant:** every ring asked for happens at or after its time; a consumer gone by
//! then is skipped (the timer holds only a weak reference).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Instant;

use super::Wakeup;

#[derive(Default)]
struct Timers {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// (when, which wake-up) by time; `Reverse` makes the heap's top the earliest.
    due: BinaryHeap<Reverse<(Instant, usize)>>,
    /// What each queued ring rings, and whether it is queued (one ring per time and
    /// wake-up, however often a consumer parks before it).
    queued: HashSet<(Instant, usize)>,
    wakeups: Vec<(usize, Weak<Wakeup>)>,
}

/// Rings `wakeup` at `at` (at once if `at` has passed).
pub(crate) fn ring_at(at: Instant, wakeup: &Arc<Wakeup>) {
    let timers = timers();
    let key = Arc::as_ptr(wakeup) as usize;
    let mut s = timers.state.lock().unwrap_or_else(|e| e.into_inner());
    if !s.queued.insert((at, key)) {
        return;
    }
    s.due.push(Reverse((at, key)));
    // A wake-up freed and another made at its address: the new one takes the entry.
    match s.wakeups.iter_mut().find(|(k, _)| *k == key) {
        Some(entry) => entry.1 = Arc::downgrade(wakeup),
        None => s.wakeups.push((key, Arc::downgrade(wakeup))),
    }
    drop(s);
    timers.changed.notify_one();
}

fn timers() -> &'static Timers {
    static TIMERS: OnceLock<&'static Timers> = OnceLock::new();
    TIMERS.get_or_init(|| {
        let t: &'static Timers = Box::leak(Box::default());
        std::thread::Builder::new()
            .name("spool-timer".into())
            .spawn(move || run(t))
            .expect("spawning the spool-timer thread");
        t
    })
}

fn run(t: &'static Timers) {
    let mut s = t.state.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let now = Instant::now();
        match s.due.peek().map(|Reverse(d)| *d) {
            None => s = t.changed.wait(s).unwrap_or_else(|e| e.into_inner()),
            Some((at, _)) if at > now => {
                s = t
                    .changed
                    .wait_timeout(s, at - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            Some((at, key)) => {
                s.due.pop();
                s.queued.remove(&(at, key));
                let w = s
                    .wakeups
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, w)| w.clone());
                // A wake-up nothing else waits on any more is forgotten.
                if !s.queued.iter().any(|(_, k)| *k == key) {
                    s.wakeups.retain(|(k, _)| *k != key);
                }
                drop(s);
                if let Some(w) = w.and_then(|w| w.upgrade()) {
                    w.wake_all();
                }
                s = t.state.lock().unwrap_or_else(|e| e.into_inner());
            }
        }
    }
}
