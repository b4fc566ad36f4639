//! Adaptive concurrency limits: a compartment whose limit follows the
//! dependency instead of a number chosen in advance.
//!
//! A fixed limit is either too small for the good days or too large for
//! the bad ones: the right number is the dependency's capacity (its
//! servers times their speed) times its latency, and both change. An
//! adaptive compartment measures what its calls experience and lets a
//! [`LimitAlgorithm`] move the limit: up while calls come back as fast as
//! without load, down when they queue (latency rises) or are cut
//! (congestion signals). Build one with
//! [`BulkheadLayer::adaptive`](crate::BulkheadLayer::adaptive) (or
//! [`HttpBulkheadLayer::adaptive`](crate::HttpBulkheadLayer::adaptive));
//! everything else (refusing at once with
//! [`BulkheadFull`](crate::error::BulkheadFull) or a 503, keys, bounded
//! waits, body mode, criticality shedding) is the same as for a fixed
//! limit.
//!
//! ```
//! use tower_bulkhead::adaptive::Gradient;
//! use tower_bulkhead::BulkheadLayer;
//!
//! let layer = BulkheadLayer::adaptive("inventory", Gradient::new());
//! let handle = layer.handle();
//! assert_eq!(handle.limit(), 20); // the initial limit, until it learns
//! assert!(handle.stats().is_adaptive());
//! ```
//!
//! # The signals
//!
//! Every call that ends gives one of three signals:
//!
//! - **a sample**: the call completed (a response, or for HTTP a response
//!   that is not a 503 or 504): its latency, from the slot being taken to
//!   the slot being given back (in body mode, the end of the body), and
//!   the calls in flight as it ends. Only one call in
//!   [`SAMPLE_EVERY`] is timed (plus every call while a window has fewer
//!   than [`MIN_SAMPLES`] samples), so most calls never read the clock.
//! - **congestion**: the caller dropped the call before it completed
//!   (its deadline, a `tokio::time::timeout`, a hedge that won: the
//!   dependency was too slow for it), the call failed with the base
//!   crate's `DeadlineExceeded`, a `tokio` timeout's `Elapsed` or an
//!   `io::Error` of kind `TimedOut` anywhere in its error chain, or (HTTP)
//!   the response was a `503` or `504`, or a gRPC `DEADLINE_EXCEEDED` or
//!   `RESOURCE_EXHAUSTED`. A deadline cut is the congestion that matters:
//!   an algorithm that ignores it never sees the overload its callers see.
//!   A timed call that is cut is also a latency sample (its latency, when
//!   it was cut, is a lower bound), counted in
//!   [`Window::congested_samples`], so that the share of calls cut can be
//!   told from the cuts a dependency causes even without load (a deadline
//!   close to its service time).
//! - **nothing**: the call failed otherwise (a fast failure says nothing
//!   about load); in the HTTP server flavour, an error of the inner
//!   service.
//!
//! # Windows
//!
//! Signals are added up in a few atomics of the compartment (no lock, no
//! allocation), and the call that closes a *window* runs the algorithm
//! once, under a try-lock (a call that finds it taken goes on). A window
//! lasts at least [`MIN_WINDOW`] and twice the recent mean latency, at
//! most [`MAX_WINDOW`], and closes with at least [`MIN_SAMPLES`] timed
//! calls and congestion signals together (or, at [`MAX_WINDOW`], with
//! whatever it has), so that one window's figures are not one call's. So a 1 ms dependency gets a new limit about every 10 ms and a 1 s
//! dependency every 2 s, with no setting to tune.
//!
//! # The algorithms
//!
//! - [`Aimd`]: additive increase (one per window while the compartment is
//!   at least half used), multiplicative decrease (×0.9 on congestion or
//!   a call slower than its timeout). Simple and robust; it needs
//!   congestion to find the top, so it keeps a little queue at the
//!   dependency. Defaults as Netflix's: 20 initially, `[1, 1000]`.
//! - [`Gradient`]: compares the recent latency with the no-load latency it
//!   measures (and re-measures every minute, as Envoy does) and shrinks
//!   the limit as soon as calls start to queue, before anything times
//!   out; a headroom of `sqrt(limit)` keeps probing upwards. The one to
//!   use when the dependency's latency tells its load.
//! - your own: implement [`LimitAlgorithm`].
//!
//! The limit stays within the algorithm's bounds. When it shrinks below
//! the calls in flight, no call is cut: new calls are refused until enough
//! have ended.
//!
//! # Observability
//!
//! [`Stats::limit`](crate::Stats::limit) is the current limit,
//! [`Stats::recent_latency`](crate::Stats::recent_latency) the mean
//! latency of the last window and
//! [`Stats::no_load_latency`](crate::Stats::no_load_latency) the
//! algorithm's no-load latency (if it has one). Every change of limit is a
//! `DEBUG` event (target `tower_bulkhead::adaptive`, at most one per
//! compartment per second, with the changes `suppressed` in between) and,
//! with the `metrics` feature, the gauge `tower_bulkhead_limit`.

