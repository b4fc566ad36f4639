//! The call that ends an open period waits for the fleet's probe election
//! it starts and, if this process wins, is the probe; callers refused
//! meanwhile are told when the election ends, never the probe's lease.

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use http_body_util::BodyExt;
use support::*;
use tokio::time::Instant;
use tower::{service_fn, Layer, ServiceExt};
use tower_breaker::error::CircuitOpen;
use tower_breaker::keyed::{
    KeyedCircuitBreaker, KeyedHttpCircuitBreaker, KeyedPlainCircuitBreaker,
};
use tower_breaker::store::{
    Decision, Election, MemoryStore, ProbeToken, Store, StoreError, StoreFuture,
};
use tower_breaker::{Breaker, BreakerRegistry, FleetConfig, Outcome, PlainBreakerLayer, State};
use tower_resilience_base::{CallContext, Deadline};

/// A memory store (shared by the "processes" of a test) whose elections
/// take `delay` (or never answer), and whose lease renewals can be made to
/// fail, as a frozen or partitioned prober's do.
#[derive(Debug, Default)]
struct SlowElections {
    inner: Arc<MemoryStore>,
    delay: Duration,
    mute: bool,
    elections: AtomicUsize,
    renewals: AtomicUsize,
    renewals_fail: AtomicBool,
    /// Write-throughs of openings fail (the store unreachable for them).
    opens_fail: AtomicBool,
    /// Pushes are not forwarded (the process hears only its own reads).
    deaf: bool,
    /// Probes are not given back (a store that cannot).
    keeps_probes: bool,
}

impl SlowElections {
    fn new(delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            delay,
            ..Self::default()
        })
    }

    /// Another process's view of the same store.
    fn on(inner: &Arc<MemoryStore>) -> Arc<Self> {
        Arc::new(Self {
            inner: Arc::clone(inner),
            ..Self::default()
        })
    }
}

impl Store for SlowElections {
    fn try_open<'a>(&'a self, name: &'a str, open_for: Duration) -> StoreFuture<'a, Duration> {
        if self.opens_fail.load(SeqCst) {
            return Box::pin(async { Err(StoreError::new("unreachable")) });
        }
        self.inner.try_open(name, open_for)
    }
    fn try_acquire_probe<'a>(
        &'a self,
        name: &'a str,
        open_for: Duration,
        lease: Duration,
    ) -> StoreFuture<'a, Election> {
        self.elections.fetch_add(1, SeqCst);
        Box::pin(async move {
            if self.mute {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(self.delay).await;
            self.inner.try_acquire_probe(name, open_for, lease).await
        })
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
        self.inner.read(name)
    }
    fn renew_probe<'a>(
        &'a self,
        name: &'a str,
        token: ProbeToken,
        lease: Duration,
    ) -> StoreFuture<'a, Option<ProbeToken>> {
        self.renewals.fetch_add(1, SeqCst);
        if self.renewals_fail.load(SeqCst) {
            return Box::pin(async { Err(StoreError::new("unreachable")) });
        }
        self.inner.renew_probe(name, token, lease)
    }
    fn renews_leases(&self) -> bool {
        true
    }
    fn release_probe<'a>(&'a self, name: &'a str, token: ProbeToken) -> StoreFuture<'a, bool> {
        if self.keeps_probes {
            return Box::pin(async { Ok(false) });
        }
        self.inner.release_probe(name, token)
    }
    fn watch(&self, name: &str, watcher: std::sync::Weak<dyn tower_breaker::store::Watcher>) {
        if !self.deaf {
            self.inner.watch(name, watcher);
        }
    }
}

/// Lets spawned store tasks run.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

fn on(store: Arc<dyn Store>, fleet: impl FnOnce(FleetConfig) -> FleetConfig) -> Breaker {
    Breaker::with_config(
        "dep",
        config()
            .count_window(2)
            .minimum_calls(2)
            .open_period(secs(5))
            .fleet(fleet(FleetConfig::new(store))),
    )
}

