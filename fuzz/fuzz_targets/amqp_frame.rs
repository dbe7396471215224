//! Fuzzes the AMQP 1.0 frame layer: any bytes, fed whole or cut into pieces (sizes taken from
//! the input's first byte), must decode without panicking, give the same frames (by their
//! debug text) either way, and never take more than the max-frame-size per frame.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use stompgate::amqp::frame::{read_protocol_header, FrameDecoder};

const MAX: u32 = 4096;

fn decode(input: &[u8], step: usize) -> Vec<String> {
    let dec = FrameDecoder::new(MAX);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut header_done = false;
    for piece in input.chunks(step.max(1)) {
        buf.extend_from_slice(piece);
        if !header_done {
            match read_protocol_header(&mut buf) {
                Ok(Some(h)) => {
                    header_done = true;
                    out.push(format!("{h:?}"));
                }
                Ok(None) => continue,
                Err(e) => {
                    out.push(format!("{e:?}"));
                    return out;
                }
            }
        }
        loop {
            let before = buf.len();
            match dec.decode(&mut buf) {
                Ok(Some(f)) => {
                    assert!(before - buf.len() <= MAX as usize);
                    out.push(format!("{f:?}"));
                }
                Ok(None) => break,
                Err(e) => {
                    out.push(format!("{e:?}"));
                    return out;
                }
            }
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&step, input)) = data.split_first() else { return };
    assert_eq!(decode(input, input.len()), decode(input, usize::from(step)));
});
