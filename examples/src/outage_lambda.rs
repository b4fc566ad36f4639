//! The outage demo's DynamoDB fleet (`--dynamodb`): the full stack runs in
//! short-lived caller processes, as AWS Lambda instances do, whose
//! breakers share one circuit through the tower-breaker-dynamodb store.
//!
//! The parent (the demo) starts its own `moto_server` (a local
//! DynamoDB-compatible server, see `moto.rs`) on a free port of 127.0.0.1,
//! creates the table, keeps the dependency and the bare caller, and starts
//! caller processes on a timetable: [`--processes`](super::FleetArgs) of
//! them are calling at any time, each makes [`CALLS`] calls (open loop, at
//! its share of the rate) and exits, and the next ones take over. A process
//! is this executable again, with [`CHILD_ENV`] set: it builds its
//! `Breaker` on a `DynamoDbStore` (its "cold start"), waits for its turn,
//! reads the shared circuit (`Breaker::refresh`), makes its calls through
//! the full stack, and exits.
//!
//! No process can open the circuit by itself: each one's own window (the
//! last second, judged from 10 calls) never holds more than its [`CALLS`]
//! calls. The circuit opens because every process reports its outcomes to
//! the table (`Store::report`, the fleet's window: the same rule over the
//! whole fleet's calls), and a report that tips the fleet's window opens it
//! for everyone.
//!
//! A child reports on stdout as things happen, one line each:
//!
//! ```text
//! start <t> <C|O|H>                       it read the table and starts calling
//! iss <t>                                 a call went out
//! rec <issued t> <latency ns> <k|f|r> <core wait ns>
//!                                         a call ended: ok, failed, rejected
//! tr <t> <C|O|H> <cause: w its window, s the table, p a probe> <own window: calls> <failures>
//! usage <reads> <writes> <refused writes> <read units> <write units>
//! totals <opened> <rejected> <failed> <store errors>
//! end <t>
//! ```
//!
//! (`t`: seconds since the run's start, by the wall clock the parent passed
//! on.)

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tower_breaker::snapshot::Cause;
use tower_breaker::{Breaker, BreakerConfig, FleetConfig, State as CircuitState, Transition};
use tower_breaker_dynamodb::{DynamoDbOptions, DynamoDbStore};

use super::fleet::{FleetOutcome, FleetSecond};
use super::moto::{self, MotoServer};
use super::{
    after_election, breaker_config, ends_open_period, full_stack, stack_call, stack_url, Args,
    Budgets, FleetArgs, Outcome as Call, Record, Recorder,
};

/// Set on a child process: `index epoch-ms start-ms pace-us end-ms
/// dependency-address moto-url`.
pub(super) const CHILD_ENV: &str = "OUTAGE_LAMBDA_CHILD";

/// The calls each process makes before it exits.
pub(super) const CALLS: usize = 5;

/// The processes' window, their own and the fleet's: the last second, in
/// 10 buckets, judged from 10 calls (`breaker_config`'s minimum).
const BUCKETS: usize = 10;
const BUCKET: Duration = Duration::from_millis(100);

/// How often a process's breaker reads the table (or reports to it, when
/// it counted outcomes since its last report): 4 times in a life of about
/// a second.
const REFRESH: Duration = Duration::from_millis(250);

/// What the recovery's bound allows for the DynamoDB requests between the
/// end of the last open period and the moment every process knows the
/// circuit closed.
const STORE_ROUND_TRIPS: Duration = Duration::from_millis(100);

/// How long before its first call a process is started: its exec and its
/// cold start (runtime, SDK client, breaker) fit in this, on a busy
/// machine, in debug.
const LEAD: Duration = Duration::from_millis(400);

/// The table (moto is ours and fresh: no prefix needed).
const TABLE: &str = "tower-breaker";

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

/// The store's settings, for the parent and the children alike.
fn store_options() -> DynamoDbOptions {
    DynamoDbOptions::new()
        .table(TABLE)
        // moto is one Python process serving every caller on a busy 2-core
        // machine; DynamoDB in the same region answers in milliseconds
        // (keep the default 200 ms there).
        .timeout(Duration::from_secs(1))
        // Every process runs on this machine, with its clock: the lease of
        // a prober that exits without probing lapses 100 ms after its end.
        .max_clock_skew(Duration::from_millis(100))
}

/// The breaker settings of every process.
fn lambda_config(args: &Args) -> BreakerConfig {
    breaker_config(args)
        .time_window(BUCKETS, BUCKET)
        // The prober's lease: its probe is one call, bounded by the
        // timeout. A process that wins an election with its last call
        // exits without probing, and the fleet waits for this.
        .max_half_open_wait(args.timeout + Duration::from_millis(200))
}

/// Seconds since the run's start, by the wall clock (shared by every
/// process on the machine).
#[derive(Debug, Clone, Copy)]
struct Clock {
    epoch: SystemTime,
}

