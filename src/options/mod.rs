//! Options and the connection-string grammar. **Invariant:** uses only `names` and
//! `error`; every limit is a named constant here.
//!
//! Files: `mod.rs` (the options, the grammar, the checks); `backoff.rs` (`Nack Backoff`:
//! its values and the delay of the n-th failed attempt); `kafka.rs` (the `Mode=Kafka`
//! keys and what they refuse).

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};

mod backoff;
mod kafka;
pub use backoff::{MAX_BACKOFF_STEPS, NackBackoff};
pub use kafka::{DEFAULT_KAFKA_TIMEOUT_MS, REFUSED_KAFKA_PROPERTIES};

/// Default `Segment Bytes`: 64 MiB.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
/// Below this a segment could not hold even a small record next to its header.
pub const MIN_SEGMENT_BYTES: u64 = 1024;
/// Largest `Segment Bytes` accepted: 1 TiB.
pub const MAX_SEGMENT_BYTES: u64 = 1 << 40;
/// Default `Max Message Bytes`: 1 MiB. Larger payloads are [`Error::MessageTooLarge`].
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// Hard ceiling for `Max Message Bytes`: record lengths are stored as `u32`.
pub const MAX_MESSAGE_BYTES_LIMIT: usize = 256 * 1024 * 1024;
/// Default `Max Header Bytes`: 64 KiB of encoded headers per message.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;
/// Largest `Max Header Bytes` accepted: 16 MiB.
pub const MAX_HEADER_BYTES_LIMIT: usize = 16 * 1024 * 1024;
/// Default `Dedup Window`: message ids remembered per topic for de-duplication.
pub const DEFAULT_DEDUP_WINDOW: usize = 100_000;
/// Largest `Dedup Window` accepted.
pub const MAX_DEDUP_WINDOW: usize = 100_000_000;
/// Default `Max Delivery Attempts`: a message that fails this many deliveries is dead-lettered.
pub const DEFAULT_MAX_DELIVERY_ATTEMPTS: u32 = 5;
/// Default `Dead Letter Suffix`: topic `orders` dead-letters to `orders.dlq`.
pub const DEFAULT_DEAD_LETTER_SUFFIX: &str = ".dlq";
/// Default `Commit Interval Ms`: auto-acks are persisted this often, in milliseconds.
pub const DEFAULT_COMMIT_INTERVAL_MS: u64 = 100;
/// Default `Index Interval Bytes`: one sparse index entry per this many segment bytes.
pub const DEFAULT_INDEX_INTERVAL_BYTES: u64 = 4096;
/// Default `Retention Check Ms`: retention runs this often, in milliseconds.
pub const DEFAULT_RETENTION_CHECK_MS: u64 = 1000;
/// The longest `message-id` header value, in UTF-8 bytes.
pub const MAX_MESSAGE_ID_BYTES: usize = 256;
/// Longer nack reasons are cut (at a character boundary) to this many UTF-8 bytes before
/// they are stored or copied into `x-dead-letter-reason`: an unbounded reason could make
/// the dead-letter copy larger than any reader accepts.
pub const MAX_NACK_REASON_BYTES: usize = 64 * 1024;
/// Upper bound for any millisecond setting (about 10 years) so `Duration` math cannot overflow.
pub const MAX_MS: u64 = 10 * 365 * 24 * 3600 * 1000;

/// Storage back-end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// The queue lives in this process, on a local data directory.
    #[default]
    Embedded,
    /// The queue is a Kafka cluster (cargo feature `kafka`; docs/kafka.md). Without the
    /// feature, opening it is [`Error::Unsupported`].
    Kafka,
}

/// When appended data (and catalog commits) reach stable storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SyncPolicy {
    /// A call that returned `Ok` survives a process crash and a power cut.
    #[default]
    Always,
    /// Survives a process crash; a power cut loses at most the last interval.
    Interval(Duration),
    /// Survives a process crash; a power cut loses what no roll, close or catalog commit synced.
    None,
}

