//! The owner's side: a listener on the data directory's socket, served by one thread
//! (`spool-admin`) that accepts and a short-lived thread per connection
//! (`spool-admin-conn`) that reads requests and answers them.
//!
//! **Who:** the socket is owner-only (0600); a peer of another user (`SO_PEERCRED`), which
//! only a changed mode lets connect, is refused all the same. Root is served.
//!
//! **Bounds** (so that no client can stall the owner; each bound is a named constant):
//! - at most [`MAX_CONNECTIONS`] at once; one more is answered "busy" and closed;
//! - the hello within [`HELLO_TIMEOUT`], each later request within [`IDLE_TIMEOUT`], and
//!   each write within [`WRITE_TIMEOUT`]; a client past one is closed;
//! - a length prefix above `MAX_FRAME_BYTES` is answered with an error and closed, before
//!   any of it is read; an undecodable frame (garbage) likewise;
//! - the large requests held at once, over all connections, take at most
//!   [`MAX_INFLIGHT_BYTES`]; a frame that would pass it is answered "busy" and closed
//!   before its body is read (a publish's decoding is bounded too: `wire_batch.rs`).
//!
//! The threads hold no lock of the instance while they wait on a client: a request is
//! handed to the [`Handler`] (the instance) only once it is whole, so publishers and
//! consumers never wait for a slow or hostile client.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::protocol::{
    FrameError, Hello, MAX_FRAME_BYTES, MAX_HELLO_BYTES, PROTOCOL_VERSION, Request, Response,
    WireError, decode, read_frame_body, read_frame_len, write_frame,
};
use super::socket_path::{self, Placement};
use super::wire_batch::MAX_BATCH_ITEMS;
use crate::error::{Error, Result};
use crate::io::private;

/// Connections served at once; more are answered "busy".
pub const MAX_CONNECTIONS: usize = 16;
/// A client must send its hello this soon after connecting.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// A client must send its next request (whole) this soon after the last answer.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Each write of an answer must go through this soon.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of large requests held at once over all connections. A request above
/// [`SMALL_FRAME_BYTES`] takes [`held_for`] its frame's length (the frame, the payloads
/// decoded from it, and the structures of its messages and headers) from when its length
/// is read until it is answered: two requests of the largest frame fit at once.
pub const MAX_INFLIGHT_BYTES: usize = 2 * held_for(MAX_FRAME_BYTES);

/// What one decoded message or header costs in memory beyond its bytes (a map entry, two
/// `String`s, allocator overhead), for the budget.
const ITEM_BYTES: usize = 96;

/// The budget a frame of `len` bytes takes: its bytes twice, and the items it can hold
/// (at least 2 bytes each on the wire, at most `MAX_BATCH_ITEMS`).
pub const fn held_for(len: usize) -> usize {
    let items = if len / 2 < MAX_BATCH_ITEMS {
        len / 2
    } else {
        MAX_BATCH_ITEMS
    };
    2 * len + ITEM_BYTES * items
}
/// Frames up to this size take nothing from [`MAX_INFLIGHT_BYTES`] (at most
/// [`MAX_CONNECTIONS`] of them are held at once), so large requests never keep out a
/// `topics` or a `reset`.
pub const SMALL_FRAME_BYTES: usize = 64 << 10;

/// What answers the requests: the owning instance.
pub trait Handler: Send + Sync + 'static {
    /// Runs `request` on the instance. Called on a connection's thread, never while
    /// waiting on the client.
    fn handle(&self, request: Request) -> Response;
}

/// A running endpoint. Stops (and removes its files) on [`Server::stop`] or drop.
pub struct Server {
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
    placement: Placement,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("socket", &self.placement.socket)
            .finish_non_exhaustive()
    }
}

struct Shared {
    stop: AtomicBool,
    /// A second handle on each open connection, to shut it down on stop.
    conns: Mutex<HashMap<u64, UnixStream>>,
    next_id: AtomicU64,
    handler: Arc<dyn Handler>,
    data_dir: PathBuf,
    /// Bytes taken from [`MAX_INFLIGHT_BYTES`] by the requests held now.
    in_flight: AtomicUsize,
}

/// A request's share of [`MAX_INFLIGHT_BYTES`], given back on drop.
struct Held<'a> {
    from: &'a AtomicUsize,
    bytes: usize,
}

