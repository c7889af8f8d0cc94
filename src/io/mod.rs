//! The I/O seam: the only code that touches the file system. Segment and index files
//! (and, under simulation, the catalog file) go through a small [`Backend`] trait with
//! the real implementation ([`RealFs`]) and a simulated one ([`sim::SimFs`]) that keeps a
//! live and a durable image and can cut the power at any operation.
//!
//! **Invariant:** knows bytes and paths, nothing about records, topics or groups. A failed
//! sync is returned, never ignored: callers poison the handle that saw it. It also leaves
//! the file's name in its directory's `UNSYNCED_FILE`, for the next open there to rewrite
//! the file before trusting it (`Fs::rewrite_unsynced`, see `DataFile::sync_data`).
//!
//! Files, by role:
//! - `mod.rs`: the `Backend` and `FileIo` traits, the real file system, `DataFile`, the lock.
//! - `sim.rs`: the simulated file system of the power-loss tests.
//! - `open_files.rs`: the bound on descriptors of files kept open, and its sweep.
//! - `private.rs`: owner-only files on the real file system (the admin endpoint's socket,
//!   its pointer and private directory).
//! - `sync_stats.rs`: the process's histogram of sync latencies (for metrics).

pub mod open_files;
pub mod private;
pub mod sim;
pub mod sync_stats;

pub use open_files::{Holder, OPEN_FILES_MAX, OpenFiles, Seen, Token};

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, IoContext, Result};

/// The most buffers one `pwritev` takes (Linux's `IOV_MAX`).
pub const IOV_MAX: usize = 1024;

/// One open file: positional reads and writes, sync, resize.
pub trait FileIo: Send + Sync + std::fmt::Debug {
    fn len(&self) -> std::io::Result<u64>;
    /// Reads into `buf` at `pos`; returns fewer bytes only at the end of the file.
    fn read_at(&self, buf: &mut [u8], pos: u64) -> std::io::Result<usize>;
    fn write_all_at(&self, buf: &[u8], pos: u64) -> std::io::Result<()>;
    /// Writes `bufs` one after the other from `pos`, as `write_all_at` would write their
    /// concatenation: a cut-short write leaves a prefix of it. This default copies them
    /// into one buffer (the simulated file system then models them as one write).
    fn write_all_vectored_at(&self, bufs: &[&[u8]], pos: u64) -> std::io::Result<()> {
        self.write_all_at(&bufs.concat(), pos)
    }
    /// Makes the file's data durable (`fdatasync`).
    fn sync_data(&self) -> std::io::Result<()>;
    /// Makes the file's data and metadata durable (`fsync`: its length too, even where
    /// only a truncation to the length it already has marked the inode changed).
    fn sync_all(&self) -> std::io::Result<()> {
        self.sync_data()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()>;
}

/// The file-system operations spool uses.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Creates a file that must not exist yet.
    fn create_new(&self, path: &Path) -> std::io::Result<Arc<dyn FileIo>>;
    fn open(&self, path: &Path) -> std::io::Result<Arc<dyn FileIo>>;
    fn open_or_create(&self, path: &Path) -> std::io::Result<Arc<dyn FileIo>>;
    /// Deleting a missing file is not an error.
    fn remove_file(&self, path: &Path) -> std::io::Result<()>;
    /// A file's length and identity, without opening it.
    fn file_stat(&self, path: &Path) -> std::io::Result<FileStat>;
    /// Renames a file (atomically replacing `to`); durable after `sync_dir`.
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()>;
    fn list_dir(&self, dir: &Path) -> std::io::Result<Vec<String>>;
    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()>;
    /// Makes the directory's entries (creations, deletions) durable.
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()>;
    /// `Some(false)`: the path exists and is not a directory.
    fn is_dir(&self, path: &Path) -> Option<bool>;
    /// Whether this is the real file system (which gets the `LOCK` file and redb's own
    /// file handling for the catalog).
    fn is_real(&self) -> bool;
    /// Makes `to` a second name of the file `from` (a hard link); durable after `sync_dir`
    /// of `to`'s directory. A backend without hard links (or `to` on another file system)
    /// fails, and callers copy instead.
    fn hard_link(&self, _from: &Path, _to: &Path) -> std::io::Result<()> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "hard links are not supported here",
        ))
    }
    /// How many names the file has (hard links): a file with more than one is shared
    /// with another directory (a snapshot) and must never be written again.
    fn link_count(&self, _path: &Path) -> std::io::Result<u64> {
        Ok(1)
    }
    /// The path with every link and `..` resolved, if it exists.
    fn canonicalize(&self, path: &Path) -> std::io::Result<PathBuf> {
        match self.is_dir(path) {
            Some(_) => Ok(path.to_owned()),
            None => Err(std::io::ErrorKind::NotFound.into()),
        }
    }
    /// A token that is the same only while what was written under `dir` is still all in
    /// the page cache or on disk: the same boot of the machine and the same directory (not
    /// a copy or a restored image). `None` when that cannot be told: then recovery never
    /// relies on it.
    fn boot_mark(&self, dir: &Path) -> Option<String>;
    /// Removes the empty directory `dir` (a missing one is not an error); durable after
    /// `sync_dir` of its parent.
    fn remove_dir(&self, dir: &Path) -> std::io::Result<()>;
    /// A bound of its own on files kept open (tests: a small one), instead of
    /// `OPEN_FILES_MAX`.
    fn open_files_max(&self) -> Option<usize> {
        None
    }
    /// A size of its own for the shared journal (tests: a small one, so that checkpoints
    /// happen), instead of the journal's default.
    fn journal_bytes(&self) -> Option<u64> {
        None
    }
}