/// What retention deletes besides what its limits do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RetentionPolicy {
    /// Only the limits: `Retention Bytes` and `Retention Ms`.
    #[default]
    Limits,
    /// The limits, and also the sealed segments that every group of the topic has
    /// finished (work-queue retention). A topic with no group keeps them.
    Acked,
}

/// Every knob of an instance. Each field has a connection-string key (in brackets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// [`Data Source`] the data directory (created if missing).
    pub data_source: PathBuf,
    /// [`Mode`] `Embedded` | `Kafka`.
    pub mode: Mode,
    /// [`Bootstrap Servers`] the Kafka cluster's `host:port` list (`Mode=Kafka` only, and
    /// required there).
    pub bootstrap_servers: String,
    /// [`Kafka Timeout Ms`] bounds every broker round trip of a call (`Mode=Kafka`).
    pub kafka_timeout_ms: u64,
    /// [`Kafka.<property>`] librdkafka properties given to every client spool makes, in
    /// the order given (`Mode=Kafka`).
    pub kafka_properties: Vec<(String, String)>,
    /// [`Sync`] `Always` | `Interval:<ms>` | `None`.
    pub sync: SyncPolicy,
    /// [`Segment Bytes`] a segment is sealed and a new one started past this size.
    pub segment_bytes: u64,
    /// [`Retention Bytes`] per topic; sealed segments are deleted past it. 0 = unlimited.
    pub retention_bytes: u64,
    /// [`Retention Ms`] sealed segments whose newest record is older are deleted. 0 = forever.
    pub retention_ms: u64,
    /// [`Retention Policy`] `Limits` | `Acked`: what retention deletes besides its limits.
    pub retention_policy: RetentionPolicy,
    /// [`Max Message Bytes`] payload limit.
    pub max_message_bytes: usize,
    /// [`Max Header Bytes`] limit on a message's encoded headers.
    pub max_header_bytes: usize,
    /// [`Dedup Window`] message ids remembered per topic; 0 disables de-duplication.
    pub dedup_window: usize,
    /// [`Max Delivery Attempts`] 0 disables dead-lettering.
    pub max_delivery_attempts: u32,
    /// [`Dead Letter Suffix`] appended to a topic's name to name its dead-letter topic.
    pub dead_letter_suffix: String,
    /// [`Dead Letter Chain`] whether nacks on a dead-letter topic dead-letter again.
    pub dead_letter_chain: bool,
    /// [`Commit Interval Ms`] how often auto-acked cursors are persisted (the replay window).
    pub commit_interval_ms: u64,
    /// [`Index Interval Bytes`] one sparse index entry per this many segment bytes.
    pub index_interval_bytes: u64,
    /// [`Retention Check Ms`] how often the background thread applies retention.
    pub retention_check_ms: u64,
    /// [`Nack Backoff`] `1s,5s,30s` | `exp:100ms..30s`: a failed message's wait before it
    /// is delivered again, by attempt. Empty (the default): at once.
    pub nack_backoff: NackBackoff,
    /// [`Ack Deadline Ms`] a delivery neither acked nor nacked this long after it was
    /// handed out is taken back as a failed attempt. 0 (the default): no deadline.
    /// A consumer's `ack_deadline` wins over it.
    pub ack_deadline_ms: u64,
    /// \[`Admin`\] `On` | `Off`: whether the instance serves the admin endpoint of its data
    /// directory (a Unix socket, owner-only; docs/operations.md, "Admin endpoint"), through
    /// which the `spool` command line works while the instance runs. Default `On`.
    pub admin: bool,
}