impl Shared {
    /// Takes `bytes` of the budget, or `None` if that would pass it.
    fn hold(&self, bytes: usize) -> Option<Held<'_>> {
        let fits = |taken: usize| {
            taken
                .checked_add(bytes)
                .filter(|&t| t <= MAX_INFLIGHT_BYTES)
        };
        let from = &self.in_flight;
        from.fetch_update(Ordering::AcqRel, Ordering::Acquire, fits)
            .ok()
            .map(|_| Held { from, bytes })
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.from.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Server {
    /// Serves `data_dir`. The caller holds the directory's lock, so a socket or pointer
    /// found there is a dead owner's, and is replaced.
    pub fn start(data_dir: &Path, handler: Arc<dyn Handler>) -> Result<Server> {
        let data_dir = private::canonical(data_dir).ok_or_else(|| {
            Error::io(
                format!("finding the data directory {}", data_dir.display()),
                std::io::ErrorKind::NotFound.into(),
            )
        })?;
        let runtime_dir = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|d| private::is_dir(d));
        let placement = socket_path::place(&data_dir, runtime_dir.as_deref());
        let listener = bind(&data_dir, &placement)?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            handler,
            data_dir,
            in_flight: AtomicUsize::new(0),
        });
        let sh = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name("spool-admin".into())
            .spawn(move || accept_loop(&listener, &sh));
        let mut server = Server {
            shared,
            acceptor: None,
            placement,
        };
        match acceptor {
            Ok(t) => server.acceptor = Some(t),
            Err(e) => {
                server.remove_files();
                return Err(Error::io("starting the admin endpoint's thread", e));
            }
        }
        Ok(server)
    }

    /// The socket's path.
    pub fn socket(&self) -> &Path {
        &self.placement.socket
    }

    /// Stops accepting, closes every connection and removes the socket (and pointer).
    /// A request being answered finishes on its own thread; its answer is not sent.
    pub fn stop(&mut self) {
        let Some(acceptor) = self.acceptor.take() else {
            return;
        };
        self.shared.stop.store(true, Ordering::SeqCst);
        // The acceptor waits in `accept`: a connection of our own wakes it. If that fails
        // it is left to end at its next connection (it holds nothing of the instance).
        let woke = UnixStream::connect(&self.placement.socket).is_ok();
        if woke && acceptor.thread().id() != std::thread::current().id() {
            let _ = acceptor.join();
        }
        for (_, c) in lock(&self.shared.conns).drain() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        self.remove_files();
    }

    fn remove_files(&self) {
        let p = &self.placement;
        for f in [Some(&p.socket), p.pointer.as_ref()].into_iter().flatten() {
            if let Err(e) = private::remove_file(f) {
                tracing::warn!(error = %e, "admin endpoint: could not remove its file");
            }
        }
        if let Some(d) = &p.private_dir {
            private::remove_empty_dir(d);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Clears a dead owner's files, binds owner-only, and writes the pointer if one is due.
fn bind(data_dir: &Path, p: &Placement) -> Result<UnixListener> {
    // The fallback directory checked first (ours, 0700, not a link): a stale socket is
    // removed only from a directory that is ours.
    if let Some(d) = &p.private_dir {
        private::private_dir(d)?;
    }
    let inside = data_dir.join(socket_path::SOCKET_FILE);
    for stale in [&inside, &p.socket] {
        if private::is_socket(stale) {
            private::remove_file(stale)?;
        }
    }
    private::remove_file(&data_dir.join(socket_path::POINTER_FILE))?;
    let listener = UnixListener::bind(&p.socket).map_err(|e| {
        Error::io(
            format!("binding the admin socket {}", p.socket.display()),
            e,
        )
    })?;
    // Linux asks for write permission on the socket to connect: until this line the
    // umask's bits apply (group and others have no write permission under the usual 022).
    private::set_owner_only(&p.socket)?;
    if let Some(pointer) = &p.pointer {
        let text = format!("{}\n", p.socket.display());
        if let Err(e) = private::write_small(pointer, &text) {
            let _ = private::remove_file(&p.socket);
            return Err(e);
        }
    }
    Ok(listener)
}

fn accept_loop(listener: &UnixListener, shared: &Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        match conn {
            Ok(stream) => admit(shared, stream),
            Err(e) => {
                // Out of descriptors, for example: wait a little rather than spin.
                tracing::warn!(error = %e, "admin endpoint: accept failed");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Starts a connection's thread, or answers "busy" when [`MAX_CONNECTIONS`] are open.
fn admit(shared: &Arc<Shared>, stream: UnixStream) {
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    if let Some(uid) = private::peer_uid(&stream).filter(|&u| !may_connect(u)) {
        // The socket is owner-only, so only a changed mode lets another user this far.
        tracing::warn!(uid, "admin endpoint: refused a connection of another user");
        let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
        let what = format!("the admin endpoint serves only its owner's user, not uid {uid}");
        return refuse(&stream, what);
    }
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    {
        let mut conns = lock(&shared.conns);
        if conns.len() >= MAX_CONNECTIONS {
            drop(conns);
            // A fresh socket's buffer takes this small frame without waiting.
            let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
            let busy =
                format!("the admin endpoint is busy ({MAX_CONNECTIONS} connections); try again");
            refuse(&stream, busy);
            return;
        }
        match stream.try_clone() {
            Ok(c) => conns.insert(id, c),
            Err(_) => return,
        };
    }
    let sh = shared.clone();
    let spawned = std::thread::Builder::new()
        .name("spool-admin-conn".into())
        .spawn(move || {
            // Its slot is given back however `serve` ends (a panic included).
            struct Slot<'a>(&'a Shared, u64);
            impl Drop for Slot<'_> {
                fn drop(&mut self) {
                    lock(&self.0.conns).remove(&self.1);
                }
            }
            let _slot = Slot(&sh, id);
            serve(&sh, &stream);
        });
    if spawned.is_err() {
        lock(&shared.conns).remove(&id);
    }
}

/// Whether a peer of user `uid` is served: the owner's user, or root (who may read the
/// data directory anyway).
fn may_connect(uid: u32) -> bool {
    uid == private::own_uid() || uid == 0
}

/// Answers with an error that says what went wrong; the caller then closes.
fn refuse(stream: &UnixStream, what: String) {
    let answer = Response::Error(WireError::Unsupported { what });
    let _ = write_frame(&mut &*stream, &answer);
}

/// Reads from a stream until `until`, whatever the number of reads it takes.
struct Deadline<'a> {
    stream: &'a UnixStream,
    until: Instant,
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        match (&*self.stream).read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                Err(std::io::ErrorKind::TimedOut.into())
            }
            r => r,
        }
    }
}