/// What `Backend::file_stat` tells of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStat {
    pub len: u64,
    /// Changes when the file is made anew or written (inode number and modification time
    /// on a real file system): the same path and length with another identity is another
    /// file, or the same one changed.
    pub identity: [u64; 2],
}

/// A shared handle on a [`Backend`], with errors that name the file, and the bound on
/// the descriptors its files kept open may hold ([`OpenFiles`]).
#[derive(Clone, Debug)]
pub struct Fs {
    backend: Arc<dyn Backend>,
    files: Arc<OpenFiles>,
}

impl Fs {
    /// The real file system, under the process's one bound on open files.
    pub fn real() -> Fs {
        Fs {
            backend: Arc::new(RealFs),
            files: OpenFiles::process(),
        }
    }

    /// `backend` under a bound of its own (`Backend::open_files_max`, else
    /// `OPEN_FILES_MAX`).
    pub fn new(backend: Arc<dyn Backend>) -> Fs {
        let max = backend.open_files_max().unwrap_or(OPEN_FILES_MAX);
        Fs {
            backend,
            files: OpenFiles::new(max),
        }
    }

    /// The bound on the descriptors files kept open hold (segments register there).
    /// The backend's own size for the shared journal, if it has one.
    pub fn journal_bytes(&self) -> Option<u64> {
        self.backend.journal_bytes()
    }

    pub fn open_files(&self) -> &Arc<OpenFiles> {
        &self.files
    }

    pub fn is_real(&self) -> bool {
        self.backend.is_real()
    }

    pub fn create_new(&self, path: &Path) -> Result<DataFile> {
        let io = self
            .backend
            .create_new(path)
            .ctx(|| format!("creating {}", path.display()))?;
        Ok(DataFile::new(io, path, self))
    }

    pub fn open(&self, path: &Path) -> Result<DataFile> {
        let io = self
            .backend
            .open(path)
            .ctx(|| format!("opening {}", path.display()))?;
        Ok(DataFile::new(io, path, self))
    }

    pub fn open_or_create(&self, path: &Path) -> Result<DataFile> {
        let io = self
            .backend
            .open_or_create(path)
            .ctx(|| format!("opening {}", path.display()))?;
        Ok(DataFile::new(io, path, self))
    }

    /// The raw handle, for the catalog's storage adapter.
    pub fn open_or_create_raw(&self, path: &Path) -> Result<Arc<dyn FileIo>> {
        self.backend
            .open_or_create(path)
            .ctx(|| format!("opening {}", path.display()))
    }

    pub fn remove_file(&self, path: &Path) -> Result<()> {
        self.backend
            .remove_file(path)
            .ctx(|| format!("deleting {}", path.display()))
    }

    pub fn file_stat(&self, path: &Path) -> Result<FileStat> {
        self.backend
            .file_stat(path)
            .ctx(|| format!("reading the size of {}", path.display()))
    }

