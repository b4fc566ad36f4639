//! The outage demo: a dependency first fails fast, then hangs, and two
//! callers at the same fixed request rate live through it, one with a
//! timeout and naive retries, one with the full stack.
//!
//! A local HTTP dependency on 127.0.0.1 answers in about 2 ms. Then it
//! answers a quarter of the calls `503` (every fourth call of each client,
//! as fast as a success) for one retry-budget window, then every call for
//! an open period (a second at least); it is healthy again for a few seconds, then *hangs*
//! every request (no answer at all, the failure that hurts most) and
//! recovers.
//! Open-loop load (new requests go out on schedule whatever is still
//! outstanding) is sent by two callers built on `reqwest`:
//!
//! - **bare**: a request timeout and up to 3 attempts, 50 ms apart;
//! - **full stack**: `ClientDeadline (the same timeout, for the whole call)
//!   -> Breaker -> Retry (10% budget) -> Bulkhead -> ClientDeadline (per
//!   attempt) -> reqwest`.
//!
//! The `503` phase is the retry budget's: a quarter of the calls failing is
//! below the breaker's threshold (half of its last 20 calls), so the
//! circuit stays closed, and only the budget stands between the failures
//! and a retry for each; then every call fails and the circuit opens. The
//! hang is the breaker's and the deadline's.
//!
//! It prints a live line per second, then a table per strategy (calls per
//! request while a quarter and while all calls fail, the load on the
//! dependency and the caller latency during the hang, peak in-flight calls,
//! calls rejected fast, time from recovery to 99% success) and writes an
//! SVG chart (default `target/outage.svg`). It exits non-zero if the full
//! stack sent more retries than its budget allows while a quarter of the
//! calls failed, did not open the circuit once every call failed, sent the
//! hanging dependency more than the request rate, took 1 ms or more (p99,
//! not counting time the OS kept its thread off a CPU core; 5 ms in a debug
//! build) to answer once the circuit was open, or did not let traffic back within one open
//! period plus a probe (plus a read of the shared circuit, for a fleet).
//!
//! With `--redis`, the full stack runs as a fleet: several caller
//! processes (this executable again, in a hidden child role), each with its
//! own `Breaker`, share one circuit through the tower-breaker-redis store; the
//! demo starts its own `redis-server` on 127.0.0.1 (see `outage_fleet.rs`)
//! and adds a fleet line: which process tripped, and how many failures the
//! others saw before they were rejecting too.
//!
//! With `--dynamodb`, the full stack runs in short-lived caller processes,
//! as AWS Lambda instances do: a few calling at any time, each making 5
//! calls and exiting, new ones taking over; their breakers share one
//! circuit through the tower-breaker-dynamodb store, on a `moto_server` the
//! demo starts on 127.0.0.1 (see `outage_lambda.rs`). No process makes
//! enough calls to open the circuit alone: the fleet's window in the table
//! opens it. It adds the fleet's lines (each process's calls, the probes)
//! and what DynamoDB was asked, per process. Each process's retry budget is
//! its own, and its floor (5 retries per second of its window) covers every
//! retry its 5 calls can make: while a quarter of the calls fail, only the
//! attempts limit bounds its retries, which the demo shows as it is.
//!
//! Run it with:
//!
//! ```text
//! cargo run --release -p examples --bin outage
//! cargo run --release -p examples --bin outage -- --rate 200 --timeout 2000 --outage-secs 15
//! cargo run --release -p examples --bin outage -- --redis --processes 4
//! cargo run -p examples --bin outage -- --quick      # a few seconds, for CI
//! cargo run -p examples --bin outage -- --quick --redis
//! cargo run -p examples --bin outage -- --quick --dynamodb
//! cargo run -p examples --bin outage -- --quick --metrics 127.0.0.1:9000
//! cargo run -p examples --bin outage -- --quick --faults
//! ```
//!
//! With `--faults`, the all-fail and hang phases come from a `tower-chaos`
//! fault layer in front of the dependency's handler (a plan of 503 for
//! every call, then one that hangs every call, switched at each phase's
//! start), a game day's way of making the same outage; the run must show
//! what it shows with the handler's own failures (CI runs both). The
//! quarter that fails first stays the handler's: every fourth call of each
//! client, which a random share cannot promise.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::get;
use axum::Router;
use http::StatusCode;
use tokio::time::{Instant, MissedTickBehavior};
use tower_breaker::error::CircuitOpen;
use tower_breaker::store::Store;
use tower_breaker::{Breaker, BreakerConfig, State as CircuitState, Transition};
use tower_breaker_redis::{RedisOptions, RedisStore};
use tower_bulkhead::error::BulkheadFull;
use tower_retry_budget::{
    RetryBudget, RetryLayer, DEFAULT_FLEET_FLOOR, DEFAULT_MIN_PER_SEC, DEFAULT_RATIO,
};
use tower_shield::reqwest::{Client, ReqwestService};
use tower_shield::stack::client_stack;

#[path = "../outage_fleet.rs"]
mod fleet;
#[path = "../outage_lambda.rs"]
mod lambda;
#[path = "../moto.rs"]
mod moto;

use fleet::FleetOutcome;

// ================================================================ settings

/// What the command line sets.
#[derive(Debug, Clone)]
struct Args {
    /// Requests per second, per caller.
    rate: u32,
    /// The caller's timeout: per attempt for the bare caller, for the whole
    /// call with the full stack.
    timeout: Duration,
    /// Length of the whole run.
    duration: Duration,
    /// Length of the hang.
    outage: Duration,
    /// The healthy time before the dependency starts failing fast.
    lead: Duration,
    /// The full stack's retry budget window (10% of the requests over it):
    /// also how long a quarter of the calls fail.
    budget_window: Duration,
    /// The breaker's first open period (doubles on re-opens, up to twice
    /// this).
    open_period: Duration,
    /// Where the chart goes.
    svg: PathBuf,
    /// `--redis` or `--dynamodb`: the full stack as a fleet of processes
    /// sharing one circuit.
    fleet: Option<FleetArgs>,
    /// `--quick`: the short run of CI.
    quick: bool,
    /// `--faults`: the dependency's all-fail and hang phases injected by
    /// `tower-chaos` instead of its handler.
    faults: bool,
}

/// What bounds the full stack's retries while a quarter of the calls fail.
#[derive(Debug, Clone)]
enum Budgets {
    /// Each caller's own budget, at these request rates.
    Own(Vec<f64>),
    /// One budget for the whole fleet, through its breakers' store, at this
    /// total request rate.
    Fleet(f64),
}

/// What `--redis`, `--redis-url`, `--dynamodb` and `--processes` set.
#[derive(Debug, Clone)]
struct FleetArgs {
    /// Where the fleet shares its circuit.
    store: FleetStore,
    /// A Redis to use instead of starting one (`--redis-url`).
    url: Option<String>,
    /// How many caller processes share the circuit (with `--dynamodb`: how
    /// many are calling at any time).
    processes: usize,
}

/// Where a fleet shares its circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FleetStore {
    /// Long-lived processes on Redis (`outage_fleet.rs`).
    Redis,
    /// Short-lived processes on DynamoDB (`outage_lambda.rs`).
    DynamoDb,
}

/// The rate of `--dynamodb` unless `--rate` says otherwise: every process
/// makes 5 calls, so this is 8 process starts a second.
const DYNAMODB_RATE: u32 = 40;