impl Clock {
    fn now(self) -> f64 {
        match SystemTime::now().duration_since(self.epoch) {
            Ok(d) => d.as_secs_f64(),
            Err(e) => -e.duration().as_secs_f64(),
        }
    }

    /// How long until `t`.
    fn until(self, t: f64) -> Duration {
        Duration::from_secs_f64((t - self.now()).max(0.0))
    }
}

// =============================================================== the store

// =================================================================== child

/// What a child process is told by its parent.
#[derive(Debug)]
pub(super) struct ChildSpec {
    index: usize,
    clock: Clock,
    /// When its first call is due (seconds since the run's start).
    start: f64,
    pace: Duration,
    /// No call goes out at or after this.
    end: f64,
    dependency: SocketAddr,
    url: String,
}

/// `Some` in a child process of the DynamoDB fleet.
pub(super) fn child_spec() -> Option<Result<ChildSpec, String>> {
    let spec = std::env::var(CHILD_ENV).ok()?;
    let parse = || -> Option<ChildSpec> {
        let mut it = spec.split(' ');
        let mut num = || it.next()?.parse::<u64>().ok();
        let index = num()? as usize;
        let epoch = UNIX_EPOCH + Duration::from_millis(num()?);
        let start = num()? as f64 / 1000.0;
        let pace = Duration::from_micros(num()?);
        let end = num()? as f64 / 1000.0;
        let dependency = it.next()?.parse().ok()?;
        let url = it.next()?.to_owned();
        it.next().is_none().then_some(ChildSpec {
            index,
            clock: Clock { epoch },
            start,
            pace,
            end,
            dependency,
            url,
        })
    };
    Some(parse().ok_or_else(|| format!("{CHILD_ENV} is malformed: {spec:?}")))
}

/// One short-lived caller process: a cold start, [`CALLS`] calls through
/// the full stack, the last reports, the end. Returns the exit code.
pub(super) async fn run_child(args: &Args, spec: ChildSpec) -> i32 {
    let me = spec.index + 1;
    let clock = spec.clock;
    let store = match DynamoDbStore::new(moto::client(&spec.url), store_options()) {
        Ok(store) => Arc::new(store),
        Err(e) => {
            eprintln!("process {me}: {e}");
            return 2;
        }
    };
    let config = lambda_config(args)
        .fleet(FleetConfig::new(store.clone()).refresh_interval(REFRESH))
        .listener(move |t: &Transition| {
            println!(
                "tr {:.6} {} {} {} {}",
                clock.now(),
                letter(t.to),
                cause_letter(t.cause),
                t.window.calls,
                t.window.failures
            );
        });
    let breaker = match Breaker::try_with_config("dependency", config) {
        Ok(breaker) => breaker,
        Err(e) => {
            eprintln!("process {me}: {e}");
            return 2;
        }
    };
    let client = full_stack(args, breaker.clone());

    // Its turn: learn the fleet's circuit, then call.
    tokio::time::sleep(clock.until(spec.start)).await;
    if let Err(e) = breaker.refresh().await {
        eprintln!("process {me}: could not read the shared circuit: {e}");
    }
    println!(
        "start {:.6} {}",
        clock.now(),
        letter(breaker.snapshot().state)
    );
    let url = stack_url(spec.dependency, spec.index);
    let call = |issued: f64| {
        println!("iss {issued:.6}");
        let (client, url) = (client.clone(), url.clone());
        let ended = ends_open_period(&breaker);
        tokio::spawn(async move {
            let (outcome, _, timing) = stack_call(&client, &url).await;
            let o = match after_election(outcome, ended) {
                Call::Ok => 'k',
                Call::Failed => 'f',
                Call::Rejected => 'r',
                Call::Elected => 'e',
            };
            println!(
                "rec {issued:.6} {} {o} {}",
                timing.latency.as_nanos(),
                timing.core_wait.as_nanos()
            );
        })
    };
    let mut tick = tokio::time::interval(spec.pace);
    // A stall of this process (a busy machine) skips the ticks it
    // missed: sent at once, they would be a burst the bulkhead
    // rightly refuses, which the recovery check would read as the
    // circuit not recovered ("recovery never" under load).
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut calls = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        tick.tick().await;
        let issued = clock.now();
        if issued >= spec.end {
            break;
        }
        calls.push(call(issued));
    }
    for call in calls {
        let _ = call.await;
    }

    // The store calls that the last calls started (an election, a
    // report) end before the process goes on.
    let _ = breaker.flush().await;
    // A process whose last call won the fleet's election probes before it
    // exits, with one more call, rather than hold the fleet's probe until
    // its lease lapses.
    if breaker.snapshot().state == CircuitState::HalfOpen {
        tick.tick().await;
        let _ = call(clock.now()).await;
    }
    // Before it exits, everything it counted reaches the table, as a
    // Lambda handler's outcomes must before the handler returns (the
    // instance is frozen then): `flush` reports what was not reported and
    // waits for the store calls in flight; with nothing pending it makes
    // no request.
    if let Err(left) = breaker.flush().await {
        eprintln!("process {me}: {left}");
    }

    let u = store.usage();
    let t = breaker.snapshot().totals;
    println!(
        "usage {} {} {} {} {}",
        u.reads, u.writes, u.refused, u.read_units, u.write_units
    );
    println!(
        "totals {} {} {} {}",
        t.opened, t.rejected, t.failed, t.store_errors
    );
    println!("end {:.6}", clock.now());
    0
}

