//! Per-call overhead of the server and client layers over a bare
//! `service_fn`, against `tower::timeout::Timeout`, plus allocations per call.
//!
//! Run with `cargo bench -p tower-deadline`. Every variant builds the same
//! request (with a budget header), so the differences are the layers' cost.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::alloc::System;
use std::convert::Infallible;
use std::future::{ready, Ready};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tokio::time::Instant;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_deadline::{ClientDeadlineLayer, Deadline, ServerDeadlineLayer};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn bare() -> impl Service<
    Request<()>,
    Response = Response<()>,
    Error = Infallible,
    Future = Ready<Result<Response<()>, Infallible>>,
> + Clone {
    service_fn(|_req: Request<()>| ready(Ok::<_, Infallible>(Response::new(()))))
}

fn request() -> Request<()> {
    Request::builder()
        .header("x-request-timeout-ms", "300")
        .body(())
        .unwrap()
}

fn plain_request() -> Request<()> {
    Request::new(())
}

/// Runs `iters` calls of `svc` inside one runtime entry, returning the time.
fn run<S>(
    rt: &tokio::runtime::Runtime,
    mut svc: S,
    make: fn() -> Request<()>,
    scoped: bool,
    iters: u64,
) -> Duration
where
    S: Service<Request<()>>,
    S::Error: std::fmt::Debug,
{
    rt.block_on(async {
        let body = async {
            let start = Instant::now();
            for _ in 0..iters {
                svc.ready().await.unwrap();
                let out = svc.call(make()).await;
                std::hint::black_box(out.unwrap());
            }
            start.elapsed()
        };
        if scoped {
            Deadline::after(Duration::from_secs(3600)).scope(body).await
        } else {
            body.await
        }
    })
}

fn allocations_per_call<S>(
    rt: &tokio::runtime::Runtime,
    svc: S,
    make: fn() -> Request<()>,
    scoped: bool,
) -> f64
where
    S: Service<Request<()>>,
    S::Error: std::fmt::Debug,
{
    const N: u64 = 10_000;
    let region = Region::new(GLOBAL);
    run(rt, svc, make, scoped, N);
    region.change().allocations as f64 / N as f64
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();

    let server = ServerDeadlineLayer::new();
    let client = ClientDeadlineLayer::new();
    let timeout = tower::timeout::TimeoutLayer::new(Duration::from_secs(3600));

    let mut group = c.benchmark_group("deadline");
    group.bench_function("bare service_fn", |b| {
        b.iter_custom(|iters| run(&rt, bare(), request, false, iters))
    });
    group.bench_function("tower Timeout", |b| {
        b.iter_custom(|iters| run(&rt, timeout.layer(bare()), request, false, iters))
    });
    group.bench_function("server, budget header", |b| {
        b.iter_custom(|iters| run(&rt, server.layer(bare()), request, false, iters))
    });
    group.bench_function("server, no header", |b| {
        b.iter_custom(|iters| run(&rt, server.layer(bare()), plain_request, false, iters))
    });
    group.bench_function("bare service_fn, no header", |b| {
        b.iter_custom(|iters| run(&rt, bare(), plain_request, false, iters))
    });
    group.bench_function("client, deadline in scope", |b| {
        b.iter_custom(|iters| run(&rt, client.layer(bare()), plain_request, true, iters))
    });
    group.bench_function("client, no deadline", |b| {
        b.iter_custom(|iters| run(&rt, client.layer(bare()), plain_request, false, iters))
    });
    group.finish();

    let rows = [
        (
            "bare, header request",
            allocations_per_call(&rt, bare(), request, false),
        ),
        (
            "bare, plain request",
            allocations_per_call(&rt, bare(), plain_request, false),
        ),
        (
            "tower Timeout",
            allocations_per_call(&rt, timeout.layer(bare()), request, false),
        ),
        (
            "server, budget header",
            allocations_per_call(&rt, server.layer(bare()), request, false),
        ),
        (
            "server, no header",
            allocations_per_call(&rt, server.layer(bare()), plain_request, false),
        ),
        (
            "client, deadline in scope",
            allocations_per_call(&rt, client.layer(bare()), plain_request, true),
        ),
        (
            "client, no deadline",
            allocations_per_call(&rt, client.layer(bare()), plain_request, false),
        ),
    ];
    println!("\nallocations per call (including building the request):");
    for (name, n) in rows {
        println!("  {name:<28} {n:.2}");
    }
}

criterion_group!(group, benches);
criterion_main!(group);
