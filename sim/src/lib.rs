//! The client and server stacks between two hosts of a simulated network
//! ([turmoil]), over HTTP (hyper, axum) and gRPC (tonic: unary calls and
//! server streams read to their end) through one client stack:
//! partitions, held messages, loss, latency and a server that crashes and
//! restarts, with a dependency that is healthy, slow, failing, flaky,
//! stalling its bodies or overloaded by turns, all decided by a seed. A run
//! checks the stacks' promises ([`Violation`]):
//!
//! - every call ends, and no later than its deadline plus one tick of the
//!   simulation, body included;
//! - retries stay within the budget (10% of the requests per window, or
//!   the floor), and every retry the budget paid for was sent;
//! - an open circuit lets no attempt through, a half-open one at most its
//!   probes at once, and at most as many in a row as closing takes;
//! - no permit is lost: the client's bulkhead, the breaker's probe slots
//!   and the server's bulkhead are empty once everything has ended.
//!
//! The seed fixes the scenario, turmoil's network, and every random draw
//! of the stacks (the jitter of both breakers' open periods and of the
//! retry layer's backoff), so a seed replays exactly, over HTTP and gRPC
//! alike (`cargo run -p resilience-sim --release -- --seed N`). Nothing
//! reads the wall clock: both servers run without hyper's `date` header.

mod grpc;
pub mod scenario;

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State as Extract;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use http_body::{Body as HttpBody, Frame};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_breaker::{BreakerConfig, SeededRandom, State, Transition};
use tower_bulkhead::CompartmentHandle;
use tower_resilience_base::error::CircuitOpen;
use tower_retry_budget::body::ReplayBody;
use tower_retry_budget::RetryLayer;
use tower_shield::stack::{client_stack, server_stack};

use scenario::{Fault, Phase, Rng, Sabotage, Scenario};

/// The simulation's step: time moves in steps of this, so a timer fires
/// up to one tick late.
pub const TICK: Duration = Duration::from_millis(1);
const PORT: u16 = 80;

/// A promise a run saw broken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a run did, and what it saw broken.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Calls made.
    pub calls: u32,
    /// Calls that got a 200 and its whole body.
    pub succeeded: u32,
    /// Calls cut by their deadline.
    pub deadline_exceeded: u32,
    /// Calls the open circuit refused.
    pub refused_by_circuit: u32,
    /// Attempts that reached the network.
    pub attempts: u64,
    /// Retries the budget paid for.
    pub retries: u64,
    /// Times the circuit opened.
    pub openings: u32,
    /// Simulated time the run took.
    pub simulated: Duration,
    /// Promises broken; empty when the run passed.
    pub violations: Vec<Violation>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {}: {} calls, {} ok, {} past deadline, {} refused open, {} attempts, \
             {} retries, {} openings, {:.1} s simulated",
            self.seed,
            self.calls,
            self.succeeded,
            self.deadline_exceeded,
            self.refused_by_circuit,
            self.attempts,
            self.retries,
            self.openings,
            self.simulated.as_secs_f64(),
        )?;
        for v in &self.violations {
            write!(f, "\n  VIOLATION: {v}")?;
        }
        Ok(())
    }
}

/// One event of the client's timeline, in the order it happened (the
/// client's host runs on one thread, so the order is exact).
#[derive(Debug, Clone, Copy)]
enum Event {
    Transition { to: State },
    AttemptStart { attempt: u64 },
    AttemptEnd { attempt: u64 },
}

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Ok,
    Status(u16),
    DeadlineExceeded,
    CircuitOpen,
    OtherError,
}

#[derive(Debug, Clone, Copy)]
struct CallRecord {
    started: Duration,
    took: Duration,
    ending: Ending,
}

