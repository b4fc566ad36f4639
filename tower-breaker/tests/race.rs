//! Races on the multi-thread runtime: one probe when the open period ends,
//! consistent figures under concurrent calls.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::*;
use tokio::sync::{Barrier, Semaphore};
use tower::{service_fn, BoxError, Layer};
use tower_breaker::{Breaker, BreakerLayer, Outcome, State};

const TASKS: usize = 1000;

/// A dependency that counts its calls and answers once released.
fn held(
    called: &Arc<AtomicUsize>,
    release: &Arc<Semaphore>,
) -> impl tower::Service<
    http::Request<String>,
    Response = http::Response<String>,
    Error = BoxError,
    Future = impl Send,
> + Clone
       + Send {
    let called = called.clone();
    let release = release.clone();
    service_fn(move |_req: http::Request<String>| {
        called.fetch_add(1, Ordering::SeqCst);
        let release = release.clone();
        async move {
            release.acquire().await.unwrap().forget();
            Ok::<_, BoxError>(http::Response::new(String::new()))
        }
    })
}

async fn probe_race(permitted: u32) -> usize {
    let b = Breaker::with_config(
        "race",
        config()
            .count_window(1)
            .minimum_calls(1)
            .open_period(Duration::ZERO)
            .permitted_probes(permitted),
    );
    record(&b, Outcome::Failure, 1);
    // Wait (without a timer) for the open period to be over.
    while b.snapshot().retry_after != Some(Duration::ZERO) {
        tokio::task::yield_now().await;
    }
    assert_eq!(b.snapshot().state, State::Open);

    let called = Arc::new(AtomicUsize::new(0));
    let rejected = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(Semaphore::new(0));
    let dependency = held(&called, &release);
    let svc = BreakerLayer::new(b.clone()).layer(dependency);
    let barrier = Arc::new(Barrier::new(TASKS));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let svc = svc.clone();
            let barrier = barrier.clone();
            let rejected = rejected.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                let result = send(&svc).await;
                if let Err(e) = &result {
                    assert!(e.is::<tower_breaker::error::CircuitOpen>());
                    rejected.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    while called.load(Ordering::SeqCst) + rejected.load(Ordering::SeqCst) < TASKS {
        tokio::task::yield_now().await;
    }
    let reached = called.load(Ordering::SeqCst);
    assert_eq!(b.snapshot().state, State::HalfOpen);
    release.add_permits(TASKS);
    for t in tasks {
        t.await.unwrap();
    }
    reached
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_of_1000_tasks_probes() {
    assert_eq!(probe_race(1).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_three_probe_with_three_permitted() {
    assert_eq!(probe_race(3).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_outcomes_keep_the_window_consistent() {
    // Eight tasks race their records into one window of 64. Phase one is
    // three failures in four per task (no 64 outcomes in a row can all be
    // failures: each task gives at most three in a row, so the circuit
    // cannot open at a rate of 1.0). Phase two, after every task is done
    // with phase one, is 64 records with exactly 8 failures: the window
    // must then hold those 64 and nothing else. A lost slot write leaves a
    // phase-one outcome behind (three in four are failures), a lost or
    // doubled aggregate update moves the counts: either breaks the totals.
    const PHASE_ONE: usize = 5_000;
    let b = Breaker::with_config(
        "race",
        config()
            .count_window(64)
            .minimum_calls(64)
            .failure_rate(1.0),
    );
    let barrier = Arc::new(Barrier::new(8));
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let b = b.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                for i in 0..PHASE_ONE {
                    let outcome = if (i + t) % 4 == 0 {
                        Outcome::Success
                    } else {
                        Outcome::Failure
                    };
                    b.try_acquire().unwrap().record(outcome);
                    if i % 64 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                barrier.wait().await;
                for i in 0..8 {
                    let outcome = if i == t % 8 {
                        Outcome::Failure
                    } else {
                        Outcome::Success
                    };
                    b.try_acquire().unwrap().record(outcome);
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let s = b.snapshot();
    assert_eq!(s.state, State::Closed);
    assert_eq!(s.totals.opened, 0);
    assert_eq!(
        (s.window.calls, s.window.failures, s.window.slow),
        (64, 8, 0),
        "the window holds exactly the last 64 records"
    );
    assert!((s.failure_rate - 0.125).abs() < 1e-9);
    assert_eq!(s.totals.calls(), 8 * (PHASE_ONE as u64 + 8));
    assert_eq!(s.totals.failed, 8 * (PHASE_ONE as u64 * 3 / 4 + 1));
    assert_eq!(s.totals.successful, 8 * (PHASE_ONE as u64 / 4 + 7));
    assert_eq!((s.totals.stale, s.totals.ignored), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_failures_opens_once() {
    let opened = Arc::new(AtomicUsize::new(0));
    let o = opened.clone();
    let b = Breaker::with_config(
        "race",
        config().count_window(20).minimum_calls(10).listener(
            move |t: &tower_breaker::Transition| {
                if t.to == State::Open {
                    o.fetch_add(1, Ordering::SeqCst);
                }
            },
        ),
    );
    let permits: Vec<_> = (0..200).map(|_| b.try_acquire().unwrap()).collect();
    let tasks: Vec<_> = permits
        .into_iter()
        .map(|p| tokio::spawn(async move { p.record(Outcome::Failure) }))
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(b.snapshot().state, State::Open);
    assert_eq!(opened.load(Ordering::SeqCst), 1);
    assert_eq!(b.snapshot().totals.opened, 1);
}

/// Outcomes recorded from far more threads than the breaker has stripes
/// of counters: the threads wrap around the stripes, and every outcome is
/// counted, in the totals and in the window.
#[test]
fn outcomes_from_more_threads_than_stripes_are_all_counted() {
    const THREADS: usize = 100;
    let b = Breaker::with_config(
        "threads",
        config()
            .count_window(1000)
            .minimum_calls(1000)
            .failure_rate(1.0),
    );
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                record(&b, Outcome::Success, 2);
                record(&b, Outcome::Failure, 1);
            });
        }
    });
    let s = b.snapshot();
    assert_eq!((s.totals.successful, s.totals.failed), (200, 100));
    assert_eq!((s.window.calls, s.window.failures), (300, 100));
    assert_eq!(s.state, State::Closed);
}

/// Rejections from far more threads than the breaker has stripes of
/// counters: every one is counted.
#[test]
fn rejections_from_more_threads_than_stripes_are_all_counted() {
    const THREADS: usize = 100;
    let b = Breaker::with_config("threads", config().count_window(1).minimum_calls(1));
    record(&b, Outcome::Failure, 1);
    assert_eq!(b.snapshot().state, State::Open);
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| assert!(b.try_acquire().is_err()));
        }
    });
    assert_eq!(b.snapshot().totals.rejected, THREADS as u64);
}
