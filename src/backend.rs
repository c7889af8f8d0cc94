//! The seam between the public handles and an engine.
//!
//! [`Spool`](crate::Spool), [`Consumer`](crate::Consumer) and
//! [`Delivery`](crate::Delivery) hold one of the enums below and forward each call to it.
//! Today there is one backend, `Embedded` (`runtime/` over `queue/`, `log/` and
//! `catalog/`). A second one (`Mode=Kafka`, or an admin client of a live instance) is a new
//! variant in each enum, a new arm in each forwarding `match`, and a module of its own
//! beside `runtime/`: nothing in `queue/` or `log/` changes.
//!
//! **Why enums, not trait objects:** the calls are `async` and on the hot path. A match
//! on an enum is static dispatch with no boxed future per call; a `dyn` trait would box
//! every `publish`, `recv` and `ack` future.
//!
//! **Invariant:** the public handles know no backend's internals; a backend never sees
//! the public handles (it returns its own consumer and delivery types, which the handles
//! wrap).

use crate::error::Result;
use crate::io::Fs;
use crate::options::{Mode, Options};
use crate::runtime::{Embedded, EmbeddedConsumer, EmbeddedDelivery};

pub(crate) use crate::runtime::ConsumerConfig;

/// The engine behind a [`Spool`](crate::Spool).
#[derive(Clone, Debug)]
pub(crate) enum Backend {
    /// The data directory, in this process.
    Embedded(Embedded),
}

impl Backend {
    /// Opens the backend `options.mode` names, on `fs` where the mode uses local files.
    pub(crate) fn open(fs: Fs, options: Options) -> Result<Backend> {
        match options.mode {
            Mode::Embedded => Ok(Backend::Embedded(Embedded::open_on(fs, options)?)),
        }
    }

    /// A consumer of `topic` in `group` on this backend.
    pub(crate) fn consumer(
        &self,
        topic: &str,
        group: &str,
        cfg: ConsumerConfig,
    ) -> Result<ConsumerBackend> {
        match self {
            Backend::Embedded(e) => Ok(ConsumerBackend::Embedded(EmbeddedConsumer::build(
                e.clone(),
                topic,
                group,
                cfg,
            )?)),
        }
    }
}

/// The backend's consumer behind a [`Consumer`](crate::Consumer).
#[derive(Debug)]
pub(crate) enum ConsumerBackend {
    /// A consumer of the embedded engine.
    Embedded(EmbeddedConsumer),
}

/// The backend's delivery behind a [`Delivery`](crate::Delivery).
#[derive(Debug)]
pub(crate) enum DeliveryBackend {
    /// A delivery of the embedded engine.
    Embedded(EmbeddedDelivery),
}
