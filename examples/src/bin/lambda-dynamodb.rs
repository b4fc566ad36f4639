//! A circuit breaker for AWS Lambda functions whose state lives in
//! DynamoDB: every instance of the function, each its own process, shares
//! one circuit through a table.
//!
//! The function is [`handler`]: a plain `async fn(event, &Context) ->
//! Result<Response, Error>`, as a Lambda function has. Its [`Context`] (the
//! `Breaker` on a `DynamoDbStore`, the HTTP client) is built once per cold
//! start and lives across invocations. With the `lambda_runtime` crate
//! (serde's derives on `Event` and `Response`, and the SDK client from
//! `aws_config::load_from_env().await` instead of `moto::client`), it plugs
//! in as:
//!
//! ```text
//! #[tokio::main]
//! async fn main() -> Result<(), lambda_runtime::Error> {
//!     let ctx = Context::cold_start(&Config::from_env()?).await?; // once per instance
//!     let ctx = &ctx;
//!     lambda_runtime::run(lambda_runtime::service_fn(move |event: LambdaEvent<Event>| async move {
//!         handler(event.payload, ctx).await
//!     }))
//!     .await
//! }
//! ```
//!
//! Lambda freezes an instance as soon as its handler returns, and the
//! breaker's store calls run in tasks beside the calls they follow: so the
//! handler ends with [`Breaker::flush`], which reports the invocation's
//! outcome and waits for the store calls in flight (one request per
//! invocation that called the dependency; none when nothing is pending).
//! A handler that is a tower service can be wrapped in
//! `tower_breaker::FlushLayer` instead.
//!
//! Here `main` plays Lambda instead: it starts a local DynamoDB
//! (`moto_server`, on 127.0.0.1), a local dependency that it can make
//! fail, and three function instances (this executable again, in a hidden
//! role), hands them events one at a time, and tells what happens: the
//! dependency fails, the instances' failures *together* open the circuit
//! (no instance has seen enough to open alone), every instance rejects
//! (an instance cold-started meanwhile too, from its first event), one
//! instance probes when the open period ends, and the circuit closes for
//! all once the dependency is back. It exits non-zero if the shared
//! circuit did not behave so.
//!
//! ```text
//! cargo run -p examples --bin lambda-dynamodb
//! ```

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::time::Instant;
use tower_breaker::snapshot::Cause;
use tower_breaker::{Breaker, BreakerConfig, FleetConfig, Outcome, State, Transition};
use tower_breaker_dynamodb::{DynamoDbOptions, DynamoDbStore};

#[path = "../moto.rs"]
mod moto;

/// Lambda's error type (`lambda_runtime::Error` is the same box).
type Error = Box<dyn std::error::Error + Send + Sync>;

/// The table every instance shares.
const TABLE: &str = "circuits";
/// How long the circuit stays open before one instance probes.
const OPEN_PERIOD: Duration = Duration::from_secs(2);
/// Set on an instance's process: `index moto-url dependency-url`.
const INSTANCE_ENV: &str = "LAMBDA_DEMO_INSTANCE";

// ================================================================ function

/// What the function learns from its environment (in Lambda: environment
/// variables, and `aws_config::load_from_env()` for the client).
#[derive(Debug)]
struct Config {
    dynamodb_url: String,
    dependency_url: String,
}

/// The invocation's input.
#[derive(Debug)]
struct Event {
    order: u64,
}

/// The invocation's output (for API Gateway: a status, a body and a
/// `Retry-After`).
#[derive(Debug)]
struct Response {
    status: u16,
    body: String,
    retry_after: Option<Duration>,
}

/// What an instance builds at its cold start and keeps across
/// invocations.
#[derive(Debug)]
struct Context {
    breaker: Breaker,
    store: Arc<DynamoDbStore>,
    http: reqwest::Client,
    dependency_url: String,
}