const USAGE: &str = "\
usage: outage [--rate N] [--timeout MS] [--duration SECS] [--outage-secs SECS]
              [--open-period MS] [--budget-window SECS] [--svg PATH] [--quick]
              [--redis [--redis-url URL] [--processes N]]
              [--dynamodb [--processes N]] [--metrics ADDR] [--faults]

  --rate N           requests per second sent by each caller (default 100)
  --timeout MS       the caller's timeout in milliseconds (default 1000)
  --duration SECS    length of the run (default: 8 s after the hang, 37 s
                     in all with the other defaults)
  --outage-secs SECS how long the dependency hangs (default 12)
  --open-period MS   the breaker's first open period (default 1000)
  --budget-window SECS
                     the retry budget's window, and how long a quarter of the
                     calls fail with 503 (default 10, the budget's default)
  --svg PATH         where to write the chart (default target/outage.svg)
  --quick            a short run of 13 s for CI (200/s, timeout 500 ms, open
                     period 500 ms, budget window 2 s, hang 3 s); flags
                     after it still apply
  --redis            run the full stack as a fleet of caller processes that
                     share one circuit through Redis (the tower-breaker-redis
                     store); starts its own redis-server on 127.0.0.1
  --redis-url URL    use this Redis instead of starting one (implies --redis)
  --dynamodb         run the full stack as short-lived caller processes (as
                     Lambda instances: each makes 5 calls and exits, new
                     ones take over) that share one circuit through
                     DynamoDB (the tower-breaker-dynamodb store); starts its
                     own moto_server on 127.0.0.1; the rate defaults to
                     40/s (both callers), --rate still applies
  --processes N      caller processes in the fleet (default 4, 2 to 16);
                     with --dynamodb, how many are calling at a time
  --metrics ADDR     serve the layers' metrics for Prometheus on
                     http://ADDR/metrics while the demo runs
  --faults           the dependency's all-fail and hang phases injected by a
                     tower-chaos fault layer (503 for every call, then a
                     hang), switched at run time, instead of its handler;
                     the run must show the same as with the handler";

impl Args {
    fn parse() -> Result<Self, String> {
        let mut args = Self {
            rate: 100,
            timeout: Duration::from_millis(1000),
            duration: Duration::ZERO,
            outage: Duration::from_secs(12),
            lead: Duration::from_secs(2),
            budget_window: tower_retry_budget::DEFAULT_WINDOW,
            open_period: Duration::from_millis(1000),
            svg: PathBuf::from("target/outage.svg"),
            fleet: None,
            quick: false,
            faults: false,
        };
        let (mut rate_given, mut redis, mut dynamodb) = (false, false, false);
        // The run lasts this long after the hang, unless --duration says.
        let mut tail = Duration::from_secs(8);
        let mut duration = None;
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "--rate" => {
                    args.rate = number(&value()?)?.max(1) as u32;
                    rate_given = true;
                }
                "--timeout" => args.timeout = Duration::from_millis(number(&value()?)?.max(1)),
                "--duration" => duration = Some(Duration::from_secs(number(&value()?)?)),
                "--outage-secs" => args.outage = Duration::from_secs(number(&value()?)?),
                "--open-period" => {
                    args.open_period = Duration::from_millis(number(&value()?)?.max(10));
                }
                "--budget-window" => {
                    args.budget_window = Duration::from_secs(number(&value()?)?.max(1));
                }
                "--svg" => args.svg = PathBuf::from(value()?),
                "--quick" => {
                    // A higher rate gives the p99 once the circuit is
                    // open a few hundred calls in a short hang.
                    args.rate = 200;
                    args.outage = Duration::from_secs(3);
                    args.timeout = Duration::from_millis(500);
                    args.open_period = Duration::from_millis(500);
                    // The 503 phase lasts one budget window: a short one.
                    args.lead = Duration::from_secs(1);
                    args.budget_window = Duration::from_secs(2);
                    tail = Duration::from_secs(3);
                    args.quick = true;
                }
                // The fleet: see `breaker_store` and `outage_fleet.rs`.
                "--redis" => {
                    args.fleet.get_or_insert_with(FleetArgs::default);
                    redis = true;
                }
                // The short-lived fleet: see `outage_lambda.rs`.
                "--dynamodb" => {
                    args.fleet.get_or_insert_with(FleetArgs::default).store = FleetStore::DynamoDb;
                    dynamodb = true;
                }
                "--redis-url" => {
                    let url = value()?;
                    if !url.starts_with("redis://") {
                        return Err(format!("--redis-url takes a redis:// URL, not {url}"));
                    }
                    args.fleet.get_or_insert_with(FleetArgs::default).url = Some(url);
                    redis = true;
                }
                "--processes" => {
                    let n = number(&value()?)?;
                    if !(2..=16).contains(&n) {
                        return Err("--processes takes 2 to 16".into());
                    }
                    args.fleet.get_or_insert_with(FleetArgs::default).processes = n as usize;
                }
                "--faults" => args.faults = true,
                // Read again by `serve_metrics`, in this process only.
                "--metrics" => drop(value()?),
                "-h" | "--help" => return Err(String::new()),
                other => return Err(format!("unknown argument {other}")),
            }
        }
        // Room after the hang for the recovery and a second of calls after
        // it, whatever the timeout and open period.
        let room = args.max_open() + args.timeout + Duration::from_millis(1300);
        let room = Duration::from_secs(room.as_secs_f64().ceil() as u64);
        args.duration = duration.unwrap_or(args.outage_end() + tail.max(room));
        if args.outage_end() + room > args.duration {
            return Err(format!(
                "the run must last at least {} s: {} s until the hang ends, then {} s to see the recovery",
                (args.outage_end() + room).as_secs(),
                args.outage_end().as_secs(),
                room.as_secs()
            ));
        }
        if redis && dynamodb {
            return Err("--redis (or --redis-url) and --dynamodb exclude each other".into());
        }
        if dynamodb && !rate_given {
            args.rate = DYNAMODB_RATE;
        }
        if let Some(fleet) = &args.fleet {
            if fleet.store == FleetStore::DynamoDb && args.rate < fleet.processes as u32 {
                return Err("--rate must be at least --processes with --dynamodb".into());
            }
            if fleet.store == FleetStore::Redis
                && f64::from(args.rate) < 2.0 * (fleet.processes as f64 + 2.0)
            {
                return Err("--rate is too low to split across the fleet's processes".into());
            }
        }
        Ok(args)
    }

    // The dependency's timeline (from the start of the run): healthy;
    // every fourth call answered 503 for one budget window; every call
    // answered 503 for an open period, or a second if that is longer (a
    // fleet on DynamoDB needs a few hundred milliseconds to open); healthy
    // until the circuit has surely closed again and a second more;
    // hanging; healthy.

    /// When a quarter of the calls start failing with 503.
    fn share_start(&self) -> Duration {
        self.lead
    }

    /// When every call starts failing with 503.
    fn share_end(&self) -> Duration {
        self.lead + self.budget_window
    }

    /// When the dependency stops failing fast.
    fn all_fail_end(&self) -> Duration {
        self.share_end() + self.open_period.max(Duration::from_secs(1))
    }

    /// When the dependency starts hanging: on a whole second, once the
    /// circuit opened by the 503s has closed (after at most a failed probe
    /// and the longest open period) and a healthy second has passed.
    fn outage_start(&self) -> Duration {
        let closed = self.all_fail_end() + self.max_open() + Duration::from_secs(1);
        Duration::from_secs(closed.as_secs_f64().ceil() as u64)
    }

    fn outage_end(&self) -> Duration {
        self.outage_start() + self.outage
    }

    /// The longest open period (with the breaker's ±10% jitter).
    fn max_open(&self) -> Duration {
        (self.open_period * 2).mul_f64(1.1)
    }
}

impl Default for FleetArgs {
    fn default() -> Self {
        Self {
            store: FleetStore::Redis,
            url: None,
            processes: 4,
        }
    }
}

fn number(s: &str) -> Result<u64, String> {
    s.parse().map_err(|_| format!("not a number: {s}"))
}

// === Shared breaker state ===
//
// By default each caller keeps its circuit in memory. With `--redis`, the
// full stack runs in several caller processes (see `outage_fleet.rs`), and
// each one's breaker shares the circuit through the Redis store: this is
// where a child process connects to it.

/// Where a breaker keeps its decision: `None` for its own memory (the
/// default), or the Redis at `url`, under the key prefix `prefix` (one per
/// run, so runs sharing a Redis never see each other's circuit).
async fn breaker_store(redis: Option<(&str, &str)>) -> Result<Option<Arc<dyn Store>>, String> {
    let Some((url, prefix)) = redis else {
        return Ok(None);
    };
    let options = RedisOptions::new()
        .prefix(prefix)
        .cleanup_after(Duration::from_secs(60));
    let store = RedisStore::connect(url, options)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Some(Arc::new(store)))
}

// ============================================================== dependency

/// What the dependency does at a moment of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Answers in about 2 ms.
    Healthy,
    /// Answers every fourth call of each client `503`, as fast as a
    /// success.
    Share,
    /// Answers every call `503`, as fast as a success.
    AllFail,
    /// Never answers.
    Hanging,
}

/// Every how many calls of a client the dependency fails in
/// [`Phase::Share`]: a quarter, spread evenly, so that any 20 calls in a
/// row hold 5 failures and the breaker (half of its last 20) stays closed
/// even when a burst of calls (a caller that stalled and catches up)
/// completes in another order than it arrived. (A third, tried first,
/// tripped the breaker in about one run in 15 on a loaded machine.)
const FAIL_EVERY: u64 = 4;

/// The dependency counts the calls it receives in slots of this length.
const SLOT: f64 = 0.1;

/// The dependency: healthy (2 ms), then failing fast with 503 (a quarter
/// of the calls, then all), healthy, hanging, then healthy again.
struct Dependency {
    start: Instant,
    /// A quarter of the calls fail from `.0` to `.1`, all from `.1` to `.2`.
    fail_fast: (Duration, Duration, Duration),
    outage: (Duration, Duration),
    /// Calls received per [`SLOT`] of the run, per caller.
    calls: [Vec<AtomicU64>; 2],
    /// Calls received in [`Phase::Share`], per caller and client (each
    /// process of a fleet is a client).
    seen: Mutex<HashMap<(usize, u32), u64>>,
    /// Requests it is hanging on right now, per caller, and the peak.
    hung: [AtomicI64; 2],
    hung_peak: [AtomicI64; 2],
    /// With `--faults`: the fault layer's switch.
    faults: Option<tower_shield::chaos::FaultHandle>,
}

impl Dependency {
    fn new(args: &Args, start: Instant) -> Self {
        let slots = (args.duration.as_secs_f64() / SLOT).ceil() as usize + 1;
        let zeros = || (0..slots).map(|_| AtomicU64::new(0)).collect();
        Self {
            start,
            fail_fast: (args.share_start(), args.share_end(), args.all_fail_end()),
            outage: (args.outage_start(), args.outage_end()),
            calls: [zeros(), zeros()],
            seen: Mutex::default(),
            hung: [AtomicI64::new(0), AtomicI64::new(0)],
            hung_peak: [AtomicI64::new(0), AtomicI64::new(0)],
            faults: args
                .faults
                .then(|| tower_shield::chaos::FaultHandle::new("outage-dependency")),
        }
    }

    fn phase(&self, t: Duration) -> Phase {
        let (share, all, healthy) = self.fail_fast;
        if t >= self.outage.0 && t < self.outage.1 {
            Phase::Hanging
        } else if t >= share && t < all {
            Phase::Share
        } else if t >= all && t < healthy {
            Phase::AllFail
        } else {
            Phase::Healthy
        }
    }

    fn count(&self, caller: usize, t: Duration) {
        let slot = (t.as_secs_f64() / SLOT) as usize;
        if let Some(slot) = self.calls[caller].get(slot) {
            slot.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Calls `caller` sent in `[from, to)` (seconds, to the slot).
    fn calls_between(&self, caller: usize, from: f64, to: f64) -> u64 {
        let slot = |t: f64| ((t / SLOT).round().max(0.0) as usize).min(self.calls[caller].len());
        self.calls[caller][slot(from)..slot(to)]
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// Calls `caller` sent in second `s` of the run.
    fn calls_in_second(&self, caller: usize, s: usize) -> u64 {
        self.calls_between(caller, s as f64, s as f64 + 1.0)
    }

    /// Whether this call of `client` is one of the quarter that fail.
    fn fails_share(&self, caller: usize, client: u32) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let n = seen.entry((caller, client)).or_insert(0);
        *n += 1;
        n.is_multiple_of(FAIL_EVERY)
    }
}

/// Decrements the hung gauge when a hanging handler is dropped (hyper drops
/// it when the caller gives up and closes the connection).
struct Hung<'a>(&'a AtomicI64);

impl Drop for Hung<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn handle(dep: Arc<Dependency>, caller: usize, client: u32) -> (StatusCode, &'static str) {
    let t = dep.start.elapsed();
    let mut answer = (StatusCode::OK, "ok");
    let phase = match dep.faults {
        // The fault layer counted the call (it may never reach here) and
        // injects the all-fail and hang phases; a call that reaches the
        // handler then is one the plan let through.
        Some(_) => match dep.phase(t) {
            Phase::Share => Phase::Share,
            _ => Phase::Healthy,
        },
        None => {
            dep.count(caller, t);
            dep.phase(t)
        }
    };
    match phase {
        Phase::Healthy => {}
        Phase::Share if !dep.fails_share(caller, client) => {}
        // Fails fast: a retryable answer, as fast as a success (a faster
        // one would overtake the successes sent just before it, and crowd
        // the breaker's window with failures).
        Phase::Share | Phase::AllFail => answer = (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
        Phase::Hanging => {
            let now = dep.hung[caller].fetch_add(1, Ordering::Relaxed) + 1;
            dep.hung_peak[caller].fetch_max(now, Ordering::Relaxed);
            let _hung = Hung(&dep.hung[caller]);
            // No answer, ever: only the caller's timeout ends this request.
            std::future::pending::<()>().await;
        }
    }
    tokio::time::sleep(Duration::from_millis(2)).await;
    answer
}

/// The dependency's listening socket, bound before anything else starts (the
/// fleet's processes need its address before the run's clock starts).
async fn bind_dependency() -> tokio::net::TcpListener {
    tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1")
}

fn serve_dependency(listener: tokio::net::TcpListener, dep: Arc<Dependency>) {
    let router = Router::new()
        .route(
            "/bare",
            get(|State(d): State<Arc<Dependency>>| handle(d, BARE, 0)),
        )
        .route(
            "/stack/{client}",
            get(
                |State(d): State<Arc<Dependency>>, Path(client): Path<u32>| {
                    handle(d, STACK, client)
                },
            ),
        )
        .with_state(dep.clone());
    let Some(faults) = dep.faults.clone() else {
        tokio::spawn(async move { axum::serve(listener, router).await });
        return;
    };
    // `--faults`: the fault layer answers for the handler in the all-fail
    // and hang phases; outside it, a middleware counts every call (and the
    // calls hanging) as the handler does without faults.
    switch_faults(dep.clone(), faults.clone());
    let app = router
        .layer(
            tower::ServiceBuilder::new()
                // An injected error (a hang past `max_hang`, say) as a 500.
                .layer(axum::error_handling::HandleErrorLayer::new(
                    |e: tower_breaker::BoxError| async move {
                        (StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
                    },
                ))
                .layer(tower_shield::chaos::FaultLayer::new(faults)),
        )
        .layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                let dep = dep.clone();
                async move {
                    let caller = if request.uri().path().starts_with("/bare") {
                        BARE
                    } else {
                        STACK
                    };
                    let t = dep.start.elapsed();
                    dep.count(caller, t);
                    let _hung = (dep.phase(t) == Phase::Hanging).then(|| {
                        let now = dep.hung[caller].fetch_add(1, Ordering::Relaxed) + 1;
                        dep.hung_peak[caller].fetch_max(now, Ordering::Relaxed);
                        Hung(&dep.hung[caller])
                    });
                    next.run(request).await
                }
            },
        ));
    tokio::spawn(async move { axum::serve(listener, app).await });
}

