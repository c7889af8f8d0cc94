//! The only code that touches `std::fs` for segment data: positional reads and writes,
//! syncs, directory syncs, the instance lock. **Invariant:** knows bytes and paths, nothing
//! about records, topics or groups. A failed sync is returned, never ignored: callers
//! poison the handle that saw it.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};

/// A segment or index file opened for positional reads and writes.
#[derive(Debug)]
pub struct DataFile {
    file: File,
    path: PathBuf,
}

impl DataFile {
    /// Creates a new file, failing if it exists (a name is never reused).
    pub fn create_new(path: &Path) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .ctx(|| format!("creating {}", path.display()))?;
        Ok(DataFile {
            file,
            path: path.to_owned(),
        })
    }

    /// Opens an existing file for reading and writing.
    pub fn open(path: &Path) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .ctx(|| format!("opening {}", path.display()))?;
        Ok(DataFile {
            file,
            path: path.to_owned(),
        })
    }

    /// Opens or creates a file (for index caches).
    pub fn open_or_create(path: &Path) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .ctx(|| format!("opening {}", path.display()))?;
        Ok(DataFile {
            file,
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn len(&self) -> Result<u64> {
        Ok(self
            .file
            .metadata()
            .ctx(|| format!("reading the size of {}", self.path.display()))?
            .len())
    }

    /// Reads exactly `buf.len()` bytes at `position`, or fewer if the file ends first;
    /// returns how many were read.
    pub fn read_at(&self, buf: &mut [u8], position: u64) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], position + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(format!("reading {}", self.path.display()), e)),
            }
        }
        Ok(done)
    }

    pub fn write_all_at(&self, buf: &[u8], position: u64) -> Result<()> {
        self.file
            .write_all_at(buf, position)
            .ctx(|| format!("writing {}", self.path.display()))
    }

    /// Makes the file's data durable (`fdatasync`).
    pub fn sync_data(&self) -> Result<()> {
        self.file
            .sync_data()
            .ctx(|| format!("syncing {}", self.path.display()))
    }

    pub fn set_len(&self, len: u64) -> Result<()> {
        self.file
            .set_len(len)
            .ctx(|| format!("truncating {}", self.path.display()))
    }

    pub fn read_all(&self) -> Result<Vec<u8>> {
        let len = self.len()?;
        let len = usize::try_from(len).map_err(|_| Error::corrupt(&self.path, "file too large"))?;
        let mut buf = vec![0u8; len];
        let n = self.read_at(&mut buf, 0)?;
        buf.truncate(n);
        Ok(buf)
    }
}

/// Makes a directory entry change (create, rename, delete) durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx(|| format!("syncing directory {}", dir.display()))
}

pub fn create_dir_all(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).ctx(|| format!("creating directory {}", dir.display()))
}

pub fn remove_file(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("deleting {}", path.display()), e)),
    }
}

/// File names in a directory (non-UTF-8 names are skipped: spool never writes them).
pub fn list_dir(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let rd = std::fs::read_dir(dir).ctx(|| format!("listing {}", dir.display()))?;
    for entry in rd {
        let entry = entry.ctx(|| format!("listing {}", dir.display()))?;
        if let Ok(name) = entry.file_name().into_string() {
            out.push(name);
        }
    }
    Ok(out)
}

/// An exclusive lock on `<dir>/LOCK`, held for the instance's life (released on drop).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    pub fn acquire(dir: &Path) -> Result<Self> {
        let path = dir.join("LOCK");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .ctx(|| format!("opening {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => Ok(DirLock { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => Err(Error::Locked {
                path: dir.to_owned(),
            }),
            Err(std::fs::TryLockError::Error(e)) => {
                Err(Error::io(format!("locking {}", path.display()), e))
            }
        }
    }
}
