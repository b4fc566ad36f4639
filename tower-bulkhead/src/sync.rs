//! What a compartment synchronises with: std's atomics and tokio's
//! `Notify`, or, under `--cfg tower_resilience_loom` only, the atomics of
//! `tower_resilience_base::loom_sync` and a model of tokio's `Notify` on
//! loom's mutex, so that the loom models (`scripts/loom`) check the
//! counters and the wake-ups together.

#[cfg(not(tower_resilience_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(not(tower_resilience_loom))]
pub(crate) use tokio::sync::Notify;

#[cfg(tower_resilience_loom)]
pub(crate) use model_notify::Notify;
#[cfg(tower_resilience_loom)]
pub(crate) use tower_resilience_base::loom_sync::{AtomicU64, AtomicUsize, Ordering};

/// tokio's `Notify`, as much of it as a compartment uses, on loom's mutex
/// (loom cannot see inside tokio's). The semantics are tokio's documented
/// ones:
///
/// - `notify_one` wakes the waiter that has been enabled longest and not
///   yet notified; with none, it stores one permit (never more), which the
///   next `enable` or poll consumes;
/// - a `Notified` registers as a waiter when it is enabled or first
///   polled, not when it is created;
/// - a `Notified` dropped after `notify_one` picked it but before it was
///   polled to completion passes the notification on to the next waiter
///   (or leaves it as the permit).
#[cfg(tower_resilience_loom)]
mod model_notify {
    use std::collections::VecDeque;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    use loom::sync::Mutex;

    pub(crate) struct Notify {
        state: Mutex<State>,
    }

    #[derive(Default)]
    struct State {
        permit: bool,
        next_id: u64,
        /// Enabled, not yet notified, in the order they were enabled.
        waiting: VecDeque<(u64, Option<Waker>)>,
        /// Notified, not yet completed.
        notified: Vec<u64>,
    }

    pub(crate) struct Notified<'a> {
        notify: &'a Notify,
        /// Set once enabled, until the notification is consumed.
        id: Option<u64>,
        done: bool,
    }

    impl Notify {
        pub(crate) fn new() -> Self {
            Self {
                state: Mutex::new(State::default()),
            }
        }

        pub(crate) fn notify_one(&self) {
            let mut state = self.state.lock().unwrap();
            match state.waiting.pop_front() {
                Some((id, waker)) => {
                    state.notified.push(id);
                    drop(state);
                    if let Some(waker) = waker {
                        waker.wake();
                    }
                }
                None => state.permit = true,
            }
        }

        pub(crate) fn notified(&self) -> Notified<'_> {
            Notified {
                notify: self,
                id: None,
                done: false,
            }
        }
    }

    impl Notified<'_> {
        pub(crate) fn enable(self: Pin<&mut Self>) -> bool {
            self.get_mut().poll_notified(None)
        }

        /// Registers (or re-registers `waker`) and returns whether this
        /// future has been notified, consuming the notification.
        fn poll_notified(&mut self, waker: Option<&Waker>) -> bool {
            if self.done {
                return true;
            }
            let mut state = self.notify.state.lock().unwrap();
            match self.id {
                None if state.permit => {
                    state.permit = false;
                    self.done = true;
                }
                None => {
                    let id = state.next_id;
                    state.next_id += 1;
                    state.waiting.push_back((id, waker.cloned()));
                    self.id = Some(id);
                }
                Some(id) => {
                    if let Some(at) = state.notified.iter().position(|&n| n == id) {
                        state.notified.swap_remove(at);
                        self.id = None;
                        self.done = true;
                    } else if let Some(waker) = waker {
                        if let Some(entry) = state.waiting.iter_mut().find(|(n, _)| *n == id) {
                            entry.1 = Some(waker.clone());
                        }
                    }
                }
            }
            self.done
        }
    }

    impl Future for Notified<'_> {
        type Output = ();

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if self.get_mut().poll_notified(Some(cx.waker())) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    impl Drop for Notified<'_> {
        fn drop(&mut self) {
            let Some(id) = self.id.take() else {
                return;
            };
            let mut state = self.notify.state.lock().unwrap();
            if let Some(at) = state.notified.iter().position(|&n| n == id) {
                state.notified.swap_remove(at);
                drop(state);
                self.notify.notify_one();
            } else {
                state.waiting.retain(|(n, _)| *n != id);
            }
        }
    }
}
