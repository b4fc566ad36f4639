//! The socket bench: what the one-line stacks cost over real sockets on
//! 127.0.0.1, next to tower's and tower-http's layers that do the same jobs.
//!
//! Every server is a separate OS process (this executable again, in a
//! hidden `--serve` role) running an axum `Router` that answers `GET /`
//! with `ok`, so the CPU time of the bench process is the callers' alone and
//! each server's CPU time is its own. The bench process runs `--concurrency`
//! caller tasks (default 64), each sending `GET` requests back to back and
//! reading the bodies, for `--secs` seconds per variant and round after a
//! short warm-up; the variants take turns within each round (the starting
//! variant rotates), and the tables give the median over `--rounds` rounds.
//!
//! Client side (the callers change, the server is the bare router):
//!
//! - **reqwest**: a bare `reqwest::Client`;
//! - **tower**: the same client as `tower_shield::reqwest::ReqwestService`
//!   under `ServiceBuilder::new().timeout(2s).concurrency_limit(1024)`,
//!   called through `tower_shield::reqwest::Client`;
//! - **tower, same jobs**: the same adapter under tower's layers doing what
//!   the stack does but the breaker's work: an outer `timeout(2s)`, `retry`
//!   with tower's `TpsBudget` (its policy keeps a copy of the request head
//!   for a retry, as ours does for an idempotent request), a
//!   `concurrency_limit(1024)`, a per-attempt `timeout(2s)`, and a
//!   `map_request` writing the remaining budget as the deadline header;
//! - **ours**: the same adapter under
//!   `client_stack("bench").timeout(2s).concurrency(1024)` (deadline,
//!   breaker, retry with its budget, bulkhead, per-attempt deadline),
//!   called through the same `Client`.
//!
//! The first tower row is the lightest client that still bounds a call;
//! the second is the fair control for the stack's cost: the same work,
//! composed from tower's layers.
//!
//! Server side (the caller is the bare `reqwest::Client`, the router
//! changes):
//!
//! - **bare**: the router alone;
//! - **tower-http**: the router with tower-http's `TimeoutLayer` (2 s, 504)
//!   and tower's `load_shed` and `concurrency_limit(1024)`, with axum's
//!   `HandleErrorLayer` answering 503 for a shed request;
//! - **ours**: the router with
//!   `.layer(server_stack("bench").timeout(2s).concurrency(1024))`
//!   (deadline, bulkhead, breaker).
//!
//! The bare-reqwest-against-bare-router measurement is the first row of
//! both tables (it is run once per round).
//!
//! Run it with:
//!
//! ```text
//! cargo run --release -p examples --bin socket-bench
//! cargo run --release -p examples --bin socket-bench -- --rounds 5 --secs 10 --concurrency 128
//! cargo run -p examples --bin socket-bench -- --quick     # 1 round of 1 s each, for CI
//! cargo run --release -p examples --bin socket-bench -- --only same-jobs,ours
//! ```
//!
//! Reading the tables: `req/s` is the median over the rounds of the
//! requests completed per second of the measured window (warm-up excluded);
//! the `vs` columns are the medians of the per-round ratios to the baseline
//! named (so 0.95 is 5% fewer requests per second than that baseline in
//! the same round); `client µs/req` and `server µs/req` are the CPU time
//! the bench process and the server process spent per request completed
//! (all threads, user and system, from `/proc/<pid>/task/*/schedstat`, or
//! `utime + stime` of `/proc/<pid>/stat` at 100 ticks/s when a thread ended
//! during the window); `CPU vs` is the ratio of those per round, medians
//! again. Both processes share the machine's cores, so requests per second
//! mix the client's and the server's costs; the CPU columns separate them.
//! `spread` is `(max - min) / median` of the rounds' requests per second:
//! differences smaller than it are noise. `errors` counts failed or non-200
//! requests in the measured windows (there should be none). A last line
//! gives the CPU the machine spent outside the two processes during the
//! windows (other programs, and kernel work charged to no thread), as the
//! progress lines do per window, and names the windows above 0.25 cores:
//! those were disturbed (fewer requests per second, and often less CPU per
//! request, as busier threads batch more), and a run with several of them
//! is worth repeating on a quieter machine. The bench
//! exits 1 if a server did not start, a request failed or a round did not
//! stop, never because of the figures.
//!
//! The servers listen on 127.0.0.1 only, the callers talk to them only
//! (`no_proxy`), the request loops end with their window, and the server
//! processes are killed when the bench ends (and exit by themselves when
//! their standard input closes, should the bench die first).

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use examples::demo::serve_local;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, Layer, ServiceBuilder, ServiceExt};
use tower_http::timeout::TimeoutLayer;
use tower_shield::reqwest::{Client, HttpRequest, HttpResponse, ReqwestService};
use tower_shield::stack::{client_stack, server_stack};