/// Sets the fault plan at each phase's start: every call answered 503
/// after the 2 ms a success takes, nothing, every call hung, nothing.
/// The quarter that fails before them stays the handler's: every fourth
/// call of each client, evenly, which a random share cannot promise (a
/// random 25% has runs of failures that trip the breaker's 50% of 20).
fn switch_faults(dep: Arc<Dependency>, faults: tower_shield::chaos::FaultHandle) {
    let (_, all_fail, healthy) = dep.fail_fast;
    let (hang, recovered) = dep.outage;
    let fail = tower_shield::chaos::FaultPlan::new()
        .latency(1.0, Duration::from_millis(2))
        .status(1.0, StatusCode::SERVICE_UNAVAILABLE);
    let hang_plan = tower_shield::chaos::FaultPlan::new().hang(1.0);
    tokio::spawn(async move {
        for (at, plan) in [
            (all_fail, Some(fail)),
            (healthy, None),
            (hang, Some(hang_plan)),
            (recovered, None),
        ] {
            tokio::time::sleep_until(dep.start + at).await;
            match plan {
                Some(plan) => faults.set(plan).expect("a valid plan"),
                None => faults.off(),
            }
        }
    });
}

// ================================================================= callers

const BARE: usize = 0;
const STACK: usize = 1;
const NAMES: [&str; 2] = ["bare", "full stack"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ok,
    Failed,
    /// Refused locally in microseconds: circuit open or compartment full.
    Rejected,
    /// Refused after waiting for the fleet's probe election: a call issued
    /// once the open period was over, which starts the election and waits
    /// for it (one store round trip) to learn whether it is the probe. Not
    /// an answer "at once": counted apart, as the probes are.
    Elected,
}

/// Whether a call issued now ends the open period of `breaker` (open, its
/// period over): with a store, it waits for the election it starts.
fn ends_open_period(breaker: &Breaker) -> bool {
    let s = breaker.snapshot();
    s.state == CircuitState::Open && s.retry_after == Some(Duration::ZERO)
}

/// `outcome`, as [`Outcome::Elected`] when the call was refused after
/// ending the open period (`ended`).
fn after_election(outcome: Outcome, ended: bool) -> Outcome {
    if ended && outcome == Outcome::Rejected {
        Outcome::Elected
    } else {
        outcome
    }
}

#[derive(Debug, Clone, Copy)]
struct Record {
    /// Seconds since the start when the request was issued.
    issued: f64,
    latency: Duration,
    /// The part of `latency` the caller's thread spent ready to run but
    /// waiting for a CPU core (see [`timed`]).
    core_wait: Duration,
    outcome: Outcome,
}

impl Record {
    /// The latency without the time the OS kept the thread off a core:
    /// what the call itself took.
    fn own(&self) -> Duration {
        self.latency.saturating_sub(self.core_wait)
    }
}

/// How long a call took.
#[derive(Debug, Clone, Copy, Default)]
struct Timing {
    latency: Duration,
    /// The part of it the thread spent waiting for a CPU core.
    core_wait: Duration,
}

/// Awaits `call` and times it.
///
/// On a 2-core machine shared with other processes (a fleet's, a
/// compiler's), a thread is sometimes preempted in the middle of a call
/// that takes a few microseconds, and waits a scheduler slice (about 1 to 4
/// ms) for a core: the call's latency then says more about the machine than
/// about the call. So when the call completes in one poll (an open
/// circuit's answer, say), it ran on one thread from start to end, and
/// Linux's per-thread scheduler statistics tell how long that thread was
/// runnable but off a core meanwhile: that is `core_wait`. For a call that
/// waited for the network (and may have moved between threads), or off
/// Linux, it is zero. (A preemption during the reading of the statistics
/// themselves, just outside the timed span, is counted too: rare, and
/// capped by the latency.)
async fn timed<T>(call: impl Future<Output = T>) -> (T, Timing) {
    let mut call = std::pin::pin!(call);
    let mut polls = 0u32;
    let before = core_wait_ns();
    let began = Instant::now();
    let out = std::future::poll_fn(|cx| {
        polls += 1;
        call.as_mut().poll(cx)
    })
    .await;
    let latency = began.elapsed();
    let core_wait = match (polls, before) {
        (1, Some(before)) => core_wait_ns().map_or(Duration::ZERO, |after| {
            Duration::from_nanos(after.saturating_sub(before)).min(latency)
        }),
        _ => Duration::ZERO,
    };
    (out, Timing { latency, core_wait })
}

/// Nanoseconds this thread has spent runnable but waiting for a CPU core
/// (the second field of `/proc/thread-self/schedstat`); `None` where that
/// is not known.
fn core_wait_ns() -> Option<u64> {
    use std::io::Read as _;
    let mut buf = [0u8; 96];
    let mut file = std::fs::File::open("/proc/thread-self/schedstat").ok()?;
    let n = file.read(&mut buf).ok()?;
    std::str::from_utf8(&buf[..n])
        .ok()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// What one caller saw.
struct Recorder {
    records: Mutex<Vec<Record>>,
    in_flight: AtomicI64,
    /// Peak in-flight calls per second of the run.
    peak: Vec<AtomicI64>,
    /// Completions per second of the run, and the successful ones.
    done: Vec<AtomicU64>,
    ok: Vec<AtomicU64>,
}

impl Recorder {
    fn new(secs: usize) -> Self {
        let zeros = |n| (0..n).map(|_| AtomicU64::new(0)).collect();
        Self {
            records: Mutex::new(Vec::new()),
            in_flight: AtomicI64::new(0),
            peak: (0..secs).map(|_| AtomicI64::new(0)).collect(),
            done: zeros(secs),
            ok: zeros(secs),
        }
    }

    fn begin(&self, sec: usize) {
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(slot) = self.peak.get(sec) {
            slot.fetch_max(now, Ordering::Relaxed);
        }
    }

    fn end(&self, start: Instant, issued: Instant, timing: Timing, outcome: Outcome) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        let sec = start.elapsed().as_secs() as usize;
        if let Some(slot) = self.done.get(sec) {
            slot.fetch_add(1, Ordering::Relaxed);
        }
        if outcome == Outcome::Ok {
            if let Some(slot) = self.ok.get(sec) {
                slot.fetch_add(1, Ordering::Relaxed);
            }
        }
        let record = Record {
            issued: (issued - start).as_secs_f64(),
            latency: timing.latency,
            core_wait: timing.core_wait,
            outcome,
        };
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(record);
    }
}

