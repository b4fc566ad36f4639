//! What a breaker can tell about itself: snapshots, totals and transition
//! events for listeners.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Mode, State};

/// A consistent-enough picture of a breaker at one moment, from
/// [`Breaker::snapshot`](crate::Breaker::snapshot).
///
/// Each figure is read with one atomic load, so figures taken while calls
/// complete may disagree by the calls in flight. The same holds across a
/// transition: the state changes first (one compare-and-swap of the state
/// word) and its count in [`totals`](Self::totals) follows, so a snapshot
/// taken on another thread at that instant can show
/// [`State::Open`] with `totals.opened` not yet
/// bumped. A caller that compares counts across a transition waits for
/// the count itself, not only for the state.
///
/// # Example
///
/// ```
/// use tower_breaker::{Breaker, Outcome, State};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let breaker = Breaker::new("inventory");
/// breaker.try_acquire().unwrap().record(Outcome::Success);
/// breaker.try_acquire().unwrap().record(Outcome::Failure);
///
/// let snapshot = breaker.snapshot();
/// assert_eq!(snapshot.state, State::Closed);
/// assert_eq!(snapshot.window.calls, 2);
/// assert_eq!(snapshot.window.failures, 1);
/// assert_eq!(snapshot.failure_rate, 0.5);
/// assert_eq!(snapshot.totals.failed, 1);
/// assert_eq!(snapshot.totals.rejected, 0);
/// # }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Snapshot {
    /// The breaker's name.
    pub name: Arc<str>,
    /// The automatic state. An open circuit whose period is over still
    /// reads [`State::Open`] until the next call moves it to
    /// [`State::HalfOpen`] (there is no background task);
    /// [`retry_after`](Self::retry_after) is then zero.
    pub state: State,
    /// The manual mode.
    pub mode: Mode,
    /// The counts of the current window (while open or half-open, of the
    /// last closed window).
    pub window: WindowCounts,
    /// `window.failures / window.calls`, or zero for an empty window.
    pub failure_rate: f64,
    /// `window.slow / window.calls`, or zero for an empty window.
    pub slow_rate: f64,
    /// Failures in a row since the last success of the current closed
    /// period (tracked only when the consecutive-failures rule is on).
    pub consecutive_failures: u64,
    /// While open: the time until the next probe may be sent. While
    /// half-open: zero when a probe slot is free, else what a refused
    /// caller is told (about when the probe in flight should finish; see
    /// [`BreakerConfig::max_half_open_wait`](crate::BreakerConfig::max_half_open_wait)).
    /// Otherwise `None`.
    pub retry_after: Option<Duration>,
    /// Probes in flight (half-open only).
    pub probes_in_flight: u32,
    /// When the state or mode last changed, if it ever did.
    pub last_transition: Option<Instant>,
    /// Totals since the breaker was created.
    pub totals: Totals,
}

/// The calls a window holds.
///
/// # Example
///
/// ```
/// let counts = tower_breaker::Breaker::new("x").snapshot().window;
/// assert_eq!(counts.calls, 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct WindowCounts {
    /// Outcomes counted (successes, failures and slow successes).
    pub calls: u64,
    /// Failures among them.
    pub failures: u64,
    /// Slow successes among them.
    pub slow: u64,
    /// Calls still in flight that have been for longer than the slow-call
    /// threshold (closed state, slow-call detection on): not in `calls`,
    /// but weighed as slow calls by every judgement of the window until
    /// they end, when they are counted in it once, as what they turn out
    /// to be.
    pub slow_in_flight: u64,
}

/// Totals since the breaker was created, in the spirit of "calls, successes,
/// failures, rejected, times opened".
///
/// Rejected calls are their own figure: a breaker that works *raises* the
/// error rate callers see while lowering their latency, and those errors
/// are not failures of the dependency.
///
/// # Example
///
/// ```
/// let totals = tower_breaker::Breaker::new("x").snapshot().totals;
/// assert_eq!(totals.calls(), 0);
/// assert_eq!(totals.opened, 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Totals {
    /// Calls that completed and counted as successes (slow ones included).
    /// Outcomes discarded as [`stale`](Self::stale) are not here.
    pub successful: u64,
    /// Calls that completed and counted as failures (not the
    /// [`stale`](Self::stale) ones).
    pub failed: u64,
    /// Successes slower than the slow-call threshold.
    pub slow: u64,
    /// Calls whose outcome was not counted: classified as ignored (a
    /// bulkhead rejection, say) or cancelled by the caller.
    pub ignored: u64,
    /// Calls rejected without calling the inner service.
    pub rejected: u64,
    /// Outcomes discarded because the circuit changed state while the
    /// call was in flight: counted here only, not as successful, failed,
    /// slow or ignored.
    pub stale: u64,
    /// Calls that metrics-only mode let through although the breaker would
    /// have rejected them.
    pub passed_in_metrics_only: u64,
    /// Times the circuit opened.
    pub opened: u64,
    /// Times a shared store failed and the breaker kept its local decision.
    pub store_errors: u64,
}