mod aimd;
pub(crate) mod controller;
mod gradient;

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

pub use aimd::Aimd;
pub use controller::{MAX_WINDOW, MIN_SAMPLES, MIN_WINDOW, SAMPLE_EVERY};
pub use gradient::Gradient;

/// A rule that moves a compartment's limit from what its calls
/// experienced: implement it to plug your own algorithm into
/// [`BulkheadLayer::adaptive`](crate::BulkheadLayer::adaptive).
///
/// The compartment adds the signals of its calls up per [`Window`] and
/// calls [`update`](Self::update) once per closed window, from the call
/// that closed it, never from two calls at once (so `&mut self` needs no
/// lock of yours), and clamps the answer into
/// `[min_limit, max_limit]`. `update` runs on a request's path: keep it
/// short, never block.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_bulkhead::adaptive::{LimitAlgorithm, Window};
/// use tower_bulkhead::BulkheadLayer;
///
/// /// Halve on congestion or when calls take over 100 ms, else grow by 2.
/// #[derive(Debug, Clone)]
/// struct Halving;
///
/// impl LimitAlgorithm for Halving {
///     fn initial_limit(&self) -> usize { 10 }
///     fn min_limit(&self) -> usize { 2 }
///     fn max_limit(&self) -> usize { 100 }
///     fn update(&mut self, limit: usize, window: &Window) -> usize {
///         let slow = window.mean_latency().is_some_and(|l| l > Duration::from_millis(100));
///         if window.congestion() > 0 || slow { limit / 2 } else { limit + 2 }
///     }
/// }
///
/// let layer = BulkheadLayer::adaptive("search", Halving);
/// assert_eq!(layer.handle().limit(), 10);
/// ```
pub trait LimitAlgorithm: Send + Sync + 'static {
    /// The limit until the first window closes.
    fn initial_limit(&self) -> usize;

    /// The lowest limit; the compartment never goes below it (nor below
    /// one).
    fn min_limit(&self) -> usize;

    /// The highest limit; the compartment never goes above it.
    fn max_limit(&self) -> usize;

    /// The new limit, from the current `limit` and what the calls of the
    /// closed `window` experienced. The compartment clamps it into
    /// `[min_limit, max_limit]`.
    fn update(&mut self, limit: usize, window: &Window) -> usize;

    /// The latency the algorithm believes the dependency has without load,
    /// if it measures one; shown by
    /// [`Stats::no_load_latency`](crate::Stats::no_load_latency). By
    /// default `None`.
    fn no_load_latency(&self) -> Option<Duration> {
        None
    }
}

/// What the calls of one window experienced: the timed calls that
/// completed (their latencies and the calls in flight when they started)
/// and the congestion signals. See the [module docs](self) for which call
/// gives which signal.
///
/// Build one with [`new`](Self::new), [`with_sample`](Self::with_sample)
/// and [`with_congestion`](Self::with_congestion) to test an algorithm on
/// a recorded trace.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_bulkhead::adaptive::Window;
/// use tokio::time::Instant;
///
/// let window = Window::new(Instant::now(), Duration::from_millis(20))
///     .with_sample(Duration::from_millis(4), 3)
///     .with_sample(Duration::from_millis(8), 5)
///     .with_congestion(1);
/// assert_eq!(window.samples(), 2);
/// assert_eq!(window.mean_latency(), Some(Duration::from_millis(6)));
/// assert_eq!(window.min_latency(), Some(Duration::from_millis(4)));
/// assert_eq!(window.max_in_flight(), 5);
/// assert_eq!(window.congestion(), 1);
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Window {
    now: Instant,
    duration: Duration,
    samples: u64,
    latency_sum: Duration,
    min_latency: Option<Duration>,
    max_latency: Option<Duration>,
    max_in_flight: usize,
    congestion: u64,
    congested_samples: u64,
}

