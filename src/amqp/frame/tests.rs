use super::*;
use fe2o3_amqp_types::definitions::{Handle, Role};
use fe2o3_amqp_types::performatives::{Attach, Begin, Open, Transfer};
use proptest::prelude::*;

fn open() -> Performative {
    Performative::Open(Open {
        container_id: "c1".into(),
        hostname: None,
        max_frame_size: 65536.into(),
        channel_max: 255.into(),
        idle_time_out: Some(30_000),
        outgoing_locales: None,
        incoming_locales: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    })
}

fn transfer(more: bool) -> Performative {
    Performative::Transfer(Transfer {
        handle: Handle(3),
        delivery_id: Some(7),
        delivery_tag: Some(serde_amqp::primitives::Binary::from(vec![1, 2])),
        message_format: Some(0),
        settled: Some(true),
        more,
        rcv_settle_mode: None,
        state: None,
        resume: false,
        aborted: false,
        batchable: false,
    })
}

fn decode_all(dec: &FrameDecoder, bytes: &[u8]) -> Result<Vec<Frame>, FrameError> {
    let mut buf = BytesMut::from(bytes);
    let mut out = Vec::new();
    while let Some(f) = dec.decode(&mut buf)? {
        out.push(f);
    }
    Ok(out)
}

#[test]
fn an_open_round_trips() {
    let mut out = BytesMut::new();
    write_amqp(&mut out, 0, &open(), &[]);
    let frames = decode_all(&FrameDecoder::new(65536), &out).unwrap();
    match &frames[..] {
        [Frame::Amqp { channel: 0, performative, payload }] => {
            assert_eq!(**performative, open());
            assert!(payload.is_empty());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_transfer_keeps_its_payload_byte_exact() {
    let payload: Vec<u8> = (0..=255u8).collect();
    let mut out = BytesMut::new();
    write_amqp(&mut out, 5, &transfer(true), &payload);
    let frames = decode_all(&FrameDecoder::new(65536), &out).unwrap();
    match &frames[..] {
        [Frame::Amqp { channel: 5, performative, payload: got }] => {
            assert_eq!(**performative, transfer(true));
            assert_eq!(&got[..], &payload[..]);
        }
        other => panic!("{other:?}"),
    }
}

/// The fuzz target's find: an array8 inside a list whose size cannot hold its count made
/// serde_amqp 0.18 subtract with overflow (a panic in debug builds). Refused before the crate.
#[test]
fn a_compound_too_small_for_its_count_is_a_bad_body_not_a_panic() {
    // The fuzz input's first byte is its piece size; the rest is the stream.
    let input = include_bytes!("../../../fuzz/corpus/amqp_frame/regress-array8-size-below-count");
    let mut buf = BytesMut::from(&input[1..]);
    assert!(matches!(read_protocol_header(&mut buf), Ok(Some(_))));
    assert!(matches!(FrameDecoder::new(4096).decode(&mut buf), Err(FrameError::BadBody)));
    // The same rule for each compound, 8- and 32-bit: size below the count field's width.
    for bad in [&[0xc0u8, 0x00][..], &[0xc1, 0x00], &[0xe0, 0x00], &[0xd0, 0, 0, 0, 3], &[0xf0, 0, 0, 0, 0]] {
        assert!(!well_formed(bad), "{bad:02x?}");
    }
    assert!(well_formed(&[0xc0, 0x01, 0x00]), "an empty list8");
    assert!(well_formed(&[0xe0, 0x04, 0x02, 0x50, 0x07, 0x08]), "an array8 of two ubytes");
    assert!(!well_formed(&[0xe0, 0x04, 0x03, 0x50, 0x07, 0x08]), "three ubytes claimed, two there");
}

/// Nesting is bounded before serde_amqp's recursive decoder sees it.
#[test]
fn nesting_past_the_depth_limit_is_refused() {
    let mut deep = Vec::new();
    for _ in 0..(MAX_DEPTH + 2) {
        deep.extend_from_slice(&[0x00, 0x53, 0x10]);
    }
    deep.push(0x45);
    assert!(!well_formed(&deep));
    assert!(well_formed(&[0x00, 0x53, 0x10, 0x45]));
}

#[test]
fn an_empty_frame_is_a_heart_beat() {
    let mut out = BytesMut::new();
    write_empty(&mut out);
    assert!(matches!(&decode_all(&FrameDecoder::default(), &out).unwrap()[..], [Frame::Empty { channel: 0 }]));
}

#[test]
fn a_crafted_huge_size_is_refused_from_the_header_alone() {
    // 4 GiB - 1 announced, 8 bytes sent: refused at once, nothing reserved for it.
    let mut buf = BytesMut::from(&[0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0][..]);
    let cap_before = buf.capacity();
    assert_eq!(FrameDecoder::new(131072).decode(&mut buf).unwrap_err(), FrameError::SizeTooLarge { size: u32::MAX, max: 131072 });
    assert_eq!(buf.capacity(), cap_before);
}

#[test]
fn a_frame_one_byte_over_the_limit_is_refused_and_one_at_it_is_taken() {
    let dec = FrameDecoder::new(1024);
    let mut at = BytesMut::new();
    write_amqp(&mut at, 0, &transfer(false), &[]);
    let pad = 1024 - at.len();
    let mut exact = BytesMut::new();
    write_amqp(&mut exact, 0, &transfer(false), &vec![0u8; pad]);
    assert_eq!(exact.len(), 1024);
    assert_eq!(decode_all(&dec, &exact).unwrap().len(), 1);
    let mut over = BytesMut::new();
    write_amqp(&mut over, 0, &transfer(false), &vec![0u8; pad + 1]);
    assert_eq!(decode_all(&dec, &over).unwrap_err(), FrameError::SizeTooLarge { size: 1025, max: 1024 });
}

#[test]
fn bad_headers_are_errors() {
    let dec = FrameDecoder::default();
    assert_eq!(decode_all(&dec, &[0, 0, 0, 4, 2, 0, 0, 0]).unwrap_err(), FrameError::SizeTooSmall(4));
    assert_eq!(decode_all(&dec, &[0, 0, 0, 8, 1, 0, 0, 0]).unwrap_err(), FrameError::BadDataOffset);
    assert_eq!(decode_all(&dec, &[0, 0, 0, 8, 3, 0, 0, 0]).unwrap_err(), FrameError::BadDataOffset);
    assert_eq!(decode_all(&dec, &[0, 0, 0, 8, 2, 9, 0, 0]).unwrap_err(), FrameError::UnknownType(9));
    assert_eq!(decode_all(&dec, &[0, 0, 0, 10, 2, 0, 0, 0, 0x00, 0x53]).unwrap_err(), FrameError::BadBody);
}

#[test]
fn a_payload_on_anything_but_transfer_is_refused() {
    let mut out = BytesMut::new();
    write_amqp(&mut out, 0, &open(), b"extra");
    assert_eq!(decode_all(&FrameDecoder::new(65536), &out).unwrap_err(), FrameError::BadBody);
}

#[test]
fn a_list_claiming_more_than_the_frame_holds_is_refused() {
    // described(0x10) list32 claiming 1 GiB inside a 20-byte frame.
    let body = [0x00, 0x53, 0x10, 0xd0, 0x40, 0, 0, 0, 0, 0, 0, 1];
    assert_eq!(described_list_len(&body), None);
}

#[test]
fn protocol_headers() {
    let mut b = BytesMut::from(&b"AMQP"[..]);
    assert_eq!(read_protocol_header(&mut b), Ok(None));
    let mut b = BytesMut::from(&SASL_HEADER[..]);
    assert_eq!(read_protocol_header(&mut b), Ok(Some(ProtocolHeader::Sasl)));
    let mut b = BytesMut::from(&AMQP_HEADER[..]);
    assert_eq!(read_protocol_header(&mut b), Ok(Some(ProtocolHeader::Amqp)));
    let mut b = BytesMut::from(&b"CONNECT\n"[..]);
    assert_eq!(read_protocol_header(&mut b), Err(FrameError::BadProtocolHeader));
    let mut b = BytesMut::from(&b"AMQP\x01\x01\x00\x00"[..]);
    assert_eq!(read_protocol_header(&mut b), Err(FrameError::BadProtocolHeader));
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = decode_all(&FrameDecoder::new(4096), &bytes);
        let _ = decode_body(0, 0, Bytes::from(bytes.clone()));
        let _ = decode_body(1, 0, Bytes::from(bytes));
    }

    #[test]
    fn a_frame_split_anywhere_decodes_the_same(payload in proptest::collection::vec(any::<u8>(), 0..300), cut in 0usize..400) {
        let mut out = BytesMut::new();
        write_amqp(&mut out, 1, &transfer(false), &payload);
        let attach = Performative::Attach(Attach {
            name: "l".into(), handle: Handle(0), role: Role::Sender, snd_settle_mode: Default::default(), rcv_settle_mode: Default::default(),
            source: None, target: None, unsettled: None, incomplete_unsettled: false, initial_delivery_count: Some(0), max_message_size: None,
            offered_capabilities: None, desired_capabilities: None, properties: None,
        });
        write_amqp(&mut out, 2, &attach, &[]);
        let cut = cut.min(out.len());
        let dec = FrameDecoder::new(4096);
        let mut buf = BytesMut::from(&out[..cut]);
        let mut frames = Vec::new();
        while let Some(f) = dec.decode(&mut buf).unwrap() { frames.push(f); }
        buf.extend_from_slice(&out[cut..]);
        while let Some(f) = dec.decode(&mut buf).unwrap() { frames.push(f); }
        prop_assert_eq!(frames.len(), 2);
        match &frames[0] {
            Frame::Amqp { payload: p, .. } => prop_assert_eq!(&p[..], &payload[..]),
            other => prop_assert!(false, "{:?}", other),
        }
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn a_begin_round_trips(next_outgoing_id in any::<u32>(), window in any::<u32>(), ch in any::<u16>()) {
        let begin = Performative::Begin(Begin { remote_channel: Some(ch), next_outgoing_id, incoming_window: window, outgoing_window: window, handle_max: Handle(7), offered_capabilities: None, desired_capabilities: None, properties: None });
        let mut out = BytesMut::new();
        write_amqp(&mut out, ch, &begin, &[]);
        let frames = decode_all(&FrameDecoder::new(4096), &out).unwrap();
        match &frames[..] {
            [Frame::Amqp { channel, performative, .. }] => { prop_assert_eq!(*channel, ch); prop_assert_eq!(&**performative, &begin); }
            other => prop_assert!(false, "{:?}", other),
        }
    }
}