// ================================================================== parent

/// What a process asked of DynamoDB (its store's `usage()`).
#[derive(Debug, Default, Clone, Copy)]
struct Cost {
    reads: u64,
    writes: u64,
    /// Of the writes, those refused by their condition (contention).
    refused: u64,
    read_units: f64,
    write_units: f64,
}

/// What the parent heard from one process.
#[derive(Debug, Default, Clone)]
struct Life {
    /// When its first call was due.
    due: f64,
    /// When it had read the table, and the circuit it read.
    started: Option<(f64, CircuitState)>,
    issued: Vec<f64>,
    records: Vec<Record>,
    /// (at, to, cause: `w` its own window, `s` the table, `p` a probe or
    /// its end, its own window's calls, failures)
    transitions: Vec<(f64, CircuitState, char, u64, u64)>,
    usage: Cost,
    /// (opened, rejected, failed, store errors)
    totals: (u64, u64, u64, u64),
    ended: Option<f64>,
    /// Its stdout closed (it exited or died).
    gone: bool,
}

impl Life {
    /// Takes one line of the protocol; `None` if it is not one.
    fn take(&mut self, line: &str) -> Option<()> {
        let w: Vec<&str> = line.split(' ').collect();
        let f = |i: usize| w.get(i)?.parse::<f64>().ok();
        let n = |i: usize| w.get(i)?.parse::<u64>().ok();
        let state = |i: usize| match *w.get(i)? {
            "C" => Some(CircuitState::Closed),
            "O" => Some(CircuitState::Open),
            "H" => Some(CircuitState::HalfOpen),
            _ => None,
        };
        match w[0] {
            "start" => self.started = Some((f(1)?, state(2)?)),
            "iss" => self.issued.push(f(1)?),
            "rec" => {
                let outcome = match *w.get(3)? {
                    "k" => Call::Ok,
                    "f" => Call::Failed,
                    "r" => Call::Rejected,
                    "e" => Call::Elected,
                    _ => return None,
                };
                self.records.push(Record {
                    issued: f(1)?,
                    latency: Duration::from_nanos(n(2)?),
                    core_wait: Duration::from_nanos(n(4)?),
                    outcome,
                });
            }
            "tr" => {
                let cause = w.get(3)?.chars().next()?;
                self.transitions
                    .push((f(1)?, state(2)?, cause, n(4)?, n(5)?));
            }
            "usage" => {
                self.usage = Cost {
                    reads: n(1)?,
                    writes: n(2)?,
                    refused: n(3)?,
                    read_units: f(4)?,
                    write_units: f(5)?,
                };
            }
            "totals" => self.totals = (n(1)?, n(2)?, n(3)?, n(4)?),
            "end" => self.ended = Some(f(1)?),
            _ => return None,
        }
        Some(())
    }

    /// Its circuit at `t`, if it was calling then.
    fn state_at(&self, t: f64) -> Option<CircuitState> {
        let (started, cold) = self.started?;
        if t < started || self.ended.is_some_and(|e| t >= e) {
            return None;
        }
        Some(
            self.transitions
                .iter()
                .rev()
                .find(|tr| tr.0 >= started && tr.0 <= t)
                .map_or(cold, |tr| tr.1),
        )
    }

    /// Its calls in the order they went out: `k` ok, `f` failed, `r`
    /// rejected.
    fn calls(&self) -> String {
        let mut calls: Vec<&Record> = self.records.iter().collect();
        calls.sort_by(|a, b| a.issued.total_cmp(&b.issued));
        calls
            .iter()
            .map(|r| match r.outcome {
                Call::Ok => 'k',
                Call::Failed => 'f',
                Call::Rejected => 'r',
                Call::Elected => 'e',
            })
            .collect()
    }

    /// `O`: the table said open at its start; `!`: its circuit opened while
    /// it called; `P`: it won a probe election.
    fn marks(&self) -> String {
        let Some((started, cold)) = self.started else {
            return "(never started)".to_owned();
        };
        let opened = self
            .transitions
            .iter()
            .any(|tr| tr.0 >= started && tr.1 == CircuitState::Open);
        format!(
            "{}{}{}",
            if cold == CircuitState::Closed {
                ""
            } else {
                "O"
            },
            if opened { "!" } else { "" },
            if self.probes().is_empty() { "" } else { "P" }
        )
    }