/// The next frame's body and its share of the budget (none for a small one), or `None`
/// after answering what went wrong (then close).
fn next_frame<'s>(
    shared: &'s Shared,
    stream: &UnixStream,
    within: Duration,
    max: usize,
) -> Option<(Vec<u8>, Option<Held<'s>>)> {
    let mut r = Deadline {
        stream,
        until: Instant::now() + within,
    };
    let read = read_frame_len(&mut r, max).and_then(|len| {
        let held = match len as usize > SMALL_FRAME_BYTES {
            false => None,
            true => match shared.hold(held_for(len as usize)) {
                Some(h) => Some(h),
                None => return Ok(None),
            },
        };
        read_frame_body(&mut r, len).map(|body| Some((body, held)))
    });
    match read {
        Ok(Some(frame)) => Some(frame),
        Ok(None) => {
            tracing::debug!("admin endpoint: refused a frame above the in-flight budget");
            let busy = "the admin endpoint is busy reading other large requests; try again";
            refuse(stream, busy.into());
            None
        }
        Err(FrameError::Closed) => None,
        Err(FrameError::TooLarge(n)) => {
            tracing::debug!(bytes = n, "admin endpoint: refused a frame above the limit");
            refuse(
                stream,
                format!("a frame of {n} bytes is larger than the limit ({max})"),
            );
            None
        }
        Err(FrameError::Io(e)) => {
            tracing::debug!(error = %e, "admin endpoint: closing a connection");
            if e.kind() == std::io::ErrorKind::TimedOut {
                refuse(stream, format!("no whole request within {within:?}"));
            }
            None
        }
    }
}

/// One connection: the hello, then requests until the client closes, errs or idles.
fn serve(shared: &Shared, stream: &UnixStream) {
    let Some((body, _)) = next_frame(shared, stream, HELLO_TIMEOUT, MAX_HELLO_BYTES) else {
        return;
    };
    match decode::<Hello>(&body) {
        Ok(h) if h.magic == super::protocol::MAGIC && h.version == PROTOCOL_VERSION => {}
        Ok(h) if h.magic == super::protocol::MAGIC => {
            let what = format!(
                "admin protocol version {} (this owner speaks {PROTOCOL_VERSION})",
                h.version
            );
            return refuse(stream, what);
        }
        _ => return refuse(stream, "not a spool admin client (bad hello)".into()),
    }
    let hello = Response::Hello {
        version: PROTOCOL_VERSION,
        server: env!("CARGO_PKG_VERSION").into(),
        data_dir: shared.data_dir.clone(),
    };
    if write_frame(&mut &*stream, &hello).is_err() {
        return;
    }
    // `_held` keeps the request's share of the budget until it is answered.
    while let Some((body, _held)) = next_frame(shared, stream, IDLE_TIMEOUT, MAX_FRAME_BYTES) {
        let request = match decode::<Request>(&body) {
            Ok(r) => r,
            Err(e) => return refuse(stream, format!("an undecodable request ({e})")),
        };
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        log(&request);
        let answer = shared.handler.handle(request);
        match write_frame(&mut &*stream, &answer) {
            Ok(()) => {}
            // Too large to send: nothing was written, so an error can go instead.
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                refuse(stream, format!("the answer is too large: {e}"));
            }
            Err(_) => return,
        }
    }
}

fn log(request: &Request) {
    let (kind, topic, group) = request.describe();
    if request.changes() {
        tracing::info!(request = kind, topic, group, "admin request");
    } else {
        tracing::debug!(request = kind, topic, group, "admin request");
    }
}