impl Context {
    /// Once per instance: the store, the breaker on it, the HTTP client;
    /// then one read of the table, so that an instance started while the
    /// circuit is open rejects from its first invocation.
    async fn cold_start(config: &Config) -> Result<Self, Error> {
        let options = DynamoDbOptions::new()
            .table(TABLE)
            // moto is a Python process on a busy machine; against DynamoDB
            // in the same region keep the default (200 ms).
            .timeout(Duration::from_secs(1));
        let store = Arc::new(DynamoDbStore::new(
            moto::client(&config.dynamodb_url),
            options,
        )?);
        let breaker_config = BreakerConfig::new()
            // Judge the last 5 s once they hold 10 calls: an instance's own
            // window, and the fleet's window in the table (the same rule
            // applied to every instance's calls together).
            .time_window(5, Duration::from_secs(1))
            .minimum_calls(10)
            .failure_rate(0.5)
            .open_period(OPEN_PERIOD)
            // The prober's lease: a probe is one call of at most 1 s.
            .max_half_open_wait(Duration::from_secs(2))
            // Read (or report to) the table at most every 200 ms; the
            // default is 1 s, one request a second per busy instance.
            .fleet(FleetConfig::new(store.clone()).refresh_interval(Duration::from_millis(200)))
            .listener(|t: &Transition| {
                // Only for this demo: tell `main` (see `instance`).
                let by = match t.cause {
                    Cause::Store => "table",
                    Cause::FailureRate | Cause::ConsecutiveFailures => "window",
                    _ => "probe",
                };
                println!("tr {} {by}", letter(t.to));
            });
        let breaker = Breaker::try_with_config("inventory", breaker_config)?;
        breaker.refresh().await?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()?;
        Ok(Self {
            breaker,
            store,
            http,
            dependency_url: config.dependency_url.clone(),
        })
    }
}

/// The function: asks the breaker, calls the dependency, records the
/// outcome. An open circuit answers at once with a 503 and when to come
/// back; a failed dependency is the invocation's error.
async fn handler(event: Event, ctx: &Context) -> Result<Response, Error> {
    let result = order(event, ctx).await;
    // The instance may be frozen as soon as this returns: the outcome
    // reaches the table first.
    if let Err(left) = ctx.breaker.flush().await {
        eprintln!("{left}");
    }
    result
}

/// The invocation's work: one call of the dependency through the breaker.
///
/// `acquire`, not `try_acquire`: an invocation that ends the open period
/// waits for the fleet's probe election (one round trip to the table) and,
/// won, is the probe; one on a decision older than the staleness (a thawed
/// instance) reads the table first. With `try_acquire`, an instance
/// invoked less often than every 1.3 s would start an election at each
/// invocation, be refused, and give the won probe back before the next.
async fn order(event: Event, ctx: &Context) -> Result<Response, Error> {
    let permit = match ctx.breaker.acquire().await {
        Ok(permit) => permit,
        Err(open) => {
            return Ok(Response {
                status: 503,
                body: format!("order {}: inventory unavailable ({open})", event.order),
                retry_after: Some(open.retry_after()),
            })
        }
    };
    let called = ctx.http.get(&ctx.dependency_url).send().await;
    match called.and_then(reqwest::Response::error_for_status) {
        Ok(answer) => {
            permit.record(Outcome::Success);
            Ok(Response {
                status: 200,
                body: format!("order {}: {}", event.order, answer.text().await?),
                retry_after: None,
            })
        }
        Err(e) => {
            permit.record(Outcome::Failure);
            Err(e.into())
        }
    }
}

// ================================================================ instance

/// One function instance (a child process): a cold start, then one
/// invocation per `invoke` line on stdin, as Lambda's runtime hands out
/// events; each result goes to stdout as a line. At the end of stdin it
/// prints what it asked of DynamoDB and exits.
async fn instance(spec: &str) -> i32 {
    let mut words = spec.split(' ');
    let (Some(_), Some(dynamodb_url), Some(dependency_url)) =
        (words.next(), words.next(), words.next())
    else {
        eprintln!("{INSTANCE_ENV} is malformed: {spec:?}");
        return 2;
    };
    let config = Config {
        dynamodb_url: dynamodb_url.to_owned(),
        dependency_url: dependency_url.to_owned(),
    };
    let ctx = match Context::cold_start(&config).await {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("cold start failed: {e}");
            return 2;
        }
    };
    println!("ready {}", letter(ctx.breaker.snapshot().state));
    let mut events = lines(std::io::stdin());
    let mut order = 0;
    while events.recv().await.is_some() {
        order += 1;
        match handler(Event { order }, &ctx).await {
            Ok(r) if r.status == 200 => println!("res ok {}", r.body),
            Ok(r) => println!(
                "res rejected {} {}",
                r.retry_after.unwrap_or_default().as_millis(),
                r.body
            ),
            Err(e) => println!("res failed {e}"),
        }
    }
    let u = ctx.store.usage();
    println!(
        "usage {} reads, {} writes ({} refused); units reported: {} read, {} write",
        u.reads, u.writes, u.refused, u.read_units, u.write_units
    );
    0
}