/// The bare caller: a timeout per attempt, and three attempts.
async fn bare_call(client: &reqwest::Client, url: &str) -> Outcome {
    for attempt in 1..=3 {
        if let Ok(response) = client.get(url).send().await {
            if response.status().is_success() && response.bytes().await.is_ok() {
                return Outcome::Ok;
            }
        }
        if attempt < 3 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Outcome::Failed
}

/// The full stack's caller: the same code a reqwest user writes, timed
/// (see [`timed`]). The flag says whether it was the open circuit that
/// rejected the call.
async fn stack_call(client: &Client, url: &str) -> (Outcome, bool, Timing) {
    let (result, timing) = timed(async {
        match client.get(url).send().await {
            Ok(response) if response.status().is_success() => match response.bytes().await {
                Ok(_) => Ok(()),
                Err(_) => Err(None),
            },
            Ok(_) => Err(None),
            Err(e) => Err(Some(e)),
        }
    })
    .await;
    let (outcome, open) = match result {
        Ok(()) => (Outcome::Ok, false),
        Err(Some(e)) if e.is::<CircuitOpen>() => (Outcome::Rejected, true),
        Err(Some(e)) if e.is::<BulkheadFull>() => (Outcome::Rejected, false),
        Err(_) => (Outcome::Failed, false),
    };
    (outcome, open, timing)
}

/// The full stack's URL on the dependency: each client (each process of a
/// fleet) has its own, so that the dependency fails every fourth call of
/// each in the 503 phase.
fn stack_url(dependency: SocketAddr, client: usize) -> String {
    format!("http://{dependency}/stack/{client}")
}

/// The retry budget of every full stack: 10% of the requests over the
/// window (with the library's floor of 5 retries per second of window).
fn retry_budget(args: &Args) -> RetryBudget {
    RetryBudget::new().window(args.budget_window)
}

/// How many retries the budgets of callers sending `rates` requests per
/// second allow over one window, all together, as the budget documents it:
/// each one `max(10% of its requests in the window, 5 per second of window)`
/// (the floor in whole retries).
fn budget_allowance(rates: &[f64], window: Duration) -> f64 {
    let w = window.as_secs_f64();
    let floor = (f64::from(DEFAULT_MIN_PER_SEC) * w).floor();
    rates
        .iter()
        .map(|rate| (DEFAULT_RATIO * rate * w).max(floor))
        .sum()
}

/// The bulkhead's size: a cap on attempts in flight to the dependency.
/// Normal use is the rate times ~2 ms (under one); 20 leaves room for
/// bursts, and is enough to fill the breaker's window with failures.
const BULKHEAD: usize = 20;

/// The full stack. Its retry budget counts time from now: build it when the
/// run's clock starts, so that the budget's buckets begin with the 503
/// phase (see [`budget_allowance`]).
fn full_stack(args: &Args, breaker: Breaker) -> Client {
    let retry = RetryLayer::new()
        .name("dependency")
        .budget(Arc::new(retry_budget(args)));
    let stack = client_stack("dependency")
        .breaker(breaker)
        .retry(retry)
        // The caller's whole budget, for all attempts together.
        .timeout(args.timeout)
        .concurrency(BULKHEAD);
    // reqwest's own retries off: every attempt is one the breaker counts.
    stack.reqwest(
        ReqwestService::client_builder()
            .connect_timeout(Duration::from_millis(100))
            .build()
            .expect("a reqwest client"),
    )
}

/// The breaker's window: the last 20 calls, judged once there are 10, open
/// at 50% failures. After healthy traffic, a caller must see 10 failures
/// before its own window trips.
const WINDOW: usize = 20;
const FAILURE_RATE: f64 = 0.5;
const FAILURES_TO_TRIP: u64 = 10;

/// The full stack's breaker settings, whatever keeps its state.
fn breaker_config(args: &Args) -> BreakerConfig {
    BreakerConfig::new()
        .count_window(WINDOW)
        .minimum_calls(10)
        .failure_rate(FAILURE_RATE)
        .open_period(args.open_period)
        .open_growth(2.0)
        .max_open_period(args.open_period * 2)
}

fn breaker(
    args: &Args,
    start: Instant,
    transitions: Arc<Mutex<Vec<(f64, CircuitState)>>>,
) -> Breaker {
    let config = breaker_config(args).listener(move |t: &Transition| {
        let at = (t.at.max(start) - start).as_secs_f64();
        transitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((at, t.to));
    });
    Breaker::with_config("dependency", config)
}

// ==================================================================== main

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = examples::demo::args_or_exit(Args::parse(), USAGE);
    // One caller process of a `--redis` fleet, started by the demo itself.
    if let Some(spec) = fleet::child_spec() {
        let code = match spec {
            Ok(spec) => fleet::run_child(&args, spec).await,
            Err(e) => {
                eprintln!("{e}");
                2
            }
        };
        std::process::exit(code);
    }
    // One caller process of a `--dynamodb` fleet.
    if let Some(spec) = lambda::child_spec() {
        let code = match spec {
            Ok(spec) => lambda::run_child(&args, spec).await,
            Err(e) => {
                eprintln!("{e}");
                2
            }
        };
        std::process::exit(code);
    }
    if let Err(e) = serve_metrics() {
        eprintln!("--metrics: {e}");
        std::process::exit(2);
    }
    let stalls = StallWatch::start();
    let mut code = run(args.clone()).await;
    if code == 1 && args.quick && stalls.longest() >= STALL {
        // A run whose verdict failed while the machine itself stopped
        // (a hypervisor's pause, a swap storm) measured the machine, not
        // the stack: the short run of CI gets one more, and says so.
        eprintln!(
            "\nThe machine stalled during this run ({}): running the demo once more.\n",
            stalls.summary()
        );
        stalls.reset();
        code = run(args).await;
    }
    if code != 0 {
        std::process::exit(code);
    }
}

/// A stall of the machine long enough to decide a verdict: a fifth of the
/// quick run's timeout, and 20 times the scheduler slices a busy 2-core
/// machine adds.
const STALL: Duration = Duration::from_millis(100);

/// The stall watch of this process, once started.
static STALLS: std::sync::OnceLock<StallWatch> = std::sync::OnceLock::new();

/// Watches for stalls of the whole machine: a plain thread (no runtime)
/// that sleeps 5 ms at a time and records how late it wakes, and the CPU
/// time the hypervisor took (`steal` in `/proc/stat`). A late wake-up of
/// a sleeping thread on an idle core is time the machine did not run at
/// all; the stack's verdicts are about timings, so a failure next to one
/// says so.
struct StallWatch {
    longest_ns: AtomicU64,
    total_ns: AtomicU64,
    steal_at_start: AtomicU64,
}

impl StallWatch {
    fn start() -> &'static StallWatch {
        let watch = STALLS.get_or_init(|| StallWatch {
            longest_ns: AtomicU64::new(0),
            total_ns: AtomicU64::new(0),
            steal_at_start: AtomicU64::new(steal_ms().unwrap_or(0)),
        });
        std::thread::spawn(move || {
            let nap = Duration::from_millis(5);
            loop {
                let before = tokio::time::Instant::now();
                std::thread::sleep(nap);
                let late = before.elapsed().saturating_sub(nap);
                // Timer slack and wake-up latency are well under 2 ms.
                if late > Duration::from_millis(2) {
                    let late = late.as_nanos() as u64;
                    watch.longest_ns.fetch_max(late, Ordering::Relaxed);
                    watch.total_ns.fetch_add(late, Ordering::Relaxed);
                }
            }
        });
        watch
    }

    fn reset(&self) {
        self.longest_ns.store(0, Ordering::Relaxed);
        self.total_ns.store(0, Ordering::Relaxed);
        self.steal_at_start
            .store(steal_ms().unwrap_or(0), Ordering::Relaxed);
    }

    fn longest(&self) -> Duration {
        Duration::from_nanos(self.longest_ns.load(Ordering::Relaxed))
    }

    fn summary(&self) -> String {
        let steal = steal_ms().map_or_else(
            || "unknown".to_owned(),
            |now| {
                format!(
                    "{} ms",
                    now.saturating_sub(self.steal_at_start.load(Ordering::Relaxed))
                )
            },
        );
        format!(
            "a thread sleeping 5 ms at a time woke up to {} late, {} late in all; CPU time taken \
             by the hypervisor: {steal}",
            ms(self.longest()),
            ms(Duration::from_nanos(self.total_ns.load(Ordering::Relaxed)))
        )
    }
}

/// The CPU time the hypervisor took from this machine since boot (the
/// `steal` column of `/proc/stat`'s `cpu` line, in ms), where known.
fn steal_ms() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let ticks: u64 = line.split_whitespace().nth(8)?.parse().ok()?;
    // USER_HZ is 100 on Linux.
    Some(ticks * 10)
}

/// `--metrics ADDR`: installs the Prometheus exporter, serving
/// `http://ADDR/metrics`, before any stack is built (the layers register
/// their metrics when they are built).
fn serve_metrics() -> Result<(), String> {
    let mut args = std::env::args().skip_while(|a| a != "--metrics").skip(1);
    let Some(addr) = args.next() else {
        return Ok(());
    };
    let addr: std::net::SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|e| e.to_string())?;
    println!("metrics: http://{addr}/metrics");
    Ok(())
}

/// A fleet of caller processes running the full stack.
#[derive(Debug)]
enum AnyFleet {
    /// `--redis`: long-lived processes.
    Redis(fleet::Fleet),
    /// `--dynamodb`: short-lived processes.
    DynamoDb(lambda::LambdaFleet),
}

impl AnyFleet {
    /// Starts its store and, with Redis, its processes; the exit code when
    /// it cannot run (0: skipped, `moto_server` is not installed).
    async fn start(
        args: &Args,
        fleet_args: &FleetArgs,
        dependency: SocketAddr,
    ) -> Result<Self, i32> {
        let started = match fleet_args.store {
            FleetStore::Redis => fleet::Fleet::start(args, fleet_args, dependency)
                .await
                .map(Self::Redis),
            FleetStore::DynamoDb => {
                let moto = match moto::MotoServer::start_or_skip("outage --dynamodb").await {
                    Ok(moto::Started::Running(moto)) => moto,
                    Ok(moto::Started::Skipped(code)) => return Err(code),
                    Err(e) => {
                        eprintln!("outage --dynamodb: {e}");
                        return Err(2);
                    }
                };
                lambda::LambdaFleet::start(args, fleet_args, dependency, moto)
                    .await
                    .map(Self::DynamoDb)
            }
        };
        started.map_err(|e| {
            eprintln!("outage {}: {e}", Self::flag(fleet_args.store));
            2
        })
    }

    fn flag(store: FleetStore) -> &'static str {
        match store {
            FleetStore::Redis => "--redis",
            FleetStore::DynamoDb => "--dynamodb",
        }
    }

    fn describe(&self, args: &Args) -> String {
        match self {
            Self::Redis(fleet) => fleet.describe(),
            Self::DynamoDb(fleet) => fleet.describe(args),
        }
    }

    /// Starts the run's clock for the processes.
    fn go(&mut self, args: &Args) -> Result<(), String> {
        match self {
            Self::Redis(fleet) => fleet.go(),
            Self::DynamoDb(fleet) => {
                fleet.go(args);
                Ok(())
            }
        }
    }

    async fn second(&self, s: usize) -> fleet::FleetSecond {
        match self {
            Self::Redis(fleet) => fleet.second(s).await,
            Self::DynamoDb(fleet) => fleet.second(s).await,
        }
    }

    async fn finish(&mut self, args: &Args) -> Result<Box<dyn FleetOutcome>, String> {
        Ok(match self {
            Self::Redis(fleet) => Box::new(fleet.finish(args).await?),
            Self::DynamoDb(fleet) => Box::new(fleet.finish(args).await?),
        })
    }
}

