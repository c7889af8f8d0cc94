//! The low-level API: acks and nacks addressed to a group's cursor offset, not to a
//! delivery.
//! **Invariant:** only the cursor itself is acked or nacked, and a refused call creates
//! neither the topic nor the group.

use std::time::Duration;

use super::engine::lock;
use super::group::Group;
use super::group_cell::group_ops;
use super::nack::Failure;
use super::{Engine, NackOutcome, Topic};
use crate::error::{Error, Result};
use crate::names;

impl Engine {
    /// Low-level ack of the group's cursor.
    pub fn ack_cursor(&self, topic: &str, group: &str, offset: u64) -> Result<()> {
        self.at_cursor(topic, group, offset, |_, g| {
            g.finish(offset);
            let ops = group_ops(topic, group, g);
            self.catalog.commit(&ops)
        })
    }

    /// Low-level nack of the group's cursor (`delay`: see [`Engine::nack_delivery`]).
    pub fn nack_cursor(
        &self,
        topic: &str,
        group: &str,
        offset: u64,
        reason: &str,
        delay: Option<Duration>,
        now_ms: u64,
    ) -> Result<NackOutcome> {
        self.at_cursor(topic, group, offset, |t, g| {
            let failure = Failure { reason, delay };
            self.nack_taken(t, group, g, offset, failure, now_ms)
        })
    }

    /// Runs `f` under the group's lock once `offset`, which must be the cursor, is taken
    /// out of whatever state it was in.
    fn at_cursor<R>(
        &self,
        topic: &str,
        group: &str,
        offset: u64,
        f: impl FnOnce(&Topic, &mut Group) -> Result<R>,
    ) -> Result<R> {
        self.refuse_unless_exists_or_valid(topic, group, offset)?;
        let (t, g) = self.existing_group(topic, group)?;
        let mut g = g.lock();
        self.clamp(&t, group, &mut g);
        self.take_cursor(&t, &mut g, offset)?;
        f(&t, &mut g)
    }

    /// A low-level ack or nack addressed to a topic or group that does not exist yet is
    /// checked against the state it would start in (cursor at the earliest offset), so a
    /// refused call creates neither: only a call that succeeds brings them into being.
    fn refuse_unless_exists_or_valid(&self, topic: &str, group: &str, offset: u64) -> Result<()> {
        names::check(topic)?;
        names::check(group)?;
        let (cursor, next) = match self.topic(topic) {
            Some(t) if lock(&t.groups).contains_key(group) => return Ok(()),
            Some(t) => (t.reader.earliest(), t.reader.next()),
            None => (0, 0),
        };
        if offset != cursor {
            return Err(Error::NotAtCursor {
                expected: cursor,
                actual: offset,
            });
        }
        if offset >= next {
            return Err(Error::OffsetOutOfRange { offset, next });
        }
        Ok(())
    }

    /// Takes `offset` out of the group's state: refused unless it is the cursor and below
    /// the log's end.
    fn take_cursor(&self, t: &Topic, g: &mut Group, offset: u64) -> Result<()> {
        if offset != g.cursor {
            return Err(Error::NotAtCursor {
                expected: g.cursor,
                actual: offset,
            });
        }
        if !g.take_cursor(t.reader.next()) {
            return Err(Error::OffsetOutOfRange {
                offset,
                next: t.reader.next(),
            });
        }
        Ok(())
    }
}
