//! Allocations per call of the stack benches' variants (see `stack`),
//! counted by an instrumented global allocator, which is why they are not
//! counted while timing: the counters slow every allocation down.
//!
//! Run with `cargo bench -p tower-shield --bench stack_allocs`.

#![allow(missing_docs)]

#[path = "support/stack.rs"]
#[macro_use]
mod stack;

use std::alloc::System;

use stack::*;
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tower::Service;
use tower_breaker::Breaker;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn allocations_per_call<S>(rt: &tokio::runtime::Runtime, svc: S, shape: Shape) -> f64
where
    S: Service<http::Request<()>>,
{
    const N: u64 = 10_000;
    let region = Region::new(GLOBAL);
    rt.block_on(run(svc, shape, N));
    region.change().allocations as f64 / N as f64
}

macro_rules! counted {
    ($($name:literal => $make:expr),* $(,)?) => {
        fn main() {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            for (shape, label) in [(Shape::Bare, "bare request"), (Shape::Real, "real request")] {
                println!("\nallocations per call, {label} (the bare service's included):");
                $(
                    println!(
                        "  {:<48} {:.2}",
                        $name,
                        allocations_per_call(&rt, $make, shape)
                    );
                )*
            }
        }
    };
}

for_each_variant!(counted);
