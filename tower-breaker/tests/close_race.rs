//! The elected prober's close races the fleet's periodic read: a read
//! asked after the local close but answered before the close reached the
//! store still finds the probe's lease (or the opening). Adopting it
//! re-opened a circuit that had just closed, and the next read closed it
//! again: the soak's refresh/close flap. The read is not adopted while the
//! process's own close is on its way.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use support::*;
use tower_breaker::store::{
    Decision, Election, MemoryStore, ProbeToken, Store, StoreFuture, Watcher,
};
use tower_breaker::{Breaker, FleetConfig, Outcome, State};

/// A memory store whose closes take `close_delay` to land (a slow or
/// distant store), counting its reads.
#[derive(Debug, Default)]
struct SlowCloses {
    inner: MemoryStore,
    close_delay: Duration,
    reads: AtomicUsize,
}

impl Store for SlowCloses {
    fn try_open<'a>(&'a self, name: &'a str, open_for: Duration) -> StoreFuture<'a, Duration> {
        self.inner.try_open(name, open_for)
    }
    fn try_acquire_probe<'a>(
        &'a self,
        name: &'a str,
        open_for: Duration,
        lease: Duration,
    ) -> StoreFuture<'a, Election> {
        self.inner.try_acquire_probe(name, open_for, lease)
    }
    fn close<'a>(&'a self, name: &'a str, token: ProbeToken) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            tokio::time::sleep(self.close_delay).await;
            self.inner.close(name, token).await
        })
    }
    fn reopen<'a>(
        &'a self,
        name: &'a str,
        token: ProbeToken,
        open_for: Duration,
    ) -> StoreFuture<'a, Duration> {
        self.inner.reopen(name, token, open_for)
    }
    fn read<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Decision> {
        self.reads.fetch_add(1, SeqCst);
        self.inner.read(name)
    }
    fn renew_probe<'a>(
        &'a self,
        name: &'a str,
        token: ProbeToken,
        lease: Duration,
    ) -> StoreFuture<'a, Option<ProbeToken>> {
        self.inner.renew_probe(name, token, lease)
    }
    fn renews_leases(&self) -> bool {
        true
    }
    fn release_probe<'a>(&'a self, name: &'a str, token: ProbeToken) -> StoreFuture<'a, bool> {
        self.inner.release_probe(name, token)
    }
    fn watch(&self, name: &str, watcher: std::sync::Weak<dyn Watcher>) {
        self.inner.watch(name, watcher);
    }
}

/// Lets spawned store tasks run.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// One process, refresh every 50 ms, closes that take 200 ms to land: it
/// opens, wins the election, and its probe succeeds. Calls during the
/// 200 ms make the periodic read, which finds the probe's lease still in
/// the store. The circuit stays closed throughout: one close, no re-open,
/// and the store holds the close in the end.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_read_racing_the_probers_close_does_not_reopen_it() {
    let store = Arc::new(SlowCloses {
        close_delay: ms(200),
        ..SlowCloses::default()
    });
    let seen = Transitions::default();
    let breaker = Breaker::with_config(
        "dep",
        config()
            .count_window(2)
            .minimum_calls(2)
            .open_period(secs(5))
            .listener(seen.listener())
            .fleet(FleetConfig::new(store.clone()).refresh_interval(ms(50))),
    );
    record(&breaker, Outcome::Failure, 2);
    settle().await;
    advance(secs(5)).await;
    let probe = breaker.acquire().await.expect("won: the probe");
    assert!(probe.is_probe());
    probe.record(Outcome::Success);
    assert_eq!(state(&breaker), State::Closed);

    let reads = store.reads.load(SeqCst);
    // Calls every 20 ms while the close is on its way: several periodic
    // reads find the lease.
    for _ in 0..12 {
        advance(ms(20)).await;
        record(&breaker, Outcome::Success, 1);
        settle().await;
        assert_eq!(state(&breaker), State::Closed, "{:?}", seen.seen());
    }
    assert!(
        store.reads.load(SeqCst) >= reads + 2,
        "the reads raced the close"
    );
    assert_eq!(
        store.inner.read("dep").await.unwrap(),
        Decision::Closed,
        "the close landed"
    );
    // Later reads find the close.
    for _ in 0..5 {
        advance(ms(60)).await;
        record(&breaker, Outcome::Success, 1);
        settle().await;
    }
    assert_eq!(state(&breaker), State::Closed);
    let opened = seen
        .seen()
        .iter()
        .filter(|(_, to)| *to == State::Open)
        .count();
    assert_eq!(opened, 1, "re-opened by a stale read: {:?}", seen.seen());
}
