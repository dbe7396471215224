//! A tiny single-threaded wake-up flag for tasks on one executor (no lock, no atomics: every
//! user lives on the same core).
use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::task::{Poll, Waker};

#[derive(Default)]
pub struct LocalEvent {
    set: Cell<bool>,
    waiters: RefCell<Vec<Waker>>,
}

impl LocalEvent {
    /// Wakes every waiter; the flag stays set until `reset`.
    pub fn set(&self) {
        self.set.set(true);
        for w in self.waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }
    /// Sets the flag without waking anyone: for a setter that knows its waiter will be polled
    /// anyway before it could sleep (it runs in the same task, later in the same poll).
    pub fn set_quietly(&self) {
        self.set.set(true);
    }
    pub fn is_set(&self) -> bool {
        self.set.get()
    }
    pub fn reset(&self) {
        self.set.set(false);
    }
    /// Resolves once the flag is set.
    pub async fn wait(&self) {
        poll_fn(|cx| {
            if self.set.get() {
                Poll::Ready(())
            } else {
                let mut w = self.waiters.borrow_mut();
                if !w.iter().any(|x| x.will_wake(cx.waker())) {
                    w.push(cx.waker().clone());
                }
                Poll::Pending
            }
        })
        .await
    }
}
