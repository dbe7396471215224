//! Fuzzes the header values parsed at CONNECT and SUBSCRIBE: `heart-beat`, `accept-version`
//! and `x-kubemq-start`. Nothing may panic; a parsed heart-beat re-parses from its canonical
//! form and negotiates without overflow; a parsed start position is one the forms can name.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stompgate::mesh::msg::StartAt;
use stompgate::session::start::parse_start;
use stompgate::stomp::negotiate::{negotiate_heart_beat, negotiate_version, parse_heart_beat};

fn is_delta(value: &[u8]) -> bool {
    std::str::from_utf8(value).is_ok_and(|v| v.trim().starts_with("time-delta:"))
}

fuzz_target!(|data: &[u8]| {
    if let Ok((x, y)) = parse_heart_beat(Some(data)) {
        assert_eq!(parse_heart_beat(Some(format!("{x},{y}").as_bytes())), Ok((x, y)));
        for server in [(0, 0), (10_000, 10_000), (u64::MAX, 1), (1, u64::MAX)] {
            let (sends, wants) = negotiate_heart_beat((x, y), server);
            assert!(sends == 0 || (sends >= server.0 && sends >= y));
            assert!(wants == 0 || (wants >= x && wants >= server.1));
        }
    }
    let _ = negotiate_version(Some(data));
    for now in [0, 1_700_000_000_000_000_000, i64::MAX] {
        match parse_start(data, now) {
            Some(StartAt::Sequence(n)) => assert!(n >= 1),
            // An absolute time is after the epoch; a delta counts back from now.
            Some(StartAt::Time(t)) if is_delta(data) => assert!(t < now),
            Some(StartAt::Time(t)) => assert!(t > 0),
            _ => {}
        }
    }
});
