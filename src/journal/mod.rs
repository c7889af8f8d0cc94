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
//! - The segment files are synced later, by a checkpoint: when the journal is full, and
//!   at close. Only then is the journal emptied (a new generation in its header).
//! - After a crash, open copies every entry of the journal's generation back into its
//!   segment file before any log is opened (`replay.rs`), syncs those files, then empties
//!   the journal.
//!
//! Rules:
//! - A round of one segment syncs that file (one sync either way, and no checkpoint due).
//! - A segment with more than `ENTRY_DATA_MAX` to make durable syncs its file: big
//!   writes are at the disk's speed already, and copying them twice would halve it.
//! - If the journal fails, the round syncs each file instead and the journal stays off.
//!   Its entries stay for the next open.
//!
//! Files, by role:
//! - `mod.rs`: `Journal`, a round, the checkpoint.
//! - `replay.rs`: copying the entries back at open.
//!
//! **Invariant:** the journal is emptied only after every segment it made durable was
//! synced itself.

mod replay;

pub(crate) use replay::replay;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::Result;
use crate::format::journal::{self as fmt, JOURNAL_HEADER_LEN, Target};
use crate::io::{DataFile, Fs};
use crate::log::segment::{Journaling, Segment};

/// The journal file's name in the data directory.
pub(crate) const JOURNAL_FILE: &str = "journal.wal";
/// The journal's size: a checkpoint when it is full (at 100 MB/s, every 0.6 s).
const JOURNAL_BYTES: u64 = 64 << 20;
/// The most bytes of one segment a round copies; more, and its file is synced instead.
const ENTRY_DATA_MAX: usize = 1 << 20;
/// Zeros written ahead of the entries at a time, so that a round's sync need not
/// change the file's size (a metadata update per sync).
const ZEROS_AHEAD: u64 = 1 << 20;

/// The shared journal of one data directory (`Sync=Always` only).
pub(crate) struct Journal {
    fs: Fs,
    dir: PathBuf,
    /// When it is full and checkpointed (`JOURNAL_BYTES` but in tests).
    capacity: u64,
    state: Mutex<State>,
}

struct State {
    /// Made by the first round that needs it.
    file: Option<DataFile>,
    generation: u64,
    /// Where the next round's entries go.
    pos: u64,
    /// How far the file holds zeros or entries.
    allocated: u64,
    /// Segments the journal made durable whose files may not be synced yet (by address).
    unsynced: HashMap<usize, Arc<Segment>>,
    /// Off after a failure or the close: rounds sync each file.
    off: bool,
    /// The round's entries (kept: no allocation per round).
    buf: Vec<u8>,
}

impl Journal {
    /// The journal of `dir`; `generation` is the one its file's header holds (`replay`),
    /// `None` if it has no file yet.
    pub(crate) fn new(fs: &Fs, dir: &Path, generation: Option<u64>) -> Journal {
        let state = State {
            file: None,
            generation: generation.unwrap_or(1),
            pos: JOURNAL_HEADER_LEN as u64,
            allocated: 0,
            unsynced: HashMap::new(),
            off: false,
            buf: Vec::new(),
        };
        Journal {
            fs: fs.clone(),
            dir: dir.to_path_buf(),
            capacity: fs.journal_bytes().unwrap_or(JOURNAL_BYTES),
            state: Mutex::new(state),
        }
    }

    /// Makes what was written to `segments` durable: through one journal write and sync
    /// when there are several, else by syncing each. A failure lands in the segment (its
    /// topic stops, `Segment::poisoned`), as with `Segment::sync`.
    pub(crate) fn sync_round(&self, segments: &[Arc<Segment>]) {
        let mut st = self.lock();
        if segments.len() < 2 || st.off {
            drop(st);
            for seg in segments {
                let _ = seg.sync();
            }
            return;
        }
        let room = self.capacity.saturating_sub(st.pos);
        let wanted: u64 = segments.iter().map(|s| s.pending_bytes()).sum();
        if wanted > room {
            self.checkpoint(&mut st);
        }
        let mut taken = Vec::with_capacity(segments.len());
        let mut direct = Vec::new();
        let mut buf = std::mem::take(&mut st.buf);
        buf.clear();
        for seg in segments {
            let Ok(Some(j)) = seg.journaling() else {
                continue;
            };
            if j.len() > ENTRY_DATA_MAX || add_entry(&mut buf, st.generation, &j).is_err() {
                direct.push(j);
            } else {
                taken.push((seg, j));
            }
        }
        let written = self.write(&mut st, &buf);
        st.buf = buf;
        for j in direct {
            let _ = j.sync_instead();
        }
        match written {
            Ok(()) => {
                for (seg, j) in taken {
                    st.unsynced
                        .entry(Arc::as_ptr(seg) as usize)
                        .or_insert_with(|| seg.clone());
                    j.durable();
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "the journal failed: syncing each topic's file from now on");
                st.off = true;
                for (_, j) in taken {
                    let _ = j.sync_instead();
                }
            }
        }
    }

