//! The hedging demo: a dependency where 5% of calls are slow, and callers
//! with and without hedged requests, side by side; then the same
//! dependency saturated, to show that hedges stay within the retry budget
//! and stop when the breaker opens.
//!
//! A local HTTP dependency on 127.0.0.1 answers 5% of its calls in 200 ms
//! and the rest in 2 ms (which calls are slow is a hash of the call
//! number, so a hedge is as likely to be slow as any call). Open-loop load
//! at a steady rate (new requests go out on schedule whatever is still
//! outstanding) goes through four callers in turn, each over `reqwest`:
//!
//! - **no hedging**: the transport alone;
//! - **tower::hedge**: tower's `Hedge` at its 95th percentile (100 data
//!   points, a 1 s period: it hedges once a whole period is recorded), the
//!   anchor;
//! - **HedgeLayer**: this toolkit's hedging layer with its defaults (the
//!   learned 95th percentile, one hedge, a 10% budget);
//! - **full stack + HedgeLayer**: `ClientDeadline -> Breaker -> Hedge ->
//!   Retry -> Bulkhead -> ClientDeadline -> reqwest`, the hedge layer
//!   sharing the retry layer's budget (`HedgeLayer::above`).
//!
//! After a warm-up, it measures each caller's latency percentiles and the
//! calls the dependency received, and prints a table. Then the overload
//! part: the dependency is healthy (2 ms) for a while, then saturated
//! (every call takes 300 ms), under three callers: a fixed 20 ms delay
//! with no budget, the same with the 10% budget, and the full stack with a
//! breaker that opens on slow calls. It prints the extra load each put on
//! the dependency, and writes an SVG chart (default `target/hedge.svg`):
//! latency by percentile, and the dependency's calls per second under
//! overload. It exits non-zero if hedging did not bring the p99 within
//! 10 ms of the p95 for at most 7% more calls, if the budget did not hold
//! the overload's extra load to 10%, or if hedges went on after the
//! breaker opened.
//!
//! Run it with:
//!
//! ```text
//! cargo run --release -p examples --bin hedge
//! cargo run --release -p examples --bin hedge -- --rate 1000 --secs 20
//! cargo run -p examples --bin hedge -- --quick     # about 25 s, for CI
//! ```

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use examples::demo::{check, serve_local};
use http_body_util::{BodyExt, Full};
use tokio::time::{Instant, MissedTickBehavior};
use tower::BoxError;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_breaker::error::CircuitOpen;
use tower_breaker::{Breaker, BreakerConfig, BreakerLayer, State as CircuitState, Transition};
use tower_bulkhead::BulkheadLayer;
use tower_deadline::ClientDeadlineLayer;
use tower_retry_budget::hedge::{HedgeCounters, HedgeLayer, HEDGE_ATTEMPT_HEADER};
use tower_retry_budget::RetryLayer;
use tower_shield::reqwest::{HttpResponse, ReqwestService};

/// The requests of every caller: a `Clone` body, which `tower::hedge`
/// needs to copy a request.
type HttpRequest = http::Request<Full<Bytes>>;

// ================================================================ settings

#[derive(Debug, Clone)]
struct Args {
    /// Requests per second of the tail part.
    rate: u64,
    /// Warm-up of each tail caller, not measured.
    warm_up: Duration,
    /// Measured time of each tail caller.
    measure: Duration,
    /// Requests per second of the overload part.
    overload_rate: u64,
    /// Healthy time, then saturated time, of each overload caller.
    healthy: Duration,
    saturated: Duration,
    svg: PathBuf,
}

const USAGE: &str = "\
usage: hedge [--rate N] [--secs SECS] [--svg PATH] [--quick]

  --rate N      requests per second of the tail part (default 500)
  --secs SECS   measured seconds per caller of the tail part (default 10)
  --svg PATH    where to write the chart (default target/hedge.svg)
  --quick       a short run for CI (3 s per caller, shorter overload)";

