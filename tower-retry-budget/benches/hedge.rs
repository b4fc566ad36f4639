//! Per-call overhead of the hedging layer on its happy path (the inner
//! service answers at once: no hedge needed), over a bare `service_fn` and
//! against `tower::hedge::Hedge` in the same run, plus allocations per
//! call. Both hedging layers learn the 95th percentile of the latencies
//! they see (here: every call answers at once).
//!
//! Run with `cargo bench -p tower-retry-budget --bench hedge`. Every
//! variant sends the same request (`GET` with an empty body). Each
//! measurement runs its whole loop inside one `block_on` of a
//! current-thread runtime.

#![allow(missing_docs)] // criterion_group! generates an undocumented function

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::hint::black_box;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use http_body_util::Empty;
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_retry_budget::hedge::HedgeLayer;

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

type Body = Empty<Bytes>;

fn ok<B>(_req: Request<B>) -> Ready<Result<Response<()>, Infallible>> {
    ready(Ok(Response::new(())))
}

/// A `GET` of `/` (the default request: building it allocates nothing).
fn request() -> Request<Body> {
    Request::new(Empty::new())
}

/// tower's hedge policy: every request may be hedged, cloned by parts.
#[derive(Debug, Clone)]
struct TowerPolicy;

impl tower::hedge::Policy<Request<Body>> for TowerPolicy {
    fn clone_request(&self, req: &Request<Body>) -> Option<Request<Body>> {
        let mut copy = Request::new(Empty::new());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.headers_mut() = req.headers().clone();
        Some(copy)
    }

    fn can_retry(&self, _req: &Request<Body>) -> bool {
        true
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// Runs `iters` calls through `svc` inside one `block_on`.
fn run<S>(rt: &tokio::runtime::Runtime, svc: &mut S, iters: u64) -> Duration
where
    S: Service<Request<Body>>,
    S::Error: std::fmt::Debug,
{
    rt.block_on(async {
        let start = tokio::time::Instant::now();
        for _ in 0..iters {
            let response = svc.ready().await.unwrap().call(request()).await.unwrap();
            black_box(response);
        }
        start.elapsed()
    })
}

/// Allocations per call, after a warm-up.
fn allocations<S>(rt: &tokio::runtime::Runtime, svc: &mut S) -> f64
where
    S: Service<Request<Body>>,
    S::Error: std::fmt::Debug,
{
    const CALLS: u64 = 10_000;
    run(rt, svc, 1_000);
    let region = Region::new(GLOBAL);
    run(rt, svc, CALLS);
    region.change().allocations as f64 / CALLS as f64
}

fn happy_path(c: &mut Criterion) {
    let rt = runtime();
    let mut bare = service_fn(ok::<Body>);
    let learned = rt.block_on(async { HedgeLayer::new() });
    let mut ours = learned.layer(service_fn(ok));
    let mut ours_clone = rt.block_on(async {
        HedgeLayer::new()
            .clone_bodies()
            .layer(service_fn(ok::<Body>))
    });
    let mut ours_fixed = rt.block_on(async {
        HedgeLayer::new()
            .fixed_delay(Duration::from_millis(10))
            .layer(service_fn(ok))
    });
    let mut tower_hedge = rt.block_on(async {
        tower::hedge::Hedge::new(
            service_fn(ok::<Body>),
            TowerPolicy,
            100,
            0.95,
            Duration::from_secs(10),
        )
    });

    let mut group = c.benchmark_group("hedge_no_hedge_needed");
    group.bench_function("bare service_fn", |b| {
        b.iter_custom(|n| run(&rt, &mut bare, n))
    });
    group.bench_function("tower-retry-budget Hedge (learned p95, buffered)", |b| {
        b.iter_custom(|n| run(&rt, &mut ours, n))
    });
    group.bench_function(
        "tower-retry-budget Hedge (learned p95, clone_bodies)",
        |b| b.iter_custom(|n| run(&rt, &mut ours_clone, n)),
    );
    group.bench_function("tower-retry-budget Hedge (fixed delay)", |b| {
        b.iter_custom(|n| run(&rt, &mut ours_fixed, n))
    });
    group.bench_function("tower::hedge::Hedge (p95)", |b| {
        b.iter_custom(|n| run(&rt, &mut tower_hedge, n))
    });
    group.finish();

    println!("allocations per call:");
    println!(
        "  bare service_fn:                                    {:.2}",
        allocations(&rt, &mut bare)
    );
    println!(
        "  tower-retry-budget Hedge (learned p95, buffered):   {:.2}",
        allocations(&rt, &mut ours)
    );
    println!(
        "  tower-retry-budget Hedge (learned p95, clone_bodies): {:.2}",
        allocations(&rt, &mut ours_clone)
    );
    println!(
        "  tower-retry-budget Hedge (fixed delay):             {:.2}",
        allocations(&rt, &mut ours_fixed)
    );
    println!(
        "  tower::hedge::Hedge (p95):                          {:.2}",
        allocations(&rt, &mut tower_hedge)
    );
    println!("counters of the learned variant: {:?}", learned.counters());
}

criterion_group!(benches, happy_path);
criterion_main!(benches);