// ================================================================ settings

/// The timeout of every stack, client and server side.
const TIMEOUT: Duration = Duration::from_secs(2);

/// The concurrency limit of every stack: far above the callers, so it never
/// rejects and only its bookkeeping is measured.
const LIMIT: usize = 1024;

/// How long after its window a round may take to stop (the stacks' 2 s
/// timeout, and some slack).
const GRACE: Duration = Duration::from_secs(5);

/// How long a server process may take to say where it listens.
const STARTUP: Duration = Duration::from_secs(10);

/// CPU busy outside the two processes, in cores, above which a window is
/// reported as disturbed.
const DISTURBED: f64 = 0.25;

/// The hidden argument of a server process.
const SERVE: &str = "--serve";

const USAGE: &str = "\
usage: socket-bench [--rounds N] [--secs S] [--concurrency C] [--quick] [--coarse-clock]
                    [--only CASES] [--pin]

  --rounds N        rounds; each variant runs once per round (default 3)
  --secs S          measured seconds per variant and round, decimals
                    allowed (default 5; a warm-up of a fifth of it, 0.2 to
                    1 s, comes first)
  --concurrency C   caller tasks sending requests back to back (default 64,
                    at most 512, half the stacks' limit)
  --quick           1 round of 1 s each, for CI; flags after it still apply
  --coarse-clock    our client stack tells time by the coarse clock
                    (`client_stack(..).coarse_clock(true)`): its thread
                    then runs in this process, which every other variant
                    (bare reqwest included) shares; compare with a run
                    without it
  --only CASES      run only these cases, comma-separated, out of
                    reqwest, tower, same-jobs, ours (the callers against
                    the bare server), tower-http, ours-server (bare
                    reqwest against those servers): to profile one case
                    (`perf record`) or to compare two quickly
  --pin             the bench on one CPU and the servers on another (the
                    first two this process may use; Linux only): each
                    process then runs one tokio worker and no longer
                    competes with the other for a core, so the rounds
                    vary far less; the figures are for a client and a
                    server with a core each";

/// What the command line sets.
#[derive(Debug, Clone)]
struct Args {
    rounds: usize,
    secs: Duration,
    concurrency: usize,
    /// `--coarse-clock`: our client stack on the coarse clock.
    coarse_clock: bool,
    /// `--only`: the cases run (their indices), every case when `None`.
    only: Option<Vec<usize>>,
    /// `--pin`: the bench's CPU and the servers', once chosen.
    pin: Option<Pinned>,
}

/// Where `--pin` put the processes.
#[derive(Debug, Clone, Copy)]
struct Pinned {
    bench: usize,
    servers: usize,
}

impl Args {
    /// The warm-up before each measured window: connections opened, pools
    /// and allocators warm.
    fn warmup(&self) -> Duration {
        (self.secs / 5).clamp(Duration::from_millis(200), Duration::from_secs(1))
    }
}

/// What this process is.
#[derive(Debug)]
enum Role {
    /// The bench: starts the servers and drives them.
    Bench(Args),
    /// A server process, started by the bench, on the CPU given (`--pin`).
    Serve(ServerKind, Option<usize>),
}

fn parse() -> Result<Role, String> {
    let mut args = Args {
        rounds: 3,
        secs: Duration::from_secs(5),
        concurrency: 64,
        coarse_clock: false,
        only: None,
        pin: None,
    };
    let mut pin = false;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            SERVE => {
                let kind = value()?;
                let kind = ServerKind::ALL
                    .into_iter()
                    .find(|k| k.arg() == kind)
                    .ok_or_else(|| format!("unknown server {kind}"))?;
                let cpu = match it.next().as_deref() {
                    Some(CPU) => Some(number(&it.next().ok_or("--cpu needs a value")?)?),
                    Some(other) => return Err(format!("unknown argument {other}")),
                    None => None,
                };
                return Ok(Role::Serve(kind, cpu));
            }
            "--rounds" => args.rounds = number(&value()?)?.clamp(1, 1000),
            "--secs" => {
                let v = value()?;
                let secs: f64 = v.parse().map_err(|_| format!("not a number: {v}"))?;
                if !(0.1..=3600.0).contains(&secs) {
                    return Err("--secs takes 0.1 to 3600".into());
                }
                args.secs = Duration::from_secs_f64(secs);
            }
            "--concurrency" => args.concurrency = number(&value()?)?.clamp(1, LIMIT / 2),
            "--quick" => {
                args.rounds = 1;
                args.secs = Duration::from_secs(1);
            }
            "--coarse-clock" => args.coarse_clock = true,
            "--pin" => pin = true,
            "--only" => {
                let cases = value()?
                    .split(',')
                    .map(|name| {
                        CASE_ARGS
                            .iter()
                            .position(|arg| *arg == name.trim())
                            .ok_or_else(|| format!("unknown case {name}"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                args.only = Some(cases);
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if pin {
        let cpus = usable_cpus()?;
        let [bench, servers, ..] = cpus[..] else {
            return Err(format!(
                "--pin needs two CPUs, this process may use {}",
                cpus.len()
            ));
        };
        args.pin = Some(Pinned { bench, servers });
    }
    Ok(Role::Bench(args))
}

/// The hidden argument after `--serve KIND`: the CPU to run on.
const CPU: &str = "--cpu";

/// The CPUs this process may run on, in order.
#[cfg(target_os = "linux")]
fn usable_cpus() -> Result<Vec<usize>, String> {
    let set = rustix::thread::sched_getaffinity(None)
        .map_err(|e| format!("cannot read this process's CPUs: {e}"))?;
    Ok((0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&cpu| set.is_set(cpu))
        .collect())
}

#[cfg(not(target_os = "linux"))]
fn usable_cpus() -> Result<Vec<usize>, String> {
    Err("--pin is for Linux only".into())
}

/// Runs this thread, and the threads it starts from now on, on `cpu` only.
#[cfg(target_os = "linux")]
fn pin_to(cpu: usize) -> Result<(), String> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set)
        .map_err(|e| format!("cannot run on CPU {cpu}: {e}"))
}

#[cfg(not(target_os = "linux"))]
fn pin_to(_cpu: usize) -> Result<(), String> {
    Err("--pin is for Linux only".into())
}

fn number(s: &str) -> Result<usize, String> {
    s.parse().map_err(|_| format!("not a number: {s}"))
}

// ================================================================= servers

/// The three routers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ServerKind {
    /// The router alone.
    Bare,
    /// tower-http's timeout, tower's load shedding and concurrency limit.
    TowerHttp,
    /// `server_stack`.
    Ours,
}

impl ServerKind {
    const ALL: [Self; 3] = [Self::Bare, Self::TowerHttp, Self::Ours];

    /// Its name on the command line of a server process.
    fn arg(self) -> &'static str {
        match self {
            Self::Bare => "bare",
            Self::TowerHttp => "tower-http",
            Self::Ours => "ours",
        }
    }

    /// Its row in the server table.
    fn label(self) -> &'static str {
        match self {
            Self::Bare => "bare axum `Router`",
            Self::TowerHttp => "tower-http `TimeoutLayer` + `load_shed` + `concurrency_limit`",
            Self::Ours => "`server_stack(..).timeout(2s).concurrency(1024)`",
        }
    }

    fn router(self) -> Router {
        let app = Router::new().route("/", get(|| async { "ok" }));
        match self {
            Self::Bare => app,
            // As an axum user writes it: the shed request's error becomes a
            // 503 in `HandleErrorLayer`, outermost, then the same order as
            // ours: timeout, then the limit.
            Self::TowerHttp => app.layer(
                ServiceBuilder::new()
                    .layer(HandleErrorLayer::new(|_: BoxError| async {
                        StatusCode::SERVICE_UNAVAILABLE
                    }))
                    .layer(TimeoutLayer::with_status_code(
                        StatusCode::GATEWAY_TIMEOUT,
                        TIMEOUT,
                    ))
                    .load_shed()
                    .concurrency_limit(LIMIT),
            ),
            Self::Ours => app.layer(server_stack("bench").timeout(TIMEOUT).concurrency(LIMIT)),
        }
    }
}

/// A server process: serves `kind` on a free port of 127.0.0.1, prints
/// `listening <address>`, and exits when its standard input closes (the
/// bench ended, or died).
async fn serve(kind: ServerKind) -> ExitCode {
    let addr = serve_local(kind.router()).await;
    println!("listening {addr}");
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        let _ = closed_tx.send(());
    });
    let _ = closed_rx.await;
    ExitCode::SUCCESS
}

