//! Publishing: message checks, de-duplication by `message-id`, appends, and the window
//! of ids rebuilt from the log at open.
//! **Invariant:** a batch is all or nothing (every message is checked before anything is
//! appended), and the de-duplication window holds exactly the ids of records that
//! reached the log, the window a reopen rebuilds.

use std::collections::HashMap;
use std::sync::Arc;

use super::dedup::Dedup;
use super::engine::lock;
use super::topic::Writer;
use super::{Engine, Topic};
use crate::error::{Error, Result};
use crate::format::Headers;
use crate::format::record;
use crate::log::segment::Segment;
use crate::log::{Append, LogReader, MESSAGE_ID_HEADER};
use crate::names;
use crate::options::{MAX_MESSAGE_ID_BYTES, Options, SyncPolicy};

/// A message as [`Engine::publish`] reads it (so callers need not build a second list).
pub trait Message {
    fn payload(&self) -> &[u8];
    fn headers(&self) -> &Headers;
}

impl Message for (&[u8], &Headers) {
    fn payload(&self) -> &[u8] {
        self.0
    }
    fn headers(&self) -> &Headers {
        self.1
    }
}

impl Message for (bytes::Bytes, Headers) {
    fn payload(&self) -> &[u8] {
        &self.0
    }
    fn headers(&self) -> &Headers {
        &self.1
    }
}

/// The offsets a publish got: a single message needs no list (no allocation).
#[derive(Debug)]
pub enum Offsets {
    One(u64),
    Many(Vec<u64>),
}

impl Offsets {
    pub fn first(&self) -> Option<u64> {
        match self {
            Offsets::One(o) => Some(*o),
            Offsets::Many(v) => v.first().copied(),
        }
    }
    pub fn into_vec(self) -> Vec<u64> {
        match self {
            Offsets::One(o) => vec![o],
            Offsets::Many(v) => v,
        }
    }
}

/// What a publish needs synced to be durable.
#[derive(Debug)]
pub struct Published {
    pub offsets: Offsets,
    /// The segment to sync, under `Sync=Always` only.
    pub segment: Option<Arc<Segment>>,
    /// The segment must be durable up to here (covers de-duplication hits too).
    pub end: u64,
    /// The topic, under `Sync=Always` when this publish appended records that no earlier
    /// publish's hand-over covers (it started holding records in memory,
    /// `TopicLog::append_held`, or wrote them): the sync thread writes what is held and
    /// syncs, which makes them visible, also if this publish is cancelled.
    pub held: Option<Arc<Topic>>,
    /// Nothing is held: this publish's records are visible to readers already.
    pub visible: bool,
}

/// A publish's messages, sorted out before anything is appended: the offset each one
/// gets, and the records to append.
struct Batch<'m> {
    /// The log's end when the batch was sorted: the first appended record's offset.
    first: u64,
    /// A single message lives on the stack: no allocation per `publish` call.
    single: bool,
    one_offset: Option<u64>,
    one_append: Option<Append<'m>>,
    offsets: Vec<u64>,
    appends: Vec<Append<'m>>,
    /// Ids this call appends, in log order (the order they enter the window), and
    /// where each one is in that list.
    new_ids: Vec<(&'m str, u64)>,
}

impl<'m> Batch<'m> {
    #[inline]
    fn new(first: u64, messages: usize) -> Batch<'m> {
        let single = messages == 1;
        let capacity = if single { 0 } else { messages };
        Batch {
            first,
            single,
            one_offset: None,
            one_append: None,
            offsets: Vec::with_capacity(capacity),
            appends: Vec::with_capacity(capacity),
            new_ids: Vec::new(),
        }
    }

    /// The offset the next record pushed gets.
    #[inline]
    fn next_offset(&self) -> u64 {
        self.first + self.appends.len() as u64
    }

    /// A de-duplication hit: the message gets `offset`, an earlier record's.
    #[inline]
    fn hit(&mut self, offset: u64) {
        if self.single {
            self.one_offset = Some(offset);
        } else {
            self.offsets.push(offset);
        }
    }

    /// A record to append.
    #[inline]
    fn push(&mut self, a: Append<'m>) {
        if self.single {
            self.one_offset = Some(self.first);
            self.one_append = Some(a);
        } else {
            self.offsets.push(self.next_offset());
            self.appends.push(a);
        }
    }

    #[inline]
    fn appends(&self) -> &[Append<'m>] {
        match &self.one_append {
            Some(a) => std::slice::from_ref(a),
            None => &self.appends[..],
        }
    }

    #[inline]
    fn into_offsets(self) -> Offsets {
        match self.one_offset {
            Some(o) => Offsets::One(o),
            None => Offsets::Many(self.offsets),
        }
    }
}

