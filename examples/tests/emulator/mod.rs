//! A small emulator of AWS Lambda for the tests: the Runtime API over
//! plain HTTP on 127.0.0.1, and the execution environments as OS
//! processes that it starts, freezes, thaws and kills as Lambda does.
//!
//! - **The Runtime API**, one endpoint per instance
//!   (`AWS_LAMBDA_RUNTIME_API=127.0.0.1:PORT`), so that the emulator knows
//!   which instance asks: `GET /2018-06-01/runtime/invocation/next` (a
//!   long poll, answered with the event and the headers
//!   `Lambda-Runtime-Aws-Request-Id`, `Lambda-Runtime-Deadline-Ms`,
//!   `Lambda-Runtime-Invoked-Function-Arn`, `Lambda-Runtime-Trace-Id`),
//!   `POST /2018-06-01/runtime/invocation/{id}/response`,
//!   `POST /2018-06-01/runtime/invocation/{id}/error` and
//!   `POST /2018-06-01/runtime/init/error`.
//! - **Freezing**: as soon as an instance has posted its response (or
//!   error), and before the emulator answers that post, the instance gets
//!   SIGSTOP; the emulator waits until the kernel reports it stopped, then
//!   marks it idle and hands the result to the caller. The instance's
//!   next long poll therefore waits while it is frozen. Routing an event
//!   to it queues the event and sends SIGCONT.
//! - **Routing**: an event goes to the idle instance that has been idle
//!   the longest (so that every warm instance takes part; Lambda does not
//!   document its choice), else to a new instance (a cold start: the
//!   process is started and the event waits for its first `next`), up to
//!   the concurrency cap, beyond which the event is throttled (Lambda's
//!   429). [`Emulator::invoke_burst`] routes several events at once, as
//!   concurrent requests arrive.
//! - **Scaling in**: [`Emulator::scale_in`] SIGKILLs an idle (frozen)
//!   instance; it is never thawed first.
//!
//! Signals go through the `kill` command (the workspace forbids `unsafe`
//! and has no signal crate).

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long an invocation may run before the emulator gives up on it and
/// kills its instance (the function's timeout).
const FUNCTION_TIMEOUT: Duration = Duration::from_secs(10);

/// The function's ARN, as the runtime is told it.
const ARN: &str = "arn:aws:lambda:us-east-1:000000000000:function:inventory-check";

/// The emulated Lambda service for one function.
#[derive(Debug)]
pub(crate) struct Emulator {
    shared: Arc<Shared>,
    binary: PathBuf,
    env: Vec<(String, String)>,
    cap: usize,
}

/// What became of one invocation.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    /// The request id the runtime was given.
    pub(crate) request_id: String,
    /// The instance that ran it (an index, in order of cold start), if
    /// any did.
    pub(crate) instance: Option<usize>,
    /// It started its instance: its first invocation, after a cold start.
    pub(crate) cold: bool,
    /// When it was routed and when its result came back, since the
    /// emulator started.
    pub(crate) routed: Duration,
    pub(crate) done: Duration,
    pub(crate) outcome: Outcome,
}

/// The result of an invocation.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// The function's answer (`/response`), as JSON.
    Response(serde_json::Value),
    /// The function's error (`/error`): its type and message.
    Error { error_type: String, message: String },
    /// The instance's cold start failed (`/init/error`).
    InitError(String),
    /// Every instance was busy and the cap was reached (Lambda's 429).
    Throttled,
    /// No answer within the function's timeout, or the instance died.
    Lost(String),
}

/// Where an instance is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Started, running its init or an invocation.
    Busy,
    /// Frozen (SIGSTOP) after its last answer, waiting for an event.
    Idle,
    /// Killed, or exited.
    Dead,
}

#[derive(Debug)]
struct Shared {
    start: Instant,
    state: Mutex<Fleet>,
}

#[derive(Debug, Default)]
struct Fleet {
    instances: Vec<Instance>,
    requests: u64,
}

/// One execution environment.
#[derive(Debug)]
struct Instance {
    child: Option<Child>,
    pid: u32,
    phase: Phase,
    /// The event routed to it, until its `next` takes it.
    queued: Option<Event>,
    /// Its `next` long poll, while it waits with nothing queued.
    polling: Option<oneshot::Sender<Event>>,
    /// The invocation it runs, and who waits for its result.
    running: Option<(String, oneshot::Sender<Outcome>)>,
    idle_since: Instant,
    started: Instant,
    /// How long its cold start took (from the process's start to its
    /// first `next`).
    init: Option<Duration>,
    invocations: u32,
    server: JoinHandle<()>,
}

#[derive(Debug, Clone)]
struct Event {
    request_id: String,
    body: String,
    deadline_ms: u128,
}

