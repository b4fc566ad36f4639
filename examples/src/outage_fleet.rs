//! The outage demo's fleet (`--redis`): the full stack runs in several
//! caller processes, each with its own `Breaker`, sharing one circuit
//! through the tower-breaker-redis store.
//!
//! The parent (the demo) starts its own `redis-server` on a free port of
//! 127.0.0.1 (or uses `--redis-url`), keeps the dependency and the bare
//! caller, and re-invokes its own executable N times with [`CHILD_ENV`] set.
//! Each child connects to Redis, reads the shared circuit, prints `ready`,
//! waits for `go` on its stdin (so every process shares one clock, to the
//! millisecond), then sends its share of the full stack's requests to the
//! parent's dependency. It reports on stdout, one line each:
//!
//! ```text
//! ready
//! sec <s> <done> <ok> <in flight> <C|O|H>      every second, live
//! rec <issued s> <latency ns> <k|f|r> <core wait ns>  every request, at the end
//! peaks <peak in flight per second...>
//! tr <at s> <C|O|H> <1: its own window, 0: the store>
//! first-reject <at s> <failures its breaker had counted>   (in the hang)
//! totals <opened> <rejected> <failed> <store errors>
//! end
//! ```
//!
//! The split is uneven on purpose: process 1 sends three shares, every
//! other process one (4 processes at 100/s: 50, 16.7, 16.7, 16.7). With an
//! even split every process sees the same failures at the same moments,
//! and each trips on its own window within a few milliseconds of the
//! others, so there is no fleet effect to see; with a busy process and
//! quiet ones (as behind most load balancers), the busy one trips first,
//! or the fleet's shared window in Redis does (it counts the newest calls
//! of all processes, so it fills twice as fast as the busy one's), and the
//! others stop when Redis pushes the opening or at their next read (every
//! [`REFRESH`]), after far fewer failures than their own window needs.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use resilience_testkit::redis::RedisServer;
use tokio::time::{Instant, MissedTickBehavior};
use tower_breaker::snapshot::Cause;
use tower_breaker::{Breaker, FleetConfig, State as CircuitState, Transition};

use super::{
    after_election, breaker_config, breaker_store, ends_open_period, full_stack, stack_call,
    stack_url, Args, Budgets, FleetArgs, Outcome as Call, Record, Recorder, FAILURES_TO_TRIP,
    FAILURE_RATE, WINDOW,
};

/// Set on a child process: `index processes dependency-address url prefix`.
const CHILD_ENV: &str = "OUTAGE_FLEET_CHILD";

/// How often each process's breaker reads the shared circuit.
const REFRESH: Duration = Duration::from_millis(25);