/// A running server process, killed when dropped.
#[derive(Debug)]
struct Server {
    kind: ServerKind,
    child: Child,
    addr: SocketAddr,
}

impl Server {
    /// Starts a server process and waits until it listens.
    fn start(kind: ServerKind, cpu: Option<usize>) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
        let mut command = Command::new(exe);
        command.args([SERVE, kind.arg()]);
        if let Some(cpu) = cpu {
            command.args([CPU, &cpu.to_string()]);
        }
        let child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start the {} server: {e}", kind.arg()))?;
        // From here on, dropping `server` kills the process.
        let mut server = Self {
            kind,
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let stdout = server.child.stdout.take().expect("stdout is piped");
        let (line_tx, line_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = line_tx.send(lines.next());
            // Drain whatever else it prints until it exits.
            for _ in lines {}
        });
        let name = kind.arg();
        let line = match line_rx.recv_timeout(STARTUP) {
            Ok(Some(Ok(line))) => line,
            Ok(_) => return Err(format!("the {name} server exited before listening")),
            Err(_) => {
                return Err(format!(
                    "the {name} server did not listen within {STARTUP:?}"
                ))
            }
        };
        let addr: SocketAddr = line
            .strip_prefix("listening ")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| format!("the {name} server said {line:?}"))?;
        if !addr.ip().is_loopback() {
            return Err(format!(
                "the {name} server listens on {addr}, not on loopback"
            ));
        }
        server.addr = addr;
        Ok(server)
    }

    fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ================================================================= callers