/// Opens `breaker` and lets the opening reach the store, then waits the
/// open period out.
async fn opened_and_over(breaker: &Breaker) {
    record(breaker, Outcome::Failure, 2);
    settle().await;
    assert_eq!(state(breaker), State::Open);
    advance(secs(5)).await;
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

/// One process on a store, the open period over, one call: it waits one
/// election (20 ms here), wins, reaches the dependency as the probe, and
/// its success closes the circuit. Before, it was refused for the whole
/// lease and the probe waited for a next call.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_call_that_ends_the_open_period_is_the_probe() {
    let store = SlowElections::new(ms(20));
    let breaker = on(store.clone(), |f| f);
    opened_and_over(&breaker).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let service = PlainBreakerLayer::new(breaker.clone()).layer(dependency(&calls));

    let started = Instant::now();
    service.oneshot(()).await.expect("the probe");
    assert_eq!(started.elapsed(), ms(20), "one election");
    assert_eq!(calls.load(SeqCst), 1);
    assert_eq!(store.elections.load(SeqCst), 1);
    assert_eq!(state(&breaker), State::Closed);
}

/// The same through the breaker's own `acquire`, for code guarded by hand.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn acquire_waits_for_the_election_it_starts_and_probes() {
    let breaker = on(SlowElections::new(ms(20)), |f| f);
    opened_and_over(&breaker).await;
    let probe = breaker.acquire().await.expect("won: the probe");
    assert!(probe.is_probe());
    probe.record(Outcome::Success);
    assert_eq!(state(&breaker), State::Closed);
}

/// While the election runs, other callers are refused at once and told
/// the election's bound (the default 500 ms: under 1 s), not the probe
/// wait of 30 s; the waiting call then probes.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn callers_refused_during_an_election_are_told_when_it_ends() {
    let breaker = on(SlowElections::new(ms(20)), |f| f);
    opened_and_over(&breaker).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let service = PlainBreakerLayer::new(breaker.clone()).layer(dependency(&calls));
    let first = tokio::spawn(service.clone().oneshot(()));
    settle().await;
    assert_eq!(state(&breaker), State::Open, "electing reads as open");

    let refused = service.clone().oneshot(()).await.unwrap_err();
    let refused = refused.downcast_ref::<CircuitOpen>().expect("refused");
    assert_eq!(refused.retry_after(), ms(500));
    assert!(refused.retry_after() < secs(1));
    advance(ms(5)).await;
    assert_eq!(
        breaker.try_acquire().unwrap_err().retry_after(),
        ms(495),
        "counts down"
    );

    first.await.unwrap().expect("the waiting call probes");
    assert_eq!(calls.load(SeqCst), 1, "only the probe reached it");
    assert_eq!(state(&breaker), State::Closed);
}

/// Two processes on one store: the one whose call ended the open period
/// first wins and probes; the other's waiting call loses and is refused
/// with the fleet's new T (the doubled period the winner re-opens for if
/// its probe fails; a close reaches it sooner), never the 30 s lease,
/// without reaching the dependency.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_lost_election_refuses_the_waiting_call() {
    let store: Arc<dyn Store> = SlowElections::new(ms(20));
    let (a, b) = (on(store.clone(), |f| f), on(store.clone(), |f| f));
    record(&a, Outcome::Failure, 2);
    record(&b, Outcome::Failure, 2);
    settle().await;
    advance(secs(5)).await;

    let probe = a.acquire().await.expect("a wins");
    let calls = Arc::new(AtomicUsize::new(0));
    let lost = PlainBreakerLayer::new(b.clone())
        .layer(dependency(&calls))
        .oneshot(())
        .await
        .unwrap_err();
    let lost = lost.downcast_ref::<CircuitOpen>().expect("b refused");
    // Told the winner's lease (2 s), not the fleet's new T (10 s).
    assert_eq!(lost.retry_after(), secs(2) - ms(20));
    assert_eq!(calls.load(SeqCst), 0);
    assert_eq!(state(&b), State::Open);
    probe.record(Outcome::Success);
}

/// Two processes on one memory store: the first opens the circuit, wins
/// the election once the period is over and holds its probe; returns the
/// prober, the other process and that probe.
async fn another_process_probes() -> (Breaker, Breaker, tower_breaker::Permit) {
    let shared = Arc::new(MemoryStore::new());
    let (prober, other) = (
        on(SlowElections::on(&shared), |f| f),
        on(SlowElections::on(&shared), |f| f),
    );
    record(&prober, Outcome::Failure, 2);
    settle().await;
    assert_eq!(state(&other), State::Open, "the push reached it");
    advance(secs(5)).await;
    let probe = prober.acquire().await.expect("wins");
    (prober, other, probe)
}

