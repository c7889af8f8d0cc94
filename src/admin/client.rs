//! [`Client`]: the command line's way into a live instance. Blocking std I/O with
//! time-outs; the methods mirror [`Spool`](crate::Spool)'s names and return types.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::protocol::{
    FrameError, Hello, Payload, Request, Response, WireBatch, WireError, WireTopicConfig, decode,
    protocol_error, read_frame, write_frame,
};
use super::server::IDLE_TIMEOUT;
use super::socket_path;
use super::wire_batch::MAX_BATCH_ITEMS;
use crate::error::{Error, Result};
use crate::format::Headers;
use crate::format::record::Record;
use crate::io::private;
use crate::queue::{GroupInfo, OffsetReset, SnapshotInfo, TopicConfig, TopicInfo, VerifyReport};

/// How long a call waits for the owner's answer, unless [`Client::set_timeout`] says
/// otherwise. A snapshot waits at least [`SNAPSHOT_TIMEOUT`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a snapshot through the owner may take.
pub const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(3600);
/// How long connecting (the hello and its answer) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection to the admin endpoint of the instance that owns a data directory: each
/// call runs in the owner, so a consumer there sees a reset on its next `recv`.
///
/// One connection, one call at a time (calls from several threads take turns). A client
/// idle for longer than the owner keeps a silent connection, or whose last exchange
/// failed (a time-out, a closed connection), reconnects by itself before its next call;
/// if nobody serves the directory any more, that call fails.
#[derive(Debug)]
pub struct Client {
    conn: Mutex<Conn>,
    /// The data directory, canonical.
    dir: PathBuf,
    socket: PathBuf,
    server_version: String,
}

#[derive(Debug)]
struct Conn {
    stream: UnixStream,
    timeout: Duration,
    broken: bool,
    /// When the last answer came: a connection idle for near the owner's idle time-out
    /// is replaced before the next call rather than found closed by it.
    last: Instant,
}

/// A connection idle this long is replaced before its next call (the owner closes one
/// idle for `IDLE_TIMEOUT`).
const REDIAL_AFTER: Duration = IDLE_TIMEOUT.saturating_sub(Duration::from_secs(5));

/// Connects to `socket` and says hello: the stream and the owner's version, or `None`
/// when nobody serves there (a dead owner's socket) or the owner is closing.
fn dial(dir: &Path, socket: &Path) -> Result<Option<(UnixStream, String)>> {
    let ctx = || format!("connecting to the admin endpoint {}", socket.display());
    if private::is_socket(socket) && !private::is_own_socket(socket) {
        return Err(transport(
            ctx(),
            std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "the socket belongs to another user: not talking to it",
            ),
        ));
    }
    let stream = match UnixStream::connect(socket) {
        Ok(s) => s,
        Err(e) => {
            use std::io::ErrorKind as K;
            return match e.kind() {
                K::NotFound | K::ConnectionRefused => Ok(None),
                _ => Err(transport(ctx(), e)),
            };
        }
    };
    stream
        .set_read_timeout(Some(CONNECT_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(CONNECT_TIMEOUT)))
        .map_err(|e| transport(ctx(), e))?;
    refused_or(write_frame(&mut &stream, &Hello::current())).map_err(|e| transport(ctx(), e))?;
    let body = match read_frame(&mut &stream) {
        Ok(b) => b,
        // Accepted, then closed unanswered: the owner is closing.
        Err(FrameError::Closed) => return Ok(None),
        Err(e) => return Err(frame_error(ctx(), e)),
    };
    let (served, server_version) = match decode::<Response>(&body) {
        Ok(Response::Hello {
            data_dir, server, ..
        }) => (data_dir, server),
        Ok(Response::Error(e)) => return Err(e.into_error()),
        Ok(other) => return Err(protocol_error(format!("a hello answered with {other:?}"))),
        Err(e) => return Err(protocol_error(format!("an undecodable hello ({e})"))),
    };
    if served != dir {
        return Err(protocol_error(format!(
            "the socket {} serves {}, not {}",
            socket.display(),
            served.display(),
            dir.display()
        )));
    }
    Ok(Some((stream, server_version)))
}