impl Engine {
    /// Checks a message before anything is appended (all-or-nothing batches).
    /// Returns the encoded headers' length (so the append does not compute it again).
    fn check_message(&self, payload: &[u8], headers: &Headers) -> Result<usize> {
        check_message(&self.opts, payload, headers)
    }

    /// Appends `msgs` as one write; de-duplicates by `message-id` (a hit returns the
    /// original offset and appends nothing, also within the batch).
    pub fn publish<M: Message>(&self, topic: &str, msgs: &[M], now_ms: u64) -> Result<Published> {
        let t = self.publish_topic(topic, msgs, now_ms)?;
        let mut guard = lock(&t.writer);
        let w = &mut *guard;
        let mut batch = Batch::new(w.log.next(), msgs.len());
        self.sort_batch(w, msgs, &mut batch)?;
        let held_before = w.log.holds();
        let appending = !batch.appends().is_empty();
        if appending {
            self.append_batch(topic, w, &batch, now_ms)?;
        }
        Ok(Published {
            offsets: batch.into_offsets(),
            segment: (self.opts.sync == SyncPolicy::Always).then(|| w.log.active().clone()),
            end: w.log.end(),
            // Under `Sync=Always` the sync thread makes them visible (`Published::held`).
            held: {
                // Held with earlier records: that publish's hand-over covers them.
                let covered = held_before && w.log.holds();
                (appending && !w.log.visible_when_written() && !covered).then(|| t.clone())
            },
            visible: w.log.visible_when_written() && !w.log.holds(),
        })
    }

    /// The topic `publish` appends to, created if new.
    #[inline]
    fn publish_topic<M: Message>(
        &self,
        topic: &str,
        msgs: &[M],
        now_ms: u64,
    ) -> Result<Arc<Topic>> {
        // Every topic in the map has a valid name (`open_topic`): only a new one is checked.
        if let Some(t) = self.topic(topic) {
            return Ok(t);
        }
        names::check(topic)?;
        // A batch that would be refused creates no topic.
        for m in msgs {
            self.check_message(m.payload(), m.headers())?;
        }
        self.topic_or_create(topic, now_ms)
    }

    /// Checks every message and looks up its id: fills `b` with the offset each one gets,
    /// and the records to append. Reads the writer's window only. (`b` is the caller's,
    /// not returned: a returned batch is copied, measurably on the one-record path.)
    #[inline]
    fn sort_batch<'m, M: Message>(
        &self,
        w: &Writer,
        msgs: &'m [M],
        b: &mut Batch<'m>,
    ) -> Result<()> {
        // Only a batch can repeat an id within itself (and a map's hasher costs a
        // single publish a few percent of its instructions).
        let mut batch_ids: Option<HashMap<&str, usize>> = None;
        for m in msgs {
            let (payload, headers) = (m.payload(), m.headers());
            // All or nothing: nothing is appended or remembered before this loop ends.
            let headers_len = self.check_message(payload, headers)?;
            let id = headers.get(MESSAGE_ID_HEADER).map(String::as_str);
            if let Some(id) = id
                && w.dedup.enabled()
            {
                // As if the batch were published message by message: each id appended
                // before this one in the batch pushes the window's oldest id out.
                let k = b.new_ids.len();
                let hit = match batch_ids.as_ref().and_then(|ids| ids.get(id)) {
                    Some(&j) => (k - j <= self.opts.dedup_window).then(|| b.new_ids[j].1),
                    None => w.dedup.lookup_after(id, k),
                };
                if let Some(o) = hit {
                    b.hit(o);
                    continue;
                }
                batch_ids.get_or_insert_with(HashMap::new).insert(id, k);
                b.new_ids.push((id, b.next_offset()));
            }
            b.push(Append {
                payload,
                headers,
                headers_len,
            });
        }
        Ok(())
    }

    /// Appends the batch's records as one write (held for the sync thread under
    /// `Sync=Always`), and remembers the ids of those that reached the log.
    #[inline]
    fn append_batch(&self, topic: &str, w: &mut Writer, b: &Batch<'_>, now_ms: u64) -> Result<()> {
        let appended = if self.opts.sync == SyncPolicy::Always {
            w.log.append_held(b.appends(), now_ms)
        } else {
            w.log.append(b.appends(), now_ms)
        };
        // Every id whose record reached the log, also when the batch failed after a
        // part of it did (a failed roll keeps the records before it): a retry must
        // find them, and the window stays the one a reopen rebuilds from the log.
        let next = w.log.next();
        if appended.is_err() {
            w.forget_dropped();
            // It may have written records before it failed (held ones of other
            // publishes, or its batch's part before a failed roll).
            self.visible(topic);
        }
        for &(id, o) in &b.new_ids {
            if o < next {
                w.dedup.insert(id, o);
            }
        }
        let got = appended?;
        debug_assert_eq!(got, b.first);
        Ok(())
    }

    /// Appends without de-duplication (dead-letter copies) and syncs before returning.
    pub(super) fn append_durable(
        &self,
        topic: &str,
        payload: &[u8],
        headers: &Headers,
        now_ms: u64,
    ) -> Result<u64> {
        let t = self.topic_or_create(topic, now_ms)?;
        let mut w = lock(&t.writer);
        let headers_len = record::headers_len(headers);
        let appended = w.log.append(
            &[Append {
                payload,
                headers,
                headers_len,
            }],
            now_ms,
        );
        if appended.is_err() {
            w.forget_dropped();
            self.visible(topic);
        }
        let o = appended?;
        // Not looked up (two groups may dead-letter one message), but remembered, so the
        // window is the same as the one a reopen rebuilds from the log.
        if let Some(id) = headers.get(MESSAGE_ID_HEADER) {
            w.dedup.insert(id, o);
        }
        let synced = w.log.sync();
        drop(w);
        // The copy, and records held before it that its append wrote, are readable now.
        self.visible(topic);
        synced?;
        Ok(o)
    }
}

