//! Fuzzes the store's recovery scan (`array::log::segment::scan_segment`) and record decoder
//! over arbitrary segment bytes: what a crash, a torn write, a flipped sector or a recycled
//! file's older records can leave. Nothing may panic; the scan keeps a prefix; every record it
//! hands over lies inside that prefix, in order, carries the scanned segment's stamp (or none,
//! version 1), and re-encodes with that stamp to bytes that decode to the same record.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stompgate::array::log::record::{self, Record};
use stompgate::array::log::segment::scan_segment;

fuzz_target!(|data: &[u8]| {
    let Some((&stamp, bytes)) = data.split_first() else { return };
    // A small stamp, so that generated records can carry the scanned segment's.
    let stamp = u32::from(stamp % 4);
    for owner in [Some(stamp), None] {
        let mut last_end = 0u64;
        let mut seen: Vec<(u64, Record<'_>)> = Vec::new();
        let scan = scan_segment(bytes, owner, |offset, rec| seen.push((offset, rec)));
        assert!(scan.good_len <= bytes.len());
        assert_eq!(scan.records, seen.len() as u64);
        for (offset, rec) in seen {
            assert!(offset >= last_end, "records come in order, without overlap");
            let at = &bytes[offset as usize..];
            let frame = record::frame(at).expect("a handed-over record has good framing");
            if let Some(owner) = owner {
                assert!(frame.stamp.is_none_or(|s| s == owner), "only the segment's own records");
            }
            last_end = offset + frame.len as u64;
            assert!(last_end <= scan.good_len as u64, "inside the prefix kept");
            let mut again = Vec::new();
            record::encode(&rec, frame.stamp.unwrap_or(0), &mut again).expect("a decoded record re-encodes");
            assert_eq!(record::decode(&again).map(|(r, n)| (r, n == again.len())), Ok((rec, true)));
        }
    }
    let _ = record::decode(bytes);
});
