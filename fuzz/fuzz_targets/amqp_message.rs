//! Fuzzes the AMQP message mapping: any bytes as a message (all its transfer frames' payloads
//! joined) must decode or be refused without panicking; what decodes, encoded for a receiver
//! with its `amqp10` envelope as Metadata, must decode again to the same body and its tags first
//! (the envelope may bring back application properties past the tag cap, which then follow);
//! and any bytes as Metadata must be read as an envelope or not without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stompgate::amqp::{envelope, mapping};

fuzz_target!(|data: &[u8]| {
    let _ = envelope::read(data);
    let mut prefixed = br#"{"amqp10":"#.to_vec();
    prefixed.extend_from_slice(data);
    let _ = envelope::read(&prefixed);
    let Ok(incoming) = mapping::decode(data) else { return };
    let encoded = mapping::encode(b"m-1", &incoming.body, &incoming.tags, &incoming.metadata);
    let again = mapping::decode(&encoded).expect("what the gateway encodes decodes");
    assert_eq!(again.body, incoming.body);
    assert!(again.tags.0.starts_with(&incoming.tags.0), "{:?} then {:?}", incoming.tags, again.tags);
});