/// An invocation routed and not finished yet.
struct Routed {
    request_id: String,
    instance: Option<usize>,
    cold: bool,
    routed: Duration,
    result: Option<oneshot::Receiver<Outcome>>,
}

impl fmt::Debug for Routed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Routed")
            .field("request_id", &self.request_id)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

// === impl Emulator ===

impl Emulator {
    /// An emulator that runs `binary` as the function, with `env` added to
    /// the runtime's own variables, at most `cap` instances at once.
    pub(crate) fn new(binary: impl Into<PathBuf>, env: Vec<(String, String)>, cap: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                start: Instant::now(),
                state: Mutex::new(Fleet::default()),
            }),
            binary: binary.into(),
            env,
            cap,
        }
    }

    /// Time since the emulator started: the clock of every [`Record`].
    pub(crate) fn now(&self) -> Duration {
        self.shared.start.elapsed()
    }

    /// One invocation, routed as Lambda routes it; returns once it has a
    /// result.
    pub(crate) async fn invoke(&self, event: &str) -> Record {
        let routed = self.route(&[event]).await;
        let mut records = self.finish(routed).await;
        records.pop().expect("one invocation, one record")
    }

    /// Several invocations arriving at once: each takes an idle instance
    /// while there is one, the rest cold-start new ones (up to the cap).
    pub(crate) async fn invoke_burst(&self, events: &[&str]) -> Vec<Record> {
        let routed = self.route(events).await;
        self.finish(routed).await
    }

    /// The instances idle now, frozen.
    pub(crate) fn idle(&self) -> Vec<usize> {
        self.with_phase(Phase::Idle)
    }

    /// The instances alive (busy or idle).
    pub(crate) fn live(&self) -> Vec<usize> {
        let fleet = self.lock();
        (0..fleet.instances.len())
            .filter(|&i| fleet.instances[i].phase != Phase::Dead)
            .collect()
    }

    /// How long each instance's cold start took, for those that finished
    /// one.
    pub(crate) fn cold_starts(&self) -> Vec<Duration> {
        self.lock()
            .instances
            .iter()
            .filter_map(|x| x.init)
            .collect()
    }

    /// Scales in: SIGKILLs instance `i`, which must be idle (frozen).
    ///
    /// # Errors
    ///
    /// When it is not idle.
    pub(crate) async fn scale_in(&self, i: usize) -> Result<(), String> {
        let child = {
            let mut fleet = self.lock();
            let x = fleet
                .instances
                .get_mut(i)
                .ok_or_else(|| format!("no instance {i}"))?;
            if x.phase != Phase::Idle {
                return Err(format!("instance {i} is {:?}, not idle", x.phase));
            }
            x.phase = Phase::Dead;
            x.polling = None;
            x.server.abort();
            x.child.take()
        };
        if let Some(child) = child {
            reap(child).await;
        }
        Ok(())
    }

    fn with_phase(&self, phase: Phase) -> Vec<usize> {
        let fleet = self.lock();
        (0..fleet.instances.len())
            .filter(|&i| fleet.instances[i].phase == phase)
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, Fleet> {
        self.shared.lock()
    }

    /// Routes `events` in one step (under one lock), then thaws the idle
    /// instances that got one.
    async fn route(&self, events: &[&str]) -> Vec<Routed> {
        let mut routed = Vec::with_capacity(events.len());
        let mut thaw = Vec::new();
        {
            let mut fleet = self.lock();
            for body in events {
                fleet.requests += 1;
                let request_id = format!("00000000-0000-4000-8000-{:012x}", fleet.requests);
                let event = Event {
                    request_id: request_id.clone(),
                    body: (*body).to_owned(),
                    deadline_ms: (SystemTime::now() + FUNCTION_TIMEOUT)
                        .duration_since(UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_millis(),
                };
                let (tx, rx) = oneshot::channel();
                let mut entry = Routed {
                    request_id: request_id.clone(),
                    instance: None,
                    cold: false,
                    routed: self.now(),
                    result: Some(rx),
                };
                let idle = (0..fleet.instances.len())
                    .filter(|&i| fleet.instances[i].phase == Phase::Idle)
                    .min_by_key(|&i| fleet.instances[i].idle_since);
                let live = fleet
                    .instances
                    .iter()
                    .filter(|x| x.phase != Phase::Dead)
                    .count();
                if let Some(i) = idle {
                    let x = &mut fleet.instances[i];
                    x.phase = Phase::Busy;
                    x.running = Some((request_id, tx));
                    x.invocations += 1;
                    // Its long poll, if it is waiting in one, gets the
                    // event as soon as it is thawed.
                    match x.polling.take() {
                        Some(poll) => {
                            if let Err(event) = poll.send(event) {
                                x.queued = Some(event);
                            }
                        }
                        None => x.queued = Some(event),
                    }
                    thaw.push(x.pid);
                    entry.instance = Some(i);
                } else if live < self.cap {
                    let i = fleet.instances.len();
                    match self.cold_start(i) {
                        Ok(mut x) => {
                            x.running = Some((request_id, tx));
                            x.invocations = 1;
                            x.queued = Some(event);
                            fleet.instances.push(x);
                            entry.instance = Some(i);
                            entry.cold = true;
                        }
                        Err(e) => {
                            let _ = tx.send(Outcome::Lost(e));
                        }
                    }
                } else {
                    let _ = tx.send(Outcome::Throttled);
                }
                routed.push(entry);
            }
        }
        for pid in thaw {
            if let Err(e) = signal(pid, "-CONT").await {
                eprintln!("emulator: could not thaw pid {pid}: {e}");
            }
        }
        routed
    }

    /// Waits for the results of `routed`.
    async fn finish(&self, routed: Vec<Routed>) -> Vec<Record> {
        let mut records = Vec::with_capacity(routed.len());
        for mut r in routed {
            let rx = r.result.take().expect("a receiver per invocation");
            let outcome = match tokio::time::timeout(FUNCTION_TIMEOUT, rx).await {
                Ok(Ok(outcome)) => outcome,
                Ok(Err(_)) => Outcome::Lost("the instance died".into()),
                Err(_) => {
                    if let Some(i) = r.instance {
                        self.kill(i).await;
                    }
                    Outcome::Lost(format!("no answer within {FUNCTION_TIMEOUT:?}"))
                }
            };
            records.push(Record {
                request_id: r.request_id,
                instance: r.instance,
                cold: r.cold,
                routed: r.routed,
                done: self.now(),
                outcome,
            });
        }
        records
    }

    /// Starts instance `i`: its Runtime API endpoint, then its process.
    fn cold_start(&self, i: usize) -> Result<Instance, String> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(|e| format!("no port on 127.0.0.1: {e}"))?;
        let addr: SocketAddr = listener.local_addr().map_err(|e| e.to_string())?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("set_nonblocking: {e}"))?;
        let listener =
            tokio::net::TcpListener::from_std(listener).map_err(|e| format!("listener: {e}"))?;
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route(
                "/2018-06-01/runtime/invocation/{id}/response",
                post(response),
            )
            .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
            .route("/2018-06-01/runtime/init/error", post(init_error))
            .with_state((self.shared.clone(), i));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let spawned = Command::new(&self.binary)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("AWS_LAMBDA_RUNTIME_API", addr.to_string())
            .env("AWS_LAMBDA_FUNCTION_NAME", "inventory-check")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/inventory-check")
            .env("AWS_LAMBDA_LOG_STREAM_NAME", format!("instance-{i}"))
            .env("AWS_REGION", "us-east-1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                server.abort();
                return Err(format!("could not start {}: {e}", self.binary.display()));
            }
        };
        let now = Instant::now();
        Ok(Instance {
            pid: child.id(),
            child: Some(child),
            phase: Phase::Busy,
            queued: None,
            polling: None,
            running: None,
            idle_since: now,
            started: now,
            init: None,
            invocations: 0,
            server,
        })
    }

    /// Kills instance `i` whatever it is doing (an invocation that timed
    /// out).
    async fn kill(&self, i: usize) {
        let child = {
            let mut fleet = self.lock();
            let x = &mut fleet.instances[i];
            x.phase = Phase::Dead;
            x.polling = None;
            x.server.abort();
            x.child.take()
        };
        if let Some(child) = child {
            reap(child).await;
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let mut fleet = self.lock();
        for x in &mut fleet.instances {
            x.server.abort();
            if let Some(mut child) = x.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

// === impl Shared ===

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Fleet> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Instance `i` has answered `request_id`: freeze it, then mark it idle
    /// and hand `outcome` to the caller.
    async fn answered(&self, i: usize, request_id: &str, outcome: Outcome) -> StatusCode {
        let pid = {
            let fleet = self.lock();
            let x = &fleet.instances[i];
            match &x.running {
                Some((id, _)) if id == request_id => x.pid,
                _ => return StatusCode::BAD_REQUEST,
            }
        };
        // Frozen before it hears back, as Lambda freezes an environment
        // once its runtime has handed in the result.
        let frozen = signal(pid, "-STOP").await;
        let mut fleet = self.lock();
        let x = &mut fleet.instances[i];
        if let Err(e) = frozen {
            eprintln!("emulator: could not freeze instance {i}: {e}");
            x.phase = Phase::Dead;
        } else if x.phase == Phase::Busy {
            x.phase = Phase::Idle;
            x.idle_since = Instant::now();
        }
        if let Some((_, tx)) = x.running.take() {
            let _ = tx.send(outcome);
        }
        StatusCode::ACCEPTED
    }
}

// ================================================================ handlers

type Api = State<(Arc<Shared>, usize)>;

/// `GET /2018-06-01/runtime/invocation/next`: the queued event, or a long
/// poll until one is routed here.
async fn next(State((shared, i)): Api) -> Response {
    let waiting = {
        let mut fleet = shared.lock();
        let x = &mut fleet.instances[i];
        if x.init.is_none() {
            x.init = Some(x.started.elapsed());
        }
        match x.queued.take() {
            Some(event) => Ok(event),
            None => {
                let (tx, rx) = oneshot::channel();
                x.polling = Some(tx);
                Err(rx)
            }
        }
    };
    let event = match waiting {
        Ok(event) => event,
        Err(rx) => match rx.await {
            Ok(event) => event,
            Err(_) => return StatusCode::GONE.into_response(),
        },
    };
    (
        [
            ("content-type", "application/json".to_owned()),
            ("lambda-runtime-aws-request-id", event.request_id.clone()),
            ("lambda-runtime-deadline-ms", event.deadline_ms.to_string()),
            ("lambda-runtime-invoked-function-arn", ARN.to_owned()),
            (
                "lambda-runtime-trace-id",
                format!(
                    "Root=1-00000000-{};Parent=0000000000000001;Sampled=0",
                    &event.request_id[12..]
                ),
            ),
        ],
        event.body,
    )
        .into_response()
}

/// `POST /2018-06-01/runtime/invocation/{id}/response`.
async fn response(State((shared, i)): Api, Path(id): Path<String>, body: Bytes) -> StatusCode {
    let outcome = match serde_json::from_slice(&body) {
        Ok(json) => Outcome::Response(json),
        Err(e) => Outcome::Error {
            error_type: "Emulator.InvalidResponse".into(),
            message: format!("not JSON: {e}"),
        },
    };
    shared.answered(i, &id, outcome).await
}

/// `POST /2018-06-01/runtime/invocation/{id}/error`: a JSON diagnostic
/// (`errorType`, `errorMessage`); the type also comes in the
/// `Lambda-Runtime-Function-Error-Type` header.
async fn error(
    State((shared, i)): Api,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let (error_type, message) = diagnostic(&headers, &body);
    shared
        .answered(
            i,
            &id,
            Outcome::Error {
                error_type,
                message,
            },
        )
        .await
}

/// `POST /2018-06-01/runtime/init/error`: the cold start failed; the
/// invocation that waited for it fails, and the instance is torn down.
async fn init_error(State((shared, i)): Api, headers: HeaderMap, body: Bytes) -> StatusCode {
    let (error_type, message) = diagnostic(&headers, &body);
    let child = {
        let mut fleet = shared.lock();
        let x = &mut fleet.instances[i];
        x.phase = Phase::Dead;
        x.queued = None;
        if let Some((_, tx)) = x.running.take() {
            let _ = tx.send(Outcome::InitError(format!("{error_type}: {message}")));
        }
        x.child.take()
    };
    if let Some(child) = child {
        // After this answer: it exits, or is killed.
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            reap(child).await;
        });
    }
    StatusCode::ACCEPTED
}