impl Args {
    fn parse() -> Result<Self, String> {
        let mut args = Self {
            rate: 500,
            warm_up: Duration::from_secs(2),
            measure: Duration::from_secs(10),
            overload_rate: 200,
            healthy: Duration::from_secs(3),
            saturated: Duration::from_secs(7),
            svg: PathBuf::from("target/hedge.svg"),
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "--rate" => args.rate = number(&value()?)?.clamp(50, 5_000),
                "--secs" => args.measure = Duration::from_secs(number(&value()?)?.max(1)),
                "--svg" => args.svg = PathBuf::from(value()?),
                "--quick" => {
                    args.measure = Duration::from_secs(3);
                    args.warm_up = Duration::from_millis(1_500);
                    args.healthy = Duration::from_secs(2);
                    args.saturated = Duration::from_secs(3);
                }
                "-h" | "--help" => return Err(String::new()),
                other => return Err(format!("unknown argument {other}")),
            }
        }
        Ok(args)
    }
}

fn number(s: &str) -> Result<u64, String> {
    s.parse().map_err(|_| format!("not a number: {s}"))
}

// ============================================================== dependency

/// The local dependency: which calls are slow, and a log of the calls it
/// received (when, and whether each was a hedge).
#[derive(Debug)]
struct Dependency {
    calls: AtomicU64,
    log: Mutex<Vec<(Instant, bool)>>,
    /// Overload part: when the dependency becomes saturated.
    saturate_at: Mutex<Option<Instant>>,
}

impl Dependency {
    /// Starts a new phase: an empty log, and when (if ever) to saturate.
    fn reset(&self, saturate_at: Option<Instant>) {
        lock(&self.log).clear();
        *lock(&self.saturate_at) = saturate_at;
    }

    fn log(&self, headers: &HeaderMap) {
        let hedge = headers.contains_key(HEDGE_ATTEMPT_HEADER.as_str());
        lock(&self.log).push((Instant::now(), hedge));
    }

    fn calls_since(&self, start: Instant) -> Vec<(f64, bool)> {
        lock(&self.log)
            .iter()
            .map(|(at, hedge)| ((*at - start).as_secs_f64(), *hedge))
            .collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether call `n` is one of the slow 5%: a hash of `n`.
fn slow(n: u64) -> bool {
    let mut x = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (x ^ (x >> 31)) % 100 < 5
}

/// `/tail`: 5% of calls in 200 ms, the rest in 2 ms.
async fn tail(State(dep): State<Arc<Dependency>>, headers: HeaderMap) -> &'static str {
    dep.log(&headers);
    let n = dep.calls.fetch_add(1, Ordering::Relaxed);
    let ms = if slow(n) { 200 } else { 2 };
    tokio::time::sleep(Duration::from_millis(ms)).await;
    "ok"
}

/// `/overload`: 2 ms until the saturation, then 300 ms for every call.
async fn overload(State(dep): State<Arc<Dependency>>, headers: HeaderMap) -> &'static str {
    dep.log(&headers);
    let saturated = lock(&dep.saturate_at).is_some_and(|at| Instant::now() >= at);
    let ms = if saturated { 300 } else { 2 };
    tokio::time::sleep(Duration::from_millis(ms)).await;
    "ok"
}

// ================================================================= callers

/// What one request saw.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Seconds since the phase started when it was issued.
    issued: f64,
    latency: Duration,
    ok: bool,
    /// Refused by the breaker (open circuit), in microseconds.
    rejected: bool,
}

/// Sends `total` time's worth of requests at `rate` per second to `url`
/// through `svc`, open loop: each call is made on schedule and its response
/// awaited on a task of its own. Returns every request's sample.
async fn drive<S>(mut svc: S, url: &str, rate: u64, total: Duration, start: Instant) -> Vec<Sample>
where
    S: Service<HttpRequest, Response = HttpResponse>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    let n = (total.as_secs_f64() * rate as f64) as usize;
    let mut tick = tokio::time::interval_at(start, Duration::from_secs_f64(1.0 / rate as f64));
    tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        tick.tick().await;
        let issued = Instant::now();
        let request = http::Request::get(url)
            .body(Full::new(Bytes::new()))
            .expect("a request");
        let ready = svc.ready().await.map_err(Into::into);
        let future = ready.map(|svc| svc.call(request));
        tasks.push(tokio::spawn(async move {
            let outcome = match future {
                Ok(future) => match future.await.map_err(Into::into) {
                    Ok(response) => {
                        let status = response.status();
                        let body = response.into_body().collect().await;
                        Ok(status.is_success() && body.is_ok())
                    }
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            let latency = issued.elapsed();
            let issued = (issued - start).as_secs_f64();
            match outcome {
                Ok(ok) => Sample {
                    issued,
                    latency,
                    ok,
                    rejected: false,
                },
                Err(e) => Sample {
                    issued,
                    latency,
                    ok: false,
                    rejected: e.is::<CircuitOpen>(),
                },
            }
        }));
    }
    let mut samples = Vec::with_capacity(n);
    for task in tasks {
        samples.push(task.await.expect("a caller task"));
    }
    samples
}