/// A write's result, with a broken pipe taken as "read the answer": an owner that is
/// busy or closing may refuse and close before the frame is written (a hello, or a
/// large request over its in-flight budget), and its answer is still there to read.
fn refused_or(written: std::io::Result<()>) -> std::io::Result<()> {
    use std::io::ErrorKind as K;
    match written {
        Err(e) if matches!(e.kind(), K::BrokenPipe | K::ConnectionReset) => Ok(()),
        other => other,
    }
}

fn transport(context: String, e: std::io::Error) -> Error {
    Error::io(context, e)
}

impl Client {
    /// Connects to the owner of `data_dir`. `Ok(None)` when no instance serves it: the
    /// directory or its socket does not exist, or nobody listens there (a dead owner's
    /// socket), or the owner is closing. Then the caller may open the directory itself.
    /// An owner opened with `Admin=Off` serves no socket: `Ok(None)` too, and its open
    /// then fails with `Error::Locked`.
    pub fn connect(data_dir: impl AsRef<Path>) -> Result<Option<Client>> {
        let Some(dir) = private::canonical(data_dir.as_ref()) else {
            return Ok(None);
        };
        let Some(socket) = socket_path::find(&dir)? else {
            return Ok(None);
        };
        let Some((stream, server_version)) = dial(&dir, &socket)? else {
            return Ok(None);
        };
        Ok(Some(Client {
            conn: Mutex::new(Conn {
                stream,
                timeout: DEFAULT_TIMEOUT,
                broken: false,
                last: Instant::now(),
            }),
            dir,
            socket,
            server_version,
        }))
    }

    /// The socket this client talks to.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// The owner's crate version.
    pub fn server_version(&self) -> &str {
        &self.server_version
    }

    /// How long later calls wait for an answer (default [`DEFAULT_TIMEOUT`]).
    pub fn set_timeout(&self, timeout: Duration) {
        self.lock().timeout = timeout.max(Duration::from_millis(1));
    }