impl Options {
    /// Defaults for a data directory.
    pub fn new(data_source: impl Into<PathBuf>) -> Self {
        Options {
            data_source: data_source.into(),
            mode: Mode::Embedded,
            bootstrap_servers: String::new(),
            kafka_timeout_ms: DEFAULT_KAFKA_TIMEOUT_MS,
            kafka_properties: Vec::new(),
            sync: SyncPolicy::Always,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            retention_bytes: 0,
            retention_ms: 0,
            retention_policy: RetentionPolicy::Limits,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            dedup_window: DEFAULT_DEDUP_WINDOW,
            max_delivery_attempts: DEFAULT_MAX_DELIVERY_ATTEMPTS,
            dead_letter_suffix: DEFAULT_DEAD_LETTER_SUFFIX.to_owned(),
            dead_letter_chain: false,
            commit_interval_ms: DEFAULT_COMMIT_INTERVAL_MS,
            index_interval_bytes: DEFAULT_INDEX_INTERVAL_BYTES,
            retention_check_ms: DEFAULT_RETENTION_CHECK_MS,
            nack_backoff: NackBackoff::Immediate,
            ack_deadline_ms: 0,
            admin: true,
        }
    }

    /// Parses `Key=Value; Key=Value`. Keys are case-insensitive and may be written with or
    /// without spaces (`Data Source`, `datasource`); values of `Mode` and `Sync` too.
    pub fn parse(connection_string: &str) -> Result<Options> {
        let mut data_source: Option<PathBuf> = None;
        let mut o = Options::new("");
        let mut seen: Vec<String> = Vec::new();
        for part in connection_string.split(';') {
            if part.trim().is_empty() {
                continue;
            }
            let Some((raw_key, raw_value)) = part.split_once('=') else {
                return Err(bad(part.trim(), "expected Key=Value"));
            };
            let key_display = raw_key.trim();
            let value = raw_value.trim();
            if let Some(property) = kafka::property_name(key_display) {
                kafka::add_property(&mut o, key_display, property, value)?;
                continue;
            }
            let key: String = key_display
                .chars()
                .filter(|c| !c.is_whitespace() && *c != '_')
                .flat_map(char::to_lowercase)
                .collect();
            if key.is_empty() {
                return Err(bad(part.trim(), "empty key"));
            }
            if seen.contains(&key) {
                return Err(bad(key_display, "given more than once"));
            }
            seen.push(key.clone());
            let k = key_display;
            match key.as_str() {
                "datasource" => {
                    if value.is_empty() {
                        return Err(bad(k, "must name a directory"));
                    }
                    data_source = Some(PathBuf::from(value));
                }
                "mode" => o.mode = parse_mode(k, value)?,
                "bootstrapservers" => o.bootstrap_servers = value.to_owned(),
                "kafkatimeoutms" => o.kafka_timeout_ms = num(k, value, 1, MAX_MS)?,
                "sync" => o.sync = parse_sync(k, value)?,
                "segmentbytes" => {
                    o.segment_bytes = num(k, value, MIN_SEGMENT_BYTES, MAX_SEGMENT_BYTES)?
                }
                "retentionbytes" => o.retention_bytes = num(k, value, 0, u64::MAX / 2)?,
                "retentionms" => o.retention_ms = num(k, value, 0, MAX_MS)?,
                "retentionpolicy" => o.retention_policy = parse_retention_policy(k, value)?,
                "maxmessagebytes" => {
                    o.max_message_bytes = num(k, value, 1, MAX_MESSAGE_BYTES_LIMIT as u64)? as usize
                }
                "maxheaderbytes" => {
                    o.max_header_bytes = num(k, value, 1, MAX_HEADER_BYTES_LIMIT as u64)? as usize
                }
                "dedupwindow" => {
                    o.dedup_window = num(k, value, 0, MAX_DEDUP_WINDOW as u64)? as usize
                }
                "maxdeliveryattempts" => {
                    o.max_delivery_attempts = num(k, value, 0, u32::MAX as u64)? as u32
                }
                "deadlettersuffix" => o.dead_letter_suffix = value.to_owned(),
                "deadletterchain" => o.dead_letter_chain = parse_bool(k, value)?,
                "commitintervalms" => o.commit_interval_ms = num(k, value, 1, MAX_MS)?,
                "indexintervalbytes" => o.index_interval_bytes = num(k, value, 1, 1 << 30)?,
                "retentioncheckms" => o.retention_check_ms = num(k, value, 1, MAX_MS)?,
                "nackbackoff" => o.nack_backoff = backoff::parse_backoff(k, value)?,
                "ackdeadlinems" => o.ack_deadline_ms = num(k, value, 0, MAX_MS)?,
                "admin" => o.admin = parse_on_off(k, value)?,
                _ => return Err(bad(k, "unknown key")),
            }
        }
        match o.mode {
            Mode::Embedded => {
                kafka::refuse_kafka_keys(&seen, &o)?;
                o.data_source = data_source.ok_or_else(|| bad("Data Source", "is required"))?;
            }
            Mode::Kafka => kafka::refuse_embedded_keys(&seen)?,
        }
        o.validate()?;
        Ok(o)
    }

