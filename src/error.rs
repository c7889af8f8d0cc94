//! The one error type. Each message says what went wrong and, where it helps, what to do.

use std::path::PathBuf;

/// Everything a spool call can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("invalid connection string: key `{key}`: {reason}")]
    InvalidConnectionString { key: String, reason: String },

    #[error(
        "invalid topic or group name {name:?}: {reason} (use 1-249 of [A-Za-z0-9._-], not `.` or `..`)"
    )]
    InvalidTopicName { name: String, reason: &'static str },

    #[error(
        "invalid message-id header: {reason} (it must be non-empty and at most 256 UTF-8 bytes)"
    )]
    InvalidMessageId { reason: String },

    #[error(
        "message of {size} bytes is larger than Max Message Bytes ({max}); raise the limit or split the payload"
    )]
    MessageTooLarge { size: usize, max: usize },

    #[error("headers of {size} bytes are larger than Max Header Bytes ({max})")]
    HeadersTooLarge { size: usize, max: usize },

    #[error(
        "offset {actual} is not the group's cursor {expected}: only the cursor can be acked or nacked at this level"
    )]
    NotAtCursor { expected: u64, actual: u64 },

    #[error("offset {offset} does not exist yet: the log ends at {next}")]
    OffsetOutOfRange { offset: u64, next: u64 },

    #[error(
        "delivery of offset {offset} is stale: the group was reset (or the delivery already finished) since it was handed out"
    )]
    StaleDelivery { offset: u64 },

    #[error("data directory {} is in use by another spool instance (in this or another process)", path.display())]
    Locked { path: PathBuf },

    #[error("unsupported: {what}")]
    Unsupported { what: String },

    #[error("corrupt data in {}: {detail}", path.display())]
    Corrupt { path: PathBuf, detail: String },

    #[error("the spool instance is closed")]
    Closed,

    #[error("a previous write or sync failed ({reason}); reopen the instance to recover")]
    Poisoned { reason: String },

    #[error("I/O error while {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    #[error("catalog error while {context}: {detail}")]
    Catalog { context: String, detail: String },
}

/// `Result` with spool's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn corrupt(path: impl Into<PathBuf>, detail: impl Into<String>) -> Self {
        Error::Corrupt {
            path: path.into(),
            detail: detail.into(),
        }
    }
}

/// Adds context to `std::io::Result`s.
pub(crate) trait IoContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::io(context(), e))
    }
}
