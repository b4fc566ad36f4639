//! A call that finds the circuit closed on a shared decision older than
//! `FleetConfig::max_staleness` reads the store first (a quiet process, a
//! thawed instance, a new process), at most the election timeout; a
//! process that keeps its decision fresh never waits.

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use support::*;
use tokio::time::Instant;
use tower::{service_fn, Layer, ServiceExt};
use tower_breaker::error::CircuitOpen;
use tower_breaker::store::{
    Decision, Election, MemoryStore, ProbeToken, Store, StoreError, StoreFuture, Watcher,
};
use tower_breaker::{Breaker, FleetConfig, PlainBreakerLayer, State};

/// A memory store shared by the "processes" of a test that pushes nothing
/// (as DynamoDB), counts its reads and can make them slow, mute or failing.
#[derive(Debug, Default)]
struct Deaf {
    inner: Arc<MemoryStore>,
    read_delay: Duration,
    mute: AtomicBool,
    failing: AtomicBool,
    reads: AtomicUsize,
}

impl Deaf {
    fn new(read_delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            read_delay,
            ..Self::default()
        })
    }
}

impl Store for Deaf {
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
        self.inner.close(name, token)
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
        Box::pin(async move {
            if self.mute.load(SeqCst) {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(self.read_delay).await;
            if self.failing.load(SeqCst) {
                return Err(StoreError::new("unreachable"));
            }
            self.inner.read(name).await
        })
    }
    fn watch(&self, _name: &str, _watcher: std::sync::Weak<dyn Watcher>) {}
}

/// A process's breaker on `store`, sharing only the decision (no reports,
/// so every sync is a read), with the default refresh interval (1 s) and
/// staleness (2 s) unless `fleet` changes them.
fn process(store: &Arc<Deaf>, fleet: impl FnOnce(FleetConfig) -> FleetConfig) -> Breaker {
    let store: Arc<dyn Store> = store.clone();
    Breaker::with_config(
        "dep",
        config().fleet(fleet(FleetConfig::new(store).fleet_window(false))),
    )
}

/// A dependency that counts its calls and answers `Ok`.
fn dependency(
    calls: &Arc<AtomicUsize>,
) -> impl tower::Service<(), Response = (), Error = Infallible, Future: Send> + Clone {
    let calls = Arc::clone(calls);
    service_fn(move |()| {
        calls.fetch_add(1, SeqCst);
        async { Ok::<_, Infallible>(()) }
    })
}

/// One call through the breaker's plain service: whether it was refused
/// as open, how long it took, and whether it reached the dependency.
async fn call(breaker: &Breaker) -> (bool, Duration, usize) {
    let calls = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let result = PlainBreakerLayer::new(breaker.clone())
        .layer(dependency(&calls))
        .oneshot(())
        .await;
    let refused = match result {
        Ok(()) => false,
        Err(e) => {
            assert!(e.downcast_ref::<CircuitOpen>().is_some(), "{e}");
            true
        }
    };
    (refused, started.elapsed(), calls.load(SeqCst))
}

/// The fleet opened while this process was quiet for 3 s (its decision is
/// older than the 2 s allowed): its next call reads first (20 ms here) and
/// is refused without reaching the dependency. With the wait turned off,
/// the same call is admitted on the stale "closed" and reaches the failing
/// dependency: the defect this fixes.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_quiet_process_reads_before_its_call_and_is_refused_when_the_fleet_opened() {
    for wait in [true, false] {
        let store = Deaf::new(ms(20));
        let quiet = process(&store, |f| {
            if wait {
                f
            } else {
                f.max_staleness(Duration::MAX)
            }
        });
        quiet.refresh().await.unwrap();
        advance(secs(3)).await;
        // Another process opens the fleet's circuit meanwhile.
        store.inner.try_open("dep", secs(5)).await.unwrap();

        let (refused, took, reached) = call(&quiet).await;
        if wait {
            assert!(refused, "read first: the fleet is open");
            assert_eq!(took, ms(20), "one read");
            assert_eq!(reached, 0);
            assert_eq!(state(&quiet), State::Open);
        } else {
            assert!(!refused, "no wait: admitted on the stale decision");
            assert_eq!(reached, 1);
        }
    }
}

