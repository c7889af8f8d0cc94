//! [`WireError`]: an [`Error`] on the wire, one variant per kind with its fields, so that
//! the client rebuilds the owner's error (an `Io` error keeps its kind's name and its
//! message). New variants go at the end only (postcard encodes a variant by its index).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::protocol::to_usize;
use crate::error::Error;

/// An [`Error`] on the wire: its kind and fields. New variants go at the end only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireError {
    InvalidConnectionString {
        key: String,
        reason: String,
    },
    InvalidTopicName {
        name: String,
        reason: String,
    },
    InvalidMessageId {
        reason: String,
    },
    MessageTooLarge {
        size: u64,
        max: u64,
    },
    HeadersTooLarge {
        size: u64,
        max: u64,
    },
    NotAtCursor {
        expected: u64,
        actual: u64,
    },
    OffsetOutOfRange {
        offset: u64,
        next: u64,
    },
    StaleDelivery {
        offset: u64,
    },
    DeliveryExpired {
        topic: String,
        group: String,
        offset: u64,
    },
    GroupInUse {
        topic: String,
        group: String,
    },
    Locked {
        path: PathBuf,
    },
    Unsupported {
        what: String,
    },
    Corrupt {
        path: PathBuf,
        detail: String,
    },
    Closed,
    Poisoned {
        reason: String,
    },
    /// `kind` is the `std::io::ErrorKind`'s name (`NotFound`, `StorageFull`, ...).
    Io {
        context: String,
        kind: String,
        message: String,
    },
    SnapshotDestination {
        path: PathBuf,
        reason: String,
    },
    IncompleteSnapshot {
        path: PathBuf,
    },
    Catalog {
        context: String,
        detail: String,
    },
    /// A kind this side does not know, as its message.
    Other {
        message: String,
    },
    /// Last, so the kinds before it keep their numbers on the wire.
    Kafka {
        context: String,
        detail: String,
    },
}

impl From<&Error> for WireError {
    fn from(e: &Error) -> WireError {
        let s = |x: &str| x.to_owned();
        match e {
            Error::InvalidConnectionString { key, reason } => WireError::InvalidConnectionString {
                key: s(key),
                reason: s(reason),
            },
            Error::InvalidTopicName { name, reason } => WireError::InvalidTopicName {
                name: s(name),
                reason: s(reason),
            },
            Error::InvalidMessageId { reason } => WireError::InvalidMessageId { reason: s(reason) },
            Error::MessageTooLarge { size, max } => WireError::MessageTooLarge {
                size: *size as u64,
                max: *max as u64,
            },
            Error::HeadersTooLarge { size, max } => WireError::HeadersTooLarge {
                size: *size as u64,
                max: *max as u64,
            },
            Error::NotAtCursor { expected, actual } => WireError::NotAtCursor {
                expected: *expected,
                actual: *actual,
            },
            Error::OffsetOutOfRange { offset, next } => WireError::OffsetOutOfRange {
                offset: *offset,
                next: *next,
            },
            Error::StaleDelivery { offset } => WireError::StaleDelivery { offset: *offset },
            Error::DeliveryExpired {
                topic,
                group,
                offset,
            } => WireError::DeliveryExpired {
                topic: s(topic),
                group: s(group),
                offset: *offset,
            },
            Error::GroupInUse { topic, group } => WireError::GroupInUse {
                topic: s(topic),
                group: s(group),
            },
            Error::Locked { path } => WireError::Locked { path: path.clone() },
            Error::Unsupported { what } => WireError::Unsupported { what: s(what) },
            Error::Corrupt { path, detail } => WireError::Corrupt {
                path: path.clone(),
                detail: s(detail),
            },
            Error::Closed => WireError::Closed,
            Error::Poisoned { reason } => WireError::Poisoned { reason: s(reason) },
            Error::Io { context, source } => WireError::Io {
                context: s(context),
                kind: format!("{:?}", source.kind()),
                message: source.to_string(),
            },
            Error::SnapshotDestination { path, reason } => WireError::SnapshotDestination {
                path: path.clone(),
                reason: s(reason),
            },
            Error::IncompleteSnapshot { path } => {
                WireError::IncompleteSnapshot { path: path.clone() }
            }
            Error::Catalog { context, detail } => WireError::Catalog {
                context: s(context),
                detail: s(detail),
            },
            Error::Kafka { context, detail } => WireError::Kafka {
                context: s(context),
                detail: s(detail),
            },
        }
    }
}

