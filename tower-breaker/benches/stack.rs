//! The whole client stack, outermost first: per-call deadline, breaker,
//! retry with budget, bulkhead, per-attempt deadline; against a bare
//! `service_fn` and against two of tower's layers (`Timeout` and
//! `ConcurrencyLimit`), on the happy path, plus allocations per call.
//!
//! Run with `cargo bench -p tower-breaker --bench stack`.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::alloc::System;
use std::convert::Infallible;
use std::future::{ready, Ready};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tokio::time::Instant;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_breaker::{Breaker, BreakerLayer};
use tower_bulkhead::BulkheadLayer;
use tower_deadline::ClientDeadlineLayer;
use tower_retry_budget::RetryLayer;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

type Bare = tower::util::ServiceFn<fn(Request<()>) -> Ready<Result<Response<()>, Infallible>>>;

fn bare() -> Bare {
    service_fn(|_req: Request<()>| ready(Ok::<_, Infallible>(Response::new(()))))
}

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

fn tower_two<S>(inner: S) -> impl Service<Request<()>, Response = Response<()>> + Clone
where
    S: Service<Request<()>, Response = Response<()>> + Clone,
    S::Error: Into<tower::BoxError>,
{
    ServiceBuilder::new()
        .timeout(Duration::from_secs(60))
        .concurrency_limit(1024)
        .service(inner)
}

/// The four layers without deadlines: breaker, retry, bulkhead.
fn ours_three(inner: Bare) -> impl Service<Request<()>, Response = Response<()>> + Clone {
    ServiceBuilder::new()
        .layer(BreakerLayer::new(Breaker::new("bench")))
        .layer(RetryLayer::new().clone_bodies())
        .layer(BulkheadLayer::new("bench", 1024))
        .service(inner)
}

/// The full stack of the README, with a 60 s budget for every call.
fn ours_full(inner: Bare) -> impl Service<Request<()>, Response = Response<()>> + Clone {
    ServiceBuilder::new()
        .layer(ClientDeadlineLayer::new().default_timeout(Duration::from_secs(60)))
        .layer(BreakerLayer::new(Breaker::new("bench")))
        .layer(RetryLayer::new().clone_bodies())
        .layer(BulkheadLayer::new("bench", 1024))
        .layer(ClientDeadlineLayer::new())
        .service(inner)
}

/// The stack built up one layer at a time, from the transport side, to
/// attribute the cost: bulkhead, then retry, then breaker, then the outer
/// deadline (the per-attempt deadline is the difference to the full stack).
fn step_bulkhead(inner: Bare) -> impl Service<Request<()>, Response = Response<()>> + Clone {
    ServiceBuilder::new()
        .layer(BulkheadLayer::new("bench", 1024))
        .service(inner)
}

fn step_retry(inner: Bare) -> impl Service<Request<()>, Response = Response<()>> + Clone {
    ServiceBuilder::new()
        .layer(RetryLayer::new().clone_bodies())
        .layer(BulkheadLayer::new("bench", 1024))
        .service(inner)
}

fn step_deadline(inner: Bare) -> impl Service<Request<()>, Response = Response<()>> + Clone {
    ServiceBuilder::new()
        .layer(ClientDeadlineLayer::new().default_timeout(Duration::from_secs(60)))
        .layer(BreakerLayer::new(Breaker::new("bench")))
        .layer(RetryLayer::new().clone_bodies())
        .layer(BulkheadLayer::new("bench", 1024))
        .service(inner)
}

fn allocations_per_call<S>(rt: &tokio::runtime::Runtime, svc: S) -> f64
where
    S: Service<Request<()>>,
{
    const N: u64 = 10_000;
    let region = Region::new(GLOBAL);
    rt.block_on(run(svc, N));
    region.change().allocations as f64 / N as f64
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("stack");
    group.bench_function("bare service_fn", |b| {
        b.iter_custom(|iters| rt.block_on(run(bare(), iters)))
    });
    group.bench_function("tower Timeout + ConcurrencyLimit", |b| {
        b.iter_custom(|iters| rt.block_on(run(tower_two(bare()), iters)))
    });
    group.bench_function("bulkhead", |b| {
        b.iter_custom(|iters| rt.block_on(run(step_bulkhead(bare()), iters)))
    });
    group.bench_function("retry + bulkhead", |b| {
        b.iter_custom(|iters| rt.block_on(run(step_retry(bare()), iters)))
    });
    group.bench_function("breaker + retry + bulkhead", |b| {
        b.iter_custom(|iters| rt.block_on(run(ours_three(bare()), iters)))
    });
    group.bench_function("deadline + breaker + retry + bulkhead", |b| {
        b.iter_custom(|iters| rt.block_on(run(step_deadline(bare()), iters)))
    });
    group.bench_function("full stack with deadlines", |b| {
        b.iter_custom(|iters| rt.block_on(run(ours_full(bare()), iters)))
    });
    group.finish();

    println!("\nallocations per call:");
    for (name, n) in [
        ("bare service_fn", allocations_per_call(&rt, bare())),
        (
            "tower Timeout + ConcurrencyLimit",
            allocations_per_call(&rt, tower_two(bare())),
        ),
        ("bulkhead", allocations_per_call(&rt, step_bulkhead(bare()))),
        (
            "retry + bulkhead",
            allocations_per_call(&rt, step_retry(bare())),
        ),
        (
            "breaker + retry + bulkhead",
            allocations_per_call(&rt, ours_three(bare())),
        ),
        (
            "deadline + breaker + retry + bulkhead",
            allocations_per_call(&rt, step_deadline(bare())),
        ),
        (
            "full stack with deadlines",
            allocations_per_call(&rt, ours_full(bare())),
        ),
    ] {
        println!("  {name:<38} {n:.2}");
    }
}

criterion_group!(group, benches);
criterion_main!(group);