/// A new process (a cold start, a thawed instance that never read) has no
/// decision at all: its first call reads first, and is refused while the
/// fleet is open.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_new_process_reads_before_its_first_call() {
    let store = Deaf::new(ms(5));
    store.inner.try_open("dep", secs(5)).await.unwrap();
    let fresh = process(&store, |f| f);
    let (refused, took, reached) = call(&fresh).await;
    assert!(refused);
    assert_eq!(took, ms(5));
    assert_eq!(reached, 0);
    assert_eq!(store.reads.load(SeqCst), 1);
}

/// A decision younger than the staleness is used as it is: the call is
/// admitted at once (the first call after the refresh interval starts a
/// read it does not wait for), even though the fleet opened meanwhile;
/// the read it started tells the next call.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_decision_younger_than_the_staleness_admits_at_once() {
    let store = Deaf::new(ms(20));
    let busy = process(&store, |f| f);
    busy.refresh().await.unwrap();
    advance(ms(1_500)).await;
    store.inner.try_open("dep", secs(5)).await.unwrap();

    let (refused, took, reached) = call(&busy).await;
    assert!(!refused);
    assert_eq!(took, Duration::ZERO, "no wait");
    assert_eq!(reached, 1);
    tokio::task::yield_now().await;
    assert_eq!(
        store.reads.load(SeqCst),
        2,
        "the refresh, and the one it started"
    );
    advance(ms(20)).await;
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    let (refused, took, _) = call(&busy).await;
    assert!(refused, "the read it started told the fleet's opening");
    assert_eq!(took, Duration::ZERO);
}

/// The staleness is at least the refresh interval: a process that calls
/// once per refresh interval or more keeps its decision fresh and never
/// waits, whatever the setting says.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_staleness_is_at_least_the_refresh_interval() {
    let store = Deaf::new(ms(20));
    let b = process(&store, |f| {
        f.refresh_interval(ms(500))
            .max_staleness(Duration::from_millis(1))
    });
    b.refresh().await.unwrap(); // asked 20 ms ago
    advance(ms(479)).await;
    let (refused, took, _) = call(&b).await;
    assert!(!refused);
    assert_eq!(took, Duration::ZERO, "499 ms old: fresh enough");
    tokio::task::yield_now().await;
    assert_eq!(store.reads.load(SeqCst), 1, "and no read started");
    advance(ms(1)).await;
    let (_, took, _) = call(&b).await;
    assert_eq!(took, ms(20), "500 ms old: read first");
}

/// A store that never answers a read holds the call at most the election
/// timeout; it is then decided on what the breaker knows (closed:
/// admitted).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_read_first_wait_ends_at_the_election_timeout() {
    let store = Deaf::new(ms(0));
    let b = process(&store, |f| f.election_timeout(ms(300)));
    store.mute.store(true, SeqCst);
    let (refused, took, reached) = call(&b).await;
    assert!(!refused);
    assert_eq!(took, ms(300));
    assert_eq!(reached, 1);
}

/// While the store fails, calls do not wait for it: the first read that
/// fails raises the alarm, and the calls after it are decided alone at
/// once (failing open).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_failing_store_is_not_waited_for() {
    let store = Deaf::new(ms(20));
    let b = process(&store, |f| f);
    store.failing.store(true, SeqCst);
    let (refused, took, _) = call(&b).await;
    assert!(!refused);
    assert_eq!(took, ms(20), "the first call waits for the read that fails");
    assert_eq!(b.snapshot().totals.store_errors, 1);
    advance(secs(3)).await;
    let (refused, took, _) = call(&b).await;
    assert!(!refused);
    assert_eq!(took, Duration::ZERO, "the store is known to fail");
}