/// What sends the requests.
#[derive(Debug, Clone)]
enum Caller {
    /// A bare `reqwest::Client`.
    Reqwest(reqwest::Client),
    /// A stack over `ReqwestService`, behind `tower_shield::reqwest::Client`
    /// (boxed, so both stacks fit one variant).
    Stacked(Client<Boxed>),
}

/// A stack of [`HttpRequest`] to [`HttpResponse`], type-erased.
type Boxed = BoxCloneSyncService<HttpRequest, HttpResponse, BoxError>;

/// `stack` behind a [`Client`] whose builders `reqwest` starts, boxed,
/// its response body as reqwest's (one `reqwest::Body::wrap` for every
/// stack alike; a plain `reqwest::Body` is not wrapped again).
fn stacked<S, B>(reqwest: reqwest::Client, stack: S) -> Caller
where
    S: tower::Service<HttpRequest, Response = http::Response<B>> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    Caller::Stacked(Client::from_parts(
        reqwest,
        BoxCloneSyncService::new(
            stack
                .map_response(|response| response.map(reqwest::Body::wrap))
                .map_err(Into::into),
        ),
    ))
}

impl Caller {
    /// One `GET`, its body read; whether it answered 200.
    async fn get(&self, url: &str) -> bool {
        let sent = match self {
            Self::Reqwest(client) => client.get(url).send().await.map_err(BoxError::from),
            Self::Stacked(client) => client.get(url).send().await,
        };
        match sent {
            Ok(response) => response.status().is_success() && response.bytes().await.is_ok(),
            Err(_) => false,
        }
    }
}

/// The retry policy of the same-jobs control: retry an error or a 5xx
/// answer while tower's `TpsBudget` allows (10 s window, 10 retries per
/// second, 10%, as our budget), depositing every request that went well.
/// A retry needs a copy of the request, kept before each call: the head,
/// and the body when it is in memory (a `GET`'s empty one, here).
#[derive(Clone)]
struct SameJobs {
    budget: Arc<tower::retry::budget::TpsBudget>,
}

impl SameJobs {
    fn new() -> Self {
        Self {
            budget: Arc::new(tower::retry::budget::TpsBudget::new(
                Duration::from_secs(10),
                10,
                0.1,
            )),
        }
    }
}

impl<E> tower::retry::Policy<HttpRequest, HttpResponse, E> for SameJobs {
    type Future = std::future::Ready<()>;

    fn retry(
        &mut self,
        _: &mut HttpRequest,
        result: &mut Result<HttpResponse, E>,
    ) -> Option<Self::Future> {
        use tower::retry::budget::Budget as _;
        match result {
            Ok(response) if !response.status().is_server_error() => {
                self.budget.deposit();
                None
            }
            _ => self.budget.withdraw().then(|| std::future::ready(())),
        }
    }

    fn clone_request(&mut self, request: &HttpRequest) -> Option<HttpRequest> {
        let body = request.body().as_bytes()?;
        let mut copy = HttpRequest::new(reqwest::Body::from(bytes::Bytes::copy_from_slice(body)));
        *copy.method_mut() = request.method().clone();
        *copy.uri_mut() = request.uri().clone();
        *copy.version_mut() = request.version();
        *copy.headers_mut() = request.headers().clone();
        *copy.extensions_mut() = request.extensions().clone();
        Some(copy)
    }
}

/// The deadline header of the same-jobs control: the remaining budget of
/// the task's deadline (or the timeout) in milliseconds, as the stack's
/// per-attempt deadline writes it (formatted on the stack, one allocation).
fn write_budget(mut request: HttpRequest) -> HttpRequest {
    let remaining = tower_deadline::remaining().unwrap_or(TIMEOUT);
    let millis = u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX);
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    let mut n = millis;
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if let Ok(value) = http::HeaderValue::from_bytes(&buf[at..]) {
        request
            .headers_mut()
            .insert(tower_deadline::DEFAULT_HTTP_HEADER, value);
    }
    request
}

/// A `reqwest::Client` that talks to 127.0.0.1 directly, whatever the
/// proxy variables say.
fn reqwest_client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| format!("reqwest client: {e}"))
}

// ===================================================================== cpu

