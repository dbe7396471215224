//! A receipted events SEND is confirmed only once every core that delivers it has the message
//! in each subscriber's buffer (or lost it to the slow-subscriber rule), with three and with
//! four cores: more cores than this 2-CPU machine has, so executors share CPUs and the rings
//! between them are handled in any order. The publisher's core counts the owner's announcement
//! and each delivering core's part exactly (`engine::completion`); an early part (a delivering
//! core confirming before the owner's announcement reached the publisher's core) must not
//! release the RECEIPT.
//!
//! Setup: the publisher on a core that does not own the channel; one fast subscriber on every
//! core; one slow subscriber, on a third core, that stops reading. With SubBuffSize 1 its
//! socket fills; once what was parked behind it has expired, the next delivery to it is parked
//! (holding the publisher's ticket) for up to the 2 s grace. The RECEIPT of a SEND made then must wait for that parked delivery while every
//! other core confirms at once.
//!
//! Embedded array only: through a remote array the RECEIPT means the array confirmed the
//! event, and no core of this gateway owns the channel.
use crate::common;
use common::flow::*;
use common::*;
use std::time::{Duration, Instant};
use stompgate::model::Pattern;

fn receipt_waits_for_a_parked_delivery_on_another_core(cores: usize) {
    if remote_array() {
        eprintln!("embedded-array property: skipped through a remote array");
        return;
    }
    let server = TestServer::start_with(|c| {
        c.cpus = (0..cores).map(|i| i % 2).collect();
        c.sub_buff_size = 1;
    });
    let channel = unique("completion");
    let topic = format!("/topic/{channel}");
    let owner = owner(&server, Pattern::Events, &channel);
    let publisher_core = (owner + 1) % cores;
    let slow_core = (owner + 2) % cores;
    assert!(slow_core != publisher_core && slow_core != owner || cores < 3);

    let mut fast: Vec<Client> = (0..cores).map(|core| connected_on(&server, core)).collect();
    for (i, f) in fast.iter_mut().enumerate() {
        f.subscribe_sync(&format!("fast-{i}"), &topic, &[]);
    }
    let mut slow = connected_on(&server, slow_core);
    slow.subscribe_sync("slow", &topic, &[]);
    let mut publisher = connected_on(&server, publisher_core);

    // Fill the slow subscriber's socket: 16 MiB it never reads, while the fast ones keep up.
    let filler = vec![b'f'; 64 * 1024];
    for _ in 0..256 {
        publisher.publish(&topic, &filler);
        for f in fast.iter_mut() {
            f.read_messages(1);
        }
    }
    // Deliveries parked behind it meanwhile (at most 16 × SubBuffSize; the rest were dropped)
    // end with the grace; its socket stays full, so the next delivery parks again, first in line.
    std::thread::sleep(Duration::from_millis(2300));
    let sent = Instant::now();
    publisher.send("SEND", &[("destination", &topic), ("receipt", "probe")], b"probe");
    for f in fast.iter_mut() {
        assert_eq!(bodies(&f.read_messages(1)), ["probe"], "every fast subscriber has the probe at once");
    }
    // Within the slow subscriber's 2 s grace the delivery stays parked, and so does the RECEIPT.
    // The window ends 1.5 s after the SEND (not after this thread gets here, which a loaded
    // machine may delay), and a frame read within it must have been read at least 2 s after the
    // SEND (a descheduled reader may return late): one read sooner arrived inside the grace.
    let within_grace = publisher.frame_within(Duration::from_millis(1500).saturating_sub(sent.elapsed()));
    if let Some(early) = &within_grace {
        let at = sent.elapsed();
        assert!(
            at >= Duration::from_secs(2),
            "{cores} cores: {early:?} arrived {at:?} after the SEND, while a delivery of the probe was parked on core {slow_core}"
        );
    }
    // Reading again lets the parked delivery out (or the grace ends it): then the RECEIPT comes.
    let drain = std::thread::spawn(move || slow.read_until_quiet(Duration::from_millis(1500)).len());
    let receipt = within_grace.unwrap_or_else(|| publisher.frame_within(Duration::from_secs(10)).expect("the RECEIPT once the parked delivery settled"));
    assert_eq!(receipt.command, "RECEIPT", "{receipt:?}");
    assert_eq!(receipt.header("receipt-id"), Some("probe"));
    assert!(drain.join().unwrap() > 0, "the slow subscriber had deliveries waiting");
}

#[test]
fn three_cores_receipt_waits_for_a_parked_delivery_on_another_core() {
    receipt_waits_for_a_parked_delivery_on_another_core(3);
}

#[test]
fn four_cores_receipt_waits_for_a_parked_delivery_on_another_core() {
    receipt_waits_for_a_parked_delivery_on_another_core(4);
}

/// Many receipted SENDs from every core to subscribers on every core: each RECEIPT comes
/// exactly once, in order, and every subscriber gets every message.
fn every_receipt_once_and_every_message_everywhere(cores: usize) {
    let server = TestServer::start_with(|c| c.cpus = (0..cores).map(|i| i % 2).collect());
    let topic = format!("/topic/{}", unique("completion-all"));
    let mut subs: Vec<Client> = (0..cores).map(|core| connected_on(&server, core)).collect();
    for (i, s) in subs.iter_mut().enumerate() {
        s.subscribe_sync(&format!("s{i}"), &topic, &[]);
    }
    let mut publishers: Vec<Client> = (0..cores).map(|core| connected_on(&server, core)).collect();
    const N: usize = 200;
    for i in 0..N {
        for (p, publisher) in publishers.iter_mut().enumerate() {
            publisher.send("SEND", &[("destination", &topic), ("receipt", &format!("{p}-{i}"))], format!("{p}-{i}").as_bytes());
        }
    }
    for (p, publisher) in publishers.iter_mut().enumerate() {
        for i in 0..N {
            let f = publisher.frame_within(Duration::from_secs(10)).unwrap_or_else(|| panic!("publisher {p}: receipt {i} never came"));
            assert_eq!(f.command, "RECEIPT", "{f:?}");
            assert_eq!(f.header("receipt-id"), Some(format!("{p}-{i}").as_str()));
        }
        publisher.no_frame(Duration::from_millis(50));
    }
    for s in subs.iter_mut() {
        let got = s.read_messages(N * cores);
        for p in 0..cores {
            let from_p: Vec<String> = bodies(&got).into_iter().filter(|b| b.starts_with(&format!("{p}-"))).collect();
            assert_eq!(from_p, (0..N).map(|i| format!("{p}-{i}")).collect::<Vec<_>>(), "publisher {p}'s messages, in order");
        }
    }
}

#[test]
fn three_cores_every_receipt_once_and_every_message_everywhere() {
    every_receipt_once_and_every_message_everywhere(3);
}

#[test]
fn four_cores_every_receipt_once_and_every_message_everywhere() {
    every_receipt_once_and_every_message_everywhere(4);
}

#[test]
fn two_cores_every_receipt_once_and_every_message_everywhere() {
    every_receipt_once_and_every_message_everywhere(2);
}
