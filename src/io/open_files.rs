//! A bound on the descriptors that files kept open hold: a log's segments register when
//! they open a file, and once more are open than the bound, the least recently used
//! idle ones close theirs (reopened when next used).
//!
//! **Invariant:** a sweep never waits for a holder (it asks, and an idle holder closes);
//! the bound is exceeded only by files in use at that instant or not closable yet (see
//! [`Holder`]).
//!
//! Least recently used is approximated by the CLOCK algorithm: a use sets a holder's
//! mark (one relaxed store, no shared counter on the append path), a sweep goes round
//! the holders from where it stopped, clears the marks it finds and closes the first
//! unmarked ones.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Descriptors all the segment files a process keeps open may hold under the common soft
/// limit of 1,024 (and the simulated file system's default). A topic in use holds two
/// (its active segment and its index), a reader of old records up to 8 sealed segments
/// more. On the real file system the bound is half the process's soft limit, whatever it
/// is (`process_bound`): this when it is 1,024.
pub const OPEN_FILES_MAX: usize = 512;
/// The bound under a very low soft limit, and under a very high one (or none).
const PROCESS_BOUND_MIN: usize = 16;
const PROCESS_BOUND_CAP: usize = 16_384;

/// Half the process's soft limit on descriptors (`RLIMIT_NOFILE`), read at first use:
/// the other half is left to the application, the catalog, the admin endpoint and
/// short-lived opens (a directory sync, an index read). A process that raised its limit
/// (as servers of many topics do) keeps more topics' files open.
fn process_bound() -> usize {
    use rustix::process::{Resource, getrlimit};
    bound_for(getrlimit(Resource::Nofile).current)
}

/// The bound under a soft limit of `soft` descriptors (`None`: unlimited).
fn bound_for(soft: Option<u64>) -> usize {
    soft.map_or(PROCESS_BOUND_CAP, |soft| {
        usize::try_from(soft / 2).unwrap_or(PROCESS_BOUND_CAP)
    })
    .clamp(PROCESS_BOUND_MIN, PROCESS_BOUND_CAP)
}

/// What a sweep finds a holder doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// It holds no file: it leaves the budget's list (it comes back when it opens one).
    Holds0,
    /// Used since the last sweep: its mark is cleared and it is passed over this time.
    Used,
    /// Not used since the last sweep, holding this many descriptors: a candidate.
    Idle(usize),
}

/// Something that keeps files open and can close them when asked (a segment).
pub trait Holder: Send + Sync {
    /// What a sweep sees; clears the mark a use set (`Seen::Used`). Never waits.
    fn seen(&self) -> Seen;
    /// Closes what it holds if nothing uses it now. Never syncs and never waits for
    /// another thread (a segment's unsynced writes stay counted, for the sync that needs
    /// them to open the file again).
    fn release(&self);
}

/// The bound and who holds what under it. One per `Fs`; `Fs::real` shares one.
#[derive(Debug)]
pub struct OpenFiles {
    max: usize,
    open: AtomicUsize,
    next_key: AtomicU64,
    holders: Mutex<Ring>,
}

/// The holders with a file open (and some that closed theirs since the last sweep), by
/// key: registration order, so that a sweep's order does not depend on memory addresses
/// (power-loss tests replay a run operation by operation).
#[derive(Default)]
struct Ring {
    list: BTreeMap<u64, Weak<dyn Holder>>,
    /// Where the last sweep stopped.
    hand: u64,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("holders", &self.list.len())
            .field("hand", &self.hand)
            .finish()
    }
}

/// One descriptor counted against an `OpenFiles` budget, until dropped.
#[derive(Debug)]
pub struct Token(Arc<OpenFiles>);

impl Drop for Token {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl OpenFiles {
    pub fn new(max: usize) -> Arc<OpenFiles> {
        Arc::new(OpenFiles {
            max: max.max(1),
            open: AtomicUsize::new(0),
            next_key: AtomicU64::new(0),
            holders: Mutex::new(Ring::default()),
        })
    }

    /// The budget every `Fs::real()` shares: the descriptor limit is the process's.
    pub fn process() -> Arc<OpenFiles> {
        static PROCESS: std::sync::OnceLock<Arc<OpenFiles>> = std::sync::OnceLock::new();
        PROCESS
            .get_or_init(|| OpenFiles::new(process_bound()))
            .clone()
    }

    /// Descriptors counted now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// A key for a new holder (`register`).
    pub fn next_key(&self) -> u64 {
        self.next_key.fetch_add(1, Ordering::Relaxed)
    }

    /// Counts a descriptor just opened.
    pub fn opened(self: &Arc<Self>) -> Token {
        self.open.fetch_add(1, Ordering::AcqRel);
        Token(self.clone())
    }

    /// Lists `holder` (under `key`, from `next_key`) among those a sweep asks; listing it
    /// again is harmless. Call after it stored its file, with none of its locks held.
    pub fn register(&self, key: u64, holder: Weak<dyn Holder>) {
        let mut ring = self.holders.lock().unwrap_or_else(|e| e.into_inner());
        ring.list.entry(key).or_insert(holder);
    }

