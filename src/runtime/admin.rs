//! The instance's side of the admin endpoint: each request is answered by the same
//! `Embedded` calls the application's handles make, so a change made through it is seen
//! by every consumer of this instance (a reset on its next `recv`).
//!
//! **Invariant:** the endpoint holds only a weak reference to the instance: it never
//! keeps a dropped instance (and its directory lock) alive.

use std::path::Path;
use std::sync::{Arc, Weak};

use super::{Embedded, Inner};
use crate::admin::protocol::{Request, Response, WireRecord};
use crate::admin::server::{Handler, Server};
use crate::error::{Error, Result};

/// Records read per step of a fetch, so that a large `max_records` is read in bounded
/// steps and stops at the frame's limit.
const FETCH_STEP: usize = 64;

/// Answers requests on the instance while it lives.
struct Owner {
    inner: Weak<Inner>,
}

/// Starts the endpoint of `inner`'s directory; a failure is logged, and the instance
/// runs without it (the command line then cannot reach it while it runs).
pub(super) fn start(inner: &Arc<Inner>, data_dir: &Path) -> Option<Server> {
    let owner = Arc::new(Owner {
        inner: Arc::downgrade(inner),
    });
    match Server::start(data_dir, owner) {
        Ok(s) => {
            tracing::debug!(socket = %s.socket().display(), "admin endpoint serving");
            Some(s)
        }
        Err(e) => {
            tracing::warn!(error = %e, "admin endpoint not started; the instance runs without it");
            None
        }
    }
}

impl Handler for Owner {
    fn handle(&self, request: Request) -> Response {
        let Some(inner) = self.inner.upgrade() else {
            return Response::Error((&Error::Closed).into());
        };
        let e = Embedded { inner };
        // A runtime per request, made and dropped on this connection's thread: one kept in
        // `Owner` could be dropped by a `close().await`, where tokio forbids dropping one.
        // Current-thread, no thread of its own: cheap next to a request.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build();
        let answer = match rt {
            Ok(rt) => rt.block_on(dispatch(&e, request)),
            Err(err) => Err(Error::io("starting a runtime for an admin request", err)),
        };
        answer.unwrap_or_else(|err| Response::Error((&err).into()))
    }
}

async fn dispatch(e: &Embedded, request: Request) -> Result<Response> {
    Ok(match request {
        Request::Topics => Response::Names(e.topics()?),
        Request::TopicInfo { topic } => Response::TopicInfo((&e.topic_info(&topic)?).into()),
        Request::Groups { topic } => Response::Names(e.groups(&topic)?),
        Request::GroupInfo { topic, group } => {
            Response::GroupInfo((&e.group_info(&topic, &group)?).into())
        }
        Request::ResetOffset { topic, group, to } => {
            Response::Offset(e.reset_offset(&topic, &group, to.into_reset()).await?)
        }
        Request::Fetch {
            topic,
            from,
            max_records,
        } => Response::Records(fetch(e, &topic, from, max_records).await?),
        Request::PublishBatch { topic, messages } => {
            let messages = messages.0.into_iter().map(|(p, h)| (p.0, h)).collect();
            Response::Offsets(e.publish_batch::<bytes::Bytes>(&topic, messages).await?)
        }
        Request::DeleteGroup { topic, group } => {
            e.delete_group(&topic, &group).await?;
            Response::Done
        }
        Request::DeleteRecordsBefore { topic, offset } => {
            Response::Offset(e.delete_records_before(&topic, offset).await?)
        }
        Request::Snapshot { dest } => Response::Snapshot((&e.snapshot(&dest).await?).into()),
        Request::ApplyRetention => {
            e.apply_retention()?;
            Response::Done
        }
        Request::SetTopicConfig { topic, config } => {
            e.set_topic_config(&topic, config.into_config()?).await?;
            Response::Done
        }
        Request::Verify { topic } => Response::Verify(e.verify(topic.as_deref()).await?),
        Request::Metrics => Response::Metrics((&e.metrics()?).into()),
    })
}

/// The size a `fetch` answer stops at (but for its first record): answers are not
/// counted in the endpoint's in-flight budget, so each stays small (16 connections hold
/// at most 16 of them), and a reader asks again for more.
const FETCH_ANSWER_BYTES: usize = 8 << 20;

/// Up to `max` records from `from`, read in steps, stopping before the answer would pass
/// [`FETCH_ANSWER_BYTES`] (at least one record, if there is one). A record too large for
/// any frame is an error rather than an answer that cannot be sent.
async fn fetch(e: &Embedded, topic: &str, from: u64, max: u64) -> Result<Vec<WireRecord>> {
    let frame = crate::admin::protocol::MAX_FRAME_BYTES - 4096;
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    let (mut out, mut bytes, mut next) = (Vec::new(), 0usize, from);
    while out.len() < max {
        let want = (max - out.len()).min(FETCH_STEP);
        let step = e.fetch(topic, next, want).await?;
        let short = step.len() < want;
        for r in step {
            let size = WireRecord::size_hint(&r);
            let budget = if out.is_empty() {
                frame
            } else {
                FETCH_ANSWER_BYTES
            };
            if bytes + size > budget {
                if out.is_empty() {
                    return Err(Error::Unsupported {
                        what: format!(
                            "record {} of {topic} is too large ({size} bytes) for the admin endpoint",
                            r.offset()
                        ),
                    });
                }
                return Ok(out);
            }
            bytes += size;
            next = r.offset() + 1;
            out.push(r.into());
        }
        if short {
            break;
        }
    }
    Ok(out)
}