/// While another process's probe is in flight, a process refuses its
/// callers with the time left of the prober's lease (at least a refresh
/// interval), as its periodic reads of the store tell it, not with the
/// fleet's T; over a probe slower than seven leases the hint stays within
/// one lease, and the probe's success closes this process too.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn callers_refused_during_another_process_probe_are_told_its_lease() {
    let (_prober, other, probe) = another_process_probes().await;
    let mut hints = Vec::new();
    for _ in 0..150 {
        advance(ms(100)).await;
        let refused = other.try_acquire().expect_err("no second probe");
        settle().await;
        hints.push(refused.retry_after());
    }
    let longest = hints.iter().max().copied().unwrap_or_default();
    assert!(longest <= secs(2), "within one lease: {hints:?}");
    assert!(
        hints.iter().all(|h| *h >= ms(100)),
        "at least a refresh interval: {hints:?}"
    );
    probe.record(Outcome::Success);
    settle().await;
    assert_eq!(state(&other), State::Closed);
    other
        .try_acquire()
        .expect("closed")
        .record(Outcome::Success);
}

/// Once the probe fails and the fleet re-opens, the hint is the time left
/// of the new opening again.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_failed_remote_probe_gives_back_the_opening_as_the_hint() {
    let (_prober, other, probe) = another_process_probes().await;
    advance(ms(100)).await;
    let during = other.try_acquire().expect_err("probing elsewhere");
    settle().await;
    assert!(
        during.retry_after() <= secs(2),
        "{:?}",
        during.retry_after()
    );
    probe.record(Outcome::Failure);
    settle().await;
    let after = other.try_acquire().expect_err("re-opened");
    assert!(
        after.retry_after() > secs(5),
        "the grown period: {:?}",
        after.retry_after()
    );
}

/// An election that never answers holds the waiting call for the
/// election timeout only (300 ms here); the call is then refused, and the
/// dependency is not called.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_wait_ends_at_the_election_timeout() {
    let store = Arc::new(SlowElections {
        mute: true,
        ..SlowElections::default()
    });
    let breaker = on(store, |f| f.election_timeout(ms(300)));
    opened_and_over(&breaker).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let service = PlainBreakerLayer::new(breaker.clone()).layer(dependency(&calls));

    let started = Instant::now();
    let refused = service.oneshot(()).await.unwrap_err();
    assert_eq!(started.elapsed(), ms(300));
    assert!(refused.downcast_ref::<CircuitOpen>().is_some());
    assert_eq!(calls.load(SeqCst), 0);
    assert_eq!(breaker.snapshot().totals.store_errors, 1);
}

/// A call that gives up while it waits (its future dropped) leaves the
/// election to end on its own: the breaker is half-open with the probe
/// slot free, and the next call probes.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_waiting_call_that_is_dropped_leaves_nothing_held() {
    let breaker = on(SlowElections::new(ms(20)), |f| f);
    opened_and_over(&breaker).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let service = PlainBreakerLayer::new(breaker.clone()).layer(dependency(&calls));
    let gave_up = tokio::time::timeout(ms(10), service.clone().oneshot(())).await;
    assert!(gave_up.is_err(), "still waiting at 10 ms");
    advance(ms(10)).await;
    settle().await;
    assert_eq!(state(&breaker), State::HalfOpen);
    service.oneshot(()).await.expect("the next call probes");
    assert_eq!(calls.load(SeqCst), 1);
    assert_eq!(state(&breaker), State::Closed);
}

/// Without a store nothing waits: the call that ends the open period
/// probes at once, as before.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn without_a_store_nothing_waits() {
    let breaker = Breaker::with_config("local", config().count_window(2).minimum_calls(2));
    record(&breaker, Outcome::Failure, 2);
    advance(secs(5)).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    PlainBreakerLayer::new(breaker.clone())
        .layer(dependency(&calls))
        .oneshot(())
        .await
        .expect("the probe");
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(state(&breaker), State::Closed);
}

