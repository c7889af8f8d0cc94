//! The admin protocol: what a client and the owner say to each other on the socket.
//!
//! - **Frame:** a `u32` little-endian length, then that many bytes of postcard. A length
//!   above [`MAX_FRAME_BYTES`] is refused before anything is read or allocated for it.
//! - **Conversation:** the client sends a [`Hello`] frame first; the owner answers
//!   [`Response::Hello`], or [`Response::Error`] and closes. Then requests and responses
//!   alternate, one [`Request`] frame, one [`Response`] frame, on the same connection.
//! - **Versions:** [`Hello`] carries [`MAGIC`] and [`PROTOCOL_VERSION`]; the `Hello`
//!   frame's shape is frozen for every version. An owner answers a version it does not
//!   speak with `Error(Unsupported)` and closes. Within a version, variants are only ever
//!   added at the end of [`Request`] and [`Response`] (postcard encodes a variant by its
//!   index), so an older owner answers a newer request as undecodable: an error, then
//!   the connection closes.
//! - **Errors** travel as [`WireError`], one variant per [`Error`] kind with its fields,
//!   so that the client rebuilds the owner's `Error` (an `Io` error keeps its kind and
//!   message).
//! - [`Request::Verify`] is the CLI's `verify`, answered with [`Response::Verify`].
//!
//! **Invariant:** plain data and conversions; no I/O but [`write_frame`] and
//! [`read_frame`] on any `Read`/`Write`.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::Headers;
use crate::format::record::Record;
use crate::options::RetentionPolicy;
use crate::queue::{
    GroupCounts, GroupInfo, OffsetReset, PendingAttempt, SnapshotInfo, TopicConfig, TopicInfo,
};

pub use super::wire_batch::WireBatch;
pub use super::wire_error::WireError;

/// The first bytes of every [`Hello`]: `SPAD` (spool admin).
pub const MAGIC: [u8; 4] = *b"SPAD";
/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;
/// The largest frame either side sends or accepts: 64 MiB. A `fetch` answer is cut to
/// fit (fewer records, as `fetch` may return); a larger publish is refused by the client.
pub const MAX_FRAME_BYTES: usize = 64 << 20;

/// The client's first frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Always [`MAGIC`].
    pub magic: [u8; 4],
    /// The client's [`PROTOCOL_VERSION`].
    pub version: u32,
}

impl Hello {
    /// This build's hello.
    pub fn current() -> Hello {
        Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
        }
    }
}

/// A call on the owner's instance; each mirrors the `Spool` method of the same name.
/// New variants go at the end only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// `topics()`.
    Topics,
    /// `topic_info(topic)`.
    TopicInfo { topic: String },
    /// `groups(topic)`.
    Groups { topic: String },
    /// `group_info(topic, group)`.
    GroupInfo { topic: String, group: String },
    /// `reset_offset(topic, group, to)`.
    ResetOffset {
        topic: String,
        group: String,
        to: WireReset,
    },
    /// `fetch(topic, from, max_records)`; the answer may hold fewer records to fit a frame.
    Fetch {
        topic: String,
        from: u64,
        max_records: u64,
    },
    /// `publish_batch(topic, messages)` (a `publish` is a batch of one); decoded within
    /// [`MAX_BATCH_ITEMS`](super::wire_batch::MAX_BATCH_ITEMS).
    PublishBatch { topic: String, messages: WireBatch },
    /// `delete_group(topic, group)`.
    DeleteGroup { topic: String, group: String },
    /// `delete_records_before(topic, offset)`.
    DeleteRecordsBefore { topic: String, offset: u64 },
    /// `snapshot(dest)`; `dest` absolute (the owner's working directory is not the
    /// client's).
    Snapshot { dest: PathBuf },
    /// `apply_retention()`.
    ApplyRetention,
    /// `set_topic_config(topic, config)`.
    SetTopicConfig {
        topic: String,
        config: WireTopicConfig,
    },
    /// `verify` (CLI.md): every record, index entry and catalog row read back.
    Verify { topic: Option<String> },
    /// `metrics()`: every topic's and group's figures and the owner's sync latencies.
    Metrics,
}

