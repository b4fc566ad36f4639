//! Settings files: one document for every dependency (TOML, YAML, JSON),
//! defaults and overrides, every refusal with its path, and changes
//! applied to running stacks that keep their state.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_breaker::State;
use tower_resilience_base::CallContext;
use tower_shield::settings::{ClientStackSettings, ServiceSettings};

const TOML: &str = r#"
[defaults.client]
timeout = "2s"
breaker = { failure_rate = "50%", open_period = "5s" }
retry = { max_attempts = 3, budget = { ratio = "10%" } }

[clients.catalog]
timeout = "800ms"
bulkhead = { limit = 16 }

[clients.payments]
retry = { max_attempts = 1 }
breaker = { window = { time = "60s", buckets = 60 }, slow_calls = { duration = "1s", rate = "50%" } }

[clients.search]
throttle = { k = 2.0, window = "60s" }
faults = { latency = { share = "10%", delay = "200ms" } }

[servers.shop]
timeout = "2s"
concurrency = 256
"#;

const YAML: &str = r#"
defaults:
  client:
    timeout: 2s
    breaker: { failure_rate: 50%, open_period: 5s }
    retry: { max_attempts: 3, budget: { ratio: 10% } }
clients:
  catalog:
    timeout: 800ms
    bulkhead: { limit: 16 }
  payments:
    retry: { max_attempts: 1 }
    breaker:
      window: { time: 60s, buckets: 60 }
      slow_calls: { duration: 1s, rate: 50% }
  search:
    throttle: { k: 2.0, window: 60s }
    faults: { latency: { share: 10%, delay: 200ms } }
servers:
  shop: { timeout: 2s, concurrency: 256 }
"#;

const JSON: &str = r#"{
  "defaults": { "client": {
    "timeout": "2s",
    "breaker": { "failure_rate": 0.5, "open_period": "5s" },
    "retry": { "max_attempts": 3, "budget": { "ratio": 0.1 } } } },
  "clients": {
    "catalog": { "timeout": "800ms", "bulkhead": { "limit": 16 } },
    "payments": { "retry": { "max_attempts": 1 },
      "breaker": { "window": { "time": "60s", "buckets": 60 },
                   "slow_calls": { "duration": "1s", "rate": "50%" } } },
    "search": { "throttle": { "k": 2.0, "window": "60s" },
                "faults": { "latency": { "share": "10%", "delay": "200ms" } } } },
  "servers": { "shop": { "timeout": "2s", "concurrency": 256 } }
}"#;

fn toml_settings() -> ServiceSettings {
    let value: serde_json::Value = toml::from_str(TOML).unwrap();
    ServiceSettings::from_value(value).unwrap()
}

fn json_of(settings: &ServiceSettings, name: &str) -> serde_json::Value {
    serde_json::to_value(settings.client(name)).unwrap()
}

#[test]
fn one_file_configures_three_dependencies_with_defaults_and_overrides() {
    let settings = toml_settings();
    assert_eq!(
        settings.client_names().collect::<Vec<_>>(),
        ["catalog", "payments", "search"]
    );

    let catalog = settings.client("catalog");
    assert_eq!(
        catalog.timeout.unwrap().0,
        Duration::from_millis(800),
        "its own"
    );
    assert_eq!(catalog.bulkhead.fixed_limit(), Some(16));
    assert_eq!(catalog.retry.max_attempts, 3, "the defaults'");
    assert_eq!(catalog.breaker.get_open_period(), Duration::from_secs(5));

    let payments = settings.client("payments");
    assert_eq!(
        payments.timeout.unwrap().0,
        Duration::from_secs(2),
        "the defaults'"
    );
    assert_eq!(payments.retry.max_attempts, 1);
    assert_eq!(payments.retry.budget.ratio.0, 0.1, "merged key by key");
    assert_eq!(payments.breaker.get_failure_rate(), 0.5);
    assert_eq!(
        payments.breaker.get_slow_call_duration(),
        Some(Duration::from_secs(1))
    );
    assert_eq!(
        payments.bulkhead.fixed_limit(),
        Some(64),
        "the stack's default"
    );

    let search = settings.client("search");
    assert_eq!(
        search.throttle.as_ref().unwrap().get_window(),
        Duration::from_secs(60)
    );
    assert!(search.faults.is_some());

    // A name the file does not list gets the defaults.
    let other = settings.client("inventory");
    assert_eq!(other.timeout.unwrap().0, Duration::from_secs(2));
    assert!(other.throttle.is_none());

    let shop = settings.server("shop");
    assert_eq!(shop.concurrency, 256);
    assert_eq!(shop.timeout.unwrap().0, Duration::from_secs(2));
}

