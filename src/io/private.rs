//! Owner-only files beside the seam: the admin endpoint's socket file, the pointer to it
//! and its private directory. Always the real file system (the endpoint exists only
//! there); nothing here is synced: these files mean something only while their owner runs.

use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{IoContext, Result};

/// `path` with every link and `..` resolved; `None` if it does not exist.
pub fn canonical(path: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(path).ok()
}

/// Whether `path` is a directory (followed if a link).
pub fn is_dir(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_dir())
}

/// Whether `path` is a Unix socket (not followed if a link).
pub fn is_socket(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// This process's effective user id.
pub fn own_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The user id of the process at the other end of a Unix socket (`SO_PEERCRED`), as it
/// was when it connected; `None` where the system does not say.
pub fn peer_uid(stream: &std::os::unix::net::UnixStream) -> Option<u32> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    return rustix::net::sockopt::socket_peercred(stream)
        .ok()
        .map(|c| c.uid.as_raw());
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        let _ = stream;
        None
    }
}

/// Whether `path` is a socket (not a link to one) owned by this process's user: a
/// client never talks to a socket another local user put where the owner's would be.
pub fn is_own_socket(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket() && m.uid() == own_uid())
}

/// Makes `path` readable and writable by its owner only (0600).
pub fn set_owner_only(path: &Path) -> Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .ctx(|| format!("making {} owner-only", path.display()))
}

/// Removes the file `path`; a missing one is not an error.
pub fn remove_file(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(crate::error::Error::io(
            format!("removing {}", path.display()),
            e,
        )),
        _ => Ok(()),
    }
}

/// Removes the directory `path` if it is empty; anything else is left as it is.
pub fn remove_empty_dir(path: &Path) {
    let _ = std::fs::remove_dir(path);
}

/// Creates `dir` with mode 0700, or checks that the one there is a directory (not a
/// link) that nobody but its owner, this process's user, may enter: another user's or an
/// open one is refused.
pub fn private_dir(dir: &Path) -> Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(crate::error::Error::io(
                format!("creating {}", dir.display()),
                e,
            ));
        }
    }
    let m = std::fs::symlink_metadata(dir).ctx(|| format!("inspecting {}", dir.display()))?;
    let others = m.uid() != own_uid();
    if !m.file_type().is_dir() || m.permissions().mode() & 0o077 != 0 || others {
        return Err(crate::error::Error::io(
            format!("using {} for the admin socket", dir.display()),
            std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "it is not a directory only its owner may enter (mode 0700)",
            ),
        ));
    }
    Ok(())
}

/// Writes `text` into a new owner-only file `path` (replacing one there).
pub fn write_small(path: &Path, text: &str) -> Result<()> {
    remove_file(path)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .ctx(|| format!("creating {}", path.display()))?;
    std::io::Write::write_all(&mut f, text.as_bytes()).ctx(|| format!("writing {}", path.display()))
}

/// Reads the small text file `path`: `None` if it does not exist; at most `max` bytes
/// (a longer one, or one not UTF-8, is `InvalidData`).
pub fn read_small(path: &Path, max: usize) -> Result<Option<String>> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(crate::error::Error::io(
                format!("opening {}", path.display()),
                e,
            ));
        }
    };
    let mut bytes = Vec::new();
    f.take(max as u64 + 1)
        .read_to_end(&mut bytes)
        .ctx(|| format!("reading {}", path.display()))?;
    let bad = |what: &str| {
        crate::error::Error::io(
            format!("reading {}", path.display()),
            std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned()),
        )
    };
    if bytes.len() > max {
        return Err(bad("longer than such a file can be"));
    }
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| bad("not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `/tmp` fallback directory is used only if it is ours, a real directory, and
    /// closed to others: anyone may create `/tmp/spool-<hash>` first.
    #[test]
    fn a_private_directory_is_made_or_refused_unless_it_is_ours_and_closed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let made = tmp.path().join("made");
        private_dir(&made).expect("made");
        let mode = std::fs::metadata(&made).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        private_dir(&made).expect("ours and closed: used again");

        let open = tmp.path().join("open");
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&open)
            .expect("mkdir");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert!(private_dir(&open).is_err(), "others may enter it");

        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&made, &link).expect("symlink");
        assert!(private_dir(&link).is_err(), "a link, even to ours");

        let file = tmp.path().join("file");
        std::fs::write(&file, b"").expect("file");
        assert!(private_dir(&file).is_err(), "not a directory");

        if own_uid() == 0 {
            let theirs = tmp.path().join("theirs");
            private_dir(&theirs).expect("made");
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown");
            assert!(private_dir(&theirs).is_err(), "another user's");
        }
    }

    /// A client talks only to a socket of its own user.
    #[test]
    fn only_a_socket_of_our_own_user_is_ours() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let sock = tmp.path().join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        assert!(is_own_socket(&sock));
        let file = tmp.path().join("f");
        std::fs::write(&file, b"").expect("file");
        assert!(!is_own_socket(&file), "not a socket");
        if own_uid() == 0 {
            std::os::unix::fs::lchown(&sock, Some(65534), Some(65534)).expect("chown");
            assert!(!is_own_socket(&sock), "another user's");
        }
    }
}
