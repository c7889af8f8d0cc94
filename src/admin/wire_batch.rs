//! A publish's messages on the wire, decoded within a bound.
//!
//! Why not a plain `Vec<(Payload, Headers)>`: an empty message is two bytes on the wire
//! but about sixty in memory, and a one-letter header about four bytes against a hundred.
//! One 64 MiB frame of them would make the owner allocate gigabytes. Here every message
//! and every header counts as one item, and decoding stops with an error at
//! [`MAX_BATCH_ITEMS`], so one request costs at most its frame, a copy of its bytes, and
//! `MAX_BATCH_ITEMS` small structures (tens of MiB).
//!
//! The encoding is exactly a `Vec<(Payload, Headers)>`'s: the bound is on decoding only.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use super::protocol::Payload;
use crate::format::Headers;

/// The most messages plus headers one publish request may carry. A client refuses a
/// larger batch before sending anything.
pub const MAX_BATCH_ITEMS: usize = 1 << 18;

/// The messages of a `PublishBatch` request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireBatch(pub Vec<(Payload, Headers)>);

impl WireBatch {
    /// The items a batch counts against [`MAX_BATCH_ITEMS`].
    pub fn items(&self) -> usize {
        self.0.iter().map(|(_, h)| 1 + h.len()).sum()
    }
}

impl Serialize for WireBatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(&self.0)
    }
}

impl<'de> Deserialize<'de> for WireBatch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<WireBatch, D::Error> {
        d.deserialize_seq(Messages {
            left: MAX_BATCH_ITEMS,
        })
    }
}

/// Takes one item of what is still allowed, or fails the decoding.
fn charge<E: serde::de::Error>(left: &mut usize) -> Result<(), E> {
    *left = left.checked_sub(1).ok_or_else(|| {
        E::custom(format!(
            "a publish request carries more than {MAX_BATCH_ITEMS} messages and headers"
        ))
    })?;
    Ok(())
}

struct Messages {
    left: usize,
}

impl<'de> Visitor<'de> for Messages {
    type Value = WireBatch;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence of messages")
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<WireBatch, A::Error> {
        // Never trust the announced length for the allocation: grow as messages arrive.
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        // Each message is charged once decoded: past the bound by one message at most.
        while let Some(m) = seq.next_element_seed(Message(&mut self.left))? {
            charge::<A::Error>(&mut self.left)?;
            out.push(m);
        }
        Ok(WireBatch(out))
    }
}

/// One `(Payload, Headers)`, its headers charged to the batch's count.
struct Message<'a>(&'a mut usize);

impl<'de> DeserializeSeed<'de> for Message<'_> {
    type Value = (Payload, Headers);

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_tuple(2, self)
    }
}

impl<'de> Visitor<'de> for Message<'_> {
    type Value = (Payload, Headers);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a payload and its headers")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let payload: Payload = seq
            .next_element()?
            .ok_or_else(|| A::Error::invalid_length(0, &"a payload and its headers"))?;
        let headers = seq
            .next_element_seed(HeaderMap(self.0))?
            .ok_or_else(|| A::Error::invalid_length(1, &"a payload and its headers"))?;
        Ok((payload, headers))
    }
}

/// A message's headers, each charged as it is decoded.
struct HeaderMap<'a>(&'a mut usize);

impl<'de> DeserializeSeed<'de> for HeaderMap<'_> {
    type Value = Headers;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Headers, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for HeaderMap<'_> {
    type Value = Headers;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("headers")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Headers, A::Error> {
        let mut out = BTreeMap::new();
        while let Some((k, v)) = map.next_entry::<String, String>()? {
            charge::<A::Error>(self.0)?;
            out.insert(k, v);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn message(headers: usize) -> (Payload, Headers) {
        let h = (0..headers).map(|i| (format!("k{i}"), String::new()));
        (Payload(Bytes::from_static(b"x")), h.collect())
    }

    #[test]
    fn a_batch_encodes_as_a_vec_and_comes_back_whole() {
        let batch = WireBatch(vec![message(0), message(3), message(1)]);
        let ours = postcard::to_stdvec(&batch).expect("encode");
        let plain = postcard::to_stdvec(&batch.0).expect("encode");
        assert_eq!(ours, plain, "the wire format is a Vec's");
        assert_eq!(postcard::from_bytes::<WireBatch>(&ours), Ok(batch.clone()));
        assert_eq!(batch.items(), 7);
    }

    #[test]
    fn decoding_stops_at_the_item_bound_for_messages_and_for_headers() {
        let exact = WireBatch(vec![message(0); MAX_BATCH_ITEMS]);
        let bytes = postcard::to_stdvec(&exact).expect("encode");
        assert_eq!(postcard::from_bytes::<WireBatch>(&bytes), Ok(exact));

        let over = vec![message(0); MAX_BATCH_ITEMS + 1];
        let bytes = postcard::to_stdvec(&over).expect("encode");
        assert!(postcard::from_bytes::<WireBatch>(&bytes).is_err());

        // One message whose headers pass the bound alone.
        let wide = vec![message(MAX_BATCH_ITEMS)];
        let bytes = postcard::to_stdvec(&wide).expect("encode");
        assert!(postcard::from_bytes::<WireBatch>(&bytes).is_err());
    }

    #[test]
    fn an_announced_length_beyond_the_bytes_is_an_error_not_an_allocation() {
        // A varint length of about 2^32 messages followed by nothing.
        let bytes = [0xff, 0xff, 0xff, 0xff, 0x0f];
        assert!(postcard::from_bytes::<WireBatch>(&bytes).is_err());
    }
}
