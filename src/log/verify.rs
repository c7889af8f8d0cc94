//! Verifying a log: every record of every segment read back and checked, and every index
//! entry checked against the record it points at (`spool verify`).
//!
//! **Invariants:**
//! - Read-only: files are opened and read, never written, truncated or rebuilt.
//! - Memory is bounded: one read chunk (grown only to a record the limit allows), and
//!   one index file at a time, read only if it is no longer than `INDEX_BYTES_MAX`.
//! - Damage is reported, never repaired: the file, the byte position, what is wrong.
//!   A segment's scan stops at its first undecodable frame (nothing after it can be
//!   found without guessing where the next frame starts).

use bytes::Bytes;

use super::*;
use crate::format::record::{FRAME_HEADER_LEN, Frame};
use crate::format::segment::{decode_entries, decode_header, decode_sealed_index};

/// Bytes read at a time.
const CHUNK: usize = 1 << 20;
/// A larger index file is reported, not read (a 64 MiB segment's index is 512 KiB).
const INDEX_BYTES_MAX: u64 = 64 << 20;

/// One problem: where it is and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    pub file: PathBuf,
    /// Byte position in `file`.
    pub position: u64,
    pub what: String,
}

/// What verifying one log found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogCheck {
    pub segments: usize,
    pub records: u64,
    /// The offset after the last whole record read (the log end, when nothing is damaged).
    pub next: u64,
    /// The first offset of the first segment.
    pub base: u64,
    pub problems: Vec<Damage>,
}

/// The segments to verify: an open log's (`TopicLog::verify_plan`) or a closed
/// directory's (`plan_closed`).
#[derive(Debug)]
pub struct VerifyPlan {
    fs: Fs,
    max_body: usize,
    segs: Vec<Planned>,
    /// Zeros after the last segment's records are not damage: a closed directory's active
    /// segment may be written ahead with zeros (`LogConfig::preallocate`).
    zeros_after_last: bool,
}

#[derive(Debug)]
struct Planned {
    base: u64,
    path: PathBuf,
    index_path: PathBuf,
    /// The end readers see (an open log), or the file's length (a closed one).
    end: u64,
    /// Its index must end with a footer.
    sealed: bool,
    /// Held while the plan lives: a held segment is never recycled by retention.
    _seg: Option<Arc<Segment>>,
}

impl TopicLog {
    /// The segments of this log as readers see them now: call it under the writer's
    /// lock and run the plan after releasing it.
    pub fn verify_plan(&self) -> VerifyPlan {
        let segs = read_lock(&self.reader.segments).clone();
        let last = segs.len().saturating_sub(1);
        VerifyPlan {
            fs: self.fs.clone(),
            max_body: self.reader.cfg.max_body,
            zeros_after_last: false,
            segs: segs
                .into_iter()
                .enumerate()
                .map(|(i, s)| Planned {
                    base: s.base,
                    path: s.path.clone(),
                    index_path: s.index_path.clone(),
                    end: s.end(),
                    sealed: i < last && s.is_sealed(),
                    _seg: Some(s),
                })
                .collect(),
        }
    }
}

/// The segment files of a closed log in `dir` (named by 20 digits and `.log`), by base
/// offset. Nothing is opened for writing: a damaged directory is read as it is, before
/// any open's recovery would cut a damaged tail away. The caller holds the lock.
pub fn plan_closed(fs: &Fs, dir: &Path, max_body: usize) -> Result<VerifyPlan> {
    let mut bases: Vec<u64> = fs
        .list_dir(dir)?
        .iter()
        .filter_map(|name| name.strip_suffix(".log"))
        .filter(|stem| stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|stem| stem.parse().ok())
        .collect();
    bases.sort_unstable();
    let mut segs = Vec::with_capacity(bases.len());
    for base in bases {
        let path = dir.join(format!("{base:020}.log"));
        let end = fs.file_stat(&path)?.len;
        segs.push(Planned {
            base,
            index_path: path.with_extension("idx"),
            path,
            end,
            // A closed log's rolled segment may still lack its footer (a kill before the
            // background seal): its index is read as it is found (`index_entries`).
            sealed: false,
            _seg: None,
        });
    }
    Ok(VerifyPlan {
        fs: fs.clone(),
        max_body,
        segs,
        zeros_after_last: true,
    })
}