    /// Checks cross-field rules; `open_with` calls it too.
    pub fn validate(&self) -> Result<()> {
        match self.mode {
            Mode::Embedded if self.data_source.as_os_str().is_empty() => {
                return Err(bad("Data Source", "is required"));
            }
            Mode::Embedded => {}
            Mode::Kafka => kafka::validate(self)?,
        }
        if !(MIN_SEGMENT_BYTES..=MAX_SEGMENT_BYTES).contains(&self.segment_bytes) {
            return Err(bad("Segment Bytes", "out of range"));
        }
        if self.max_message_bytes == 0 || self.max_message_bytes > MAX_MESSAGE_BYTES_LIMIT {
            return Err(bad("Max Message Bytes", "out of range"));
        }
        if self.max_header_bytes == 0 || self.max_header_bytes > MAX_HEADER_BYTES_LIMIT {
            return Err(bad("Max Header Bytes", "out of range"));
        }
        if self.dedup_window > MAX_DEDUP_WINDOW {
            return Err(bad("Dedup Window", "out of range"));
        }
        if self.max_delivery_attempts > 0 {
            if self.dead_letter_suffix.is_empty() {
                return Err(bad(
                    "Dead Letter Suffix",
                    "must not be empty while dead-lettering is enabled",
                ));
            }
            if crate::names::check_suffix(&self.dead_letter_suffix).is_err() {
                return Err(bad(
                    "Dead Letter Suffix",
                    "may only hold the characters [A-Za-z0-9._-]",
                ));
            }
        }
        if let SyncPolicy::Interval(d) = self.sync
            && (d.is_zero() || d.as_millis() > MAX_MS as u128)
        {
            return Err(bad("Sync", "interval out of range"));
        }
        for (name, v) in [
            ("Commit Interval Ms", self.commit_interval_ms),
            ("Retention Check Ms", self.retention_check_ms),
        ] {
            if v == 0 || v > MAX_MS {
                return Err(bad(name, "out of range"));
            }
        }
        if self.ack_deadline_ms > MAX_MS {
            return Err(bad("Ack Deadline Ms", "out of range"));
        }
        if self.retention_ms > MAX_MS {
            return Err(bad("Retention Ms", "out of range"));
        }
        if self.index_interval_bytes == 0 {
            return Err(bad("Index Interval Bytes", "out of range"));
        }
        Ok(())
    }
}

pub(crate) fn bad(key: &str, reason: &str) -> Error {
    Error::InvalidConnectionString {
        key: key.to_owned(),
        reason: reason.to_owned(),
    }
}

pub(crate) fn num(key: &str, value: &str, min: u64, max: u64) -> Result<u64> {
    let v: u64 = value
        .parse()
        .map_err(|_| bad(key, &format!("`{value}` is not a whole number")))?;
    if v < min || v > max {
        return Err(bad(key, &format!("{v} is outside {min}..={max}")));
    }
    Ok(v)
}