/// The CPU time of a process so far, as `/proc` tells it.
#[derive(Debug, Clone, Default)]
struct CpuSample {
    /// `(thread id, ns on CPU)` of every live thread, sorted.
    threads: Vec<(u64, u64)>,
    /// `utime + stime` of the whole process (ended threads included), in
    /// clock ticks.
    ticks: Option<u64>,
}

/// Where a CPU figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CpuSource {
    Schedstat,
    Ticks,
}

/// The Linux clock tick (`USER_HZ`), 100 on every mainstream architecture.
const TICKS_PER_SEC: u64 = 100;

impl CpuSample {
    /// `pid` is a number or `self`.
    fn read(pid: &str) -> Self {
        let ticks = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                // The fields after the command name, which is in
                // parentheses and may contain spaces: utime and stime are
                // the 12th and 13th of them.
                let (_, rest) = stat.rsplit_once(')')?;
                let mut fields = rest.split_whitespace().skip(11);
                let utime: u64 = fields.next()?.parse().ok()?;
                let stime: u64 = fields.next()?.parse().ok()?;
                Some(utime + stime)
            });
        let mut threads = Vec::new();
        if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for entry in dir.flatten() {
                let Some(tid) = entry.file_name().to_str().and_then(|t| t.parse().ok()) else {
                    continue;
                };
                let Ok(schedstat) = std::fs::read_to_string(entry.path().join("schedstat")) else {
                    continue;
                };
                if let Some(ns) = schedstat
                    .split_whitespace()
                    .next()
                    .and_then(|ns| ns.parse().ok())
                {
                    threads.push((tid, ns));
                }
            }
        }
        threads.sort_unstable();
        Self { threads, ticks }
    }

    /// The CPU time spent from `earlier` to `self`: exact from the
    /// threads' schedstat when every thread of `earlier` is still there
    /// (an ended thread takes its time with it), else from the process's
    /// clock ticks.
    fn since(&self, earlier: &Self) -> Option<(Duration, CpuSource)> {
        let kept = earlier
            .threads
            .iter()
            .all(|(tid, _)| self.threads.binary_search_by_key(tid, |t| t.0).is_ok());
        if !earlier.threads.is_empty() && kept {
            let sum = |s: &Self| s.threads.iter().map(|t| t.1).sum::<u64>();
            let ns = sum(self).saturating_sub(sum(earlier));
            return Some((Duration::from_nanos(ns), CpuSource::Schedstat));
        }
        let ticks = self.ticks?.saturating_sub(earlier.ticks?);
        Some((
            Duration::from_millis(ticks * 1000 / TICKS_PER_SEC),
            CpuSource::Ticks,
        ))
    }
}

/// The machine's busy time so far (every CPU, idle and I/O wait
/// excluded), in clock ticks, from the first line of `/proc/stat`.
fn machine_busy_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .map(|t| t.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal (guest time is
    // already in user).
    let busy = ticks.iter().take(8).enumerate();
    Some(
        busy.filter(|(i, _)| *i != 3 && *i != 4)
            .map(|(_, t)| t)
            .sum(),
    )
}

// ============================================================= measurement

/// One variant's measured window.
#[derive(Debug, Clone, Copy)]
struct Sample {
    ok: u64,
    errors: u64,
    window: Duration,
    client_cpu: Option<(Duration, CpuSource)>,
    server_cpu: Option<(Duration, CpuSource)>,
    /// CPU time the machine spent outside the two processes during the
    /// window (other programs, and kernel work charged to no thread), in
    /// cores: the sign of a disturbed window.
    elsewhere: Option<f64>,
}

impl Sample {
    fn rate(&self) -> f64 {
        self.ok as f64 / self.window.as_secs_f64()
    }

    fn per_request(&self, cpu: Option<(Duration, CpuSource)>) -> Option<f64> {
        let (cpu, _) = cpu?;
        (self.ok > 0).then(|| cpu.as_secs_f64() * 1e6 / self.ok as f64)
    }

    fn client_us(&self) -> Option<f64> {
        self.per_request(self.client_cpu)
    }

    fn server_us(&self) -> Option<f64> {
        self.per_request(self.server_cpu)
    }
}

/// `concurrency` callers send requests back to back for the warm-up and
/// the window; what completed inside the window is counted, and the CPU
/// time of both processes is read at its edges.
async fn measure(
    caller: &Caller,
    url: &str,
    server_pid: u32,
    args: &Args,
) -> Result<Sample, String> {
    let from = Instant::now() + args.warmup();
    let until = from + args.secs;
    let url: Arc<str> = url.into();
    let mut callers = JoinSet::new();
    for _ in 0..args.concurrency {
        let (caller, url) = (caller.clone(), Arc::clone(&url));
        callers.spawn(async move {
            let (mut ok, mut errors) = (0u64, 0u64);
            while Instant::now() < until {
                let answered = caller.get(&url).await;
                let done = Instant::now();
                if done >= from && done < until {
                    if answered {
                        ok += 1;
                    } else {
                        errors += 1;
                    }
                }
            }
            (ok, errors)
        });
    }
    let server_pid = server_pid.to_string();

    tokio::time::sleep_until(from).await;
    let machine_start = machine_busy_ticks();
    let client_start = CpuSample::read("self");
    let server_start = CpuSample::read(&server_pid);
    let started = Instant::now();
    tokio::time::sleep_until(until).await;
    let window = started.elapsed();
    let client_end = CpuSample::read("self");
    let server_end = CpuSample::read(&server_pid);
    let machine_end = machine_busy_ticks();

    let (mut ok, mut errors) = (0, 0);
    let stop_by = until + GRACE;
    loop {
        match tokio::time::timeout_at(stop_by, callers.join_next()).await {
            Ok(Some(Ok((o, e)))) => {
                ok += o;
                errors += e;
            }
            Ok(Some(Err(e))) => return Err(format!("a caller task failed: {e}")),
            Ok(None) => break,
            Err(_) => {
                callers.abort_all();
                return Err(format!(
                    "callers still waiting for answers {GRACE:?} after the window"
                ));
            }
        }
    }
    let client_cpu = client_end.since(&client_start);
    let server_cpu = server_end.since(&server_start);
    let elsewhere = (|| {
        let machine = machine_end?.saturating_sub(machine_start?) as f64 / TICKS_PER_SEC as f64;
        let ours = client_cpu?.0 + server_cpu?.0;
        Some((machine - ours.as_secs_f64()).max(0.0) / window.as_secs_f64())
    })();
    Ok(Sample {
        ok,
        errors,
        window,
        client_cpu,
        server_cpu,
        elsewhere,
    })
}

/// One pairing of caller and server.
#[derive(Debug)]
struct Case<'a> {
    caller: &'a Caller,
    caller_label: &'static str,
    server: &'a Server,
}

