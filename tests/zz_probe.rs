mod common;
use common::*;
use std::sync::atomic::{AtomicU8, Ordering};
fn lp(tag: u32) {
    static PHASE: [AtomicU8; 3] = [AtomicU8::new(0), AtomicU8::new(0), AtomicU8::new(0)];
    for _i in 0..100 {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || { if rx.recv_timeout(std::time::Duration::from_secs(15)).is_err() { std::process::exit(10 * tag as i32 + PHASE[tag as usize].load(Ordering::SeqCst) as i32); } });
        PHASE[tag as usize].store(1, Ordering::SeqCst);
        let s = TestServer::start();
        PHASE[tag as usize].store(2, Ordering::SeqCst);
        drop(s);
        PHASE[tag as usize].store(3, Ordering::SeqCst);
        tx.send(()).unwrap();
    }
}
#[test] fn a() { lp(1) }
#[test] fn b() { lp(2) }