impl WireError {
    /// The owner's error, rebuilt on the client's side.
    pub fn into_error(self) -> Error {
        match self {
            WireError::InvalidConnectionString { key, reason } => {
                Error::InvalidConnectionString { key, reason }
            }
            WireError::InvalidTopicName { name, reason } => match crate::names::check(&name) {
                Err(e) => e,
                // The owner's rule differs from ours (another version): keep its words.
                Ok(()) => Error::Unsupported {
                    what: format!("the owner refused the name {name:?}: {reason}"),
                },
            },
            WireError::InvalidMessageId { reason } => Error::InvalidMessageId { reason },
            WireError::MessageTooLarge { size, max } => Error::MessageTooLarge {
                size: to_usize(size),
                max: to_usize(max),
            },
            WireError::HeadersTooLarge { size, max } => Error::HeadersTooLarge {
                size: to_usize(size),
                max: to_usize(max),
            },
            WireError::NotAtCursor { expected, actual } => Error::NotAtCursor { expected, actual },
            WireError::OffsetOutOfRange { offset, next } => {
                Error::OffsetOutOfRange { offset, next }
            }
            WireError::StaleDelivery { offset } => Error::StaleDelivery { offset },
            WireError::DeliveryExpired {
                topic,
                group,
                offset,
            } => Error::DeliveryExpired {
                topic,
                group,
                offset,
            },
            WireError::GroupInUse { topic, group } => Error::GroupInUse { topic, group },
            WireError::Locked { path } => Error::Locked { path },
            WireError::Unsupported { what } => Error::Unsupported { what },
            WireError::Corrupt { path, detail } => Error::Corrupt { path, detail },
            WireError::Closed => Error::Closed,
            WireError::Poisoned { reason } => Error::Poisoned { reason },
            WireError::Io {
                context,
                kind,
                message,
            } => Error::io(
                format!("{context} (in the owning instance)"),
                std::io::Error::new(io_kind(&kind), message),
            ),
            WireError::SnapshotDestination { path, reason } => {
                Error::SnapshotDestination { path, reason }
            }
            WireError::IncompleteSnapshot { path } => Error::IncompleteSnapshot { path },
            WireError::Catalog { context, detail } => Error::Catalog { context, detail },
            WireError::Kafka { context, detail } => Error::Kafka { context, detail },
            WireError::Other { message } => Error::Unsupported { what: message },
        }
    }
}

/// The `std::io::ErrorKind` named `name` (its `Debug` form), `Other` if unknown here.
fn io_kind(name: &str) -> std::io::ErrorKind {
    use std::io::ErrorKind as K;
    [
        K::NotFound,
        K::PermissionDenied,
        K::AlreadyExists,
        K::InvalidInput,
        K::InvalidData,
        K::TimedOut,
        K::WriteZero,
        K::Interrupted,
        K::Unsupported,
        K::UnexpectedEof,
        K::OutOfMemory,
        K::StorageFull,
        K::NotADirectory,
        K::IsADirectory,
        K::DirectoryNotEmpty,
        K::ReadOnlyFilesystem,
        K::QuotaExceeded,
        K::FileTooLarge,
        K::ResourceBusy,
        K::CrossesDevices,
    ]
    .into_iter()
    .find(|k| format!("{k:?}") == name)
    .unwrap_or(K::Other)
}