impl Request {
    /// The request's name, topic and group, for the owner's log.
    pub fn describe(&self) -> (&'static str, Option<&str>, Option<&str>) {
        match self {
            Request::Topics => ("topics", None, None),
            Request::TopicInfo { topic } => ("topic_info", Some(topic), None),
            Request::Groups { topic } => ("groups", Some(topic), None),
            Request::GroupInfo { topic, group } => ("group_info", Some(topic), Some(group)),
            Request::ResetOffset { topic, group, .. } => ("reset_offset", Some(topic), Some(group)),
            Request::Fetch { topic, .. } => ("fetch", Some(topic), None),
            Request::PublishBatch { topic, .. } => ("publish_batch", Some(topic), None),
            Request::DeleteGroup { topic, group } => ("delete_group", Some(topic), Some(group)),
            Request::DeleteRecordsBefore { topic, .. } => {
                ("delete_records_before", Some(topic), None)
            }
            Request::Snapshot { .. } => ("snapshot", None, None),
            Request::ApplyRetention => ("apply_retention", None, None),
            Request::SetTopicConfig { topic, .. } => ("set_topic_config", Some(topic), None),
            Request::Verify { topic } => ("verify", topic.as_deref(), None),
            Request::Metrics => ("metrics", None, None),
        }
    }

    /// Whether the request changes the instance (logged at `info`; reads at `debug`).
    pub fn changes(&self) -> bool {
        !matches!(
            self,
            Request::Topics
                | Request::TopicInfo { .. }
                | Request::Groups { .. }
                | Request::GroupInfo { .. }
                | Request::Fetch { .. }
                | Request::Verify { .. }
                | Request::Metrics
        )
    }
}

/// The owner's answer. New variants go at the end only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// The answer to a [`Hello`] the owner speaks.
    Hello {
        /// The owner's [`PROTOCOL_VERSION`].
        version: u32,
        /// The owner's crate version.
        server: String,
        /// The owner's data directory, canonical.
        data_dir: PathBuf,
    },
    /// The call failed (or the frame was not understood: then the connection closes).
    Error(WireError),
    /// The call succeeded and returns nothing.
    Done,
    /// Topic or group names.
    Names(Vec<String>),
    /// A `TopicInfo`.
    TopicInfo(WireTopicInfo),
    /// A `GroupInfo`.
    GroupInfo(WireGroupInfo),
    /// One offset (a reset's new cursor, a deletion's new earliest).
    Offset(u64),
    /// A publish's offsets.
    Offsets(Vec<u64>),
    /// Fetched records.
    Records(Vec<WireRecord>),
    /// What a snapshot copied.
    Snapshot(WireSnapshotInfo),
    /// What `verify` found (added after version 1's first variants: at the end).
    Verify(crate::queue::VerifyReport),
    /// The owner's metrics.
    Metrics(super::wire_metrics::WireMetrics),
}

/// Bytes encoded as one length-prefixed run (not byte by byte, as a `Vec<u8>` would be).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Payload(pub Bytes);

impl Serialize for Payload {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Payload, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Payload;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> std::result::Result<Payload, E> {
                Ok(Payload(Bytes::copy_from_slice(v)))
            }
            fn visit_byte_buf<E: serde::de::Error>(
                self,
                v: Vec<u8>,
            ) -> std::result::Result<Payload, E> {
                Ok(Payload(Bytes::from(v)))
            }
        }
        d.deserialize_byte_buf(V)
    }
}

/// [`OffsetReset`] on the wire (a time as its distance from the Unix epoch, exactly).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireReset {
    /// `Earliest`.
    Earliest,
    /// `Latest`.
    Latest,
    /// `Time(UNIX_EPOCH + secs + nanos)`; a time before the epoch travels as the epoch.
    Time { secs: u64, nanos: u32 },
    /// `Explicit(n)`.
    Explicit(u64),
}

impl From<OffsetReset> for WireReset {
    fn from(r: OffsetReset) -> WireReset {
        match r {
            OffsetReset::Earliest => WireReset::Earliest,
            OffsetReset::Latest => WireReset::Latest,
            OffsetReset::Explicit(n) => WireReset::Explicit(n),
            OffsetReset::Time(t) => {
                let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
                WireReset::Time {
                    secs: d.as_secs(),
                    nanos: d.subsec_nanos(),
                }
            }
        }
    }
}

impl WireReset {
    /// Back to an [`OffsetReset`]; a time too far out to represent is the latest one.
    pub fn into_reset(self) -> OffsetReset {
        match self {
            WireReset::Earliest => OffsetReset::Earliest,
            WireReset::Latest => OffsetReset::Latest,
            WireReset::Explicit(n) => OffsetReset::Explicit(n),
            WireReset::Time { secs, nanos } => {
                let d = Duration::new(secs, nanos.min(999_999_999));
                match UNIX_EPOCH.checked_add(d) {
                    Some(t) => OffsetReset::Time(t),
                    None => OffsetReset::Latest,
                }
            }
        }
    }
}

