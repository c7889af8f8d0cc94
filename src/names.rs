//! Topic and group names: 1-249 of `[A-Za-z0-9._-]`, not `.` or `..` (safe as a directory
//! name on every platform, and never a path).
//!
//! **Invariant:** a leaf. `options` checks the dead-letter suffix here, and `queue` every
//! topic and group name, so the rule lives once.

use crate::error::{Error, Result};

/// Topic and group names: 1..=249 characters.
pub const MAX_NAME_LEN: usize = 249;

/// Checks a topic or group name.
pub fn check(name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        Some("empty")
    } else if name.len() > MAX_NAME_LEN {
        Some("longer than 249 characters")
    } else if name == "." || name == ".." {
        Some("`.` and `..` are reserved")
    } else if !name.bytes().all(allowed) {
        Some("contains a character outside [A-Za-z0-9._-]")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(Error::InvalidTopicName {
            name: name.chars().take(300).collect(),
            reason,
        }),
        None => Ok(()),
    }
}

fn allowed(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-'
}

/// Checks a dead-letter suffix (it becomes part of a topic name).
pub fn check_suffix(suffix: &str) -> Result<()> {
    if suffix.bytes().all(allowed) && suffix.len() < MAX_NAME_LEN {
        Ok(())
    } else {
        Err(Error::InvalidTopicName {
            name: suffix.chars().take(300).collect(),
            reason: "dead-letter suffix contains a character outside [A-Za-z0-9._-]",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn names() {
        for ok in ["a", "factory.events", "A-b_c.9", &"x".repeat(249), "..."] {
            assert!(check(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a\\b",
            "a\0b",
            "é",
            "a b",
            &"x".repeat(250),
        ] {
            assert!(check(bad).is_err(), "{bad:?}");
        }
    }
}
