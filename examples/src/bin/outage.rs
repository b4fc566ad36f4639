//! The outage demo: a dependency hangs for a while, and two callers at the
//! same fixed request rate live through it, one with a timeout and naive
//! retries, one with the full stack.
//!
//! A local HTTP dependency on 127.0.0.1 answers in about 2 ms, then for a
//! window *hangs* every request (no answer at all, the realistic failure),
//! then recovers. Open-loop load (new requests go out on schedule whatever
//! is still outstanding) is sent by two callers built on `reqwest`:
//!
//! - **bare**: a request timeout and up to 3 attempts, 50 ms apart;
//! - **full stack**: `ClientDeadline (the same timeout, for the whole call)
//!   -> Breaker -> Retry (10% budget) -> Bulkhead -> ClientDeadline (per
//!   attempt) -> reqwest`.
//!
//! It prints a live line per second, then a table per strategy (requests,
//! calls that reached the dependency, the amplification, caller latency
//! during the outage, peak in-flight calls, calls rejected fast, time from
//! recovery to 99% success) and writes an SVG chart (default
//! `target/outage.svg`). It exits non-zero if the full stack did not keep
//! the dependency's load at or below the request rate, did not answer in
//! well under the timeout once the circuit was open, or did not let
//! traffic back within one open period plus a probe.
//!
//! With `--redis`, the full stack runs as a fleet: several caller
//! processes (this executable again, in a hidden child role), each with its
//! own `Breaker`, share one circuit through tower-breaker's Redis store; the
//! demo starts its own `redis-server` on 127.0.0.1 (see `outage_fleet.rs`)
//! and adds a fleet line: which process tripped, and how many failures the
//! others saw before they were rejecting too.
//!
//! With `--dynamodb`, the full stack runs in short-lived caller processes,
//! as AWS Lambda instances do: a few calling at any time, each making 5
//! calls and exiting, new ones taking over; their breakers share one
//! circuit through tower-breaker's DynamoDB store, on a `moto_server` the
//! demo starts on 127.0.0.1 (see `outage_lambda.rs`). No process makes
//! enough calls to open the circuit alone: the fleet's window in the table
//! opens it. It adds the fleet's lines (each process's calls, the probes)
//! and what DynamoDB was asked, per process.
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
//! ```

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use axum::Router;
use tokio::time::{Instant, MissedTickBehavior};
use tower_breaker::error::CircuitOpen;
use tower_breaker::redis_store::{RedisOptions, RedisStore};
use tower_breaker::reqwest::Client;
use tower_breaker::stack::client_stack;
use tower_breaker::store::Store;
use tower_breaker::{Breaker, BreakerConfig, State as CircuitState, Transition};
use tower_bulkhead::error::BulkheadFull;

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
    /// Length of the outage.
    outage: Duration,
    /// The breaker's first open period (doubles on re-opens, up to twice
    /// this).
    open_period: Duration,
    /// Where the chart goes.
    svg: PathBuf,
    /// `--redis` or `--dynamodb`: the full stack as a fleet of processes
    /// sharing one circuit.
    fleet: Option<FleetArgs>,
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
              [--open-period MS] [--svg PATH] [--quick]
              [--redis [--redis-url URL] [--processes N]]
              [--dynamodb [--processes N]] [--metrics ADDR]

  --rate N           requests per second sent by each caller (default 100)
  --timeout MS       the caller's timeout in milliseconds (default 1000)
  --duration SECS    length of the run (default 30)
  --outage-secs SECS how long the dependency hangs (default 12)
  --open-period MS   the breaker's first open period (default 1000)
  --svg PATH         where to write the chart (default target/outage.svg)
  --quick            a short run of 8 s for CI (200/s, timeout 500 ms, open
                     period 500 ms, outage 3 s); flags after it still apply
  --redis            run the full stack as a fleet of caller processes that
                     share one circuit through Redis (tower-breaker's Redis
                     store); starts its own redis-server on 127.0.0.1
  --redis-url URL    use this Redis instead of starting one (implies --redis)
  --dynamodb         run the full stack as short-lived caller processes (as
                     Lambda instances: each makes 5 calls and exits, new
                     ones take over) that share one circuit through
                     DynamoDB (tower-breaker's DynamoDB store); starts its
                     own moto_server on 127.0.0.1; the rate defaults to
                     40/s (both callers), --rate still applies
  --processes N      caller processes in the fleet (default 4, 2 to 16);
                     with --dynamodb, how many are calling at a time
  --metrics ADDR     serve the layers' metrics for Prometheus on
                     http://ADDR/metrics while the demo runs";

impl Args {
    fn parse() -> Result<Self, String> {
        let mut args = Self {
            rate: 100,
            timeout: Duration::from_millis(1000),
            duration: Duration::from_secs(30),
            outage: Duration::from_secs(12),
            open_period: Duration::from_millis(1000),
            svg: PathBuf::from("target/outage.svg"),
            fleet: None,
        };
        let (mut rate_given, mut redis, mut dynamodb) = (false, false, false);
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "--rate" => {
                    args.rate = number(&value()?)?.max(1) as u32;
                    rate_given = true;
                }
                "--timeout" => args.timeout = Duration::from_millis(number(&value()?)?.max(1)),
                "--duration" => args.duration = Duration::from_secs(number(&value()?)?.max(2)),
                "--outage-secs" => args.outage = Duration::from_secs(number(&value()?)?),
                "--open-period" => {
                    args.open_period = Duration::from_millis(number(&value()?)?.max(10));
                }
                "--svg" => args.svg = PathBuf::from(value()?),
                "--quick" => {
                    // A higher rate keeps the few probes of a short
                    // outage well under 1% of the calls made while open.
                    args.rate = 200;
                    args.duration = Duration::from_secs(8);
                    args.outage = Duration::from_secs(3);
                    args.timeout = Duration::from_millis(500);
                    args.open_period = Duration::from_millis(500);
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
                // Read again by `serve_metrics`, in this process only.
                "--metrics" => drop(value()?),
                "-h" | "--help" => return Err(String::new()),
                other => return Err(format!("unknown argument {other}")),
            }
        }
        if args.outage + Duration::from_secs(2) > args.duration {
            return Err("the outage must end at least 2 s before the run does".into());
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

    /// When the dependency starts hanging: 40% of the healthy time is
    /// before the outage, 60% after it.
    fn outage_start(&self) -> Duration {
        Duration::from_secs(((self.duration - self.outage).as_secs_f64() * 0.4).round() as u64)
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

/// The dependency: healthy (2 ms), then hanging, then healthy again.
struct Dependency {
    start: Instant,
    outage: (Duration, Duration),
    /// Calls received per second of the run, per caller.
    calls: [Vec<AtomicU64>; 2],
    /// Requests it is hanging on right now, per caller, and the peak.
    hung: [AtomicI64; 2],
    hung_peak: [AtomicI64; 2],
}

impl Dependency {
    fn in_outage(&self) -> bool {
        let t = self.start.elapsed();
        t >= self.outage.0 && t < self.outage.1
    }

    fn count(&self, caller: usize) {
        let sec = self.start.elapsed().as_secs() as usize;
        if let Some(slot) = self.calls[caller].get(sec) {
            slot.fetch_add(1, Ordering::Relaxed);
        }
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

async fn handle(dep: Arc<Dependency>, caller: usize) -> &'static str {
    dep.count(caller);
    if dep.in_outage() {
        let now = dep.hung[caller].fetch_add(1, Ordering::Relaxed) + 1;
        dep.hung_peak[caller].fetch_max(now, Ordering::Relaxed);
        let _hung = Hung(&dep.hung[caller]);
        // No answer, ever: only the caller's timeout ends this request.
        std::future::pending::<()>().await;
    }
    tokio::time::sleep(Duration::from_millis(2)).await;
    "ok"
}

/// The dependency's listening socket, bound before anything else starts (the
/// fleet's processes need its address before the run's clock starts).
async fn bind_dependency() -> tokio::net::TcpListener {
    tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1")
}

fn serve_dependency(listener: tokio::net::TcpListener, dep: Arc<Dependency>) {
    let app = Router::new()
        .route(
            "/bare",
            get(|State(d): State<Arc<Dependency>>| handle(d, BARE)),
        )
        .route(
            "/stack",
            get(|State(d): State<Arc<Dependency>>| handle(d, STACK)),
        )
        .with_state(dep);
    tokio::spawn(async move { axum::serve(listener, app).await });
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
}

#[derive(Debug, Clone, Copy)]
struct Record {
    /// Seconds since the start when the request was issued.
    issued: f64,
    latency: Duration,
    outcome: Outcome,
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

    fn end(&self, start: Instant, issued: Instant, outcome: Outcome) {
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
            latency: issued.elapsed(),
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

/// The full stack's caller: the same code a reqwest user writes. The flag
/// says whether it was the open circuit that rejected the call.
async fn stack_call(client: &Client, url: &str) -> (Outcome, bool) {
    match client.get(url).send().await {
        Ok(response) if response.status().is_success() => match response.bytes().await {
            Ok(_) => (Outcome::Ok, false),
            Err(_) => (Outcome::Failed, false),
        },
        Ok(_) => (Outcome::Failed, false),
        Err(e) if e.is::<CircuitOpen>() => (Outcome::Rejected, true),
        Err(e) if e.is::<BulkheadFull>() => (Outcome::Rejected, false),
        Err(_) => (Outcome::Failed, false),
    }
}

/// The bulkhead's size: a cap on attempts in flight to the dependency.
/// Normal use is the rate times ~2 ms (under one); 20 leaves room for
/// bursts, and is enough to fill the breaker's window with failures.
const BULKHEAD: usize = 20;

fn full_stack(args: &Args, breaker: Breaker) -> Client {
    let stack = client_stack("dependency")
        .breaker(breaker)
        // The caller's whole budget, for all attempts together.
        .timeout(args.timeout)
        .concurrency(BULKHEAD);
    stack.reqwest(
        reqwest::Client::builder()
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
    let args = match Args::parse() {
        Ok(args) => args,
        Err(message) if message.is_empty() => {
            println!("{USAGE}");
            return;
        }
        Err(message) => {
            eprintln!("{message}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
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
    let code = run(args).await;
    if code != 0 {
        std::process::exit(code);
    }
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
        "A dependency on {addr} answers in ~2 ms, hangs from {:.1} s to {:.1} s, then recovers.",
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
         -> retry (10% budget) -> bulkhead ({BULKHEAD}) -> per-attempt deadline",
        args.timeout.as_millis(),
        args.open_period.as_millis(),
        (args.open_period * 2).as_millis()
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
    let dep = Arc::new(Dependency {
        start,
        outage: (out_start, out_end),
        calls: [
            (0..secs).map(|_| AtomicU64::new(0)).collect(),
            (0..secs).map(|_| AtomicU64::new(0)).collect(),
        ],
        hung: [AtomicI64::new(0), AtomicI64::new(0)],
        hung_peak: [AtomicI64::new(0), AtomicI64::new(0)],
    });
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
        let urls = [
            format!("http://{addr}/bare"),
            format!("http://{addr}/stack"),
        ];
        let stack = local.as_ref().map(|(_, stack)| stack.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
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
                        let outcome = match &stack {
                            Some(stack) if caller == STACK => stack_call(stack, &url).await.0,
                            _ => bare_call(&bare, &url).await,
                        };
                        rec.end(start, issued, outcome);
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
        let phase = if (s as f64) < out_start.as_secs_f64() {
            "healthy"
        } else if (s as f64) < out_end.as_secs_f64() {
            "HANGING"
        } else {
            "recovered"
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
                dep.calls[caller][s].load(Ordering::Relaxed),
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
    let (transitions, open_everywhere, opened, rejected, fleet_outcome) = match (&local, &mut fleet)
    {
        (Some((breaker, _)), _) => {
            let snap = breaker.snapshot();
            let transitions = transitions
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            (
                transitions,
                None,
                snap.totals.opened,
                snap.totals.rejected,
                None,
            )
        }
        (None, Some(fleet)) => match fleet.finish(&args).await {
            Ok(outcome) => {
                recorders[STACK] = Arc::new(outcome.recorder(secs));
                (
                    outcome.transitions(),
                    outcome.open_everywhere(),
                    outcome.opened(),
                    outcome.rejected(),
                    Some(outcome),
                )
            }
            Err(e) => {
                eprintln!("NOT DEMONSTRATED: the fleet did not report: {e}");
                return 1;
            }
        },
        (None, None) => unreachable!("the full stack runs here or in the fleet"),
    };
    drop(fleet); // stops the processes and redis-server or moto_server

    let open_quantile = fleet_outcome
        .as_ref()
        .map_or(0.99, |outcome| outcome.open_quantile());
    let report = Report::new(
        &args,
        &dep,
        &recorders,
        &transitions,
        open_everywhere,
        open_quantile,
    );
    report.print(
        &args,
        opened,
        rejected,
        fleet_outcome.as_ref().map(|outcome| outcome.processes()),
    );
    if let Some(outcome) = &fleet_outcome {
        outcome.print(&args);
    }
    match report.chart(&args, &transitions) {
        Ok(()) => println!("\nChart written to {}", args.svg.display()),
        Err(e) => eprintln!("\ncould not write the chart to {}: {e}", args.svg.display()),
    }
    let learn = fleet_outcome
        .as_ref()
        .map_or(Duration::ZERO, |outcome| outcome.learns_within());
    let mut failures = report.verdict(&args, learn);
    if let Some(outcome) = &fleet_outcome {
        failures.extend(outcome.verdict());
    }
    if failures.is_empty() {
        println!("\nThe full stack held: no load multiplication, fast answers while open, recovery within one open period plus a probe.");
        if let Some(outcome) = &fleet_outcome {
            println!("{}", outcome.held());
        }
        0
    } else {
        for f in &failures {
            eprintln!("NOT DEMONSTRATED: {f}");
        }
        1
    }
}

// ================================================================== report

/// The figures of one caller.
#[derive(Debug, Default, Clone)]
struct Figures {
    requests: usize,
    dep_calls: u64,
    dep_rate_before: f64,
    dep_rate_outage: f64,
    p50_outage: Duration,
    p99_outage: Duration,
    /// The report's quantile (p99; p90 for the short-lived fleet) of the
    /// requests issued while the circuit was open or half-open (the full
    /// stack's first opening to the recovery).
    p99_open: Duration,
    peak_in_flight: i64,
    /// Most requests the dependency held hanging at once.
    peak_hung: i64,
    rejected: usize,
    failed: usize,
    /// From the recovery to 99% success, for good; `None` if never.
    recovery: Option<Duration>,
    /// Per second: dependency calls, caller p99 (ms) and peak in flight.
    series: Vec<(u64, f64, i64)>,
}

struct Report {
    figures: [Figures; 2],
    /// The quantile of `p99_open`.
    open_quantile: f64,
    first_open: Option<f64>,
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
    let mut v: Vec<Duration> = records
        .iter()
        .filter(|r| r.issued >= from && r.issued < to)
        .map(|r| r.latency)
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

impl Report {
    fn new(
        args: &Args,
        dep: &Dependency,
        recorders: &[Arc<Recorder>; 2],
        transitions: &[(f64, CircuitState)],
        open_everywhere: Option<f64>,
        open_quantile: f64,
    ) -> Self {
        let out = (
            args.outage_start().as_secs_f64(),
            args.outage_end().as_secs_f64(),
        );
        let end = args.duration.as_secs_f64();
        let first_open = transitions
            .iter()
            .find(|(at, to)| *to == CircuitState::Open && *at >= out.0)
            .map(|(at, _)| *at);
        let figures = [BARE, STACK].map(|caller| {
            let rec = &recorders[caller];
            let records = rec.records.lock().unwrap_or_else(PoisonError::into_inner);
            let calls = &dep.calls[caller];
            let per_sec = |from: f64, to: f64| {
                let (a, b) = (from.ceil() as usize, to.floor() as usize);
                let n: u64 = calls[a..b].iter().map(|c| c.load(Ordering::Relaxed)).sum();
                n as f64 / (b - a).max(1) as f64
            };
            let during = latencies(&records, out.0, out.1);
            // A fleet is open once every process is (each learns it on its
            // own read); a single breaker, from its first opening.
            let open_from = open_everywhere.or(first_open).unwrap_or(out.1);
            let open = latencies(&records, open_from, out.1);
            let series = (0..args.duration.as_secs() as usize)
                .map(|s| {
                    let l = latencies(&records, s as f64, s as f64 + 1.0);
                    (
                        calls[s].load(Ordering::Relaxed),
                        percentile(&l, 0.99).as_secs_f64() * 1000.0,
                        rec.peak[s].load(Ordering::Relaxed),
                    )
                })
                .collect();
            Figures {
                requests: records.len(),
                dep_calls: calls.iter().map(|c| c.load(Ordering::Relaxed)).sum(),
                dep_rate_before: per_sec(1.0, out.0),
                dep_rate_outage: per_sec(out.0, out.1),
                p50_outage: percentile(&during, 0.5),
                p99_outage: percentile(&during, 0.99),
                p99_open: percentile(&open, open_quantile),
                peak_in_flight: rec
                    .peak
                    .iter()
                    .map(|p| p.load(Ordering::Relaxed))
                    .max()
                    .unwrap_or(0),
                peak_hung: dep.hung_peak[caller].load(Ordering::Relaxed),
                rejected: records
                    .iter()
                    .filter(|r| r.outcome == Outcome::Rejected)
                    .count(),
                failed: records
                    .iter()
                    .filter(|r| r.outcome == Outcome::Failed)
                    .count(),
                recovery: recovery(&records, out.1, end),
                series,
            }
        });
        Self {
            figures,
            open_quantile,
            first_open,
            out,
            end,
        }
    }

    /// `opened` and `rejected` are the breaker's totals (summed over the
    /// fleet's `processes`, if any).
    fn print(&self, args: &Args, opened: u64, rejected: u64, processes: Option<usize>) {
        let [b, s] = &self.figures;
        let ms = |d: Duration| {
            let ms = d.as_secs_f64() * 1000.0;
            if ms < 10.0 {
                format!("{ms:.2} ms")
            } else {
                format!("{ms:.0} ms")
            }
        };
        let rows: Vec<(String, String, String)> = vec![
            (
                "requests sent".into(),
                b.requests.to_string(),
                s.requests.to_string(),
            ),
            (
                "calls that reached the dependency".into(),
                b.dep_calls.to_string(),
                s.dep_calls.to_string(),
            ),
            (
                "amplification (calls / requests)".into(),
                format!("{:.2}x", b.dep_calls as f64 / b.requests.max(1) as f64),
                format!("{:.2}x", s.dep_calls as f64 / s.requests.max(1) as f64),
            ),
            (
                "dependency calls/s: before -> during outage".into(),
                rate_change(b),
                rate_change(s),
            ),
            (
                "caller latency in outage: p50 / p99".into(),
                format!("{} / {}", ms(b.p50_outage), ms(b.p99_outage)),
                format!("{} / {}", ms(s.p50_outage), ms(s.p99_outage)),
            ),
            (
                format!(
                    "caller p{:.0} once the circuit is open",
                    self.open_quantile * 100.0
                ),
                ms(b.p99_open),
                ms(s.p99_open),
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
                "recovery to 99% success".into(),
                b.recovery
                    .map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64())),
                s.recovery
                    .map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64())),
            ),
        ];
        println!(
            "\nOutage from {:.1} s to {:.1} s; rate {}/s per caller; timeout {} ms.",
            self.out.0,
            self.out.1,
            args.rate,
            args.timeout.as_millis()
        );
        println!();
        println!("| | bare (timeout + 3 attempts) | full stack |");
        println!("|---|---:|---:|");
        for (what, bare, stack) in rows {
            println!("| {what} | {bare} | {stack} |");
        }
        let first_open = self
            .first_open
            .map_or("never".into(), |t| format!("{:.2} s", t - self.out.0));
        match processes {
            None => println!(
                "\nThe circuit first opened {first_open} after the dependency started hanging; it \
                 opened {opened} times and rejected {rejected} calls."
            ),
            Some(n) => println!(
                "\nThe fleet's circuit first opened {first_open} after the dependency started \
                 hanging; the breakers of its {n} processes opened {opened} times in all and \
                 rejected {rejected} calls (the full stack's column sums the {n} processes; its \
                 peak in flight sums each one's peak per second)."
            ),
        }
        println!(
            "\"once the circuit is open\": requests issued from the first opening to the recovery; \
             recovery: from the recovery until every 1 s window of requests is at least 99% successful."
        );
    }

    /// What must be true of the full stack; empty when it all held.
    /// `learn`: how late a caller may learn that the circuit closed (a
    /// fleet's refresh interval).
    fn verdict(&self, args: &Args, learn: Duration) -> Vec<String> {
        let [b, s] = &self.figures;
        let mut failures = Vec::new();
        if self.first_open.is_none() {
            failures.push("the circuit never opened".to_owned());
        }
        if s.dep_rate_outage > s.dep_rate_before * 1.1 {
            failures.push(format!(
                "the dependency saw {:.0} calls/s in the outage, more than the {:.0}/s before",
                s.dep_rate_outage, s.dep_rate_before
            ));
        }
        if s.p99_open > args.timeout / 10 {
            failures.push(format!(
                "p{:.0} once open was {:?}, not far below the {:?} timeout",
                self.open_quantile * 100.0,
                s.p99_open,
                args.timeout
            ));
        }
        let bound = args.max_open() + args.timeout + learn + Duration::from_millis(300);
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
    fn chart(&self, args: &Args, transitions: &[(f64, CircuitState)]) -> std::io::Result<()> {
        let svg = svg(self, args, transitions);
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
        r#"<text x="{left}" y="24" font-size="16" font-weight="bold">A dependency hangs for {:.0} s: {} requests/s, timeout {} ms</text>"#,
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
        r##"<rect x="{}" y="36" width="14" height="12" fill="#adb5bd" fill-opacity="0.35"/><text x="{}" y="48">dependency hanging</text>"##,
        left + 620.0,
        left + 638.0
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
