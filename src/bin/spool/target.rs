//! What `--data` names, checked before anything is opened (CLI.md, "Bad input"): a value
//! containing `=` is a connection string the library parses; anything else a directory.
//! Only `publish` may create the directory; every command refuses a file, and a directory
//! that holds something other than a spool instance.

use std::path::Path;

use spool::Options;

use crate::failure::Failure;

/// The file every spool data directory has.
const CATALOG: &str = "catalog.redb";

/// The instance a command works on.
#[derive(Debug)]
pub struct Target {
    /// What to open it with (the connection string's keys, or the defaults).
    pub options: Options,
}

impl Target {
    /// Parses `--data` (or `$SPOOL_DATA`).
    pub fn from_flag(data: Option<&str>) -> Result<Target, Failure> {
        let Some(data) = data.filter(|d| !d.trim().is_empty()) else {
            return Err(Failure::failed(
                "no data directory: pass --data <DIR> or set SPOOL_DATA",
            ));
        };
        let options = if data.contains('=') {
            Options::parse(data)?
        } else {
            Options::new(data)
        };
        Ok(Target { options })
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.options.data_source
    }

    /// `Ok` if the directory may be opened: an instance's directory, or for a command
    /// that `creates`, one that does not exist yet or is empty.
    pub fn check(&self, creates: bool) -> Result<(), Failure> {
        let dir = self.dir();
        let shown = dir.display();
        match std::fs::metadata(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return if creates {
                    Ok(())
                } else {
                    Err(Failure::failed(format!(
                        "{shown} does not exist: check the path (only publish creates a data directory)"
                    )))
                };
            }
            Err(e) => return Err(Failure::failed(format!("cannot read {shown}: {e}"))),
            Ok(m) if !m.is_dir() => {
                return Err(Failure::failed(format!(
                    "{shown} is a file, not a data directory: pass the directory that holds {CATALOG}"
                )));
            }
            Ok(_) => {}
        }
        if dir.join(CATALOG).is_file() {
            return Ok(());
        }
        let empty = std::fs::read_dir(dir)
            .map_err(|e| Failure::failed(format!("cannot read {shown}: {e}")))?
            .next()
            .is_none();
        if creates && empty {
            return Ok(());
        }
        Err(Failure::failed(format!(
            "{shown} is not a spool data directory (it has no {CATALOG}): check the path"
        )))
    }
}