/// An election that answers after the election timeout is still used: the
/// waiting call was refused at the timeout, but the late win makes this
/// process half-open at once (a win not used would hold the whole fleet
/// for the lease), and its next call probes.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_win_that_comes_after_the_timeout_still_probes() {
    let breaker = on(SlowElections::new(ms(400)), |f| f.election_timeout(ms(300)));
    opened_and_over(&breaker).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let service = PlainBreakerLayer::new(breaker.clone()).layer(dependency(&calls));
    let refused = service.clone().oneshot(()).await.unwrap_err();
    assert!(refused.downcast_ref::<CircuitOpen>().is_some());
    assert_eq!(state(&breaker), State::Open);
    advance(ms(100)).await;
    settle().await;
    assert_eq!(state(&breaker), State::HalfOpen, "the late win");
    service.oneshot(()).await.expect("the probe");
    assert_eq!(calls.load(SeqCst), 1);
    assert_eq!(state(&breaker), State::Closed);
}

/// A process half-open as the fleet's prober that freezes (its renewals
/// stop reaching the store) past its lease: another process is elected
/// once the fleet's T has passed, probes and closes the record. The
/// frozen prober then follows the fleet's close (pushed here) instead of
/// staying half-open, where its next calls would be a second probe.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_prober_past_its_lease_adopts_the_fleets_close() {
    let shared = Arc::new(MemoryStore::new());
    let (frozen_view, other_view) = (SlowElections::on(&shared), SlowElections::on(&shared));
    let (frozen, other) = (on(frozen_view.clone(), |f| f), on(other_view, |f| f));
    record(&frozen, Outcome::Failure, 2);
    settle().await;
    assert_eq!(state(&other), State::Open, "pushed");
    advance(secs(5)).await;
    let stuck = frozen.acquire().await.expect("the frozen process wins");
    assert_eq!(state(&frozen), State::HalfOpen);
    frozen_view.renewals_fail.store(true, SeqCst);

    // Past the winner's new T (a doubled period) and its lease.
    advance(secs(10)).await;
    let probe = other.acquire().await.expect("elected after the lease");
    probe.record(Outcome::Success);
    settle().await;
    assert_eq!(state(&other), State::Closed);
    assert_eq!(state(&frozen), State::Closed, "followed the fleet's close");
    drop(stuck);
}

/// The killed prober: its lease is 2 s and stops being renewed, so the
/// next process is elected as soon as the fleet's T (the winner's doubled
/// period, 10 s) has passed, not after the 30 s probe wait the lease used
/// to be.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_dead_prober_frees_the_fleet_within_one_lease_after_t() {
    let shared = Arc::new(MemoryStore::new());
    let (dead_view, other_view) = (SlowElections::on(&shared), SlowElections::on(&shared));
    let (dead, other) = (on(dead_view.clone(), |f| f), on(other_view, |f| f));
    record(&dead, Outcome::Failure, 2);
    settle().await;
    advance(secs(5)).await;
    let _probe = dead.acquire().await.expect("wins");
    dead_view.renewals_fail.store(true, SeqCst);
    let won_at = Instant::now();

    let elected = loop {
        if let Ok(probe) = other.acquire().await {
            break probe;
        }
        advance(ms(100)).await;
    };
    assert!(elected.is_probe());
    let after = won_at.elapsed();
    assert!(
        after >= secs(10) && after <= secs(10) + secs(2),
        "elected {after:?} after the dead prober's win"
    );
}

/// A live probe slower than five leases (15 s against a 2 s lease) keeps
/// its lease by renewing it: no other process is elected meanwhile, even
/// past the fleet's T; its success then closes everyone.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_slow_live_probe_keeps_its_lease_and_stays_alone() {
    let shared = Arc::new(MemoryStore::new());
    let (slow_view, other_view) = (SlowElections::on(&shared), SlowElections::on(&shared));
    let (slow, other) = (on(slow_view.clone(), |f| f), on(other_view, |f| f));
    record(&slow, Outcome::Failure, 2);
    settle().await;
    advance(secs(5)).await;
    let probe = slow.acquire().await.expect("wins");
    for _ in 0..150 {
        advance(ms(100)).await;
        assert!(other.acquire().await.is_err(), "a second probe");
    }
    let renewals = slow_view.renewals.load(SeqCst);
    assert!(
        renewals >= 8,
        "renewed more than once per lease: {renewals}"
    );
    probe.record(Outcome::Success);
    settle().await;
    assert_eq!(state(&other), State::Closed);
}