/// [`TopicConfig`] on the wire (`retention_policy`: 0 `Limits`, 1 `Acked`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireTopicConfig {
    pub retention_bytes: Option<u64>,
    pub retention_ms: Option<u64>,
    pub retention_policy: Option<u8>,
}

impl From<&TopicConfig> for WireTopicConfig {
    fn from(c: &TopicConfig) -> WireTopicConfig {
        WireTopicConfig {
            retention_bytes: c.retention_bytes,
            retention_ms: c.retention_ms,
            retention_policy: c.retention_policy.map(|p| match p {
                RetentionPolicy::Limits => 0,
                RetentionPolicy::Acked => 1,
            }),
        }
    }
}

impl WireTopicConfig {
    /// Back to a [`TopicConfig`]; an unknown policy number is `Corrupt` input.
    pub fn into_config(self) -> Result<TopicConfig> {
        let retention_policy = match self.retention_policy {
            None => None,
            Some(0) => Some(RetentionPolicy::Limits),
            Some(1) => Some(RetentionPolicy::Acked),
            Some(n) => return Err(protocol_error(format!("unknown retention policy {n}"))),
        };
        Ok(TopicConfig {
            retention_bytes: self.retention_bytes,
            retention_ms: self.retention_ms,
            retention_policy,
        })
    }
}

/// [`TopicInfo`] on the wire.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireTopicInfo {
    pub earliest: u64,
    pub next: u64,
    pub messages: u64,
    pub bytes: u64,
    pub segments: u64,
    pub dedup_ids: u64,
    pub config: WireTopicConfig,
}

impl From<&TopicInfo> for WireTopicInfo {
    fn from(t: &TopicInfo) -> WireTopicInfo {
        WireTopicInfo {
            earliest: t.earliest,
            next: t.next,
            messages: t.messages,
            bytes: t.bytes,
            segments: t.segments as u64,
            dedup_ids: t.dedup_ids as u64,
            config: (&t.config).into(),
        }
    }
}

impl WireTopicInfo {
    /// Back to a [`TopicInfo`].
    pub fn into_info(self) -> Result<TopicInfo> {
        Ok(TopicInfo {
            earliest: self.earliest,
            next: self.next,
            messages: self.messages,
            bytes: self.bytes,
            segments: to_usize(self.segments),
            dedup_ids: to_usize(self.dedup_ids),
            config: self.config.into_config()?,
        })
    }
}

/// [`GroupInfo`] on the wire; `pending` as `(offset, attempts, last_reason)`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireGroupInfo {
    pub cursor: u64,
    pub next: u64,
    pub lag: u64,
    pub in_flight: u64,
    pub pending: Vec<(u64, u32, String)>,
    pub dead_lettered: u64,
    pub skipped: u64,
    pub epoch: u64,
    /// `GroupCounts`: delivered, redelivered, acked, nacked, expired.
    pub counts: [u64; 5],
}

impl From<&GroupInfo> for WireGroupInfo {
    fn from(g: &GroupInfo) -> WireGroupInfo {
        WireGroupInfo {
            cursor: g.cursor,
            next: g.next,
            lag: g.lag,
            in_flight: g.in_flight as u64,
            pending: g
                .pending
                .iter()
                .map(|p| (p.offset, p.attempts, p.last_reason.clone()))
                .collect(),
            dead_lettered: g.dead_lettered,
            skipped: g.skipped,
            epoch: g.epoch,
            counts: g.counts.to_array(),
        }
    }
}

impl WireGroupInfo {
    /// Back to a [`GroupInfo`].
    pub fn into_info(self) -> GroupInfo {
        GroupInfo {
            cursor: self.cursor,
            next: self.next,
            lag: self.lag,
            in_flight: to_usize(self.in_flight),
            pending: self
                .pending
                .into_iter()
                .map(|(offset, attempts, last_reason)| PendingAttempt {
                    offset,
                    attempts,
                    last_reason,
                })
                .collect(),
            dead_lettered: self.dead_lettered,
            skipped: self.skipped,
            epoch: self.epoch,
            counts: GroupCounts::from_array(self.counts),
        }
    }
}