fn transport() -> ReqwestService {
    ReqwestService::new(
        // reqwest's own retries off: the hedges are the only extra copies.
        ReqwestService::client_builder()
            .connect_timeout(Duration::from_millis(100))
            .pool_max_idle_per_host(1_024)
            .build()
            .expect("a reqwest client"),
    )
}

/// tower's hedge policy for our requests: any request may be hedged; the
/// copy clones the parts and the (`Full<Bytes>`) body.
#[derive(Debug, Clone)]
struct TowerPolicy;

impl tower::hedge::Policy<HttpRequest> for TowerPolicy {
    fn clone_request(&self, req: &HttpRequest) -> Option<HttpRequest> {
        let mut copy = http::Request::new(req.body().clone());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.headers_mut() = req.headers().clone();
        Some(copy)
    }

    fn can_retry(&self, _req: &HttpRequest) -> bool {
        true
    }
}

/// The recommended client stack, by hand, with the hedging layer between
/// the breaker and the retry layer, sharing its budget.
fn full_stack(
    breaker: Breaker,
    hedge: HedgeLayer,
    retry: RetryLayer,
) -> impl Service<HttpRequest, Response = HttpResponse, Error = BoxError, Future = impl Send + 'static>
{
    ServiceBuilder::new()
        // The callers below take reqwest's body.
        .map_response(|response: http::Response<_>| response.map(reqwest::Body::wrap))
        .layer(
            ClientDeadlineLayer::new()
                .default_timeout(Duration::from_secs(1))
                .enforce_only(),
        )
        .layer(BreakerLayer::new(breaker))
        .layer(hedge.clone_bodies())
        .layer(retry)
        .layer(BulkheadLayer::new("dependency", 256))
        .layer(ClientDeadlineLayer::new())
        .service(transport())
}

// ================================================================ figures

/// One caller's figures in the tail part.
#[derive(Debug)]
struct TailFigures {
    name: &'static str,
    /// Sorted latencies of the measured requests.
    sorted: Vec<Duration>,
    requests: usize,
    failed: usize,
    calls: usize,
    hedges: Option<HedgeCounters>,
}

impl TailFigures {
    fn p(&self, p: f64) -> Duration {
        percentile(&self.sorted, p)
    }

    fn extra(&self) -> f64 {
        (self.calls as f64 - self.requests as f64) / self.requests as f64
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs one tail caller: warm-up, then the measured part.
async fn tail_phase<S>(
    name: &'static str,
    svc: S,
    args: &Args,
    dep: &Dependency,
    url: &str,
    hedges: impl Fn() -> Option<HedgeCounters>,
) -> TailFigures
where
    S: Service<HttpRequest, Response = HttpResponse>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    dep.reset(None);
    let start = Instant::now();
    let total = args.warm_up + args.measure;
    let samples = drive(svc, url, args.rate, total, start).await;
    let warm = args.warm_up.as_secs_f64();
    let measured: Vec<&Sample> = samples.iter().filter(|s| s.issued >= warm).collect();
    let mut sorted: Vec<Duration> = measured.iter().map(|s| s.latency).collect();
    sorted.sort_unstable();
    let measure_end = total.as_secs_f64();
    // The dependency's calls made for the measured requests: those that
    // arrived after the warm-up (late ones included).
    let calls = dep
        .calls_since(start)
        .iter()
        .filter(|(at, _)| *at >= warm && *at < measure_end + 1.0)
        .count();
    TailFigures {
        name,
        requests: measured.len(),
        failed: measured.iter().filter(|s| !s.ok).count(),
        sorted,
        calls,
        hedges: hedges(),
    }
}

/// One caller's figures in the overload part.
#[derive(Debug)]
struct OverloadFigures {
    name: &'static str,
    requests: usize,
    rejected: usize,
    /// Calls per second at the dependency, and hedges among them.
    per_sec: Vec<(u64, u64)>,
    calls: usize,
    hedges: usize,
    counters: HedgeCounters,
    /// When the breaker opened (seconds into the phase), if it did.
    opened: Option<f64>,
    hedges_after_open: usize,
}

impl OverloadFigures {
    fn extra(&self) -> f64 {
        (self.calls as f64 - (self.requests - self.rejected) as f64) / self.requests as f64
    }
}

async fn overload_phase<S>(
    name: &'static str,
    svc: S,
    args: &Args,
    dep: &Dependency,
    url: &str,
    counters: impl Fn() -> HedgeCounters,
    transitions: Option<&Mutex<Vec<(Instant, CircuitState)>>>,
) -> OverloadFigures
where
    S: Service<HttpRequest, Response = HttpResponse>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    let start = Instant::now();
    dep.reset(Some(start + args.healthy));
    let total = args.healthy + args.saturated;
    let samples = drive(svc, url, args.overload_rate, total, start).await;
    let calls = dep.calls_since(start);
    let secs = total.as_secs() as usize + 1;
    let mut per_sec = vec![(0, 0); secs];
    for (at, hedge) in &calls {
        if let Some(slot) = per_sec.get_mut(*at as usize) {
            slot.0 += 1;
            slot.1 += u64::from(*hedge);
        }
    }
    let opened = transitions.and_then(|t| {
        lock(t)
            .iter()
            .find(|(_, to)| *to == CircuitState::Open)
            .map(|(at, _)| (*at - start).as_secs_f64())
    });
    let hedges_after_open = opened.map_or(0, |open| {
        calls
            .iter()
            .filter(|(at, hedge)| *hedge && *at > open)
            .count()
    });
    OverloadFigures {
        name,
        requests: samples.len(),
        rejected: samples.iter().filter(|s| s.rejected).count(),
        per_sec,
        hedges: calls.iter().filter(|(_, hedge)| *hedge).count(),
        calls: calls.len(),
        counters: counters(),
        opened,
        hedges_after_open,
    }
}