impl VerifyPlan {
    /// Reads every segment and index of the plan.
    pub fn run(&self) -> LogCheck {
        let mut check = LogCheck {
            segments: self.segs.len(),
            base: self.segs.first().map_or(0, |s| s.base),
            ..LogCheck::default()
        };
        let mut expected: Option<u64> = None;
        let last = self.segs.len().saturating_sub(1);
        for (i, seg) in self.segs.iter().enumerate() {
            if let Some(e) = expected
                && e != seg.base
            {
                check.problems.push(Damage {
                    file: seg.path.clone(),
                    position: 0,
                    what: format!(
                        "segment starts at offset {} where {e} was expected",
                        seg.base
                    ),
                });
            }
            let index = self.index_entries(seg, &mut check.problems);
            let zeros_ok = self.zeros_after_last && i == last;
            let scan = self.scan(seg, zeros_ok, index, &mut check.problems);
            check.records += scan.records;
            check.next = scan.next;
            expected = Some(scan.next);
            // A segment planned unsealed may roll (and be sealed) while a live verify
            // reads it: its footer then covers records past the planned end.
            let footer_wrong = scan.summary.is_some_and(|s| {
                if seg.sealed {
                    s.next != scan.next
                } else {
                    s.next < scan.next
                }
            });
            if let Some(summary) = scan.summary.filter(|_| footer_wrong) {
                check.problems.push(Damage {
                    file: seg.index_path.clone(),
                    position: 0,
                    what: format!(
                        "index footer says the segment ends at offset {}, its records end at {}",
                        summary.next, scan.next
                    ),
                });
            }
        }
        check
    }

    /// The segment's index entries (and a sealed index's summary), or none if the file is
    /// missing (a cache: open rebuilds it). A sealed index that does not decode is damage.
    fn index_entries(
        &self,
        seg: &Planned,
        problems: &mut Vec<Damage>,
    ) -> (Vec<IndexEntry>, Option<SegmentSummary>) {
        let damage = |what: String| Damage {
            file: seg.index_path.clone(),
            position: 0,
            what,
        };
        if self.fs.is_dir(&seg.index_path).is_none() {
            return (Vec::new(), None);
        }
        let bytes = match self
            .fs
            .open(&seg.index_path)
            .and_then(|f| f.read_all(INDEX_BYTES_MAX))
        {
            Ok(Some(b)) => b,
            Ok(None) => {
                problems.push(damage("index file larger than any index can be".into()));
                return (Vec::new(), None);
            }
            Err(e) => {
                problems.push(damage(format!("cannot read it: {e}")));
                return (Vec::new(), None);
            }
        };
        let found = decode_sealed_index(&bytes);
        if seg.sealed || found.is_some() {
            return match found {
                Some((entries, summary)) => (entries, Some(summary)),
                None => {
                    problems.push(damage("sealed index footer or checksum is damaged".into()));
                    (Vec::new(), None)
                }
            };
        }
        // The active segment's index is appended as it grows, never synced: whole
        // entries only.
        let whole = bytes.len() - bytes.len() % INDEX_ENTRY_LEN;
        (decode_entries(&bytes[..whole]), None)
    }
}

/// What scanning one segment's records found.
struct Scan {
    records: u64,
    next: u64,
    summary: Option<SegmentSummary>,
}

impl VerifyPlan {
    /// Reads the records of `seg` up to `end` in chunks, checking each frame, the dense
    /// offsets from the base, and that every index entry points at a record start with
    /// its offset and timestamp.
    fn scan(
        &self,
        seg: &Planned,
        zeros_ok: bool,
        (entries, summary): (Vec<IndexEntry>, Option<SegmentSummary>),
        problems: &mut Vec<Damage>,
    ) -> Scan {
        let mut out = Scan {
            records: 0,
            next: seg.base,
            summary,
        };
        let at = |position: u64, what: String| Damage {
            file: seg.path.clone(),
            position,
            what,
        };
        let file = match self.fs.open(&seg.path) {
            Ok(f) => f,
            Err(e) => {
                problems.push(at(0, format!("cannot open it: {e}")));
                return out;
            }
        };
        if let Err(what) = self.check_header(&file, seg.base) {
            problems.push(at(0, what));
            return out;
        }
        let end = seg.end;
        let mut index = Entries::new(entries, seg);
        let mut pos = SEGMENT_HEADER_LEN as u64;
        let mut chunk = Chunk::default();
        let mut stopped = false;
        while pos < end {
            stopped = true;
            let frame = match chunk.frame_at(&file, pos, end, self.max_body) {
                Ok(f) => f,
                Err(e) => {
                    problems.push(at(pos, format!("cannot read it: {e}")));
                    break;
                }
            };
            let (record, len) = match frame {
                Frame::Complete { record, len } => (record, len),
                _ if zeros_ok && records_end_at(&file, pos, end) => break,
                Frame::Incomplete { needed } => {
                    problems.push(at(
                        pos,
                        format!("record of {needed} bytes runs past the segment's end {end}"),
                    ));
                    break;
                }
                Frame::Corrupt(why) => {
                    problems.push(at(pos, format!("damaged record: {why}")));
                    break;
                }
            };
            if record.offset != out.next {
                problems.push(at(
                    pos,
                    format!(
                        "record has offset {} where {} was expected",
                        record.offset, out.next
                    ),
                ));
                break;
            }
            index.check_record(pos, &record, problems);
            out.records += 1;
            out.next += 1;
            pos += len as u64;
            stopped = false;
        }
        // After damage, the entries past it say nothing more.
        index.check_rest(if stopped { 0 } else { end }, problems);
        out
    }