    pub fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        self.backend
            .rename(from, to)
            .ctx(|| format!("renaming {} to {}", from.display(), to.display()))
    }

    /// File names in a directory.
    pub fn list_dir(&self, dir: &Path) -> Result<Vec<String>> {
        self.backend
            .list_dir(dir)
            .ctx(|| format!("listing {}", dir.display()))
    }

    /// Creates `dir` (and parents) and makes its entry in the parent durable.
    pub fn create_dir_all(&self, dir: &Path) -> Result<()> {
        let existed = self.backend.is_dir(dir) == Some(true);
        self.backend
            .create_dir_all(dir)
            .ctx(|| format!("creating directory {}", dir.display()))?;
        if !existed && let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            self.sync_dir(parent)?;
        }
        Ok(())
    }

    /// Makes `to` a second name of the file `from` (see `Backend::hard_link`).
    pub fn hard_link(&self, from: &Path, to: &Path) -> Result<()> {
        self.backend
            .hard_link(from, to)
            .ctx(|| format!("linking {} to {}", to.display(), from.display()))
    }

    /// How many names (hard links) the file has.
    pub fn link_count(&self, path: &Path) -> Result<u64> {
        self.backend
            .link_count(path)
            .ctx(|| format!("reading the links of {}", path.display()))
    }

    /// `path` made absolute, with links and `..` resolved as far as it exists: the
    /// deepest existing ancestor resolved, the rest appended. `None` when that cannot be
    /// told (a `..` after a missing directory).
    pub fn resolve(&self, path: &Path) -> Option<PathBuf> {
        let mut rest = Vec::new();
        let mut at = path;
        loop {
            let probe = if at.as_os_str().is_empty() {
                Path::new(".")
            } else {
                at
            };
            if let Ok(found) = self.backend.canonicalize(probe) {
                return Some(rest.iter().rev().fold(found, |p: PathBuf, n| p.join(n)));
            }
            rest.push(at.file_name()?.to_owned());
            at = at.parent()?;
        }
    }

    pub fn sync_dir(&self, dir: &Path) -> Result<()> {
        let started = std::time::Instant::now();
        let r = self.backend.sync_dir(dir);
        sync_stats::record(started.elapsed());
        r.ctx(|| format!("syncing directory {}", dir.display()))
    }

    /// Removes the empty directory `dir` (a missing one is not an error).
    pub fn remove_dir(&self, dir: &Path) -> Result<()> {
        self.backend
            .remove_dir(dir)
            .ctx(|| format!("removing directory {}", dir.display()))
    }

    pub fn is_dir(&self, path: &Path) -> Option<bool> {
        self.backend.is_dir(path)
    }

    pub fn boot_mark(&self, dir: &Path) -> Option<String> {
        self.backend.boot_mark(dir)
    }

    /// Writes every file `UNSYNCED_FILE` in `dir` names (a sync of it failed, see
    /// `DataFile::sync_data`) whole again, as it reads now, and syncs it; then deletes the
    /// note. Writing the pages dirties them again, so this sync writes them: afterwards
    /// the disk holds what a reader sees. Called before anything in `dir` is read. A name
    /// that is no plain file name of `dir`, or whose file is gone, is skipped.
    pub fn rewrite_unsynced(&self, dir: &Path) -> Result<()> {
        let note = dir.join(UNSYNCED_FILE);
        if self.is_dir(&note).is_none() {
            return Ok(());
        }
        // A name per line, and only names of this directory's files.
        let text = self
            .open(&note)?
            .read_all(UNSYNCED_MAX_BYTES)?
            .ok_or_else(|| {
                Error::corrupt(&note, format!("longer than {UNSYNCED_MAX_BYTES} bytes"))
            })?;
        // Lossy: a damaged line must not hide the others.
        let text = String::from_utf8_lossy(&text);
        let mut names: Vec<&str> = text
            .lines()
            .filter(|n| !n.is_empty() && *n != "." && *n != ".." && !n.contains('/'))
            .collect();
        names.sort_unstable();
        names.dedup();
        let mut buf = vec![0u8; REWRITE_CHUNK];
        for name in names {
            let path = dir.join(name);
            if self.is_dir(&path) != Some(false) {
                continue;
            }
            tracing::warn!(file = %path.display(), "a sync of this file failed: writing it again");
            let f = self.open(&path)?;
            let len = f.len()?;
            let mut at = 0;
            while at < len {
                let n = f.read_at(&mut buf, at)?;
                if n == 0 {
                    break;
                }
                f.write_all_at(&buf[..n], at)?;
                at += n as u64;
            }
            // The failed sync may have dropped a truncation too: the length again, synced
            // with the inode.
            f.set_len(len)?;
            f.io.sync_all()
                .ctx(|| format!("syncing {}", path.display()))?;
        }
        self.remove_file(&note)
    }
}

