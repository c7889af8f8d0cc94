//! Regenerates the seed corpora in `fuzz/corpus/<target>/seed-*` from real files written
//! by spool's public API. Run from `fuzz/`:
//! `cargo test --test make_seeds -- --ignored`
//! (stable toolchain, no sanitizer needed). Each structured seed is checked by decoding it
//! back with `arbitrary` exactly as the fuzz target will.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arbitrary::{Arbitrary, Unstructured};
use spool::{Headers, Spool};
use spool_fuzz::{HeadersInput, RecoverInput};

/// Builds raw fuzzer bytes for a `#[derive(Arbitrary)]` struct decoded with
/// `arbitrary_take_rest`: byte strings are length-prefixed, and `arbitrary` reads those
/// lengths from the *end* of the input, most recent read last.
#[derive(Default)]
struct Enc {
    front: Vec<u8>,
    /// (length, bytes of `front` consumed before the length is read).
    sizes: Vec<(usize, usize)>,
}

impl Enc {
    fn byte(&mut self, b: u8) -> &mut Self {
        self.front.push(b);
        self
    }
    fn sized(&mut self, bytes: &[u8]) -> &mut Self {
        self.sizes.push((bytes.len(), self.front.len()));
        self.front.extend_from_slice(bytes);
        self
    }
    fn finish(&mut self, rest: &[u8]) -> Vec<u8> {
        self.front.extend_from_slice(rest);
        // The width of each length field depends on how many bytes remain when it is read,
        // which depends on the total length: find the total that is self-consistent.
        let n = self.sizes.len();
        for total in self.front.len()..=self.front.len() + 8 * n {
            let mut widths = Vec::with_capacity(n);
            let mut taken = 0;
            for &(_, at) in &self.sizes {
                let remaining = total - at - taken;
                let w = if remaining <= 256 {
                    1
                } else if remaining <= 65_537 {
                    2
                } else {
                    panic!("seed too large for this encoder");
                };
                widths.push(w);
                taken += w;
            }
            if self.front.len() + taken != total {
                continue;
            }
            let mut out = self.front.clone();
            for (&(len, _), &w) in self.sizes.iter().zip(&widths).rev() {
                match w {
                    1 => out.push(u8::try_from(len).expect("fits")),
                    _ => out.extend_from_slice(&u16::try_from(len).expect("fits").to_be_bytes()),
                }
            }
            return out;
        }
        panic!("no self-consistent encoding");
    }
}

fn recover_input(index: &[u8], segment: &[u8]) -> Vec<u8> {
    let raw = Enc::default().sized(index).finish(segment);
    let back = RecoverInput::arbitrary_take_rest(Unstructured::new(&raw)).expect("decodes");
    assert_eq!(back, RecoverInput { index, segment });
    raw
}

fn headers_input(headers: &Headers, payload: &[u8]) -> Vec<u8> {
    let mut e = Enc::default();
    for (k, v) in headers {
        e.byte(1).sized(k.as_bytes()).sized(v.as_bytes());
    }
    let raw = e.byte(0).finish(payload);
    let back = HeadersInput::arbitrary_take_rest(Unstructured::new(&raw)).expect("decodes");
    assert_eq!(
        back,
        HeadersInput {
            headers: headers.clone(),
            payload
        }
    );
    raw
}

fn headers(pairs: &[(&str, &str)]) -> Headers {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect::<BTreeMap<_, _>>()
}

/// Publishes `messages` to topic `t` and returns the topic's directory.
fn publish(dir: &Path, settings: &str, messages: &[(&[u8], Headers)]) -> PathBuf {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mq = Spool::open(&format!("Data Source={};{settings}", dir.display())).expect("open");
        for (p, h) in messages {
            mq.publish("t", p.to_vec(), h).await.expect("publish");
        }
        mq.close().await.expect("close");
    });
    dir.join("topics").join("t")
}

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    std::fs::create_dir_all(&dir).expect("corpus dir");
    std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("write seed");
}

