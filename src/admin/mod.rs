//! The admin endpoint of a live instance (doc-hidden: the `spool` command line's way in).
//!
//! The instance that owns a data directory serves a Unix socket for it (`Admin=On`, the
//! default), so that the command line works while an application runs: reads are
//! answered by the owner, and changes are made by the owner, so a consumer running there
//! sees a reset on its next `recv`. With no owner running, [`Client::connect`] returns
//! `None` and the command line opens the directory itself.
//!
//! **Invariant:** the endpoint never stalls the owner. A request reaches the instance
//! only once it is whole; every wait on a client is bounded (`server.rs`); a client that
//! misbehaves loses its own connection and nothing else.
//!
//! Files, by role:
//! - `protocol.rs`: frames, the versioned `Request`/`Response` enums.
//! - `wire_error.rs`: `WireError`, an `Error` on the wire and back.
//! - `wire_batch.rs`: a publish's messages, decoded within a bound on their number.
//! - `wire_metrics.rs`: `Metrics` in one answer.
//! - `socket_path.rs`: where the socket lives (`<data>/admin.sock`, or elsewhere with a
//!   pointer when the path is too long for a socket address).
//! - `server.rs`: the owner's listener and connection threads, and their bounds.
//! - `client.rs`: [`Client`], blocking, with time-outs.
//!
//! Unix only, like the rest of the crate (`io/` reads and writes with
//! `std::os::unix::fs::FileExt`); a port elsewhere makes `Admin` a no-op there.
//!
//! The instance's side of each request (which `Embedded` call answers it) is
//! `runtime/admin.rs`: this module sits below `runtime/` and knows no instance.

mod client;
pub(crate) mod protocol;
pub(crate) mod server;
pub(crate) mod socket_path;
mod wire_batch;
mod wire_error;
mod wire_metrics;

pub use client::{CONNECT_TIMEOUT, Client, DEFAULT_TIMEOUT, SNAPSHOT_TIMEOUT};

/// The protocol's version and frame limit, for the command line's messages.
pub mod limits {
    pub use super::protocol::{MAX_FRAME_BYTES, PROTOCOL_VERSION};
    pub use super::server::{
        HELLO_TIMEOUT, IDLE_TIMEOUT, MAX_CONNECTIONS, MAX_INFLIGHT_BYTES, SMALL_FRAME_BYTES,
        WRITE_TIMEOUT,
    };
    pub use super::socket_path::{POINTER_FILE, SOCKET_FILE, SUN_PATH_MAX};
    pub use super::wire_batch::MAX_BATCH_ITEMS;
}
