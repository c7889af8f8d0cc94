//! Rings a consumer's wake-up at a set time: a consumer parks while a record of its group
//! waits out a delay, or a delivery's ack deadline runs, and must look again then even if
//! nothing is published. A std thread (so `recv` needs no runtime timer), one per
//! process, started by the first wait with a time (if it cannot start, rings are made
//! at once, and starting is tried again at the next).
//! **Invariant:** every ring asked for happens at or after its time; a consumer gone by
//! then is skipped (the timer holds only a weak reference).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// (when, which wake-up) by time; `Reverse` makes the heap's top the earliest. An
    /// entry no longer in `pending` (an earlier ring replaced it) is skipped.
    due: BinaryHeap<Reverse<(Instant, usize)>>,
    /// Each wake-up's one pending ring: a consumer that parks again and again before it
    /// asks for no second one (the ring makes it look, and ask again, anyway).
    pending: HashMap<usize, (Instant, Weak<Wakeup>)>,
}

/// Rings `wakeup` at `at` (at once if `at` has passed), unless a ring at or before `at`
/// is pending for it already.
pub(crate) fn ring_at(at: Instant, wakeup: &Arc<Wakeup>) {
    let timers = timers();
    let key = Arc::as_ptr(wakeup) as usize;
    let mut s = timers.state.lock().unwrap_or_else(|e| e.into_inner());
    // A wake-up freed and another made at its address: the old entry is not its ring.
    if let Some((when, w)) = s.pending.get(&key)
        && *when <= at
        && w.strong_count() > 0
    {
        return;
    }
    s.pending.insert(key, (at, Arc::downgrade(wakeup)));
    s.due.push(Reverse((at, key)));
    drop(s);
    timers.changed.notify_one();
    if !started(timers) {
        // No thread to ring later: ring now. The consumer looks, parks again and asks
        // again (busy, but never asleep past its time), and the next ask retries the
        // thread.
        wakeup.wake_all();
    }
}

fn timers() -> &'static Timers {
    static TIMERS: OnceLock<&'static Timers> = OnceLock::new();
    TIMERS.get_or_init(|| Box::leak(Box::default()))
}

/// Whether the timer thread runs, starting it if not. Starting can fail when the process
/// is out of threads or memory: that is logged, and tried again at the next ring.
fn started(t: &'static Timers) -> bool {
    static RUNNING: AtomicBool = AtomicBool::new(false);
    static STARTED: Mutex<bool> = Mutex::new(false);
    if RUNNING.load(Ordering::Acquire) {
        return true;
    }
    let mut started = STARTED.lock().unwrap_or_else(|e| e.into_inner());
    if !*started {
        match std::thread::Builder::new()
            .name("spool-timer".into())
            .spawn(move || run(t))
        {
            Ok(_) => {
                *started = true;
                RUNNING.store(true, Ordering::Release);
            }
            Err(e) => tracing::error!(error = %e, "cannot start the spool-timer thread"),
        }
    }
    *started
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
                let ours = s.pending.get(&key).is_some_and(|(when, _)| *when == at);
                let w = if ours {
                    s.pending.remove(&key).map(|(_, w)| w)
                } else {
                    None
                };
                drop(s);
                if let Some(w) = w.and_then(|w| w.upgrade()) {
                    w.wake_all();
                }
                s = t.state.lock().unwrap_or_else(|e| e.into_inner());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(w: &Arc<Wakeup>) -> Option<Instant> {
        let key = Arc::as_ptr(w) as usize;
        let s = timers().state.lock().unwrap_or_else(|e| e.into_inner());
        s.pending.get(&key).map(|(at, _)| *at)
    }

    /// A consumer that parks many times before its ring asks for one ring, the earliest.
    #[test]
    fn one_ring_is_pending_per_wake_up_the_earliest() {
        let w = Arc::new(Wakeup::default());
        let base = Instant::now() + std::time::Duration::from_secs(3600);
        for i in 0..100u64 {
            ring_at(base + std::time::Duration::from_nanos(i), &w);
        }
        assert_eq!(pending(&w), Some(base));
        let sooner = base - std::time::Duration::from_secs(1);
        ring_at(sooner, &w);
        assert_eq!(pending(&w), Some(sooner));
        let rings = w.rings();
        ring_at(Instant::now(), &w);
        let start = Instant::now();
        while w.rings() == rings && start.elapsed() < std::time::Duration::from_secs(20) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(w.rings() > rings, "a ring that is due rings");
        assert_eq!(pending(&w), None);
    }
}
