//! The live view: every dependency's breaker, bulkhead, retries, throttle
//! (and, with the `chaos` feature, fault injection) as one JSON snapshot,
//! served by a tower service an axum router mounts, and a self-contained
//! HTML page that polls it: what an operator opens during an incident.
//!
//! ```
//! use tower_shield::client_stack;
//! use tower_shield::view::LiveView;
//!
//! let catalog = client_stack("catalog");
//! let view = LiveView::new();
//! view.add_client_stack(&catalog);
//!
//! let snapshot = view.snapshot();
//! assert_eq!(snapshot.dependencies[0].name, "catalog");
//! assert_eq!(snapshot.dependencies[0].breaker.as_ref().unwrap().state, "closed");
//! let json = view.json();
//! assert!(json.contains(r#""name":"catalog""#));
//! ```
//!
//! Mounted in axum (the page polls the JSON at the path it is given):
//!
//! ```
//! # use tower_shield::view::LiveView;
//! # let view = LiveView::new();
//! let ops = axum::Router::new()
//!     .route_service("/resilience.json", view.json_service())
//!     .route_service("/resilience", view.page_service("/resilience.json"));
//! # let _: axum::Router = ops;
//! ```
//!
//! **Mount it behind your own authentication.** It shows no secret (no
//! store credentials, no request contents, only names, states and
//! counters), but names and error rates of a service's dependencies are
//! not for everyone.

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderValue, Request, Response};
use serde::Serialize;
use tower_breaker::snapshot::Cause;
use tower_breaker::throttle::ThrottleHandle;
use tower_breaker::{Breaker, Mode, State};
use tower_bulkhead::CompartmentHandle;
use tower_retry_budget::Counters;
use tower_service::Service;

use crate::stack::{ClientStack, ThrottleSlot};
use tower_bulkhead::release::Release;

/// The registry of what the view shows: named dependencies, each with the
/// parts it has. Cheap to clone (one `Arc`); every clone, and every
/// service it made, shows the same dependencies.
///
/// Register each dependency once ([`add_client_stack`](Self::add_client_stack)
/// for a one-line stack, or [`dependency`](Self::dependency) and its
/// setters for layers built by hand). A name registered again replaces
/// the earlier entry.
#[derive(Clone, Default)]
pub struct LiveView {
    dependencies: Arc<RwLock<Vec<Entry>>>,
}

type RetryCounters = Arc<dyn Fn() -> Counters + Send + Sync>;

#[derive(Clone)]
struct Entry {
    name: String,
    breaker: Option<Breaker>,
    bulkhead: Option<CompartmentHandle>,
    retries: Option<RetryCounters>,
    throttle: Option<ThrottleHandle>,
    #[cfg(feature = "chaos")]
    faults: Option<tower_chaos::FaultHandle>,
}

/// A dependency being registered with [`LiveView::dependency`]: add its
/// parts, then it is shown (it is registered when this is dropped).
#[must_use = "the dependency is registered when this is dropped"]
pub struct DependencyBuilder<'a> {
    view: &'a LiveView,
    entry: Option<Entry>,
}

impl DependencyBuilder<'_> {
    fn entry(&mut self) -> &mut Entry {
        self.entry.as_mut().expect("present until dropped")
    }

    /// Its circuit breaker.
    pub fn breaker(mut self, breaker: Breaker) -> Self {
        self.entry().breaker = Some(breaker);
        self
    }

    /// Its bulkhead compartment (`BulkheadLayer::handle`).
    pub fn bulkhead(mut self, bulkhead: CompartmentHandle) -> Self {
        self.entry().bulkhead = Some(bulkhead);
        self
    }

    /// Its retry counters (`Retry::counters`, or a closure reading them).
    pub fn retries(mut self, counters: impl Fn() -> Counters + Send + Sync + 'static) -> Self {
        self.entry().retries = Some(Arc::new(counters));
        self
    }

    /// Its client-side throttle.
    pub fn throttle(mut self, throttle: ThrottleHandle) -> Self {
        self.entry().throttle = Some(throttle);
        self
    }

    /// Its fault injection (feature `chaos`).
    #[cfg(feature = "chaos")]
    #[cfg_attr(docsrs, doc(cfg(feature = "chaos")))]
    pub fn faults(mut self, faults: tower_chaos::FaultHandle) -> Self {
        self.entry().faults = Some(faults);
        self
    }
}

impl Drop for DependencyBuilder<'_> {
    fn drop(&mut self) {
        if let Some(entry) = self.entry.take() {
            self.view.insert(entry);
        }
    }
}