#[test]
fn toml_yaml_and_json_read_the_same() {
    let from_toml = toml_settings();
    let from_yaml =
        ServiceSettings::from_deserializer(serde_yaml_ng::Deserializer::from_str(YAML)).unwrap();
    let from_json = ServiceSettings::from_json_str(JSON).unwrap();
    for name in ["catalog", "payments", "search", "inventory"] {
        assert_eq!(
            json_of(&from_yaml, name),
            json_of(&from_toml, name),
            "{name}"
        );
        assert_eq!(
            json_of(&from_json, name),
            json_of(&from_toml, name),
            "{name}"
        );
    }
    assert_eq!(
        serde_json::to_value(from_yaml.server("shop")).unwrap(),
        serde_json::to_value(from_toml.server("shop")).unwrap()
    );
}

#[test]
fn a_stack_settings_round_trip() {
    let settings = toml_settings();
    for name in ["catalog", "payments", "search"] {
        let written = serde_json::to_string(settings.client(name)).unwrap();
        let read: ClientStackSettings = serde_json::from_str(&written).unwrap();
        assert_eq!(serde_json::to_string(&read).unwrap(), written);
        let toml_written = toml::to_string(settings.client(name)).unwrap();
        let read: ClientStackSettings = toml::from_str(&toml_written).unwrap();
        assert_eq!(
            serde_json::to_string(&read).unwrap(),
            written,
            "{toml_written}"
        );
    }
}

#[test]
fn every_refusal_says_where_and_why() {
    for (document, expected) in [
        (
            r#"{"client": {}}"#,
            "client: unknown key `client`, expected one of defaults, clients, servers",
        ),
        (
            r#"{"defaults": {"clients": {}}}"#,
            "defaults.clients: unknown key `clients`, expected one of client, server",
        ),
        (
            r#"{"defaults": {"client": {"breaker": {"open_perod": "1s"}}}}"#,
            "defaults.client.breaker.open_perod: unknown field `open_perod`",
        ),
        (
            r#"{"clients": {"catalog": {"retry": {"attempts": 2}}}}"#,
            "clients.catalog.retry.attempts: unknown field `attempts`",
        ),
        (
            r#"{"clients": {"catalog": {"bulkhead": {"limit": 0}}}}"#,
            "clients.catalog.bulkhead.limit: must be at least 1, got 0",
        ),
        (
            r#"{"clients": {"catalog": {"breaker": {"failure_rate": "150%"}}}}"#,
            "clients.catalog.breaker.failure_rate: invalid share \"150%\": above 100%",
        ),
        (
            r#"{"clients": {"catalog": {"timeout": "-2s"}}}"#,
            "clients.catalog.timeout: invalid duration \"-2s\": a duration cannot be negative",
        ),
        (
            r#"{"clients": {"catalog": {"timeout": 2}}}"#,
            "clients.catalog.timeout: invalid duration 2: a number needs a unit",
        ),
        (
            r#"{"clients": {"catalog": {"retry": {"max_attempts": 0}}}}"#,
            "clients.catalog.retry.max_attempts: must be at least 1",
        ),
        (
            r#"{"clients": {"catalog": {"faults": {"error": "60%", "hang": "60%"}}}}"#,
            "clients.catalog.faults: ",
        ),
        (
            r#"{"clients": {"catalog": {"throttle": {"k": 0.5}}}}"#,
            "clients.catalog.throttle: ",
        ),
        (
            r#"{"servers": {"shop": {"concurrency": 0}}}"#,
            "servers.shop.concurrency: must be at least 1, got 0",
        ),
        (
            r#"{"servers": {"shop": {"timeout": "10m", "max_timeout": "1m"}}}"#,
            "servers.shop.timeout: (10m) is above max_timeout (1m)",
        ),
        (
            r#"{"clients": {"catalog": 5}}"#,
            "clients.catalog: expected a table of settings, got 5",
        ),
        (r#"[1]"#, "expected a table of settings"),
    ] {
        let err = ServiceSettings::from_json_str(document)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(expected),
            "{document}\n  got: {err}\n  expected: {expected}"
        );
    }
}