/// A [`Record`] on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireRecord {
    pub offset: u64,
    pub timestamp_ms: u64,
    pub headers: Headers,
    pub payload: Payload,
}

impl WireRecord {
    /// The record's encoded size, near enough to keep an answer under a frame's limit.
    pub fn size_hint(r: &Record) -> usize {
        let headers: usize = r.headers.iter().map(|(k, v)| k.len() + v.len() + 10).sum();
        32 + headers + r.payload.len()
    }

    /// Back to a [`Record`].
    pub fn into_record(self) -> Record {
        Record {
            offset: self.offset,
            timestamp_ms: self.timestamp_ms,
            headers: self.headers,
            payload: self.payload.0,
        }
    }
}

impl From<Record> for WireRecord {
    fn from(r: Record) -> WireRecord {
        WireRecord {
            offset: r.offset,
            timestamp_ms: r.timestamp_ms,
            headers: r.headers,
            payload: Payload(r.payload),
        }
    }
}

/// [`SnapshotInfo`] on the wire.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireSnapshotInfo {
    pub topics: u64,
    pub groups: u64,
    pub bytes: u64,
    pub linked_bytes: u64,
    pub copied_bytes: u64,
    pub linked_files: u64,
    pub copied_files: u64,
}

impl From<&SnapshotInfo> for WireSnapshotInfo {
    fn from(s: &SnapshotInfo) -> WireSnapshotInfo {
        WireSnapshotInfo {
            topics: s.topics as u64,
            groups: s.groups as u64,
            bytes: s.bytes,
            linked_bytes: s.linked_bytes,
            copied_bytes: s.copied_bytes,
            linked_files: s.linked_files as u64,
            copied_files: s.copied_files as u64,
        }
    }
}

impl WireSnapshotInfo {
    /// Back to a [`SnapshotInfo`].
    pub fn into_info(self) -> SnapshotInfo {
        SnapshotInfo {
            topics: to_usize(self.topics),
            groups: to_usize(self.groups),
            bytes: self.bytes,
            linked_bytes: self.linked_bytes,
            copied_bytes: self.copied_bytes,
            linked_files: to_usize(self.linked_files),
            copied_files: to_usize(self.copied_files),
        }
    }
}

pub(super) fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// A frame the other side sent that this side cannot take.
pub fn protocol_error(what: impl Into<String>) -> Error {
    Error::io(
        "talking to the admin endpoint",
        std::io::Error::new(std::io::ErrorKind::InvalidData, what.into()),
    )
}

/// Writes `msg` as one frame; a frame above [`MAX_FRAME_BYTES`] is refused, nothing written.
pub fn write_frame<W: Write, T: Serialize>(w: &mut W, msg: &T) -> std::io::Result<()> {
    let mut buf = vec![0u8; 4];
    // `InvalidInput` (here and below): nothing was written, the connection is still good.
    postcard::to_io(msg, &mut buf)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let len = buf.len() - 4;
    if len > MAX_FRAME_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "a frame of {len} bytes is larger than the admin endpoint's limit ({MAX_FRAME_BYTES})"
            ),
        ));
    }
    buf[..4].copy_from_slice(&(len as u32).to_le_bytes());
    w.write_all(&buf)?;
    w.flush()
}

/// What reading a frame can end in besides a frame.
#[derive(Debug)]
pub enum FrameError {
    /// The other side closed the connection before a frame's first byte.
    Closed,
    /// The length prefix is above the limit; nothing was read past it.
    TooLarge(u64),
    /// A read failed or timed out, or the connection closed inside a frame.
    Io(std::io::Error),
}

/// Reads one frame's body. The body is read as it arrives (never allocated up front from
/// the prefix), so a peer that announces much and sends little costs little.
pub fn read_frame<R: Read>(r: &mut R) -> std::result::Result<Vec<u8>, FrameError> {
    read_frame_up_to(r, MAX_FRAME_BYTES)
}

/// The largest hello a client may send: a hello is a few dozen bytes, and before it no
/// client has shown it speaks the protocol (so none may make the owner buffer 64 MiB).
pub const MAX_HELLO_BYTES: usize = 1024;

/// [`read_frame`] with a smaller limit than [`MAX_FRAME_BYTES`] (the hello's).
pub fn read_frame_up_to<R: Read>(
    r: &mut R,
    max: usize,
) -> std::result::Result<Vec<u8>, FrameError> {
    let len = read_frame_len(r, max)?;
    read_frame_body(r, len)
}

