//! Per-call cost of the keyed breaker (`KeyedBreakerLayer` over a
//! `BreakerRegistry`), against one unkeyed breaker: the known-key path, and
//! a stream of unique keys against a full registry of 1,024 keys, once with
//! nothing evictable (every entry closed and recently used: each new key
//! gets the overflow breaker) and once with every entry idle (each new key
//! evicts one and gets its own breaker). One thread, and two threads
//! hammering clones of one service (the same hot key, or disjoint streams
//! of unique keys). Allocations per call are printed first.
//!
//! Run with
//! `cargo bench -p tower-breaker --bench keyed -- --warm-up-time 1 --measurement-time 3`.
//!
//! Keys are `u64`s carried in the request body, so the key function itself
//! costs nothing and allocates nothing: what is measured is the registry.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::alloc::System;
use std::convert::Infallible;
use std::future::{ready, Ready};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tokio::time::Instant;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_breaker::{Breaker, BreakerConfig, BreakerLayer, BreakerRegistry, KeyedBreakerLayer};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The most keys of every registry here.
const MAX_KEYS: u64 = 1024;
/// A key the full registries hold.
const KNOWN: u64 = 7;

type Bare = tower::util::ServiceFn<fn(Request<u64>) -> Ready<Result<Response<()>, Infallible>>>;

fn bare() -> Bare {
    service_fn(|_req: Request<u64>| ready(Ok::<_, Infallible>(Response::new(()))))
}

fn key_of(req: &Request<u64>) -> u64 {
    *req.body()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// A registry holding keys `0..MAX_KEYS`, all closed and just used, whose
/// entries may be evicted once `idle` has passed since.
fn full(idle: Duration) -> BreakerRegistry<u64> {
    let registry = BreakerRegistry::new("bench", BreakerConfig::new())
        .max_keys(MAX_KEYS as usize)
        .idle_timeout(idle);
    for key in 0..MAX_KEYS {
        registry.get(&key);
    }
    assert_eq!(registry.len(), MAX_KEYS as usize);
    registry
}

/// Which key each call carries.
#[derive(Debug, Clone, Copy)]
enum Keys {
    /// Always [`KNOWN`].
    Known,
    /// A key never seen before, on every call.
    Unique,
}

/// The first of `n` fresh keys, never handed out before (above the keys
/// the registries are filled with).
fn fresh_keys(n: u64) -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1 << 32);
    NEXT.fetch_add(n, Ordering::Relaxed)
}

/// `iters` calls of `svc`, timed.
async fn run<S>(mut svc: S, keys: Keys, iters: u64) -> Duration
where
    S: Service<Request<u64>>,
{
    let first = fresh_keys(iters);
    let start = Instant::now();
    for i in 0..iters {
        let key = match keys {
            Keys::Known => KNOWN,
            Keys::Unique => first + i,
        };
        let _ = svc.ready().await;
        let out = svc.call(Request::new(key)).await;
        std::hint::black_box(out.is_ok());
    }
    start.elapsed()
}

/// `iters` calls on each of two OS threads at once (each with its own
/// current-thread runtime and a clone of the service); returns the wall
/// time, i.e. the time per call as each thread sees it.
fn run_two<S>(svc: &S, keys: Keys, iters: u64) -> Duration
where
    S: Service<Request<u64>> + Clone + Send + 'static,
{
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let svc = svc.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let rt = runtime();
                barrier.wait();
                rt.block_on(run(svc, keys, iters))
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .max()
        .unwrap()
}

fn allocations<S>(rt: &tokio::runtime::Runtime, svc: S, keys: Keys) -> f64
where
    S: Service<Request<u64>>,
{
    const CALLS: u64 = 10_000;
    rt.block_on(async {
        let region = Region::new(GLOBAL);
        run(svc, keys, CALLS).await;
        region.change().allocations as f64 / CALLS as f64
    })
}

/// Every variant: its name, the service and the keys it is called with.
macro_rules! variants {
    ($f:ident) => {{
        $f!(
            "unkeyed_breaker",
            BreakerLayer::new(Breaker::new("bench")).layer(bare()),
            Keys::Known
        );
        $f!(
            "known_key",
            KeyedBreakerLayer::new(full(Duration::from_secs(600)), key_of).layer(bare()),
            Keys::Known
        );
        $f!(
            "unique_keys_full_nothing_evictable",
            KeyedBreakerLayer::new(full(Duration::from_secs(600)), key_of).layer(bare()),
            Keys::Unique
        );
        $f!(
            "unique_keys_full_all_idle",
            KeyedBreakerLayer::new(full(Duration::ZERO), key_of).layer(bare()),
            Keys::Unique
        );
    }};
}

fn one_thread(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("one_thread");
    macro_rules! bench {
        ($name:expr, $svc:expr, $keys:expr) => {{
            let svc = rt.block_on(async { $svc });
            group.bench_function($name, |b| {
                b.iter_custom(|iters| rt.block_on(run(svc.clone(), $keys, iters)))
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
        ($name:expr, $svc:expr, $keys:expr) => {{
            let svc = rt.block_on(async { $svc });
            group.bench_function($name, |b| {
                b.iter_custom(|iters| run_two(&svc, $keys, iters))
            });
        }};
    }
    variants!(bench);
    group.finish();
}

fn allocations_per_call(_c: &mut Criterion) {
    let rt = runtime();
    println!("\nallocations per call:");
    macro_rules! count {
        ($name:expr, $svc:expr, $keys:expr) => {{
            let svc = rt.block_on(async { $svc });
            println!("  {:<36} {:.2}", $name, allocations(&rt, svc, $keys));
        }};
    }
    variants!(count);
}

criterion_group!(benches, allocations_per_call, one_thread, two_threads);
criterion_main!(benches);
