//! Per-call overhead of the breaker over a bare `service_fn`, against
//! `tower::limit::ConcurrencyLimit`: the closed path (count window, time
//! window with slow-call timing, with and without the attempt hook) and the
//! open path's rejection, and the client-side throttle admitting (its
//! dependency accepts everything) and shedding (it refused everything),
//! with one thread and with two threads hammering clones of one stack. After criterion's figures, the same variants in
//! interleaved rounds (min and median per call; for two threads, the
//! aggregate: wall time over the calls of both). Allocations per call are
//! counted by the `overhead_allocs` bench, whose counting allocator would
//! slow every allocation here.
//!
//! Run with `cargo bench -p tower-breaker --bench overhead` (and
//! `--bench overhead_allocs`).

#![allow(missing_docs)] // criterion_group! generates undocumented items

#[path = "support/overhead.rs"]
#[macro_use]
mod overhead;
#[path = "support/peers.rs"]
mod peers;

use criterion::{criterion_group, criterion_main, Criterion};
use overhead::*;

fn one_thread(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("one_thread");
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
    let mut group = c.benchmark_group("two_threads");
    macro_rules! bench {
        ($name:expr, $svc:expr) => {{
            let svc = rt.block_on(async { $svc });
            group.bench_function($name, |b| b.iter_custom(|iters| run_two(&svc, iters)));
        }};
    }
    variants!(bench);
    group.finish();
}

/// The variants in turn, round after round: the minimum over the rounds is
/// the figure a noisy machine disturbs least.
fn interleaved(_c: &mut Criterion) {
    const ROUNDS: usize = 15;
    const CALLS: u64 = 100_000;
    let rt = runtime();
    let mut names = Vec::new();
    macro_rules! name {
        ($name:expr, $svc:expr) => {{
            // Named, not built.
            let _ = || $svc;
            names.push($name);
        }};
    }
    variants!(name);
    let mut one = vec![Vec::with_capacity(ROUNDS); names.len()];
    let mut two = vec![Vec::with_capacity(ROUNDS); names.len()];
    for _ in 0..ROUNDS {
        let mut i = 0;
        macro_rules! round {
            ($name:expr, $svc:expr) => {{
                let svc = rt.block_on(async { $svc });
                let elapsed = rt.block_on(run(svc.clone(), CALLS));
                one[i].push(elapsed.as_nanos() as f64 / CALLS as f64);
                // Two threads: the aggregate cost, wall time over both
                // threads' calls.
                let elapsed = run_two(&svc, CALLS);
                two[i].push(elapsed.as_nanos() as f64 / (2 * CALLS) as f64);
                i += 1;
            }};
        }
        variants!(round);
        let _ = i;
    }
    for v in one.iter_mut().chain(two.iter_mut()) {
        v.sort_by(f64::total_cmp);
    }
    for (label, samples) in [("one thread", &one), ("two threads, aggregate", &two)] {
        let base = samples[0][0];
        println!(
            "\nns per call, {label}, {ROUNDS} interleaved rounds of {CALLS} calls \
             (min, median; min over the bare service):"
        );
        for (name, v) in names.iter().zip(samples) {
            println!(
                "  {:<56} {:>8.1} {:>8.1} {:>+8.1}",
                name,
                v[0],
                v[ROUNDS / 2],
                v[0] - base
            );
        }
    }
}

criterion_group!(benches, one_thread, two_threads, interleaved);
criterion_main!(benches);