/// The share of the full stack's rate that process `index` sends.
fn share(rate: u32, index: usize, processes: usize) -> f64 {
    let weight = if index == 0 { 3.0 } else { 1.0 };
    f64::from(rate) * weight / (processes as f64 + 2.0)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn letter(state: CircuitState) -> char {
    match state {
        CircuitState::Closed => 'C',
        CircuitState::Open => 'O',
        CircuitState::HalfOpen => 'H',
    }
}

fn from_letter(c: &str) -> Option<CircuitState> {
    match c {
        "C" => Some(CircuitState::Closed),
        "O" => Some(CircuitState::Open),
        "H" => Some(CircuitState::HalfOpen),
        _ => None,
    }
}

// =================================================================== child

/// What a child process is told by its parent.
#[derive(Debug)]
pub(super) struct ChildSpec {
    index: usize,
    processes: usize,
    dependency: SocketAddr,
    url: String,
    prefix: String,
}

/// `Some` in a child process of the fleet.
pub(super) fn child_spec() -> Option<Result<ChildSpec, String>> {
    let spec = std::env::var(CHILD_ENV).ok()?;
    let parse = || -> Option<ChildSpec> {
        let mut it = spec.split(' ');
        let spec = ChildSpec {
            index: it.next()?.parse().ok()?,
            processes: it.next()?.parse().ok()?,
            dependency: it.next()?.parse().ok()?,
            url: it.next()?.to_owned(),
            prefix: it.next()?.to_owned(),
        };
        (it.next().is_none() && spec.index < spec.processes).then_some(spec)
    };
    Some(parse().ok_or_else(|| format!("{CHILD_ENV} is malformed: {spec:?}")))
}

/// One caller process: the full stack at its share of the rate, its breaker
/// sharing the circuit through Redis. Returns the exit code.
pub(super) async fn run_child(args: &Args, spec: ChildSpec) -> i32 {
    let me = spec.index + 1;
    let store = match breaker_store(Some((&spec.url, &spec.prefix))).await {
        Ok(store) => store,
        Err(e) => {
            eprintln!("process {me}: {e}");
            return 2;
        }
    };
    let transitions: Arc<Mutex<Vec<(Instant, CircuitState, bool)>>> = Arc::default();
    let mut config = breaker_config(args).listener({
        let transitions = transitions.clone();
        move |t: &Transition| {
            let own = !matches!(t.cause, Cause::Store);
            lock(&transitions).push((t.at, t.to, own));
        }
    });
    if let Some(store) = store {
        config = config.fleet(FleetConfig::new(store).refresh_interval(REFRESH));
    }
    let breaker = match Breaker::try_with_config("dependency", config) {
        Ok(breaker) => breaker,
        Err(e) => {
            eprintln!("process {me}: {e}");
            return 2;
        }
    };
    // Know the fleet's circuit before the first call.
    if let Err(e) = breaker.refresh().await {
        eprintln!("process {me}: could not read the shared circuit: {e}");
    }

    // `go` on stdin starts the clock; the end of stdin (the parent is gone)
    // ends this process.
    let (go_tx, go_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut line = String::new();
        if matches!(stdin.read_line(&mut line), Ok(n) if n > 0) && line.trim() == "go" {
            let _ = go_tx.send(());
            while matches!(stdin.read_line(&mut line), Ok(n) if n > 0) {}
        }
        std::process::exit(3);
    });
    println!("ready");
    if go_rx.await.is_err() {
        return 3;
    }
    let start = Instant::now();
    // Built now, so that its retry budget's buckets start with the run's
    // clock (see `budget_allowance`).
    let client = full_stack(args, breaker.clone());

    let secs = args.duration.as_secs() as usize + 1;
    let rec = Arc::new(Recorder::new(secs));
    // The fleet's story is the hang's: the first rejection in it, and the
    // failures its breaker counted in it until then.
    let hang = start + args.outage_start();
    let failed_before_hang: Arc<OnceLock<u64>> = Arc::default();
    {
        let (breaker, failed_before_hang) = (breaker.clone(), failed_before_hang.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(hang).await;
            failed_before_hang.get_or_init(|| breaker.snapshot().totals.failed);
        });
    }
    let first_reject: Arc<OnceLock<(Instant, u64)>> = Arc::default();
    let load = {
        let (rec, first_reject, breaker) = (rec.clone(), first_reject.clone(), breaker.clone());
        let failed_before_hang = failed_before_hang.clone();
        let duration = args.duration;
        let period = Duration::from_secs_f64(1.0 / share(args.rate, spec.index, spec.processes));
        let url = stack_url(spec.dependency, spec.index);
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
                let (rec, first_reject, breaker) =
                    (rec.clone(), first_reject.clone(), breaker.clone());
                let failed_before_hang = failed_before_hang.clone();
                let (client, url) = (client.clone(), url.clone());
                rec.begin((now - start).as_secs() as usize);
                tokio::spawn(async move {
                    let issued = Instant::now();
                    let ended = ends_open_period(&breaker);
                    let (outcome, circuit_open, timing) = stack_call(&client, &url).await;
                    let outcome = after_election(outcome, ended);
                    if let (true, Some(&before)) = (circuit_open, failed_before_hang.get()) {
                        if issued >= hang {
                            first_reject.get_or_init(|| {
                                (issued, breaker.snapshot().totals.failed - before)
                            });
                        }
                    }
                    rec.end(start, issued, timing, outcome);
                });
            }
        })
    };

    let mut second =
        tokio::time::interval_at(start + Duration::from_secs(1), Duration::from_secs(1));
    for s in 0..args.duration.as_secs() as usize {
        second.tick().await;
        println!(
            "sec {s} {} {} {} {}",
            rec.done[s].load(std::sync::atomic::Ordering::Relaxed),
            rec.ok[s].load(std::sync::atomic::Ordering::Relaxed),
            rec.in_flight.load(std::sync::atomic::Ordering::Relaxed),
            letter(breaker.snapshot().state)
        );
    }
    let _ = load.await;
    // Every call ends by the caller's timeout.
    let wait_until = Instant::now() + args.timeout * 2;
    while Instant::now() < wait_until
        && rec.in_flight.load(std::sync::atomic::Ordering::Relaxed) > 0
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let since = |at: Instant| (at.max(start) - start).as_secs_f64();
    let mut out = BufWriter::new(std::io::stdout().lock());
    for r in lock(&rec.records).iter() {
        let o = match r.outcome {
            Call::Ok => 'k',
            Call::Failed => 'f',
            Call::Rejected => 'r',
            Call::Elected => 'e',
        };
        let _ = writeln!(
            out,
            "rec {:.6} {} {o} {}",
            r.issued,
            r.latency.as_nanos(),
            r.core_wait.as_nanos()
        );
    }
    let peaks: Vec<String> = rec
        .peak
        .iter()
        .map(|p| p.load(std::sync::atomic::Ordering::Relaxed).to_string())
        .collect();
    let _ = writeln!(out, "peaks {}", peaks.join(" "));
    for &(at, to, own) in lock(&transitions).iter() {
        let _ = writeln!(out, "tr {:.6} {} {}", since(at), letter(to), u8::from(own));
    }
    if let Some(&(at, failed)) = first_reject.get() {
        let _ = writeln!(out, "first-reject {:.6} {failed}", since(at));
    }
    let totals = breaker.snapshot().totals;
    let _ = writeln!(
        out,
        "totals {} {} {} {}",
        totals.opened, totals.rejected, totals.failed, totals.store_errors
    );
    let _ = writeln!(out, "end");
    let _ = out.flush();
    0
}

