//! The whole client stack and its joints, timed against a bare
//! `service_fn` and against tower's own layers in the same run: the stack
//! built up one layer at a time (to attribute the cost), the one-line
//! `client_stack`, and the rejection while the circuit is open; each on a
//! bare `Request<()>` and on a request that carries headers and an
//! extension as a real hyper or reqwest request does, with a deadline in
//! scope (the task-local deadline of a request being served). After
//! criterion's figures, the same variants in interleaved rounds (min and
//! median per call), which a noisy machine disturbs less than one long run
//! per variant. The allocations per call are counted by the `stack_allocs`
//! bench, whose counting allocator would slow every allocation here.
//!
//! Run with `cargo bench -p tower-shield --bench stack` (and
//! `--bench stack_allocs`).

#![allow(missing_docs)] // criterion_group! generates undocumented items

#[path = "support/stack.rs"]
#[macro_use]
mod stack;

use criterion::{criterion_group, criterion_main, Criterion};
use stack::*;
use tower_breaker::Breaker;

macro_rules! timed {
    ($($name:literal => $make:expr),* $(,)?) => {
        fn benches(c: &mut Criterion) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            for (shape, label) in [(Shape::Bare, "bare request"), (Shape::Real, "real request")] {
                let mut group = c.benchmark_group(format!("stack, {label}"));
                $(
                    group.bench_function($name, |b| {
                        b.iter_custom(|iters| rt.block_on(run($make, shape, iters)))
                    });
                )*
                group.finish();
            }
            for (shape, label) in [(Shape::Bare, "bare request"), (Shape::Real, "real request")] {
                // Criterion measures the variants one after the other; on a
                // shared virtual machine a slow minute then lands on one of
                // them. Here every variant runs in turn in each round, and
                // the minimum over the rounds is the least disturbed figure.
                const ROUNDS: usize = 15;
                const CALLS: u64 = 50_000;
                let names = [$($name),*];
                let mut samples = vec![Vec::with_capacity(ROUNDS); names.len()];
                for _ in 0..ROUNDS {
                    let mut i = 0;
                    $(
                        let elapsed = rt.block_on(run($make, shape, CALLS));
                        samples[i].push(elapsed.as_nanos() as f64 / CALLS as f64);
                        i += 1;
                    )*
                    let _ = i;
                }
                for v in &mut samples {
                    v.sort_by(f64::total_cmp);
                }
                let base = samples[0][0];
                println!(
                    "\nns per call, {label}, {ROUNDS} interleaved rounds of {CALLS} calls \
                     (min, median; min over the bare service):"
                );
                for (name, v) in names.iter().zip(&samples) {
                    println!(
                        "  {:<48} {:>8.1} {:>8.1} {:>+8.1}",
                        name,
                        v[0],
                        v[ROUNDS / 2],
                        v[0] - base
                    );
                }
            }
        }
    };
}

for_each_variant!(timed);

criterion_group!(group, benches);
criterion_main!(group);