    fn lifetime(&self) -> f64 {
        match (self.started, self.ended) {
            (Some((s, _)), Some(e)) => (e - s).max(0.0),
            _ => 0.0,
        }
    }

    /// When it won a probe election, and what became of its probe
    /// (closed: ok; opened: failed; `None`: it ended without probing).
    fn probes(&self) -> Vec<(f64, Option<CircuitState>, f64)> {
        let mut out = Vec::new();
        for (i, tr) in self.transitions.iter().enumerate() {
            if tr.1 == CircuitState::HalfOpen {
                let next = self.transitions[i + 1..].first();
                let until = next.map_or(self.ended.unwrap_or(tr.0), |n| n.0);
                out.push((tr.0, next.map(|n| n.1), until));
            }
        }
        out
    }
}

/// The short-lived fleet: moto, the table, the timetable of processes.
#[derive(Debug)]
pub(super) struct LambdaFleet {
    lives: Arc<Mutex<Vec<Life>>>,
    children: Arc<Mutex<Vec<Child>>>,
    spawner: Option<JoinHandle<Result<(), String>>>,
    dependency: SocketAddr,
    /// Processes calling at once.
    concurrent: usize,
    /// Each process's interval between two calls.
    pace: Duration,
    // Dropped after the processes (fields drop in order).
    moto: MotoServer,
}

impl LambdaFleet {
    /// Creates the table on `moto`; the processes start with [`go`].
    ///
    /// [`go`]: LambdaFleet::go
    pub(super) async fn start(
        args: &Args,
        fleet: &FleetArgs,
        dependency: SocketAddr,
        moto: MotoServer,
    ) -> Result<Self, String> {
        DynamoDbStore::new(moto::client(moto.url()), store_options())
            .map_err(|e| e.to_string())?
            .create_table()
            .await
            .map_err(|e| format!("could not create the table: {e}"))?;
        let concurrent = fleet.processes;
        Ok(Self {
            lives: Arc::default(),
            children: Arc::default(),
            spawner: None,
            dependency,
            concurrent,
            pace: Duration::from_secs_f64(concurrent as f64 / f64::from(args.rate)),
            moto,
        })
    }

    /// The time between two process starts.
    fn every(&self) -> Duration {
        self.pace * CALLS as u32 / self.concurrent as u32
    }

    /// The header lines that say how the fleet runs.
    pub(super) fn describe(&self, args: &Args) -> String {
        let per = 1.0 / self.pace.as_secs_f64();
        format!(
            "  breaker state: shared through DynamoDB (a moto_server started for this run at {}, \
             table {TABLE:?})\n  \
             the full stack runs in short-lived caller processes, as Lambda instances: {} \
             calling at any time, each making {CALLS} calls at {per:.0}/s ({:.1} s) and exiting;\n  \
             a new one every {} ms ({} in the run), each reading the table at its start and \
             reporting to it every {} ms;\n  \
             each process's own window (the last {:.0} s, judged from 10 calls) never holds \
             more than its {CALLS} calls: only the fleet's window in the table can open the \
             circuit\n  \
             live line: circuits = the breaker of each process calling then (C closed, O open, \
             H half-open)",
            self.moto.url(),
            self.concurrent,
            self.pace.as_secs_f64() * CALLS as f64,
            self.every().as_millis(),
            self.planned(args),
            REFRESH.as_millis(),
            (BUCKET * BUCKETS as u32).as_secs_f64(),
        )
    }

    /// How many processes the run starts.
    fn planned(&self, args: &Args) -> usize {
        (args.duration.as_secs_f64() / self.every().as_secs_f64()).ceil() as usize
    }

    /// Starts the run's clock and the timetable: process `g`'s first call
    /// is due at `g` times [`every`](Self::every); it is started
    /// [`LEAD`] before.
    pub(super) fn go(&mut self, args: &Args) {
        let epoch = SystemTime::now();
        let start = Instant::now();
        let planned = self.planned(args);
        let every = self.every();
        let (lives, children) = (self.lives.clone(), self.children.clone());
        let exe = std::env::current_exe();
        let fixed = format!(
            "{} {} {} {}",
            self.pace.as_micros(),
            args.duration.as_millis(),
            self.dependency,
            self.moto.url()
        );
        let epoch_ms = epoch
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        self.spawner = Some(tokio::spawn(async move {
            let exe = exe.map_err(|e| format!("no current executable: {e}"))?;
            for g in 0..planned {
                let due = every * g as u32;
                tokio::time::sleep_until((start + due).checked_sub(LEAD).unwrap_or(start)).await;
                let mut child = Command::new(&exe)
                    .args(std::env::args_os().skip(1))
                    .env(
                        CHILD_ENV,
                        format!("{g} {epoch_ms} {} {fixed}", due.as_millis()),
                    )
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .map_err(|e| format!("could not start caller process {}: {e}", g + 1))?;
                let stdout = child.stdout.take().expect("piped stdout");
                lock(&lives).push(Life {
                    due: due.as_secs_f64(),
                    ..Life::default()
                });
                lock(&children).push(child);
                let lives = lives.clone();
                std::thread::spawn(move || {
                    for line in BufReader::new(stdout).lines() {
                        let Ok(line) = line else { break };
                        if lock(&lives)[g].take(&line).is_none() {
                            eprintln!("process {}: {line}", g + 1);
                        }
                    }
                    lock(&lives)[g].gone = true;
                });
            }
            Ok(())
        }));
    }

