//! Per-call cost of the fallback layer over a bare `service_fn`, against
//! tower's `MapErr` (the cheapest `util` layer that touches every result):
//! the pass-through with each kind of fallback, the shadow mode's sampling,
//! the fallback path itself (a failure answered with a value) and the
//! exercise mode, with allocations per call, on one thread and on two
//! threads sharing one stack.
//!
//! Run with `cargo bench -p tower-degrade --bench fallback`.
//!
//! Allocations are counted with `stats_alloc`, whose counters are shared
//! atomics: on two threads, the variants that allocate also pay for that
//! allocator's contention.

#![allow(missing_docs)] // criterion_group! generates undocumented items

#[path = "../../tower-breaker/benches/support/overhead.rs"]
#[allow(unused_macros)] // the overhead variants are not this bench's
mod overhead;

use std::alloc::System;
use std::convert::Infallible;
use std::future::ready;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response, StatusCode};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};
use tower_degrade::{Fallback, FallbackLayer};
use tower_resilience_base::random::SeededRandom;

use overhead::{bare, run, run_two, runtime, Bare};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

type Req = Request<()>;
type Res = Response<()>;

/// A dependency that answers 503 at once.
fn failing() -> Bare {
    service_fn(|_req: Req| {
        let mut response = Response::new(());
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        ready(Ok::<_, Infallible>(response))
    })
}

fn to_box(e: Infallible) -> BoxError {
    match e {}
}

fn value() -> FallbackLayer<Req, Res> {
    FallbackLayer::new(Fallback::value(Response::new(())))
}

fn allocations<S>(rt: &tokio::runtime::Runtime, svc: S) -> f64
where
    S: Service<Req>,
{
    const CALLS: u64 = 10_000;
    rt.block_on(async {
        let region = Region::new(GLOBAL);
        run(svc, CALLS).await;
        region.change().allocations as f64 / CALLS as f64
    })
}

macro_rules! variants {
    ($f:ident) => {{
        $f!("bare", bare());
        $f!(
            "map_err",
            bare().map_err(to_box as fn(Infallible) -> BoxError)
        );
        $f!("fallback_value", value().layer(bare()));
        $f!(
            "fallback_plain",
            FallbackLayer::plain(Fallback::value(Response::new(()))).layer(bare())
        );
        $f!(
            "fallback_keyed_fn",
            FallbackLayer::new(Fallback::keyed(
                |req: &Req| req.method().clone(),
                |_, _| Ok(Response::new(()))
            ))
            .layer(bare())
        );
        $f!(
            "fallback_last_good",
            FallbackLayer::new(Fallback::last_good(
                |_: &Req| 0u8,
                1024,
                Duration::from_secs(60)
            ))
            .layer(bare())
        );
        $f!(
            "fallback_shadow_1pct",
            value()
                .shadow(0.01)
                .random(SeededRandom::new(1))
                .layer(bare())
        );
        $f!(
            "fallback_serving_503",
            value().header(false).layer(failing())
        );
        $f!("fallback_serving_503_header", value().layer(failing()));
        $f!("fallback_exercise_all", value().exercise(1.0).layer(bare()));
    }};
}

fn one_thread(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("fallback_one_thread");
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
    let mut group = c.benchmark_group("fallback_two_threads");
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

/// The least time per call over many short rounds, the variants taking
/// turns: on a machine busy with other work, the minimum is the figure
/// that other work disturbs least (criterion's means are printed too).
fn least_per_call(_c: &mut Criterion) {
    const ROUNDS: usize = 60;
    const CALLS: u64 = 5_000;
    let rt = runtime();
    let mut names: Vec<&str> = Vec::new();
    let mut rounds: Vec<Box<dyn FnMut() -> Duration>> = Vec::new();
    macro_rules! add {
        ($name:expr, $svc:expr) => {{
            let svc = rt.block_on(async { $svc });
            let handle = rt.handle().clone();
            names.push($name);
            rounds.push(Box::new(move || handle.block_on(run(svc.clone(), CALLS))));
        }};
    }
    variants!(add);
    let mut least = vec![Duration::MAX; rounds.len()];
    for _ in 0..ROUNDS {
        for (i, round) in rounds.iter_mut().enumerate() {
            least[i] = least[i].min(round());
        }
    }
    println!("\nleast time per call ({ROUNDS} rounds of {CALLS} calls, interleaved):");
    for (name, t) in names.iter().zip(least) {
        println!(
            "  {:<28} {:.1} ns",
            name,
            t.as_nanos() as f64 / CALLS as f64
        );
    }
}

criterion_group!(
    benches,
    allocations_per_call,
    least_per_call,
    one_thread,
    two_threads
);
criterion_main!(benches);