/// The cases, in this order (the tables index them).
const REQWEST_BARE: usize = 0;
const TOWER_CLIENT: usize = 1;
const OURS_CLIENT: usize = 2;
const TOWER_HTTP_SERVER: usize = 3;
const OURS_SERVER: usize = 4;
const TOWER_SAME_JOBS: usize = 5;

/// The cases' names for `--only`, by index.
const CASE_ARGS: [&str; 6] = [
    "reqwest",
    "tower",
    "ours",
    "tower-http",
    "ours-server",
    "same-jobs",
];

async fn bench(args: &Args) -> Result<(), String> {
    let cores = match args.pin {
        Some(Pinned { bench, servers }) => {
            format!("the bench pinned to CPU {bench}, the server processes to CPU {servers}")
        }
        None => format!(
            "{} cores shared by the bench and the server processes",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        ),
    };
    println!(
        "socket-bench: {} round(s), {:.1} s per variant (after {:.1} s of warm-up), \
         {} callers, {cores}",
        args.rounds,
        args.secs.as_secs_f64(),
        args.warmup().as_secs_f64(),
        args.concurrency,
    );

    let servers = ServerKind::ALL
        .into_iter()
        .map(|kind| Server::start(kind, args.pin.map(|p| p.servers)))
        .collect::<Result<Vec<_>, _>>()?;
    let server = |kind| {
        servers
            .iter()
            .find(|s| s.kind == kind)
            .expect("every kind started")
    };
    for s in &servers {
        println!(
            "  server {:<10} pid {:<7} {}",
            s.kind.arg(),
            s.pid(),
            s.addr
        );
    }

    let reqwest = Caller::Reqwest(reqwest_client()?);
    let transport = reqwest_client()?;
    let tower = stacked(
        transport.clone(),
        ServiceBuilder::new()
            .timeout(TIMEOUT)
            .concurrency_limit(LIMIT)
            .service(ReqwestService::new(transport)),
    );
    let transport = reqwest_client()?;
    let tower_same_jobs = stacked(
        transport.clone(),
        ServiceBuilder::new()
            .timeout(TIMEOUT)
            .layer(tower::retry::RetryLayer::new(SameJobs::new()))
            .concurrency_limit(LIMIT)
            .timeout(TIMEOUT)
            .map_request(write_budget)
            .service(ReqwestService::new(transport)),
    );
    let transport = reqwest_client()?;
    let ours = stacked(
        transport.clone(),
        client_stack("bench")
            .timeout(TIMEOUT)
            .concurrency(LIMIT)
            .coarse_clock(args.coarse_clock)
            .layer(ReqwestService::new(transport)),
    );

    let cases = [
        Case {
            caller: &reqwest,
            caller_label: "bare `reqwest::Client`",
            server: server(ServerKind::Bare),
        },
        Case {
            caller: &tower,
            caller_label: "`ReqwestService` + tower `timeout` + `concurrency_limit`",
            server: server(ServerKind::Bare),
        },
        Case {
            caller: &ours,
            caller_label: if args.coarse_clock {
                "`ReqwestService` + `client_stack(..).timeout(2s).concurrency(1024).coarse_clock(true)`"
            } else {
                "`ReqwestService` + `client_stack(..).timeout(2s).concurrency(1024)`"
            },
            server: server(ServerKind::Bare),
        },
        Case {
            caller: &reqwest,
            caller_label: "bare `reqwest::Client`",
            server: server(ServerKind::TowerHttp),
        },
        Case {
            caller: &reqwest,
            caller_label: "bare `reqwest::Client`",
            server: server(ServerKind::Ours),
        },
        Case {
            caller: &tower_same_jobs,
            caller_label: "`ReqwestService` + tower, same jobs: `timeout`, `retry` \
                           (`TpsBudget`), `concurrency_limit`, per-attempt `timeout`, \
                           budget header",
            server: server(ServerKind::Bare),
        },
    ];

    // Every pairing answers before anything is timed.
    for case in &cases {
        let url = case.server.url();
        match tokio::time::timeout(GRACE, case.caller.get(&url)).await {
            Ok(true) => {}
            _ => {
                return Err(format!(
                    "{} -> {} server: the first request failed",
                    case.caller_label,
                    case.server.kind.arg()
                ))
            }
        }
    }

    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); cases.len()];
    for round in 0..args.rounds {
        for turn in 0..cases.len() {
            let index = (turn + round) % cases.len();
            if args
                .only
                .as_ref()
                .is_some_and(|only| !only.contains(&index))
            {
                continue;
            }
            let case = &cases[index];
            let sample = measure(case.caller, &case.server.url(), case.server.pid(), args)
                .await
                .map_err(|e| format!("round {}, {}: {e}", round + 1, case_name(index)))?;
            println!(
                "  round {}/{} {:<22} {:>9.0} req/s  client {:>6} µs/req  server {:>6} µs/req  \
                 elsewhere {} cores{}",
                round + 1,
                args.rounds,
                case_name(index),
                sample.rate(),
                fmt_us(sample.client_us()),
                fmt_us(sample.server_us()),
                sample
                    .elsewhere
                    .map_or_else(|| "n/a".to_owned(), |c| format!("{c:.2}")),
                if sample.errors > 0 {
                    format!("  {} errors", sample.errors)
                } else {
                    String::new()
                },
            );
            samples[index].push(sample);
        }
    }

    println!();
    print!("{}", tables(args, &cases, &samples));

    let errors: u64 = samples.iter().flatten().map(|s| s.errors).sum();
    let empty = samples.iter().flatten().any(|s| s.ok == 0);
    if errors > 0 || empty {
        return Err(format!(
            "{errors} request(s) failed{}",
            if empty {
                ", and a variant completed none in a window"
            } else {
                ""
            }
        ));
    }
    Ok(())
}

