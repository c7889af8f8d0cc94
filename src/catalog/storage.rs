//! redb's storage backend over the crate's file seam, so the power-loss tests can run
//! the catalog on the simulated file system.
//!
//! **Invariant:** every byte redb reads or writes goes through `io::FileIo`.

use super::*;

/// redb storage over a [`FileIo`] (the simulated file system of the power-loss tests).
#[derive(Debug)]
pub(super) struct FileStorage(pub(super) Arc<dyn FileIo>);

impl redb::StorageBackend for FileStorage {
    fn len(&self) -> std::io::Result<u64> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        if self.0.read_at(out, offset)? < out.len() {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(())
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.0.write_all_at(data, offset)
    }
}