impl LiveView {
    /// An empty view.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the dependency `name`: add its parts to the returned
    /// builder.
    ///
    /// ```
    /// use tower_shield::breaker::Breaker;
    /// use tower_shield::view::LiveView;
    ///
    /// let view = LiveView::new();
    /// let _ = view.dependency("ledger").breaker(Breaker::new("ledger"));
    /// assert!(view.snapshot().dependencies[0].bulkhead.is_none());
    /// ```
    pub fn dependency(&self, name: impl Into<String>) -> DependencyBuilder<'_> {
        DependencyBuilder {
            view: self,
            entry: Some(Entry {
                name: name.into(),
                breaker: None,
                bulkhead: None,
                retries: None,
                throttle: None,
                #[cfg(feature = "chaos")]
                faults: None,
            }),
        }
    }

    /// Registers a one-line client stack under its breaker's name: its
    /// breaker, bulkhead, retry counters and throttle (if it has one).
    pub fn add_client_stack<P, M, R, T>(&self, stack: &ClientStack<P, M, R, T>)
    where
        ClientStack<P, M, R, T>: Clone + Send + Sync + 'static,
        R: Release,
        T: ThrottleSlot,
    {
        let breaker = stack.breaker_handle().clone();
        let name = breaker.name().to_owned();
        let retry = stack.clone();
        let mut builder = self
            .dependency(name)
            .breaker(breaker)
            .bulkhead(stack.bulkhead_handle())
            .retries(move || retry.retry_counters());
        if let Some(throttle) = stack.throttle_handle() {
            builder = builder.throttle(throttle.clone());
        }
        drop(builder);
    }

    fn insert(&self, entry: Entry) {
        let mut dependencies = self
            .dependencies
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        dependencies.retain(|e| e.name != entry.name);
        dependencies.push(entry);
    }

    /// Every dependency's figures now.
    #[must_use]
    pub fn snapshot(&self) -> ViewSnapshot {
        let entries = self
            .dependencies
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        ViewSnapshot {
            taken_at_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, millis),
            dependencies: entries.iter().map(Entry::view).collect(),
        }
    }

    /// [`snapshot`](Self::snapshot) as JSON.
    #[must_use]
    pub fn json(&self) -> String {
        // Plain numbers, strings and options: serializing cannot fail.
        serde_json::to_string(&self.snapshot())
            .unwrap_or_else(|e| format!(r#"{{"error":"{}"}}"#, e.to_string().replace('"', "'")))
    }

    /// A service answering every request with the JSON snapshot
    /// (`application/json`, not cached), for `Router::route_service`.
    #[must_use]
    pub fn json_service(&self) -> JsonService {
        JsonService { view: self.clone() }
    }

    /// A service answering every request with the HTML page, which polls
    /// the JSON at `json_path` every second. The page is self-contained
    /// (no external script, style or font).
    #[must_use]
    pub fn page_service(&self, json_path: &str) -> PageService {
        let escaped: String = json_path
            .chars()
            .filter(|c| c.is_ascii_graphic() && !matches!(c, '"' | '\'' | '<' | '>' | '\\' | '`'))
            .collect();
        PageService {
            page: Arc::from(PAGE.replace("__JSON_PATH__", &escaped)),
        }
    }
}

impl std::fmt::Debug for LiveView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self
            .dependencies
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|e| e.name.clone())
            .collect();
        f.debug_struct("LiveView")
            .field("dependencies", &names)
            .finish()
    }
}

impl std::fmt::Debug for DependencyBuilder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DependencyBuilder").finish_non_exhaustive()
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Entry {
    fn view(&self) -> DependencyView {
        DependencyView {
            name: self.name.clone(),
            breaker: self.breaker.as_ref().map(breaker_view),
            bulkhead: self.bulkhead.as_ref().map(|handle| {
                let stats = handle.stats();
                BulkheadView {
                    in_flight: stats.in_flight(),
                    limit: stats.limit(),
                    adaptive: stats.is_adaptive(),
                    rejected: stats.rejected(),
                    shed: stats.shed(),
                    recent_latency_ms: stats.recent_latency().map(|d| d.as_secs_f64() * 1e3),
                    no_load_latency_ms: stats.no_load_latency().map(|d| d.as_secs_f64() * 1e3),
                }
            }),
            retries: self.retries.as_ref().map(|read| {
                let c = read();
                RetriesView {
                    requests: c.requests,
                    retries: c.retries,
                    refused_by_budget: c.refused_by_budget,
                }
            }),
            throttle: self.throttle.as_ref().map(|t| {
                let s = t.snapshot();
                ThrottleView {
                    requests: s.requests,
                    accepts: s.accepts,
                    rejection_probability: s.rejection_probability,
                    rejected: s.rejected,
                    throttling: s.throttling,
                }
            }),
            #[cfg(feature = "chaos")]
            faults: self.faults.as_ref().map(|f| {
                let s = f.snapshot();
                FaultsView {
                    on: s.on,
                    eligible: s.eligible,
                    injected: tower_chaos::FaultKind::ALL
                        .into_iter()
                        .map(|k| (k.as_str(), s.injected[k.index()]))
                        .collect(),
                }
            }),
        }
    }
}