/// Many calls that find the decision stale at once share one read.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn concurrent_stale_calls_share_one_read() {
    let store = Deaf::new(ms(20));
    let b = process(&store, |f| f);
    let calls = Arc::new(AtomicUsize::new(0));
    let service = PlainBreakerLayer::new(b.clone()).layer(dependency(&calls));
    let started = Instant::now();
    let tasks: Vec<_> = (0..50)
        .map(|_| tokio::spawn(service.clone().oneshot(())))
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(started.elapsed(), ms(20));
    assert_eq!(calls.load(SeqCst), 50);
    assert_eq!(store.reads.load(SeqCst), 1);
}

/// Regression: a store's answer was ordered against the breaker's own
/// transitions by time, so one asked in the same tick as a transition
/// (always, under a paused clock; often, with the coarse clock) was
/// dropped although it was asked after it. Transitions are counted now: a
/// read asked after a transition is adopted, whatever the clock says.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_read_asked_after_a_transition_in_the_same_tick_is_adopted() {
    let store = Deaf::new(Duration::ZERO);
    let b = process(&store, |f| f);
    b.refresh().await.unwrap();
    // A transition (a mode switched and back), then, at the same instant,
    // another process opens the fleet's circuit and this one reads.
    b.set_mode(tower_breaker::Mode::ForcedOpen);
    b.set_mode(tower_breaker::Mode::Automatic);
    store.inner.try_open("dep", secs(5)).await.unwrap();
    b.refresh().await.unwrap();
    assert_eq!(state(&b), State::Open);
}

/// A thawed instance (a quiet process) whose read first finds the fleet's
/// open period over, with no prober: the same call waits for the election
/// it starts and, won, reaches the dependency as the probe; its success
/// closes the fleet. Before, the call started the election without waiting
/// for it, was refused, and the winner had no call to probe with (the
/// 300-environment simulation on DynamoDB: 14 elections in a 20 s outage,
/// none probed).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_read_first_that_finds_the_period_over_waits_for_the_election_and_probes() {
    let store = Deaf::new(ms(20));
    let thawed = process(&store, |f| f);
    thawed.refresh().await.unwrap();
    assert_eq!(state(&thawed), State::Closed);
    // While it was frozen, the fleet opened for 5 s, and that is over.
    store.inner.try_open("dep", secs(5)).await.unwrap();
    advance(secs(30)).await;

    let (refused, took, reached) = call(&thawed).await;
    assert!(!refused, "the probe");
    assert_eq!(reached, 1, "reached the dependency");
    assert_eq!(took, ms(20), "one read, then an election at once");
    assert_eq!(state(&thawed), State::Closed);
    thawed.flush().await.expect("the close is written");
    assert_eq!(
        store.inner.read("dep").await.unwrap(),
        Decision::Closed,
        "its success closed the fleet"
    );
}

/// The same for a key of a keyed breaker, whose service's `poll_ready`
/// does not know the key: the quiet key's call reads first in the
/// service's future and is refused without reaching the dependency.
/// Before, keyed breakers never read first, and the call reached the
/// failing dependency once per process.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_quiet_key_reads_before_its_call_and_is_refused_when_the_fleet_opened() {
    let store = Deaf::new(ms(20));
    let fleet: Arc<dyn Store> = store.clone();
    let registry = tower_breaker::BreakerRegistry::new(
        "key",
        config().fleet(FleetConfig::new(fleet).fleet_window(false)),
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let service = tower_breaker::keyed::KeyedPlainCircuitBreaker::new(
        dependency(&calls),
        registry.clone(),
        |_: &()| 7u32,
    );
    service.clone().oneshot(()).await.expect("closed: admitted");
    assert_eq!(calls.load(SeqCst), 1);
    advance(secs(3)).await;
    // Another process opens the fleet's circuit for this key meanwhile.
    store.inner.try_open("key:7", secs(5)).await.unwrap();

    let reads = store.reads.load(SeqCst);
    let started = Instant::now();
    let refused = service.oneshot(()).await.unwrap_err();
    assert!(refused.downcast_ref::<CircuitOpen>().is_some(), "{refused}");
    assert_eq!(started.elapsed(), ms(20), "one read");
    assert_eq!(store.reads.load(SeqCst), reads + 1);
    assert_eq!(calls.load(SeqCst), 1, "the failing dependency was spared");
    assert_eq!(state(&registry.get(&7)), State::Open);
}