// === impl Totals ===

impl Totals {
    /// Calls whose outcome was counted: `successful + failed`.
    #[must_use]
    pub fn calls(&self) -> u64 {
        self.successful + self.failed
    }
}

/// A change of state, told to a [`Listener`].
///
/// # Example
///
/// ```
/// use tower_breaker::{Breaker, BreakerConfig, Mode, State, Transition};
///
/// let config = BreakerConfig::new().listener(|t: &Transition| {
///     if t.to == State::Open {
///         eprintln!("{} opened after {} failures", t.name, t.window.failures);
///     }
/// });
/// let breaker = Breaker::with_config("search", config);
/// breaker.set_mode(Mode::ForcedOpen);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Transition {
    /// The breaker's name.
    pub name: Arc<str>,
    /// The state before.
    pub from: State,
    /// The state after.
    pub to: State,
    /// The mode after (a mode change is a transition too).
    pub mode: Mode,
    /// Why it happened.
    pub cause: Cause,
    /// The counts behind the transition: for an opening from closed, the
    /// window that tripped it; for an opening adopted from a shared store
    /// ([`Cause::Store`]), this process's own window at that moment; for a
    /// transition out of half-open, the probes' outcomes (the successes so
    /// far, plus the failed or slow probe); zero otherwise.
    pub window: WindowCounts,
    /// For an opening: how long the circuit stays open.
    pub open_for: Option<Duration>,
    /// When it happened.
    pub at: Instant,
}

/// Why a [`Transition`] happened.
///
/// # Example
///
/// ```
/// use tower_breaker::snapshot::Cause;
///
/// assert_ne!(Cause::FailureRate, Cause::SlowCallRate);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cause {
    /// The failure rate reached its threshold.
    FailureRate,
    /// The slow-call rate reached its threshold.
    SlowCallRate,
    /// Enough failures in a row.
    ConsecutiveFailures,
    /// The open period ended: probing.
    OpenPeriodOver,
    /// A probe failed (or was slow).
    ProbeFailed,
    /// No probe completed within the maximum half-open wait.
    ProbeTimedOut,
    /// This process won the fleet's probe election and made no call to
    /// probe with (a quiet process, a caller that gave up while it waited
    /// for the election): it gave the probe back to the fleet
    /// (half-open -> open).
    ProbeGivenBack,
    /// Enough probes succeeded.
    ProbesSucceeded,
    /// The mode was changed by hand.
    ModeChanged,
    /// The shared store said so (another process opened, closed or won the
    /// probe election).
    Store,
}

/// Told about every transition of a breaker: for alarms and dashboards.
///
/// It is called synchronously by the call that caused the transition, on
/// that call's thread, after the transition and its `tracing` event: keep
/// it short and never block in it. It may read the breaker
/// ([`Breaker::snapshot`](crate::Breaker::snapshot) takes no lock).
/// Closures `Fn(&Transition)` are listeners.
///
/// The trait is object safe and is used as `Arc<dyn Listener>`.
///
/// # Example
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use std::sync::Arc;
/// use tower_breaker::{State, Transition};
/// use tower_breaker::snapshot::Listener;
///
/// #[derive(Debug, Default)]
/// struct OpenAlarm(AtomicU32);
///
/// impl Listener for OpenAlarm {
///     fn on_transition(&self, t: &Transition) {
///         if t.to == State::Open {
///             self.0.fetch_add(1, Ordering::Relaxed);
///         }
///     }
/// }
///
/// let alarm = Arc::new(OpenAlarm::default());
/// let config = tower_breaker::BreakerConfig::new().listener(alarm.clone());
/// # let _ = config;
/// ```
pub trait Listener: Send + Sync + 'static {
    /// Called once per transition.
    fn on_transition(&self, transition: &Transition);
}

impl<F> Listener for F
where
    F: Fn(&Transition) + Send + Sync + 'static,
{
    fn on_transition(&self, transition: &Transition) {
        self(transition);
    }
}

impl<L: Listener + ?Sized> Listener for Arc<L> {
    fn on_transition(&self, transition: &Transition) {
        (**self).on_transition(transition);
    }
}

pub(crate) struct DebugListener<'a>(pub(crate) &'a Option<Arc<dyn Listener>>);

impl fmt::Debug for DebugListener<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() { "Some(..)" } else { "None" })
    }
}
