//! The mock cluster and helpers of the `Mode=Kafka` tests.
#![allow(dead_code)]

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use spool::{Delivery, Headers, Spool};

pub const WAIT: Duration = Duration::from_secs(60);

pub struct Cluster {
    pub mock: MockCluster<'static, DefaultProducerContext>,
}

impl Cluster {
    /// A one-broker mock cluster with `topics`, each of one partition.
    pub fn new(topics: &[&str]) -> Cluster {
        let mock = MockCluster::new(1).expect("mock cluster");
        for t in topics {
            mock.create_topic(t, 1, 1).expect("create topic");
        }
        Cluster { mock }
    }

    pub fn connection(&self, extra: &str) -> String {
        format!(
            "Mode=Kafka;Bootstrap Servers={};Kafka.session.timeout.ms=6000;{extra}",
            self.mock.bootstrap_servers()
        )
    }

    pub fn open(&self, extra: &str) -> Spool {
        Spool::open(&self.connection(extra)).expect("open Mode=Kafka")
    }

    /// Commits `offset` with `metadata` for `group` as another client would (the group
    /// must have no members).
    pub fn commit_as_other_client(&self, topic: &str, group: &str, offset: i64, metadata: &str) {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.mock.bootstrap_servers())
            .set("group.id", group)
            .create()
            .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        let mut e = tpl.add_partition(topic, 0);
        e.set_offset(Offset::Offset(offset)).expect("offset");
        e.set_metadata(metadata);
        c.commit(&tpl, CommitMode::Sync).expect("commit");
        drop(tpl);
        drop(c);
    }
}

pub async fn recv(c: &mut spool::Consumer) -> Delivery {
    tokio::time::timeout(WAIT, c.recv())
        .await
        .expect("a delivery within the wait")
        .expect("recv")
}

pub async fn publish_n(mq: &Spool, topic: &str, n: u64) {
    for i in 0..n {
        let o = mq
            .publish(topic, format!("m{i}").into_bytes(), &Headers::new())
            .await
            .expect("publish");
        assert_eq!(o, i, "offsets are the partition's, from 0");
    }
}

pub async fn publish_n_from(mq: &Spool, topic: &str, first: u64, n: u64) {
    for i in first..first + n {
        let o = mq
            .publish(topic, format!("m{i}").into_bytes(), &Headers::new())
            .await
            .expect("publish");
        assert_eq!(o, i);
    }
}
