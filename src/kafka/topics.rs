//! Creating a missing dead-letter topic under `Mode=Kafka` (API.md: "created if
//! missing, with as many partitions as its source").
//!
//! - Before a copy is produced, the dead-letter topic's partitions are read. If it has
//!   none, it is created with its source's count, through an admin client made at the
//!   first creation (replication: the broker's default).
//! - As many partitions as the source: a copy keeps its `message-key`, so it lands on the
//!   partition number of the record it copies.
//! - A topic another instance created meanwhile is fine (`TopicAlreadyExists`).
//! - A failed creation (no right to create topics, a broker without CreateTopics such as
//!   librdkafka's mock cluster) is logged, and the copy is produced all the same: a
//!   cluster that creates topics on first use makes it with its default count, and one
//!   that does not fails the produce with the broker's own error.
//! - A topic seen to exist is remembered, so later copies skip the lookup.

use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication, TopicResult};
use rdkafka::error::KafkaResult;
use rdkafka::types::RDKafkaErrorCode;

use super::{Kafka, blocking, clients, kafka_err};
use crate::error::Result;

impl Kafka {
    /// Makes sure `dlq` exists before a copy of a `source` record goes to it.
    pub(super) async fn ensure_dead_letter_topic(&self, source: &str, dlq: &str) -> Result<()> {
        if self.known_topic(dlq) {
            return Ok(());
        }
        let counts = {
            let (k, s, d) = (self.clone(), source.to_owned(), dlq.to_owned());
            blocking(move || Ok((k.partitions(&d)?, k.partitions(&s)?))).await?
        };
        let made = match to_create(counts.0, counts.1) {
            None => true,
            Some(n) => self.create_topic(dlq, n).await?,
        };
        if made {
            self.remember_topic(dlq);
        }
        Ok(())
    }

    /// Creates `topic` with `partitions`; whether it exists now (`false`: the failure
    /// is logged, and the produce that follows tells).
    async fn create_topic(&self, topic: &str, partitions: i32) -> Result<bool> {
        let admin = self.admin()?;
        let timeout = Some(self.timeout());
        let opts = AdminOptions::new()
            .request_timeout(timeout)
            .operation_timeout(timeout);
        let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1));
        let r = admin.create_topics([&new], &opts).await;
        Ok(created(topic, r))
    }

    /// The admin client, made at the first call.
    fn admin(&self) -> Result<&rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>> {
        if let Some(a) = self.inner.admin.get() {
            return Ok(a);
        }
        let made = clients::admin(self.options())?;
        Ok(self.inner.admin.get_or_init(|| made))
    }

    fn known_topic(&self, topic: &str) -> bool {
        let known = self.inner.known_topics.lock();
        known.unwrap_or_else(|e| e.into_inner()).contains(topic)
    }

    fn remember_topic(&self, topic: &str) {
        let mut known = self
            .inner
            .known_topics
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        known.insert(topic.to_owned());
    }
}

/// How many partitions to create the dead-letter topic with, given its own count and
/// its source's (0: missing); `None` when it exists.
fn to_create(dlq_partitions: i32, source_partitions: i32) -> Option<i32> {
    (dlq_partitions == 0).then_some(source_partitions.max(1))
}

/// Whether the topic exists after a creation that answered `r`; a failure is logged.
fn created(topic: &str, r: KafkaResult<Vec<TopicResult>>) -> bool {
    let failure = match r {
        Ok(results) => match results.into_iter().next() {
            Some(Ok(_)) | Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => return true,
            Some(Err((_, code))) => code.to_string(),
            None => "no answer for the topic".to_owned(),
        },
        Err(e) => kafka_err("creating a topic", e).to_string(),
    };
    tracing::warn!(
        topic,
        error = %failure,
        "could not create the dead-letter topic; producing the copy all the same"
    );
    false
}

#[cfg(test)]
mod tests {
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode;

    use super::{created, to_create};

    #[test]
    fn a_missing_dead_letter_topic_gets_its_sources_partitions() {
        assert_eq!(to_create(0, 4), Some(4));
        assert_eq!(to_create(0, 1), Some(1));
        // A source that vanished meanwhile: one partition, not an invalid zero.
        assert_eq!(to_create(0, 0), Some(1));
        assert_eq!(to_create(3, 4), None, "an existing topic is kept as it is");
    }

    #[test]
    fn a_topic_created_meanwhile_counts_as_created() {
        assert!(created("t.dlq", Ok(vec![Ok("t.dlq".to_owned())])));
        let exists = RDKafkaErrorCode::TopicAlreadyExists;
        assert!(created(
            "t.dlq",
            Ok(vec![Err(("t.dlq".to_owned(), exists))])
        ));
    }

    #[test]
    fn a_failed_creation_is_not_remembered() {
        let denied = RDKafkaErrorCode::TopicAuthorizationFailed;
        assert!(!created(
            "t.dlq",
            Ok(vec![Err(("t.dlq".to_owned(), denied))])
        ));
        assert!(!created("t.dlq", Ok(vec![])));
        let timed_out = KafkaError::AdminOp(RDKafkaErrorCode::OperationTimedOut);
        assert!(!created("t.dlq", Err(timed_out)));
    }
}