/// The demo; returns the exit code once everything it started (the fleet's
/// processes, redis-server or moto_server) is stopped.
async fn run(args: Args) -> i32 {
    let secs = args.duration.as_secs() as usize + 1;
    let (out_start, out_end) = (args.outage_start(), args.outage_end());
    let listener = bind_dependency().await;
    let addr = listener.local_addr().expect("local address");
    // With `--redis`: Redis and the caller processes, ready before the
    // clock starts; with `--dynamodb`: moto and the table (the processes
    // start on a timetable once the clock runs).
    let mut fleet = match &args.fleet {
        None => None,
        Some(fleet_args) => match AnyFleet::start(&args, fleet_args, addr).await {
            Ok(fleet) => Some(fleet),
            Err(code) => return code,
        },
    };
    let flag = args.fleet.as_ref().map_or("", |f| AnyFleet::flag(f.store));

    println!(
        "A dependency on {addr} answers in ~2 ms; it answers 503 (as fast) to every fourth call of \
         each client from {:.1} s to {:.1} s (one budget window) and to every call until {:.1} s \
         (one open period, or a second); it hangs from {:.1} s to {:.1} s, then recovers.",
        args.share_start().as_secs_f64(),
        args.share_end().as_secs_f64(),
        args.all_fail_end().as_secs_f64(),
        out_start.as_secs_f64(),
        out_end.as_secs_f64()
    );
    println!(
        "Two callers send {} requests/s each for {} s, timeout {} ms:",
        args.rate,
        args.duration.as_secs(),
        args.timeout.as_millis()
    );
    println!("  bare:       reqwest with the timeout per attempt, 3 attempts 50 ms apart");
    let window = match &fleet {
        Some(AnyFleet::DynamoDb(_)) => "the last 1 s, 10 calls",
        _ => "20 calls",
    };
    println!(
        "  full stack: deadline {} ms -> breaker ({window}, 50%, open {} ms, up to {} ms) \
         -> retry (3 attempts, budget: 10% of the requests over {} s, at least {} retries/s) \
         -> bulkhead ({BULKHEAD}) -> per-attempt deadline",
        args.timeout.as_millis(),
        args.open_period.as_millis(),
        (args.open_period * 2).as_millis(),
        args.budget_window.as_secs(),
        DEFAULT_MIN_PER_SEC
    );
    match &fleet {
        None => println!("  breaker state: in memory (the default)\n"),
        Some(fleet) => println!("{}\n", fleet.describe(&args)),
    }

    if let Some(fleet) = &mut fleet {
        if let Err(e) = fleet.go(&args) {
            eprintln!("outage {flag}: {e}");
            return 1;
        }
    }
    let start = Instant::now();
    let dep = Arc::new(Dependency::new(&args, start));
    serve_dependency(listener, dep.clone());

    let transitions = Arc::new(Mutex::new(Vec::new()));
    // The full stack in this process, unless the fleet's processes run it.
    let local = fleet.is_none().then(|| {
        let breaker = breaker(&args, start, transitions.clone());
        let stack = full_stack(&args, breaker.clone());
        (breaker, stack)
    });
    let bare = reqwest::Client::builder()
        .timeout(args.timeout)
        .connect_timeout(Duration::from_millis(100))
        .build()
        .expect("a reqwest client");
    let mut recorders = [Arc::new(Recorder::new(secs)), Arc::new(Recorder::new(secs))];

    // The load: open loop, one request per caller per tick.
    let load = {
        let recorders = recorders.clone();
        let duration = args.duration;
        let period = Duration::from_secs_f64(1.0 / f64::from(args.rate));
        let urls = [format!("http://{addr}/bare"), stack_url(addr, 0)];
        let stack = local.as_ref().map(|(_, stack)| stack.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            // A stall of this process (a busy machine) skips the ticks it
            // missed: sent at once, they would be a burst the bulkhead
            // rightly refuses, which the recovery check would read as the
            // circuit not recovered ("recovery never" under load).
            tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
            loop {
                let now = tick.tick().await;
                if now - start >= duration {
                    break;
                }
                let sec = (now - start).as_secs() as usize;
                for caller in [BARE, STACK] {
                    // The fleet's processes send the full stack's requests.
                    if caller == STACK && stack.is_none() {
                        continue;
                    }
                    let rec = recorders[caller].clone();
                    let url = urls[caller].clone();
                    let (bare, stack) = (bare.clone(), stack.clone());
                    rec.begin(sec);
                    tokio::spawn(async move {
                        let issued = Instant::now();
                        let (outcome, timing) = match &stack {
                            Some(stack) if caller == STACK => {
                                let (outcome, _, timing) = stack_call(stack, &url).await;
                                (outcome, timing)
                            }
                            _ => {
                                let outcome = bare_call(&bare, &url).await;
                                let latency = issued.elapsed();
                                (
                                    outcome,
                                    Timing {
                                        latency,
                                        ..Timing::default()
                                    },
                                )
                            }
                        };
                        rec.end(start, issued, timing, outcome);
                    });
                }
            }
        })
    };

    // A live line per second.
    let mut second =
        tokio::time::interval_at(start + Duration::from_secs(1), Duration::from_secs(1));
    for s in 0..args.duration.as_secs() as usize {
        second.tick().await;
        let fleet_second = match &fleet {
            Some(fleet) => Some(fleet.second(s).await),
            None => None,
        };
        let phase = match dep.phase(Duration::from_secs(s as u64)) {
            Phase::Healthy if (s as f64) < out_start.as_secs_f64() => "healthy",
            Phase::Healthy => "recovered",
            Phase::Share => "503 1/4",
            Phase::AllFail => "503 all",
            Phase::Hanging => "HANGING",
        };
        let mut line = format!("t={:>3}s {phase:<9}", s + 1);
        for caller in [BARE, STACK] {
            let (done, ok, in_flight) = match &fleet_second {
                Some(f) if caller == STACK => (f.done, f.ok, f.in_flight),
                _ => {
                    let rec = &recorders[caller];
                    (
                        rec.done[s].load(Ordering::Relaxed),
                        rec.ok[s].load(Ordering::Relaxed),
                        rec.in_flight.load(Ordering::Relaxed),
                    )
                }
            };
            let _ = write!(
                line,
                " | {}: {:>4} dep calls, {:>4} in flight, {:>3}% ok",
                NAMES[caller],
                dep.calls_in_second(caller, s),
                in_flight,
                (ok * 100).checked_div(done).unwrap_or(0)
            );
        }
        match (&local, &fleet_second) {
            (Some((breaker, _)), _) => {
                let _ = write!(line, ", circuit {:?}", breaker.snapshot().state);
            }
            (None, Some(f)) => {
                let _ = write!(line, ", circuits {}", f.circuits);
            }
            (None, None) => {}
        }
        println!("{line}");
    }
    let _ = load.await;
    // Let the last calls finish (the bare caller may need 3 timeouts).
    let wait_until = Instant::now() + args.timeout * 4;
    while Instant::now() < wait_until
        && recorders
            .iter()
            .any(|r| r.in_flight.load(Ordering::Relaxed) > 0)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The full stack's figures: this process's breaker, or the fleet's.
    let (side, opened, rejected, fleet_outcome) = match (&local, &mut fleet) {
        (Some((breaker, _)), _) => {
            let snap = breaker.snapshot();
            let transitions = transitions
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            let side = StackSide {
                open_in_force: open_period_in_force(&transitions, out_end.as_secs_f64()),
                transitions,
                open_everywhere: None,
                probes: None,
                budgets: Budgets::Own(vec![f64::from(args.rate)]),
                learn: (Duration::ZERO, String::new()),
                call_interval: Duration::from_secs_f64(1.0 / f64::from(args.rate)),
            };
            (side, snap.totals.opened, snap.totals.rejected, None)
        }
        (None, Some(fleet)) => match fleet.finish(&args).await {
            Ok(outcome) => {
                recorders[STACK] = Arc::new(outcome.recorder(secs));
                let side = StackSide {
                    transitions: outcome.transitions(),
                    open_everywhere: outcome.open_everywhere(),
                    probes: Some(
                        outcome.probes_sent(out_start.as_secs_f64(), out_end.as_secs_f64()),
                    ),
                    open_in_force: outcome.open_period_in_force(),
                    budgets: outcome.budgets(),
                    learn: outcome.learns_within(),
                    call_interval: outcome.call_interval(),
                };
                (side, outcome.opened(), outcome.rejected(), Some(outcome))
            }
            Err(e) => {
                eprintln!("NOT DEMONSTRATED: the fleet did not report: {e}");
                return 1;
            }
        },
        (None, None) => unreachable!("the full stack runs here or in the fleet"),
    };
    drop(fleet); // stops the processes and redis-server or moto_server

    let report = Report::new(&args, &dep, &recorders, side);
    report.print(
        &args,
        opened,
        rejected,
        fleet_outcome.as_ref().map(|outcome| outcome.processes()),
    );
    if let Some(outcome) = &fleet_outcome {
        outcome.print(&args);
    }
    match report.chart(&args) {
        Ok(()) => println!("\nChart written to {}", args.svg.display()),
        Err(e) => eprintln!("\ncould not write the chart to {}: {e}", args.svg.display()),
    }
    let mut failures = report.verdict(&args);
    if let Some(outcome) = &fleet_outcome {
        failures.extend(outcome.verdict());
    }
    if failures.is_empty() {
        println!(
            "\nThe full stack held: its retries within the budget while a quarter of the calls \
             failed, the circuit open once they all did; no load multiplication in the hang, \
             answers under {} once open ({BUILD}), recovery within one open period plus a \
             probe.",
            ms(OPEN_P99)
        );
        if let Some(outcome) = &fleet_outcome {
            println!("{}", outcome.held());
        }
        0
    } else {
        for f in &failures {
            eprintln!("NOT DEMONSTRATED: {f}");
        }
        if let Some(stalls) = STALLS.get() {
            eprintln!("Meanwhile, the machine: {}.", stalls.summary());
        }
        1
    }
}

// ================================================================== report

/// What the report needs of the full stack's circuit and callers, whether
/// it ran here or in a fleet.
#[derive(Debug)]
struct StackSide {
    /// The circuit over time: (at, open or closed); a fleet's is open while
    /// any process's circuit is not closed.
    transitions: Vec<(f64, CircuitState)>,
    /// A fleet's: when, in the hang, every process's circuit had opened.
    open_everywhere: Option<f64>,
    /// A fleet's: how many probes its breakers sent in the hang (one per
    /// half-open, for the one breaker here: read from `transitions`).
    probes: Option<usize>,
    /// How long the circuit stayed open the last time before it closed
    /// after the hang, if known.
    open_in_force: Option<f64>,
    /// What bounds the full stack's retries.
    budgets: Budgets,
    /// How late, at most, a caller learns that the circuit closed (a
    /// fleet's refresh interval and store round trips), and why.
    learn: (Duration, String),
    /// The longest time between two calls of one caller: the probe goes
    /// out with the next call after the open period.
    call_interval: Duration,
}

/// The open period that ended last before the circuit closed after
/// `after`: from the last opening before that close to the next change
/// (half-open, for a breaker that probes).
fn open_period_in_force(transitions: &[(f64, CircuitState)], after: f64) -> Option<f64> {
    let close = transitions
        .iter()
        .position(|&(at, to)| at >= after && to == CircuitState::Closed)?;
    let open = transitions[..close]
        .iter()
        .rposition(|&(_, to)| to == CircuitState::Open)?;
    Some(transitions[open + 1].0 - transitions[open].0)
}

