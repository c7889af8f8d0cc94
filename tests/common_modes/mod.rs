//! One backend of either mode for the rules both must keep (tests/group_rules.rs): a
//! temporary data directory, or librdkafka's mock cluster (feature `kafka`).
#![allow(
    dead_code,
    reason = "each test file uses a different subset of these helpers"
)]

use std::time::Duration;

use spool::{Consumer, Delivery, Headers, Spool};

#[cfg(feature = "kafka")]
#[path = "../common_kafka/mod.rs"]
mod common_kafka;

/// Generous: a first group join on the mock cluster takes seconds.
pub const WAIT: Duration = Duration::from_secs(60);

/// Where a rule runs.
pub enum Backend {
    Embedded(tempfile::TempDir),
    #[cfg(feature = "kafka")]
    Kafka(common_kafka::Cluster),
}

impl Backend {
    pub fn embedded() -> Backend {
        Backend::Embedded(tempfile::tempdir().expect("tempdir"))
    }

    /// A mock cluster holding `topics` and their dead-letter topics, one partition each.
    #[cfg(feature = "kafka")]
    pub fn kafka(topics: &[&str]) -> Backend {
        let dlqs: Vec<String> = topics.iter().map(|t| format!("{t}.dlq")).collect();
        let mut all: Vec<&str> = topics.to_vec();
        all.extend(dlqs.iter().map(String::as_str));
        Backend::Kafka(common_kafka::Cluster::new(&all))
    }

    pub fn is_kafka(&self) -> bool {
        !matches!(self, Backend::Embedded(_))
    }

    /// Opens an instance with `extra` keys that mean the same in both modes.
    pub fn open(&self, extra: &str) -> Spool {
        Spool::open(&self.connection(extra)).expect("open")
    }

    /// The connection string of `open` (a child process opens the same backend with
    /// it; `Sync=None` survives a crash of the process).
    pub fn connection(&self, extra: &str) -> String {
        match self {
            Backend::Embedded(dir) => {
                format!("Data Source={};Sync=None;{extra}", dir.path().display())
            }
            #[cfg(feature = "kafka")]
            Backend::Kafka(c) => c.connection(extra),
        }
    }
}

pub async fn recv(c: &mut Consumer) -> Delivery {
    tokio::time::timeout(WAIT, c.recv())
        .await
        .expect("a delivery within the wait")
        .expect("recv")
}

/// Publishes `m0` .. `m<n-1>`, checking each gets the next offset from 0.
pub async fn publish_n(mq: &Spool, topic: &str, n: u64) {
    for i in 0..n {
        let o = mq
            .publish(topic, format!("m{i}").into_bytes(), &Headers::new())
            .await
            .expect("publish");
        assert_eq!(o, i);
    }
}
