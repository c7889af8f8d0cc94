//! The seam between the commands and an instance: `Backend`, whose methods are the
//! library calls the command line needs, each with `Spool`'s name and meaning.
//!
//! - `Offline`: no process owns the directory; this one opens it (`Spool::open_with`)
//!   and `close` releases it after the command.
//! - Next (API.md, "Operating a live instance"): a variant holding the owner's admin
//!   client, tried first when the directory is locked. Its methods mirror `Spool`'s, so
//!   each method here gets one more `match` arm and no command changes: commands use
//!   only these primitives (dlq, reset's dry run and `tail --follow` are built from them).
//!
//! **Invariant:** nothing but `Backend` reaches the library's `Spool` in the binary.

use std::path::Path;

use spool::{
    GroupInfo, Headers, OffsetReset, Record, SnapshotInfo, Spool, TopicInfo, VerifyReport,
};

use crate::failure::Failure;
use crate::target::Target;

/// Where the commands' calls go.
#[derive(Debug)]
pub enum Backend {
    /// The directory opened by this process for the command's length.
    Offline(Spool),
}

type Result<T> = std::result::Result<T, Failure>;

impl Backend {
    /// Reaches the instance `target` names: checks the directory (`creates`: publish may
    /// make it), then opens it. A directory an application holds is refused until the
    /// admin endpoint exists.
    pub async fn connect(target: &Target, creates: bool) -> Result<Backend> {
        target.check(creates)?;
        match Spool::open_with(target.options.clone()) {
            Ok(mq) => Ok(Backend::Offline(mq)),
            Err(spool::Error::Locked { .. }) => Err(Failure::failed(format!(
                "{} is open in another process (an application owns it), and this build \
                 cannot reach a running owner yet: stop the owner, or run the command on a \
                 snapshot the owner takes",
                target.dir().display()
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Releases the instance (offline: flush, record a clean stop, unlock).
    pub async fn close(&self) -> Result<()> {
        match self {
            Backend::Offline(mq) => Ok(mq.close().await?),
        }
    }

    /// `Spool::topics`.
    pub async fn topics(&self) -> Result<Vec<String>> {
        match self {
            Backend::Offline(mq) => Ok(mq.topics()?),
        }
    }

    /// `Spool::topic_info`.
    pub async fn topic_info(&self, topic: &str) -> Result<TopicInfo> {
        match self {
            Backend::Offline(mq) => Ok(mq.topic_info(topic)?),
        }
    }

    /// `Spool::groups`.
    pub async fn groups(&self, topic: &str) -> Result<Vec<String>> {
        match self {
            Backend::Offline(mq) => Ok(mq.groups(topic)?),
        }
    }

    /// `Spool::group_info`.
    pub async fn group_info(&self, topic: &str, group: &str) -> Result<GroupInfo> {
        match self {
            Backend::Offline(mq) => Ok(mq.group_info(topic, group)?),
        }
    }

    /// `Spool::reset_offset`.
    pub async fn reset_offset(&self, topic: &str, group: &str, to: OffsetReset) -> Result<u64> {
        tracing::info!(topic, group, ?to, "admin request: reset");
        match self {
            Backend::Offline(mq) => Ok(mq.reset_offset(topic, group, to).await?),
        }
    }

    /// `Spool::fetch`.
    pub async fn fetch(&self, topic: &str, from: u64, max: usize) -> Result<Vec<Record>> {
        match self {
            Backend::Offline(mq) => Ok(mq.fetch(topic, from, max).await?),
        }
    }

    /// `Spool::publish_batch` (all or nothing).
    pub async fn publish_batch(
        &self,
        topic: &str,
        messages: Vec<(Vec<u8>, Headers)>,
    ) -> Result<Vec<u64>> {
        tracing::info!(topic, messages = messages.len(), "admin request: publish");
        match self {
            Backend::Offline(mq) => Ok(mq.publish_batch(topic, messages).await?),
        }
    }

    /// `Spool::delete_group`.
    pub async fn delete_group(&self, topic: &str, group: &str) -> Result<()> {
        tracing::info!(topic, group, "admin request: delete group");
        match self {
            Backend::Offline(mq) => Ok(mq.delete_group(topic, group).await?),
        }
    }

    /// `Spool::delete_records_before`.
    pub async fn delete_records_before(&self, topic: &str, offset: u64) -> Result<u64> {
        tracing::info!(topic, offset, "admin request: delete records");
        match self {
            Backend::Offline(mq) => Ok(mq.delete_records_before(topic, offset).await?),
        }
    }

    /// `Spool::snapshot`.
    pub async fn snapshot(&self, dest: &Path) -> Result<SnapshotInfo> {
        tracing::info!(dest = %dest.display(), "admin request: snapshot");
        match self {
            Backend::Offline(mq) => Ok(mq.snapshot(dest).await?),
        }
    }

    /// `Spool::verify` (doc-hidden): read-only.
    pub async fn verify(&self, topic: Option<&str>) -> Result<VerifyReport> {
        match self {
            Backend::Offline(mq) => Ok(mq.verify(topic).await?),
        }
    }
}
