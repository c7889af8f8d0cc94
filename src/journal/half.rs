//! One of the journal's two files: made on first use, written round by round, emptied by
//! a checkpoint (a new generation in its header).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::error::Result;
use crate::format::journal::{self as fmt, JOURNAL_HEADER_LEN};
use crate::io::{DataFile, Fs};
use crate::log::segment::Segment;

/// Zeros written ahead of the entries at a time, so that a round's sync need not change
/// the file's size (a metadata update per sync).
const ZEROS_AHEAD: u64 = 1 << 20;

/// The journal files' names in the data directory.
pub(crate) const FILE_NAMES: [&str; 2] = ["journal.0.wal", "journal.1.wal"];

/// One journal file and what its entries made durable.
#[derive(Default)]
pub(super) struct Half {
    /// `None` until first used, and while a checkpoint has it.
    pub(super) file: Option<DataFile>,
    pub(super) generation: u64,
    /// Where the next round's entries go.
    pub(super) pos: u64,
    /// How far the file holds zeros or entries.
    allocated: u64,
    /// Segments its entries made durable whose files may not be synced yet (by address).
    pub(super) unsynced: HashMap<usize, Arc<Segment>>,
}

impl Half {
    /// Room left before `capacity`.
    pub(super) fn room(&self, capacity: u64) -> u64 {
        capacity.saturating_sub(self.pos.max(JOURNAL_HEADER_LEN as u64))
    }

    /// Makes the file `name` in `dir` if it has none (header of `generation` and the
    /// first zeros, synced with the directory), with `end` bytes of room.
    pub(super) fn allocate(
        &mut self,
        fs: &Fs,
        dir: &Path,
        name: &str,
        generation: u64,
        end: u64,
        capacity: u64,
    ) -> Result<&DataFile> {
        if self.file.is_none() {
            let file = fs.open_or_create(&dir.join(name))?;
            file.write_all_at(&fmt::encode_header(generation), 0)?;
            let first = ZEROS_AHEAD.min(capacity);
            write_zeros(&file, JOURNAL_HEADER_LEN as u64, first)?;
            file.sync_data()?;
            fs.sync_dir(dir)?;
            self.allocated = first.max(file.len()?);
            self.generation = generation;
            self.pos = JOURNAL_HEADER_LEN as u64;
            self.file = Some(file);
        }
        let file = self.file.as_ref().expect("made above");
        if end > self.allocated {
            let to = (end + ZEROS_AHEAD).min(capacity).max(end);
            write_zeros(file, self.allocated, to)?;
            self.allocated = to;
        }
        Ok(file)
    }

    /// Writes a round's entries at its position and syncs them.
    pub(super) fn append(&mut self, buf: &[u8]) -> Result<()> {
        let file = self.file.as_ref().expect("allocated");
        file.write_all_at(buf, self.pos)?;
        file.sync_data()?;
        self.pos += buf.len() as u64;
        Ok(())
    }

    /// A checkpoint emptied `file` (its header says `generation` now).
    pub(super) fn emptied(&mut self, file: DataFile, generation: u64) {
        self.file = Some(file);
        self.generation = generation;
        self.pos = JOURNAL_HEADER_LEN as u64;
    }
}

/// Empties `file`: a header of `generation` (after every segment its entries made
/// durable was synced).
pub(super) fn empty(file: &DataFile, generation: u64) -> Result<()> {
    file.write_all_at(&fmt::encode_header(generation), 0)?;
    file.sync_data()
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
