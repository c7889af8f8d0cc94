//! The one error type. Each message says what went wrong and, where it helps, what to do.

use std::path::PathBuf;

/// Everything a spool call can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The connection string (or an [`Options`](crate::options::Options) value) is invalid.
    /// Fix the named key and open again.
    #[error("invalid connection string: key `{key}`: {reason}")]
    InvalidConnectionString {
        /// The key at fault, or the whole malformed part when it has no `=`.
        key: String,
        /// What is wrong with its value, or that the key is unknown or repeated.
        reason: String,
    },

    /// A topic or group name (or the dead-letter suffix) breaks the naming rules.
    /// Names are 1-249 characters of `[A-Za-z0-9._-]`, and not `.` or `..`.
    #[error(
        "invalid topic or group name {name:?}: {reason} (use 1-249 of [A-Za-z0-9._-], not `.` or `..`)"
    )]
    InvalidTopicName {
        /// The rejected name, cut to its first 300 characters.
        name: String,
        /// Which rule it breaks.
        reason: &'static str,
    },

    /// A `message-id` header is empty or longer than 256 UTF-8 bytes.
    /// Nothing of the publish was appended.
    #[error(
        "invalid message-id header: {reason} (it must be non-empty and at most 256 UTF-8 bytes)"
    )]
    InvalidMessageId {
        /// Why the id was rejected.
        reason: String,
    },

    /// A payload is larger than `Max Message Bytes`.
    /// Nothing of the publish was appended; raise the limit or split the payload.
    #[error(
        "message of {size} bytes is larger than Max Message Bytes ({max}); raise the limit or split the payload"
    )]
    MessageTooLarge {
        /// The payload's size, in bytes.
        size: usize,
        /// The instance's `Max Message Bytes`.
        max: usize,
    },

    /// A message's encoded headers are larger than `Max Header Bytes`.
    /// Nothing of the publish was appended.
    #[error("headers of {size} bytes are larger than Max Header Bytes ({max})")]
    HeadersTooLarge {
        /// The encoded size of the headers, in bytes.
        size: usize,
        /// The instance's `Max Header Bytes`.
        max: usize,
    },

    /// [`Spool::ack`](crate::Spool::ack) or [`Spool::nack`](crate::Spool::nack) named an
    /// offset other than the group's cursor. Use a [`Consumer`](crate::Consumer) to ack out of order.
    #[error(
        "offset {actual} is not the group's cursor {expected}: only the cursor can be acked or nacked at this level"
    )]
    NotAtCursor {
        /// The group's cursor: the only offset this call accepts.
        expected: u64,
        /// The offset the call named.
        actual: u64,
    },

    /// An ack or nack named an offset at or past the end of the log.
    #[error("offset {offset} does not exist yet: the log ends at {next}")]
    OffsetOutOfRange {
        /// The offset the call named.
        offset: u64,
        /// The log's end: the offset the next publish gets.
        next: u64,
    },

    /// An ack or nack of a delivery the group no longer holds: the group was reset since
    /// the hand-out, or the delivery already finished. The call changed nothing.
    #[error(
        "delivery of offset {offset} is stale: the group was reset (or the delivery already finished) since it was handed out"
    )]
    StaleDelivery {
        /// The delivery's offset.
        offset: u64,
    },

    /// An ack, nack or `extend_deadline` of a delivery whose ack deadline had passed: the
    /// group took it back as a failed attempt (it is delivered again, or was
    /// dead-lettered). The call changed nothing. Handle faster, call `extend_deadline`
    /// while working, or give the consumer a longer `ack_deadline`.
    #[error(
        "delivery of offset {offset} (topic {topic}, group {group}) expired: its ack deadline passed, so it was taken back as a failed attempt"
    )]
    DeliveryExpired {
        /// The topic.
        topic: String,
        /// The group.
        group: String,
        /// The delivery's offset.
        offset: u64,
    },

    /// The group cannot be deleted: a consumer of it is open in this instance. Drop or
    /// close its consumers first.
    #[error("group {group} of topic {topic} is in use: a consumer of it is open")]
    GroupInUse {
        /// The topic.
        topic: String,
        /// The group.
        group: String,
    },

    /// Another spool instance, in this or another process, has the data directory open.
    /// Close that instance first; only one may use a directory at a time.
    #[error("data directory {} is in use by another spool instance (in this or another process)", path.display())]
    Locked {
        /// The locked data directory (or its catalog file).
        path: PathBuf,
    },

    /// The request cannot be served by this version.
    /// Examples: a `Mode` other than `Embedded`, or a catalog written by a newer spool.
    #[error("unsupported: {what}")]
    Unsupported {
        /// What was asked for.
        what: String,
    },

    /// A file in the data directory holds data spool can neither read nor repair: damaged
    /// from outside, or not written by spool. Inspect or restore the named file.
    #[error("corrupt data in {}: {detail}", path.display())]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// What was found wrong, and where.
        detail: String,
    },

    /// The instance was closed with [`Spool::close`](crate::Spool::close).
    /// Open it again to continue.
    #[error("the spool instance is closed")]
    Closed,

    /// A write or sync of this topic failed earlier, so the topic stopped.
    /// Close and reopen the instance to recover.
    #[error("a previous write or sync failed ({reason}); reopen the instance to recover")]
    Poisoned {
        /// The failure that stopped the topic.
        reason: String,
    },

    /// The operating system reported an I/O error.
    #[error("I/O error while {context}: {source}")]
    Io {
        /// What spool was doing, usually naming the file.
        context: String,
        /// The underlying error; its `kind()` tells, for example, a full disk or a denied permission.
        #[source]
        source: std::io::Error,
    },

    /// A snapshot's destination cannot take it: it exists and is not an empty directory,
    /// or it lies inside the data directory. Nothing was written there. Name a directory
    /// that does not exist or is empty, outside the data directory.
    #[error("cannot take a snapshot into {}: {reason}; name a directory that does not exist or is empty, outside the data directory", path.display())]
    SnapshotDestination {
        /// The destination named.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// The directory holds a snapshot that did not finish (a power cut, a crash or an
    /// error while it was taken), so it is not a complete copy. Delete the directory and
    /// take the snapshot again.
    #[error("{} holds a snapshot that did not finish (its SNAPSHOT-INCOMPLETE marker is still there); delete the directory and take the snapshot again", path.display())]
    IncompleteSnapshot {
        /// The directory.
        path: PathBuf,
    },

    /// A Kafka broker or librdkafka reported an error, or a call took longer than
    /// `Kafka Timeout Ms` (`Mode=Kafka`).
    #[error("Kafka error while {context}: {detail}")]
    Kafka {
        /// What spool was doing.
        context: String,
        /// librdkafka's own message.
        detail: String,
    },

    /// The catalog (the redb file holding cursors and attempts) reported an error.
    #[error("catalog error while {context}: {detail}")]
    Catalog {
        /// What spool was doing.
        context: String,
        /// The catalog's own message.
        detail: String,
    },
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