fn letter(state: State) -> char {
    match state {
        State::Closed => 'C',
        State::Open => 'O',
        State::HalfOpen => 'H',
    }
}

/// The lines of `input`, read on a thread of their own.
fn lines(input: impl std::io::Read + Send + 'static) -> UnboundedReceiver<String> {
    let (tx, rx) = unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(input).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

// ==================================================================== main

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let code = match std::env::var(INSTANCE_ENV) {
        Ok(spec) => instance(&spec).await,
        Err(_) => simulate().await,
    };
    std::process::exit(code);
}

/// Plays Lambda: the local DynamoDB and dependency, the instances, the
/// events. Returns the exit code.
async fn simulate() -> i32 {
    let moto = match moto::MotoServer::start_or_skip("lambda-dynamodb").await {
        Ok(moto::Started::Running(moto)) => moto,
        Ok(moto::Started::Skipped(code)) => return code,
        Err(e) => {
            eprintln!("lambda-dynamodb: {e}");
            return 2;
        }
    };
    let options = DynamoDbOptions::new().table(TABLE);
    let created = match DynamoDbStore::new(moto::client(moto.url()), options) {
        Ok(store) => store.create_table().await,
        Err(e) => Err(e),
    };
    if let Err(e) = created {
        eprintln!("lambda-dynamodb: could not create the table: {e}");
        return 2;
    }

    // The dependency: answers "in stock" until told to fail (HTTP 500).
    let failing = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let app = Router::new().route("/", {
        let (failing, calls) = (failing.clone(), calls.clone());
        get(move || async move {
            calls.fetch_add(1, Relaxed);
            if failing.load(Relaxed) {
                Err(http::StatusCode::INTERNAL_SERVER_ERROR)
            } else {
                Ok("in stock")
            }
        })
    });
    let dependency = examples::demo::serve_local(app).await;
    println!(
        "DynamoDB (moto) at {}, table {TABLE:?}; dependency at http://{dependency}/",
        moto.url()
    );

    let (tx, mut rx) = unbounded_channel();
    let mut sim = Sim {
        start: Instant::now(),
        spec: format!("{} http://{dependency}/", moto.url()),
        tx,
        instances: Vec::new(),
        next: 0,
        phase: Phase::ColdStarts,
        failing,
        calls,
        calls_when_all_rejected: 0,
        seen: Seen::default(),
    };
    for _ in 0..3 {
        if let Err(e) = sim.spawn() {
            eprintln!("lambda-dynamodb: {e}");
            return 2;
        }
    }
    // Lambda's part: an event every 70 ms, to the instances in turn; and
    // what they answer.
    let mut tick = tokio::time::interval(Duration::from_millis(70));
    let deadline = sim.start + Duration::from_secs(20);
    while sim.phase != Phase::Done && Instant::now() < deadline {
        let step = tokio::select! {
            _ = tick.tick() => {
                sim.invoke_next();
                Ok(())
            }
            Some((i, line)) = rx.recv() => sim.heard(i, line),
        };
        if let Err(e) = step {
            eprintln!("lambda-dynamodb: {e}");
            break;
        }
    }

    // The end of the events: each instance says what it asked of DynamoDB.
    for instance in &mut sim.instances {
        instance.stdin = None;
    }
    let stop = Instant::now() + Duration::from_secs(5);
    while sim.instances.iter().any(|x| x.usage.is_none()) {
        match tokio::time::timeout_at(stop, rx.recv()).await {
            Ok(Some((i, Some(line)))) => {
                if let Some(usage) = line.strip_prefix("usage ") {
                    sim.instances[i].usage = Some(usage.to_owned());
                }
            }
            Ok(Some((_, None))) => {}
            _ => break,
        }
    }
    println!("\nPer instance: invocations ok / failed / rejected; what it asked of DynamoDB");
    for (i, x) in sim.instances.iter_mut().enumerate() {
        println!(
            "  #{}: {} / {} / {}; {}",
            i + 1,
            x.ok,
            x.failed,
            x.rejected,
            x.usage.as_deref().unwrap_or("(no report)")
        );
        let _ = x.child.kill();
        let _ = x.child.wait();
    }
    drop(moto);
    sim.verdict()
}

/// Where the scenario is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    ColdStarts,
    Healthy,
    Failing,
    Open,
    Closing,
    Done,
}