fn parse_mode(key: &str, value: &str) -> Result<Mode> {
    if value.eq_ignore_ascii_case("embedded") {
        Ok(Mode::Embedded)
    } else if value.eq_ignore_ascii_case("kafka") {
        Ok(Mode::Kafka)
    } else if value.is_empty() {
        Err(bad(key, "empty value"))
    } else {
        Err(Error::Unsupported {
            what: format!("Mode={value} (the modes are Embedded and Kafka)"),
        })
    }
}

fn parse_retention_policy(key: &str, value: &str) -> Result<RetentionPolicy> {
    if value.eq_ignore_ascii_case("limits") {
        Ok(RetentionPolicy::Limits)
    } else if value.eq_ignore_ascii_case("acked") {
        Ok(RetentionPolicy::Acked)
    } else {
        Err(bad(key, "expected Limits or Acked"))
    }
}

fn parse_bool(key: &str, value: &str) -> Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "yes" | "1" => Ok(true),
        "false" | "no" | "0" => Ok(false),
        _ => Err(bad(key, "expected true or false")),
    }
}

fn parse_on_off(key: &str, value: &str) -> Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(bad(key, "expected On or Off")),
    }
}

fn parse_sync(key: &str, value: &str) -> Result<SyncPolicy> {
    let lower = value.to_ascii_lowercase();
    match lower.as_str() {
        "always" => Ok(SyncPolicy::Always),
        "none" => Ok(SyncPolicy::None),
        _ => match lower.strip_prefix("interval:") {
            Some(ms) => Ok(SyncPolicy::Interval(Duration::from_millis(num(
                key,
                ms.trim(),
                1,
                MAX_MS,
            )?))),
            None => Err(bad(key, "expected Always, Interval:<ms> or None")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_key() {
        let o = Options::parse(
            " data source = ./x ; MODE=embedded; sync=interval:25; Segment Bytes=4096; \
             Retention Bytes=10; Retention Ms=20; Max Message Bytes=100; Max Header Bytes=50; \
             Dedup Window=0; Max Delivery Attempts=3; Dead Letter Suffix=.dead; \
             Dead Letter Chain=true; Commit Interval Ms=5; Index Interval Bytes=64; \
             Retention Check Ms=7; Nack Backoff=1s,5s; Ack Deadline Ms=30000",
        )
        .expect("valid");
        assert_eq!(o.data_source, PathBuf::from("./x"));
        assert_eq!(o.sync, SyncPolicy::Interval(Duration::from_millis(25)));
        assert_eq!(o.segment_bytes, 4096);
        assert_eq!(o.retention_bytes, 10);
        assert_eq!(o.retention_ms, 20);
        assert_eq!(o.max_message_bytes, 100);
        assert_eq!(o.max_header_bytes, 50);
        assert_eq!(o.dedup_window, 0);
        assert_eq!(o.max_delivery_attempts, 3);
        assert_eq!(o.dead_letter_suffix, ".dead");
        assert!(o.dead_letter_chain);
        assert_eq!(o.commit_interval_ms, 5);
        assert_eq!(o.index_interval_bytes, 64);
        assert_eq!(o.retention_check_ms, 7);
        let steps = vec![Duration::from_secs(1), Duration::from_secs(5)];
        assert_eq!(o.nack_backoff, NackBackoff::Steps(steps));
        assert_eq!(o.ack_deadline_ms, 30_000);
        assert!(o.admin, "Admin is On by default");
    }

    #[test]
    fn admin_is_on_or_off() {
        for (v, want) in [("On", true), ("off", false), ("OFF", false), ("true", true)] {
            let o = Options::parse(&format!("Data Source=x; Admin = {v}")).expect(v);
            assert_eq!(o.admin, want, "{v}");
        }
        match Options::parse("Data Source=x;Admin=maybe") {
            Err(Error::InvalidConnectionString { key, .. }) => assert_eq!(key, "Admin"),
            other => panic!("expected InvalidConnectionString naming Admin, got {other:?}"),
        }
    }
}
