//! The Lambda function of `src/bin/lambda-runtime.rs`, on the real
//! `lambda_runtime`, as a fleet of OS processes under the Runtime API
//! emulator of `emulator/mod.rs`: frozen (SIGSTOP) between invocations,
//! one scaled in (SIGKILL) during the outage, one cold-started while the
//! circuit is open, its circuit shared through a private `redis-server` or
//! `moto_server` on 127.0.0.1. A local dependency counts the calls it
//! receives (by invocation: the function sends its request id) and can be
//! switched to fail.
//!
//! The scenario, for each store: 5 cold starts at once, 10 healthy
//! invocations, a lull longer than the breaker's window (so that the
//! window holds no healthy calls when the failures start), then an
//! invocation every 60 ms while the dependency fails, the fleet opens, one
//! probe fails, an instance cold-starts, the dependency recovers, the next
//! probe closes the circuit and every instance admits again. It checks the
//! targets of issue 29:
//!
//! - the fleet opens within 2x `minimum_calls` dependency calls once every
//!   call fails (and not before `minimum_calls`);
//! - exactly one probe reaches the dependency per open window: after the
//!   opening, the dependency sees only the probes, one call each, each at
//!   least one open period (less its jitter) after the one before;
//! - the instance cold-started while open rejects its first invocation
//!   without calling the dependency;
//! - the circuit closes for all within one open period plus one probe plus
//!   one refresh interval after the dependency recovers, plus a margin of
//!   [`MARGIN`] for a loaded machine (the last rejection, on any instance,
//!   is measured on the emulator's clock).
//!
//! Timings are asserted as lower bounds (load only delays) or with that
//! margin; counts are exact. Run with `-- --nocapture` to see the figures.

mod emulator;
#[path = "../src/moto.rs"]
mod moto;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::Router;
use emulator::{Emulator, Outcome, Record};
use resilience_testkit::redis::RedisServer;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::time::Instant;
use tower_breaker_dynamodb::{DynamoDbOptions, DynamoDbStore};

/// Instances started at once; the emulator's concurrency cap.
const FLEET: usize = 5;
const CAP: usize = 6;
/// The function's breaker (its environment).
const MINIMUM_CALLS: usize = 10;
const OPEN_PERIOD: Duration = Duration::from_millis(1500);
const WINDOW: Duration = Duration::from_secs(3);
const REFRESH: Duration = Duration::from_millis(250);
/// The breaker's defaults: the jitter of each open period, and its growth
/// after a failed probe.
const JITTER: f64 = 0.1;
const GROWTH: u32 = 2;
/// An invocation every `TICK` while the scenario runs.
const TICK: Duration = Duration::from_millis(60);
/// Taken off the lower bounds on probe spacing: the store's clock and the
/// rounding of its periods.
const SLACK: Duration = Duration::from_millis(250);
/// Added to the upper bound on the time to close: the wait for the next
/// invocation after the open period (one [`TICK`]), the store's round
/// trips and a loaded 2-core machine (a debug build of every process).
const MARGIN: Duration = Duration::from_millis(1500);
/// No scenario runs longer.
const LIMIT: Duration = Duration::from_secs(50);