/// A prober that was frozen past its lease wakes after the fleet elected
/// another prober, whose probe failed and re-opened: its next renewal is
/// fenced, and it leaves half-open for the fleet's opening (no second
/// probe from it).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_fenced_renewal_leaves_half_open_for_the_fleets_decision() {
    let shared = Arc::new(MemoryStore::new());
    let (frozen_view, other_view) = (SlowElections::on(&shared), SlowElections::on(&shared));
    let (frozen, other) = (on(frozen_view.clone(), |f| f), on(other_view, |f| f));
    record(&frozen, Outcome::Failure, 2);
    settle().await;
    advance(secs(5)).await;
    let _stuck = frozen.acquire().await.expect("wins");
    frozen_view.renewals_fail.store(true, SeqCst);
    advance(secs(10)).await;
    other
        .acquire()
        .await
        .expect("elected")
        .record(Outcome::Failure);
    settle().await;
    assert_eq!(state(&other), State::Open);

    frozen_view.renewals_fail.store(false, SeqCst);
    advance(secs(1)).await;
    settle().await;
    assert_eq!(state(&frozen), State::Open, "fenced: follows the re-open");
}

/// A store slower than the election timeout (seen: 2.7 s from a loaded
/// local DynamoDB): the breaker times the first election out, goes back to
/// open for a refresh interval and starts a second one, queued behind the
/// first. The first's late win still makes it half-open, and the second
/// never reaches the store (it would lose against this process's own
/// lease and hold the fleet for it).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_late_win_ends_a_later_election_too() {
    let store = SlowElections::new(secs(1));
    let breaker = on(store.clone(), |f| {
        f.election_timeout(ms(300)).refresh_interval(ms(100))
    });
    opened_and_over(&breaker).await;
    assert!(breaker.acquire().await.is_err(), "timed out at 300 ms");
    advance(ms(150)).await;
    assert!(breaker.try_acquire().is_err(), "a second election starts");
    advance(ms(600)).await;
    settle().await;
    assert_eq!(state(&breaker), State::HalfOpen, "the first one's late win");
    settle().await;
    assert_eq!(store.elections.load(SeqCst), 1);
    breaker
        .try_acquire()
        .expect("the probe")
        .record(Outcome::Success);
    assert_eq!(state(&breaker), State::Closed);
}

/// A process opened on its own while its write-through failed; later the
/// rest of the fleet probed and closed the circuit. When that process
/// reads the store again it finds the close, which is newer than its
/// opening: it must not write its opening over it (before, it did, and the
/// fleet re-opened against a dependency that had just recovered).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_close_is_never_overwritten_by_an_older_unshared_opening() {
    let shared = Arc::new(MemoryStore::new());
    let lonely_view = Arc::new(SlowElections {
        inner: Arc::clone(&shared),
        deaf: true,
        ..SlowElections::default()
    });
    lonely_view.opens_fail.store(true, SeqCst);
    let lonely = on(lonely_view.clone(), |f| f.refresh_interval(secs(3600)));
    let fleet = on(SlowElections::on(&shared), |f| f);

    record(&fleet, Outcome::Failure, 2);
    settle().await;
    advance(secs(1)).await;
    record(&lonely, Outcome::Failure, 2);
    settle().await;
    assert_eq!(state(&lonely), State::Open, "opened alone, not shared");

    advance(secs(4)).await;
    fleet
        .acquire()
        .await
        .expect("the fleet's probe")
        .record(Outcome::Success);
    settle().await;
    assert_eq!(shared.read("dep").await.unwrap(), Decision::Closed);

    lonely_view.opens_fail.store(false, SeqCst);
    lonely.refresh().await.unwrap();
    settle().await;
    assert_eq!(
        shared.read("dep").await.unwrap(),
        Decision::Closed,
        "the close stands"
    );
    assert!(fleet.try_acquire().is_ok(), "the fleet stays closed");
}

