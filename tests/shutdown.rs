//! Graceful stop (what SIGTERM does): every connected client, on either core, gets
//! `ERROR message:server shutting down` and is closed, including a client-ack consumer that
//! still holds unacknowledged queue messages (they are requeued as its connection is
//! released). Stopping takes at most the 2 s shutdown grace (plus slack), with or without
//! clients, and also when a client never reads. Through a remote array the array outlives the
//! gateway, so the requeued messages are observable there.
//!
//! Setup: each test runs its own two-core gateway (`TestServer`); stopping the gateway is timed
//! on the test thread against its promise (a core waits at most `SHUTDOWN_GRACE`, 2 s, for its
//! connections to take the ERROR), then each client reads what the server wrote before closing.
use crate::common;
use common::flow::*;
use common::*;
use std::time::{Duration, Instant};

/// The runtime's `SHUTDOWN_GRACE`: how long a stopping core waits for its connections.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Beyond the grace: the 100 ms tick that notices the stop, joining the threads, and
/// scheduling on a loaded two-CPU machine.
const STOP_SLACK: Duration = Duration::from_secs(2);

/// Stops the gateway and asserts it kept the shutdown promise: done within the grace (+ slack).
fn stop_within_the_grace(server: &mut TestServer) {
    let t0 = Instant::now();
    server.stop_gateway();
    let took = t0.elapsed();
    assert!(took <= SHUTDOWN_GRACE + STOP_SLACK, "stopping took {took:?}, past the {SHUTDOWN_GRACE:?} grace");
}

#[test]
fn connected_clients_on_both_cores_get_error_and_are_closed() {
    let mut server = TestServer::start();
    let mut clients = connected_spread(&server, 4);
    let t = format!("/topic/{}", unique("sd"));
    clients[0].subscribe_sync("s", &t, &[]);
    clients[1].subscribe_sync("s", "/reply/r1", &[]);
    stop_within_the_grace(&mut server);
    for (i, c) in clients.iter_mut().enumerate() {
        let e = c.frame();
        assert_eq!(e.command, "ERROR", "client {i} (core {}): {e:?}", i % 2);
        assert_eq!(e.header("message"), Some("server shutting down"), "client {i}");
        assert_eq!(e.body_str(), "the gateway is stopping; reconnect later", "client {i}");
        assert!(c.closed(), "client {i} still open");
    }
}

#[test]
fn client_ack_consumer_holding_messages_gets_error_and_stop_keeps_the_grace() {
    let mut server = TestServer::start();
    let q = format!("/queue/{}", unique("sd"));
    let mut holders: Vec<Client> = [0, 1].iter().map(|&core| connected_on(&server, core)).collect();
    for (i, h) in holders.iter_mut().enumerate() {
        let mode = if i == 0 { "client" } else { "client-individual" };
        assert!(h.subscribe_sync(&format!("h{i}"), &q, &[("ack", mode)]).is_empty());
    }
    let mut p = server.connected();
    for i in 0..6 {
        p.send_sync("SEND", &[("destination", &q)], format!("m{i}").as_bytes());
    }
    // Read until all six are held (the queue is in the array now: the RECEIPTs said so).
    let mut held = [0usize; 2];
    let deadline = Instant::now() + WAIT;
    while held.iter().sum::<usize>() < 6 && Instant::now() < deadline {
        for (i, h) in holders.iter_mut().enumerate() {
            if let Some(f) = h.frame_within(Duration::from_millis(20)) {
                assert_eq!(f.command, "MESSAGE", "{f:?}");
                held[i] += 1;
            }
        }
    }
    assert_eq!(held.iter().sum::<usize>(), 6, "all six messages are held, none acknowledged: {held:?}");
    assert!(held.iter().all(|&n| n > 0), "each holder holds some: {held:?}");

    stop_within_the_grace(&mut server);
    // The cores notice the stop independently: messages released by a holder on one core may
    // be redelivered to the holder on the other before that one's ERROR. Anything before the
    // ERROR must be such a redelivery.
    for (i, c) in holders.iter_mut().chain(std::iter::once(&mut p)).enumerate() {
        let (e, before) = c.until("ERROR");
        for f in &before {
            assert_eq!(f.command, "MESSAGE", "{f:?}");
            assert_eq!(f.header("destination"), Some(q.as_str()));
            assert_eq!(f.header("redelivered"), Some("true"), "{f:?}");
        }
        assert_eq!(e.header("message"), Some("server shutting down"), "{e:?}");
        assert!(c.closed(), "client {i} still open");
    }
}

