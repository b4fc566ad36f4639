//! The overload harness (issue 30): a simulated dependency of fixed
//! capacity (a FIFO queue in front of C servers, lognormal service times)
//! offered 1x to 10x its capacity by open-loop callers with deadlines, and
//! the limits under test between them: none, our fixed bulkhead at a sweep
//! of sizes, our adaptive bulkhead (Gradient, AIMD), our throttle (alone
//! and in front of the adaptive bulkhead), and tower-resilience-adaptive
//! (the peer) at its defaults, as shipped and under tower's `LoadShed`. A discrete-event simulation on
//! tokio's paused clock: deterministic from the seed. See
//! `docs/overload.md` for the results and what the simulation leaves out.
//!
//! ```text
//! cargo run --release -p examples --bin overload -- --svg docs/overload.svg   # everything, a few minutes
//! cargo run -p examples --bin overload -- --ci          # the CI check, seconds
//! cargo run --release -p examples --bin overload -- --real-time   # the peer on the wall clock
//! ```
//!
//! Flags: `--seed N` (default 1), `--svg PATH` (the chart), `--quick` or
//! `--ci` (the short check: the adaptive bulkhead at its defaults at 5x,
//! 8 and 32 servers of 5 ms, 100 ms deadline; exits non-zero if it serves
//! less than 95% of capacity in either), `--real-time` (the peer's cells on the wall
//! clock; see the peer's caveat in `docs/overload.md`),
//! `--scenario steady|step|criticality` (one scenario only).

use std::process::ExitCode;
use std::time::Duration;

use examples::overload::{
    run_cell, run_cell_on, settle_time, svg, BoxError, Cell, CellResult, Contender, OurAlgorithm,
    Panel, PeerAlgorithm, Rng, Series,
};

const MS: Duration = Duration::from_millis(1);
const LOADS: [f64; 4] = [1.0, 2.0, 5.0, 10.0];
const FIXED: [usize; 7] = [8, 16, 32, 64, 128, 256, 1024];