/// What the client host writes and the checks read.
#[derive(Default)]
struct Journal {
    events: Vec<Event>,
    /// Attempts per call, by the call's number.
    attempts_per_call: HashMap<u32, u32>,
    next_attempt: u64,
    calls: Vec<CallRecord>,
    /// The budget's own count of paid retries, read at the end.
    budget_retries: u64,
    /// Permits still held once everything ended: (what, count).
    leftovers: Vec<(&'static str, usize)>,
    finished: bool,
}

type Shared = Arc<Mutex<Journal>>;

fn record(journal: &Shared, event: Event) {
    journal.lock().unwrap().events.push(event);
}

/// Runs the scenario of `seed` and checks every promise.
///
/// ```
/// let report = resilience_sim::run(3);
/// assert!(report.violations.is_empty(), "{report}");
/// assert!(report.calls > 0);
/// ```
pub fn run(seed: u64) -> Report {
    run_scenario(Scenario::from_seed(seed))
}

/// Runs `scenario` and checks every promise.
pub fn run_scenario(scenario: Scenario) -> Report {
    let scenario = Arc::new(scenario);
    let journal: Shared = Arc::default();
    let server_bulkhead: Arc<Mutex<Option<CompartmentHandle>>> = Arc::default();

    let mut sim = turmoil::Builder::new()
        .simulation_duration(Duration::from_secs(3_600))
        .tick_duration(TICK)
        .rng_seed(scenario.seed)
        .min_message_latency(scenario.latency.0)
        .max_message_latency(scenario.latency.1)
        // The listen backlog (turmoil panics when it overflows, where a
        // kernel would drop the SYN): every call held by a `Hold` fault
        // arrives at once when it lifts.
        .tcp_capacity(1 << 14)
        .build();

    {
        let scenario = Arc::clone(&scenario);
        let handle = Arc::clone(&server_bulkhead);
        let boots = Cell::new(0u64);
        sim.host("server", move || {
            boots.set(boots.get() + 1);
            let rng = Rng::new(scenario.seed ^ boots.get().wrapping_mul(0x2545_f491));
            server(Arc::clone(&scenario), rng, Arc::clone(&handle))
        });
    }
    {
        let scenario = Arc::clone(&scenario);
        let journal = Arc::clone(&journal);
        let handle = Arc::clone(&server_bulkhead);
        sim.client("client", async move {
            client(scenario, journal, handle).await;
            Ok(())
        });
    }

    let mut violations = Vec::new();
    let mut pending: Vec<(Duration, Fault, bool)> = scenario
        .strikes
        .iter()
        .flat_map(|s| [(s.at, s.fault, true), (s.at + s.lasts, s.fault, false)])
        .collect();
    pending.sort_by_key(|(at, _, _)| *at);
    let mut pending = pending.into_iter().peekable();
    let mut down = 0u32;
    loop {
        while let Some((_, fault, strike)) = pending.next_if(|(at, _, _)| *at <= sim.elapsed()) {
            apply(&mut sim, fault, strike, &scenario, &mut down);
        }
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => {
                violations.push(Violation(format!("the simulation stopped: {e}")));
                break;
            }
        }
    }
    let simulated = sim.elapsed();
    drop(sim);

    let journal = Arc::try_unwrap(journal)
        .ok()
        .map(|m| m.into_inner().unwrap())
        .unwrap_or_default();
    check(&scenario, &journal, simulated, violations)
}

fn apply(
    sim: &mut turmoil::Sim<'_>,
    fault: Fault,
    strike: bool,
    scenario: &Scenario,
    down: &mut u32,
) {
    match (fault, strike) {
        (Fault::Partition, true) => sim.partition("client", "server"),
        (Fault::Partition, false) => sim.repair("client", "server"),
        (Fault::Hold, true) => sim.hold("client", "server"),
        (Fault::Hold, false) => sim.release("client", "server"),
        (Fault::Crash, true) => {
            *down += 1;
            if *down == 1 {
                sim.crash("server");
            }
        }
        (Fault::Crash, false) => {
            *down -= 1;
            if *down == 0 {
                sim.bounce("server");
            }
        }
        (Fault::Loss(p), true) => sim.set_link_fail_rate("client", "server", p),
        (Fault::Loss(_), false) => sim.set_link_fail_rate("client", "server", 0.0),
        (Fault::Latency(l), true) => sim.set_link_latency("client", "server", l),
        (Fault::Latency(_), false) => {
            sim.set_link_latency("client", "server", scenario.latency.0);
            sim.set_link_max_message_latency("client", "server", scenario.latency.1);
        }
    }
}

