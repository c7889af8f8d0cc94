//! The shared journal: group commit across topics under `Sync=Always` (issue 31 point 2).
//!
//! Each topic is its own log, so durable publishes to N topics cost N `fdatasync`s per
//! round of the sync thread (measured: 64 publishers over 1,000 topics, 0.2 ms each,
//! 3.5 k msg/s against 196 k on one topic). A round over several segments instead copies
//! each one's bytes that no sync covered into `journal.wal` and syncs that one file: the
//! round costs one sync, as on one topic (BookKeeper's journal, RocksDB's WAL).
//!
//! How the promise holds:
//! - A publish returns once its bytes are in the segment's page cache *and* durable in
//!   the journal (`Segment::journaled`).
//! - The journal is two files, `journal.0.wal` and `journal.1.wal`, written in turn.
//!   When the one in use is full, the sync thread goes on in the other, and a checkpoint
//!   syncs the segment files the full one made durable, on a thread of its own. Only
//!   then is that file emptied (a new generation in its header). At close, both are.
//! - After a crash, open copies every entry of both files back into its segment file
//!   before any log is opened (`replay.rs`), syncs those files, then empties the journal.
//!
//! Rules:
//! - A round of one segment syncs that file (one sync either way, and no checkpoint due).
//! - A segment with more than `ENTRY_DATA_MAX` to make durable syncs its file: big
//!   writes are at the disk's speed already, and copying them twice would halve it.
//! - If the journal fails, the round syncs each file instead and the journal stays off.
//!   Its entries stay for the next open.
//! - At most one checkpoint runs; a round that needs its file waits for it, before it
//!   takes any segment's sync lock (the checkpoint takes them too).
//!
//! Files, by role:
//! - `mod.rs`: `Journal`, a round, the switch from one file to the other, close.
//! - `half.rs`: one journal file.
//! - `checkpoint.rs`: syncing the segments of a full file, then emptying it.
//! - `replay.rs`: copying the entries back at open.
//!
//! **Invariant:** a journal file is emptied only after every segment its entries made
//! durable was synced itself.

mod checkpoint;
mod half;
mod replay;

pub(crate) use half::FILE_NAMES;
pub(crate) use replay::replay;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::Result;
use crate::format::journal::{self as fmt, Target};
use crate::io::Fs;
use crate::log::segment::{Journaling, Segment, Shown};
use checkpoint::Running;
use half::Half;

/// Each journal file's size: when the one in use is full, it is checkpointed (at
/// 100 MB/s, every 0.3 s) while the other takes the rounds.
const HALF_BYTES: u64 = 32 << 20;
/// The most bytes of one segment a round copies; more, and its file is synced instead.
const ENTRY_DATA_MAX: usize = 1 << 20;
/// The last generation a header may name: far beyond any real count, so that the next
/// ones never overflow (open refuses a journal past it as damaged).
pub(crate) const GENERATION_MAX: u64 = u64::MAX / 2;

/// What is left of a round once the journal's lock is released.
enum Done<'a> {
    /// Durable through the journal: its consumers to wake.
    Shown(Shown),
    /// Not in the journal: its file is synced instead.
    Direct(Journaling<'a>),
}

/// The shared journal of one data directory (`Sync=Always` only).
pub(crate) struct Journal {
    fs: Fs,
    dir: PathBuf,
    /// Each file's size (`HALF_BYTES` but in tests).
    capacity: u64,
    state: Mutex<State>,
}

struct State {
    halves: [Half; 2],
    /// The file rounds go to.
    current: usize,
    /// The generation the next header written gets (each is new: `replay`).
    next_generation: u64,
    /// The checkpoint of the other file, if one runs.
    running: Option<Running>,
    /// Off after a failure or the close: rounds sync each file.
    off: bool,
    /// The round's entries (kept: no allocation per round).
    buf: Vec<u8>,
}