struct Args {
    seed: u64,
    svg: Option<String>,
    ci: bool,
    real_time: bool,
    scenario: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        seed: 1,
        svg: None,
        ci: false,
        real_time: false,
        scenario: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" | "--ci" => args.ci = true,
            "--real-time" => args.real_time = true,
            "--seed" => {
                let v = it.next().ok_or("--seed needs a number")?;
                args.seed = v
                    .parse()
                    .map_err(|_| format!("--seed: not a number: {v}"))?;
            }
            "--svg" => args.svg = Some(it.next().ok_or("--svg needs a path")?),
            "--scenario" => {
                let v = it
                    .next()
                    .ok_or("--scenario needs steady, step or criticality")?;
                if !["steady", "step", "criticality"].contains(&v.as_str()) {
                    return Err(format!("--scenario: unknown scenario {v}"));
                }
                args.scenario = Some(v);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

fn ours() -> Vec<Contender> {
    vec![
        Contender::Adaptive(OurAlgorithm::Gradient),
        Contender::Adaptive(OurAlgorithm::Aimd),
        Contender::Throttle { adaptive: false },
        Contender::Throttle { adaptive: true },
    ]
}

fn contenders() -> Vec<Contender> {
    let mut all = vec![Contender::None];
    all.extend(FIXED.iter().map(|&n| Contender::Fixed(n)));
    all.extend(ours());
    for shed in [false, true] {
        for algorithm in [
            PeerAlgorithm::Aimd,
            PeerAlgorithm::Vegas,
            PeerAlgorithm::Gradient2,
        ] {
            all.push(Contender::Peer { algorithm, shed });
        }
    }
    all
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("overload: {message}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("overload: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<bool, BoxError> {
    if args.ci {
        return ci(args.seed);
    }
    if args.real_time {
        real_time(args.seed)?;
        return Ok(true);
    }
    let wants = |s: &str| args.scenario.as_deref().is_none_or(|w| w == s);
    println!("# Overload harness: results\n");
    println!(
        "Seed {}. Dependency: FIFO queue, C servers, lognormal service time (sigma 0.5). \
         Open-loop Poisson callers; each call under `tokio::time::timeout(deadline)`. \
         Cells: goodput as % of capacity · p99 of successes (ms) · wasted work (% of the \
         dependency's services, for callers who had gone); for adaptive limits, L: the \
         limit at the end of the run. † the peer reads \
         `std::time::Instant`, which the paused clock does not move: see docs/overload.md.\n",
        args.seed
    );
    let mut panels = Vec::new();
    if wants("steady") {
        panels.extend(steady(args.seed)?);
    }
    if wants("step") {
        panels.extend(step(args.seed)?);
    }
    if wants("criticality") {
        criticality(args.seed)?;
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, svg(&panels))?;
        eprintln!("chart written to {path}");
    }
    Ok(true)
}

/// The wall clock, on purpose: the simulation's clock is paused, and this
/// only reports how long a table took to compute.
#[allow(clippy::disallowed_types)]
fn wall_clock() -> std::time::Instant {
    std::time::Instant::now()
}

fn mark(c: &Contender) -> &'static str {
    if c.is_peer() {
        "†"
    } else {
        ""
    }
}

fn cell_text(c: &Contender, r: &CellResult) -> String {
    let limit = match (c, r.limit_series.last()) {
        (Contender::None | Contender::Fixed(_), _) | (_, None) => String::new(),
        (_, Some((_, l))) => format!(" · L{l}"),
    };
    format!(
        "{:.1}% · {:.0} · {:.0}%{limit}",
        r.goodput_pct,
        r.p99.as_secs_f64() * 1e3,
        r.wasted_pct()
    )
}

/// The share of service times (lognormal, sigma 0.5) within the
/// deadline, in %: with no queue at all, the most of the capacity that can
/// be served within it.
fn ceiling(mean: Duration, deadline: Duration) -> f64 {
    let mut rng = Rng::new(0xCE11);
    let n = 400_000;
    let within = (0..n)
        .filter(|_| rng.lognormal(mean.as_secs_f64(), 0.5) <= deadline.as_secs_f64())
        .count();
    100.0 * within as f64 / f64::from(n)
}

fn steady(seed: u64) -> Result<Vec<Panel>, BoxError> {
    println!("## 1. Steady load\n");
    let contenders = contenders();
    let mut panels = Vec::new();
    let mut best_lines = Vec::new();
    let mut verdicts = Vec::new();
    for servers in [8, 32] {
        for mean_ms in [5u32, 20] {
            for deadline_ms in [25u32, 100] {
                let started = wall_clock();
                let cells: Vec<Cell> = LOADS
                    .iter()
                    .map(|&load| Cell::steady(servers, MS * mean_ms, MS * deadline_ms, load))
                    .collect();
                let mut results: Vec<Vec<CellResult>> = Vec::new();
                for contender in &contenders {
                    let mut row = Vec::new();
                    for cell in &cells {
                        row.push(run_cell(cell, contender, seed)?);
                    }
                    results.push(row);
                }
                let capacity = cells[0].capacity();
                println!(
                    "### {servers} servers × {mean_ms} ms mean ({capacity:.0} requests/s), deadline {deadline_ms} ms \
                     (window {:.1} s after {:.0} s of warm-up)\n\n\
                     No-queue ceiling: {:.1}% of the service times are within the deadline, so about \
                     that share of capacity is the most any limiter can serve in time.\n",
                    cells[0].measure.as_secs_f64(),
                    cells[0].warmup.as_secs_f64(),
                    ceiling(MS * mean_ms, MS * deadline_ms)
                );
                println!("| contender | 1x | 2x | 5x | 10x |\n|---|---|---|---|---|");
                // The best fixed size per load: the lowest p99 among those
                // within half a point of the most goodput (closer than that
                // is the window's noise).
                let best: Vec<usize> = (0..LOADS.len())
                    .map(|l| {
                        let fixed: Vec<usize> = (0..contenders.len())
                            .filter(|&i| matches!(contenders[i], Contender::Fixed(_)))
                            .collect();
                        let top = fixed
                            .iter()
                            .map(|&i| results[i][l].goodput_pct)
                            .fold(0.0, f64::max);
                        fixed
                            .into_iter()
                            .filter(|&i| results[i][l].goodput_pct >= top - 0.5)
                            .min_by_key(|&i| results[i][l].p99)
                            .unwrap_or(0)
                    })
                    .collect();
                for (i, contender) in contenders.iter().enumerate() {
                    let cols: Vec<String> = results[i]
                        .iter()
                        .enumerate()
                        .map(|(l, r)| {
                            if best[l] == i {
                                format!("**{}**", cell_text(contender, r))
                            } else {
                                cell_text(contender, r)
                            }
                        })
                        .collect();
                    println!(
                        "| {}{} | {} |",
                        contender.name(),
                        mark(contender),
                        cols.join(" | ")
                    );
                }
                let best_names: Vec<String> = best
                    .iter()
                    .enumerate()
                    .map(|(l, &i)| format!("{}x: {}", LOADS[l], contenders[i].name()))
                    .collect();
                println!(
                    "\nBest fixed (bold: the lowest p99 within 0.5 point of the most goodput): {}. \
                     Run time of this table: {:.1} s.\n",
                    best_names.join(", "),
                    started.elapsed().as_secs_f64()
                );
                for (i, contender) in contenders.iter().enumerate() {
                    if !matches!(
                        contender,
                        Contender::Adaptive(_) | Contender::Throttle { adaptive: true }
                    ) {
                        continue;
                    }
                    for l in 1..LOADS.len() {
                        let r = &results[i][l];
                        let fixed = &results[best[l]][l];
                        let ratio = r.p99.as_secs_f64() / fixed.p99.as_secs_f64().max(1e-9);
                        let peer = contenders
                            .iter()
                            .enumerate()
                            .filter(|(_, c)| c.is_peer())
                            .map(|(j, _)| results[j][l].goodput_pct)
                            .fold(0.0, f64::max);
                        let mut misses = Vec::new();
                        if r.goodput_pct < 99.0 {
                            misses.push("goodput < 99%");
                        }
                        if ratio > 1.2 {
                            misses.push("p99 > 1.2x best fixed");
                        }
                        if r.goodput_pct <= peer {
                            misses.push("not ahead of the peer");
                        }
                        verdicts.push(format!(
                            "| {servers} × {mean_ms} ms, {deadline_ms} ms | {}x | {} | {:.1}% | {:.1} / {:.1} ms = {ratio:.2} ({}) | {peer:.1}% | {} |",
                            LOADS[l],
                            contender.name(),
                            r.goodput_pct,
                            r.p99.as_secs_f64() * 1e3,
                            fixed.p99.as_secs_f64() * 1e3,
                            contenders[best[l]].name(),
                            if misses.is_empty() {
                                "met".to_owned()
                            } else {
                                format!("**{}**", misses.join(", "))
                            }
                        ));
                    }
                }
                best_lines.push(format!(
                    "{servers}×{mean_ms} ms, {deadline_ms} ms: {}",
                    best_names.join(", ")
                ));
                panels.push(Panel {
                    title: format!("{servers} servers × {mean_ms} ms, deadline {deadline_ms} ms"),
                    x_label: "offered load (x capacity)".into(),
                    y_label: "goodput, % of capacity".into(),
                    series: contenders
                        .iter()
                        .enumerate()
                        .map(|(i, c)| Series {
                            name: format!("{}{}", c.name(), mark(c)),
                            points: LOADS
                                .iter()
                                .zip(&results[i])
                                .map(|(&l, r)| (l, r.goodput_pct))
                                .collect(),
                        })
                        .collect(),
                });
                eprintln!(
                    "steady {servers}x{mean_ms}ms/{deadline_ms}ms done in {:.1} s",
                    started.elapsed().as_secs_f64()
                );
            }
        }
    }
    println!(
        "### Against issue 30's first target\n\nAt 2x, 5x and 10x: goodput at least 99% of \
         capacity; p99 of the successes at most 1.2x the best fixed limit's (bold above); \
         goodput ahead of every peer variant (as shipped and under `LoadShed`).\n\n\
         | setting | load | contender | goodput | p99 / best fixed's | best peer goodput | verdict |\n\
         |---|---|---|---|---|---|---|"
    );
    for line in &verdicts {
        println!("{line}");
    }
    println!();
    Ok(panels)
}

fn step(seed: u64) -> Result<Vec<Panel>, BoxError> {
    let (t1, t2, end) = (5.0, 10.0, 15.0);
    println!(
        "## 2. Capacity step\n\n32 servers × 5 ms (6,400 requests/s), deadline 100 ms, offered 5x \
         the full capacity (32,000 requests/s) throughout; at {t1} s the servers drop to 16 \
         (the offer becomes 10x), at {t2} s they come back. Goodput in % of the full capacity \
         over the whole run; settling: time from the step until goodput (100 ms buckets, \
         each averaged with the two before) stays within 10% of its new steady value (the \
         mean over the last 40% of the segment); the same for the limit (sampled every \
         100 ms).\n"
    );
    let mut cell = Cell::steady(32, MS * 5, MS * 100, 5.0)
        .with_window(Duration::ZERO, Duration::from_secs_f64(end));
    cell.steps = vec![
        (Duration::from_secs_f64(t1), 16),
        (Duration::from_secs_f64(t2), 32),
    ];
    let mut contenders = vec![Contender::None, Contender::Fixed(64), Contender::Fixed(128)];
    contenders.extend(ours());
    contenders.extend(contenders_peer());
    let mut limit_series = Vec::new();
    let mut goodput_series = Vec::new();
    println!("| contender | goodput | p99 ms | wasted | goodput settled after halving | after restoring | limit settled after halving | after restoring |\n|---|---|---|---|---|---|---|---|");
    let mut limit_rows = Vec::new();
    for contender in &contenders {
        let r = run_cell(&cell, contender, seed)?;
        let limits: Vec<(f64, f64)> = r.limit_series.iter().map(|&(t, l)| (t, l as f64)).collect();
        let settle = |series: &[(f64, f64)], from: f64, to: f64| {
            if series.is_empty() {
                return "-".to_owned();
            }
            match settle_time(series, from, to, 0.1) {
                Some(s) => format!("{s:.1} s"),
                None => "never".to_owned(),
            }
        };
        println!(
            "| {}{} | {:.1}% | {:.0} | {:.0}% | {} | {} | {} | {} |",
            contender.name(),
            mark(contender),
            r.goodput_pct,
            r.p99.as_secs_f64() * 1e3,
            r.wasted_pct(),
            settle(&r.goodput_series, t1, t2),
            settle(&r.goodput_series, t2, end),
            settle(&limits, t1, t2),
            settle(&limits, t2, end),
        );
        if !r.limit_series.is_empty() {
            let at = |t: f64| {
                r.limit_series
                    .iter()
                    .rev()
                    .find(|(s, _)| *s <= t + 1e-9)
                    .map_or(0, |(_, l)| *l)
            };
            let samples: Vec<String> = (0..=(end as usize * 2))
                .map(|i| at(i as f64 / 2.0).to_string())
                .collect();
            limit_rows.push(format!(
                "| {}{} | {} |",
                contender.name(),
                mark(contender),
                samples.join(" | ")
            ));
            limit_series.push(Series {
                name: format!("{}{}", contender.name(), mark(contender)),
                points: r.limit_series.iter().map(|&(t, l)| (t, l as f64)).collect(),
            });
        }
        goodput_series.push(Series {
            name: format!("{}{}", contender.name(), mark(contender)),
            points: smooth(&r.goodput_series)
                .into_iter()
                .map(|(t, g)| (t, 100.0 * g / cell.capacity()))
                .collect(),
        });
    }
    let header: Vec<String> = (0..=(end as usize * 2))
        .map(|i| format!("{:.1}", i as f64 / 2.0))
        .collect();
    println!(
        "\nThe limit every 0.5 s (s →):\n\n| contender | {} |\n|---|{}",
        header.join(" | "),
        "---|".repeat(header.len())
    );
    for row in limit_rows {
        println!("{row}");
    }
    println!();
    Ok(vec![
        Panel {
            title: "capacity step (32 → 16 → 32 servers, 5x): goodput".into(),
            x_label: "time (s)".into(),
            y_label: "goodput, % of full capacity (300 ms average)".into(),
            series: goodput_series,
        },
        Panel {
            title: "capacity step: the limit".into(),
            x_label: "time (s)".into(),
            y_label: "concurrency limit".into(),
            series: limit_series,
        },
    ])
}

fn smooth(series: &[(f64, f64)]) -> Vec<(f64, f64)> {
    (0..series.len())
        .map(|i| {
            let lo = i.saturating_sub(1);
            let hi = (i + 1).min(series.len() - 1);
            let n = (hi - lo + 1) as f64;
            (
                series[i].0,
                series[lo..=hi].iter().map(|(_, g)| g).sum::<f64>() / n,
            )
        })
        .collect()
}

fn contenders_peer() -> Vec<Contender> {
    contenders()
        .into_iter()
        .filter(Contender::is_peer)
        .collect()
}

fn criticality(seed: u64) -> Result<(), BoxError> {
    println!(
        "## 3. Criticality at 2x\n\n40% of the requests `Criticality::Critical`, 60% \
         `Sheddable` (as a request extension, and in scope around the call). Deadline 100 ms, \
         5 ms mean. Target: at least 99% of the critical requests succeed.\n"
    );
    println!("| servers | contender | goodput | critical succeeded | sheddable succeeded |\n|---|---|---|---|---|");
    for servers in [8, 32] {
        let mut cell = Cell::steady(servers, MS * 5, MS * 100, 2.0);
        cell.critical_share = Some(0.4);
        let mut contenders = vec![
            Contender::None,
            Contender::Fixed(servers * 2),
            Contender::Fixed(servers * 4),
        ];
        contenders.extend(ours());
        contenders.extend(contenders_peer());
        for contender in &contenders {
            let r = run_cell(&cell, contender, seed)?;
            println!(
                "| {servers} | {}{} | {:.1}% | {:.1}% | {:.1}% |",
                contender.name(),
                mark(contender),
                r.goodput_pct,
                r.critical_pct(),
                r.sheddable_pct()
            );
        }
    }
    println!();
    Ok(())
}

/// The CI check (issue 30's): our adaptive bulkhead at its defaults
/// (Gradient) at 5x, 8 and 32 servers of 5 ms, 100 ms deadline, 2 s of
/// warm-up and 3 s measured; fails below 95% of capacity in either.
fn ci(seed: u64) -> Result<bool, BoxError> {
    let mut ok = true;
    let contender = Contender::Adaptive(OurAlgorithm::Gradient);
    println!(
        "overload --ci: {} at 5x, 5 ms mean, 100 ms deadline (seed {seed})",
        contender.name()
    );
    for servers in [8, 32] {
        let cell = Cell::steady(servers, MS * 5, MS * 100, 5.0)
            .with_window(Duration::from_secs(2), Duration::from_secs(3));
        let r = run_cell(&cell, &contender, seed)?;
        println!(
            "  {servers} servers: goodput {:.1}% of capacity, p99 {:.0} ms, wasted {:.1}%, limit at the end {}",
            r.goodput_pct,
            r.p99.as_secs_f64() * 1e3,
            r.wasted_pct(),
            r.limit_series.last().map_or(0, |(_, l)| *l)
        );
        if r.goodput_pct < 95.0 {
            eprintln!(
                "overload --ci: FAILED: {} at {servers} servers serves {:.1}% of capacity at 5x, below 95%",
                contender.name(),
                r.goodput_pct
            );
            ok = false;
        }
    }
    Ok(ok)
}

/// The peer on the wall clock: it measures latency with
/// `std::time::Instant`, which tokio's paused clock does not move, so on
/// the paused clock it sees every call take microseconds. Here the same
/// simulation runs in real time on a cheap cell (8 servers × 20 ms, 400
/// requests/s) so that its latency signal is real.
fn real_time(seed: u64) -> Result<(), BoxError> {
    println!(
        "## The peer on the wall clock\n\n8 servers × 20 ms (400 requests/s), deadline 100 ms, \
         1 s of warm-up and 4 s measured, in real time (timer granularity 1 ms; \
         results depend on the machine's load). Paused-clock figures of the same cell \
         beside them.\n"
    );
    println!("| contender | clock | 1x | 2x | 5x | 10x |\n|---|---|---|---|---|---|");
    let mut contenders = vec![Contender::None, Contender::Fixed(16)];
    contenders.extend(contenders_peer());
    for contender in &contenders {
        for paused in [false, true] {
            let mut cols = Vec::new();
            for load in LOADS {
                let cell = Cell::steady(8, MS * 20, MS * 100, load)
                    .with_window(Duration::from_secs(1), Duration::from_secs(4));
                let r = run_cell_on(&cell, contender, seed, paused)?;
                cols.push(cell_text(contender, &r));
            }
            println!(
                "| {} | {} | {} |",
                contender.name(),
                if paused { "paused" } else { "wall" },
                cols.join(" | ")
            );
        }
    }
    Ok(())
}
