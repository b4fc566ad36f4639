//! Breakers sharing one store behave as one circuit; a failing store fails
//! open.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::*;
use tower_breaker::store::{
    Decision, Election, MemoryStore, ProbeToken, Store, StoreError, StoreFuture,
};
use tower_breaker::FleetConfig;
use tower_breaker::{Breaker, Outcome, State};

const REFRESH: Duration = Duration::from_millis(100);

/// Lets spawned store tasks run.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

fn fleet(store: &Arc<MemoryStore>, n: usize) -> Vec<Breaker> {
    let store: Arc<dyn Store> = store.clone();
    (0..n)
        .map(|_| {
            Breaker::with_config(
                "shared",
                config()
                    .count_window(2)
                    .minimum_calls(2)
                    .fleet(FleetConfig::new(store.clone()).refresh_interval(REFRESH)),
            )
        })
        .collect()
}

/// Calls every breaker once, so each notices a due refresh or an election.
async fn poke(fleet: &[Breaker]) {
    for b in fleet {
        if let Ok(p) = b.try_acquire() {
            p.record(Outcome::Ignored);
        }
    }
    settle().await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn one_trips_and_all_reject_at_once_by_push() {
    let store = Arc::new(MemoryStore::new());
    let fleet = fleet(&store, 5);
    poke(&fleet).await;
    record(&fleet[0], Outcome::Failure, 2);
    settle().await;
    for b in &fleet[1..] {
        assert!(b.try_acquire().is_err(), "pushed: no wait for a read");
        assert_eq!(state(b), State::Open);
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn without_pushes_one_trips_and_all_reject_within_one_refresh_interval() {
    let store = Arc::new(Faulty::default());
    let fleet: Vec<Breaker> = (0..5)
        .map(|_| {
            Breaker::with_config(
                "shared",
                config()
                    .count_window(2)
                    .minimum_calls(2)
                    .fleet(FleetConfig::new(store.clone()).refresh_interval(REFRESH)),
            )
        })
        .collect();
    poke(&fleet).await; // first reads: closed
    record(&fleet[0], Outcome::Failure, 2);
    assert_eq!(state(&fleet[0]), State::Open);
    settle().await;
    assert!(matches!(
        store.read("shared").await.unwrap(),
        Decision::Open { .. }
    ));

    for b in &fleet[1..] {
        assert!(b.try_acquire().is_ok(), "not yet: the cache is fresh");
    }
    advance(REFRESH).await;
    poke(&fleet).await;
    for b in &fleet[1..] {
        let err = b.try_acquire().unwrap_err();
        assert!(err.retry_after() <= secs(5));
        assert_eq!(b.snapshot().totals.failed, 0, "never saw a failure itself");
        assert_eq!(state(b), State::Open);
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn one_probe_fleet_wide_and_its_success_closes_everyone() {
    let store = Arc::new(MemoryStore::new());
    let fleet = fleet(&store, 5);
    record(&fleet[0], Outcome::Failure, 2);
    settle().await;
    advance(REFRESH).await;
    poke(&fleet).await;
    assert!(fleet.iter().all(|b| state(b) == State::Open));

    advance(secs(5)).await;
    poke(&fleet).await; // the open periods end: elections
    let mut probes = Vec::new();
    for _ in 0..20 {
        for b in &fleet {
            if let Ok(p) = b.try_acquire() {
                probes.push(p);
            }
        }
        settle().await;
    }
    assert_eq!(probes.len(), 1, "exactly one probe in the whole fleet");
    assert_eq!(
        fleet.iter().filter(|b| state(b) == State::HalfOpen).count(),
        1
    );
    probes.pop().unwrap().record(Outcome::Success);
    settle().await;
    assert_eq!(store.read("shared").await.unwrap(), Decision::Closed);
    advance(REFRESH).await;
    poke(&fleet).await;
    poke(&fleet).await;
    for b in &fleet {
        assert_eq!(state(b), State::Closed);
        assert!(b.try_acquire().is_ok());
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_failed_probe_keeps_the_fleet_open_for_the_longer_period() {
    let store = Arc::new(MemoryStore::new());
    let fleet = fleet(&store, 3);
    record(&fleet[0], Outcome::Failure, 2);
    settle().await;
    advance(secs(5)).await;
    poke(&fleet).await;
    let mut probe = None;
    for b in &fleet {
        if let Ok(p) = b.try_acquire() {
            probe = Some(p);
        }
    }
    let probe = probe.expect("the election winner probes");
    probe.record(Outcome::Failure);
    settle().await;
    match store.read("shared").await.unwrap() {
        Decision::Open { remaining } => assert!(remaining > secs(9), "{remaining:?}"),
        other => panic!("still open, got {other:?}"),
    }
}

/// A [`MemoryStore`] with faults: no pushes (the breakers learn from their
/// reads alone, as when pushes are lost), a `close` that answers late, and
/// elections that fail a number of times before they work, or never answer.
#[derive(Debug)]
struct Faulty {
    inner: MemoryStore,
    close_delay: Duration,
    failing_elections: std::sync::atomic::AtomicU32,
    /// Elections never answer.
    mute_elections: bool,
}

impl Default for Faulty {
    fn default() -> Self {
        Self {
            inner: MemoryStore::new(),
            close_delay: Duration::ZERO,
            failing_elections: std::sync::atomic::AtomicU32::new(0),
            mute_elections: false,
        }
    }
}

impl Store for Faulty {
    fn try_open<'a>(&'a self, name: &'a str, open_for: Duration) -> StoreFuture<'a, Duration> {
        self.inner.try_open(name, open_for)
    }
    fn try_acquire_probe<'a>(
        &'a self,
        name: &'a str,
        open_for: Duration,
        lease: Duration,
    ) -> StoreFuture<'a, Election> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.mute_elections {
            return Box::pin(std::future::pending());
        }
        let failing = self
            .failing_elections
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Box::pin(async { Err(StoreError::new("timed out")) });
        }
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
        self.inner.read(name)
    }
}

/// A store that always fails.
#[derive(Debug)]
struct Down;

impl Store for Down {
    fn try_open<'a>(&'a self, _: &'a str, _: Duration) -> StoreFuture<'a, Duration> {
        Box::pin(async { Err(StoreError::new("down")) })
    }
    fn try_acquire_probe<'a>(
        &'a self,
        _: &'a str,
        _: Duration,
        _: Duration,
    ) -> StoreFuture<'a, Election> {
        Box::pin(async { Err(StoreError::new("down")) })
    }
    fn close<'a>(&'a self, _: &'a str, _: ProbeToken) -> StoreFuture<'a, bool> {
        Box::pin(async { Err(StoreError::new("down")) })
    }
    fn read<'a>(&'a self, _: &'a str) -> StoreFuture<'a, Decision> {
        Box::pin(async { Err(StoreError::new("down")) })
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_failing_store_fails_open_and_the_local_breaker_keeps_working() {
    let b = Breaker::with_config(
        "t",
        config()
            .count_window(2)
            .minimum_calls(2)
            .fleet(FleetConfig::new(Arc::new(Down)).refresh_interval(REFRESH)),
    );
    record(&b, Outcome::Success, 3);
    settle().await;
    record(&b, Outcome::Failure, 1); // 1 of 2: 50%
    settle().await;
    assert_eq!(state(&b), State::Open, "the local decision stands");
    advance(secs(5)).await;
    assert!(b.try_acquire().is_err(), "electing");
    settle().await;
    let probe = b
        .try_acquire()
        .expect("the failed election falls back to a local probe");
    probe.record(Outcome::Success);
    settle().await;
    assert_eq!(state(&b), State::Closed);
    assert!(b.snapshot().totals.store_errors >= 3);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_next_prober_grows_the_period_from_the_fleets_reopens() {
    let store = Arc::new(MemoryStore::new());
    let fleet = fleet(&store, 2);
    record(&fleet[0], Outcome::Failure, 2);
    settle().await;
    // Round 1: only fleet[0] calls; its probe fails: 10 s (5 s x 2).
    advance(secs(5)).await;
    poke(&fleet[..1]).await;
    fleet[0].try_acquire().unwrap().record(Outcome::Failure);
    settle().await;
    match store.read("shared").await.unwrap() {
        Decision::Open { remaining } => assert_eq!(remaining, secs(10)),
        other => panic!("open, got {other:?}"),
    }
    // Round 2: fleet[1], which never re-opened itself, wins; it learns the
    // fleet's count and its failed probe holds the circuit 20 s.
    advance(secs(10)).await;
    let mut probe = None;
    for _ in 0..5 {
        // Reads "expired", adopts it, elects, wins.
        match fleet[1].try_acquire() {
            Ok(p) if p.is_probe() => probe = Some(p),
            Ok(p) => p.record(Outcome::Ignored),
            Err(_) => {}
        }
        settle().await;
    }
    let probe = probe.expect("fleet[1] won the election");
    probe.record(Outcome::Failure);
    settle().await;
    match store.read("shared").await.unwrap() {
        Decision::Open { remaining } => assert_eq!(remaining, secs(20)),
        other => panic!("open, got {other:?}"),
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn fail_closed_rejects_while_the_store_fails_and_recovers_with_it() {
    let b = Breaker::with_config(
        "t",
        config().fleet(
            FleetConfig::new(Arc::new(Down))
                .refresh_interval(REFRESH)
                .on_store_failure(tower_breaker::store::StoreFailureMode::FailClosed),
        ),
    );
    b.try_acquire().unwrap().record(Outcome::Success); // starts the first read
    settle().await;
    let err = b.try_acquire().unwrap_err();
    assert_eq!(err.retry_after(), REFRESH);
    assert_eq!(state(&b), State::Closed);
    assert!(b.snapshot().totals.rejected >= 1);

    // Against a store that answers, the same breaker admits after a read.
    let ok = Breaker::with_config(
        "t",
        config().fleet(
            FleetConfig::new(Arc::new(MemoryStore::new()))
                .on_store_failure(tower_breaker::store::StoreFailureMode::FailClosed),
        ),
    );
    ok.refresh().await.unwrap();
    assert!(ok.try_acquire().is_ok());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn memory_store_records_expire_after_the_cleanup_time() {
    let store = MemoryStore::new().cleanup_after(Duration::from_secs(60));
    for i in 0..100 {
        store
            .try_open(&format!("tenant-{i}"), Duration::from_secs(5))
            .await
            .unwrap();
    }
    assert_eq!(store.len(), 100);
    // Past T, within the cleanup time: still there, and expired.
    tokio::time::advance(Duration::from_secs(64)).await;
    assert_eq!(store.read("tenant-0").await.unwrap(), Decision::Expired);
    assert_eq!(store.len(), 100);
    // Past T plus the cleanup time: gone at the next sweep (sweeps run at
    // most every quarter of the cleanup time).
    tokio::time::advance(Duration::from_secs(16)).await;
    assert_eq!(store.read("tenant-0").await.unwrap(), Decision::Missing);
    assert!(store.is_empty());
}

// --- guarantees that survive the store's failures ---

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_lost_record_never_closes_the_fleet_without_a_probe() {
    let store = Arc::new(MemoryStore::new());
    let fleet = fleet(&store, 3);
    poke(&fleet).await;
    record(&fleet[0], Outcome::Failure, 2);
    settle().await;
    advance(REFRESH).await;
    poke(&fleet).await;
    assert!(fleet.iter().all(|b| state(b) == State::Open));

    // The store loses the record (a restart without persistence, say).
    assert!(store.remove("shared"));
    for _ in 0..5 {
        advance(REFRESH).await;
        poke(&fleet).await;
        assert!(
            fleet.iter().all(|b| state(b) == State::Open),
            "nobody closes on a missing record"
        );
    }
    // And the openings are written again.
    assert!(matches!(
        store.read("shared").await.unwrap(),
        Decision::Open { .. }
    ));
    // At the end of the period: exactly one probe, fleet-wide.
    advance(secs(5)).await;
    let mut probes = Vec::new();
    for _ in 0..3 {
        for b in &fleet {
            if let Ok(p) = b.try_acquire() {
                assert!(p.is_probe(), "only probes pass");
                probes.push(p);
            }
        }
        settle().await;
    }
    assert_eq!(probes.len(), 1, "one probe");
    probes.pop().unwrap().record(Outcome::Success);
    settle().await;
    advance(REFRESH).await;
    poke(&fleet).await;
    assert!(fleet.iter().all(|b| state(b) == State::Closed));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_slow_probe_keeps_its_lease_past_the_open_period() {
    let store = Arc::new(MemoryStore::new());
    let fleet = fleet(&store, 3);
    poke(&fleet).await;
    record(&fleet[0], Outcome::Failure, 2);
    settle().await;
    advance(REFRESH).await;
    poke(&fleet).await;
    assert!(fleet.iter().all(|b| state(b) == State::Open));
    advance(secs(5)).await;
    // The first caller after the period is elected and probes...
    let probe = fleet[1].try_acquire();
    settle().await;
    let probe = match probe {
        Ok(p) => p,
        Err(_) => fleet[1].try_acquire().expect("elected"),
    };
    assert!(probe.is_probe());
    // ...for longer than the next open period (10 s): nobody else is
    // elected while its lease (the 30 s half-open wait) runs.
    for _ in 0..25 {
        advance(secs(1)).await;
        poke(&fleet).await;
        for b in [&fleet[0], &fleet[2]] {
            assert!(
                b.try_acquire().is_err(),
                "a second prober during the first one's lease"
            );
        }
    }
    probe.record(Outcome::Success);
    settle().await;
    assert_eq!(store.read("shared").await.unwrap(), Decision::Closed);
    advance(REFRESH).await;
    poke(&fleet).await;
    assert!(fleet.iter().all(|b| state(b) == State::Closed));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_stale_prober_cannot_reopen_a_circuit_the_fleet_closed() {
    let store = MemoryStore::new();
    store.try_open("svc", secs(1)).await.unwrap();
    advance(secs(1)).await;
    let Election::Won(stale) = store
        .try_acquire_probe("svc", secs(1), secs(2))
        .await
        .unwrap()
    else {
        panic!("first elector wins")
    };
    // Its lease runs out; another is elected and closes the circuit.
    advance(secs(3)).await;
    let Election::Won(fresh) = store
        .try_acquire_probe("svc", secs(1), secs(2))
        .await
        .unwrap()
    else {
        panic!("the lease is over")
    };
    assert!(store.close("svc", fresh).await.unwrap());
    // The stale prober's probe failed at last: fenced, nothing written.
    assert_eq!(
        store.reopen("svc", stale, secs(10)).await.unwrap(),
        Duration::ZERO
    );
    assert!(!store.close("svc", stale).await.unwrap());
    assert_eq!(store.read("svc").await.unwrap(), Decision::Closed);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_close_and_a_later_open_reach_the_store_in_order() {
    let store = Arc::new(Faulty {
        close_delay: ms(50),
        ..Faulty::default()
    });
    let b = Breaker::with_config(
        "ordered",
        config()
            .count_window(2)
            .minimum_calls(2)
            .fleet(FleetConfig::new(store.clone()).refresh_interval(secs(60))),
    );
    record(&b, Outcome::Failure, 2);
    settle().await;
    advance(secs(5)).await;
    let probe = b.try_acquire();
    settle().await;
    let probe = probe.or_else(|_| b.try_acquire()).expect("elected");
    probe.record(Outcome::Success); // close: written slowly
    assert_eq!(state(&b), State::Closed);

    record(&b, Outcome::Failure, 2); // and open again at once
    assert_eq!(state(&b), State::Open);
    for _ in 0..10 {
        advance(ms(10)).await;
        settle().await;
    }
    // Not the election's record (open until its T, with the prober's
    // lease), nor the close: the new opening, after both.
    let read = store.read("ordered").await.unwrap();
    assert!(
        matches!(read, Decision::Open { remaining } if remaining > secs(4)),
        "the opening was written after the close: {read:?}"
    );
}

#[test]
fn a_breaker_with_a_store_outside_a_runtime_is_refused_by_try_with_config() {
    let err = Breaker::try_with_config("no-runtime", config().store(Arc::new(MemoryStore::new())))
        .unwrap_err();
    assert!(err.to_string().contains("tokio runtime"), "{err}");
    // Without a store, no runtime is needed.
    assert!(Breaker::try_with_config("plain", config()).is_ok());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn one_failed_election_does_not_let_the_process_probe_on_its_own() {
    let store = Arc::new(Faulty {
        failing_elections: std::sync::atomic::AtomicU32::new(1),
        ..Faulty::default()
    });
    let b = Breaker::with_config(
        "flaky",
        config()
            .count_window(2)
            .minimum_calls(2)
            .fleet(FleetConfig::new(store.clone()).refresh_interval(REFRESH)),
    );
    record(&b, Outcome::Failure, 2);
    settle().await;
    advance(secs(5)).await;
    assert!(b.try_acquire().is_err(), "electing");
    settle().await;
    // The election failed once: still open, asking again a refresh later.
    assert_eq!(state(&b), State::Open);
    assert!(b.try_acquire().is_err(), "no local probe after one failure");
    advance(REFRESH).await;
    assert!(b.try_acquire().is_err(), "electing again");
    settle().await;
    let probe = b.try_acquire().expect("won the second election");
    assert!(probe.is_probe());
    assert_eq!(b.snapshot().totals.store_errors, 1);
}

/// An election that never answers does not leave the circuit electing for
/// ever: until the election timeout (not the probe wait, here much
/// longer), callers are told to wait for it; one tick after, the election
/// counts as a store error and the circuit stays open (the store worked
/// until then: no local probe yet).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_election_that_never_answers_times_out_after_the_election_timeout() {
    let b = Breaker::with_config(
        "mute",
        config()
            .count_window(2)
            .minimum_calls(2)
            .max_half_open_wait(secs(30))
            .fleet(
                FleetConfig::new(Arc::new(Faulty {
                    mute_elections: true,
                    ..Faulty::default()
                }))
                .refresh_interval(REFRESH)
                .election_timeout(ms(300)),
            ),
    );
    record(&b, Outcome::Failure, 2);
    settle().await;
    advance(secs(5)).await;
    let electing = b.try_acquire().unwrap_err();
    assert_eq!(electing.retry_after(), ms(300), "the election timeout");
    settle().await;
    advance(ms(299)).await;
    let electing = b.try_acquire().unwrap_err();
    assert_eq!(electing.retry_after(), ms(1), "the election's last tick");
    assert_eq!(b.snapshot().totals.store_errors, 0);
    advance(ms(2)).await;
    assert!(b.try_acquire().is_err(), "timed out: open, no local probe");
    assert_eq!(state(&b), State::Open);
    assert_eq!(b.snapshot().totals.store_errors, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_store_down_for_two_refresh_intervals_lets_the_process_probe_on_its_own() {
    let b = Breaker::with_config(
        "down",
        config()
            .count_window(2)
            .minimum_calls(2)
            .fleet(FleetConfig::new(Arc::new(Down)).refresh_interval(REFRESH)),
    );
    record(&b, Outcome::Failure, 2);
    settle().await;
    advance(secs(5)).await;
    let mut probe = None;
    let start = tokio::time::Instant::now();
    while probe.is_none() {
        if let Ok(p) = b.try_acquire() {
            probe = Some(p);
        }
        settle().await;
        advance(ms(10)).await;
        assert!(start.elapsed() < secs(1), "fails open in the end");
    }
    assert!(probe.unwrap().is_probe());
}