#[test]
fn an_error_in_the_defaults_is_placed_in_the_defaults() {
    // The defaults' bad value shows in every entry that inherits it: the
    // error names the defaults, where it is written.
    let err = ServiceSettings::from_json_str(
        r#"{ "defaults": { "client": { "retry": { "backoff": { "multiplier": "fast" } } } },
             "clients": { "catalog": { "timeout": "1s" } } }"#,
    )
    .unwrap_err();
    assert_eq!(err.path(), "defaults.client.retry.backoff.multiplier");
    // An override that replaces a window whole is not merged into the
    // defaults' window (count and time would both be set).
    let settings = ServiceSettings::from_json_str(
        r#"{ "defaults": { "client": { "breaker": { "window": { "time": "10s" } } } },
             "clients": { "catalog": { "breaker": { "window": { "count": 50 } } } } }"#,
    )
    .unwrap();
    assert_eq!(
        settings.client("catalog").breaker.get_window(),
        tower_breaker::config::WindowKind::Count { size: 50 }
    );
}

/// The dependency: fails while `fail` is set; counts the attempts it
/// got and the most in flight at once.
#[derive(Clone, Default)]
struct Dependency {
    fail: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
    /// Of `sent`, the retries (attempt 2 or later, as the retry layer
    /// above says in the call context).
    retries_sent: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    most_in_flight: Arc<AtomicUsize>,
}

fn transport(
    dep: Dependency,
) -> impl tower::Service<
    http::Request<tower_retry_budget::body::ReplayBody<String>>,
    Response = http::Response<String>,
    Error = BoxError,
    Future = impl Send,
> + Clone {
    service_fn(
        move |_req: http::Request<tower_retry_budget::body::ReplayBody<String>>| {
            let dep = dep.clone();
            if CallContext::current(CallContext::attempt) > 1 {
                dep.retries_sent.fetch_add(1, SeqCst);
            }
            async move {
                dep.sent.fetch_add(1, SeqCst);
                let now = dep.in_flight.fetch_add(1, SeqCst) + 1;
                dep.most_in_flight.fetch_max(now, SeqCst);
                tokio::task::yield_now().await;
                dep.in_flight.fetch_sub(1, SeqCst);
                if dep.fail.load(SeqCst) {
                    let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
                    Err::<http::Response<String>, BoxError>(Box::new(reset))
                } else {
                    Ok(http::Response::new(String::from("ok")))
                }
            }
        },
    )
}

