//! Per-call overhead of the bulkhead (fixed and adaptive) over a bare
//! `service_fn`, against tower's `ConcurrencyLimit` (alone and under
//! `LoadShed`), the rejection path (also from two threads at once, with a
//! compartment named in the source and one named at run time), and
//! allocations per call.
//!
//! Run with `cargo bench -p tower-bulkhead`. Every loop runs inside one
//! `block_on` of a current-thread runtime, so the figures are the layers'
//! cost, not the runtime's.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::alloc::System;
use std::convert::Infallible;
use std::future::{ready, Ready};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tokio::time::Instant;
use tower::limit::ConcurrencyLimitLayer;
use tower::load_shed::LoadShedLayer;
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};
use tower_bulkhead::adaptive::{Aimd, Gradient};
use tower_bulkhead::{BulkheadLayer, HttpBulkheadLayer};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const ROOMY: usize = 1 << 20;

fn bare() -> impl Service<
    Request<()>,
    Response = Response<()>,
    Error = Infallible,
    Future = Ready<Result<Response<()>, Infallible>>,
> + Clone {
    service_fn(|_req: Request<()>| ready(Ok::<_, Infallible>(Response::new(()))))
}

/// Runs `iters` calls of `svc` inside one runtime entry, returning the time.
/// Errors (rejections) are kept, not unwrapped.
fn run<S>(rt: &tokio::runtime::Runtime, mut svc: S, iters: u64) -> Duration
where
    S: Service<Request<()>>,
{
    rt.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            if svc.ready().await.is_err() {
                panic!("inner service failed");
            }
            let out = svc.call(Request::new(())).await;
            drop(std::hint::black_box(out));
        }
        start.elapsed()
    })
}

/// `iters` calls split between two threads, each with its own
/// current-thread runtime and clone of `svc`, started together; the time
/// until both are done (so the figure per call is the aggregate).
fn run_two_threads<S>(svc: S, iters: u64) -> Duration
where
    S: Service<Request<()>> + Clone + Send + 'static,
{
    let start = std::sync::Arc::new(std::sync::Barrier::new(3));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let svc = svc.clone();
            let start = std::sync::Arc::clone(&start);
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                start.wait();
                run(&rt, svc, iters / 2)
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    for thread in threads {
        thread.join().unwrap();
    }
    began.elapsed()
}

