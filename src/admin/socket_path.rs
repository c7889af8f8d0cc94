//! Where a data directory's admin socket lives.
//!
//! - `<data>/admin.sock` when that path fits a socket address (`sun_path`: 107 bytes on
//!   Linux, 103 elsewhere).
//! - Otherwise `$XDG_RUNTIME_DIR/spool-<hash>.sock` (a per-user directory, 0700 by its
//!   standard) when that fits, else `/tmp/spool-<hash>/admin.sock` in a directory of its
//!   own with mode 0700. `<hash>` is 16 hex digits of the canonical data directory's path.
//!   The owner then writes that path into `<data>/admin.sock.path` (the pointer), and a
//!   client reads it there: the hash never has to agree between versions.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::io::private;

/// The socket's name inside the data directory.
pub const SOCKET_FILE: &str = "admin.sock";
/// The pointer's name inside the data directory, when the socket is elsewhere.
pub const POINTER_FILE: &str = "admin.sock.path";
/// The longest path a Unix socket address holds (`sun_path` less its final NUL).
pub const SUN_PATH_MAX: usize = if cfg!(target_os = "linux") { 107 } else { 103 };
/// A pointer longer than this is damage, not a path.
const POINTER_MAX_BYTES: usize = 4096;

/// Where an owner binds, and the files that go with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The socket's path.
    pub socket: PathBuf,
    /// `<data>/admin.sock.path`, when the socket is outside the data directory.
    pub pointer: Option<PathBuf>,
    /// The private directory made for the socket under `/tmp`, if one is.
    pub private_dir: Option<PathBuf>,
}

fn fits(p: &Path) -> bool {
    p.as_os_str().len() <= SUN_PATH_MAX
}

/// FNV-1a, 64 bits: a short stable name for a long path.
fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Where the owner of `data_dir` (canonical) binds; `runtime_dir` is `$XDG_RUNTIME_DIR`.
pub fn place(data_dir: &Path, runtime_dir: Option<&Path>) -> Placement {
    let inside = data_dir.join(SOCKET_FILE);
    if fits(&inside) {
        return Placement {
            socket: inside,
            pointer: None,
            private_dir: None,
        };
    }
    let name = format!("spool-{:016x}", hash(data_dir.as_os_str().as_bytes()));
    let pointer = Some(data_dir.join(POINTER_FILE));
    if let Some(run) = runtime_dir.filter(|r| r.is_absolute()) {
        let socket = run.join(format!("{name}.sock"));
        if fits(&socket) {
            return Placement {
                socket,
                pointer,
                private_dir: None,
            };
        }
    }
    let dir = Path::new("/tmp").join(name);
    Placement {
        socket: dir.join(SOCKET_FILE),
        pointer,
        private_dir: Some(dir),
    }
}

/// Where a client finds the socket of `data_dir` (canonical): the pointer's path if
/// there is a pointer, else `<data>/admin.sock` if it is a socket; `None` if neither.
pub fn find(data_dir: &Path) -> Result<Option<PathBuf>> {
    let pointer = data_dir.join(POINTER_FILE);
    if let Some(text) = private::read_small(&pointer, POINTER_MAX_BYTES)? {
        let p = PathBuf::from(text.trim_end_matches('\n'));
        if !p.is_absolute() {
            return Err(crate::error::Error::io(
                format!("reading {}", pointer.display()),
                std::io::Error::new(std::io::ErrorKind::InvalidData, "not an absolute path"),
            ));
        }
        return Ok(Some(p));
    }
    let inside = data_dir.join(SOCKET_FILE);
    Ok(private::is_socket(&inside).then_some(inside))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_directory_keeps_its_socket_and_a_long_one_points_elsewhere() {
        let short = place(Path::new("/var/lib/app"), None);
        assert_eq!(short.socket, Path::new("/var/lib/app/admin.sock"));
        assert_eq!(short.pointer, None);

        let long = PathBuf::from(format!("/data/{}", "d".repeat(120)));
        let run = Path::new("/run/user/1000");
        let p = place(&long, Some(run));
        assert!(p.socket.starts_with(run) && fits(&p.socket), "{p:?}");
        assert_eq!(p.pointer, Some(long.join(POINTER_FILE)));
        assert_eq!(p.private_dir, None);
        assert_eq!(
            place(&long, Some(run)),
            p,
            "the same directory, the same place"
        );

        let other = place(&long.join("x"), Some(run));
        assert_ne!(other.socket, p.socket);

        let long_run = PathBuf::from(format!("/run/{}", "r".repeat(100)));
        for run in [None, Some(long_run.as_path()), Some(Path::new("relative"))] {
            let p = place(&long, run);
            assert!(p.socket.starts_with("/tmp") && fits(&p.socket), "{p:?}");
            assert_eq!(p.private_dir.as_deref(), p.socket.parent());
        }
    }
}
