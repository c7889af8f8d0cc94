//! Inputs that once made a fuzz target (`fuzz/`) panic, replayed through the same
//! `spool::fuzzing` entry points. Each test is named after what the input exposed.

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2));
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// `recover_segment`: a valid record 0, then a checksum-valid record numbered 5, then a torn
/// frame. Recovery stopped at the misnumbered record but truncated the file to the start
/// of the scan chunk, dropping record 0 while still counting it in `next` (so a read found
/// no record and the next append reused a lost offset's position).
#[test]
fn recovery_keeps_records_before_an_out_of_sequence_record() {
    let index = hex("aeffffff00000000200000000000000000000000000000003f55b166");
    let segment = hex(concat!(
        // header: magic, base 0, created_ms, crc
        "53504c010000000000000000000000006fb00e29a201000000000000a5c87c6d",
        // record 0 (49 bytes)
        "29000000b685131300000000000000006fb00e29a20100000100000000",
        "303132333435363738396162636465666768696a",
        // a valid frame carrying offset 5 where 1 was expected
        "29000000a32b4bd8050000000000000070b00e29a20100000100000000",
        "303132333435363738396162636465666768696a",
        // a torn frame
        "2900006a00",
    ));
    let dir = tempfile::tempdir().expect("tempdir");
    spool::fuzzing::recover_active_segment(dir.path(), &segment, &index);
}

/// `recover_segment`: an index whose entries (offset 0 at byte 32, offset 6 at byte 326) are
/// valid and point at real records, in front of a segment whose first record is garbage.
/// Open trusts the records before the last index entry without reading them, so the damage
/// surfaces as `Error::Corrupt` from a read; the harness used to treat that as a failure to
/// read back. Now it compares with a full scan of the same bytes, which stops at the
/// garbage, and accepts the read error only in that case.
#[test]
fn recovery_with_an_index_past_prefix_damage_reports_it_on_read() {
    let index = hex(concat!(
        "000000000000000020000000000000006fb00e29a20100000000000000000000060000000000000046010000",
        "0000000070b00e29a201000001000000000000100c000000000000006c020000000000696a29000000a00c15",
        "d307000000019c023b060000000000000070b00e29a201000001000000003031323334353637383961626364",
        "65666768696a29000000a00c15d3070000000000a00c15d3070000000000290032336a00c000000029000100",
        "303132333468696a00c0000000a32b4b",
    ));
    let segment = hex(concat!(
        "d8050000000000000070b00e29a20100000100000000303132333435363738396162636465666768696a2900",
        "0000019c023b060000000000000070b00e29a201000001000000003031323334353637383961626364656667",
        "68696a29000000a00c15d3070000000000290032333468696a00c03233343536373839616263646566676869",
        "6a29000000019c023b060000000000000070b00e29a201000001000000003031323334353637383961626364",
        "65666768696a29000000a00c15d3070000000000290032336a00c029000000019c023b060000000000000070",
        "b00e29a20100000100000000303132333435363738396162636465666768696a29000000a00c15d307000000",
        "0000290032333468696a00c032333435363738396162636465666768696a29000000019c023b060000000000",
        "000070b00e29a20100000100000000303132333435363738396162636465666768696a",
    ));
    let dir = tempfile::tempdir().expect("tempdir");
    spool::fuzzing::recover_active_segment(dir.path(), &segment, &index);
}

/// The same shape with a timestamp that goes backwards instead of a bad offset: the scan
/// stops there through the same path, and must keep the record before it.
#[test]
fn recovery_keeps_records_before_a_backwards_timestamp() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let log = rt.block_on(async {
        let mq =
            spool::Spool::open(&format!("Data Source={};Sync=None", data.display())).expect("open");
        for p in [&b"a"[..], b"b"] {
            mq.publish("t", p.to_vec(), &spool::Headers::new())
                .await
                .expect("publish");
        }
        mq.close().await.expect("close");
        std::fs::read(data.join("topics/t/00000000000000000000.log")).expect("segment")
    });
    // Frame: `len u32 | crc32 u32 | offset u64 | timestamp_ms u64 | ...`, crc over the
    // length field and the body.
    let header = 32;
    let frame_at =
        |at: usize| 8 + u32::from_le_bytes(log[at..at + 4].try_into().expect("4 bytes")) as usize;
    let first_len = frame_at(header);
    let second_at = header + first_len;
    let mut second = log[second_at..second_at + frame_at(second_at)].to_vec();
    second[16..24].copy_from_slice(&0u64.to_le_bytes());
    let mut h = crc32fast::Hasher::new();
    h.update(&second[0..4]);
    h.update(&second[8..]);
    let crc = h.finalize();
    second[4..8].copy_from_slice(&crc.to_le_bytes());
    let mut segment = log[..header + first_len].to_vec();
    segment.extend_from_slice(&second);
    let fresh = tempfile::tempdir().expect("tempdir");
    spool::fuzzing::recover_active_segment(fresh.path(), &segment, &[]);
}
