//! What recording costs with a real recorder: each layer alone and the
//! one-line client stack, built with feature `metrics`, timed with no
//! recorder installed (the `metrics` facade's no-op) and with
//! `metrics-exporter-prometheus`'s recorder, in interleaved rounds (min
//! and median per call). Each service is built inside the recorder's scope,
//! as a process that installs its recorder at start-up builds its stacks
//! after it: the layers register their handles when they are built.
//!
//! Run with `cargo bench -p tower-shield --features metrics --bench metrics`,
//! and without `--features metrics` for the layers with no recording
//! compiled in (both columns are then the same build, and should match).

#![allow(missing_docs)]

#[path = "support/stack.rs"]
#[allow(unused_macros)] // the stack benches' list of variants
mod stack;

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use stack::*;
use tower::Layer;
use tower_breaker::{Breaker, BreakerLayer};
use tower_deadline::ClientDeadlineLayer;

const ROUNDS: usize = 15;
const CALLS: u64 = 50_000;

/// Builds the variant `i` on the bare service and times it.
fn time(rt: &tokio::runtime::Runtime, i: usize, shape: Shape) -> f64 {
    let elapsed = match i {
        0 => rt.block_on(run(bare(), shape, CALLS)),
        1 => rt.block_on(run(
            BreakerLayer::new(Breaker::new("bench")).layer(bare()),
            shape,
            CALLS,
        )),
        2 => rt.block_on(run(retry_alone(bare()), shape, CALLS)),
        3 => rt.block_on(run(step_bulkhead(bare()), shape, CALLS)),
        4 => rt.block_on(run(
            ClientDeadlineLayer::new()
                .default_timeout(Duration::from_secs(60))
                .layer(bare()),
            shape,
            CALLS,
        )),
        _ => rt.block_on(run(one_line(bare()), shape, CALLS)),
    };
    elapsed.as_nanos() as f64 / CALLS as f64
}

const NAMES: [&str; 6] = [
    "bare service_fn",
    "breaker",
    "retry",
    "bulkhead",
    "client deadline",
    "client_stack (one line)",
];

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    for (shape, label) in [(Shape::Bare, "bare request"), (Shape::Real, "real request")] {
        let mut noop = vec![Vec::with_capacity(ROUNDS); NAMES.len()];
        let mut prometheus = vec![Vec::with_capacity(ROUNDS); NAMES.len()];
        for _ in 0..ROUNDS {
            for i in 0..NAMES.len() {
                noop[i].push(time(&rt, i, shape));
                prometheus[i].push(metrics::with_local_recorder(&recorder, || {
                    time(&rt, i, shape)
                }));
            }
        }
        for v in noop.iter_mut().chain(prometheus.iter_mut()) {
            v.sort_by(f64::total_cmp);
        }
        println!(
            "\nns per call, {label}, feature `metrics` {}, {ROUNDS} interleaved rounds of {CALLS} \
             calls (min, median): no recorder | prometheus | difference of the minimums",
            if cfg!(feature = "metrics") {
                "on"
            } else {
                "off"
            }
        );
        for (i, name) in NAMES.iter().enumerate() {
            println!(
                "  {:<28} {:>8.1} {:>8.1} | {:>8.1} {:>8.1} | {:>+7.1}",
                name,
                noop[i][0],
                noop[i][ROUNDS / 2],
                prometheus[i][0],
                prometheus[i][ROUNDS / 2],
                prometheus[i][0] - noop[i][0],
            );
        }
    }
    // With the feature, the recorder did record: its rendering names the
    // layers' metrics.
    let rendered = handle.render();
    for name in ["tower_breaker_calls_total", "tower_bulkhead_in_flight"] {
        assert_eq!(
            rendered.contains(name),
            cfg!(feature = "metrics"),
            "{name}:\n{rendered}"
        );
    }
}