/// Two processes; `a` wins the election without a call to probe with
/// (`try_acquire` does not wait for it) and stays quiet; `b` calls every
/// 100 ms. Returns how long after the win `b` probed (it probes once and
/// succeeds), and `a`'s state then.
async fn quiet_winner(keeps_probes: bool) -> (Duration, State) {
    let shared = Arc::new(MemoryStore::new());
    let view = |keeps_probes| {
        Arc::new(SlowElections {
            inner: Arc::clone(&shared),
            keeps_probes,
            ..SlowElections::default()
        })
    };
    let (a, b) = (on(view(keeps_probes), |f| f), on(view(keeps_probes), |f| f));
    record(&a, Outcome::Failure, 2);
    settle().await;
    assert_eq!(state(&b), State::Open, "the push reached it");
    advance(secs(5)).await;
    assert!(a.try_acquire().is_err(), "the election starts");
    settle().await;
    assert_eq!(state(&a), State::HalfOpen, "a won");
    let won = Instant::now();
    loop {
        assert!(won.elapsed() < secs(30), "b never probed");
        advance(ms(100)).await;
        settle().await;
        if let Ok(permit) = b.try_acquire() {
            assert!(permit.is_probe(), "b probes");
            permit.record(Outcome::Success);
            settle().await;
            return (won.elapsed(), state(&a));
        }
    }
}

/// The winner of the fleet's election that makes no call (a quiet
/// process, a keyed breaker's key without traffic, a caller that gave up
/// while it waited) gives the probe back after two renewals without a
/// probe in flight (1.3 s with the default 2 s lease): another process
/// probes at its next call. Before, the winner renewed its lease for as
/// long as it lived, and nobody probed.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_winner_without_a_call_gives_the_probe_back() {
    let (after, a) = quiet_winner(false).await;
    assert!(after <= ms(1_500), "b probed {after:?} after the win");
    assert_eq!(a, State::Closed, "b's success closed a too");
}

/// Giving the probe back is not an opening for an alert: it is told at
/// `INFO` as `circuit_probe_given_back` (how long the winner held the
/// probe, how long the circuit is open again), never as the `WARN`
/// `circuit_opened` that failures cause.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_probe_given_back_is_told_as_such_not_as_an_opening() {
    let events = resilience_testkit::Events::default();
    let _guard = resilience_testkit::set_default(events.clone());
    quiet_winner(false).await;
    let seen = events.take();
    let given_back: Vec<_> = seen
        .iter()
        .filter(|(message, _)| message == "circuit_probe_given_back")
        .collect();
    assert_eq!(given_back.len(), 1, "events: {seen:?}");
    let fields = &given_back[0].1;
    assert_eq!(fields["breaker"], "dep");
    let held: u64 = fields["held_ms"].parse().unwrap();
    assert!((1_000..=1_500).contains(&held), "held {held} ms");
    assert!(
        !seen
            .iter()
            .any(|(message, fields)| message == "circuit_opened"
                && fields.get("cause").map(String::as_str) == Some("ProbeGivenBack")),
        "a give-back told as an opening: {seen:?}"
    );
}

/// On a store that cannot take the probe back, the quiet winner stops
/// renewing: the fleet elects again once the election's T (the grown
/// period, 10 s) has passed, never later.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn on_a_store_that_keeps_probes_a_quiet_winner_holds_the_fleet_until_t_only() {
    let (after, _) = quiet_winner(true).await;
    assert!(
        after > secs(9) && after <= secs(10) + ms(600),
        "b probed {after:?} after the win"
    );
}

// === keyed breakers ===
//
// A keyed service's `poll_ready` does not know the key, so a key's call
// that must wait for its breaker's fleet waits in the service's future.

/// A registry whose breakers are configured as [`on`]'s, on `store`.
fn registry_on(store: Arc<dyn Store>) -> BreakerRegistry<u32> {
    BreakerRegistry::new(
        "key",
        config()
            .count_window(2)
            .minimum_calls(2)
            .open_period(secs(5))
            .fleet(FleetConfig::new(store)),
    )
}

/// An HTTP dependency that counts its calls and answers `200`.
fn http_dependency(
    calls: &Arc<AtomicUsize>,
) -> impl tower::Service<
    Request<String>,
    Response = Response<String>,
    Error = Infallible,
    Future: Send,