fn allocations_per_call<S>(rt: &tokio::runtime::Runtime, svc: S) -> f64
where
    S: Service<Request<()>>,
{
    const N: u64 = 10_000;
    let region = Region::new(GLOBAL);
    run(rt, svc, N);
    region.change().allocations as f64 / N as f64
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();

    // Built once: the compartments live in the layers, as in a server.
    let client = BulkheadLayer::new("bench", ROOMY);
    let http = HttpBulkheadLayer::new("bench", ROOMY);
    let keyed = BulkheadLayer::new("bench", ROOMY).per_key(|_req: &Request<()>| "static-key");
    // Adaptive, with bounds so high that the happy path never refuses.
    let aimd = BulkheadLayer::adaptive("bench", Aimd::new().initial(ROOMY).bounds(ROOMY, ROOMY));
    let gradient =
        BulkheadLayer::adaptive("bench", Gradient::new().initial(ROOMY).bounds(ROOMY, ROOMY));
    let client_full = BulkheadLayer::new("full", 0);
    let http_full = HttpBulkheadLayer::new("full", 0);
    let concurrency = ConcurrencyLimitLayer::new(ROOMY);
    let shed = || {
        ServiceBuilder::new()
            .layer(LoadShedLayer::new())
            .layer(ConcurrencyLimitLayer::new(ROOMY))
    };
    let shed_full = || {
        ServiceBuilder::new()
            .layer(LoadShedLayer::new())
            .layer(ConcurrencyLimitLayer::new(0))
    };

    let mut group = c.benchmark_group("bulkhead");
    group.bench_function("bare service_fn", |b| {
        b.iter_custom(|iters| run(&rt, bare(), iters))
    });
    group.bench_function("tower ConcurrencyLimit", |b| {
        b.iter_custom(|iters| run(&rt, concurrency.layer(bare()), iters))
    });
    group.bench_function("tower LoadShed+ConcurrencyLimit", |b| {
        b.iter_custom(|iters| run(&rt, shed().service(bare()), iters))
    });
    group.bench_function("Bulkhead (client)", |b| {
        b.iter_custom(|iters| run(&rt, client.layer(bare()), iters))
    });
    group.bench_function("Bulkhead adaptive Aimd", |b| {
        b.iter_custom(|iters| run(&rt, aimd.layer(bare()), iters))
    });
    group.bench_function("Bulkhead adaptive Gradient", |b| {
        b.iter_custom(|iters| run(&rt, gradient.layer(bare()), iters))
    });
    group.bench_function("HttpBulkhead", |b| {
        b.iter_custom(|iters| run(&rt, http.layer(bare()), iters))
    });
    group.bench_function("Bulkhead per_key", |b| {
        b.iter_custom(|iters| run(&rt, keyed.layer(bare()), iters))
    });
    group.bench_function("reject: Bulkhead (client)", |b| {
        b.iter_custom(|iters| run(&rt, client_full.layer(bare()), iters))
    });
    group.bench_function("reject: HttpBulkhead 503", |b| {
        b.iter_custom(|iters| run(&rt, http_full.layer(bare()), iters))
    });
    group.bench_function("reject: tower LoadShed+ConcurrencyLimit(0)", |b| {
        b.iter_custom(|iters| run(&rt, shed_full().service(bare()), iters))
    });
    group.finish();

    // Two threads rejecting from one compartment: a name written in the
    // source is copied into each `BulkheadFull` without a reference count;
    // one built at run time is a shared string, whose one count both
    // threads' rejections clone and drop.
    let mut group = c.benchmark_group("bulkhead, two threads");
    let shared_full = BulkheadLayer::new(String::from("full"), 0);
    group.bench_function(
        "reject: Bulkhead (client), name written in the source",
        |b| b.iter_custom(|iters| run_two_threads(client_full.layer(bare()), iters)),
    );
    group.bench_function("reject: Bulkhead (client), name built at run time", |b| {
        b.iter_custom(|iters| run_two_threads(shared_full.layer(bare()), iters))
    });
    group.bench_function("reject: tower LoadShed+ConcurrencyLimit(0)", |b| {
        b.iter_custom(|iters| run_two_threads(shed_full().service(bare()), iters))
    });
    group.finish();

    let rows = [
        ("bare service_fn", allocations_per_call(&rt, bare())),
        (
            "tower ConcurrencyLimit",
            allocations_per_call(&rt, concurrency.layer(bare())),
        ),
        (
            "tower LoadShed+ConcurrencyLimit",
            allocations_per_call(&rt, shed().service(bare())),
        ),
        (
            "Bulkhead (client)",
            allocations_per_call(&rt, client.layer(bare())),
        ),
        (
            "Bulkhead adaptive Aimd",
            allocations_per_call(&rt, aimd.layer(bare())),
        ),
        (
            "Bulkhead adaptive Gradient",
            allocations_per_call(&rt, gradient.layer(bare())),
        ),
        (
            "HttpBulkhead",
            allocations_per_call(&rt, http.layer(bare())),
        ),
        (
            "Bulkhead per_key",
            allocations_per_call(&rt, keyed.layer(bare())),
        ),
        (
            "reject: Bulkhead (client)",
            allocations_per_call(&rt, client_full.layer(bare())),
        ),
        (
            "reject: HttpBulkhead 503",
            allocations_per_call(&rt, http_full.layer(bare())),
        ),
        (
            "reject: LoadShed+ConcurrencyLimit(0)",
            allocations_per_call(&rt, shed_full().service(bare())),
        ),
    ];
    println!("\nallocations per call:");
    for (name, n) in rows {
        println!("  {name:<38} {n:.2}");
    }
}

criterion_group!(group, benches);
criterion_main!(group);