/// In a directory: the names of its files whose sync failed, one per line, written by
/// `DataFile::sync_data` and consumed by `Fs::rewrite_unsynced`.
pub const UNSYNCED_FILE: &str = "unsynced";

/// Far more than the note of any directory's files takes (see `Fs::rewrite_unsynced`).
const UNSYNCED_MAX_BYTES: u64 = 16 << 20;

/// What `Fs::rewrite_unsynced` reads and writes back at a time.
const REWRITE_CHUNK: usize = 1 << 20;

/// A segment or index file with errors that name it.
#[derive(Debug)]
pub struct DataFile {
    io: Arc<dyn FileIo>,
    path: PathBuf,
    /// Where its failed syncs are noted (`UNSYNCED_FILE`).
    fs: Fs,
}

impl DataFile {
    fn new(io: Arc<dyn FileIo>, path: &Path, fs: &Fs) -> Self {
        DataFile {
            io,
            path: path.to_owned(),
            fs: fs.clone(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The same open file under the name it was renamed to.
    pub fn renamed(self, path: &Path) -> DataFile {
        DataFile::new(self.io, path, &self.fs)
    }

    pub fn len(&self) -> Result<u64> {
        self.io
            .len()
            .ctx(|| format!("reading the size of {}", self.path.display()))
    }

    /// Reads `buf.len()` bytes at `position`, or fewer if the file ends first.
    pub fn read_at(&self, buf: &mut [u8], position: u64) -> Result<usize> {
        self.io
            .read_at(buf, position)
            .ctx(|| format!("reading {}", self.path.display()))
    }

    pub fn write_all_at(&self, buf: &[u8], position: u64) -> Result<()> {
        self.io
            .write_all_at(buf, position)
            .ctx(|| format!("writing {}", self.path.display()))
    }

    /// Writes `bufs` one after the other from `position` (see `FileIo::write_all_vectored_at`).
    pub fn write_all_vectored_at(&self, bufs: &[&[u8]], position: u64) -> Result<()> {
        self.io
            .write_all_vectored_at(bufs, position)
            .ctx(|| format!("writing {}", self.path.display()))
    }

    /// Makes the file's data durable. When that fails, Linux may have marked the pages it
    /// could not write clean ("fsyncgate"): they stay readable, no later sync writes them,
    /// and a reopen in the same boot would read records the disk does not hold and vouch
    /// for them with its own syncs. So the file's name is noted in `UNSYNCED_FILE`, for
    /// the next open of its directory to write the whole file again (`rewrite_unsynced`).
    /// Not synced: only a reopen in the same boot needs it, and the page cache keeps it
    /// that long; after a power cut the disk is all there is to read.
    pub fn sync_data(&self) -> Result<()> {
        let started = std::time::Instant::now();
        let r = self.io.sync_data();
        sync_stats::record(started.elapsed());
        if r.is_err() {
            self.note_unsynced();
        }
        r.ctx(|| format!("syncing {}", self.path.display()))
    }

    /// Appends this file's name to `UNSYNCED_FILE` in its directory (best effort: logged
    /// if it fails, the sync's own error is what the caller gets).
    fn note_unsynced(&self) {
        // One note at a time, so two failing files never write over each other's line.
        static NOTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = NOTING.lock().unwrap_or_else(|e| e.into_inner());
        let (Some(dir), Some(name)) = (
            self.path.parent(),
            self.path.file_name().and_then(|n| n.to_str()),
        ) else {
            return;
        };
        let note = dir.join(UNSYNCED_FILE);
        let noted = self.fs.open_or_create(&note).and_then(|f| {
            let end = f.len()?;
            f.write_all_at(format!("{name}\n").as_bytes(), end)
        });
        if let Err(e) = noted {
            tracing::error!(
                file = %self.path.display(),
                error = %e,
                "a sync failed and could not be noted: reboot before reopening this data directory"
            );
        }
    }

    pub fn set_len(&self, len: u64) -> Result<()> {
        self.io
            .set_len(len)
            .ctx(|| format!("truncating {}", self.path.display()))
    }

    /// The whole file, or `None` if it is longer than `max` bytes: its length is checked
    /// first, so a damaged (or sparse) file cannot make us allocate whatever it claims.
    pub fn read_all(&self, max: u64) -> Result<Option<Vec<u8>>> {
        let len = self.len()?;
        let Some(len) = usize::try_from(len).ok().filter(|_| len <= max) else {
            return Ok(None);
        };
        let mut buf = vec![0u8; len];
        let n = self.read_at(&mut buf, 0)?;
        buf.truncate(n);
        Ok(Some(buf))
    }
}

/// The real file system.
#[derive(Debug)]
pub struct RealFs;

#[derive(Debug)]
struct RealFile(File);

impl FileIo for RealFile {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn read_at(&self, buf: &mut [u8], pos: u64) -> std::io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match self.0.read_at(&mut buf[done..], pos + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }
    fn write_all_at(&self, buf: &[u8], pos: u64) -> std::io::Result<()> {
        self.0.write_all_at(buf, pos)
    }
    /// `pwritev`, `IOV_MAX` buffers at a time, until every byte is written: the kernel
    /// copies each buffer into the page cache straight from where it lies.
    fn write_all_vectored_at(&self, bufs: &[&[u8]], mut pos: u64) -> std::io::Result<()> {
        use std::io::IoSlice;
        let mut slices: Vec<IoSlice<'_>> = bufs
            .iter()
            .filter(|b| !b.is_empty())
            .map(|b| IoSlice::new(b))
            .collect();
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            let take = rest.len().min(IOV_MAX);
            match rustix::io::pwritev(&self.0, &rest[..take], pos) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    pos += n as u64;
                    // A short write (a signal, or over 2 GiB in one call): the rest next.
                    IoSlice::advance_slices(&mut rest, n);
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.0.sync_data()
    }
    fn sync_all(&self) -> std::io::Result<()> {
        self.0.sync_all()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
}

fn rw() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true).write(true);
    o
}

impl Backend for RealFs {
    fn create_new(&self, path: &Path) -> std::io::Result<Arc<dyn FileIo>> {
        Ok(Arc::new(RealFile(rw().create_new(true).open(path)?)))
    }
    fn open(&self, path: &Path) -> std::io::Result<Arc<dyn FileIo>> {
        Ok(Arc::new(RealFile(rw().open(path)?)))
    }
    fn open_or_create(&self, path: &Path) -> std::io::Result<Arc<dyn FileIo>> {
        Ok(Arc::new(RealFile(
            rw().create(true).truncate(false).open(path)?,
        )))
    }
    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }
    fn file_stat(&self, path: &Path) -> std::io::Result<FileStat> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path)?;
        let mtime = (m.mtime() as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(m.mtime_nsec() as u64);
        Ok(FileStat {
            len: m.len(),
            identity: [m.ino(), mtime],
        })
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        std::fs::rename(from, to)
    }
    fn list_dir(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            // Names spool did not write (non-UTF-8) are not ours: skip them.
            if let Ok(name) = entry?.file_name().into_string() {
                out.push(name);
            }
        }
        Ok(out)
    }
    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        File::open(dir)?.sync_all()
    }
    fn remove_dir(&self, dir: &Path) -> std::io::Result<()> {
        match std::fs::remove_dir(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }
    fn hard_link(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        std::fs::hard_link(from, to)
    }
    fn link_count(&self, path: &Path) -> std::io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        Ok(std::fs::metadata(path)?.nlink())
    }
    fn canonicalize(&self, path: &Path) -> std::io::Result<PathBuf> {
        std::fs::canonicalize(path)
    }
    fn is_dir(&self, path: &Path) -> Option<bool> {
        std::fs::metadata(path).ok().map(|m| m.is_dir())
    }
    fn is_real(&self) -> bool {
        true
    }
    fn boot_mark(&self, dir: &Path) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        // Linux makes a new random id at every boot; elsewhere there is none.
        static BOOT_ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        let boot = BOOT_ID.get_or_init(|| {
            std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        });
        // Device and inode: a copied or restored directory is another directory.
        let m = std::fs::metadata(dir).ok()?;
        Some(format!("{} {} {}", boot.as_deref()?, m.dev(), m.ino()))
    }
}