#[tokio::test(start_paused = true)]
async fn a_change_applies_to_the_running_stack_and_keeps_its_state() {
    let mut settings = ServiceSettings::from_json_str(
        r#"{ "clients": { "catalog": { "timeout": "1s", "bulkhead": { "limit": 4 },
             "breaker": { "window": { "count": 10 }, "minimum_calls": 4 } } } }"#,
    )
    .unwrap();
    let (stack, _handle) = settings.client_stack("catalog");
    let breaker = stack.breaker_handle().clone();
    let bulkhead = stack.bulkhead_handle();
    let budget = Arc::clone(stack.retry_budget());
    let dep = Dependency::default();
    dep.fail.store(true, SeqCst);
    let client = stack.layer(transport(dep.clone()));
    for _ in 0..4 {
        let _ = client
            .clone()
            .oneshot(http::Request::new(String::new()))
            .await;
    }
    assert_eq!(breaker.snapshot().state, State::Open);
    let before = breaker.snapshot().totals;
    let requests = budget.counters().requests;

    let reports = settings.apply(
        ServiceSettings::from_json_str(
            r#"{ "clients": { "catalog": { "timeout": "300ms", "bulkhead": { "limit": 8 },
                 "retry": { "max_attempts": 2, "budget": { "ratio": "20%" } },
                 "breaker": { "window": { "count": 50 }, "minimum_calls": 4, "failure_rate": "80%" } } } }"#,
        )
        .unwrap(),
    );
    let report = &reports["catalog"];
    assert_eq!(
        report.applied,
        [
            "timeout",
            "breaker.failure_rate",
            "retry.max_attempts",
            "retry.budget.ratio",
            "bulkhead.limit"
        ]
    );
    let not_live: Vec<_> = report.not_live.iter().map(|n| n.setting.as_str()).collect();
    assert_eq!(not_live, ["breaker.window"]);

    assert_eq!(
        breaker.snapshot().state,
        State::Open,
        "the open circuit stays open"
    );
    assert_eq!(breaker.snapshot().totals, before, "its counters are kept");
    assert_eq!(bulkhead.limit(), 8);
    assert_eq!(
        stack.timeout_handle().get(),
        Some(Duration::from_millis(300))
    );
    assert_eq!(stack.max_attempts_handle().get(), 2);
    assert_eq!(budget.ratio_value(), Some(0.2));
    assert_eq!(
        budget.counters().requests,
        requests,
        "the budget keeps its window"
    );
    // The services built before the change use the new settings.
    let err = client
        .clone()
        .oneshot(http::Request::new(String::new()))
        .await
        .unwrap_err();
    assert!(err.is::<tower_breaker::error::CircuitOpen>(), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_throttle_takes_new_ks_live_but_not_a_new_window() {
    let settings = toml_settings();
    let (stack, handle) = settings.client_stack("search");
    let throttle = stack.throttle_handle().unwrap().clone();
    let mut new = handle.current();
    new.throttle = Some(
        tower_breaker::throttle::ThrottleConfig::new()
            .k(3.0)
            .window(Duration::from_secs(30)),
    );
    let report = handle.apply(&new).unwrap();
    assert_eq!(report.applied, ["throttle"]);
    assert_eq!(report.not_live[0].setting, "throttle.window");
    assert_eq!(throttle.config().get_k(Default::default()), 3.0);
    assert_eq!(throttle.config().get_window(), Duration::from_secs(60));
    // A stack built without a throttle cannot gain one live.
    let (_, catalog) = settings.client_stack("catalog");
    let report = catalog.apply(&new).unwrap();
    assert_eq!(report.not_live[0].setting, "throttle");
}

#[tokio::test(start_paused = true)]
async fn an_invalid_change_changes_nothing() {
    let settings =
        ServiceSettings::from_json_str(r#"{ "clients": { "catalog": { "timeout": "1s" } } }"#)
            .unwrap();
    let (stack, handle) = settings.client_stack("catalog");
    let mut bad = handle.current();
    bad.retry.max_attempts = 0;
    bad.timeout = Some(Duration::from_secs(9).into());
    let err = handle.apply(&bad).unwrap_err();
    assert_eq!(
        err.to_string(),
        "retry.max_attempts: must be at least 1 (1 turns retries off), got 0"
    );
    assert_eq!(stack.timeout_handle().get(), Some(Duration::from_secs(1)));
}

#[tokio::test(start_paused = true)]
async fn faults_follow_the_settings_once_a_fault_layer_is_registered() {
    let settings = ServiceSettings::from_json_str(r#"{ "clients": { "search": {} } }"#).unwrap();
    let (_stack, handle) = settings.client_stack("search");
    let mut with_faults = handle.current();
    with_faults.faults = Some(tower_chaos::FaultPlan::new().error(0.5));
    let report = handle.apply(&with_faults).unwrap();
    assert_eq!(report.not_live[0].setting, "faults", "no fault layer yet");

    let faults = tower_chaos::FaultLayer::new(tower_chaos::FaultHandle::new("search"));
    let handle = handle.with_faults(faults.handle().clone()).unwrap();
    assert!(
        faults.handle().is_on(),
        "the current plan applies at registration"
    );
    let mut without = handle.current();
    without.faults = None;
    assert_eq!(handle.apply(&without).unwrap().applied, ["faults"]);
    assert!(!faults.handle().is_on());
}

/// Many tasks call through one stack while its settings change hundreds
/// of times: no permit or budget token is lost, and an open circuit stays
/// open through every change.
#[test]
fn reloads_under_load_lose_nothing() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let document = |limit: usize, rate: &str, attempts: u32| {
            format!(
                r#"{{ "clients": {{ "catalog": {{ "timeout": "5s", "bulkhead": {{ "limit": {limit} }},
                     "retry": {{ "max_attempts": {attempts}, "budget": {{ "ratio": "{rate}" }} }},
                     "breaker": {{ "window": {{ "count": 20 }}, "minimum_calls": 10, "failure_rate": "{rate}" }} }} }} }}"#
            )
        };
        let mut settings = ServiceSettings::from_json_str(&document(4, "50%", 3)).unwrap();
        let (stack, _) = settings.client_stack("catalog");
        let bulkhead = stack.bulkhead_handle();
        let breaker = stack.breaker_handle().clone();
        let budget = Arc::clone(stack.retry_budget());
        let dep = Dependency::default();
        let client = stack.layer(transport(dep.clone()));
        let stop = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicUsize::new(0));

        // Every reload waits for callers to finish a few calls under the
        // settings it replaced, so reloads and calls interleave however
        // busy the machine is (a fixed number of rounds on a loaded core
        // could otherwise pass with the callers barely running).
        let calls_in_between = |at_least: usize| {
            let calls = Arc::clone(&calls);
            async move {
                let from = calls.load(SeqCst);
                tokio::time::timeout(Duration::from_secs(10), async {
                    while calls.load(SeqCst) < from + at_least {
                        tokio::task::yield_now().await;
                    }
                })
                .await
                .expect("the callers stopped making calls between reloads");
            }
        };

        let mut tasks = Vec::new();
        for _ in 0..16 {
            let client = client.clone();
            let stop = Arc::clone(&stop);
            let calls = Arc::clone(&calls);
            tasks.push(tokio::spawn(async move {
                while !stop.load(SeqCst) {
                    let _ = client.clone().oneshot(http::Request::new(String::new())).await;
                    calls.fetch_add(1, SeqCst);
                    // A rejection answers at once: without this, callers
                    // that are only ever rejected would keep both worker
                    // threads and starve the calls holding permits.
                    tokio::task::yield_now().await;
                }
            }));
        }
        // Phase 1: a healthy dependency, the limit and the budget changing.
        for round in 0..200 {
            let (limit, rate, attempts) = if round % 2 == 0 { (2, "20%", 2) } else { (8, "50%", 3) };
            let reports = settings.apply(ServiceSettings::from_json_str(&document(limit, rate, attempts)).unwrap());
            assert!(reports["catalog"].is_complete(), "{:?}", reports["catalog"]);
            assert!(bulkhead.in_flight() <= 8);
            calls_in_between(4).await;
        }
        // Phase 2: the dependency fails; the circuit opens and must stay
        // open while the settings keep changing.
        dep.fail.store(true, SeqCst);
        // The opening's count follows its state word (the transition is a
        // compare-and-swap, counted after it succeeds): on two worker
        // threads a snapshot can see the circuit open with the count not
        // yet bumped, so wait for both.
        while {
            let now = breaker.snapshot();
            now.state != State::Open || now.totals.opened == 0
        } {
            tokio::task::yield_now().await;
        }
        let opened = breaker.snapshot().totals.opened;
        for round in 0..200 {
            let rate = if round % 2 == 0 { "90%" } else { "60%" };
            let _ = settings.apply(ServiceSettings::from_json_str(&document(4, rate, 3)).unwrap());
            assert_eq!(breaker.snapshot().state, State::Open, "round {round}");
            calls_in_between(2).await;
        }
        assert_eq!(breaker.snapshot().totals.opened, opened, "never closed and re-opened");
        stop.store(true, SeqCst);
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(bulkhead.in_flight(), 0, "every permit came back");
        assert!(dep.most_in_flight.load(SeqCst) <= 8, "never above the largest limit");
        // Every retry sent was paid for, and every retry paid for and not
        // given back (a retry the bulkhead turns away is given back) was
        // sent: none lost, none sent unpaid.
        let counters = budget.counters();
        let retries_sent = dep.retries_sent.load(SeqCst) as u64;
        assert_eq!(retries_sent, counters.retries, "{counters:?}");
        // Every first attempt the budget counted was sent or turned away
        // by the bulkhead. The bulkhead's count also holds the retries it
        // turned away, at most those given back.
        let firsts_sent = dep.sent.load(SeqCst) as u64 - retries_sent;
        let turned_away = bulkhead.rejected();
        assert!(
            (counters.requests..=counters.requests + counters.refunded).contains(&(firsts_sent + turned_away)),
            "{counters:?}, {firsts_sent} first attempts sent, {turned_away} turned away by the bulkhead"
        );
        assert!(counters.retries + counters.refunded > 0, "the retry path ran: {counters:?}");
    });
}