    fn lock(&self) -> MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends `request` and returns the owner's answer (its error rebuilt as an `Err`).
    fn call(&self, request: &Request, at_least: Duration) -> Result<Response> {
        let mut conn = self.lock();
        let ctx = || format!("talking to the admin endpoint {}", self.socket.display());
        // A connection that failed (a time-out, an owner that restarted) or sat idle for
        // near the owner's idle time-out is replaced before this call; the call that saw
        // the failure is never sent again.
        if conn.broken || conn.last.elapsed() >= REDIAL_AFTER {
            match dial(&self.dir, &self.socket)? {
                Some((stream, _)) => {
                    conn.stream = stream;
                    conn.broken = false;
                }
                None => {
                    conn.broken = true;
                    let gone = "the owner no longer serves the directory (it closed)";
                    return Err(transport(
                        ctx(),
                        std::io::Error::new(std::io::ErrorKind::NotConnected, gone),
                    ));
                }
            }
        }
        let t = conn.timeout.max(at_least);
        let stream = &conn.stream;
        let set = stream
            .set_read_timeout(Some(t))
            .and_then(|()| stream.set_write_timeout(Some(t)));
        let sent = set.and_then(|()| refused_or(write_frame(&mut &*stream, request)));
        let got = match sent {
            // Too large to send: nothing was written, the connection is still good.
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                return Err(transport(ctx(), e));
            }
            Err(e) => Err(transport(ctx(), e)),
            Ok(()) => read_frame(&mut &*stream).map_err(|e| frame_error(ctx(), e)),
        };
        let answer = got.and_then(|body| {
            decode::<Response>(&body)
                .map_err(|e| protocol_error(format!("an undecodable answer ({e})")))
        });
        conn.last = Instant::now();
        match answer {
            Ok(Response::Error(e)) => {
                // The owner's refusals (busy, too large, not understood) close the
                // connection after them: the next call connects again.
                conn.broken |= matches!(e, WireError::Unsupported { .. });
                Err(e.into_error())
            }
            Ok(r) => Ok(r),
            Err(e) => {
                conn.broken = true;
                Err(e)
            }
        }
    }

    /// Every topic, sorted by name.
    pub fn topics(&self) -> Result<Vec<String>> {
        match self.call(&Request::Topics, Duration::ZERO)? {
            Response::Names(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }

    /// The topic's offsets, size and segment count (see [`crate::Spool::topic_info`]).
    pub fn topic_info(&self, topic: &str) -> Result<TopicInfo> {
        crate::names::check(topic)?;
        let r = Request::TopicInfo {
            topic: topic.into(),
        };
        match self.call(&r, Duration::ZERO)? {
            Response::TopicInfo(t) => t.into_info(),
            other => Err(unexpected(other)),
        }
    }

    /// The groups with durable state on `topic`, sorted by name.
    pub fn groups(&self, topic: &str) -> Result<Vec<String>> {
        crate::names::check(topic)?;
        let r = Request::Groups {
            topic: topic.into(),
        };
        match self.call(&r, Duration::ZERO)? {
            Response::Names(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }

    /// The group's cursor, lag, deliveries out and attempts (see [`crate::Spool::group_info`]).
    pub fn group_info(&self, topic: &str, group: &str) -> Result<GroupInfo> {
        check_both(topic, group)?;
        let r = Request::GroupInfo {
            topic: topic.into(),
            group: group.into(),
        };
        match self.call(&r, Duration::ZERO)? {
            Response::GroupInfo(g) => Ok(g.into_info()),
            other => Err(unexpected(other)),
        }
    }

    /// Moves the group's cursor in the owner; returns the new cursor. A consumer of the
    /// group running there sees it on its next `recv`.
    pub fn reset_offset(&self, topic: &str, group: &str, to: OffsetReset) -> Result<u64> {
        check_both(topic, group)?;
        let r = Request::ResetOffset {
            topic: topic.into(),
            group: group.into(),
            to: to.into(),
        };
        offset(self.call(&r, Duration::ZERO)?)
    }

    /// Reads up to `max_records` from `from` (clamped to the earliest). The owner may
    /// return fewer to keep its answer under `MAX_FRAME_BYTES` (64 MiB): read on from
    /// the last offset + 1.
    pub fn fetch(&self, topic: &str, from: u64, max_records: usize) -> Result<Vec<Record>> {
        crate::names::check(topic)?;
        let r = Request::Fetch {
            topic: topic.into(),
            from,
            max_records: max_records as u64,
        };
        match self.call(&r, Duration::ZERO)? {
            Response::Records(rs) => Ok(rs.into_iter().map(|r| r.into_record()).collect()),
            other => Err(unexpected(other)),
        }
    }

    /// Appends one message in the owner; returns its offset (the original one on a
    /// de-duplication hit).
    pub fn publish(
        &self,
        topic: &str,
        payload: impl Into<Bytes>,
        headers: &Headers,
    ) -> Result<u64> {
        let offsets = self.publish_batch(topic, vec![(payload.into(), headers.clone())])?;
        offsets
            .first()
            .copied()
            .ok_or_else(|| protocol_error("a publish answered with no offset"))
    }

    /// Appends messages in one write in the owner; all or nothing. A batch larger than a
    /// frame (64 MiB), or of more than `MAX_BATCH_ITEMS` messages and headers, is
    /// refused here, and nothing is sent.
    pub fn publish_batch<P: Into<Bytes>>(
        &self,
        topic: &str,
        messages: Vec<(P, Headers)>,
    ) -> Result<Vec<u64>> {
        crate::names::check(topic)?;
        let messages = WireBatch(
            messages
                .into_iter()
                .map(|(p, h)| (Payload(p.into()), h))
                .collect(),
        );
        let items = messages.items();
        if items > MAX_BATCH_ITEMS {
            let what = format!(
                "a batch of {items} messages and headers is more than one request carries ({MAX_BATCH_ITEMS}); split it"
            );
            let e = std::io::Error::new(std::io::ErrorKind::InvalidInput, what);
            return Err(transport(
                format!("publishing to {topic} through the owner"),
                e,
            ));
        }
        let r = Request::PublishBatch {
            topic: topic.into(),
            messages,
        };
        match self.call(&r, Duration::ZERO)? {
            Response::Offsets(o) => Ok(o),
            other => Err(unexpected(other)),
        }
    }

    /// Forgets a group in the owner (see [`crate::Spool::delete_group`]); fails with
    /// `GroupInUse` while a consumer of it is open there.
    pub fn delete_group(&self, topic: &str, group: &str) -> Result<()> {
        check_both(topic, group)?;
        let r = Request::DeleteGroup {
            topic: topic.into(),
            group: group.into(),
        };
        done(self.call(&r, Duration::ZERO)?)
    }

    /// Deletes the records before `offset` in the owner; returns the new earliest
    /// (see [`crate::Spool::delete_records_before`]).
    pub fn delete_records_before(&self, topic: &str, offset_before: u64) -> Result<u64> {
        crate::names::check(topic)?;
        let r = Request::DeleteRecordsBefore {
            topic: topic.into(),
            offset: offset_before,
        };
        offset(self.call(&r, Duration::ZERO)?)
    }

    /// Sets `topic`'s retention overrides in the owner (see [`crate::Spool::set_topic_config`]).
    pub fn set_topic_config(&self, topic: &str, config: TopicConfig) -> Result<()> {
        crate::names::check(topic)?;
        let r = Request::SetTopicConfig {
            topic: topic.into(),
            config: WireTopicConfig::from(&config),
        };
        done(self.call(&r, Duration::ZERO)?)
    }

    /// Makes the owner copy the instance into `dest` (see [`crate::Spool::snapshot`]). A
    /// relative `dest` is taken from this process's working directory, not the owner's.
    pub fn snapshot(&self, dest: impl AsRef<Path>) -> Result<SnapshotInfo> {
        let dest = std::path::absolute(dest.as_ref())
            .map_err(|e| transport(format!("resolving {}", dest.as_ref().display()), e))?;
        match self.call(&Request::Snapshot { dest }, SNAPSHOT_TIMEOUT)? {
            Response::Snapshot(s) => Ok(s.into_info()),
            other => Err(unexpected(other)),
        }
    }

    /// Has the owner read every record, index entry and catalog row back (see
    /// [`crate::Spool::verify`]); read-only. Bounded by the snapshot's time-out: it reads
    /// every log.
    pub fn verify(&self, topic: Option<&str>) -> Result<VerifyReport> {
        let topic = topic.map(str::to_owned);
        match self.call(&Request::Verify { topic }, SNAPSHOT_TIMEOUT)? {
            Response::Verify(r) => Ok(r),
            other => Err(unexpected(other)),
        }
    }

    /// The owner's metrics (see [`crate::Spool::metrics`]), in one call.
    pub fn metrics(&self) -> Result<crate::queue::Metrics> {
        match self.call(&Request::Metrics, Duration::ZERO)? {
            Response::Metrics(m) => m.into_metrics(),
            other => Err(unexpected(other)),
        }
    }

    /// Applies retention in the owner now.
    pub fn apply_retention(&self) -> Result<()> {
        done(self.call(&Request::ApplyRetention, Duration::ZERO)?)
    }
}

fn check_both(topic: &str, group: &str) -> Result<()> {
    crate::names::check(topic)?;
    crate::names::check(group)
}

fn offset(r: Response) -> Result<u64> {
    match r {
        Response::Offset(o) => Ok(o),
        other => Err(unexpected(other)),
    }
}

fn done(r: Response) -> Result<()> {
    match r {
        Response::Done => Ok(()),
        other => Err(unexpected(other)),
    }
}

fn unexpected(r: Response) -> Error {
    let mut what = format!("{r:?}");
    if what.len() > 200 {
        let mut end = 200;
        while !what.is_char_boundary(end) {
            end -= 1;
        }
        what.truncate(end);
    }
    protocol_error(format!("an answer of the wrong kind: {what}"))
}

fn frame_error(context: String, e: FrameError) -> Error {
    match e {
        FrameError::Closed => transport(
            context,
            std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the owner closed the connection",
            ),
        ),
        FrameError::TooLarge(n) => {
            protocol_error(format!("an answer of {n} bytes, above the limit"))
        }
        FrameError::Io(e) => transport(context, e),
    }
}