fn diagnostic(headers: &HeaderMap, body: &[u8]) -> (String, String) {
    let json: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let error_type = json["errorType"]
        .as_str()
        .or_else(|| {
            headers
                .get("lambda-runtime-function-error-type")
                .and_then(|v| v.to_str().ok())
        })
        .unwrap_or("Unknown")
        .to_owned();
    let message = json["errorMessage"].as_str().unwrap_or_default().to_owned();
    (error_type, message)
}

// ================================================================ signals

/// Sends `signal` (`-STOP`, `-CONT`) to `pid`; after `-STOP`, waits until
/// the kernel reports the process stopped.
async fn signal(pid: u32, signal: &'static str) -> Result<(), String> {
    tokio::task::spawn_blocking(move || {
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .stderr(Stdio::null())
            .status()
            .map_err(|e| format!("kill {signal} {pid}: {e}"))?;
        if !status.success() {
            return Err(format!("kill {signal} {pid}: {status}"));
        }
        if signal == "-STOP" {
            let stat = format!("/proc/{pid}/stat");
            for _ in 0..1000 {
                let text = std::fs::read_to_string(&stat).unwrap_or_default();
                // `pid (comm) S ...`: the state follows the last ')'.
                let state = text
                    .rsplit_once(')')
                    .and_then(|(_, r)| r.trim().chars().next());
                if matches!(state, Some('T' | 't')) {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            return Err(format!("pid {pid} did not stop"));
        }
        Ok(())
    })
    .await
    .map_err(|e| e.to_string())?
}

/// SIGKILLs `child` (stopped or not) and reaps it.
async fn reap(mut child: Child) {
    let _ = tokio::task::spawn_blocking(move || {
        let _ = child.kill();
        let _ = child.wait();
    })
    .await;
}
