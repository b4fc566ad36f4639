//! Allocations per call of the overhead bench's variants (see `overhead`),
//! counted by an instrumented global allocator, which is why they are not
//! counted while timing: the counters slow every allocation down.
//!
//! Run with `cargo bench -p tower-breaker --bench overhead_allocs`.

#![allow(missing_docs)]

#[path = "support/overhead.rs"]
#[macro_use]
mod overhead;
#[path = "support/peers.rs"]
mod peers;

use std::alloc::System;

use http::Request;
use overhead::*;
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tower::Service;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

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

fn main() {
    let rt = runtime();
    println!("\nallocations per call:");
    macro_rules! count {
        ($name:expr, $svc:expr) => {{
            let svc = rt.block_on(async { $svc });
            println!("  {:<56} {:.2}", $name, allocations(&rt, svc));
        }};
    }
    variants!(count);
}
