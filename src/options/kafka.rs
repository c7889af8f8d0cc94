//! The connection string under `Mode=Kafka` (API.md, "Mode=Kafka"):
//! - `Bootstrap Servers` is required; `Kafka Timeout Ms` bounds a broker round trip.
//! - `Kafka.<property>=<value>` passes a librdkafka property to every client.
//! - Keys that only mean something for a local directory are refused by name.
//! - Properties spool's promises rest on are refused by name.
//!
//! Whether librdkafka knows a property and accepts its value is checked at `open`, by the
//! `kafka` backend: this module has no librdkafka to ask.

use super::{Mode, Options, bad};
use crate::error::Result;

/// Default `Kafka Timeout Ms`: a broker round trip of a call fails after 10 s.
pub const DEFAULT_KAFKA_TIMEOUT_MS: u64 = 10_000;

/// librdkafka properties a `Kafka.<property>` key may not set, and why. The first group
/// would weaken a promise (acks=all, idempotent produce, commits only after the effect,
/// no reading of aborted records); the second is spool's to set.
pub const REFUSED_KAFKA_PROPERTIES: &[(&str, &str)] = &[
    ("acks", "spool produces with acks=all"),
    ("request.required.acks", "spool produces with acks=all"),
    ("enable.idempotence", "spool's produce is idempotent"),
    ("enable.auto.commit", "spool commits only what was acked"),
    ("auto.commit.enable", "spool commits only what was acked"),
    (
        "enable.auto.offset.store",
        "spool stores only what was acked",
    ),
    ("isolation.level", "spool reads committed records only"),
    ("bootstrap.servers", "set it with `Bootstrap Servers`"),
    ("metadata.broker.list", "set it with `Bootstrap Servers`"),
    ("group.id", "the group is the consumer's group name"),
    (
        "transactional.id",
        "spool's produce is idempotent, not transactional",
    ),
    (
        "auto.offset.reset",
        "a new group starts at the earliest record, as in embedded mode",
    ),
    (
        "enable.partition.eof",
        "spool's consumers wait for records, not for the end",
    ),
];

/// Keys (as normalised by the parser) that only mean something for a local directory,
/// with the name an error shows.
const EMBEDDED_ONLY: &[(&str, &str)] = &[
    ("datasource", "Data Source"),
    ("sync", "Sync"),
    ("segmentbytes", "Segment Bytes"),
    ("indexintervalbytes", "Index Interval Bytes"),
    ("retentionbytes", "Retention Bytes"),
    ("retentionms", "Retention Ms"),
    ("retentionpolicy", "Retention Policy"),
    ("retentioncheckms", "Retention Check Ms"),
    ("admin", "Admin"),
];

/// Keys (normalised) that only mean something under `Mode=Kafka`.
const KAFKA_ONLY: &[(&str, &str)] = &[
    ("bootstrapservers", "Bootstrap Servers"),
    ("kafkatimeoutms", "Kafka Timeout Ms"),
];

/// The librdkafka property a `Kafka.<property>` key names, if `key` is one.
pub(super) fn property_name(key: &str) -> Option<&str> {
    let (prefix, rest) = key.split_at_checked(6)?;
    prefix.eq_ignore_ascii_case("kafka.").then_some(rest)
}

/// Records `Kafka.<property>=<value>`, refusing an empty name, a repeat and the
/// properties of [`REFUSED_KAFKA_PROPERTIES`].
pub(super) fn add_property(o: &mut Options, key: &str, property: &str, value: &str) -> Result<()> {
    let property = property.trim();
    if property.is_empty() {
        return Err(bad(key, "names no librdkafka property"));
    }
    if let Some((_, why)) = REFUSED_KAFKA_PROPERTIES
        .iter()
        .find(|(p, _)| p.eq_ignore_ascii_case(property))
    {
        return Err(bad(key, &format!("may not be set: {why}")));
    }
    if o.kafka_properties.iter().any(|(p, _)| p == property) {
        return Err(bad(key, "given more than once"));
    }
    o.kafka_properties
        .push((property.to_owned(), value.to_owned()));
    Ok(())
}

/// Under `Mode=Kafka`: the first embedded-only key given, by name.
pub(super) fn refuse_embedded_keys(seen: &[String]) -> Result<()> {
    for key in seen {
        if let Some((_, name)) = EMBEDDED_ONLY.iter().find(|(k, _)| k == key) {
            return Err(bad(
                name,
                "only means something for a local directory (Mode=Embedded)",
            ));
        }
    }
    Ok(())
}

/// Under `Mode=Embedded`: the first Kafka-only key given, by name.
pub(super) fn refuse_kafka_keys(seen: &[String], o: &Options) -> Result<()> {
    for key in seen {
        if let Some((_, name)) = KAFKA_ONLY.iter().find(|(k, _)| k == key) {
            return Err(bad(name, "only means something under Mode=Kafka"));
        }
    }
    if let Some((p, _)) = o.kafka_properties.first() {
        return Err(bad(
            &format!("Kafka.{p}"),
            "only means something under Mode=Kafka",
        ));
    }
    Ok(())
}