/// The fleet scenarios, one at a time: each loads the machine with its
/// processes and measures time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_on_redis_opens_probes_and_closes_as_one() {
    let Some(redis) = redis_or_skip("a_fleet_on_redis_opens_probes_and_closes_as_one") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    fleet("redis", redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_on_dynamodb_opens_probes_and_closes_as_one() {
    let test = "a_fleet_on_dynamodb_opens_probes_and_closes_as_one";
    let moto = match moto::MotoServer::start_or_skip(test).await {
        Ok(moto::Started::Running(moto)) => moto,
        Ok(moto::Started::Skipped(0)) => return,
        Ok(moto::Started::Skipped(_)) => {
            panic!("moto_server not found and TOWER_REQUIRE_SERVERS is set: `{test}` must run")
        }
        Err(e) => panic!("{e}"),
    };
    DynamoDbStore::new(
        moto::client(moto.url()),
        DynamoDbOptions::new().table("circuits"),
    )
    .expect("a valid store")
    .create_table()
    .await
    .expect("the table");
    let _serial = SERIAL.lock().await;
    fleet("dynamodb", format!("dynamodb={}", moto.url())).await;
}

/// A cold start that fails (here: a store the function does not know)
/// reaches the emulator as `/init/error`, and fails the invocation that
/// was waiting for the instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_cold_start_is_reported_as_an_init_error() {
    let env = vec![
        (
            "CIRCUIT_STORE".to_owned(),
            "memcached://127.0.0.1:1".to_owned(),
        ),
        (
            "DEPENDENCY_URL".to_owned(),
            "http://127.0.0.1:1/".to_owned(),
        ),
    ];
    let emu = Emulator::new(env!("CARGO_BIN_EXE_lambda-runtime"), env, CAP);
    let record = emu.invoke(r#"{"order":1}"#).await;
    match &record.outcome {
        Outcome::InitError(e) => assert!(e.contains("CIRCUIT_STORE"), "{e}"),
        other => panic!("expected an init error, got {other:?}"),
    }
    assert!(record.cold);
    assert!(emu.live().is_empty(), "the instance is torn down");
}

// ================================================================ scenario

/// What the function's answer says.
fn status(r: &Record) -> Option<u64> {
    match &r.outcome {
        Outcome::Response(json) => json["statusCode"].as_u64(),
        _ => None,
    }
}

fn probe(r: &Record) -> bool {
    matches!(&r.outcome, Outcome::Response(json) if json["probe"] == true)
}

fn store_requests(r: &Record) -> Option<u64> {
    match &r.outcome {
        Outcome::Response(json) => json["storeRequests"].as_u64(),
        _ => None,
    }
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// The scenario against the store `circuit_store` (the function's
/// `CIRCUIT_STORE`).
async fn fleet(label: &str, circuit_store: String) {
    let dependency = Dependency::start().await;
    let env = [
        ("CIRCUIT_STORE", circuit_store),
        ("DEPENDENCY_URL", dependency.url.clone()),
        ("OPEN_PERIOD_MS", ms(OPEN_PERIOD).to_string()),
        ("MINIMUM_CALLS", MINIMUM_CALLS.to_string()),
        ("WINDOW_SECS", WINDOW.as_secs().to_string()),
        ("REFRESH_INTERVAL_MS", ms(REFRESH).to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let emu = Arc::new(Emulator::new(
        env!("CARGO_BIN_EXE_lambda-runtime"),
        env,
        CAP,
    ));
    let mut run = Run::new(emu.clone(), label);

    // 1. A burst of FLEET requests: as many cold starts.
    let started = run.burst(FLEET).await;
    assert!(
        started.iter().all(|r| r.cold && status(r) == Some(200)),
        "{started:?}"
    );
    run.say(&format!(
        "{FLEET} instances cold-started at once (cold starts took {:?} ms)",
        emu.cold_starts().iter().map(|d| ms(*d)).collect::<Vec<_>>()
    ));

    // 2. Healthy traffic, spread over the warm instances.
    let mut healthy = 0;
    run.pump("10 healthy invocations", |_| {
        healthy += 1;
        healthy >= 10
    })
    .await;
    run.drain().await;
    assert!(
        run.records.iter().all(|r| status(r) == Some(200)),
        "healthy: {:?}",
        run.records
    );
    let healthy_requests: Vec<u64> = run
        .records
        .iter()
        .filter(|r| !r.cold)
        .filter_map(store_requests)
        .collect();
    run.say(&format!(
        "{} healthy invocations, every one 200; the fleet is idle (frozen) for {} ms, longer \
         than the breaker's window",
        run.records.len(),
        ms(WINDOW) + 300
    ));
    tokio::time::sleep(WINDOW + Duration::from_millis(300)).await;

    // 3. Every call fails.
    let t_fail = emu.now();
    dependency.failing.store(true, Relaxed);
    run.say("the dependency fails every call (HTTP 503, which the stack retries)");
    let failed = run
        .pump("a failed invocation", |r| status(r) == Some(502))
        .await;
    // Once the invocations in flight are done, every instance is frozen.
    run.drain().await;
    let victim = failed.instance.expect("an instance ran it");
    emu.scale_in(victim).await.expect("a frozen instance");
    run.say(&format!(
        "instance {victim} scaled in (SIGKILL while frozen) after a failed invocation"
    ));
    run.pump("a rejection", |r| status(r) == Some(503)).await;
    run.say("the fleet rejects: the circuit is open");
    let first_probe = run.pump("the first probe", probe).await;
    let probed: Vec<Call> = dependency
        .calls(&emu)
        .into_iter()
        .filter(|c| c.request_id == first_probe.request_id)
        .collect();
    assert!(
        probed.len() == 1 && probed[0].failed,
        "the first probe is one call, to the failing dependency: {first_probe:?}, {probed:?}"
    );
    run.say("one instance probed at the end of the open period; it failed: open again");

    // 4. A burst while open: every idle instance, and one cold start.
    run.drain().await;
    let burst = run.burst(emu.idle().len() + 1).await;
    let cold: Vec<&Record> = burst.iter().filter(|r| r.cold).collect();
    assert_eq!(cold.len(), 1, "one cold start in the burst: {burst:?}");
    let cold = cold[0].clone();
    run.say(&format!(
        "a burst of {} while open: instance {} cold-started and answered {:?}",
        burst.len(),
        cold.instance.unwrap_or_default(),
        status(&cold)
    ));

    // 5. The dependency recovers; a probe closes the circuit.
    let t_recover = emu.now();
    dependency.failing.store(false, Relaxed);
    run.say("the dependency recovers");
    let closing = run
        .pump("a probe that closes", |r| {
            probe(r) && status(r) == Some(200)
        })
        .await;
    run.say("a probe succeeded: the circuit is closed in the store");

    // 6. Until every live instance has admitted a call since.
    let mut admitted = HashSet::new();
    let live = emu.clone();
    run.pump("every instance admitting", |r| {
        if status(r) == Some(200) && r.routed >= closing.done {
            admitted.extend(r.instance);
        }
        live.live().iter().all(|i| admitted.contains(i))
    })
    .await;
    run.drain().await;
    run.say(&format!(
        "every live instance ({}) admits and calls the dependency again",
        emu.live().len()
    ));

    // 7. An event the function cannot read: its error, through /error.
    let bad = emu.invoke(r#"{"order":"seven"}"#).await;
    match &bad.outcome {
        Outcome::Error {
            error_type,
            message,
        } => run.say(&format!(
            "a malformed event: the runtime posted /error ({error_type}: {message})"
        )),
        other => panic!("a malformed event: expected /error, got {other:?}"),
    }

    // ------------------------------------------------------------ figures
    let calls = dependency.calls(&emu);
    let records = &run.records;
    let probes: Vec<&Record> = records.iter().filter(|r| probe(r)).collect();
    let probe_ids: HashSet<&str> = probes.iter().map(|r| r.request_id.as_str()).collect();
    let calls_of = |id: &str| calls.iter().filter(|c| c.request_id == id).count();
    let probe_calls: Vec<&Call> = calls
        .iter()
        .filter(|c| probe_ids.contains(c.request_id.as_str()))
        .collect();
    for p in &probes {
        assert_eq!(
            calls_of(&p.request_id),
            1,
            "a probe is one call of the dependency (no retry): {p:?}"
        );
    }
    let first_probe_at = probe_calls[0].at;
    let close_at = probe_calls.last().expect("a probe").at;

    // Calls to open: every call after the failures began and before the
    // first probe (the fleet's overshoot included).
    let failing: Vec<&Call> = calls
        .iter()
        .filter(|c| c.at >= t_fail && c.at < first_probe_at)
        .collect();
    assert!(failing.iter().all(|c| c.failed));
    let to_open = failing.len();
    // Between the first probe and the close, only probes.
    let leaked = calls
        .iter()
        .filter(|c| c.at >= first_probe_at && c.at <= close_at)
        .filter(|c| !probe_ids.contains(c.request_id.as_str()))
        .count();

    // Probe spacing: each at least its open period (less the jitter)
    // after the opening it ends.
    let mut spacing = Vec::new();
    let mut period = OPEN_PERIOD;
    let opened_at = failing.get(MINIMUM_CALLS - 1).map_or(t_fail, |c| c.at);
    let mut previous = opened_at;
    for c in &probe_calls {
        spacing.push((c.at.saturating_sub(previous), period));
        previous = c.at;
        period *= GROWTH;
    }
    // A failed probe's answer is 502, or 503 when the stack's retry found
    // the circuit open again; the dependency says which probes failed.
    let failed_probes = probe_calls.iter().filter(|c| c.failed).count();
    let in_force = OPEN_PERIOD * GROWTH.pow(u32::try_from(failed_probes).unwrap_or(0));

    let last_rejection = records
        .iter()
        .filter(|r| status(r) == Some(503))
        .map(|r| r.done)
        .max()
        .unwrap_or_default();
    let closed_for_all = closing.done.max(last_rejection);
    let to_close = closed_for_all.saturating_sub(t_recover);
    let probe_took = closing.done.saturating_sub(closing.routed);
    let close_target = in_force.mul_f64(1.0 + JITTER) + probe_took + REFRESH;

    println!();
    println!("[{label}] figures:");
    let failing_invocations: HashSet<&str> =
        failing.iter().map(|c| c.request_id.as_str()).collect();
    println!(
        "  calls to open: {to_open} dependency calls, from {} invocations, once every call \
         failed (minimum_calls {MINIMUM_CALLS}, target at most {})",
        failing_invocations.len(),
        2 * MINIMUM_CALLS
    );
    println!(
        "  probes: {} for {} open windows ({failed_probes} failed, 1 closed); calls by \
         anything else while open: {leaked}",
        probes.len(),
        probes.len()
    );
    for (i, (gap, period)) in spacing.iter().enumerate() {
        println!(
            "    probe {}: {} ms after {} (open period {} ms, at least {} ms with the jitter)",
            i + 1,
            ms(*gap),
            if i == 0 {
                format!("failed call {MINIMUM_CALLS}")
            } else {
                "the probe before".to_owned()
            },
            ms(*period),
            ms(period.mul_f64(1.0 - JITTER))
        );
    }
    println!(
        "  cold start while open: instance {} answered {:?} to its first invocation, with {} \
         dependency call(s)",
        cold.instance.unwrap_or_default(),
        status(&cold),
        calls_of(&cold.request_id)
    );
    println!(
        "  time to close for all: {} ms after the dependency recovered (the probe closed it at \
         +{} ms, the last rejection at +{} ms); target: open period in force {} ms (+{}% \
         jitter) + the probe {} ms + refresh {} ms = {} ms, asserted with a margin of {} ms",
        ms(to_close),
        ms(closing.done.saturating_sub(t_recover)),
        ms(last_rejection.saturating_sub(t_recover)),
        ms(in_force),
        (JITTER * 100.0) as u32,
        ms(probe_took),
        ms(REFRESH),
        ms(close_target),
        ms(MARGIN)
    );
    for r in records
        .iter()
        .filter(|r| status(r) == Some(503) && r.done > closing.done)
    {
        if let Outcome::Response(json) = &r.outcome {
            println!(
                "    rejected after the close: instance {:?} routed at +{} ms: {}",
                r.instance,
                ms(r.routed.saturating_sub(t_recover)),
                json["body"]
            );
        }
    }
    let rejected_requests: Vec<u64> = records
        .iter()
        .filter(|r| !r.cold && status(r) == Some(503))
        .filter_map(store_requests)
        .collect();
    let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len().max(1) as f64;
    if !healthy_requests.is_empty() {
        println!(
            "  DynamoDB requests per warm invocation: {:.2} healthy, {:.2} rejected while open",
            mean(&healthy_requests),
            mean(&rejected_requests)
        );
    }
    println!(
        "  {} invocations ({} throttled), {} dependency calls, {} instances started, the \
         scenario took {:.1} s",
        records.len() + 1,
        records
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Throttled))
            .count(),
        calls.len(),
        emu.cold_starts().len(),
        emu.now().as_secs_f64()
    );

    // ------------------------------------------------------------ targets
    assert!(
        (MINIMUM_CALLS..=2 * MINIMUM_CALLS).contains(&to_open),
        "the fleet opened after {to_open} dependency calls (minimum_calls {MINIMUM_CALLS})"
    );
    assert_eq!(
        leaked, 0,
        "calls other than the probes reached the dependency while open"
    );
    assert!(
        failed_probes >= 1 && probes.len() == failed_probes + 1,
        "probes: {failed_probes} failed of {}",
        probes.len()
    );
    for (i, (gap, period)) in spacing.iter().enumerate() {
        assert!(
            *gap + SLACK >= period.mul_f64(1.0 - JITTER),
            "probe {} came {} ms after the opening it ends (open period {} ms): two probes \
             in one open window",
            i + 1,
            ms(*gap),
            ms(*period)
        );
    }
    assert_eq!(
        status(&cold),
        Some(503),
        "the cold start while open: {cold:?}"
    );
    assert_eq!(calls_of(&cold.request_id), 0);
    assert!(
        to_close <= close_target + MARGIN,
        "closed for all {} ms after the recovery (target {} ms, margin {} ms)",
        ms(to_close),
        ms(close_target),
        ms(MARGIN)
    );
    for r in records {
        match &r.outcome {
            Outcome::Lost(why) => panic!("invocation {} lost: {why}", r.request_id),
            Outcome::Error { message, .. } => panic!("invocation {}: {message}", r.request_id),
            _ => {}
        }
    }
}

/// The scenario's traffic: an invocation every [`TICK`], each in a task
/// of its own, and the records of those that finished.
struct Run {
    emu: Arc<Emulator>,
    label: String,
    tx: UnboundedSender<Record>,
    rx: UnboundedReceiver<Record>,
    in_flight: usize,
    order: u64,
    records: Vec<Record>,
    deadline: Instant,
}

impl Run {
    fn new(emu: Arc<Emulator>, label: &str) -> Self {
        let (tx, rx) = unbounded_channel();
        Self {
            emu,
            label: label.to_owned(),
            tx,
            rx,
            in_flight: 0,
            order: 0,
            records: Vec::new(),
            deadline: Instant::now() + LIMIT,
        }
    }

    fn say(&self, what: &str) {
        println!(
            "[{} {:6.2} s] {what}",
            self.label,
            self.emu.now().as_secs_f64()
        );
    }

    fn event(&mut self) -> String {
        self.order += 1;
        format!(r#"{{"order":{}}}"#, self.order)
    }

    /// `n` invocations at once.
    async fn burst(&mut self, n: usize) -> Vec<Record> {
        let events: Vec<String> = (0..n).map(|_| self.event()).collect();
        let events: Vec<&str> = events.iter().map(String::as_str).collect();
        let records = self.emu.invoke_burst(&events).await;
        self.records.extend(records.iter().cloned());
        records
    }

    /// Sends an invocation every [`TICK`] until `done` holds for one
    /// that finished; returns that one.
    async fn pump(&mut self, what: &str, mut done: impl FnMut(&Record) -> bool) -> Record {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let event = self.event();
                    let (emu, tx) = (self.emu.clone(), self.tx.clone());
                    self.in_flight += 1;
                    tokio::spawn(async move {
                        let _ = tx.send(emu.invoke(&event).await);
                    });
                }
                Some(r) = self.rx.recv() => {
                    self.in_flight -= 1;
                    self.records.push(r.clone());
                    if done(&r) {
                        return r;
                    }
                }
                () = tokio::time::sleep_until(self.deadline) => {
                    panic!("[{}] the scenario did not reach {what} within {LIMIT:?}", self.label)
                }
            }
        }
    }

    /// Waits for the invocations still running.
    async fn drain(&mut self) {
        while self.in_flight > 0 {
            let r = tokio::time::timeout_at(self.deadline, self.rx.recv())
                .await
                .expect("the invocations in flight finish")
                .expect("the channel is open");
            self.in_flight -= 1;
            self.records.push(r);
        }
    }
}

// ================================================================ servers

/// The dependency: answers `in stock`, or 503 while `failing` (a status
/// the stack retries, within its budget); keeps
/// every call with its time and the `x-request-id` it carried.
struct Dependency {
    url: String,
    failing: Arc<AtomicBool>,
    calls: Arc<Mutex<Vec<(Instant, String, bool)>>>,
}

/// One call the dependency received, on the emulator's clock.
#[derive(Debug)]
struct Call {
    at: Duration,
    request_id: String,
    failed: bool,
}

impl Dependency {
    async fn start() -> Self {
        let failing = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new().route("/inventory", {
            let (failing, calls) = (failing.clone(), calls.clone());
            get(move |headers: HeaderMap| async move {
                let id = headers
                    .get("x-request-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let failed = failing.load(Relaxed);
                calls
                    .lock()
                    .expect("not poisoned")
                    .push((Instant::now(), id, failed));
                if failed {
                    Err(StatusCode::SERVICE_UNAVAILABLE)
                } else {
                    Ok("in stock")
                }
            })
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("an address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            url: format!("http://{addr}/inventory"),
            failing,
            calls,
        }
    }

    /// The calls so far, in order, timed on `emu`'s clock.
    fn calls(&self, emu: &Emulator) -> Vec<Call> {
        let epoch = Instant::now() - emu.now();
        self.calls
            .lock()
            .expect("not poisoned")
            .iter()
            .map(|(at, id, failed)| Call {
                at: at.saturating_duration_since(epoch),
                request_id: id.clone(),
                failed: *failed,
            })
            .collect()
    }
}

/// A private `redis-server` on a free port of 127.0.0.1, killed on drop,
/// or `None` having said loudly that the test is skipped (a failure under
/// `TOWER_REQUIRE_SERVERS`).
fn redis_or_skip(test: &str) -> Option<RedisServer> {
    let hint = "install it to run the Lambda fleet on Redis";
    tower_breaker_conformance::server_found("redis-server", "--version", test, hint)
        .then(RedisServer::start)
}