impl Journal {
    /// The journal of `dir`; `next_generation` is what `replay` returned.
    pub(crate) fn new(fs: &Fs, dir: &Path, next_generation: u64) -> Journal {
        let state = State {
            halves: Default::default(),
            current: 0,
            next_generation,
            running: None,
            off: false,
            buf: Vec::new(),
        };
        Journal {
            fs: fs.clone(),
            dir: dir.to_path_buf(),
            capacity: fs.journal_bytes().unwrap_or(HALF_BYTES),
            state: Mutex::new(state),
        }
    }

    /// Makes what was written to `segments` durable: through one journal write and sync
    /// when there are several, else by syncing each. A failure lands in the segment (its
    /// topic stops, `Segment::poisoned`), as with `Segment::sync`.
    pub(crate) fn sync_round(&self, segments: &[Arc<Segment>]) {
        let mut st = self.lock();
        if segments.len() >= 2 && !st.off {
            // Before any segment's sync lock is taken: a checkpoint takes them.
            let wanted: u64 = segments.iter().map(|s| s.pending_bytes()).sum();
            if wanted > st.halves[st.current].room(self.capacity) {
                self.switch(&mut st);
            }
        }
        if segments.len() < 2 || st.off {
            drop(st);
            for seg in segments {
                let _ = seg.sync();
            }
            return;
        }
        let done = self.journal_round(&mut st, segments);
        // With no lock of the journal held: a wake-up may drop the last handle (whose
        // close takes it), and a sync of one topic's file need not hold up the others.
        drop(st);
        for d in done {
            match d {
                Done::Shown(s) => s.wake(),
                Done::Direct(j) => drop(j.sync_instead()),
            }
        }
    }