/// The cross-field rules of `Mode=Kafka`.
pub(super) fn validate(o: &Options) -> Result<()> {
    debug_assert_eq!(o.mode, Mode::Kafka);
    if o.bootstrap_servers.trim().is_empty() {
        return Err(bad("Bootstrap Servers", "is required under Mode=Kafka"));
    }
    if o.kafka_timeout_ms == 0 || o.kafka_timeout_ms > super::MAX_MS {
        return Err(bad("Kafka Timeout Ms", "out of range"));
    }
    for (p, _) in &o.kafka_properties {
        if REFUSED_KAFKA_PROPERTIES
            .iter()
            .any(|(r, _)| r.eq_ignore_ascii_case(p))
        {
            return Err(bad(&format!("Kafka.{p}"), "may not be set"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    fn refused_key(s: &str) -> String {
        match Options::parse(s) {
            Err(Error::InvalidConnectionString { key, .. }) => key,
            other => panic!("{s}: expected InvalidConnectionString, got {other:?}"),
        }
    }

    #[test]
    fn parses_the_kafka_keys() {
        let o = Options::parse(
            "Mode=Kafka; Bootstrap Servers=127.0.0.1:9092,b:9092; Kafka Timeout Ms=500; \
             Kafka.security.protocol=plaintext; Kafka.linger.ms=5; Max Delivery Attempts=3",
        )
        .expect("valid");
        assert_eq!(o.mode, Mode::Kafka);
        assert_eq!(o.bootstrap_servers, "127.0.0.1:9092,b:9092");
        assert_eq!(o.kafka_timeout_ms, 500);
        assert_eq!(o.max_delivery_attempts, 3);
        let props = vec![
            ("security.protocol".to_owned(), "plaintext".to_owned()),
            ("linger.ms".to_owned(), "5".to_owned()),
        ];
        assert_eq!(o.kafka_properties, props);
    }

    #[test]
    fn bootstrap_servers_is_required() {
        assert_eq!(refused_key("Mode=Kafka"), "Bootstrap Servers");
        assert_eq!(
            refused_key("Mode=Kafka;Bootstrap Servers= "),
            "Bootstrap Servers"
        );
    }

    #[test]
    fn embedded_only_keys_are_refused_by_name() {
        for (given, name) in [
            ("Data Source=./x", "Data Source"),
            ("Sync=None", "Sync"),
            ("Segment Bytes=4096", "Segment Bytes"),
            ("Index Interval Bytes=64", "Index Interval Bytes"),
            ("Retention Bytes=1", "Retention Bytes"),
            ("Retention Ms=1", "Retention Ms"),
            ("Retention Policy=Acked", "Retention Policy"),
            ("Retention Check Ms=5", "Retention Check Ms"),
            ("Admin=Off", "Admin"),
        ] {
            // Before and after the Mode key: the order does not matter.
            let before = format!("{given};Mode=Kafka;Bootstrap Servers=b:1");
            let after = format!("Mode=Kafka;Bootstrap Servers=b:1;{given}");
            assert_eq!(refused_key(&before), name);
            assert_eq!(refused_key(&after), name);
        }
    }

    #[test]
    fn promise_weakening_properties_are_refused() {
        for (p, _) in REFUSED_KAFKA_PROPERTIES {
            let s = format!("Mode=Kafka;Bootstrap Servers=b:1;Kafka.{p}=x");
            assert_eq!(refused_key(&s), format!("Kafka.{p}"));
        }
        let upper = "Mode=Kafka;Bootstrap Servers=b:1;KAFKA.Enable.Auto.Commit=true";
        assert_eq!(refused_key(upper), "KAFKA.Enable.Auto.Commit");
        assert_eq!(
            refused_key("Mode=Kafka;Bootstrap Servers=b:1;Kafka.=x"),
            "Kafka."
        );
        let twice = "Mode=Kafka;Bootstrap Servers=b:1;Kafka.linger.ms=1;Kafka.linger.ms=2";
        assert_eq!(refused_key(twice), "Kafka.linger.ms");
    }

    #[test]
    fn kafka_keys_are_refused_in_embedded_mode() {
        assert_eq!(
            refused_key("Data Source=x;Bootstrap Servers=b:1"),
            "Bootstrap Servers"
        );
        assert_eq!(
            refused_key("Data Source=x;Kafka Timeout Ms=5"),
            "Kafka Timeout Ms"
        );
        assert_eq!(
            refused_key("Data Source=x;Kafka.linger.ms=5"),
            "Kafka.linger.ms"
        );
    }
}