// ==================================================================== main

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = examples::demo::args_or_exit(Args::parse(), USAGE);
    if !run(args).await {
        std::process::exit(1);
    }
}

async fn run(args: Args) -> bool {
    let dep = Arc::new(Dependency {
        calls: AtomicU64::new(0),
        log: Mutex::new(Vec::new()),
        saturate_at: Mutex::new(None),
    });
    let app = Router::new()
        .route("/tail", get(tail))
        .route("/overload", get(overload))
        .with_state(dep.clone());
    let addr = serve_local(app).await;
    let tail_url = format!("http://{addr}/tail");
    let overload_url = format!("http://{addr}/overload");

    println!(
        "Tail: 5% of calls take 200 ms, the rest 2 ms; {} requests/s, {:.1} s warm-up + {:.0} s measured per caller.\n",
        args.rate,
        args.warm_up.as_secs_f64(),
        args.measure.as_secs_f64()
    );
    let mut tail_figures = Vec::new();
    tail_figures.push(tail_phase("no hedging", transport(), &args, &dep, &tail_url, || None).await);
    let tower_hedge =
        tower::hedge::Hedge::new(transport(), TowerPolicy, 100, 0.95, Duration::from_secs(1));
    tail_figures.push(
        tail_phase(
            "tower::hedge (p95)",
            tower_hedge,
            &args,
            &dep,
            &tail_url,
            || None,
        )
        .await,
    );
    let ours = HedgeLayer::new();
    let svc = ours.clone().layer(transport());
    tail_figures.push(
        tail_phase("HedgeLayer (p95)", svc, &args, &dep, &tail_url, || {
            Some(ours.counters())
        })
        .await,
    );
    let retry = RetryLayer::new();
    let stacked = HedgeLayer::above(&retry);
    let svc = full_stack(Breaker::new("dependency"), stacked.clone(), retry);
    tail_figures.push(
        tail_phase(
            "full stack + HedgeLayer",
            svc,
            &args,
            &dep,
            &tail_url,
            || Some(stacked.counters()),
        )
        .await,
    );
    print_tail(&tail_figures);
    println!(
        "  learned delay now: HedgeLayer {:?}, full stack {:?}",
        ours.current_delay(),
        stacked.current_delay()
    );

    println!(
        "\nOverload: healthy (2 ms) for {:.0} s, then saturated (every call 300 ms) for {:.0} s; {} requests/s.\n",
        args.healthy.as_secs_f64(),
        args.saturated.as_secs_f64(),
        args.overload_rate
    );
    let mut overload_figures = Vec::new();
    let unbudgeted = HedgeLayer::new()
        .fixed_delay(Duration::from_millis(20))
        .no_budget();
    overload_figures.push(
        overload_phase(
            "fixed 20 ms delay, no budget",
            unbudgeted.clone().layer(transport()),
            &args,
            &dep,
            &overload_url,
            || unbudgeted.counters(),
            None,
        )
        .await,
    );
    let budgeted = HedgeLayer::new().fixed_delay(Duration::from_millis(20));
    overload_figures.push(
        overload_phase(
            "fixed 20 ms delay, 10% budget",
            budgeted.clone().layer(transport()),
            &args,
            &dep,
            &overload_url,
            || budgeted.counters(),
            None,
        )
        .await,
    );
    let transitions: Arc<Mutex<Vec<(Instant, CircuitState)>>> = Arc::default();
    let breaker = Breaker::with_config(
        "dependency",
        BreakerConfig::new()
            .count_window(20)
            .minimum_calls(10)
            .slow_calls(Duration::from_millis(100), 0.5)
            .open_period(Duration::from_secs(30))
            .listener({
                let transitions = transitions.clone();
                move |t: &Transition| lock(&transitions).push((t.at, t.to))
            }),
    );
    let retry = RetryLayer::new();
    let stacked = HedgeLayer::above(&retry).fixed_delay(Duration::from_millis(20));
    overload_figures.push(
        overload_phase(
            "full stack (fixed 20 ms), breaker",
            full_stack(breaker, stacked.clone(), retry),
            &args,
            &dep,
            &overload_url,
            || stacked.counters(),
            Some(&transitions),
        )
        .await,
    );
    print_overload(&overload_figures, &args);

    let mut failures = Vec::new();
    println!("\nChecks:");
    let none = &tail_figures[0];
    check(
        none.p(0.99) >= Duration::from_millis(150),
        &format!(
            "without hedging the p99 is the slow calls' ({:.1} ms)",
            ms(none.p(0.99))
        ),
        &mut failures,
    );
    for f in &tail_figures[2..] {
        check(
            f.p(0.99) <= f.p(0.95) + Duration::from_millis(10),
            &format!(
                "{}: p99 {:.1} ms is within 10 ms of p95 {:.1} ms",
                f.name,
                ms(f.p(0.99)),
                ms(f.p(0.95))
            ),
            &mut failures,
        );
        check(
            f.extra() <= 0.07,
            &format!(
                "{}: {:.1}% extra calls, at most 7%",
                f.name,
                f.extra() * 100.0
            ),
            &mut failures,
        );
        check(
            f.failed == 0,
            &format!("{}: every request answered ({} failed)", f.name, f.failed),
            &mut failures,
        );
    }
    let budgeted = &overload_figures[1];
    // The budget: 10% of the window's requests, or its floor of 5 per
    // second over the 10 s window, whichever is more.
    let floor = 50.0 / budgeted.requests as f64;
    check(
        budgeted.extra() <= 0.10 + floor,
        &format!(
            "the budget held the overload's extra load to {:.1}% (10%, or the floor of 50 per window)",
            budgeted.extra() * 100.0
        ),
        &mut failures,
    );
    let stack = &overload_figures[2];
    check(
        stack.opened.is_some(),
        "the breaker opened on slow calls",
        &mut failures,
    );
    check(
        stack.hedges_after_open == 0,
        &format!(
            "no hedge after the breaker opened ({})",
            stack.hedges_after_open
        ),
        &mut failures,
    );

    match write_chart(&args, &tail_figures, &overload_figures) {
        Ok(()) => println!("\nChart written to {}", args.svg.display()),
        Err(e) => eprintln!("\ncould not write the chart to {}: {e}", args.svg.display()),
    }
    if !failures.is_empty() {
        eprintln!("\n{} check(s) failed", failures.len());
    }
    failures.is_empty()
}