    /// At close, once every topic's file was synced (`synced_all`): syncs what the
    /// journal alone made durable, empties the journal and turns it off. If a topic
    /// failed to sync, the journal keeps its entries for the next open.
    pub(crate) fn close(&self, synced_all: bool) {
        let mut st = self.lock();
        if synced_all && !st.off {
            self.checkpoint(&mut st);
        }
        st.off = true;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes `buf` at the journal's position and syncs it.
    fn write(&self, st: &mut State, buf: &[u8]) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let end = st.pos + buf.len() as u64;
        self.allocate(st, end)?;
        let file = st.file.as_ref().expect("allocated");
        file.write_all_at(buf, st.pos)?;
        file.sync_data()?;
        st.pos = end;
        Ok(())
    }

    /// Makes the file (header and first zeros, synced with its directory) if there is
    /// none, and writes zeros ahead until it holds `end`.
    fn allocate(&self, st: &mut State, end: u64) -> Result<()> {
        if st.file.is_none() {
            let path = self.dir.join(JOURNAL_FILE);
            let file = self.fs.open_or_create(&path)?;
            file.write_all_at(&fmt::encode_header(st.generation), 0)?;
            let first = ZEROS_AHEAD.min(self.capacity);
            write_zeros(&file, JOURNAL_HEADER_LEN as u64, first)?;
            file.sync_data()?;
            self.fs.sync_dir(&self.dir)?;
            st.allocated = first.max(file.len()?);
            st.file = Some(file);
        }
        if end > st.allocated {
            let to = (end + ZEROS_AHEAD).min(self.capacity).max(end);
            let file = st.file.as_ref().expect("made above");
            write_zeros(file, st.allocated, to)?;
            st.allocated = to;
        }
        Ok(())
    }

    /// Syncs every segment the journal made durable, then empties the journal. A segment
    /// whose sync fails keeps the journal as it is (its topic stops; the next open copies
    /// the entries back), and the journal turns off.
    fn checkpoint(&self, st: &mut State) {
        let segments: Vec<Arc<Segment>> = st.unsynced.drain().map(|(_, s)| s).collect();
        if !sync_all(&segments) {
            tracing::error!(
                "a checkpoint of the journal failed: syncing each topic's file from now on"
            );
            st.off = true;
            return;
        }
        let Some(file) = st.file.as_ref() else {
            return;
        };
        let next = st.generation + 1;
        let emptied = file
            .write_all_at(&fmt::encode_header(next), 0)
            .and_then(|()| file.sync_data());
        match emptied {
            Ok(()) => {
                st.generation = next;
                st.pos = JOURNAL_HEADER_LEN as u64;
            }
            Err(e) => {
                tracing::error!(error = %e, "emptying the journal failed: syncing each topic's file from now on");
                st.off = true;
            }
        }
    }
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

/// Syncs `segments` (several at once when there are many: each sync waits on the disk);
/// whether all succeeded.
fn sync_all(segments: &[Arc<Segment>]) -> bool {
    const THREADS: usize = 8;
    if segments.len() < 2 * THREADS {
        return segments.iter().all(|s| s.sync().is_ok());
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                use std::sync::atomic::Ordering::Relaxed;
                while let Some(s) = segments.get(next.fetch_add(1, Relaxed)) {
                    if s.sync().is_err() {
                        failed.store(true, Relaxed);
                    }
                }
            });
        }
    });
    !failed.into_inner()
}

/// Writes zeros over `[from, to)` of `file` (not synced).
fn write_zeros(file: &DataFile, from: u64, to: u64) -> Result<()> {
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZEROS.len() as u64) as usize;
        file.write_all_at(&ZEROS[..n], at)?;
        at += n as u64;
    }
    Ok(())
}