    /// If more descriptors are open than the bound: asks the least recently used idle
    /// holders to close theirs, until back under it or every holder was asked. Another
    /// sweep under way does it instead. Call with no lock of a holder held. `opener` (the
    /// holder that just opened a file, if any) is never asked: it is about to use it.
    pub fn sweep_if_over(&self, opener: Option<u64>) {
        if self.open() <= self.max {
            return;
        }
        let victims = {
            let Ok(mut ring) = self.holders.try_lock() else {
                return;
            };
            self.pick(&mut ring, opener)
        };
        // Outside the list's lock: a release takes its holder's locks (with `try_*`).
        for v in victims {
            v.release();
        }
    }

    /// Goes round the list (twice at most: the first round may only clear marks) and
    /// picks idle holders enough to come back under the bound.
    fn pick(&self, ring: &mut Ring, opener: Option<u64>) -> Vec<Arc<dyn Holder>> {
        let mut excess = self.open().saturating_sub(self.max);
        let mut victims = Vec::new();
        let mut steps = 2 * ring.list.len();
        while excess > 0 && steps > 0 {
            steps -= 1;
            let Some((&key, weak)) = ring
                .list
                .range(ring.hand..)
                .next()
                .or_else(|| ring.list.iter().next())
            else {
                break;
            };
            ring.hand = key + 1;
            if opener == Some(key) {
                continue;
            }
            let Some(h) = weak.upgrade() else {
                ring.list.remove(&key);
                continue;
            };
            match h.seen() {
                Seen::Holds0 => {
                    ring.list.remove(&key);
                }
                Seen::Used => {}
                Seen::Idle(n) => {
                    excess = excess.saturating_sub(n);
                    victims.push(h);
                }
            }
        }
        victims
    }

    /// Holders listed (for tests: the list does not grow with closed ones).
    #[cfg(test)]
    pub fn listed(&self) -> usize {
        self.holders
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .list
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// Half the soft limit: 512 under the common 1,024, more where it was raised, never
    /// more than the cap nor less than the floor.
    #[test]
    fn the_bound_is_half_the_soft_limit() {
        assert_eq!(bound_for(Some(1024)), OPEN_FILES_MAX);
        assert_eq!(bound_for(Some(20_000)), 10_000);
        assert_eq!(bound_for(Some(u64::MAX)), PROCESS_BOUND_CAP);
        assert_eq!(bound_for(None), PROCESS_BOUND_CAP);
        assert_eq!(bound_for(Some(8)), PROCESS_BOUND_MIN);
    }

    /// A holder of one descriptor that closes when asked unless `busy`.
    struct Fake {
        files: Arc<OpenFiles>,
        token: Mutex<Option<Token>>,
        used: AtomicBool,
        busy: AtomicBool,
    }

    impl Holder for Fake {
        fn seen(&self) -> Seen {
            if self.token.lock().expect("lock").is_none() {
                Seen::Holds0
            } else if self.used.swap(false, Ordering::Relaxed) {
                Seen::Used
            } else {
                Seen::Idle(1)
            }
        }
        fn release(&self) {
            if !self.busy.load(Ordering::Relaxed) {
                self.token.lock().expect("lock").take();
            }
        }
    }

    impl Fake {
        fn open(self: &Arc<Self>, key: u64) {
            self.used.store(true, Ordering::Relaxed);
            let mut t = self.token.lock().expect("lock");
            if t.is_none() {
                *t = Some(self.files.opened());
            }
            drop(t);
            let weak: Weak<dyn Holder> = Arc::downgrade(self) as Weak<dyn Holder>;
            self.files.register(key, weak);
            self.files.sweep_if_over(None);
        }
        fn holds(&self) -> bool {
            self.token.lock().expect("lock").is_some()
        }
    }

    /// The least recently used idle holders close; one in use or busy is passed over;
    /// the list keeps only holders with a file open, however many come and go.
    #[test]
    fn the_least_recently_used_idle_holders_close_beyond_the_bound() {
        let files = OpenFiles::new(4);
        let fakes: Vec<Arc<Fake>> = (0..10)
            .map(|_| {
                Arc::new(Fake {
                    files: files.clone(),
                    token: Mutex::new(None),
                    used: AtomicBool::new(false),
                    busy: AtomicBool::new(false),
                })
            })
            .collect();
        fakes[0].busy.store(true, Ordering::Relaxed);
        for (i, f) in fakes.iter().enumerate() {
            f.open(i as u64);
            assert!(files.open() <= 4 + 1, "{}", files.open());
        }
        assert!(fakes[0].holds(), "busy: kept");
        assert!(fakes[9].holds(), "the newest is in use");
        assert!(!fakes[1].holds(), "least recently used: closed");
        // Using an old one again reopens it; the bound holds.
        for round in 0..5 {
            for (i, f) in fakes.iter().enumerate().skip(1) {
                if i % 3 == round % 3 {
                    f.open(i as u64);
                }
            }
            assert!(files.open() <= 4 + 1, "{}", files.open());
        }
        assert!(files.listed() <= 10);
        drop(fakes);
        assert_eq!(files.open(), 0, "tokens give their descriptors back");
    }
}
