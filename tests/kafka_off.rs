//! Without the cargo feature `kafka`, `Mode=Kafka` is `Unsupported`, naming the feature
//! (API.md, "Mode=Kafka"); its connection string is still checked first.
#![cfg(not(feature = "kafka"))]

use spool::{Error, Spool};

#[test]
fn mode_kafka_needs_the_feature() {
    match Spool::open("Mode=Kafka;Bootstrap Servers=127.0.0.1:9092") {
        Err(Error::Unsupported { what }) => {
            assert!(what.contains("feature `kafka`"), "{what}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    match Spool::open("Mode=Kafka;Data Source=./x;Bootstrap Servers=b:1") {
        Err(Error::InvalidConnectionString { key, .. }) => assert_eq!(key, "Data Source"),
        other => panic!("expected InvalidConnectionString, got {other:?}"),
    }
}
