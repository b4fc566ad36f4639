//! Per-call overhead of the breaker over a bare `service_fn`, against
//! `tower::limit::ConcurrencyLimit`: the closed path (with and without the
//! attempt hook), the open path's rejection, and allocations per call, with
//! one thread and with two threads hammering clones of one stack.
//!
//! Run with `cargo bench -p tower-breaker --bench overhead`.
//!
//! The binary counts allocations with `stats_alloc`, whose counters are
//! shared atomics: with two threads, the variants that allocate (the attempt
//! hook, the boxed rejection, the HTTP answer) also pay for that counting
//! allocator's contention, not only their own.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::alloc::System;
use std::convert::Infallible;
use std::future::{ready, Ready};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tokio::time::Instant;
use tower::limit::ConcurrencyLimit;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_breaker::{
    Breaker, BreakerConfig, BreakerLayer, HttpBreakerLayer, Outcome, PlainBreakerLayer,
};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

type Bare = tower::util::ServiceFn<fn(Request<()>) -> Ready<Result<Response<()>, Infallible>>>;

fn bare() -> Bare {
    service_fn(|_req: Request<()>| ready(Ok::<_, Infallible>(Response::new(()))))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// `iters` calls of `svc`, timed.
async fn run<S>(mut svc: S, iters: u64) -> Duration
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
fn run_two<S>(svc: &S, iters: u64) -> Duration
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

fn allocations<S>(rt: &tokio::runtime::Runtime, svc: S) -> f64
where
    S: Service<Request<()>>,
{
    const CALLS: u64 = 10_000;
    rt.block_on(async {
        let region = Region::new(GLOBAL);
        run(svc, CALLS).await;
        region.change().allocations as f64 / CALLS as f64
    })
}

fn open_breaker() -> Breaker {
    let b = Breaker::with_config(
        "bench-open",
        BreakerConfig::new()
            .count_window(1)
            .minimum_calls(1)
            .open_period(Duration::from_secs(3600))
            .max_open_period(Duration::from_secs(3600))
            .rejection_event_interval(Duration::from_secs(3600)),
    );
    b.try_acquire().unwrap().record(Outcome::Failure);
    b
}

fn closed() -> Breaker {
    Breaker::new("bench")
}

macro_rules! variants {
    ($f:ident) => {{
        $f!("bare", bare());
        $f!(
            "concurrency_limit",
            ConcurrencyLimit::new(bare(), 1_000_000)
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
            "breaker_closed_with_hook",
            BreakerLayer::new(closed()).layer(bare())
        );
        $f!(
            "breaker_open_rejects",
            BreakerLayer::new(open_breaker()).layer(bare())
        );
        $f!(
            "breaker_open_http_answer",
            HttpBreakerLayer::new(open_breaker()).layer(bare())
        );
    }};
}

fn one_thread(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("one_thread");
    macro_rules! bench {
        ($name:expr, $svc:expr) => {{
            let svc = rt.block_on(async { $svc });
            group.bench_function($name, |b| {
                b.iter_custom(|iters| rt.block_on(run(svc.clone(), iters)))
            });
        }};
    }
    variants!(bench);
    group.finish();
}

fn two_threads(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("two_threads");
    macro_rules! bench {
        ($name:expr, $svc:expr) => {{
            let svc = rt.block_on(async { $svc });
            group.bench_function($name, |b| b.iter_custom(|iters| run_two(&svc, iters)));
        }};
    }
    variants!(bench);
    group.finish();
}

fn allocations_per_call(_c: &mut Criterion) {
    let rt = runtime();
    println!("\nallocations per call:");
    macro_rules! count {
        ($name:expr, $svc:expr) => {{
            let svc = rt.block_on(async { $svc });
            println!("  {:<28} {:.2}", $name, allocations(&rt, svc));
        }};
    }
    variants!(count);
}

criterion_group!(benches, allocations_per_call, one_thread, two_threads);
criterion_main!(benches);