/// A frame's length prefix, checked against `max` (and [`MAX_FRAME_BYTES`]) before
/// anything past it is read.
pub fn read_frame_len<R: Read>(r: &mut R, max: usize) -> std::result::Result<u64, FrameError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Err(FrameError::Closed),
            Ok(0) => return Err(FrameError::Io(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let len = u64::from(u32::from_le_bytes(len));
    if len > max.min(MAX_FRAME_BYTES) as u64 {
        return Err(FrameError::TooLarge(len));
    }
    Ok(len)
}

/// The `len` bytes of a frame's body, read as they arrive.
pub fn read_frame_body<R: Read>(r: &mut R, len: u64) -> std::result::Result<Vec<u8>, FrameError> {
    let mut body = Vec::new();
    r.take(len).read_to_end(&mut body).map_err(FrameError::Io)?;
    if body.len() as u64 != len {
        return Err(FrameError::Io(std::io::ErrorKind::UnexpectedEof.into()));
    }
    Ok(body)
}

/// Decodes a whole frame body as `T`; trailing bytes are garbage too.
pub fn decode<'a, T: Deserialize<'a>>(body: &'a [u8]) -> std::result::Result<T, String> {
    match postcard::take_from_bytes::<T>(body) {
        Ok((v, [])) => Ok(v),
        Ok((_, rest)) => Err(format!("{} bytes after the message", rest.len())),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by review: a hello could be a 64 MiB frame, buffered before the client had
    /// shown it speaks the protocol. A hello frame above `MAX_HELLO_BYTES` is refused
    /// from its length alone; a real hello fits.
    #[test]
    fn a_hello_frame_is_small() {
        let mut hello = Vec::new();
        write_frame(&mut hello, &Hello::current()).expect("write");
        assert!(read_frame_up_to(&mut &hello[..], MAX_HELLO_BYTES).is_ok());
        let mut big = (MAX_HELLO_BYTES as u32 + 1).to_le_bytes().to_vec();
        big.resize(4 + MAX_HELLO_BYTES + 1, 0);
        let r = read_frame_up_to(&mut &big[..], MAX_HELLO_BYTES);
        assert!(matches!(r, Err(FrameError::TooLarge(n)) if n == MAX_HELLO_BYTES as u64 + 1));
    }

    #[test]
    fn frames_round_trip_and_bounds_hold_before_reading() {
        let mut buf = Vec::new();
        let req = Request::GroupInfo {
            topic: "t".into(),
            group: "g".into(),
        };
        write_frame(&mut buf, &req).expect("write");
        let body = read_frame(&mut &buf[..]).expect("read");
        assert_eq!(decode::<Request>(&body), Ok(req));
        assert!(matches!(read_frame(&mut &[][..]), Err(FrameError::Closed)));
        let huge = u32::MAX.to_le_bytes();
        assert!(matches!(
            read_frame(&mut &huge[..]),
            Err(FrameError::TooLarge(n)) if n == u64::from(u32::MAX)
        ));
        let short = [9, 0, 0, 0, 1];
        assert!(matches!(
            read_frame(&mut &short[..]),
            Err(FrameError::Io(_))
        ));
        assert!(
            decode::<Request>(&[0, 7]).is_err(),
            "trailing bytes are garbage"
        );
        assert!(
            decode::<Request>(&[200]).is_err(),
            "an unknown variant is garbage"
        );
    }

    #[test]
    fn times_and_errors_come_back_as_they_left() {
        let t = UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
        let back = WireReset::from(OffsetReset::Time(t)).into_reset();
        assert_eq!(back, OffsetReset::Time(t));
        let e = Error::NotAtCursor {
            expected: 4,
            actual: 9,
        };
        let back = WireError::from(&e).into_error();
        assert!(matches!(
            back,
            Error::NotAtCursor {
                expected: 4,
                actual: 9
            }
        ));
        let e = Error::io("writing x", std::io::ErrorKind::StorageFull.into());
        match WireError::from(&e).into_error() {
            Error::Io { source, .. } => assert_eq!(source.kind(), std::io::ErrorKind::StorageFull),
            other => panic!("{other:?}"),
        }
        let bad = Error::InvalidTopicName {
            name: "a/b".into(),
            reason: "contains a character outside [A-Za-z0-9._-]",
        };
        assert!(matches!(
            WireError::from(&bad).into_error(),
            Error::InvalidTopicName { .. }
        ));
    }
}