    fn check_header(&self, file: &DataFile, base: u64) -> std::result::Result<(), String> {
        let mut h = [0u8; SEGMENT_HEADER_LEN];
        let n = file
            .read_at(&mut h, 0)
            .map_err(|e| format!("cannot read it: {e}"))?;
        let header = decode_header(&h[..n]).map_err(str::to_owned)?;
        if header.base != base {
            return Err(format!(
                "segment header says base offset {} but the file is named {base}",
                header.base
            ));
        }
        Ok(())
    }
}

/// Whether `file` holds only zeros in `[from, to)` (written ahead, never a record);
/// a read error counts as not (the frame there is then reported).
/// Whether the last segment's records end at `pos`: zeros follow (space preallocated after
/// them), or a zeroed frame header (the one the writer puts ahead of each write, over a
/// recycled file's old records). Open reads the log the same way.
fn records_end_at(file: &DataFile, pos: u64, end: u64) -> bool {
    zeros(file, pos, end) || zeros(file, pos, (pos + FRAME_HEADER_LEN as u64).min(end))
}

fn zeros(file: &DataFile, from: u64, to: u64) -> bool {
    let mut buf = vec![0u8; CHUNK];
    let mut at = from;
    while at < to {
        let want = usize::try_from(to - at).unwrap_or(CHUNK).min(CHUNK);
        match file.read_at(&mut buf[..want], at) {
            Ok(n) if n > 0 && buf[..n].iter().all(|&b| b == 0) => at += n as u64,
            _ => return false,
        }
    }
    true
}

/// A window of a segment file, read ahead in chunks.
#[derive(Default)]
struct Chunk {
    /// File position of `buf[0]`.
    start: u64,
    buf: Bytes,
}

impl Chunk {
    /// The frame at `pos`, reading more of the file (at most up to `end`) if the window
    /// does not hold it whole.
    fn frame_at(&mut self, file: &DataFile, pos: u64, end: u64, max_body: usize) -> Result<Frame> {
        loop {
            let inside = pos >= self.start && pos <= self.start + self.buf.len() as u64;
            if inside {
                let at = usize::try_from(pos - self.start).unwrap_or(usize::MAX);
                match record::decode_at(&self.buf, at, max_body) {
                    Frame::Incomplete { needed }
                        if self.start + (self.buf.len() as u64) < end
                            && pos + (needed as u64) <= end =>
                    {
                        self.read(file, pos, end, needed)?;
                    }
                    frame => return Ok(frame),
                }
            } else {
                self.read(file, pos, end, 0)?;
            }
        }
    }

    fn read(&mut self, file: &DataFile, pos: u64, end: u64, needed: usize) -> Result<()> {
        let want = CHUNK.max(needed) as u64;
        let len = usize::try_from(want.min(end - pos)).unwrap_or(CHUNK);
        let mut buf = vec![0u8; len];
        let n = file.read_at(&mut buf, pos)?;
        buf.truncate(n);
        if n == 0 {
            return Err(Error::io(
                "reading a segment",
                std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
            ));
        }
        self.start = pos;
        self.buf = Bytes::from(buf);
        Ok(())
    }
}

/// A segment's index entries, matched against its records as the scan passes them.
struct Entries<'a> {
    entries: Vec<IndexEntry>,
    next: usize,
    seg: &'a Planned,
}

impl<'a> Entries<'a> {
    fn new(entries: Vec<IndexEntry>, seg: &'a Planned) -> Self {
        Entries {
            entries,
            next: 0,
            seg,
        }
    }

    fn damage(&self, i: usize, what: String) -> Damage {
        Damage {
            file: self.seg.index_path.clone(),
            position: (i * INDEX_ENTRY_LEN) as u64,
            what,
        }
    }

    /// Entries up to the record at `pos` must point at record starts; the one at `pos`
    /// must name the record's offset and timestamp.
    fn check_record(&mut self, pos: u64, record: &Record, problems: &mut Vec<Damage>) {
        while let Some(e) = self.entries.get(self.next).copied() {
            if e.position > pos {
                return;
            }
            let i = self.next;
            self.next += 1;
            if e.position < pos {
                problems.push(self.damage(
                    i,
                    format!(
                        "index entry points at position {} inside a record",
                        e.position
                    ),
                ));
            } else if e.offset != record.offset || e.timestamp_ms != record.timestamp_ms {
                problems.push(self.damage(
                    i,
                    format!(
                        "index entry says offset {} (ts {}) at position {pos}, the record there is offset {} (ts {})",
                        e.offset, e.timestamp_ms, record.offset, record.timestamp_ms
                    ),
                ));
            }
        }
    }

    /// Entries left after the last record: damage if they point inside the records read.
    /// Past `end` an unsynced index may run ahead of the log (it is cut at the next open).
    fn check_rest(&mut self, end: u64, problems: &mut Vec<Damage>) {
        for i in self.next..self.entries.len() {
            let e = self.entries[i];
            if e.position < end {
                problems.push(self.damage(
                    i,
                    format!(
                        "index entry points at position {} where no record starts",
                        e.position
                    ),
                ));
            }
        }
        self.next = self.entries.len();
    }
}