// === the server ===

/// What the server's handler reads: the scenario's phases and its own
/// random draws (a new sequence at each boot).
struct ServerWorld {
    scenario: Arc<Scenario>,
    rng: Mutex<Rng>,
}

impl ServerWorld {
    /// The phase now, a draw in `[0, 1)` that picks the answer, and how
    /// long the answer takes.
    fn draw(&self) -> (Phase, f64, Duration) {
        let now = turmoil::sim_elapsed().unwrap_or_default();
        let phase = self.scenario.phase_at(now);
        let mut rng = self.rng.lock().unwrap();
        let wait = match phase {
            Phase::Healthy | Phase::Failing | Phase::Stalling | Phase::Dribbling | Phase::Flaky => {
                rng.millis(1, 10)
            }
            Phase::Slow => rng.millis(50, 2_000),
            Phase::Overloaded => rng.millis(20, 200),
        };
        (phase, rng.unit(), wait)
    }
}

async fn server(
    scenario: Arc<Scenario>,
    rng: Rng,
    handle: Arc<Mutex<Option<CompartmentHandle>>>,
) -> turmoil::Result {
    // The server's breaker keeps its default settings, with its open
    // period's jitter drawn from the seed, as the client's is: drawn from
    // the process's random source, it made a seed part ways between runs
    // once the server's circuit opened (seen on gRPC seeds 68 and 298).
    let stack = server_stack("server")
        .concurrency(scenario.server_concurrency)
        .random(SeededRandom::new(scenario.seed ^ 0x5e4e_0000));
    *handle.lock().unwrap() = Some(stack.bulkhead_handle());
    let world = Arc::new(ServerWorld {
        scenario,
        rng: Mutex::new(rng),
    });
    // The gRPC server's stack is a clone: one breaker, one bulkhead.
    let grpc = grpc::serve(Arc::clone(&world), stack.clone());
    let app = Router::new()
        .route("/", get(answer))
        .with_state(world)
        .layer(stack);
    let http = async move {
        let listener: turmoil::net::TcpListener =
            turmoil::net::TcpListener::bind((IpAddr::from(Ipv4Addr::UNSPECIFIED), PORT)).await?;
        loop {
            let (stream, _) = listener.accept().await?;
            let service = TowerToHyperService::new(app.clone());
            tokio::task::spawn_local(async move {
                // A connection that breaks (a crash, a partition) ends here.
                let _ = hyper::server::conn::http1::Builder::new()
                    .auto_date_header(false)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
        #[allow(unreachable_code)]
        turmoil::Result::Ok(())
    };
    let served: turmoil::Result<((), ())> = tokio::try_join!(http, grpc);
    served.map(|_| ())
}

async fn answer(Extract(world): Extract<Arc<ServerWorld>>) -> Response {
    let (phase, draw, wait) = world.draw();
    match phase {
        Phase::Failing if draw < 0.35 => {
            return http::StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
        Phase::Failing if draw < 0.7 => return http::StatusCode::BAD_GATEWAY.into_response(),
        Phase::Flaky if draw < 0.3 => return http::StatusCode::SERVICE_UNAVAILABLE.into_response(),
        Phase::Overloaded if draw < 0.5 => {
            return (
                http::StatusCode::SERVICE_UNAVAILABLE,
                [(http::header::RETRY_AFTER, "1")],
            )
                .into_response()
        }
        _ => {}
    }
    tokio::time::sleep(wait).await;
    match phase {
        Phase::Stalling => Body::from_stream(
            stream::once(async { Ok::<_, std::io::Error>(Bytes::from_static(b"first;")) })
                .chain(stream::pending()),
        )
        .into_response(),
        Phase::Dribbling => Body::from_stream(stream::iter(0..20).then(|_| async {
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok::<_, std::io::Error>(Bytes::from_static(b"chunk;"))
        }))
        .into_response(),
        _ => "ok".into_response(),
    }
}

// === the client ===

/// The client's transport: one connection per attempt over the simulated
/// network, each attempt written in the journal when it starts and when
/// its answer ends (its body read to the end, failed or dropped).
#[derive(Clone)]
struct Transport {
    journal: Shared,
}

impl Service<http::Request<ReplayBody<Full<Bytes>>>> for Transport {
    type Response = http::Response<Attempted>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<ReplayBody<Full<Bytes>>>) -> Self::Future {
        let end = start_attempt(&self.journal, request.headers());
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect(("server", PORT)).await?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::task::spawn_local(async move {
                let _ = connection.await;
            });
            let response = sender.send_request(request).await?;
            Ok(response.map(|body| Attempted { body, end }))
        })
    }
}

/// Writes the start of an attempt of the call its `x-call` header names,
/// and returns what writes its end.
fn start_attempt(journal: &Shared, headers: &http::HeaderMap) -> AttemptEnd {
    let call: u32 = headers
        .get("x-call")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(u32::MAX);
    let mut j = journal.lock().unwrap();
    *j.attempts_per_call.entry(call).or_default() += 1;
    j.next_attempt += 1;
    let attempt = j.next_attempt;
    j.events.push(Event::AttemptStart { attempt });
    AttemptEnd {
        journal: Arc::clone(journal),
        attempt,
        ended: false,
    }
}

/// Writes the end of an attempt once: when its body ends or fails, or
/// when it is dropped (with the future, before an answer; or half-read).
struct AttemptEnd {
    journal: Shared,
    attempt: u64,
    ended: bool,
}

impl AttemptEnd {
    fn end(&mut self) {
        if !self.ended {
            self.ended = true;
            record(
                &self.journal,
                Event::AttemptEnd {
                    attempt: self.attempt,
                },
            );
        }
    }
}

impl Drop for AttemptEnd {
    fn drop(&mut self) {
        self.end();
    }
}

/// An attempt's answer body.
struct Attempted<B = Incoming> {
    body: B,
    end: AttemptEnd,
}

impl<B: HttpBody<Data = Bytes> + Unpin> HttpBody for Attempted<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            this.end.end();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

async fn client(
    scenario: Arc<Scenario>,
    journal: Shared,
    server_bulkhead: Arc<Mutex<Option<CompartmentHandle>>>,
) {
    let listener_journal = Arc::clone(&journal);
    let config = BreakerConfig::new()
        .count_window(scenario.window)
        .minimum_calls(scenario.window as u32)
        .open_period(scenario.open_period)
        .permitted_probes(match scenario.sabotage {
            Some(Sabotage::ExtraProbe) => scenario.probes + 1,
            _ => scenario.probes,
        })
        .successes_to_close(scenario.successes_to_close)
        .listener(move |t: &Transition| record(&listener_journal, Event::Transition { to: t.to }))
        .random(SeededRandom::new(scenario.seed ^ 0xb4ea_0000));
    // The default retry layer with its jitter drawn from the seed.
    let retry = RetryLayer::new()
        .name("dependency")
        .max_attempts(scenario.max_attempts)
        .random(SeededRandom::new(scenario.seed ^ 0x4e74_0000));
    let timeout = match scenario.sabotage {
        Some(Sabotage::LateDeadline) => scenario.timeout + Duration::from_millis(50),
        _ => scenario.timeout,
    };
    let stack = client_stack("dependency")
        .timeout(timeout)
        .retry(retry)
        .concurrency(scenario.client_concurrency)
        .breaker_config(config);
    let breaker = stack.breaker_handle().clone();
    let bulkhead = stack.bulkhead_handle();
    let budget = Arc::clone(stack.retry_budget());
    let service = stack.layer(Transport {
        journal: Arc::clone(&journal),
    });
    // The same stack (one breaker, budget and bulkhead) over gRPC.
    let grpc_client = grpc::Client::new(stack.tonic(grpc::Logged {
        channel: grpc::channel(),
        journal: Arc::clone(&journal),
    }));
    let start = Instant::now();

    let mut rng = Rng::new(scenario.seed ^ 0xc11e_0000);
    let mut calls = Vec::with_capacity(scenario.calls as usize);
    for n in 0..scenario.calls {
        tokio::time::sleep(rng.exponential(scenario.mean_gap)).await;
        let service = service.clone();
        let journal = Arc::clone(&journal);
        if rng.unit() < scenario.grpc_share {
            let client = grpc_client.clone();
            calls.push(tokio::task::spawn_local(async move {
                let began = Instant::now();
                let ending = grpc::call(client, n).await;
                journal.lock().unwrap().calls.push(CallRecord {
                    started: began - start,
                    took: began.elapsed(),
                    ending,
                });
            }));
            continue;
        }
        calls.push(tokio::task::spawn_local(async move {
            let began = Instant::now();
            let request = http::Request::get(format!("http://server:{PORT}/"))
                .header("x-call", n)
                .body(Full::new(Bytes::new()))
                .expect("a valid request");
            let ending = match service.oneshot(request).await {
                Ok(response) => {
                    let status = response.status();
                    match response.into_body().collect().await {
                        Ok(_) if status == http::StatusCode::OK => Ending::Ok,
                        Ok(_) => Ending::Status(status.as_u16()),
                        Err(e) => classify(&*e),
                    }
                }
                Err(e) => {
                    if std::env::var_os("SIM_DEBUG").is_some() {
                        eprintln!("call {n}: {e} / {e:?}");
                    }
                    classify(&*e)
                }
            };
            let record = CallRecord {
                started: began - start,
                took: began.elapsed(),
                ending,
            };
            journal.lock().unwrap().calls.push(record);
        }));
    }
    for call in calls {
        let _ = call.await;
    }
    // Every call has ended: wait for the server's side of the last ones
    // (bounded by the deadline they carried), then count what is held.
    tokio::time::sleep(scenario.timeout + Duration::from_millis(500)).await;
    let mut j = journal.lock().unwrap();
    j.budget_retries = budget.counters().retries;
    j.leftovers
        .push(("client bulkhead permits", bulkhead.in_flight()));
    j.leftovers.push((
        "breaker probes",
        breaker.snapshot().probes_in_flight as usize,
    ));
    if let Some(server) = server_bulkhead.lock().unwrap().as_ref() {
        j.leftovers
            .push(("server bulkhead permits", server.in_flight()));
    }
    j.finished = true;
}

fn classify(e: &(dyn std::error::Error + 'static)) -> Ending {
    let mut source = Some(e);
    while let Some(e) = source {
        if e.is::<tower_resilience_base::error::DeadlineExceeded>() {
            return Ending::DeadlineExceeded;
        }
        if e.is::<CircuitOpen>() {
            return Ending::CircuitOpen;
        }
        source = e.source();
    }
    Ending::OtherError
}

// === the checks ===

fn check(
    scenario: &Scenario,
    journal: &Journal,
    simulated: Duration,
    mut violations: Vec<Violation>,
) -> Report {
    let mut v = |s: String| violations.push(Violation(s));

    // Every call ends, within its deadline plus a tick.
    if !journal.finished {
        v("the client never finished".into());
    }
    if journal.calls.len() != scenario.calls as usize {
        v(format!(
            "{} of {} calls ended",
            journal.calls.len(),
            scenario.calls
        ));
    }
    for call in &journal.calls {
        if call.took > scenario.timeout + TICK {
            v(format!(
                "a call started at {:?} took {:?}, past its deadline of {:?} ({:?})",
                call.started, call.took, scenario.timeout, call.ending
            ));
        }
    }

    // Retries: every retry sent was paid for, and every paid retry sent.
    let sent_retries: u64 = journal
        .attempts_per_call
        .values()
        .map(|&a| u64::from(a.saturating_sub(1)))
        .sum();
    if sent_retries != journal.budget_retries {
        v(format!(
            "{sent_retries} retries reached the network, the budget paid for {}",
            journal.budget_retries
        ));
    }
    if journal
        .attempts_per_call
        .values()
        .any(|&a| a > scenario.max_attempts)
    {
        v(format!(
            "a call made more than {} attempts",
            scenario.max_attempts
        ));
    }
    // Within the budget: over each window of 10 s from the budget's start,
    // at most 10% of its requests, or 5 per second when that is more.
    let mut requests_per_window: HashMap<u64, u64> = HashMap::new();
    for call in &journal.calls {
        if call.ending != Ending::CircuitOpen {
            *requests_per_window
                .entry(call.started.as_secs() / 10)
                .or_default() += 1;
        }
    }
    let windows = simulated.as_secs() / 10 + 1;
    let allowance: u64 = (0..windows)
        .map(|w| (requests_per_window.get(&w).copied().unwrap_or(0) / 10).max(50))
        .sum();
    if journal.budget_retries > allowance {
        v(format!(
            "{} retries, over the budget's {allowance}",
            journal.budget_retries
        ));
    }

    // The circuit: nothing through while open; in half-open, at most the
    // permitted probes at once, and no more in a row than closing takes
    // (each success admits the next; one failure re-opens).
    let mut state = State::Closed;
    let mut in_flight_since_half_open: Vec<u64> = Vec::new();
    let mut probes_this_half_open = 0u32;
    let mut openings = 0;
    for event in &journal.events {
        match *event {
            Event::Transition { to } => {
                if to == State::Open {
                    openings += 1;
                }
                state = to;
                in_flight_since_half_open.clear();
                probes_this_half_open = 0;
            }
            Event::AttemptStart { attempt } => match state {
                State::Open => v(format!("attempt {attempt} sent while the circuit was open")),
                State::HalfOpen => {
                    in_flight_since_half_open.push(attempt);
                    probes_this_half_open += 1;
                    if in_flight_since_half_open.len() > scenario.probes as usize {
                        v(format!(
                            "{} probes in flight at once in half-open (permitted {})",
                            in_flight_since_half_open.len(),
                            scenario.probes
                        ));
                    }
                    let most = scenario.successes_to_close + scenario.probes - 1;
                    if probes_this_half_open > most {
                        v(format!(
                            "{probes_this_half_open} probes in one half-open period \
                             (at most {most})"
                        ));
                    }
                }
                State::Closed => {}
            },
            Event::AttemptEnd { attempt } => {
                in_flight_since_half_open.retain(|&a| a != attempt);
            }
        }
    }

    // No permit lost.
    for &(what, held) in &journal.leftovers {
        if held != 0 {
            v(format!("{held} {what} still held once every call ended"));
        }
    }

    let count = |e: Ending| journal.calls.iter().filter(|c| c.ending == e).count() as u32;
    violations.dedup();
    Report {
        seed: scenario.seed,
        calls: journal.calls.len() as u32,
        succeeded: count(Ending::Ok),
        deadline_exceeded: count(Ending::DeadlineExceeded),
        refused_by_circuit: count(Ending::CircuitOpen),
        attempts: journal.next_attempt,
        retries: journal.budget_retries,
        openings,
        simulated,
        violations,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario() -> Scenario {
        let mut s = Scenario::from_seed(1);
        s.calls = 2;
        s.timeout = Duration::from_millis(100);
        s.max_attempts = 2;
        s.probes = 1;
        s.successes_to_close = 1;
        s
    }

    fn call(took_ms: u64, ending: Ending) -> CallRecord {
        CallRecord {
            started: Duration::ZERO,
            took: Duration::from_millis(took_ms),
            ending,
        }
    }

    fn clean() -> Journal {
        Journal {
            events: vec![
                Event::AttemptStart { attempt: 1 },
                Event::AttemptEnd { attempt: 1 },
                Event::AttemptStart { attempt: 2 },
                Event::AttemptEnd { attempt: 2 },
            ],
            attempts_per_call: HashMap::from([(0, 1), (1, 1)]),
            next_attempt: 2,
            calls: vec![call(10, Ending::Ok), call(101, Ending::DeadlineExceeded)],
            budget_retries: 0,
            leftovers: vec![("client bulkhead permits", 0)],
            finished: true,
        }
    }

    fn violations(journal: &Journal) -> Vec<Violation> {
        check(&scenario(), journal, Duration::from_secs(1), Vec::new()).violations
    }

    #[test]
    fn a_clean_journal_passes() {
        assert_eq!(violations(&clean()), vec![]);
    }

    #[test]
    fn a_call_past_its_deadline_and_a_tick_is_caught() {
        let mut j = clean();
        j.calls[1].took = Duration::from_millis(102);
        let v = violations(&j);
        assert!(v[0].0.contains("past its deadline"), "{v:?}");
    }

    #[test]
    fn a_call_that_never_ended_is_caught() {
        let mut j = clean();
        j.calls.pop();
        assert!(violations(&j)[0].0.contains("1 of 2 calls ended"));
    }

    #[test]
    fn an_unpaid_or_unsent_retry_is_caught() {
        let mut j = clean();
        j.attempts_per_call.insert(1, 2);
        assert!(violations(&j)[0]
            .0
            .contains("1 retries reached the network"));
        let mut j = clean();
        j.budget_retries = 1;
        assert!(violations(&j)[0].0.contains("the budget paid for 1"));
    }

    #[test]
    fn retries_over_the_budget_are_caught() {
        let mut j = clean();
        j.budget_retries = 51;
        j.attempts_per_call = (0..51).map(|c| (c, 2)).collect();
        let v = violations(&j);
        assert!(
            v.iter().any(|v| v.0.contains("over the budget's 50")),
            "{v:?}"
        );
    }

    #[test]
    fn an_attempt_while_open_is_caught() {
        let mut j = clean();
        j.events.insert(0, Event::Transition { to: State::Open });
        assert!(violations(&j)[0].0.contains("while the circuit was open"));
    }

    #[test]
    fn two_probes_at_once_are_caught_but_two_in_a_row_are_not() {
        let mut j = clean();
        j.events = vec![
            Event::Transition {
                to: State::HalfOpen,
            },
            Event::AttemptStart { attempt: 1 },
            Event::AttemptStart { attempt: 2 },
        ];
        let v = violations(&j);
        assert!(v[0].0.contains("2 probes in flight at once"), "{v:?}");

        let mut s = scenario();
        s.successes_to_close = 2;
        j.events = vec![
            Event::Transition {
                to: State::HalfOpen,
            },
            Event::AttemptStart { attempt: 1 },
            Event::AttemptEnd { attempt: 1 },
            Event::AttemptStart { attempt: 2 },
            Event::AttemptEnd { attempt: 2 },
            Event::Transition { to: State::Closed },
        ];
        let report = check(&s, &j, Duration::from_secs(1), Vec::new());
        assert_eq!(report.violations, vec![]);
        j.events.insert(5, Event::AttemptStart { attempt: 3 });
        let report = check(&s, &j, Duration::from_secs(1), Vec::new());
        assert!(report.violations[0]
            .0
            .contains("3 probes in one half-open period"));
    }

    #[test]
    fn a_permit_held_at_the_end_is_caught() {
        let mut j = clean();
        j.leftovers.push(("server bulkhead permits", 1));
        assert!(violations(&j)[0]
            .0
            .contains("1 server bulkhead permits still held"));
    }
}
