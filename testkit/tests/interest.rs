//! The case `set_default` exists for, in a binary of its own (the race
//! needs a process where one test's subscriber is the only registered
//! dispatcher): another thread, without a subscriber, reaches a call
//! site first; the capturing thread must still see the call site's
//! events. With `tracing::subscriber::set_default` in place of ours this
//! test fails every time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

#[derive(Clone, Default)]
struct Count(Arc<AtomicUsize>);

impl Subscriber for Count {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn emit() {
    tracing::info!("the shared call site");
}

#[test]
fn a_call_site_first_reached_by_a_thread_without_subscriber_still_reaches_ours() {
    let count = Count::default();
    let _guard = resilience_testkit::set_default(count.clone());
    std::thread::spawn(emit).join().unwrap();
    emit();
    assert_eq!(count.0.load(Ordering::SeqCst), 1);
}