// === impl Window ===

impl Window {
    /// An empty window that closes at `now` after lasting `duration`.
    #[must_use]
    pub const fn new(now: Instant, duration: Duration) -> Self {
        Self {
            now,
            duration,
            samples: 0,
            latency_sum: Duration::ZERO,
            min_latency: None,
            max_latency: None,
            max_in_flight: 0,
            congestion: 0,
            congested_samples: 0,
        }
    }

    /// This window with one more timed call that completed after
    /// `latency`, with `in_flight` calls in flight (itself included) when
    /// it ended (what the bulkhead records: the count at the release).
    #[must_use]
    pub fn with_sample(mut self, latency: Duration, in_flight: usize) -> Self {
        self.samples += 1;
        self.latency_sum = self.latency_sum.saturating_add(latency);
        self.min_latency = Some(self.min_latency.map_or(latency, |m| m.min(latency)));
        self.max_latency = Some(self.max_latency.map_or(latency, |m| m.max(latency)));
        self.max_in_flight = self.max_in_flight.max(in_flight);
        self
    }

    /// This window with one more timed call that was cut (dropped by its
    /// caller, timed out) after `latency`: a sample whose latency is a
    /// lower bound, and a congestion signal.
    #[must_use]
    pub fn with_congested_sample(self, latency: Duration, in_flight: usize) -> Self {
        let mut window = self.with_sample(latency, in_flight).with_congestion(1);
        window.congested_samples += 1;
        window
    }

    /// This window with `signals` more congestion signals.
    #[must_use]
    pub const fn with_congestion(mut self, signals: u64) -> Self {
        self.congestion = self.congestion.saturating_add(signals);
        self
    }

    /// Built by the compartment from its atomics.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_parts(
        now: Instant,
        duration: Duration,
        samples: u64,
        latency_sum: Duration,
        min_latency: Option<Duration>,
        max_latency: Option<Duration>,
        max_in_flight: usize,
        congestion: u64,
        congested_samples: u64,
    ) -> Self {
        Self {
            now,
            duration,
            samples,
            latency_sum,
            min_latency,
            max_latency,
            max_in_flight,
            congestion,
            congested_samples,
        }
    }

    /// When the window closed.
    #[must_use]
    pub const fn now(&self) -> Instant {
        self.now
    }

    /// How long the window lasted.
    #[must_use]
    pub const fn duration(&self) -> Duration {
        self.duration
    }

    /// The timed calls that ended in it: completed, or cut (see
    /// [`congested_samples`](Self::congested_samples)).
    #[must_use]
    pub const fn samples(&self) -> u64 {
        self.samples
    }

    /// Of the [`samples`](Self::samples), those cut by their caller or a
    /// timeout (their latency is when they were cut). Calls are chosen
    /// for timing when they start, whatever their end, so
    /// `congested_samples / samples` estimates the share of all calls that
    /// were cut.
    #[must_use]
    pub const fn congested_samples(&self) -> u64 {
        self.congested_samples
    }

    /// The mean latency of its timed calls, if any.
    #[must_use]
    pub fn mean_latency(&self) -> Option<Duration> {
        let n = u32::try_from(self.samples).unwrap_or(u32::MAX);
        (n > 0).then(|| self.latency_sum / n)
    }

    /// The lowest latency of its timed calls, if any.
    #[must_use]
    pub const fn min_latency(&self) -> Option<Duration> {
        self.min_latency
    }

    /// The highest latency of its timed calls, if any.
    #[must_use]
    pub const fn max_latency(&self) -> Option<Duration> {
        self.max_latency
    }

    /// The most calls in flight seen by a timed call as it ended (itself
    /// included): how much of the limit was used.
    #[must_use]
    pub const fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// Its congestion signals, timed calls or not: calls dropped by their
    /// callers, cut by a deadline or a timeout, or answered 503/504.
    #[must_use]
    pub const fn congestion(&self) -> u64 {
        self.congestion
    }
}

impl fmt::Debug for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Window")
            .field("duration", &self.duration)
            .field("samples", &self.samples)
            .field("mean_latency", &self.mean_latency())
            .field("min_latency", &self.min_latency)
            .field("max_latency", &self.max_latency)
            .field("max_in_flight", &self.max_in_flight)
            .field("congestion", &self.congestion)
            .field("congested_samples", &self.congested_samples)
            .finish()
    }
}
