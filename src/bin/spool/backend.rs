//! The seam between the commands and an instance: `Backend`, whose methods are the
//! library calls the command line needs, each with `Spool`'s name and meaning.
//!
//! - `Offline`: no process owns the directory; this one opens it (`Spool::open_with`)
//!   and `close` releases it after the command.
//! - `Live`: an application owns the directory and serves its admin endpoint (API.md,
//!   "Operating a live instance"); every call goes to the owner through
//!   `spool::admin::Client`, whose methods mirror `Spool`'s. Commands use only these
//!   primitives (dlq, reset's dry run and `tail --follow` are built from them), so they
//!   do not know which variant they talk to.
//!
//! **Invariant:** nothing but `Backend` reaches the library's `Spool` in the binary.

use std::path::Path;
use std::sync::Arc;

use spool::admin::{Client, limits};
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
    /// The owner's admin endpoint. Its calls block, so they run on the runtime's blocking
    /// threads (`live`): `spool serve` goes on answering while one waits on the owner.
    Live(Arc<Client>),
}

type Result<T> = std::result::Result<T, Failure>;

impl Backend {
    /// Reaches the instance `target` names: checks the directory (`creates`: publish may
    /// make it), then goes through the owner's admin endpoint if one answers, else opens
    /// the directory itself. A `Mode=Kafka` connection string opens the cluster. A directory held by an owner that serves no endpoint
    /// (`Admin=Off`) or does not answer is refused.
    pub async fn connect(target: &Target, creates: bool) -> Result<Backend> {
        // `Mode=Kafka` has no directory and no admin endpoint: the cluster is shared.
        if target.options.mode == spool::Mode::Kafka {
            return Ok(Backend::Offline(Spool::open_with(target.options.clone())?));
        }
        target.check(creates)?;
        if target.dir().is_dir()
            && let Some(client) = Client::connect(target.dir())?
        {
            tracing::debug!(socket = %client.socket_path().display(), "through the owner");
            return Ok(Backend::Live(Arc::new(client)));
        }
        match Spool::open_with(target.options.clone()) {
            Ok(mq) => Ok(Backend::Offline(mq)),
            Err(spool::Error::Locked { .. }) => Err(Failure::failed(format!(
                "{} is open in another process whose admin endpoint does not answer (its \
                 connection string says Admin=Off, or it is stuck): turn the endpoint on, \
                 or stop the owner",
                target.dir().display()
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Releases the instance (offline: flush, record a clean stop, unlock).
    pub async fn close(&self) -> Result<()> {
        match self {
            Backend::Offline(mq) => Ok(mq.close().await?),
            Backend::Live(_) => Ok(()),
        }
    }

    /// `Spool::topics`.
    pub async fn topics(&self) -> Result<Vec<String>> {
        match self {
            Backend::Offline(mq) => Ok(mq.topics()?),
            Backend::Live(c) => live(c, |c| c.topics()).await,
        }
    }

    /// `Spool::topic_info`.
    pub async fn topic_info(&self, topic: &str) -> Result<TopicInfo> {
        match self {
            Backend::Offline(mq) => Ok(mq.topic_info(topic)?),
            Backend::Live(c) => {
                let t = topic.to_owned();
                live(c, move |c| c.topic_info(&t)).await
            }
        }
    }

    /// `Spool::groups`.
    pub async fn groups(&self, topic: &str) -> Result<Vec<String>> {
        match self {
            Backend::Offline(mq) => Ok(mq.groups(topic)?),
            Backend::Live(c) => {
                let t = topic.to_owned();
                live(c, move |c| c.groups(&t)).await
            }
        }
    }

    /// `Spool::group_info`.
    pub async fn group_info(&self, topic: &str, group: &str) -> Result<GroupInfo> {
        match self {
            Backend::Offline(mq) => Ok(mq.group_info(topic, group)?),
            Backend::Live(c) => {
                let (t, g) = (topic.to_owned(), group.to_owned());
                live(c, move |c| c.group_info(&t, &g)).await
            }
        }
    }

    /// `Spool::reset_offset`.
    pub async fn reset_offset(&self, topic: &str, group: &str, to: OffsetReset) -> Result<u64> {
        tracing::info!(topic, group, ?to, "admin request: reset");
        match self {
            Backend::Offline(mq) => Ok(mq.reset_offset(topic, group, to).await?),
            Backend::Live(c) => {
                let (t, g) = (topic.to_owned(), group.to_owned());
                live(c, move |c| c.reset_offset(&t, &g, to)).await
            }
        }
    }

    /// `Spool::fetch`.
    pub async fn fetch(&self, topic: &str, from: u64, max: usize) -> Result<Vec<Record>> {
        match self {
            Backend::Offline(mq) => Ok(mq.fetch(topic, from, max).await?),
            Backend::Live(c) => {
                let t = topic.to_owned();
                live(c, move |c| c.fetch(&t, from, max)).await
            }
        }
    }

    /// `messages` cut into as few [`Backend::publish_batch`]es as the way in allows: none
    /// for none (so no topic is made), one (all or nothing) when the directory is opened here; through the owner, batches of
    /// what one request carries (half a frame's bytes, and the endpoint's bound on
    /// messages and headers), in order.
    pub fn batches(&self, messages: Vec<(Vec<u8>, Headers)>) -> Vec<Vec<(Vec<u8>, Headers)>> {
        if messages.is_empty() {
            return Vec::new();
        }
        if let Backend::Offline(_) = self {
            return vec![messages];
        }
        let (max_bytes, max_items) = (limits::MAX_FRAME_BYTES / 2, limits::MAX_BATCH_ITEMS);
        let mut out = vec![Vec::new()];
        let (mut bytes, mut items) = (0usize, 0usize);
        for m in messages {
            let h: usize = m.1.iter().map(|(k, v)| k.len() + v.len() + 10).sum();
            let (b, i) = (m.0.len() + h + 10, 1 + m.1.len());
            let last = out.last_mut().expect("never empty");
            if !last.is_empty() && (bytes + b > max_bytes || items + i > max_items) {
                out.push(Vec::new());
                (bytes, items) = (0, 0);
            }
            (bytes, items) = (bytes + b, items + i);
            out.last_mut().expect("never empty").push(m);
        }
        out
    }

    /// `Spool::metrics` (through the owner: one request, with the owner's sync times).
    pub async fn metrics(&self) -> Result<spool::Metrics> {
        match self {
            Backend::Offline(mq) => Ok(mq.metrics()?),
            Backend::Live(c) => live(c, |c| c.metrics()).await,
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
            Backend::Live(c) => {
                let t = topic.to_owned();
                live(c, move |c| c.publish_batch(&t, messages)).await
            }
        }
    }

    /// `Spool::delete_group`.
    pub async fn delete_group(&self, topic: &str, group: &str) -> Result<()> {
        tracing::info!(topic, group, "admin request: delete group");
        match self {
            Backend::Offline(mq) => Ok(mq.delete_group(topic, group).await?),
            Backend::Live(c) => {
                let (t, g) = (topic.to_owned(), group.to_owned());
                live(c, move |c| c.delete_group(&t, &g)).await
            }
        }
    }

    /// `Spool::delete_records_before`.
    pub async fn delete_records_before(&self, topic: &str, offset: u64) -> Result<u64> {
        tracing::info!(topic, offset, "admin request: delete records");
        match self {
            Backend::Offline(mq) => Ok(mq.delete_records_before(topic, offset).await?),
            Backend::Live(c) => {
                let t = topic.to_owned();
                live(c, move |c| c.delete_records_before(&t, offset)).await
            }
        }
    }

    /// `Spool::snapshot`.
    pub async fn snapshot(&self, dest: &Path) -> Result<SnapshotInfo> {
        tracing::info!(dest = %dest.display(), "admin request: snapshot");
        match self {
            Backend::Offline(mq) => Ok(mq.snapshot(dest).await?),
            Backend::Live(c) => {
                let d = dest.to_owned();
                live(c, move |c| c.snapshot(&d)).await
            }
        }
    }

    /// `Spool::verify` (doc-hidden): read-only.
    pub async fn verify(&self, topic: Option<&str>) -> Result<VerifyReport> {
        match self {
            Backend::Offline(mq) => Ok(mq.verify(topic).await?),
            Backend::Live(c) => {
                let t = topic.map(str::to_owned);
                live(c, move |c| c.verify(t.as_deref())).await
            }
        }
    }
}

/// Runs a blocking call of the owner's client on the runtime's blocking threads.
async fn live<T: Send + 'static>(
    c: &Arc<Client>,
    call: impl FnOnce(&Client) -> spool::Result<T> + Send + 'static,
) -> Result<T> {
    let c = c.clone();
    match tokio::task::spawn_blocking(move || call(&c)).await {
        Ok(r) => Ok(r?),
        Err(e) => Err(Failure::failed(format!(
            "a call to the owner did not finish: {e}"
        ))),
    }
}