fn print_tail(figures: &[TailFigures]) {
    println!(
        "  {:<26} {:>8} {:>8} {:>8} {:>8} {:>9} {:>7} {:>14}",
        "caller", "p50", "p95", "p99", "p99.9", "requests", "extra", "hedges (won)"
    );
    for f in figures {
        let hedges = f.hedges.map_or_else(
            || "-".to_owned(),
            |c| format!("{} ({})", c.hedges, c.hedges_won),
        );
        println!(
            "  {:<26} {:>6.1}ms {:>6.1}ms {:>6.1}ms {:>6.1}ms {:>9} {:>6.2}% {:>14}",
            f.name,
            ms(f.p(0.5)),
            ms(f.p(0.95)),
            ms(f.p(0.99)),
            ms(f.p(0.999)),
            f.requests,
            f.extra() * 100.0,
            hedges
        );
    }
    println!(
        "  (extra: calls the dependency received beyond one per measured request; tower's hedges are not counted by tower)"
    );
}

fn print_overload(figures: &[OverloadFigures], args: &Args) {
    println!(
        "  {:<34} {:>8} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8}",
        "caller", "requests", "calls", "hedges", "extra", "budget", "breaker", "rejected"
    );
    for f in figures {
        println!(
            "  {:<34} {:>8} {:>7} {:>7} {:>6.1}% {:>8} {:>8} {:>8}",
            f.name,
            f.requests,
            f.calls,
            f.hedges,
            f.extra() * 100.0,
            f.counters.refused_by_budget,
            f.counters.refused_by_breaker,
            f.rejected
        );
    }
    println!(
        "  (budget, breaker: hedges refused by each; rejected: requests the open breaker refused; saturation at {:.0} s)",
        args.healthy.as_secs_f64()
    );
    if let Some(f) = figures.iter().find(|f| f.opened.is_some()) {
        println!(
            "  {}: the breaker opened {:.2} s in; {} hedges before, {} after",
            f.name,
            f.opened.unwrap_or_default(),
            f.hedges - f.hedges_after_open,
            f.hedges_after_open
        );
    }
}

