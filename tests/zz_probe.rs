mod common;
use common::*;
fn lp(tag: u32) {
    for i in 0..100 {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || { if rx.recv_timeout(std::time::Duration::from_secs(15)).is_err() { eprintln!("HANG thread {tag} at iteration {i}"); std::process::exit(3); } });
        let s = TestServer::start();
        drop(s);
        tx.send(()).unwrap();
    }
}
#[test] fn a() { lp(1) }
#[test] fn b() { lp(2) }