/// A running instance, as `main` sees it.
#[derive(Debug)]
struct Instance {
    child: Child,
    stdin: Option<ChildStdin>,
    ready: bool,
    /// Its circuit: `C`, `O`, `H`.
    state: char,
    ok: u32,
    failed: u32,
    rejected: u32,
    /// Its failures when it first rejected a call.
    failed_before_reject: Option<u32>,
    usage: Option<String>,
}

/// What `main` saw happen, for the checks at the end.
#[derive(Debug, Default)]
struct Seen {
    window_openings: u32,
    probes: u32,
    calls_once_all_rejected: u64,
    late_instance_rejected_first: Option<bool>,
}

/// `main`'s side of the run.
#[derive(Debug)]
struct Sim {
    start: Instant,
    /// What every instance is told: `moto-url dependency-url`.
    spec: String,
    tx: UnboundedSender<(usize, Option<String>)>,
    instances: Vec<Instance>,
    /// The instance the last event went to.
    next: usize,
    phase: Phase,
    failing: Arc<AtomicBool>,
    /// The dependency's calls.
    calls: Arc<AtomicU64>,
    calls_when_all_rejected: u64,
    seen: Seen,
}

impl Sim {
    /// A cold start: one more instance, this executable again.
    fn spawn(&mut self) -> Result<(), String> {
        let index = self.instances.len();
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = Command::new(exe)
            .env(INSTANCE_ENV, format!("{index} {}", self.spec))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("could not start instance {}: {e}", index + 1))?;
        let mut out = lines(child.stdout.take().expect("piped stdout"));
        let tx = self.tx.clone();
        tokio::spawn(async move {
            while let Some(line) = out.recv().await {
                let _ = tx.send((index, Some(line)));
            }
            let _ = tx.send((index, None));
        });
        self.instances.push(Instance {
            stdin: child.stdin.take(),
            child,
            ready: false,
            state: 'C',
            ok: 0,
            failed: 0,
            rejected: 0,
            failed_before_reject: None,
            usage: None,
        });
        Ok(())
    }

    /// One event to the next ready instance, in turn.
    fn invoke_next(&mut self) {
        if self.phase == Phase::ColdStarts {
            return;
        }
        let n = self.instances.len();
        for _ in 0..n {
            self.next = (self.next + 1) % n;
            let instance = &mut self.instances[self.next];
            if let (true, Some(stdin)) = (instance.ready, instance.stdin.as_mut()) {
                let _ = stdin.write_all(b"invoke\n").and_then(|()| stdin.flush());
                return;
            }
        }
    }

    fn say(&self, what: &str) {
        println!("[{:5.2} s] {what}", self.start.elapsed().as_secs_f64());
    }

    /// Takes a line from instance `i` (`None`: its output closed).
    fn heard(&mut self, i: usize, line: Option<String>) -> Result<(), String> {
        let n = i + 1;
        let Some(line) = line else {
            return match self.instances[i].usage {
                Some(_) => Ok(()),
                None => Err(format!("instance {n} exited early")),
            };
        };
        let words: Vec<&str> = line.splitn(4, ' ').collect();
        let me = &mut self.instances[i];
        match words.as_slice() {
            ["ready", state] => {
                me.ready = true;
                me.state = state.chars().next().unwrap_or('?');
                if self.phase == Phase::Open {
                    let state = me.state;
                    self.say(&format!(
                        "instance {n} cold-started while the circuit is open; its cold start \
                         read the table: circuit {state}"
                    ));
                }
            }
            ["res", "ok", ..] => me.ok += 1,
            ["res", "failed", ..] => me.failed += 1,
            ["res", "rejected", retry, ..] => {
                me.rejected += 1;
                me.failed_before_reject.get_or_insert(me.failed);
                if n == 4 && self.seen.late_instance_rejected_first.is_none() {
                    self.seen.late_instance_rejected_first = Some(me.ok + me.failed == 0);
                    self.say(&format!(
                        "instance 4's first invocation: rejected without calling the \
                         dependency (retry in {retry} ms)"
                    ));
                }
            }
            ["tr", to, by] => {
                let to = to.chars().next().unwrap_or('?');
                me.state = to;
                let (ok, failed) = (me.ok, me.failed);
                self.transition(n, to, by, ok, failed);
            }
            ["usage", ..] => me.usage = Some(words[1..].join(" ")),
            _ => eprintln!("instance {n}: {line}"),
        }
        self.next_phase()
    }

    /// Instance `n`'s circuit went `to`, because of `by`.
    fn transition(&mut self, n: usize, to: char, by: &str, ok: u32, failed: u32) {
        if to == 'O' && by == "window" {
            self.seen.window_openings += 1;
        }
        match (self.phase, to) {
            (_, 'H') => {
                self.seen.probes += 1;
                self.say(&format!(
                    "instance {n} won the fleet's probe election: the invocation waiting for it is the \
                     one probe"
                ));
            }
            (Phase::Failing, 'O') => {
                let each: Vec<String> = self
                    .instances
                    .iter()
                    .enumerate()
                    .map(|(j, x)| format!("#{} {}", j + 1, x.failed))
                    .collect();
                let all: u32 = self.instances.iter().map(|x| x.failed).sum();
                self.say(&format!(
                    "instance {n}: circuit OPEN ({}), after {all} failures in all ({}); alone, an \
                     instance needs 10 calls in 5 s, half of them failed",
                    if by == "table" {
                        "its report tipped the fleet's window in the table"
                    } else {
                        "its own window tripped"
                    },
                    each.join(", ")
                ));
                self.phase = Phase::Open;
            }
            (Phase::Open, 'O') => self.say(&format!(
                "instance {n}: circuit open, learned from the table ({ok} ok, {failed} failed \
                 so far)"
            )),
            (Phase::Open, 'C') => {
                self.say(&format!(
                    "instance {n}: the probe succeeded: circuit CLOSED in the table"
                ));
                self.seen.calls_once_all_rejected =
                    self.calls.load(Relaxed) - self.calls_when_all_rejected;
                self.phase = Phase::Closing;
            }
            (Phase::Closing, 'C') => {
                self.say(&format!(
                    "instance {n}: circuit closed, learned from the table"
                ));
            }
            _ => {}
        }
    }

    /// The moves of the scenario that wait for every instance.
    fn next_phase(&mut self) -> Result<(), String> {
        let all = |f: &dyn Fn(&Instance) -> bool| self.instances.iter().all(f);
        match self.phase {
            Phase::ColdStarts if all(&|x| x.ready) => {
                self.say(
                    "3 instances cold-started: each built its Breaker on the table once; the \
                     dependency is healthy",
                );
                self.phase = Phase::Healthy;
            }
            Phase::Healthy if all(&|x| x.ok >= 2) => {
                self.say("every instance served 2 invocations from the dependency");
                self.say("the dependency starts failing (HTTP 500)");
                self.failing.store(true, Relaxed);
                self.phase = Phase::Failing;
            }
            Phase::Open
                if self.instances.len() == 3 && all(&|x| x.state == 'O' && x.rejected > 0) =>
            {
                self.calls_when_all_rejected = self.calls.load(Relaxed);
                let before: Vec<String> = self
                    .instances
                    .iter()
                    .enumerate()
                    .map(|(j, x)| format!("#{} {}", j + 1, x.failed_before_reject.unwrap_or(0)))
                    .collect();
                self.say(&format!(
                    "all 3 instances reject (failures each had seen: {}); the dependency is \
                     not called",
                    before.join(", ")
                ));
                self.say("the dependency recovers; a 4th instance cold-starts (Lambda scales out)");
                self.failing.store(false, Relaxed);
                self.spawn()?;
            }
            Phase::Closing if all(&|x| x.state == 'C') => {
                self.say("every instance is closed again; the dependency serves them all");
                self.phase = Phase::Done;
            }
            _ => {}
        }
        Ok(())
    }

    /// The checks; the exit code.
    fn verdict(&self) -> i32 {
        let mut failures = Vec::new();
        let mut check = |ok: bool, what: &str| examples::demo::check(ok, what, &mut failures);
        let seen = &self.seen;
        println!();
        check(
            seen.window_openings == 0,
            "the circuit opened by the fleet's window in the table, not one instance's own",
        );
        check(
            self.instances.iter().take(3).all(|x| x.rejected > 0),
            "every instance rejected calls while the circuit was open",
        );
        check(
            seen.late_instance_rejected_first == Some(true),
            "an instance cold-started while open rejected from its first invocation",
        );
        check(
            seen.probes == 1 && seen.calls_once_all_rejected == 1,
            &format!(
                "one probe for the whole fleet ({} elected; the dependency called {} time(s) \
                 once all rejected)",
                seen.probes, seen.calls_once_all_rejected
            ),
        );
        check(
            self.phase == Phase::Done,
            "every instance closed once the probe succeeded",
        );
        i32::from(!failures.is_empty())
    }
}
