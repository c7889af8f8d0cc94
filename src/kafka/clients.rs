//! librdkafka configurations: the user's `Kafka.<property>` pass-through, then the
//! properties spool's promises rest on, which nothing overrides (options/kafka.rs refuses
//! them in the connection string).

use rdkafka::ClientConfig;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::FromClientConfigAndContext;
use rdkafka::consumer::BaseConsumer;
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureProducer;

use super::group::GroupContext;
use crate::error::{Error, Result};
use crate::options::Options;

/// The user's properties over the bootstrap servers.
fn base(o: &Options) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &o.bootstrap_servers);
    for (k, v) in &o.kafka_properties {
        c.set(k, v);
    }
    c
}

/// The producer: idempotent, `acks=all`.
pub(super) fn producer(o: &Options) -> Result<FutureProducer> {
    let mut c = base(o);
    if c.get("message.max.bytes").is_none() {
        c.set("message.max.bytes", message_max_bytes(o));
    }
    // `Kafka Timeout Ms` bounds a publish too (librdkafka's default is 5 minutes).
    if c.get("message.timeout.ms").is_none() {
        c.set("message.timeout.ms", o.kafka_timeout_ms.to_string());
    }
    c.set("enable.idempotence", "true").set("acks", "all");
    create(&c, |c| c.create())
}

/// An admin client: creating a missing dead-letter topic.
pub(super) fn admin(o: &Options) -> Result<AdminClient<DefaultClientContext>> {
    create(&base(o), |c| c.create())
}

/// A reader without a group: metadata, watermarks, `fetch`.
pub(super) fn reader(o: &Options) -> Result<BaseConsumer> {
    let mut c = consumer_config(o);
    c.set("group.id", "spool-reader-without-group");
    create(&c, |c| c.create())
}

/// A member of `group`: commits only what spool commits.
pub(super) fn member(
    o: &Options,
    group: &str,
    context: GroupContext,
) -> Result<BaseConsumer<GroupContext>> {
    let mut c = consumer_config(o);
    c.set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest");
    create(&c, |c| BaseConsumer::from_config_and_context(c, context))
}

fn consumer_config(o: &Options) -> ClientConfig {
    let mut c = base(o);
    c.set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "false");
    c
}

/// Room for the largest record spool accepts, its headers and Kafka's framing.
fn message_max_bytes(o: &Options) -> String {
    let framing = 64 * 1024;
    (o.max_message_bytes + o.max_header_bytes + framing)
        .clamp(1000, 1_000_000_000)
        .to_string()
}

/// Creates a client; a property librdkafka refuses is `InvalidConnectionString` naming
/// it as the connection string wrote it.
fn create<T>(
    c: &ClientConfig,
    f: impl FnOnce(&ClientConfig) -> Result<T, KafkaError>,
) -> Result<T> {
    f(c).map_err(|e| match e {
        KafkaError::ClientConfig(_, desc, key, _) => Error::InvalidConnectionString {
            key: format!("Kafka.{key}"),
            reason: desc,
        },
        // Properties each valid, refused together (librdkafka names none of them).
        KafkaError::ClientCreation(reason) => Error::InvalidConnectionString {
            key: "Kafka.*".to_owned(),
            reason,
        },
        other => Error::Kafka {
            context: "creating a Kafka client".to_owned(),
            detail: other.to_string(),
        },
    })
}
