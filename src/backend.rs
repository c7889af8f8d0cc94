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

#[cfg(feature = "kafka")]
pub(crate) use crate::kafka::{Kafka, KafkaConsumer, KafkaDelivery};
pub(crate) use crate::runtime::ConsumerConfig;

/// The engine behind a [`Spool`](crate::Spool).
#[derive(Clone, Debug)]
pub(crate) enum Backend {
    /// The data directory, in this process.
    Embedded(Embedded),
    /// A Kafka cluster (`Mode=Kafka`, cargo feature `kafka`).
    #[cfg(feature = "kafka")]
    Kafka(Kafka),
}

impl Backend {
    /// Opens the backend `options.mode` names, on `fs` where the mode uses local files.
    pub(crate) fn open(fs: Fs, options: Options) -> Result<Backend> {
        match options.mode {
            Mode::Embedded => Ok(Backend::Embedded(Embedded::open_on(fs, options)?)),
            #[cfg(feature = "kafka")]
            Mode::Kafka => Ok(Backend::Kafka(Kafka::open(options)?)),
            #[cfg(not(feature = "kafka"))]
            Mode::Kafka => Err(crate::error::Error::Unsupported {
                what: "Mode=Kafka needs spool built with its cargo feature `kafka`".to_owned(),
            }),
        }
    }

    /// The embedded engine, for a call only it serves; under `Mode=Kafka`, `Unsupported`
    /// naming the call.
    #[cfg_attr(not(feature = "kafka"), allow(unused_variables))]
    pub(crate) fn embedded(&self, call: &str) -> Result<&Embedded> {
        match self {
            Backend::Embedded(e) => Ok(e),
            #[cfg(feature = "kafka")]
            Backend::Kafka(_) => Err(crate::kafka::unsupported(call)),
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
            #[cfg(feature = "kafka")]
            Backend::Kafka(k) => {
                // The builder's deadline wins over the key's; zero is none.
                let key = std::time::Duration::from_millis(k.options().ack_deadline_ms);
                let settings = crate::kafka::Settings {
                    manual_ack: cfg.manual_ack,
                    max_in_flight: cfg.max_in_flight,
                    ack_deadline: Some(cfg.ack_deadline.unwrap_or(key)).filter(|d| !d.is_zero()),
                    key_ordered: cfg.key_ordered,
                };
                Ok(ConsumerBackend::Kafka(KafkaConsumer::build(
                    k, topic, group, settings,
                )?))
            }
        }
    }
}

/// The backend's consumer behind a [`Consumer`](crate::Consumer).
#[derive(Debug)]
pub(crate) enum ConsumerBackend {
    /// A consumer of the embedded engine.
    Embedded(EmbeddedConsumer),
    /// A consumer of a Kafka cluster.
    #[cfg(feature = "kafka")]
    Kafka(KafkaConsumer),
}

/// The backend's delivery behind a [`Delivery`](crate::Delivery).
#[derive(Debug)]
pub(crate) enum DeliveryBackend {
    /// A delivery of the embedded engine.
    Embedded(EmbeddedDelivery),
    /// A delivery from a Kafka cluster.
    #[cfg(feature = "kafka")]
    Kafka(KafkaDelivery),
}
