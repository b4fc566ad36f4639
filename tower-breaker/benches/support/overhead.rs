//! The variants of the breaker's overhead benches (`overhead` times them,
//! `overhead_allocs` counts their allocations): a bare `service_fn`,
//! tower's `ConcurrencyLimit` as the control, and the breaker's closed
//! paths (count window, time window with slow-call timing, with and without
//! the attempt hook) and open paths, the throttle admitting and shedding;
//! and the peer circuit breakers of
//! `peers.rs`, closed and open (a bench that expands `variants!` declares
//! that module too).

#![allow(dead_code, unreachable_pub)] // each bench uses what it needs

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::time::Duration;

use http::{Request, Response};
use tokio::time::Instant;
use tower::{service_fn, Service, ServiceExt};
use tower_breaker::throttle::ThrottleHandle;
use tower_breaker::{Breaker, BreakerConfig, Outcome};
use tower_resilience_base::criticality::Criticality;

pub type Bare = tower::util::ServiceFn<fn(Request<()>) -> Ready<Result<Response<()>, Infallible>>>;

pub fn bare() -> Bare {
    service_fn(|_req: Request<()>| ready(Ok::<_, Infallible>(Response::new(()))))
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// `iters` calls of `svc`, timed.
pub async fn run<S>(mut svc: S, iters: u64) -> Duration
where
    S: Service<Request<()>>,
{
    let start = Instant::now();
    for _ in 0..iters {
        let _ = svc.ready().await;
        let out = svc.call(Request::new(())).await;
        std::hint::black_box(out.is_ok());
    }
    start.elapsed()
}

/// `iters` calls on each of two OS threads at once (each with its own
/// current-thread runtime and a clone of the stack); returns the wall time,
/// i.e. the time per call as each thread sees it.
pub fn run_two<S>(svc: &S, iters: u64) -> Duration
where
    S: Service<Request<()>> + Clone + Send + 'static,
{
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let svc = svc.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let rt = runtime();
                barrier.wait();
                rt.block_on(run(svc, iters))
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .max()
        .unwrap()
}

/// A breaker opened by one failure, for an hour.
pub fn open_breaker() -> Breaker {
    open_breaker_with(BreakerConfig::new())
}

/// [`open_breaker`] on the coarse clock.
pub fn open_breaker_coarse() -> Breaker {
    open_breaker_with(BreakerConfig::new().coarse_clock(true))
}

fn open_breaker_with(config: BreakerConfig) -> Breaker {
    let b = Breaker::with_config(
        "bench-open",
        config
            .count_window(1)
            .minimum_calls(1)
            .open_period(Duration::from_secs(3600))
            .max_open_period(Duration::from_secs(3600))
            .rejection_event_interval(Duration::from_secs(3600)),
    );
    b.try_acquire().unwrap().record(Outcome::Failure);
    b
}

/// The default breaker: a count window.
pub fn closed() -> Breaker {
    Breaker::new("bench")
}

/// The default breaker sharing its decision and evidence through an
/// in-process [`MemoryStore`](tower_breaker::store::MemoryStore): the
/// closed path of a fleet's breaker (`poll_ready` checks for an election
/// and for a stale decision).
pub fn closed_with_store() -> Breaker {
    Breaker::with_config(
        "bench-store",
        BreakerConfig::new().store(std::sync::Arc::new(tower_breaker::store::MemoryStore::new())),
    )
}

/// A time window (10 buckets of 1 s) that also counts slow calls (over
/// 1 s): every call reads the clock when it starts and when it ends.
pub fn closed_timed() -> Breaker {
    closed_timed_with(BreakerConfig::new())
}

/// [`closed_timed`] on the coarse clock: an atomic load per reading.
pub fn closed_timed_coarse() -> Breaker {
    closed_timed_with(BreakerConfig::new().coarse_clock(true))
}

fn closed_timed_with(config: BreakerConfig) -> Breaker {
    Breaker::with_config(
        "bench-timed",
        config
            .time_window(10, Duration::from_secs(1))
            .slow_calls(Duration::from_secs(1), 0.5),
    )
}

/// One throttle for every round, whose dependency accepts every call: a
/// throttle admits its calls without computing the rule once its window
/// has a past (two buckets, 4 s with the default window), which a throttle
/// built per round of milliseconds never reaches.
pub fn admitting_throttle() -> ThrottleHandle {
    static THROTTLE: std::sync::OnceLock<ThrottleHandle> = std::sync::OnceLock::new();
    THROTTLE
        .get_or_init(|| ThrottleHandle::new("bench-admits"))
        .clone()
}

/// A throttle whose dependency has refused 10,000 calls: it sheds most
/// calls (the rule's share; the calls it lets through are accepted by the
/// bare service, so the share settles near 80% with the default K of 2).
pub fn shedding_throttle() -> ThrottleHandle {
    let throttle = ThrottleHandle::new("bench-sheds");
    for _ in 0..10_000 {
        if let Ok(permit) = throttle.try_acquire(Criticality::Critical) {
            permit.record(Outcome::Failure);
        }
    }
    assert!(throttle.snapshot().throttling, "the throttle sheds");
    throttle
}

/// Calls `$f!(name, service)` with every variant.
macro_rules! variants {
    ($f:ident) => {{
        use tower::Layer;
        use tower_breaker::{BreakerLayer, HttpBreakerLayer, PlainBreakerLayer};
        $f!("bare", bare());
        $f!(
            "concurrency_limit",
            tower::limit::ConcurrencyLimit::new(bare(), 1_000_000)
        );
        $f!(
            "breaker_closed",
            BreakerLayer::new(closed())
                .count_attempts(false)
                .layer(bare())
        );
        $f!(
            "breaker_closed_plain",
            PlainBreakerLayer::new(closed()).layer(bare())
        );
        $f!(
            "breaker_closed_plain_memory_store",
            PlainBreakerLayer::new(closed_with_store()).layer(bare())
        );
        $f!(
            "breaker_closed_plain_time_window_slow_calls",
            PlainBreakerLayer::new(closed_timed()).layer(bare())
        );
        $f!(
            "breaker_closed_plain_time_window_slow_calls_coarse_clock",
            PlainBreakerLayer::new(closed_timed_coarse()).layer(bare())
        );
        $f!(
            "breaker_closed_with_hook",
            BreakerLayer::new(closed()).layer(bare())
        );
        $f!(
            "breaker_open_rejects",
            BreakerLayer::new(open_breaker()).layer(bare())
        );
        $f!(
            "breaker_open_rejects_plain",
            PlainBreakerLayer::new(open_breaker()).layer(bare())
        );
        $f!(
            "breaker_open_rejects_plain_coarse_clock",
            PlainBreakerLayer::new(open_breaker_coarse()).layer(bare())
        );
        $f!(
            "breaker_open_rejects_typed",
            PlainBreakerLayer::new(open_breaker()).typed().layer(bare())
        );
        $f!(
            "breaker_closed_typed",
            PlainBreakerLayer::new(closed()).typed().layer(bare())
        );
        $f!("peer_recloser_closed", peers::recloser_closed());
        $f!("peer_recloser_open_rejects", peers::recloser_open());
        $f!("peer_failsafe_closed", peers::failsafe_closed());
        $f!("peer_failsafe_open_rejects", peers::failsafe_open());
        $f!(
            "breaker_open_http_answer",
            HttpBreakerLayer::new(open_breaker()).layer(bare())
        );
        $f!(
            "throttle_admits",
            tower_breaker::throttle::Throttle::new(bare(), admitting_throttle())
        );
        $f!(
            "throttle_sheds",
            tower_breaker::throttle::Throttle::new(bare(), shedding_throttle())
        );
    }};
}