/// The slack of the recovery's bound: the recovery is found on a 100 ms
/// grid of 1 s windows (100 ms), and the probe's outcome goes through a few
/// tasks and timers (tokio's timers tick in milliseconds) and, in a fleet,
/// Redis (50 ms).
const RECOVERY_SLACK: Duration = Duration::from_millis(150);

/// The slack of the budget's bound on calls per request while a quarter of
/// the calls fail: the dependency counts calls in 100 ms slots, so a first
/// attempt sent just before the phase may be counted in it; and the
/// budget's buckets start when the caller's clock does, which in a fleet's
/// process is a few milliseconds after the dependency's (its `go` travels
/// through a pipe), so the bucket that holds the phase's first
/// milliseconds leaves the window before the phase ends, and gives back the
/// retries made in them. Measured: 0 to 4 retries more than the allowance
/// of 50 (quick, 4 processes), 0.01 of a call per request; 0.02 leaves
/// room.
const BUDGET_SLACK: f64 = 0.02;

/// Once the circuit is open, calls must be answered (p99, without the time
/// the OS kept the thread off a core) in less than this: 1 ms in a release
/// build.
///
/// A debug build (CI runs the short demo in one) takes about 30 times as
/// long for the same answer, measured on a 2-core machine: 0.03 ms p99 in
/// release, 0.15 ms typical and 0.4 to 1.0 ms at p99 in debug, nearly all
/// of it reqwest's and `url`'s request building, unoptimized. Its bound is
/// 5 ms: still far below anything that waited for the dependency (the
/// timeout, 500 ms) or for the store (a round trip, 1 to 40 ms), which is
/// what the check is there to catch.
const OPEN_P99: Duration = if cfg!(debug_assertions) {
    Duration::from_millis(5)
} else {
    Duration::from_millis(1)
};

/// The build `OPEN_P99` is for, as the table says it.
const BUILD: &str = if cfg!(debug_assertions) {
    "debug build"
} else {
    "release build"
};

/// Calls, requests and successes of one caller over a phase.
#[derive(Debug, Default, Clone, Copy)]
struct Load {
    /// Requests issued in the phase.
    requests: usize,
    /// Calls the dependency received in the phase.
    calls: u64,
    /// Requests that succeeded.
    ok: usize,
}

impl Load {
    fn new(dep: &Dependency, caller: usize, records: &[Record], from: f64, to: f64) -> Self {
        let issued = || records.iter().filter(|r| r.issued >= from && r.issued < to);
        Self {
            requests: issued().count(),
            calls: dep.calls_between(caller, from, to),
            ok: issued().filter(|r| r.outcome == Outcome::Ok).count(),
        }
    }

    fn per_request(&self) -> f64 {
        self.calls as f64 / self.requests.max(1) as f64
    }

    fn ok_share(&self) -> f64 {
        self.ok as f64 / self.requests.max(1) as f64
    }
}

/// The figures of one caller.
#[derive(Debug, Default, Clone)]
struct Figures {
    requests: usize,
    dep_calls: u64,
    /// While a quarter of the calls failed (until the full stack's circuit
    /// opened, if it did).
    share: Load,
    /// While every call failed.
    all_fail: Load,
    /// Calls per second in the second before the hang, and in the hang.
    dep_rate_before: f64,
    dep_rate_outage: f64,
    p50_outage: Duration,
    p99_outage: Duration,
    /// The calls issued once the circuit was open (everywhere, for a
    /// fleet) until the hang ended, but for the full stack's probes: how
    /// many, their p99, and their p99 without the time the OS kept the
    /// caller's thread off a core.
    open_calls: usize,
    p99_open: Duration,
    p99_open_own: Duration,
    /// Of those, the calls that waited for a core, and the longest wait.
    waited: usize,
    max_wait: Duration,
    /// The calls issued in that span that went to the dependency: the
    /// probes.
    through: usize,
    /// The calls refused after waiting for the fleet's probe election (they
    /// ended an open period), and the longest of them.
    elected: usize,
    elected_max: Duration,
    /// Peaks in the hang.
    peak_in_flight: i64,
    /// Most requests the dependency held hanging at once.
    peak_hung: i64,
    /// Requests issued in the hang that were rejected fast, or failed.
    rejected: usize,
    failed: usize,
    /// From the recovery to 99% success, for good; `None` if never.
    recovery: Option<Duration>,
    /// Per second: dependency calls, caller p99 (ms) and peak in flight.
    series: Vec<(u64, f64, i64)>,
}

struct Report {
    figures: [Figures; 2],
    side: StackSide,
    /// The full stack's circuit's first opening while a quarter of the calls
    /// failed (it should not open), once they all failed, and in the hang.
    share_open: Option<f64>,
    all_fail_open: Option<f64>,
    first_open: Option<f64>,
    /// Where the "once open" span starts.
    open_from: f64,
    /// When the last of the full stack's calls issued in that span ended:
    /// a call issued just before the hang's end may be admitted (as a
    /// probe) just after it, so its probe is looked for up to here.
    calls_ended: f64,
    /// The phases: a quarter failing, all failing (to their ends), the hang.
    share: (f64, f64),
    all_fail: (f64, f64),
    out: (f64, f64),
    end: f64,
}

fn rate_change(f: &Figures) -> String {
    format!(
        "{:.0} -> {:.0} ({:.2}x)",
        f.dep_rate_before,
        f.dep_rate_outage,
        f.dep_rate_outage / f.dep_rate_before.max(1.0)
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64) * p).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn latencies(records: &[Record], from: f64, to: f64) -> Vec<Duration> {
    sorted(records, from, to, |r| r.latency)
}

fn sorted(
    records: &[Record],
    from: f64,
    to: f64,
    what: impl Fn(&Record) -> Duration,
) -> Vec<Duration> {
    let mut v: Vec<Duration> = records
        .iter()
        .filter(|r| r.issued >= from && r.issued < to)
        .map(what)
        .collect();
    v.sort();
    v
}

/// The first moment after `from` from which every 1 s window of issued
/// requests (sliding by 100 ms, up to `end`) has at least 99% successes.
fn recovery(records: &[Record], from: f64, end: f64) -> Option<Duration> {
    let mut starts = Vec::new();
    let mut s = from;
    while s + 1.0 <= end + 1e-9 {
        starts.push(s);
        s += 0.1;
    }
    let good = |w: f64| {
        let (mut n, mut ok) = (0usize, 0usize);
        for r in records
            .iter()
            .filter(|r| r.issued >= w && r.issued < w + 1.0)
        {
            n += 1;
            ok += usize::from(r.outcome == Outcome::Ok);
        }
        n > 0 && ok * 100 >= n * 99
    };
    let verdicts: Vec<bool> = starts.iter().map(|&w| good(w)).collect();
    let last_bad = verdicts.iter().rposition(|ok| !ok);
    let first_good = match last_bad {
        None => 0,
        Some(i) if i + 1 < starts.len() => i + 1,
        Some(_) => return None,
    };
    Some(Duration::from_secs_f64(starts[first_good] - from))
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{ms:.0} ms")
    }
}