// ===================================================================== svg

const COLORS: [&str; 4] = ["#d9480f", "#868e96", "#1971c2", "#2f9e44"];

fn write_chart(
    args: &Args,
    tail: &[TailFigures],
    overload: &[OverloadFigures],
) -> std::io::Result<()> {
    let svg = svg(args, tail, overload);
    if let Some(dir) = args.svg.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.svg, svg)
}

/// The chart, written by hand: latency by percentile (a "nines" axis: p50,
/// p90, p99, p99.9 equally spaced) on a log scale, and the overload part's
/// calls per second at the dependency.
fn svg(args: &Args, tail: &[TailFigures], overload: &[OverloadFigures]) -> String {
    let (w, left, right, panel_h, gap, top) = (960.0, 80.0, 20.0, 240.0, 80.0, 70.0);
    let plot_w = w - left - right;
    let h = top + 2.0 * (panel_h + gap) + 10.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{left}" y="24" font-size="16" font-weight="bold">Hedged requests: 5% of calls take 200 ms, the rest 2 ms ({} requests/s)</text>"#,
        args.rate
    );

    // Panel 1: latency by percentile.
    let y0 = top;
    let nines = |p: f64| -(1.0 - p).log10(); // p50 -> 0.3, p99.9 -> 3
    let (x_lo, x_hi) = (nines(0.5), nines(0.999));
    let x = |p: f64| left + plot_w * (nines(p) - x_lo) / (x_hi - x_lo);
    let (lo, hi) = (0.0_f64, 3.0_f64); // 1 ms .. 1000 ms
    let y =
        |d: f64| y0 + panel_h - panel_h * ((d.max(1.0).log10() - lo) / (hi - lo)).clamp(0.0, 1.0);
    let _ = writeln!(
        out,
        r#"<text x="{left}" y="{}" font-weight="bold">caller latency (ms, log scale) by percentile</text>"#,
        y0 - 10.0
    );
    for v in [1.0, 10.0, 100.0, 1000.0] {
        let yy = y(v);
        let _ = writeln!(
            out,
            r##"<line x1="{left}" y1="{yy}" x2="{}" y2="{yy}" stroke="#dee2e6"/><text x="{}" y="{}" text-anchor="end">{v:.0}</text>"##,
            w - right,
            left - 6.0,
            yy + 4.0
        );
    }
    for (p, label) in [
        (0.5, "p50"),
        (0.9, "p90"),
        (0.95, "p95"),
        (0.99, "p99"),
        (0.999, "p99.9"),
    ] {
        let xx = x(p);
        let _ = writeln!(
            out,
            r##"<line x1="{xx}" y1="{y0}" x2="{xx}" y2="{}" stroke="#dee2e6"/><text x="{xx}" y="{}" text-anchor="middle">{label}</text>"##,
            y0 + panel_h,
            y0 + panel_h + 16.0
        );
    }
    for (i, f) in tail.iter().enumerate() {
        let points: Vec<String> = (0..=200)
            .map(|k| {
                let p = 1.0 - 10f64.powf(-(x_lo + (x_hi - x_lo) * f64::from(k) / 200.0));
                format!("{:.1},{:.1}", x(p), y(ms(f.p(p))))
            })
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            COLORS[i % COLORS.len()],
            points.join(" ")
        );
        // The legend goes under the axis labels, where no curve runs.
        let lx = left + (i % 2) as f64 * 400.0;
        let ly = y0 + panel_h + 36.0 + (i / 2) as f64 * 16.0;
        let _ = writeln!(
            out,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="3"/><text x="{}" y="{}">{} ({:+.1}% calls)</text>"#,
            lx + 24.0,
            COLORS[i % COLORS.len()],
            lx + 30.0,
            ly + 4.0,
            f.name,
            f.extra() * 100.0
        );
    }

    // Panel 2: calls per second at the dependency under overload.
    let y0 = top + panel_h + gap;
    let secs = overload.iter().map(|f| f.per_sec.len()).max().unwrap_or(1) as f64;
    let x = |t: f64| left + plot_w * (t / secs);
    let max = overload
        .iter()
        .flat_map(|f| f.per_sec.iter().map(|(calls, _)| *calls as f64))
        .fold(args.overload_rate as f64 * 1.2, f64::max);
    let hi = nice(max);
    let y = |v: f64| y0 + panel_h - panel_h * (v / hi).clamp(0.0, 1.0);
    let _ = writeln!(
        out,
        r#"<text x="{left}" y="{}" font-weight="bold">overload: calls/s reaching the dependency ({} requests/s; saturated from {:.0} s)</text>"#,
        y0 - 10.0,
        args.overload_rate,
        args.healthy.as_secs_f64()
    );
    let sat = x(args.healthy.as_secs_f64());
    let _ = writeln!(
        out,
        r##"<rect x="{sat}" y="{y0}" width="{}" height="{panel_h}" fill="#adb5bd" fill-opacity="0.3"/>"##,
        left + plot_w - sat
    );
    for i in 0..=4 {
        let v = hi * f64::from(i) / 4.0;
        let yy = y(v);
        let _ = writeln!(
            out,
            r##"<line x1="{left}" y1="{yy}" x2="{}" y2="{yy}" stroke="#dee2e6"/><text x="{}" y="{}" text-anchor="end">{v:.0}</text>"##,
            w - right,
            left - 6.0,
            yy + 4.0
        );
    }
    for t in 0..=secs as usize {
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle">{t} s</text>"#,
            x(t as f64),
            y0 + panel_h + 16.0
        );
    }
    let rate_y = y(args.overload_rate as f64);
    let _ = writeln!(
        out,
        r##"<line x1="{left}" y1="{rate_y}" x2="{}" y2="{rate_y}" stroke="#212529" stroke-dasharray="4 4"/><text x="{}" y="{}" text-anchor="end">request rate</text>"##,
        w - right,
        w - right,
        rate_y - 4.0
    );
    for (i, f) in overload.iter().enumerate() {
        let color = [COLORS[0], COLORS[2], COLORS[3]][i % 3];
        let last = f.per_sec.len().saturating_sub(1);
        let points: Vec<String> = f.per_sec[..last]
            .iter()
            .enumerate()
            .map(|(s, (calls, _))| format!("{:.1},{:.1}", x(s as f64 + 0.5), y(*calls as f64)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            points.join(" ")
        );
        if let Some(open) = f.opened {
            let xx = x(open);
            let _ = writeln!(
                out,
                r#"<line x1="{xx}" y1="{y0}" x2="{xx}" y2="{}" stroke="{color}" stroke-dasharray="2 3"/><text x="{}" y="{}" fill="{color}">breaker opens</text>"#,
                y0 + panel_h,
                xx + 4.0,
                y0 + panel_h - 8.0
            );
        }
        let ly = y0 + 16.0 + i as f64 * 16.0;
        let _ = writeln!(
            out,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}">{} ({:+.1}% calls)</text>"#,
            left + 10.0,
            left + 34.0,
            left + 40.0,
            ly + 4.0,
            f.name,
            f.extra() * 100.0
        );
    }
    out.push_str("</svg>\n");
    out
}

/// A round upper bound for a linear axis.
fn nice(max: f64) -> f64 {
    let magnitude = 10f64.powf(max.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * magnitude >= max {
            return m * magnitude;
        }
    }
    10.0 * magnitude
}