> + Clone {
    let calls = Arc::clone(calls);
    service_fn(move |_: Request<String>| {
        calls.fetch_add(1, SeqCst);
        async { Ok::<_, Infallible>(Response::new(String::new())) }
    })
}

/// Which keyed service a test calls through.
#[derive(Clone, Copy, Debug)]
enum Flavour {
    Client,
    Server,
    Plain,
}

const FLAVOURS: [Flavour; 3] = [Flavour::Client, Flavour::Server, Flavour::Plain];

/// One call of key 1 through `flavour`'s keyed service over a counting
/// dependency: whether it reached the dependency and was answered well
/// (`Ok`), or was refused (`Err`, with the refusal).
async fn keyed_call(
    flavour: Flavour,
    registry: &BreakerRegistry<u32>,
    calls: &Arc<AtomicUsize>,
) -> Result<(), String> {
    match flavour {
        Flavour::Client => {
            let svc = KeyedCircuitBreaker::new(
                http_dependency(calls),
                registry.clone(),
                |_: &Request<String>| 1,
            );
            let response = svc
                .oneshot(Request::new(String::new()))
                .await
                .map_err(|e| e.to_string())?;
            response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        }
        Flavour::Server => {
            let svc = KeyedHttpCircuitBreaker::new(
                http_dependency(calls),
                registry.clone(),
                |_: &Request<String>| 1,
            );
            let response = svc.oneshot(Request::new(String::new())).await.unwrap();
            match response.status().as_u16() {
                200 => {
                    response
                        .into_body()
                        .collect()
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(())
                }
                status => Err(format!("answered {status}")),
            }
        }
        Flavour::Plain => {
            KeyedPlainCircuitBreaker::new(dependency(calls), registry.clone(), |_: &()| 1)
                .oneshot(())
                .await
                .map_err(|e| e.to_string())
        }
    }
}

/// The call that ends a key's open period waits for the election it
/// starts and, this process winning, is the probe (its success closes the
/// key's circuit), in each keyed flavour, as in the unkeyed ones. Before,
/// it started the election without waiting and was refused.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_keys_call_that_ends_its_open_period_waits_for_the_election_and_probes() {
    for flavour in FLAVOURS {
        let store = SlowElections::new(ms(20));
        let registry = registry_on(store.clone());
        opened_and_over(&registry.get(&1)).await;
        let calls = Arc::new(AtomicUsize::new(0));

        let started = Instant::now();
        let probed = keyed_call(flavour, &registry, &calls).await;
        assert_eq!(probed, Ok(()), "{flavour:?}: the probe");
        assert_eq!(started.elapsed(), ms(20), "{flavour:?}: one election");
        assert_eq!(calls.load(SeqCst), 1, "{flavour:?}");
        assert_eq!(store.elections.load(SeqCst), 1, "{flavour:?}");
        assert_eq!(state(&registry.get(&1)), State::Closed, "{flavour:?}");
    }
}

/// A key called once every 10 s on a fleet's store, its dependency healthy
/// again: the first call after the open period probes and closes the
/// circuit. Before, each call started an election and was refused; the
/// winner, with no call to probe with, gave the probe back 1.3 s later, and
/// the next call 10 s on did the same: the key stayed open for good.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_rarely_called_key_recovers_at_its_first_call_after_the_open_period() {
    for flavour in FLAVOURS {
        let registry = registry_on(Arc::new(MemoryStore::new()));
        opened_and_over(&registry.get(&1)).await;
        let calls = Arc::new(AtomicUsize::new(0));
        let mut answers = Vec::new();
        for _ in 0..4 {
            answers.push(keyed_call(flavour, &registry, &calls).await.is_ok());
            // 10 s of quiet, in steps, so the breaker's lease renewals and
            // a give-back run as they would.
            for _ in 0..100 {
                advance(ms(100)).await;
                settle().await;
            }
        }
        assert_eq!(answers, [true; 4], "{flavour:?}: answered");
        assert_eq!(calls.load(SeqCst), 4, "{flavour:?}");
        assert_eq!(state(&registry.get(&1)), State::Closed, "{flavour:?}");
    }
}