/// How long opening waits for a lock that another thread's fork may still hold.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

/// An exclusive lock on `<dir>/LOCK`, held for the instance's life (released on drop).
#[derive(Debug)]
pub struct DirLock {
    _file: Option<File>,
}

impl DirLock {
    /// Locks `dir` on the real file system; a simulated one needs no lock.
    pub fn acquire(fs: &Fs, dir: &Path) -> Result<Self> {
        if !fs.is_real() {
            return Ok(DirLock { _file: None });
        }
        let path = dir.join("LOCK");
        let file = rw()
            .create(true)
            .truncate(false)
            .open(&path)
            .ctx(|| format!("opening {}", path.display()))?;
        // A child process forked by another thread holds a copy of a just-released lock's
        // descriptor until it execs (milliseconds): retry briefly before saying Locked.
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(DirLock { _file: Some(file) }),
                Err(std::fs::TryLockError::WouldBlock) => {
                    if std::time::Instant::now() >= deadline {
                        return Err(Error::Locked {
                            path: dir.to_owned(),
                        });
                    }
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(Error::io(format!("locking {}", path.display()), e));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::sim::SimFs;

    /// A vectored write is the write of the buffers' concatenation, over `IOV_MAX` of
    /// them and with empty ones among them, on the real and the simulated file system.
    #[test]
    fn a_vectored_write_writes_the_buffers_one_after_the_other() {
        let pieces: Vec<Vec<u8>> = (0..3 * IOV_MAX + 7)
            .map(|i| vec![(i % 251) as u8; i % 5])
            .collect();
        let bufs: Vec<&[u8]> = pieces.iter().map(|p| &p[..]).collect();
        let whole = bufs.concat();
        let tmp = tempfile::tempdir().expect("tempdir");
        let sim = SimFs::new(1);
        sim.create_dir_all(Path::new("/d")).expect("dir");
        let real = Fs::real();
        let simulated = Fs::new(Arc::new(sim));
        for (fs, path) in [
            (&real, tmp.path().join("f")),
            (&simulated, PathBuf::from("/d/f")),
        ] {
            let f = fs.create_new(&path).expect("create");
            f.write_all_at(b"head", 0).expect("write");
            f.write_all_vectored_at(&bufs, 4).expect("vectored");
            let got = f.read_all(u64::MAX).expect("read").expect("all");
            assert_eq!(&got[..4], b"head");
            assert_eq!(&got[4..], &whole[..], "{}", path.display());
        }
    }

    /// A failed sync leaves the file's name in `UNSYNCED_FILE`; `rewrite_unsynced` makes
    /// what a reader sees durable and deletes the note, and a note naming paths outside
    /// the directory, missing files or garbage touches nothing else and never panics.
    #[test]
    fn a_failed_sync_is_noted_and_the_next_rewrite_makes_the_file_durable() {
        let sim = SimFs::new(9);
        let fs = Fs::new(Arc::new(sim.clone()));
        let dir = Path::new("/d");
        fs.create_dir_all(dir).expect("dir");
        let outside = fs.create_new(Path::new("/outside")).expect("create");
        outside.write_all_at(b"not synced", 0).expect("write");
        let a = fs.create_new(&dir.join("a")).expect("create");
        fs.sync_dir(dir).expect("sync dir");
        a.write_all_at(b"records", 0).expect("write");
        sim.fail_syncs_of(Some(&dir.join("a")));
        assert!(a.sync_data().is_err(), "injected");
        sim.fail_syncs_of(None);
        let note = dir.join(UNSYNCED_FILE);
        assert_eq!(
            fs.open(&note)
                .expect("noted")
                .read_all(u64::MAX)
                .expect("read")
                .expect("all"),
            b"a\n"
        );
        // Hostile lines next to the real one.
        let n = fs.open(&note).expect("note");
        n.write_all_at(b"a\n../outside\n/outside\n.\n..\nmissing\n\n\xff\xfe\n", 2)
            .expect("write");
        let syncs = sim.sync_points().len();
        fs.rewrite_unsynced(dir).expect("rewrite");
        assert_eq!(sim.sync_points().len(), syncs + 1, "one file synced, `a`");
        assert_eq!(fs.is_dir(&note), None, "the note is gone");
        let cut = sim.crash_now();
        assert_eq!(cut.read_file(&dir.join("a")).expect("a"), b"records");
        // Nothing noted: nothing to do.
        fs.rewrite_unsynced(dir).expect("no note");
    }
}