/// A short name for the progress lines.
fn case_name(index: usize) -> &'static str {
    match index {
        REQWEST_BARE => "reqwest -> bare",
        TOWER_CLIENT => "tower -> bare",
        OURS_CLIENT => "ours -> bare",
        TOWER_HTTP_SERVER => "reqwest -> tower-http",
        OURS_SERVER => "reqwest -> ours",
        TOWER_SAME_JOBS => "tower same jobs -> bare",
        _ => "?",
    }
}

// ================================================================== report

fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|v| v.is_finite());
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    })
}

/// The median over the rounds of `f(case's sample) / f(base's sample)`.
fn median_ratio(
    samples: &[Vec<Sample>],
    case: usize,
    base: usize,
    f: impl Fn(&Sample) -> Option<f64>,
) -> Option<f64> {
    let ratios = samples[case]
        .iter()
        .zip(&samples[base])
        .filter_map(|(c, b)| Some(f(c)? / f(b)?))
        .collect();
    median(ratios)
}

fn fmt_us(value: Option<f64>) -> String {
    value.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.1}"))
}

fn fmt_ratio(value: Option<f64>) -> String {
    value.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.3}"))
}

/// One table row of a case.
///
/// `bases` name the rows the `vs` columns compare with, in order; the `CPU
/// vs` column compares with the first.
fn row(
    samples: &[Vec<Sample>],
    label: &str,
    case: usize,
    bases: &[usize],
    cpu: fn(&Sample) -> Option<f64>,
    other_cpu: fn(&Sample) -> Option<f64>,
) -> String {
    let rounds = &samples[case];
    let rates: Vec<f64> = rounds.iter().map(Sample::rate).collect();
    let rate = median(rates.clone()).unwrap_or(0.0);
    let (lo, hi) = rates.iter().fold((f64::INFINITY, 0.0_f64), |(lo, hi), &r| {
        (lo.min(r), hi.max(r))
    });
    let spread = if rate > 0.0 {
        format!("{:.1}%", (hi - lo) / rate * 100.0)
    } else {
        "n/a".to_owned()
    };
    let errors: u64 = rounds.iter().map(|s| s.errors).sum();
    let mut out = format!("| {label} | {rate:.0} |");
    for &base in bases {
        let ratio = median_ratio(samples, case, base, |s| Some(s.rate()));
        let _ = write!(out, " {} |", fmt_ratio(ratio));
    }
    let _ = writeln!(
        out,
        " {} | {} | {} | {errors} | {spread} |",
        fmt_us(median(rounds.iter().filter_map(cpu).collect())),
        fmt_ratio(median_ratio(samples, case, bases[0], cpu)),
        fmt_us(median(rounds.iter().filter_map(other_cpu).collect())),
    );
    out
}

