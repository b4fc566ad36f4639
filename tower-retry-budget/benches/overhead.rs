//! Per-call overhead of `Retry` on a request that succeeds first time, over
//! a bare `service_fn` and against `tower::retry::Retry` with `TpsBudget`,
//! plus allocations per call.
//!
//! Run with `cargo bench -p tower-retry-budget`. Every variant builds the
//! same request (`GET` with an empty body), so the differences are the
//! layers' cost. Each measurement runs its whole loop inside one
//! `block_on` of a current-thread runtime.

#![allow(missing_docs)] // criterion_group! generates an undocumented function

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use http_body_util::Empty;
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tower::retry::budget::{Budget, TpsBudget};
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_retry_budget::RetryLayer;

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

type Body = Empty<Bytes>;

fn ok<B>(_req: Request<B>) -> Ready<Result<Response<()>, Infallible>> {
    ready(Ok(Response::new(())))
}

fn request() -> Request<Body> {
    Request::new(Empty::new())
}

/// tower's retry policy with a `TpsBudget`, as in tower's docs.
#[derive(Clone)]
struct TowerPolicy {
    budget: Arc<TpsBudget>,
}

impl<E> tower::retry::Policy<Request<Body>, Response<()>, E> for TowerPolicy {
    type Future = Ready<()>;

    fn retry(
        &mut self,
        _req: &mut Request<Body>,
        result: &mut Result<Response<()>, E>,
    ) -> Option<Self::Future> {
        match result {
            Ok(r) if !r.status().is_server_error() => {
                self.budget.deposit();
                None
            }
            _ => self.budget.withdraw().then(|| ready(())),
        }
    }

    fn clone_request(&mut self, req: &Request<Body>) -> Option<Request<Body>> {
        Some(req.clone())
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// Runs `iters` calls through `svc` inside one `block_on`.
fn run<S>(rt: &tokio::runtime::Runtime, svc: &S, iters: u64) -> Duration
where
    S: Service<Request<Body>> + Clone,
    S::Error: std::fmt::Debug,
{
    rt.block_on(async {
        let mut svc = svc.clone();
        let start = tokio::time::Instant::now();
        for _ in 0..iters {
            let response = svc.ready().await.unwrap().call(request()).await.unwrap();
            black_box(response);
        }
        start.elapsed()
    })
}

/// Allocations per call, after a warm-up.
fn allocations<S>(rt: &tokio::runtime::Runtime, svc: &S) -> f64
where
    S: Service<Request<Body>> + Clone,
    S::Error: std::fmt::Debug,
{
    const CALLS: u64 = 10_000;
    run(rt, svc, 1_000);
    let region = Region::new(GLOBAL);
    run(rt, svc, CALLS);
    region.change().allocations as f64 / CALLS as f64
}

fn overhead(c: &mut Criterion) {
    let rt = runtime();
    let bare = service_fn(ok::<Body>);
    let ours = rt.block_on(async { RetryLayer::new().layer(service_fn(ok)) });
    let ours_clone = rt.block_on(async {
        RetryLayer::new()
            .clone_bodies()
            .layer(service_fn(ok::<Body>))
    });
    let tower_retry = tower::retry::RetryLayer::new(TowerPolicy {
        budget: Arc::new(TpsBudget::new(Duration::from_secs(10), 10, 0.2)),
    })
    .layer(service_fn(ok::<Body>));

    let mut group = c.benchmark_group("success_first_time");
    group.bench_function("bare service_fn", |b| b.iter_custom(|n| run(&rt, &bare, n)));
    group.bench_function("tower-retry-budget Retry (buffered body)", |b| {
        b.iter_custom(|n| run(&rt, &ours, n))
    });
    group.bench_function("tower-retry-budget Retry (clone_bodies)", |b| {
        b.iter_custom(|n| run(&rt, &ours_clone, n))
    });
    group.bench_function("tower::retry::Retry + TpsBudget", |b| {
        b.iter_custom(|n| run(&rt, &tower_retry, n))
    });
    group.finish();

    println!("allocations per call:");
    println!(
        "  bare service_fn:                           {:.2}",
        allocations(&rt, &bare)
    );
    println!(
        "  tower-retry-budget Retry (buffered body):  {:.2}",
        allocations(&rt, &ours)
    );
    println!(
        "  tower-retry-budget Retry (clone_bodies):   {:.2}",
        allocations(&rt, &ours_clone)
    );
    println!(
        "  tower::retry::Retry + TpsBudget:           {:.2}",
        allocations(&rt, &tower_retry)
    );
    println!("counters of the buffered variant: {:?}", ours.counters());
}

criterion_group!(benches, overhead);
criterion_main!(benches);