    /// The fleet's figures of second `s` (its lines arrive within a few
    /// milliseconds; 100 ms are allowed).
    pub(super) async fn second(&self, s: usize) -> FleetSecond {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (from, to) = (s as f64, s as f64 + 1.0);
        let mut f = FleetSecond {
            done: 0,
            ok: 0,
            in_flight: 0,
            circuits: String::new(),
        };
        for life in lock(&self.lives).iter() {
            for r in &life.records {
                let done = r.issued + r.latency.as_secs_f64();
                if done >= from && done < to {
                    f.done += 1;
                    f.ok += u64::from(r.outcome == Call::Ok);
                }
            }
            let issued = life.issued.iter().filter(|&&t| t < to).count();
            let done = life
                .records
                .iter()
                .filter(|r| r.issued + r.latency.as_secs_f64() < to)
                .count();
            f.in_flight += issued.saturating_sub(done) as i64;
            if let Some(state) = life.state_at(to) {
                f.circuits.push(letter(state));
            }
        }
        if f.circuits.is_empty() {
            f.circuits.push('-');
        }
        f
    }

    /// Waits for the last process's last report.
    pub(super) async fn finish(&mut self, args: &Args) -> Result<LambdaOutcome, String> {
        if let Some(spawner) = self.spawner.take() {
            spawner
                .await
                .map_err(|e| format!("the process timetable failed: {e}"))??;
        }
        let deadline = Instant::now() + args.timeout * 3 + REFRESH + Duration::from_secs(10);
        loop {
            let (n, ended, lost) = {
                let lives = lock(&self.lives);
                let ended = lives.iter().filter(|l| l.ended.is_some()).count();
                let lost = lives.iter().filter(|l| l.gone && l.ended.is_none()).count();
                (lives.len(), ended, lost)
            };
            if lost > 0 {
                return Err(format!("{lost} caller process(es) exited without a report"));
            }
            if ended == n {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "only {ended} of {n} caller processes reported in time"
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for child in lock(&self.children).iter_mut() {
            let _ = child.wait();
        }
        // The reader threads are done once each stdout closed.
        let deadline = Instant::now() + Duration::from_secs(2);
        while lock(&self.lives).iter().any(|l| !l.gone) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(LambdaOutcome {
            lives: lock(&self.lives).clone(),
            concurrent: self.concurrent,
            pace: self.pace,
            out: (
                args.outage_start().as_secs_f64(),
                args.outage_end().as_secs_f64(),
            ),
            timeout: args.timeout,
            open_period: args.open_period,
        })
    }
}

impl Drop for LambdaFleet {
    fn drop(&mut self) {
        if let Some(spawner) = &self.spawner {
            spawner.abort();
        }
        for child in lock(&self.children).iter_mut() {
            if !matches!(child.try_wait(), Ok(Some(_))) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

// ================================================================= outcome

/// What the short-lived processes reported.
#[derive(Debug)]
pub(super) struct LambdaOutcome {
    lives: Vec<Life>,
    concurrent: usize,
    pace: Duration,
    /// The outage, in seconds since the start.
    out: (f64, f64),
    timeout: Duration,
    open_period: Duration,
}

impl LambdaOutcome {
    /// Every process's circuit changes, in order: (at, process, its circuit
    /// from then on; `None`: it ended).
    fn events(&self) -> Vec<(f64, usize, Option<CircuitState>)> {
        let mut all = Vec::new();
        for (i, life) in self.lives.iter().enumerate() {
            let Some((started, cold)) = life.started else {
                continue;
            };
            all.push((started, i, Some(cold)));
            for tr in life.transitions.iter().filter(|tr| tr.0 >= started) {
                all.push((tr.0, i, Some(tr.1)));
            }
            if let Some(end) = life.ended {
                all.push((end, i, None));
            }
        }
        all.sort_by(|a, b| a.0.total_cmp(&b.0));
        all
    }

    /// The fleet's circuit over time: (at, open: some process calling then
    /// was not closed; every process calling then was not closed).
    fn fleet_states(&self) -> Vec<(f64, bool, bool)> {
        let mut states: Vec<Option<CircuitState>> = vec![None; self.lives.len()];
        let mut out = Vec::new();
        for (at, i, state) in self.events() {
            states[i] = state;
            let alive: Vec<CircuitState> = states.iter().flatten().copied().collect();
            if alive.is_empty() {
                continue; // nobody calling: the last picture stands
            }
            let any = alive.iter().any(|s| *s != CircuitState::Closed);
            let all = alive.iter().all(|s| *s != CircuitState::Closed);
            out.push((at, any, all));
        }
        out
    }

    /// The first opening of the table, as the process whose report tipped
    /// it saw it: (at, process, its own window's calls, failures).
    fn first_opening(&self) -> Option<(f64, usize, u64, u64)> {
        self.lives
            .iter()
            .enumerate()
            .flat_map(|(i, l)| {
                l.transitions
                    .iter()
                    .filter(|tr| tr.1 == CircuitState::Open && tr.2 == 's' && tr.0 >= self.out.0)
                    .map(move |tr| (tr.0, i, tr.3, tr.4))
            })
            .min_by(|a, b| a.0.total_cmp(&b.0))
    }

    /// Every election won: (at, process, what became of the probe, until).
    fn probes(&self) -> Vec<(f64, usize, Option<CircuitState>, f64)> {
        let mut all: Vec<_> = self
            .lives
            .iter()
            .enumerate()
            .flat_map(|(i, l)| {
                l.probes()
                    .into_iter()
                    .map(move |(at, to, until)| (at, i, to, until))
            })
            .collect();
        all.sort_by(|a, b| a.0.total_cmp(&b.0));
        all
    }

    /// What the processes whose first call was due in `[from, to)` asked
    /// of DynamoDB, all together.
    fn cost(&self, from: f64, to: f64) -> Spent {
        let mut c = Spent::default();
        for l in self
            .lives
            .iter()
            .filter(|l| l.due >= from && l.due < to && l.ended.is_some())
        {
            c.processes += 1;
            c.reads += l.usage.reads;
            c.writes += l.usage.writes;
            c.refused += l.usage.refused;
            c.read_units += l.usage.read_units;
            c.write_units += l.usage.write_units;
            c.alive += l.lifetime();
            c.store_errors += l.totals.3;
        }
        c
    }
}

/// What a group of processes asked of DynamoDB.
#[derive(Debug, Default)]
struct Spent {
    processes: usize,
    reads: u64,
    writes: u64,
    refused: u64,
    read_units: f64,
    write_units: f64,
    /// Seconds alive, all together.
    alive: f64,
    store_errors: u64,
}

impl FleetOutcome for LambdaOutcome {
    fn processes(&self) -> usize {
        self.lives.len()
    }

    fn recorder(&self, secs: usize) -> Recorder {
        let rec = Recorder::new(secs);
        // Calls in flight over time, from every issue and every end.
        let mut steps: Vec<(f64, i64)> = Vec::new();
        let mut records = lock(&rec.records);
        for l in &self.lives {
            records.extend_from_slice(&l.records);
            steps.extend(l.records.iter().map(|r| (r.issued, 1)));
            steps.extend(
                l.records
                    .iter()
                    .map(|r| (r.issued + r.latency.as_secs_f64(), -1)),
            );
        }
        records.sort_by(|a, b| a.issued.total_cmp(&b.issued));
        drop(records);
        steps.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
        let mut level = 0;
        let mut second = 0;
        for (at, step) in steps {
            let s = (at.max(0.0) as usize).min(secs.saturating_sub(1));
            while second < s {
                second += 1;
                rec.peak[second].fetch_max(level, Relaxed);
            }
            level += step;
            rec.peak[s].fetch_max(level, Relaxed);
        }
        rec
    }

    fn transitions(&self) -> Vec<(f64, CircuitState)> {
        let mut out = Vec::new();
        let mut open = false;
        for (at, any, _) in self.fleet_states() {
            if any != open {
                open = any;
                let to = if any {
                    CircuitState::Open
                } else {
                    CircuitState::Closed
                };
                out.push((at, to));
            }
        }
        out
    }

    fn open_everywhere(&self) -> Option<f64> {
        let first = self.first_opening()?.0;
        self.fleet_states()
            .into_iter()
            .find(|&(at, _, all)| at >= first && all)
            .map(|(at, _, _)| at)
    }

    fn opened(&self) -> u64 {
        self.lives.iter().map(|l| l.totals.0).sum()
    }

    fn rejected(&self) -> u64 {
        self.lives.iter().map(|l| l.totals.1).sum()
    }

    fn learns_within(&self) -> (Duration, String) {
        (
            REFRESH + STORE_ROUND_TRIPS,
            format!(
                "the processes' refresh interval, {} ms: a process learns the close at its \
                 next read of the table; and {} ms for the store's round trips on the way, the \
                 re-opening, the election, the close and that read: moto answers in about 10 \
                 to 40 ms on a busy 2-core machine",
                REFRESH.as_millis(),
                STORE_ROUND_TRIPS.as_millis()
            ),
        )
    }

    fn call_interval(&self) -> Duration {
        self.pace
    }

    fn probes_sent(&self, from: f64, to: f64) -> usize {
        self.probes()
            .iter()
            .filter(|p| p.0 >= from && p.0 < to)
            .count()
    }

    /// The table's last open period before the probe that closed it after
    /// the hang: from the hang's last failed probe (or its first opening)
    /// to that election.
    fn open_period_in_force(&self) -> Option<f64> {
        let probes = self.probes();
        let closing = probes
            .iter()
            .position(|p| p.0 >= self.out.1 && p.2 == Some(CircuitState::Closed))?;
        let opened = match probes[..closing]
            .iter()
            .rev()
            .find(|p| p.0 >= self.out.0 && p.2 == Some(CircuitState::Open))
        {
            Some(failed) => failed.3,
            None => self.first_opening()?.0,
        };
        Some(probes[closing].0 - opened)
    }

    fn budgets(&self) -> Budgets {
        // The processes calling at a time, each at its pace.
        Budgets::Fleet(self.concurrent as f64 / self.pace.as_secs_f64().max(1e-9))
    }

    fn print(&self, args: &Args) {
        let n = self.lives.len();
        println!(
            "\nFleet ({n} short-lived processes, {} calling at a time, one circuit in DynamoDB):",
            self.concurrent
        );
        match self.first_opening() {
            Some((at, i, calls, failures)) => println!(
                "  the table opened the circuit {:.2} s after the dependency started hanging, when \
                 process {}'s report tipped the fleet's window (its own window then held \
                 {calls} call(s), {failures} failed; alone a process needs 10 calls in {:.0} s, half of them \
                 failed, and none ever makes more than {CALLS})",
                at - self.out.0,
                i + 1,
                (BUCKET * BUCKETS as u32).as_secs_f64()
            ),
            None => println!("  the circuit never opened during the outage"),
        }
        if let Some(all) = self.open_everywhere() {
            println!(
                "  every process calling was rejecting {:.0} ms later",
                (all - self.first_opening().map_or(all, |f| f.0)) * 1000.0
            );
        }
        let probes: Vec<String> = self
            .probes()
            .iter()
            .map(|&(at, i, to, _)| {
                let what = match to {
                    Some(CircuitState::Closed) => "ok, closed",
                    Some(CircuitState::Open) => "failed, re-opened",
                    _ => "ended without probing",
                };
                format!("#{} at {at:.2} s ({what})", i + 1)
            })
            .collect();
        println!(
            "  probes, one at a time for the whole fleet: {}",
            if probes.is_empty() {
                "none".to_owned()
            } else {
                probes.join(", ")
            }
        );

        println!(
            "\nEach process: its calls in order (k ok, f failed, r rejected; a 6th: the probe of a \
             process that won the election with its last calls), then O if the table said open \
             at its start, ! if its circuit opened while it called, P if it won a probe election; \
             in a run of processes alike, the first and the last:"
        );
        let mut runs: Vec<(usize, usize, String)> = Vec::new();
        for (i, l) in self.lives.iter().enumerate() {
            let shown = format!("{} {}", l.calls(), l.marks());
            match runs.last_mut() {
                Some(run) if run.2 == shown => run.1 = i,
                _ => runs.push((i, i, shown)),
            }
        }
        let mut line = String::new();
        for (k, (first, last, shown)) in runs.iter().enumerate() {
            let who = if first == last {
                format!("#{}", first + 1)
            } else {
                format!("#{}-#{}", first + 1, last + 1)
            };
            let _ = write!(line, "  {who:>8} {shown:<10}");
            if (k + 1) % 5 == 0 || k + 1 == runs.len() {
                println!("{}", line.trim_end());
                line.clear();
            }
        }

        // What DynamoDB was asked, per process.
        let life = self.pace.as_secs_f64() * CALLS as f64;
        println!(
            "\nDynamoDB: requests per process (GetItem reads + PutItem/UpdateItem writes, from \
             `DynamoDbStore::usage`); items are under 1 KB, so each request costs 1 capacity \
             unit (a strongly consistent read 1 RCU, a write 1 WCU, refused conditional writes \
             included); \"reported\": the units moto returned:"
        );
        println!(
            "| processes whose first call was due | processes | alive, each | requests each | \
             per process-minute | the fleet, per minute | refused writes | reported RCU + WCU \
             per process-minute | store errors |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        let rows = [
            ("before the outage (steady state)", 0.0, self.out.0 - life),
            ("in the outage", self.out.0, self.out.1),
            ("after it", self.out.1, args.duration.as_secs_f64()),
        ];
        for (what, from, to) in rows {
            let c = self.cost(from, to);
            if c.processes == 0 {
                continue;
            }
            let k = c.processes as f64;
            let per_min = |v: f64| v / c.alive.max(1e-9) * 60.0;
            println!(
                "| {what}, {from:.1} to {to:.1} s | {} | {:.2} s | {:.1} + {:.1} | {:.0} + {:.0} | \
                 {:.0} + {:.0} | {} | {:.0} + {:.0} | {} |",
                c.processes,
                c.alive / k,
                c.reads as f64 / k,
                c.writes as f64 / k,
                per_min(c.reads as f64),
                per_min(c.writes as f64),
                c.reads as f64 / (to - from) * 60.0,
                c.writes as f64 / (to - from) * 60.0,
                c.refused,
                per_min(c.read_units),
                per_min(c.write_units),
                c.store_errors,
            );
        }
        let total: u64 = self
            .lives
            .iter()
            .map(|l| l.usage.reads + l.usage.writes)
            .sum();
        let calls: usize = self.lives.iter().map(|l| l.records.len()).sum();
        println!(
            "In all: {total} requests for {calls} calls ({:.2} per call), {:.1} per second of the run.",
            total as f64 / calls.max(1) as f64,
            total as f64 / args.duration.as_secs_f64()
        );
    }

    fn verdict(&self) -> Vec<String> {
        let mut failures = Vec::new();
        // In the hang (in the 503s a process's retries can fill its own
        // window: every attempt counts).
        for (i, l) in self.lives.iter().enumerate() {
            if l.transitions
                .iter()
                .any(|tr| tr.2 == 'w' && tr.0 >= self.out.0)
            {
                failures.push(format!(
                    "process {} tripped on its own window instead of the fleet's",
                    i + 1
                ));
            }
        }
        if self.first_opening().is_none() {
            failures.push("the table never opened the circuit in the outage".to_owned());
        }
        // Processes that started while the table said open never called
        // the dependency, except a winner of the fleet's probe election.
        let started_open: Vec<(usize, &Life)> = self
            .lives
            .iter()
            .enumerate()
            .filter(|(_, l)| l.started.is_some_and(|(_, s)| s == CircuitState::Open))
            .collect();
        if started_open.is_empty() {
            failures.push("no process started while the circuit was open".to_owned());
        }
        for (i, l) in started_open {
            let mut calls: Vec<&Record> = l.records.iter().collect();
            calls.sort_by(|a, b| a.issued.total_cmp(&b.issued));
            // A call refused after the election it started (lost) did not
            // call the dependency either.
            let called = |r: &&Record| !matches!(r.outcome, Call::Rejected | Call::Elected);
            if calls.first().is_some_and(called) && l.probes().is_empty() {
                failures.push(format!(
                    "process {} started with the circuit open but called the dependency",
                    i + 1
                ));
            }
        }
        // One probe at a time: no election won while a probe was out.
        let probes = self.probes();
        for pair in probes.windows(2) {
            if pair[1].0 < pair[0].3 - 0.001 {
                failures.push(format!(
                    "two probes at once: process {} at {:.2} s, process {} at {:.2} s",
                    pair[0].1 + 1,
                    pair[0].0,
                    pair[1].1 + 1,
                    pair[1].0
                ));
            }
        }
        // Once every process calling rejected, the only calls that waited
        // for the dependency were the probes.
        if let Some(from) = self.open_everywhere() {
            let slow = self
                .lives
                .iter()
                .flat_map(|l| &l.records)
                .filter(|r| {
                    r.issued >= from
                        && r.issued < self.out.1
                        && !matches!(r.outcome, Call::Rejected | Call::Elected)
                        && r.latency > self.timeout / 10
                })
                .count();
            let probed = probes
                .iter()
                .filter(|p| p.0 >= from - self.open_period.as_secs_f64() && p.0 < self.out.1)
                .count();
            if slow > probed {
                failures.push(format!(
                    "{slow} calls waited for the hanging dependency once every process was \
                     open, more than its {probed} probes"
                ));
            }
        }
        failures
    }

    fn held(&self) -> String {
        format!(
            "The fleet shared one circuit: processes of {CALLS} calls each, none able to trip \
             alone, opened it together through the table; processes started while it was open \
             rejected from their first call; one probe at a time."
        )
    }
}

/// The kind of a transition's cause, for the protocol.
fn cause_letter(cause: Cause) -> char {
    match cause {
        Cause::Store => 's',
        Cause::FailureRate | Cause::SlowCallRate | Cause::ConsecutiveFailures => 'w',
        _ => 'p',
    }
}