impl Report {
    fn new(args: &Args, dep: &Dependency, recorders: &[Arc<Recorder>; 2], side: StackSide) -> Self {
        let secs = |d: Duration| d.as_secs_f64();
        let share = (secs(args.share_start()), secs(args.share_end()));
        let all_fail = (share.1, secs(args.all_fail_end()));
        let out = (secs(args.outage_start()), secs(args.outage_end()));
        let end = args.duration.as_secs_f64();
        let opening = |from: f64, to: f64| {
            side.transitions
                .iter()
                .find(|(at, to_state)| *to_state == CircuitState::Open && *at >= from && *at < to)
                .map(|(at, _)| *at)
        };
        let share_open = opening(share.0, share.1);
        // Once every call fails, the circuit must open before they stop.
        let all_fail_open = opening(all_fail.0, all_fail.1);
        let first_open = opening(out.0, out.1);
        // A fleet is open once every process is (each learns it on its own
        // read); a single breaker, from its first opening.
        let open_from = side.open_everywhere.or(first_open).unwrap_or(out.1);
        let figures = [BARE, STACK].map(|caller| {
            let rec = &recorders[caller];
            let records = rec.records.lock().unwrap_or_else(PoisonError::into_inner);
            let during = latencies(&records, out.0, out.1);
            // The full stack's calls the open circuit answered; its probes
            // apart. The bare caller has no circuit: all its calls.
            let answered: Vec<Record> = records
                .iter()
                .filter(|r| r.issued >= open_from && r.issued < out.1)
                .filter(|r| caller == BARE || r.outcome == Outcome::Rejected)
                .copied()
                .collect();
            let elected: Vec<&Record> = records
                .iter()
                .filter(|r| r.issued >= open_from && r.issued < out.1)
                .filter(|r| r.outcome == Outcome::Elected)
                .collect();
            let through = records
                .iter()
                .filter(|r| r.issued >= open_from && r.issued < out.1)
                .count()
                - answered.len()
                - elected.len();
            let open = sorted(&answered, 0.0, end, |r| r.latency);
            let own = sorted(&answered, 0.0, end, Record::own);
            let hang_secs = out.0 as usize..(out.1.ceil() as usize).min(rec.peak.len());
            let in_hang = || {
                records
                    .iter()
                    .filter(|r| r.issued >= out.0 && r.issued < out.1)
            };
            let series = (0..args.duration.as_secs() as usize)
                .map(|s| {
                    let l = latencies(&records, s as f64, s as f64 + 1.0);
                    (
                        dep.calls_in_second(caller, s),
                        percentile(&l, 0.99).as_secs_f64() * 1000.0,
                        rec.peak[s].load(Ordering::Relaxed),
                    )
                })
                .collect();
            Figures {
                requests: records.len(),
                dep_calls: dep.calls_between(caller, 0.0, end + 1.0),
                share: Load::new(
                    dep,
                    caller,
                    &records,
                    share.0,
                    share_open.unwrap_or(share.1),
                ),
                all_fail: Load::new(dep, caller, &records, all_fail.0, all_fail.1),
                dep_rate_before: dep.calls_between(caller, out.0 - 1.0, out.0) as f64,
                dep_rate_outage: dep.calls_between(caller, out.0, out.1) as f64
                    / (out.1 - out.0).max(1.0),
                p50_outage: percentile(&during, 0.5),
                p99_outage: percentile(&during, 0.99),
                open_calls: answered.len(),
                p99_open: percentile(&open, 0.99),
                p99_open_own: percentile(&own, 0.99),
                waited: answered
                    .iter()
                    .filter(|r| r.core_wait > Duration::ZERO)
                    .count(),
                max_wait: answered
                    .iter()
                    .map(|r| r.core_wait)
                    .max()
                    .unwrap_or_default(),
                through,
                elected: elected.len(),
                elected_max: elected.iter().map(|r| r.latency).max().unwrap_or_default(),
                peak_in_flight: rec.peak[hang_secs]
                    .iter()
                    .map(|p| p.load(Ordering::Relaxed))
                    .max()
                    .unwrap_or(0),
                peak_hung: dep.hung_peak[caller].load(Ordering::Relaxed),
                rejected: in_hang()
                    .filter(|r| matches!(r.outcome, Outcome::Rejected | Outcome::Elected))
                    .count(),
                failed: in_hang().filter(|r| r.outcome == Outcome::Failed).count(),
                recovery: recovery(&records, out.1, end),
                series,
            }
        });
        let calls_ended = recorders[STACK]
            .records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|r| r.issued >= open_from && r.issued < out.1)
            .map(|r| r.issued + r.latency.as_secs_f64())
            .fold(out.1, f64::max);
        Self {
            figures,
            side,
            share_open,
            all_fail_open,
            first_open,
            open_from,
            calls_ended,
            share,
            all_fail,
            out,
            end,
        }
    }

    /// How many retries per request the full stack's budgets allow while
    /// a quarter of the calls fail (one budget window), and how that is
    /// derived.
    fn budget_bound(&self, args: &Args) -> (f64, String) {
        let requests = self.figures[STACK].share.requests.max(1) as f64;
        let window = args.budget_window;
        match &self.side.budgets {
            Budgets::Own(rates) => {
                let allowance = budget_allowance(rates, window);
                let floor = f64::from(DEFAULT_MIN_PER_SEC) * window.as_secs_f64();
                let how = if rates.len() == 1 {
                    format!(
                        "its budget allows max(10% of the {:.0} requests of its {} s window, \
                         {floor:.0}) = {allowance:.0} retries",
                        rates[0] * window.as_secs_f64(),
                        window.as_secs()
                    )
                } else {
                    let each: Vec<String> = rates
                        .iter()
                        .map(|r| {
                            format!(
                                "{:.0}",
                                (DEFAULT_RATIO * r * window.as_secs_f64()).max(floor)
                            )
                        })
                        .collect();
                    format!(
                        "each process's budget allows max(10% of its requests in its {} s \
                         window, {floor:.0}): {} = {allowance:.0} retries in all (the floor is \
                         the budget's documented minimum, for quiet callers)",
                        window.as_secs(),
                        each.join(" + ")
                    )
                };
                (1.0 + allowance / requests, how)
            }
            Budgets::Fleet(rate) => {
                // The fleet's budget slides over the store's epochs: a
                // retry in the phase may also spend the credit of the
                // healthy requests of the window before it.
                let w = window.as_secs_f64();
                let before = rate * self.share.0.min(w);
                let floor = DEFAULT_FLEET_FLOOR as f64;
                let allowance = (DEFAULT_RATIO * (requests + before)).max(floor);
                (
                    1.0 + allowance / requests,
                    format!(
                        "one budget for the whole fleet, shared through the store: at most 10% \
                         of the fleet's requests in a sliding {} s window (or a fleet-wide \
                         floor of {floor:.0}), which during the phase may still hold the {before:.0} \
                         healthy requests before it: 10% of {requests:.0} + {before:.0} = \
                         {allowance:.1} retries",
                        window.as_secs()
                    ),
                )
            }
        }
    }

    /// The most the recovery may take, and how that is derived: one open
    /// period (the one in force, if known; else the longest), one probe
    /// (bounded by the timeout), one read of the shared circuit (a fleet's
    /// refresh interval) and [`RECOVERY_SLACK`].
    fn recovery_bound(&self, args: &Args) -> (Duration, String) {
        let (open, which) = match self.side.open_in_force {
            Some(open) => (
                Duration::from_secs_f64(open).min(args.max_open()),
                "the open period in force when the hang ended",
            ),
            None => (args.max_open(), "the longest open period"),
        };
        let (learn, why) = &self.side.learn;
        let wait = self.side.call_interval;
        let bound = open + wait + args.timeout + *learn + RECOVERY_SLACK;
        let refresh = if learn.is_zero() {
            String::new()
        } else {
            format!(" + {} ms ({why})", learn.as_millis())
        };
        let how = format!(
            "{:.2} s = {:.2} s ({which}) + {} ms (the probe leaves with the prober's next \
             request) + {} ms (the probe, at most the timeout){refresh} + {} ms of slack (the \
             recovery is found on a 100 ms grid; timers)",
            bound.as_secs_f64(),
            open.as_secs_f64(),
            wait.as_millis(),
            args.timeout.as_millis(),
            RECOVERY_SLACK.as_millis()
        );
        (bound, how)
    }

    /// How many probes the full stack's circuit sent for the calls issued
    /// from `open_from` to the hang's end: its half-open transitions from
    /// `open_from` until the last of those calls ended (a call issued a
    /// moment before the hang's end can become a probe a moment after it,
    /// which a count up to the hang's end would miss, while counting the
    /// call as let through).
    fn probes(&self) -> usize {
        self.side.probes.unwrap_or_else(|| {
            self.side
                .transitions
                .iter()
                .filter(|(at, to)| {
                    *to == CircuitState::HalfOpen && *at >= self.open_from && *at < self.calls_ended
                })
                .count()
        })
    }

    /// `opened` and `rejected` are the breaker's totals (summed over the
    /// fleet's `processes`, if any).
    fn print(&self, args: &Args, opened: u64, rejected: u64, processes: Option<usize>) {
        let [b, s] = &self.figures;
        let (budget, budget_how) = self.budget_bound(args);
        let (recovery_bound, recovery_how) = self.recovery_bound(args);
        let share_to = self.share_open.unwrap_or(self.share.1);
        let times = |x: f64| format!("{x:.2}x");
        let percent = |x: f64| format!("{:.0}%", x * 100.0);
        let head = |what: String| (format!("**{what}**"), String::new(), String::new());
        let rows: Vec<(String, String, String)> = vec![
            (
                "requests sent (whole run)".into(),
                b.requests.to_string(),
                s.requests.to_string(),
            ),
            (
                "calls that reached the dependency (whole run)".into(),
                b.dep_calls.to_string(),
                s.dep_calls.to_string(),
            ),
            head(format!(
                "503 to every fourth call, {:.0} s to {share_to:.0} s",
                self.share.0
            )),
            (
                format!("calls per request (the budget allows {budget:.2}x)"),
                times(b.share.per_request()),
                times(s.share.per_request()),
            ),
            (
                "requests that succeeded".into(),
                percent(b.share.ok_share()),
                percent(s.share.ok_share()),
            ),
            head(format!(
                "503 to every call, {:.1} s to {:.1} s",
                self.all_fail.0, self.all_fail.1
            )),
            (
                "calls per request".into(),
                times(b.all_fail.per_request()),
                times(s.all_fail.per_request()),
            ),
            (
                "circuit opened after".into(),
                "-".into(),
                self.all_fail_open.map_or("never".into(), |at| {
                    format!("{:.0} ms", (at - self.all_fail.0) * 1000.0)
                }),
            ),
            head(format!("hang, {:.0} s to {:.0} s", self.out.0, self.out.1)),
            (
                "dependency calls/s: before -> during".into(),
                rate_change(b),
                rate_change(s),
            ),
            (
                "caller latency: p50 / p99".into(),
                format!("{} / {}", ms(b.p50_outage), ms(b.p99_outage)),
                format!("{} / {}", ms(s.p50_outage), ms(s.p99_outage)),
            ),
            (
                "caller p99 once the circuit is open".into(),
                ms(b.p99_open),
                ms(s.p99_open),
            ),
            (
                format!(
                    "the same, without waits for a CPU core (must be < {}, {BUILD})",
                    ms(OPEN_P99)
                ),
                "-".into(),
                ms(s.p99_open_own),
            ),
            (
                "peak calls in flight at the caller".into(),
                b.peak_in_flight.to_string(),
                s.peak_in_flight.to_string(),
            ),
            (
                "peak requests hanging at the dependency".into(),
                b.peak_hung.to_string(),
                s.peak_hung.to_string(),
            ),
            (
                "calls rejected fast".into(),
                b.rejected.to_string(),
                s.rejected.to_string(),
            ),
            (
                "calls failed (timeouts)".into(),
                b.failed.to_string(),
                s.failed.to_string(),
            ),
            (
                format!(
                    "recovery to 99% success (must be <= {:.2} s)",
                    recovery_bound.as_secs_f64()
                ),
                b.recovery
                    .map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64())),
                s.recovery
                    .map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64())),
            ),
        ];
        println!(
            "\nRate {}/s per caller; timeout {} ms; open period {} ms; retry budget window {} s.",
            args.rate,
            args.timeout.as_millis(),
            args.open_period.as_millis(),
            args.budget_window.as_secs()
        );
        println!();
        println!("| | bare (timeout + 3 attempts) | full stack |");
        println!("|---|---:|---:|");
        for (what, bare, stack) in rows {
            println!("| {what} | {bare} | {stack} |");
        }

        let breaker = match self.share_open {
            None => {
                "the circuit stayed closed (it opens when half of the calls in its window fail)"
                    .to_owned()
            }
            Some(at) => format!("the circuit opened at {at:.2} s (the figures stop there)"),
        };
        let retries = s.share.calls.saturating_sub(s.share.requests as u64);
        println!(
            "\nWhile a quarter of the calls failed, {breaker}: the retry budget held the \
             load. The bare caller retries every failure, up to 3 attempts ({:.2} calls per \
             request); the full stack sent {} calls for {} requests, {retries} retries: \
             {budget_how}, so at most {budget:.2} calls per request (checked with \
             {BUDGET_SLACK} of slack: the dependency counts calls in 100 ms slots, and a \
             fleet process's budget starts a few ms after the dependency's clock). The \
             price: fewer failures rescued by a retry ({} of the requests succeeded, {} for \
             the bare caller).",
            b.share.per_request(),
            s.share.calls,
            s.share.requests,
            percent(s.share.ok_share()),
            percent(b.share.ok_share()),
        );
        let first_open = self
            .first_open
            .map_or("never".into(), |t| format!("{:.2} s", t - self.out.0));
        match processes {
            None => println!(
                "The circuit first opened {first_open} after the dependency started hanging; it \
                 opened {opened} times in the run and rejected {rejected} calls."
            ),
            Some(n) => println!(
                "The fleet's circuit first opened {first_open} after the dependency started \
                 hanging; the breakers of its {n} processes opened {opened} times in the run and \
                 rejected {rejected} calls (the full stack's column sums the {n} processes; its \
                 peak in flight sums each one's peak per second)."
            ),
        }
        println!(
            "Once the circuit was open (from {:.2} s to the end of the hang), it answered {} \
             calls itself and let {} through as probes ({} probe(s) sent; each waits for the \
             dependency, at most the timeout, and is not in the p99). p99 of the answered: {} as \
             measured, {} without waits for a CPU core: {} of them waited (at most {}) while the \
             OS ran another thread (on this {}-core machine: the bare caller's, the \
             dependency's{}; from /proc/thread-self/schedstat).{}",
            self.open_from,
            s.open_calls,
            s.through,
            self.probes(),
            ms(s.p99_open),
            ms(s.p99_open_own),
            s.waited,
            ms(s.max_wait),
            std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            if processes.is_some() {
                ", the other caller processes'"
            } else {
                ""
            },
            if s.elected > 0 {
                format!(
                    " Apart from those, {} call(s) ended an open period and were refused after \
                     waiting for the fleet's probe election they started (one store round trip, \
                     at most the election timeout; the longest {}): the winner's such call is \
                     the probe.",
                    s.elected,
                    ms(s.elected_max)
                )
            } else {
                String::new()
            }
        );
        println!("Recovery bound: {recovery_how}.");
        println!(
            "\"recovery\": from the end of the hang until every 1 s window of requests is at \
             least 99% successful."
        );
    }

    /// What must be true of the full stack; empty when it all held.
    fn verdict(&self, args: &Args) -> Vec<String> {
        let [b, s] = &self.figures;
        let mut failures = Vec::new();
        // A quarter of the calls failing: the budget, not the breaker.
        if let Some(at) = self.share_open {
            failures.push(format!(
                "the circuit opened at {at:.2} s while only a quarter of the calls failed: the \
                 breaker, not the retry budget, held the load"
            ));
        }
        let (budget, _) = self.budget_bound(args);
        if s.share.per_request() > budget + BUDGET_SLACK {
            failures.push(format!(
                "while a quarter of the calls failed the full stack sent {:.3} calls per request, \
                 more than its retry budget allows ({budget:.3}, +{BUDGET_SLACK})",
                s.share.per_request()
            ));
        }
        if b.share.per_request() <= s.share.per_request() {
            failures.push(
                "while a quarter of the calls failed the bare caller sent no more calls per \
                 request than the full stack"
                    .to_owned(),
            );
        }
        if self.all_fail_open.is_none() {
            failures.push("the circuit did not open while every call failed".to_owned());
        }
        // The hang: the breaker and the deadline.
        if self.first_open.is_none() {
            failures.push("the circuit never opened in the hang".to_owned());
        }
        if s.dep_rate_outage > s.dep_rate_before * 1.1 {
            failures.push(format!(
                "the dependency saw {:.0} calls/s in the hang, more than the {:.0}/s before",
                s.dep_rate_outage, s.dep_rate_before
            ));
        }
        if s.p99_open_own >= OPEN_P99 {
            failures.push(format!(
                "p99 once open was {} without waits for a CPU core ({} as measured), not under {}",
                ms(s.p99_open_own),
                ms(s.p99_open),
                ms(OPEN_P99)
            ));
        }
        let election_bound =
            tower_breaker::config::DEFAULT_ELECTION_TIMEOUT + Duration::from_millis(100);
        if s.elected_max > election_bound {
            failures.push(format!(
                "a call that ended an open period waited {} for the fleet's election, more than {}",
                ms(s.elected_max),
                ms(election_bound)
            ));
        }
        if s.through > self.probes() {
            failures.push(format!(
                "{} calls went to the dependency once the circuit was open, more than its {} \
                 probe(s)",
                s.through,
                self.probes()
            ));
        }
        let (bound, _) = self.recovery_bound(args);
        match s.recovery {
            Some(d) if d <= bound => {}
            other => failures.push(format!(
                "recovery took {other:?}, more than one open period plus a probe ({bound:?})"
            )),
        }
        if b.dep_rate_outage < s.dep_rate_outage {
            failures.push("the bare caller sent fewer calls than the full stack".to_owned());
        }
        failures
    }

    /// Writes the chart: three panels over time, one line per caller.
    fn chart(&self, args: &Args) -> std::io::Result<()> {
        let svg = svg(self, args, &self.side.transitions);
        if let Some(dir) = args.svg.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir)?;
            }
        }
        std::fs::write(&args.svg, svg)
    }
}