#[test]
fn stop_with_no_clients_returns_within_the_grace() {
    let mut server = TestServer::start();
    stop_within_the_grace(&mut server);
}

#[test]
fn stop_after_clients_left_returns_within_the_grace() {
    let mut server = TestServer::start();
    for mut c in connected_spread(&server, 2) {
        c.disconnect_sync();
        assert!(c.closed());
    }
    stop_within_the_grace(&mut server);
}

#[test]
fn a_client_that_never_reads_cannot_hold_the_stop_beyond_the_grace() {
    let mut server = TestServer::start();
    let t = format!("/topic/{}", unique("sd-stuck"));
    let mut stuck = server.connected();
    stuck.subscribe_sync("s", &t, &[]);
    // 64 MiB for a subscriber that reads nothing: its socket and write queue fill, so the
    // ERROR cannot be written to it. The RECEIPT of the last SEND is the barrier: it comes once
    // the stuck subscriber holds that message in its write buffer or lost it.
    let mut p = server.connected();
    let body = vec![b'x'; 256 * 1024];
    for _ in 0..255 {
        p.publish(&t, &body);
    }
    let f = {
        p.send("SEND", &[("destination", &t), ("receipt", "last")], &body);
        p.frame_within(Duration::from_secs(30)).expect("RECEIPT of the last SEND")
    };
    assert_eq!((f.command.as_str(), f.header("receipt-id")), ("RECEIPT", Some("last")), "{f:?}");
    stop_within_the_grace(&mut server);
    drop(stuck);
}

#[test]
fn queue_messages_held_by_a_consumer_go_back_to_the_remote_array_when_the_gateway_stops() {
    // On the embedded array the queue ends with the process; through a remote array it
    // outlives the gateway, and README promises the held messages go back to it.
    if !remote_array() {
        eprintln!("only through a remote array (STOMPGATE_TEST_ARRAY=remote): the queue outlives the gateway there");
        return;
    }
    let mut server = TestServer::start();
    let q = format!("/queue/{}", unique("sd-requeue"));
    let mut holder = server.connected();
    assert!(holder.subscribe_sync("h", &q, &[("ack", "client-individual")]).is_empty());
    let mut p = server.connected();
    for i in 0..6 {
        p.send_sync("SEND", &[("destination", &q)], format!("m{i}").as_bytes());
    }
    let held = holder.read_messages(6);
    assert_eq!(bodies(&held), numbered("m", 0..6));
    stop_within_the_grace(&mut server);
    let (e, before) = holder.until("ERROR");
    assert!(before.is_empty(), "{before:?}");
    assert_eq!(e.header("message"), Some("server shutting down"), "{e:?}");

    // Straight on the array: all six are back, each marked redelivered.
    let mut direct = Client::open(server.array_stomp_addr().expect("remote mode has an array"));
    assert_eq!(direct.connect("1.2").command, "CONNECTED");
    let mut got = direct.subscribe_sync("d", &q, &[("ack", "client-individual")]);
    got.extend(direct.read_messages(6 - got.len()));
    let mut back = bodies(&got);
    back.sort();
    assert_eq!(back, numbered("m", 0..6));
    for f in &got {
        assert_eq!(f.header("redelivered"), Some("true"), "{f:?}");
    }
    direct.no_frame(QUIET);
}