fn state_name(state: State) -> &'static str {
    match state {
        State::Closed => "closed",
        State::Open => "open",
        State::HalfOpen => "half_open",
    }
}

fn cause_name(cause: Cause) -> &'static str {
    match cause {
        Cause::FailureRate => "failure_rate",
        Cause::SlowCallRate => "slow_call_rate",
        Cause::ConsecutiveFailures => "consecutive_failures",
        Cause::OpenPeriodOver => "open_period_over",
        Cause::ProbeFailed => "probe_failed",
        Cause::ProbeTimedOut => "probe_timed_out",
        Cause::ProbeGivenBack => "probe_given_back",
        Cause::ProbesSucceeded => "probes_succeeded",
        Cause::ModeChanged => "mode_changed",
        Cause::Store => "store",
        _ => "other",
    }
}

fn breaker_view(breaker: &Breaker) -> BreakerView {
    let s = breaker.snapshot();
    BreakerView {
        state: state_name(s.state),
        mode: match s.mode {
            Mode::Automatic => "automatic",
            Mode::ForcedOpen => "forced_open",
            Mode::ForcedClosed => "forced_closed",
            Mode::Disabled => "disabled",
            Mode::MetricsOnly => "metrics_only",
        },
        failure_rate: finite(s.failure_rate),
        slow_rate: finite(s.slow_rate),
        calls: s.window.calls,
        failures: s.window.failures,
        slow: s.window.slow,
        slow_in_flight: s.window.slow_in_flight,
        retry_after_ms: s.retry_after.map(millis),
        probes_in_flight: s.probes_in_flight,
        since_transition_ms: s.last_transition.map(|at| millis(at.elapsed())),
        successful: s.totals.successful,
        failed: s.totals.failed,
        rejected: s.totals.rejected,
        opened: s.totals.opened,
        transitions: breaker
            .recent_transitions()
            .into_iter()
            .rev()
            .map(|t| TransitionView {
                from: state_name(t.from),
                to: state_name(t.to),
                cause: cause_name(t.cause),
                ago_ms: millis(t.at.elapsed()),
                calls: t.window.calls,
                failures: t.window.failures,
                open_for_ms: t.open_for.map(millis),
            })
            .collect(),
    }
}

/// A rate as JSON can carry it (NaN and infinities as 0).
fn finite(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

/// Every dependency of a [`LiveView`] at one moment.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ViewSnapshot {
    /// When it was taken, in milliseconds since the Unix epoch.
    pub taken_at_unix_ms: u64,
    /// The dependencies, in the order they were registered.
    pub dependencies: Vec<DependencyView>,
}

/// One dependency: the parts it has.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct DependencyView {
    /// Its name.
    pub name: String,
    /// Its breaker.
    pub breaker: Option<BreakerView>,
    /// Its bulkhead compartment.
    pub bulkhead: Option<BulkheadView>,
    /// Its retries.
    pub retries: Option<RetriesView>,
    /// Its client-side throttle.
    pub throttle: Option<ThrottleView>,
    /// Its fault injection (feature `chaos`).
    #[cfg(feature = "chaos")]
    #[cfg_attr(docsrs, doc(cfg(feature = "chaos")))]
    pub faults: Option<FaultsView>,
}

