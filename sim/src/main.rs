//! Runs the simulation over seeds and prints what broke.
//!
//! ```text
//! resilience-sim                  # seeds 0..1000
//! resilience-sim --seeds 200      # seeds 0..200
//! resilience-sim --seeds 500..700
//! resilience-sim --seed 42        # one seed, with its scenario and report
//! ```
//!
//! Exits with 1 when a seed broke a promise; each such seed is printed
//! with the command that replays it. `SIM_DEBUG=1` prints each failed
//! call's error as it ends, `SIM_EACH=1` each seed's report (to compare
//! two runs). Seeds run on one thread per core
//! (`SIM_THREADS=N` to choose), and are reported in seed order.

use std::num::NonZeroUsize;
use std::ops::Range;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};

use resilience_sim::scenario::Scenario;
use resilience_sim::Report;

/// Threads to run seeds on: `SIM_THREADS`, else one per core. Each seed's
/// run is a world of its own (its network, clock and randomness come from
/// the seed), so the thread that runs it changes nothing in its report.
fn workers() -> usize {
    std::env::var("SIM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, NonZeroUsize::get))
}

/// Runs every seed of `seeds` on `threads` threads, each taking the next
/// seed not yet taken; the reports come back in seed order, `None` for a
/// seed whose run panicked (its message is on stderr).
fn run_all(seeds: Range<u64>, threads: usize) -> Vec<(u64, Option<Report>)> {
    let next = AtomicU64::new(seeds.start);
    let mut all: Vec<(u64, Option<Report>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let seed = next.fetch_add(1, Ordering::Relaxed);
                        if seed >= seeds.end {
                            return done;
                        }
                        let report = std::panic::catch_unwind(|| resilience_sim::run(seed)).ok();
                        done.push((seed, report));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a worker catches its seeds' panics"))
            .collect()
    });
    all.sort_unstable_by_key(|(seed, _)| *seed);
    all
}

fn parse_seeds(arg: &str) -> Result<Range<u64>, String> {
    let bad = || format!("--seeds takes N or A..B, not {arg:?}");
    match arg.split_once("..") {
        Some((a, b)) => {
            let (a, b) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
            if a >= b {
                return Err(bad());
            }
            Ok(a..b)
        }
        None => Ok(0..arg.parse().map_err(|_| bad())?),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut seeds = 0..1000;
    let mut single = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let value = it.next();
        let parsed = match (arg.as_str(), value) {
            ("--seeds", Some(v)) => parse_seeds(v).map(|r| seeds = r),
            ("--seed", Some(v)) => v
                .parse()
                .map(|s| single = Some(s))
                .map_err(|_| format!("--seed takes a number, not {v:?}")),
            _ => Err(format!(
                "usage: resilience-sim [--seeds N | --seeds A..B | --seed N] (got {arg:?})"
            )),
        };
        if let Err(e) = parsed {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    }

    if let Some(seed) = single {
        println!("{}", Scenario::from_seed(seed));
        let report = resilience_sim::run(seed);
        println!("{report}");
        return if report.violations.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }

    // The wall clock, for the report (there is no paused time out here).
    #[allow(clippy::disallowed_types)]
    let started = std::time::Instant::now();
    let (mut failed, mut calls, mut openings, mut simulated) = (Vec::new(), 0u64, 0u64, 0.0);
    let (mut retries, mut past_deadline) = (0u64, 0u64);
    let count = seeds.end - seeds.start;
    let each = std::env::var_os("SIM_EACH").is_some();
    for (seed, outcome) in run_all(seeds.clone(), workers()) {
        if let (true, Some(report)) = (each, &outcome) {
            println!("{report}");
        }
        let Some(report) = outcome else {
            println!("seed {seed}: PANICKED (above)");
            println!("  replay: cargo run -p resilience-sim --release -- --seed {seed}");
            failed.push(seed);
            continue;
        };
        calls += u64::from(report.calls);
        openings += u64::from(report.openings);
        retries += report.retries;
        past_deadline += u64::from(report.deadline_exceeded);
        simulated += report.simulated.as_secs_f64();
        if !report.violations.is_empty() {
            println!("{}\n{report}", Scenario::from_seed(seed));
            println!("  replay: cargo run -p resilience-sim --release -- --seed {seed}");
            failed.push(seed);
        }
    }
    println!(
        "{count} seeds ({}..{}): {} failed; {calls} calls, {past_deadline} cut at their \
         deadline, {retries} retries, {openings} openings, {simulated:.0} s simulated in {:.1} s",
        seeds.start,
        seeds.end,
        failed.len(),
        started.elapsed().as_secs_f64(),
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!("failing seeds: {failed:?}");
        ExitCode::FAILURE
    }
}