fn tables(args: &Args, cases: &[Case<'_>], samples: &[Vec<Sample>]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### Client side: {} callers -> bare axum server, medians of {} round(s) of {:.1} s\n",
        args.concurrency,
        args.rounds,
        args.secs.as_secs_f64()
    );
    out.push_str(
        "| client | req/s | vs tower | vs tower, same jobs | vs reqwest | client µs/req \
         | CPU vs tower | server µs/req | errors | spread |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let ran = |case: &usize| !samples[*case].is_empty();
    for case in [REQWEST_BARE, TOWER_CLIENT, TOWER_SAME_JOBS, OURS_CLIENT]
        .into_iter()
        .filter(ran)
    {
        out.push_str(&row(
            samples,
            cases[case].caller_label,
            case,
            &[TOWER_CLIENT, TOWER_SAME_JOBS, REQWEST_BARE],
            Sample::client_us,
            Sample::server_us,
        ));
    }
    let _ = writeln!(
        out,
        "\n### Server side: {} bare reqwest callers -> server, medians of {} round(s) of {:.1} s\n",
        args.concurrency,
        args.rounds,
        args.secs.as_secs_f64()
    );
    out.push_str(
        "| server | req/s | vs tower-http | vs bare | server µs/req | CPU vs tower-http \
         | client µs/req | errors | spread |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for case in [REQWEST_BARE, TOWER_HTTP_SERVER, OURS_SERVER]
        .into_iter()
        .filter(ran)
    {
        out.push_str(&row(
            samples,
            cases[case].server.kind.label(),
            case,
            &[TOWER_HTTP_SERVER, REQWEST_BARE],
            Sample::server_us,
            Sample::client_us,
        ));
    }
    let windows = samples.iter().flatten().count() * 2;
    let exact = samples
        .iter()
        .flatten()
        .flat_map(|s| [s.client_cpu, s.server_cpu])
        .filter(|cpu| matches!(cpu, Some((_, CpuSource::Schedstat))))
        .count();
    let _ = writeln!(
        out,
        "\nCPU per request: all threads of the process, from schedstat (ns) in \
         {exact} of {windows} readings, utime + stime at {TICKS_PER_SEC} ticks/s otherwise. \
         Ratios are medians of per-round ratios."
    );
    let elsewhere: Vec<f64> = samples
        .iter()
        .flatten()
        .filter_map(|s| s.elsewhere)
        .collect();
    if let Some(most) = elsewhere.iter().copied().reduce(f64::max) {
        let _ = writeln!(
            out,
            "Busy elsewhere (CPU the machine spent outside the bench and its server, \
             in cores): median {:.2}, most {most:.2}.",
            median(elsewhere).unwrap_or(0.0),
        );
    }
    let mut disturbed = Vec::new();
    for (index, rounds) in samples.iter().enumerate() {
        for (round, sample) in rounds.iter().enumerate() {
            if sample.elsewhere.is_some_and(|c| c > DISTURBED) {
                disturbed.push(format!("{} (round {})", case_name(index), round + 1));
            }
        }
    }
    if !disturbed.is_empty() {
        let _ = writeln!(
            out,
            "Disturbed windows (over {DISTURBED} cores busy elsewhere; their figures \
             are suspect, a rerun on a quieter machine is worth it): {}.",
            disturbed.join(", ")
        );
    }
    out
}

// ==================================================================== main

fn main() -> ExitCode {
    let role = match parse() {
        Ok(role) => role,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("socket-bench: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    // Pinned before the runtime starts, so that its workers (one per CPU
    // this process may use) inherit the CPU.
    let cpu = match &role {
        Role::Bench(args) => args.pin.map(|p| p.bench),
        Role::Serve(_, cpu) => *cpu,
    };
    if let Some(Err(e)) = cpu.map(pin_to) {
        eprintln!("socket-bench: {e}");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("socket-bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        match role {
            Role::Serve(kind, _) => serve(kind).await,
            Role::Bench(args) => match bench(&args).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("socket-bench: {e}");
                    ExitCode::FAILURE
                }
            },
        }
    })
}