/// A breaker: `tower_breaker::Snapshot`, flattened.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct BreakerView {
    /// `closed`, `open` or `half_open`.
    pub state: &'static str,
    /// `automatic`, `forced_open`, `forced_closed`, `disabled` or
    /// `metrics_only`.
    pub mode: &'static str,
    /// The window's failure rate (0 to 1).
    pub failure_rate: f64,
    /// The window's slow-call rate (0 to 1).
    pub slow_rate: f64,
    /// Calls in the window.
    pub calls: u64,
    /// Failures in the window.
    pub failures: u64,
    /// Slow calls in the window.
    pub slow: u64,
    /// Calls in flight for longer than the slow-call threshold.
    pub slow_in_flight: u64,
    /// While open: the time until the next probe, in milliseconds.
    pub retry_after_ms: Option<u64>,
    /// Probes in flight (half-open).
    pub probes_in_flight: u32,
    /// The time since the last transition, in milliseconds.
    pub since_transition_ms: Option<u64>,
    /// Successful calls since the breaker was built.
    pub successful: u64,
    /// Failed calls since the breaker was built.
    pub failed: u64,
    /// Calls rejected since the breaker was built.
    pub rejected: u64,
    /// Times the circuit opened.
    pub opened: u64,
    /// The last transitions (at most 10), newest first.
    pub transitions: Vec<TransitionView>,
}

/// One of a breaker's recent transitions: `tower_breaker::Transition`.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct TransitionView {
    /// The state before: `closed`, `open` or `half_open`.
    pub from: &'static str,
    /// The state after.
    pub to: &'static str,
    /// Why: `failure_rate`, `slow_call_rate`, `consecutive_failures`,
    /// `open_period_over`, `probe_failed`, `probe_timed_out`,
    /// `probe_given_back`, `probes_succeeded`, `mode_changed`, `store`.
    pub cause: &'static str,
    /// How long ago, in milliseconds.
    pub ago_ms: u64,
    /// The calls behind it (the window that tripped an opening, the
    /// probes of a transition out of half-open).
    pub calls: u64,
    /// The failures among them.
    pub failures: u64,
    /// For an opening: how long the circuit stays open, in milliseconds.
    pub open_for_ms: Option<u64>,
}

/// A bulkhead compartment: `tower_bulkhead::Stats`.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct BulkheadView {
    /// Calls in flight.
    pub in_flight: usize,
    /// The limit now.
    pub limit: usize,
    /// Whether the limit is adaptive.
    pub adaptive: bool,
    /// Calls rejected (full) since it was built.
    pub rejected: u64,
    /// Calls shed for their criticality since it was built.
    pub shed: u64,
    /// An adaptive limit's recent latency, in milliseconds.
    pub recent_latency_ms: Option<f64>,
    /// An adaptive limit's measured no-load latency, in milliseconds.
    pub no_load_latency_ms: Option<f64>,
}

/// Retries: `tower_retry_budget::Counters`.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct RetriesView {
    /// Requests (first attempts).
    pub requests: u64,
    /// Retries sent.
    pub retries: u64,
    /// Retries the budget refused.
    pub refused_by_budget: u64,
}

/// A throttle: `tower_breaker::throttle::ThrottleSnapshot`.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ThrottleView {
    /// Requests in the window.
    pub requests: u64,
    /// Requests accepted (or in flight) in the window.
    pub accepts: u64,
    /// The probability a `Critical` request is rejected now.
    pub rejection_probability: f64,
    /// Requests rejected since it was built.
    pub rejected: u64,
    /// Whether it rejects a share of some criticality now.
    pub throttling: bool,
}

/// Fault injection (feature `chaos`): `tower_chaos::FaultSnapshot`.
#[cfg(feature = "chaos")]
#[cfg_attr(docsrs, doc(cfg(feature = "chaos")))]
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct FaultsView {
    /// Whether faults are being injected.
    pub on: bool,
    /// Calls that drew faults.
    pub eligible: u64,
    /// Faults injected, by kind.
    pub injected: std::collections::BTreeMap<&'static str, u64>,
}

/// The service of [`LiveView::json_service`].
#[derive(Debug, Clone)]
pub struct JsonService {
    view: LiveView,
}

impl<B> Service<Request<B>> for JsonService {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<B>) -> Self::Future {
        ready(Ok(uncached(self.view.json(), "application/json")))
    }
}

/// The service of [`LiveView::page_service`].
#[derive(Debug, Clone)]
pub struct PageService {
    page: Arc<str>,
}

impl<B> Service<Request<B>> for PageService {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<B>) -> Self::Future {
        ready(Ok(uncached(
            self.page.to_string(),
            "text/html; charset=utf-8",
        )))
    }
}

/// A `200` with `body` of `content_type`, never cached: a view is read
/// live.
fn uncached(body: String, content_type: &'static str) -> Response<String> {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The page: polls the JSON every second, one card per dependency, with a
/// short history of its failure rate.
const PAGE: &str = include_str!("view.html");