#[test]
#[ignore = "writes the seed corpora; run by hand"]
fn make_seeds() {
    let tmp = tempfile::tempdir().expect("tempdir");

    // A small active segment: three records, two with a message-id, an index entry every
    // 64 bytes.
    let small = publish(
        &tmp.path().join("small"),
        "Sync=None;Index Interval Bytes=64",
        &[
            (b"hello", Headers::new()),
            (b"world", headers(&[("message-id", "id-1")])),
            (b"third", headers(&[("message-id", "id-2"), ("k", "v")])),
        ],
    );
    let log = std::fs::read(small.join("00000000000000000000.log")).expect("log");
    let idx = std::fs::read(small.join("00000000000000000000.idx")).expect("idx");
    assert!(idx.len() >= 64, "the index holds entries");

    // A sealed first segment (rolled at 1 KiB) with its footer-terminated index.
    let msgs: Vec<(&[u8], Headers)> = (0..40)
        .map(|_| (&b"0123456789abcdefghij"[..], Headers::new()))
        .collect();
    let rolled = publish(
        &tmp.path().join("rolled"),
        "Sync=None;Segment Bytes=1024;Index Interval Bytes=256",
        &msgs,
    );
    let sealed_log = std::fs::read(rolled.join("00000000000000000000.log")).expect("log");
    let sealed_idx = std::fs::read(rolled.join("00000000000000000000.idx")).expect("idx");

    let records = &log[32..];
    let torn = &log[..log.len() - 7];
    let mut garbage = log.clone();
    garbage.extend_from_slice(&[0xff; 12]);

    write("decode_records", "records", records);
    write("decode_records", "torn", &records[..records.len() - 7]);
    write("decode_records", "segment", &log);
    write("decode_records", "active-index", &idx);
    write("decode_records", "sealed-index", &sealed_idx);

    // Seeds whose segment starts with `S` (odd) keep their own header; `records` starts
    // with an even length byte, so the target prepends a valid header to it.
    assert_eq!(records[0] & 1, 0);
    write("recover_segment", "valid", &recover_input(&idx, &log));
    write("recover_segment", "no-index", &recover_input(&[], &log));
    write("recover_segment", "torn", &recover_input(&idx, torn));
    write(
        "recover_segment",
        "garbage-tail",
        &recover_input(&idx, &garbage),
    );
    write(
        "recover_segment",
        "headerless",
        &recover_input(&[], records),
    );
    write(
        "recover_segment",
        "sealed",
        &recover_input(&sealed_idx, &sealed_log),
    );

    for (name, s) in [
        (
            "full",
            "Data Source=./x;Mode=Embedded;Sync=Interval:25;Segment Bytes=4096",
        ),
        (
            "every-key",
            " data source = ./x ; MODE=embedded; sync=always; Retention Bytes=10; \
             Retention Ms=20; Max Message Bytes=100; Max Header Bytes=50; Dedup Window=7; \
             Max Delivery Attempts=3; Dead Letter Suffix=.dead; Dead Letter Chain=yes; \
             Commit Interval Ms=5; Index Interval Bytes=64; Retention Check Ms=9",
        ),
        ("minimal", "Data Source=d"),
        (
            "sync-none",
            "DataSource=d;Sync=None;Max_Delivery_Attempts=0;Dead Letter Suffix=",
        ),
        ("repeated", "Data Source=a;data source=b"),
    ] {
        write("connection_string", name, s.as_bytes());
    }

    write("headers", "empty", &headers_input(&Headers::new(), b"p"));
    write(
        "headers",
        "message-id",
        &headers_input(&headers(&[("k", "v"), ("message-id", "id-1")]), b"payload"),
    );
    write(
        "headers",
        "unicode",
        &headers_input(&headers(&[("clé", "värde ✓"), ("", "")]), &[0, 1, 2, 255]),
    );
}