// ================================================================== parent

/// Starts a `redis-server` of our own (the workspace's launcher) on a free
/// port of 127.0.0.1, killed on drop. The wait for it to answer blocks, so
/// it runs off the runtime's workers.
fn start_redis() -> Result<RedisServer, String> {
    tokio::task::block_in_place(RedisServer::try_start).map_err(|e| {
        format!(
            "{e}: install redis-server (Debian: apt-get install redis-server) or pass \
             --redis-url redis://127.0.0.1:PORT"
        )
    })
}

/// One second of a child's live figures.
#[derive(Debug, Clone, Copy)]
struct Second {
    done: u64,
    ok: u64,
    in_flight: i64,
    state: char,
}

/// What the parent heard from one child.
#[derive(Debug, Default)]
struct Heard {
    ready: bool,
    seconds: Vec<Option<Second>>,
    records: Vec<Record>,
    peaks: Vec<i64>,
    /// (at, to, tripped by its own window)
    transitions: Vec<(f64, CircuitState, bool)>,
    /// (at, failures its breaker had counted)
    first_reject: Option<(f64, u64)>,
    /// (opened, rejected, failed, store errors)
    totals: Option<(u64, u64, u64, u64)>,
    ended: bool,
    /// Its stdout closed (it exited or died).
    gone: bool,
}