// ===================================================================== svg

const COLORS: [&str; 2] = ["#d9480f", "#1971c2"];

/// The chart, written by hand: no plotting or font dependencies.
fn svg(report: &Report, args: &Args, transitions: &[(f64, CircuitState)]) -> String {
    let (w, left, right, panel_h, gap, top) = (960.0, 80.0, 20.0, 170.0, 60.0, 70.0);
    let plot_w = w - left - right;
    let h = top + 3.0 * (panel_h + gap) + 10.0;
    let end = report.end;
    let x = |t: f64| left + plot_w * (t / end);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{left}" y="24" font-size="16" font-weight="bold">A dependency fails fast with 503, then hangs for {:.0} s: {} requests/s, timeout {} ms</text>"#,
        report.out.1 - report.out.0,
        args.rate,
        args.timeout.as_millis()
    );
    for (i, name) in [
        "bare: timeout + 3 attempts",
        "full stack: deadline, breaker, retry budget, bulkhead",
    ]
    .iter()
    .enumerate()
    {
        let lx = left + i as f64 * 260.0;
        let _ = writeln!(
            out,
            r#"<line x1="{lx}" y1="44" x2="{}" y2="44" stroke="{}" stroke-width="3"/><text x="{}" y="48">{name}</text>"#,
            lx + 24.0,
            COLORS[i],
            lx + 30.0
        );
    }
    let _ = writeln!(
        out,
        r##"<rect x="{}" y="36" width="14" height="12" fill="#f08c00" fill-opacity="0.2"/><text x="{}" y="48">503s (1/4, all)</text>"##,
        left + 640.0,
        left + 658.0
    );
    let _ = writeln!(
        out,
        r##"<rect x="{}" y="36" width="14" height="12" fill="#adb5bd" fill-opacity="0.35"/><text x="{}" y="48">hanging</text>"##,
        left + 770.0,
        left + 788.0
    );

    let panels: [(&str, bool); 3] = [
        ("calls/s reaching the dependency", false),
        ("caller p99 latency (ms, log scale), by second issued", true),
        ("calls in flight at the caller (peak per second)", false),
    ];
    for (p, (title, log)) in panels.iter().enumerate() {
        let y0 = top + p as f64 * (panel_h + gap);
        let value = |f: &Figures, s: usize| -> f64 {
            let (calls, p99, peak) = f.series[s];
            match p {
                0 => calls as f64,
                1 => p99,
                _ => peak as f64,
            }
        };
        let max = report
            .figures
            .iter()
            .flat_map(|f| (0..f.series.len()).map(move |s| value(f, s)))
            .fold(1.0_f64, f64::max);
        // Linear panels start at zero; the log panel spans 0.01 ms .. max.
        let (lo, hi) = if *log {
            (-2.0, max.log10().ceil().max(1.0))
        } else {
            (0.0, nice(max))
        };
        let y = |v: f64| {
            let v = if *log { v.max(0.01).log10() } else { v };
            y0 + panel_h - panel_h * ((v - lo) / (hi - lo)).clamp(0.0, 1.0)
        };
        let _ = writeln!(
            out,
            r##"<rect x="{}" y="{y0}" width="{}" height="{panel_h}" fill="#f08c00" fill-opacity="0.12"/><rect x="{}" y="{y0}" width="{}" height="{panel_h}" fill="#f08c00" fill-opacity="0.28"/>"##,
            x(report.share.0),
            x(report.share.1) - x(report.share.0),
            x(report.all_fail.0),
            x(report.all_fail.1) - x(report.all_fail.0)
        );
        let _ = writeln!(
            out,
            r##"<rect x="{}" y="{y0}" width="{}" height="{panel_h}" fill="#adb5bd" fill-opacity="0.35"/>"##,
            x(report.out.0),
            x(report.out.1) - x(report.out.0)
        );
        // The full stack's circuit: open stretches as a band under the title.
        let mut open_at: Option<f64> = None;
        for &(at, to) in transitions {
            match (open_at, to) {
                (None, CircuitState::Open) => open_at = Some(at),
                (Some(from), CircuitState::Closed) => {
                    band(&mut out, x(from), x(at), y0);
                    open_at = None;
                }
                _ => {}
            }
        }
        if let Some(from) = open_at {
            band(&mut out, x(from), x(end), y0);
        }
        let _ = writeln!(
            out,
            r##"<text x="{left}" y="{}" font-weight="bold">{title}</text><text x="{}" y="{}" text-anchor="end" fill="#1971c2">band: circuit not closed</text>"##,
            y0 - 8.0,
            w - right,
            y0 - 8.0
        );
        // Axes and grid.
        let ticks: Vec<f64> = if *log {
            (lo as i32..=hi as i32).map(|e| 10f64.powi(e)).collect()
        } else {
            (0..=4).map(|i| hi * f64::from(i) / 4.0).collect()
        };
        for v in ticks {
            let yy = y(v);
            let label = if v < 1.0 {
                format!("{v}")
            } else {
                format!("{v:.0}")
            };
            let _ = writeln!(
                out,
                r##"<line x1="{left}" y1="{yy}" x2="{}" y2="{yy}" stroke="#dee2e6"/><text x="{}" y="{}" text-anchor="end">{label}</text>"##,
                w - right,
                left - 6.0,
                yy + 4.0
            );
        }
        let _ = writeln!(
            out,
            r##"<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="#495057"/>"##,
            y0 + panel_h,
            w - right,
            y0 + panel_h
        );
        let step = if end > 20.0 { 5 } else { 1 };
        for t in (0..=end as usize).step_by(step) {
            let _ = writeln!(
                out,
                r#"<text x="{}" y="{}" text-anchor="middle">{t} s</text>"#,
                x(t as f64),
                y0 + panel_h + 16.0
            );
        }
        for (i, f) in report.figures.iter().enumerate() {
            let points: Vec<String> = (0..f.series.len())
                .map(|s| format!("{:.1},{:.1}", x(s as f64 + 0.5), y(value(f, s))))
                .collect();
            let _ = writeln!(
                out,
                r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
                COLORS[i],
                points.join(" ")
            );
        }
    }
    out.push_str("</svg>\n");
    out
}

fn band(out: &mut String, x1: f64, x2: f64, y0: f64) {
    let _ = writeln!(
        out,
        r##"<rect x="{x1:.1}" y="{}" width="{:.1}" height="4" fill="#1971c2" fill-opacity="0.6"/>"##,
        y0 - 4.0,
        (x2 - x1).max(1.0)
    );
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
