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

/// Asserts that nothing is delivered for a while: long enough on the mock cluster for
/// records already produced to reach the member (a shorter wait could pass unearned).
pub async fn assert_nothing(b: &Backend, c: &mut Consumer) {
    let quiet = if b.is_kafka() {
        Duration::from_secs(1)
    } else {
        Duration::from_millis(100)
    };
    let d = c.recv_timeout(quiet).await.expect("recv_timeout");
    assert!(
        d.is_none(),
        "expected no delivery, got offset {:?}",
        d.map(|d| d.offset())
    );
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

/// Runs each rule (an `async fn(Backend)` of the calling file) in every mode: as
/// `embedded::<rule>` on a data directory, and as `kafka::<rule>` (feature `kafka`) on a
/// mock cluster holding topic `t` and `t.dlq`.
#[macro_export]
macro_rules! in_every_mode {
    ($($rule:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    super::$rule(super::Backend::embedded()).await;
                }
            )*
        }
        #[cfg(feature = "kafka")]
        mod kafka {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    super::$rule(super::Backend::kafka(&["t"])).await;
                }
            )*
        }
    };
}