impl Heard {
    /// Takes one line of the protocol; false if it is not one.
    fn take(&mut self, line: &str) -> bool {
        let words: Vec<&str> = line.split(' ').collect();
        let num = |i: usize| words.get(i).and_then(|w| w.parse::<u64>().ok());
        let float = |i: usize| words.get(i).and_then(|w| w.parse::<f64>().ok());
        match words[0] {
            "ready" => self.ready = true,
            "sec" => {
                let (Some(s), Some(done), Some(ok), Some(in_flight), Some(state)) = (
                    num(1),
                    num(2),
                    num(3),
                    words.get(4).and_then(|w| w.parse::<i64>().ok()),
                    words.get(5).and_then(|w| w.chars().next()),
                ) else {
                    return false;
                };
                let s = s as usize;
                if self.seconds.len() <= s {
                    self.seconds.resize(s + 1, None);
                }
                self.seconds[s] = Some(Second {
                    done,
                    ok,
                    in_flight,
                    state,
                });
            }
            "rec" => {
                let outcome = match words.get(3).copied() {
                    Some("k") => Call::Ok,
                    Some("f") => Call::Failed,
                    Some("r") => Call::Rejected,
                    Some("e") => Call::Elected,
                    _ => return false,
                };
                let (Some(issued), Some(latency), Some(core_wait)) = (float(1), num(2), num(4))
                else {
                    return false;
                };
                self.records.push(Record {
                    issued,
                    latency: Duration::from_nanos(latency),
                    core_wait: Duration::from_nanos(core_wait),
                    outcome,
                });
            }
            "peaks" => {
                self.peaks = words[1..].iter().filter_map(|w| w.parse().ok()).collect();
            }
            "tr" => {
                let (Some(at), Some(to), Some(own)) =
                    (float(1), words.get(2).and_then(|w| from_letter(w)), num(3))
                else {
                    return false;
                };
                self.transitions.push((at, to, own == 1));
            }
            "first-reject" => {
                let (Some(at), Some(failed)) = (float(1), num(2)) else {
                    return false;
                };
                self.first_reject = Some((at, failed));
            }
            "totals" => {
                let (Some(a), Some(b), Some(c), Some(d)) = (num(1), num(2), num(3), num(4)) else {
                    return false;
                };
                self.totals = Some((a, b, c, d));
            }
            "end" => self.ended = true,
            _ => return false,
        }
        true
    }
}

/// One caller process.
#[derive(Debug)]
struct Process {
    child: Child,
    stdin: Option<ChildStdin>,
    heard: Arc<Mutex<Heard>>,
}

/// The fleet: Redis and the caller processes; both are stopped on drop.
#[derive(Debug)]
pub(super) struct Fleet {
    processes: Vec<Process>,
    rates: Vec<f64>,
    url: String,
    prefix: String,
    // Dropped after the processes (fields drop in order).
    redis: Option<RedisServer>,
}

/// The fleet's live figures of one second.
#[derive(Debug)]
pub(super) struct FleetSecond {
    pub(super) done: u64,
    pub(super) ok: u64,
    pub(super) in_flight: i64,
    /// Each process's circuit: `C`, `O`, `H` (`?`: no report).
    pub(super) circuits: String,
}

