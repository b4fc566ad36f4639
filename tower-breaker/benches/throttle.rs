//! Per-call overhead of client-side adaptive throttling over a bare
//! `service_fn`: the HTTP flavour and the plain one while nothing is
//! rejected (the happy path, target: at most +30 ns, no allocation), with
//! a `Sheddable` criticality in scope, and the rejection path (a
//! dependency that accepts nothing, the cap at 100%), with one thread and
//! with two threads calling clones of one throttle. Allocations per call
//! are counted first, by an instrumented global allocator (our paths do
//! not allocate, so it does not slow the timing of the happy path).
//!
//! Run with `cargo bench -p tower-breaker --bench throttle`.

#![allow(missing_docs)] // criterion_group! generates undocumented items

#[path = "support/overhead.rs"]
#[allow(unused_macros)] // its `variants!` are the breaker's
mod overhead;

use std::alloc::System;
use std::convert::Infallible;
use std::future::ready;

use criterion::{criterion_group, Criterion};
use http::{Request, Response, StatusCode};
use overhead::{bare, run, run_two, runtime};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tower::{service_fn, Layer, Service};
use tower_breaker::throttle::{Criticality, ThrottleLayer};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// A dependency that answers 503 to everything.
fn refusing(
) -> impl Service<Request<()>, Response = Response<()>, Error = Infallible, Future = impl Send>
       + Clone
       + Send
       + 'static {
    service_fn(|_req: Request<()>| {
        let mut answer = Response::new(());
        *answer.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        ready(Ok::<_, Infallible>(answer))
    })
}

/// A service that runs `inner` with `criticality` in scope, as a server
/// stack does for the handler.
#[derive(Clone)]
struct Scoped<S>(S, Criticality);

impl<S: Service<Request<()>>> Service<Request<()>> for Scoped<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Request<()>) -> Self::Future {
        self.1.sync_scope(|| self.0.call(req))
    }
}

macro_rules! variants {
    ($m:ident) => {
        $m!("bare service_fn", bare());
        $m!(
            "throttle (http, healthy: no rejection)",
            ThrottleLayer::new("bench").layer(bare())
        );
        $m!(
            "throttle (http, healthy, coarse clock)",
            ThrottleLayer::new("bench").coarse_clock(true).layer(bare())
        );
        $m!(
            "throttle (plain, healthy: no rejection)",
            ThrottleLayer::new("bench")
                .plain()
                .classifier(tower_breaker::DefaultClassifier)
                .layer(bare())
        );
        $m!(
            "throttle (http, sheddable in scope, healthy)",
            Scoped(
                ThrottleLayer::new("bench").layer(bare()),
                Criticality::Sheddable
            )
        );
        $m!(
            "throttle (http, rejecting 100%)",
            ThrottleLayer::new("bench")
                .max_rejection(1.0)
                .layer(refusing())
        );
    };
}

fn allocations() {
    const CALLS: u64 = 10_000;
    let rt = runtime();
    println!("\nallocations per call:");
    macro_rules! count {
        ($name:expr, $svc:expr) => {{
            let svc = $svc;
            let per_call = rt.block_on(async {
                // Warm up (the window's first bucket, the rule's state).
                run(svc.clone(), 1_000).await;
                let region = Region::new(GLOBAL);
                run(svc, CALLS).await;
                region.change().allocations as f64 / CALLS as f64
            });
            println!("  {:<56} {:.2}", $name, per_call);
        }};
    }
    variants!(count);
}

fn one_thread(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("throttle_one_thread");
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
    let mut group = c.benchmark_group("throttle_two_threads");
    macro_rules! bench {
        ($name:expr, $svc:expr) => {{
            let svc = rt.block_on(async { $svc });
            group.bench_function($name, |b| b.iter_custom(|iters| run_two(&svc, iters)));
        }};
    }
    variants!(bench);
    group.finish();
}

criterion_group!(benches, one_thread, two_threads);

fn main() {
    allocations();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