/// Loads the last `window` message ids of the log, reading segments newest first and
/// skipping those without ids, so the work is bounded by the window, not the log.
/// Checks a message against the limits of `opts` before anything is written (every
/// backend's batches are all or nothing against bad input). Returns the encoded headers'
/// length.
pub(crate) fn check_message(opts: &Options, payload: &[u8], headers: &Headers) -> Result<usize> {
    if payload.len() > opts.max_message_bytes {
        return Err(Error::MessageTooLarge {
            size: payload.len(),
            max: opts.max_message_bytes,
        });
    }
    let hlen = record::headers_len(headers);
    if hlen > opts.max_header_bytes {
        return Err(Error::HeadersTooLarge {
            size: hlen,
            max: opts.max_header_bytes,
        });
    }
    if let Some(id) = headers.get(MESSAGE_ID_HEADER) {
        if id.is_empty() {
            return Err(Error::InvalidMessageId {
                reason: "it is empty".into(),
            });
        }
        if id.len() > MAX_MESSAGE_ID_BYTES {
            return Err(Error::InvalidMessageId {
                reason: format!("it is {} bytes long", id.len()),
            });
        }
    }
    Ok(hlen)
}

pub(super) fn rebuild_dedup(reader: &LogReader, dedup: &mut Dedup, window: usize) -> Result<()> {
    let mut chunks: Vec<Vec<(String, u64)>> = Vec::new();
    let mut have = 0usize;
    for seg in reader.segments_newest_first() {
        if have >= window {
            break;
        }
        if seg.summary().id_count == 0 {
            continue;
        }
        let want = (window - have) as u64;
        let mut ids = Vec::new();
        let visited = reader.last_ids(&seg, want, &mut ids);
        if let Err(e) = visited {
            // Anything but damage (out of descriptors, an I/O error) fails the open: a
            // rebuild that silently missed ids would let duplicates in.
            if !matches!(e, Error::Corrupt { .. }) {
                return Err(e);
            }
            // A damaged sealed segment fails its reads with `Corrupt`; it must not keep
            // the whole instance from opening. Its ids (those read before the damage are
            // kept) may be missed by de-duplication: say so.
            tracing::error!(segment = %seg.path.display(), error = %e,
                "de-duplication rebuild could not read a damaged segment; its message ids may not de-duplicate");
        }
        let keep = ids.len().min(window - have);
        let ids = ids.split_off(ids.len() - keep);
        have += ids.len();
        chunks.push(ids);
    }
    for chunk in chunks.into_iter().rev() {
        for (id, o) in chunk {
            dedup.insert(&id, o);
        }
    }
    Ok(())
}