impl Fleet {
    /// Starts Redis (unless given a URL) and the processes, and waits until
    /// each has read the shared circuit.
    pub(super) async fn start(
        args: &Args,
        fleet: &FleetArgs,
        dependency: SocketAddr,
    ) -> Result<Self, String> {
        let (redis, url) = match &fleet.url {
            Some(url) => {
                breaker_store(Some((url, "outage-demo:"))).await?;
                (None, url.clone())
            }
            None => {
                let server = start_redis()?;
                let url = server.url();
                (Some(server), url)
            }
        };
        // One prefix per run: runs sharing a Redis never share a circuit.
        let prefix = format!("outage-demo:{}:", std::process::id());
        let exe = std::env::current_exe().map_err(|e| format!("no current executable: {e}"))?;
        let n = fleet.processes;
        let mut this = Self {
            processes: Vec::with_capacity(n),
            rates: (0..n).map(|i| share(args.rate, i, n)).collect(),
            url,
            prefix,
            redis,
        };
        for index in 0..n {
            let mut child = Command::new(&exe)
                .args(std::env::args_os().skip(1))
                .env(
                    CHILD_ENV,
                    format!("{index} {n} {dependency} {} {}", this.url, this.prefix),
                )
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("could not start caller process {}: {e}", index + 1))?;
            let stdout = child.stdout.take().expect("piped stdout");
            let heard = Arc::new(Mutex::new(Heard::default()));
            {
                let heard = heard.clone();
                std::thread::spawn(move || {
                    for line in BufReader::new(stdout).lines() {
                        let Ok(line) = line else { break };
                        if !lock(&heard).take(&line) {
                            eprintln!("process {}: {line}", index + 1);
                        }
                    }
                    lock(&heard).gone = true;
                });
            }
            let stdin = child.stdin.take();
            this.processes.push(Process {
                child,
                stdin,
                heard,
            });
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let (ready, gone) = this.count(|h| h.ready, |h| h.gone);
            if ready == n {
                return Ok(this);
            }
            if gone > 0 {
                return Err(format!(
                    "{gone} caller process(es) exited before they were ready"
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "only {ready} of {n} caller processes ready after 15 s"
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn count(&self, a: impl Fn(&Heard) -> bool, b: impl Fn(&Heard) -> bool) -> (usize, usize) {
        self.processes.iter().fold((0, 0), |(x, y), p| {
            let h = lock(&p.heard);
            (x + usize::from(a(&h)), y + usize::from(b(&h)))
        })
    }

    /// The header lines that say how the fleet runs.
    pub(super) fn describe(&self) -> String {
        let rates: Vec<String> = self.rates.iter().map(|r| format!("{r:.1}/s")).collect();
        format!(
            "  breaker state: shared through Redis at {} ({}), key prefix {}\n  \
             the full stack runs in {} caller processes, each with its own breaker reading the \
             shared circuit every {} ms;\n  their rates: {} (process 1 is the busy one)\n  \
             live line: circuits = each process's breaker (C closed, O open, H half-open)",
            self.url,
            if self.redis.is_some() {
                "a redis-server started for this run"
            } else {
                "--redis-url"
            },
            self.prefix,
            self.processes.len(),
            REFRESH.as_millis(),
            rates.join(", ")
        )
    }

    /// Starts every process's clock.
    pub(super) fn go(&mut self) -> Result<(), String> {
        for (i, p) in self.processes.iter_mut().enumerate() {
            let stdin = p.stdin.as_mut().expect("stdin kept until the end");
            stdin
                .write_all(b"go\n")
                .and_then(|()| stdin.flush())
                .map_err(|e| format!("could not start caller process {}: {e}", i + 1))?;
        }
        Ok(())
    }

    /// The fleet's figures of second `s`, once every process reported it
    /// (or after 400 ms).
    pub(super) async fn second(&self, s: usize) -> FleetSecond {
        let deadline = Instant::now() + Duration::from_millis(400);
        loop {
            let (reported, gone) = self.count(
                |h| h.seconds.get(s).is_some_and(Option::is_some),
                |h| h.gone,
            );
            if reported + gone >= self.processes.len() || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut f = FleetSecond {
            done: 0,
            ok: 0,
            in_flight: 0,
            circuits: String::new(),
        };
        for p in &self.processes {
            match lock(&p.heard).seconds.get(s).copied().flatten() {
                Some(second) => {
                    f.done += second.done;
                    f.ok += second.ok;
                    f.in_flight += second.in_flight;
                    f.circuits.push(second.state);
                }
                None => f.circuits.push('?'),
            }
        }
        f
    }

    /// Waits for every process's final report.
    pub(super) async fn finish(&mut self, args: &Args) -> Result<Outcome, String> {
        let n = self.processes.len();
        let deadline = Instant::now() + args.timeout * 3 + Duration::from_secs(10);
        loop {
            let (ended, gone) = self.count(|h| h.ended, |h| h.gone && !h.ended);
            if ended == n {
                break;
            }
            if gone > 0 {
                return Err(format!("{gone} caller process(es) exited without a report"));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "only {ended} of {n} caller processes reported in time"
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut heard = Vec::with_capacity(n);
        for p in &mut self.processes {
            p.stdin = None; // they are done: let them go
            let _ = p.child.wait();
            heard.push(std::mem::take(&mut *lock(&p.heard)));
        }
        Ok(Outcome {
            heard,
            rates: self.rates.clone(),
            hang: (
                args.outage_start().as_secs_f64(),
                args.outage_end().as_secs_f64(),
            ),
        })
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for p in &mut self.processes {
            p.stdin = None;
            if !matches!(p.child.try_wait(), Ok(Some(_))) {
                let _ = p.child.kill();
                let _ = p.child.wait();
            }
        }
    }
}

// ================================================================= outcome

/// A process's first opening at or after `from`: (at, by its own window).
fn first_open(h: &Heard, from: f64) -> Option<(f64, bool)> {
    h.transitions
        .iter()
        .find(|(at, to, _)| *to == CircuitState::Open && *at >= from)
        .map(|&(at, _, own)| (at, own))
}

/// What the fleet's processes reported.
#[derive(Debug)]
pub(super) struct Outcome {
    heard: Vec<Heard>,
    rates: Vec<f64>,
    /// The hang, in seconds since the start: the fleet's story (who
    /// tripped, who followed) is told of it.
    hang: (f64, f64),
}

/// What the demo reads from a fleet's outcome, whatever keeps its circuit
/// (this module's processes on Redis, or `outage_lambda.rs`'s on
/// DynamoDB).
pub(super) trait FleetOutcome {
    /// How many caller processes ran.
    fn processes(&self) -> usize;

    /// The full stack's calls, all processes together, with the peak in
    /// flight per second.
    fn recorder(&self, secs: usize) -> Recorder;

    /// The fleet's circuit for the chart: (at, open or closed).
    fn transitions(&self) -> Vec<(f64, CircuitState)>;

    /// When, in the hang, every process's circuit had opened.
    fn open_everywhere(&self) -> Option<f64>;

    /// How many probes the fleet sent from `from` to `to` (at most: a
    /// breaker's half-open without a probe may count).
    fn probes_sent(&self, from: f64, to: f64) -> usize;

    /// How long the fleet's circuit stayed open the last time before it
    /// closed after the hang, if that is known.
    fn open_period_in_force(&self) -> Option<f64> {
        None
    }

    /// What bounds the fleet's retries: the budget its processes share
    /// through their breakers' store.
    fn budgets(&self) -> Budgets;

    /// Openings, all breakers together.
    fn opened(&self) -> u64;

    /// Calls rejected by an open circuit, all breakers together.
    fn rejected(&self) -> u64;

    /// How late a process may learn that the fleet's circuit closed (its
    /// refresh interval, and what its store's round trips add), and how
    /// that is derived: the recovery's bound grows by it.
    fn learns_within(&self) -> (Duration, String);

    /// The longest time between two calls of one process: the probe goes
    /// out with the next call of the process that wins the election.
    fn call_interval(&self) -> Duration;

    /// The fleet's own lines, after the table.
    fn print(&self, args: &Args);

    /// What must be true of the fleet; empty when it all held.
    fn verdict(&self) -> Vec<String>;

    /// The closing line when it all held.
    fn held(&self) -> String;
}

impl FleetOutcome for Outcome {
    fn processes(&self) -> usize {
        self.heard.len()
    }

    /// The full stack's calls, all processes together; the peak in flight
    /// of a second is the sum of each process's peak in it.
    fn recorder(&self, secs: usize) -> Recorder {
        let rec = Recorder::new(secs);
        let mut records = lock(&rec.records);
        for h in &self.heard {
            records.extend_from_slice(&h.records);
            for (slot, &peak) in rec.peak.iter().zip(&h.peaks) {
                slot.fetch_add(peak, std::sync::atomic::Ordering::Relaxed);
            }
        }
        records.sort_by(|a, b| a.issued.total_cmp(&b.issued));
        drop(records);
        rec
    }

    /// The fleet's circuit for the chart: not closed while any process's
    /// breaker is not closed.
    fn transitions(&self) -> Vec<(f64, CircuitState)> {
        let mut all: Vec<(f64, usize, CircuitState)> = self
            .heard
            .iter()
            .enumerate()
            .flat_map(|(i, h)| h.transitions.iter().map(move |&(at, to, _)| (at, i, to)))
            .collect();
        all.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut states = vec![CircuitState::Closed; self.heard.len()];
        let mut out = Vec::new();
        for (at, i, to) in all {
            let was_closed = states.iter().all(|s| *s == CircuitState::Closed);
            states[i] = to;
            let is_closed = states.iter().all(|s| *s == CircuitState::Closed);
            if was_closed && !is_closed {
                out.push((at, CircuitState::Open));
            } else if !was_closed && is_closed {
                out.push((at, CircuitState::Closed));
            }
        }
        out
    }

    /// When every process's circuit had opened.
    fn open_everywhere(&self) -> Option<f64> {
        self.heard
            .iter()
            .map(|h| first_open(h, self.hang.0).map(|(at, _)| at))
            .try_fold(0.0_f64, |max, at| at.map(|at| max.max(at)))
    }

    fn opened(&self) -> u64 {
        self.heard
            .iter()
            .filter_map(|h| h.totals)
            .map(|t| t.0)
            .sum()
    }

    fn rejected(&self) -> u64 {
        self.heard
            .iter()
            .filter_map(|h| h.totals)
            .map(|t| t.1)
            .sum()
    }

    fn probes_sent(&self, from: f64, to: f64) -> usize {
        self.heard
            .iter()
            .flat_map(|h| &h.transitions)
            .filter(|(at, to_state, _)| {
                *to_state == CircuitState::HalfOpen && *at >= from && *at < to
            })
            .count()
    }

    /// The fleet's last open period before it closed after the hang: from
    /// the last opening any process saw (a failed probe's, say) to the
    /// next half-open (the election of the probe that closed it). A
    /// process already open records no transition when the fleet re-opens,
    /// so no single process's transitions tell.
    fn open_period_in_force(&self) -> Option<f64> {
        let mut all: Vec<(f64, CircuitState)> = self
            .heard
            .iter()
            .flat_map(|h| h.transitions.iter().map(|&(at, to, _)| (at, to)))
            .collect();
        all.sort_by(|a, b| a.0.total_cmp(&b.0));
        let close = all
            .iter()
            .position(|&(at, to)| at >= self.hang.1 && to == CircuitState::Closed)?;
        let open = all[..close]
            .iter()
            .rposition(|&(_, to)| to == CircuitState::Open)?;
        let half = all[open..close]
            .iter()
            .find(|&&(_, to)| to == CircuitState::HalfOpen)?;
        Some(half.0 - all[open].0)
    }

    fn budgets(&self) -> Budgets {
        Budgets::Fleet(self.rates.iter().sum())
    }

    fn learns_within(&self) -> (Duration, String) {
        (
            REFRESH,
            "the processes' refresh interval: a process learns the close at its next read of \
             Redis"
                .to_owned(),
        )
    }

    fn call_interval(&self) -> Duration {
        let slowest = self.rates.iter().copied().fold(f64::INFINITY, f64::min);
        Duration::from_secs_f64(1.0 / slowest)
    }

    /// The fleet line and the per-process failures seen before rejecting.
    fn print(&self, args: &Args) {
        let out_start = args.outage_start().as_secs_f64();
        let n = self.heard.len();
        let Some((tripper, opened_at)) = self.first_opening() else {
            println!(
                "\nFleet ({n} processes, one circuit in Redis): no process opened in the hang."
            );
            return;
        };
        let own = |h: &Heard| h.first_reject.map_or(0, |(_, f)| f);
        let others: Vec<usize> = (0..n).filter(|&i| Some(i) != tripper).collect();
        let last_reject = others
            .iter()
            .map(|&i| self.heard[i].first_reject.map(|(at, _)| at))
            .try_fold(f64::MIN, |max, at| at.map(|at| max.max(at)));
        let counts: Vec<String> = others
            .iter()
            .map(|&i| own(&self.heard[i]).to_string())
            .collect();
        let counts = match counts.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => counts.join(""),
        };
        let (all_others, their) = match (tripper, others.len()) {
            (_, 1) => ("the other process was".to_owned(), "its"),
            (Some(_), k) => (format!("all {k} others were"), "their"),
            (None, k) => (format!("all {k} processes were"), "their"),
        };
        let rejecting = match last_reject {
            Some(at) => format!(
                "{:.0} ms later {all_others} rejecting, after {counts} failures of {their} own",
                (at - opened_at).max(0.0) * 1000.0
            ),
            None => format!("not every process rejected; failures seen: {counts}"),
        };
        let who = match tripper {
            Some(first) => format!(
                "process {} ({:.0}/s) tripped first, {:.2} s after the dependency started \
                 hanging, on {} failures of its own",
                first + 1,
                self.rates[first],
                opened_at - out_start,
                own(&self.heard[first]),
            ),
            None => format!(
                "the fleet's shared window tripped first (Redis opened the circuit on the \
                 failures the processes reported), {:.2} s after the dependency started hanging",
                opened_at - out_start,
            ),
        };
        println!(
            "\nFleet ({n} processes, one circuit in Redis): {who}; {rejecting} (alone, each \
             needs {FAILURES_TO_TRIP}: {:.0}% of its last {WINDOW} calls).",
            FAILURE_RATE * 100.0,
        );
        let mut line = String::from("Failures seen before the first rejection, per process:");
        for (i, h) in self.heard.iter().enumerate() {
            let how = match first_open(h, self.hang.0) {
                Some((_, true)) => "tripped on its own",
                Some((_, false)) => "told by Redis",
                None => "never opened",
            };
            let _ = write!(
                line,
                " #{} ({:.0}/s) {} ({how}){}",
                i + 1,
                self.rates[i],
                h.first_reject
                    .map_or("no rejection".to_owned(), |(_, f)| f.to_string()),
                if i + 1 < n { ";" } else { "." }
            );
        }
        println!("{line}");
        println!(
            "For the fleet, \"once the circuit is open\" starts when every process's breaker is \
             open, and the chart's band shows any process's circuit not closed."
        );
    }

    /// What must be true of the fleet; empty when it all held.
    ///
    /// The circuit is one: it opens once, either on the window of one
    /// process (the busy one, usually) or on the fleet's shared window in
    /// Redis (the reports of all of them), and every other process follows
    /// the store, after fewer failures than its own window needs.
    fn verdict(&self) -> Vec<String> {
        let mut failures = Vec::new();
        let Some((tripper, _)) = self.first_opening() else {
            failures.push("no process of the fleet opened in the hang".to_owned());
            return failures;
        };
        for (i, h) in self.heard.iter().enumerate() {
            if Some(i) == tripper {
                continue;
            }
            match first_open(h, self.hang.0) {
                None => failures.push(format!("process {} never opened", i + 1)),
                Some((_, true)) => failures.push(format!(
                    "process {} tripped on its own window instead of following the shared circuit",
                    i + 1
                )),
                Some((_, false)) => {}
            }
            match h.first_reject {
                None => failures.push(format!("process {} never rejected a call", i + 1)),
                Some((_, f)) if f >= FAILURES_TO_TRIP => failures.push(format!(
                    "process {} saw {f} failures before it rejected, as many as its own \
                     window needs",
                    i + 1
                )),
                Some(_) => {}
            }
        }
        failures
    }

    fn held(&self) -> String {
        "The fleet shared one circuit: it opened once (on one process's window or on the \
         fleet's shared window), and every other process stopped calling without waiting for \
         failures of its own."
            .to_owned()
    }
}

impl Outcome {
    /// The fleet's first opening in the hang: (the process whose own
    /// window opened it, or `None` when Redis opened it on the fleet's
    /// shared window; when).
    fn first_opening(&self) -> Option<(Option<usize>, f64)> {
        self.heard
            .iter()
            .enumerate()
            .filter_map(|(i, h)| first_open(h, self.hang.0).map(|(at, own)| (own.then_some(i), at)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }
}