/// A call that waited for its key's election calls the layers below with
/// the context the layers above gave it (here the deadline of a client
/// deadline layer above, as it is during `call`).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_keys_waiting_call_keeps_the_context_of_the_layers_above() {
    let registry = registry_on(SlowElections::new(ms(20)));
    opened_and_over(&registry.get(&1)).await;
    let seen = Arc::new(std::sync::Mutex::new(None));
    let inner = {
        let seen = Arc::clone(&seen);
        service_fn(move |()| {
            *seen.lock().unwrap() = Some(CallContext::current(|cx| (cx.deadline(), cx.attempt())));
            async { Ok::<_, Infallible>(()) }
        })
    };
    let mut svc = KeyedPlainCircuitBreaker::new(inner, registry.clone(), |_: &()| 1);
    let deadline = Deadline::after(secs(2));
    std::future::poll_fn(|cx| tower::Service::poll_ready(&mut svc, cx))
        .await
        .unwrap();
    let waiting = CallContext::scoped(
        |cx| {
            cx.set_deadline(deadline, true);
            cx.set_attempt(1);
        },
        || tower::Service::call(&mut svc, ()),
    );
    assert!(
        seen.lock().unwrap().is_none(),
        "not called before the election"
    );
    waiting.await.expect("the probe");
    assert_eq!(*seen.lock().unwrap(), Some((Some(deadline), 1)));
}

/// A key's call that gives up while it waits leaves nothing held: the key
/// is half-open with the probe slot free, and its next call probes.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_keys_waiting_call_that_is_dropped_leaves_nothing_held() {
    let registry = registry_on(SlowElections::new(ms(20)));
    opened_and_over(&registry.get(&1)).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let gave_up = tokio::time::timeout(ms(10), keyed_call(Flavour::Plain, &registry, &calls)).await;
    assert!(gave_up.is_err(), "still waiting at 10 ms");
    advance(ms(10)).await;
    settle().await;
    assert_eq!(state(&registry.get(&1)), State::HalfOpen);
    assert_eq!(keyed_call(Flavour::Plain, &registry, &calls).await, Ok(()));
    assert_eq!(calls.load(SeqCst), 1);
    assert_eq!(state(&registry.get(&1)), State::Closed);
}

/// A key whose breaker need not wait (its fleet's decision is fresh) is
/// called at once, in `call`: the service that was made ready is the one
/// called. (A new key's first call reads the fleet's decision first, as a
/// new process's does.)
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_key_with_a_fresh_decision_is_called_in_call() {
    let registry = registry_on(SlowElections::new(ms(20)));
    let calls = Arc::new(AtomicUsize::new(0));
    assert_eq!(keyed_call(Flavour::Plain, &registry, &calls).await, Ok(()));
    let mut svc = KeyedPlainCircuitBreaker::new(dependency(&calls), registry, |_: &()| 1);
    std::future::poll_fn(|cx| tower::Service::poll_ready(&mut svc, cx))
        .await
        .unwrap();
    let future = tower::Service::call(&mut svc, ());
    assert_eq!(calls.load(SeqCst), 2, "called during `call`");
    future.await.unwrap();
}

/// What `try_acquire`'s docs warn about: on a store, a caller of
/// `try_acquire` that calls less often than the give-back (1.3 s) starts
/// an election at every call and is refused every time, while the same
/// caller with `acquire` probes at its first call and closes the circuit.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_rare_caller_probes_with_acquire_and_never_with_try_acquire() {
    for waits in [false, true] {
        let breaker = on(Arc::new(MemoryStore::new()), |f| f);
        opened_and_over(&breaker).await;
        let mut granted = Vec::new();
        for _ in 0..3 {
            let permit = if waits {
                breaker.acquire().await
            } else {
                breaker.try_acquire()
            };
            granted.push(permit.map(|p| p.record(Outcome::Success)).is_ok());
            // 5 s of quiet, in steps, so lease renewals and a give-back
            // run as they would.
            for _ in 0..50 {
                advance(ms(100)).await;
                settle().await;
            }
        }
        if waits {
            assert_eq!(granted, [true; 3]);
            assert_eq!(state(&breaker), State::Closed);
        } else {
            assert_eq!(granted, [false; 3]);
            assert_eq!(state(&breaker), State::Open);
        }
    }
}