    /// The round through the journal: each segment's bytes taken under its sync lock,
    /// one write and sync, then each shown durable. Returns whom to wake, and the
    /// segments whose own file is to be synced instead.
    fn journal_round<'a>(&self, st: &mut State, segments: &'a [Arc<Segment>]) -> Vec<Done<'a>> {
        let cur = st.current;
        let Some(generation) = self.generation_of(st, cur) else {
            st.off = true;
            tracing::error!(
                "the journal ran out of generations: syncing each topic's file from now on"
            );
            segments.iter().for_each(|s| drop(s.sync()));
            return Vec::new();
        };
        // What does not fit is synced in its own file: the journal never outgrows its size.
        let room = st.halves[cur].room(self.capacity) as usize;
        let mut taken = Vec::with_capacity(segments.len());
        let mut direct = Vec::new();
        let mut buf = std::mem::take(&mut st.buf);
        buf.clear();
        for seg in segments {
            let Ok(Some(j)) = seg.journaling() else {
                continue;
            };
            let fits = j.len() <= ENTRY_DATA_MAX && buf.len() + entry_len(&j) <= room;
            if !fits || add_entry(&mut buf, generation, &j).is_err() {
                direct.push(j);
            } else {
                taken.push((seg, j));
            }
        }
        let written = self.write(st, cur, generation, &buf);
        st.buf = buf;
        let mut done: Vec<Done<'a>> = direct.into_iter().map(Done::Direct).collect();
        if let Err(e) = written {
            tracing::error!(error = %e, "the journal failed: syncing each topic's file from now on");
            st.off = true;
            done.extend(taken.into_iter().map(|(_, j)| Done::Direct(j)));
            return done;
        }
        for (seg, j) in taken {
            st.halves[cur]
                .unsynced
                .entry(Arc::as_ptr(seg) as usize)
                .or_insert_with(|| seg.clone());
            done.extend(j.durable().map(Done::Shown));
        }
        done
    }

    /// The generation entries of file `half` carry: its header's, or the one a file made
    /// now gets (`None`: none is left).
    fn generation_of(&self, st: &mut State, half: usize) -> Option<u64> {
        if st.halves[half].file.is_some() {
            Some(st.halves[half].generation)
        } else {
            (st.next_generation <= GENERATION_MAX).then_some(st.next_generation)
        }
    }

    /// Writes `buf` (entries of `generation`) to file `half` and syncs it.
    fn write(&self, st: &mut State, half: usize, generation: u64, buf: &[u8]) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let h = &mut st.halves[half];
        let made = h.file.is_none();
        let end = h.pos.max(fmt::JOURNAL_HEADER_LEN as u64) + buf.len() as u64;
        h.allocate(
            &self.fs,
            &self.dir,
            FILE_NAMES[half],
            generation,
            end,
            self.capacity,
        )?;
        if made {
            st.next_generation += 1;
        }
        st.halves[half].append(buf)
    }

    /// The file in use is full: its checkpoint starts, and rounds go to the other file,
    /// once that one's checkpoint (started at the last switch) has ended.
    fn switch(&self, st: &mut State) {
        self.finish_checkpoint(st);
        if st.off {
            return;
        }
        let cur = st.current;
        let h = &mut st.halves[cur];
        if h.file.is_some() {
            let Some(generation) = take_generation(st) else {
                tracing::error!(
                    "the journal ran out of generations: syncing each topic's file from now on"
                );
                st.off = true;
                return;
            };
            let h = &mut st.halves[cur];
            let file = h.file.take().expect("checked above");
            let segments: Vec<Arc<Segment>> = h.unsynced.drain().map(|(_, s)| s).collect();
            st.running = Some(checkpoint::start(cur, file, segments, generation));
        }
        st.current = 1 - cur;
    }

    /// Waits for the running checkpoint and takes its file back; a failed one turns the
    /// journal off (its entries stay for the next open).
    fn finish_checkpoint(&self, st: &mut State) {
        let Some(r) = st.running.take() else {
            return;
        };
        let (half, generation) = (r.half, r.generation);
        match r.finish() {
            Some(done) if done.ok => st.halves[half].emptied(done.file, generation),
            _ => {
                tracing::error!(
                    "a checkpoint of the journal failed: syncing each topic's file from now on"
                );
                st.off = true;
            }
        }
    }

    /// At close, once every topic's file was synced (`synced_all`): syncs what the
    /// journal alone made durable, empties both files and turns the journal off. If a
    /// topic failed to sync, the journal keeps its entries for the next open.
    pub(crate) fn close(&self, synced_all: bool) {
        let mut st = self.lock();
        self.finish_checkpoint(&mut st);
        if synced_all && !st.off {
            for i in 0..2 {
                let segments: Vec<Arc<Segment>> =
                    st.halves[i].unsynced.drain().map(|(_, s)| s).collect();
                let Some(generation) = take_generation(&mut st) else {
                    break;
                };
                let emptied = checkpoint::sync_all(&segments)
                    && st.halves[i]
                        .file
                        .as_ref()
                        .is_none_or(|f| half::empty(f, generation).is_ok());
                if !emptied {
                    tracing::error!(
                        "emptying the journal at close failed: the next open copies it back"
                    );
                    break;
                }
            }
        }
        st.off = true;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The next generation for a header (`None`: past `GENERATION_MAX`).
fn take_generation(st: &mut State) -> Option<u64> {
    let g = st.next_generation;
    (g <= GENERATION_MAX).then(|| {
        st.next_generation += 1;
        g
    })
}

/// The bytes `j`'s entry takes in the journal.
fn entry_len(j: &Journaling<'_>) -> usize {
    fmt::ENTRY_HEAD_LEN + j.topic().len().min(fmt::NAME_MAX) + j.len()
}

/// Adds `j`'s entry to the round.
fn add_entry(buf: &mut Vec<u8>, generation: u64, j: &Journaling<'_>) -> Result<()> {
    let target = Target {
        topic: j.topic(),
        base: j.base(),
        segment_header_crc: j.header_crc()?,
        position: j.from(),
    };
    fmt::append_entry(buf, generation, target, j.len(), |data| j.read_into(data))
}
