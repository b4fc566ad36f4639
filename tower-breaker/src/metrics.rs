//! What a breaker records through the [`metrics`](https://docs.rs/metrics)
//! facade (feature `metrics`).
//!
//! Every metric carries the label `breaker`, the name the breaker was built
//! with ([`Breaker::new`](crate::Breaker::new)); the other labels take only
//! the values listed here, so the number of series is bounded by the
//! number of breakers you name. A keyed breaker's breakers are named by
//! their key ([`KeyedBreakerLayer`](crate::KeyedBreakerLayer)), so their
//! series are bounded by its registry's size.
//!
//! | Name | Type | Unit | Labels | What |
//! |------|------|------|--------|------|
//! | `tower_breaker_calls_total` | counter | calls | `breaker`, `outcome` | admitted calls by the outcome counted: `success`, `failure`, `slow` (a success slower than the slow-call threshold; not also counted as `success`), `ignored` (classified as not the dependency's fault, or cancelled: dropped before an outcome), `stale` (completed after the circuit moved on, so not counted in any window) |
//! | `tower_breaker_rejections_total` | counter | calls | `breaker` | calls refused without calling the inner service (open, forced open, half-open with every probe slot taken, ramping up, or a retry refused before its backoff) |
//! | `tower_breaker_state` | gauge | state code | `breaker` | `0` closed, `1` open (including the election of a fleet's prober), `2` half-open, `3` forced open, `4` forced closed, `5` disabled; metrics-only mode shows the automatic state it tracks |
//! | `tower_breaker_transitions_total` | counter | transitions | `breaker`, `from`, `to` | state changes; `from` and `to` are `closed`, `open`, `half_open`, `forced_open`, `forced_closed` or `disabled` (as the gauge). A [`Breaker::set_mode`](crate::Breaker::set_mode) counts even when the state stays (it resets the circuit) |
//! | `tower_breaker_probes_total` | counter | probes | `breaker`, `result` | half-open probes by result: `success`, `failure` (failed or slow), `ignored` (not counted: ignored, dropped, or completed after the circuit moved on), `timed_out` (never completed within the maximum half-open wait) |
//! | `tower_breaker_store_errors_total` | counter | errors | `breaker` | failed or timed-out calls to the shared store (with a store only) |
//!
//! Calls let through by [`Mode::MetricsOnly`] or
//! [`Mode::Disabled`] are not counted in
//! `tower_breaker_calls_total` (they are not counted in the window
//! either); see [`Totals`](crate::snapshot::Totals) for them.
//!
//! # Registration
//!
//! The handles are registered with the recorder installed when the breaker
//! is built ([`Breaker::with_config`](crate::Breaker::with_config)) and
//! kept next to the breaker's own figures, so no call looks a metric up:
//! install the recorder (the exporter) before building breakers. A breaker
//! built before that records into nothing. Transitions are rare and look
//! their counter up when they happen.
//!
//! # Example
//!
//! ```
//! use metrics_util::debugging::DebuggingRecorder;
//! use tower_breaker::{metrics, Breaker, BreakerConfig, Outcome};
//!
//! let recorder = DebuggingRecorder::new();
//! let snapshotter = recorder.snapshotter();
//! ::metrics::with_local_recorder(&recorder, || {
//!     # let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
//!     # let _guard = runtime.enter();
//!     let breaker = Breaker::with_config("billing", BreakerConfig::new().count_window(2).minimum_calls(2));
//!     breaker.try_acquire().unwrap().record(Outcome::Failure);
//!     breaker.try_acquire().unwrap().record(Outcome::Failure);
//!     assert!(breaker.try_acquire().is_err());
//! });
//! let names: Vec<String> = snapshotter
//!     .snapshot()
//!     .into_vec()
//!     .into_iter()
//!     .map(|(key, ..)| key.key().name().to_owned())
//!     .collect();
//! assert!(names.iter().any(|n| n == metrics::CALLS));
//! assert!(names.iter().any(|n| n == metrics::REJECTIONS));
//! assert!(names.iter().any(|n| n == metrics::TRANSITIONS));
//! ```

use ::metrics::{counter, gauge, Counter, Gauge};

use crate::Mode;

/// Counter of admitted calls, by `outcome`.
pub const CALLS: &str = "tower_breaker_calls_total";
/// Counter of calls refused without calling the inner service.
pub const REJECTIONS: &str = "tower_breaker_rejections_total";
/// Gauge of the state: 0 closed, 1 open, 2 half-open, 3 forced open, 4
/// forced closed, 5 disabled.
pub const STATE: &str = "tower_breaker_state";
/// Counter of state changes, by `from` and `to`.
pub const TRANSITIONS: &str = "tower_breaker_transitions_total";
/// Counter of half-open probes, by `result`.
pub const PROBES: &str = "tower_breaker_probes_total";
/// Counter of failed shared-store calls.
pub const STORE_ERRORS: &str = "tower_breaker_store_errors_total";

/// The handles of one breaker, registered once.
pub(crate) struct BreakerMetrics {
    name: String,
    success: Counter,
    failure: Counter,
    slow: Counter,
    ignored: Counter,
    stale: Counter,
    rejected: Counter,
    state: Gauge,
    probe_success: Counter,
    probe_failure: Counter,
    probe_ignored: Counter,
    probe_timed_out: Counter,
    store_errors: Counter,
}

// === impl BreakerMetrics ===

impl BreakerMetrics {
    pub(crate) fn new(name: &str) -> Self {
        let calls = |outcome: &'static str| counter!(CALLS, "breaker" => name.to_owned(), "outcome" => outcome);
        let probes = |result: &'static str| counter!(PROBES, "breaker" => name.to_owned(), "result" => result);
        let state = gauge!(STATE, "breaker" => name.to_owned());
        state.set(0.0);
        Self {
            name: name.to_owned(),
            success: calls("success"),
            failure: calls("failure"),
            slow: calls("slow"),
            ignored: calls("ignored"),
            stale: calls("stale"),
            rejected: counter!(REJECTIONS, "breaker" => name.to_owned()),
            state,
            probe_success: probes("success"),
            probe_failure: probes("failure"),
            probe_ignored: probes("ignored"),
            probe_timed_out: probes("timed_out"),
            store_errors: counter!(STORE_ERRORS, "breaker" => name.to_owned()),
        }
    }

    #[inline]
    pub(crate) fn success(&self) {
        self.success.increment(1);
    }

    #[inline]
    pub(crate) fn failure(&self) {
        self.failure.increment(1);
    }

    #[inline]
    pub(crate) fn slow(&self) {
        self.slow.increment(1);
    }

    #[inline]
    pub(crate) fn ignored(&self) {
        self.ignored.increment(1);
    }

    #[inline]
    pub(crate) fn stale(&self) {
        self.stale.increment(1);
    }

    #[inline]
    pub(crate) fn rejected(&self) {
        self.rejected.increment(1);
    }

    pub(crate) fn probe(&self, result: ProbeResult) {
        match result {
            ProbeResult::Success => &self.probe_success,
            ProbeResult::Failure => &self.probe_failure,
            ProbeResult::Ignored => &self.probe_ignored,
            ProbeResult::TimedOut => &self.probe_timed_out,
        }
        .increment(1);
    }

    pub(crate) fn store_error(&self) {
        self.store_errors.increment(1);
    }

    /// A transition between two (public state, mode) pairs: sets the gauge
    /// and counts the change.
    pub(crate) fn transition(&self, from: (crate::State, Mode), to: (crate::State, Mode)) {
        let (from, to) = (state_code(from.0, from.1), state_code(to.0, to.1));
        self.state.set(to as f64);
        counter!(
            TRANSITIONS,
            "breaker" => self.name.clone(),
            "from" => code_label(from),
            "to" => code_label(to)
        )
        .increment(1);
    }
}

/// The result of a half-open probe, as counted.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ProbeResult {
    Success,
    Failure,
    Ignored,
    TimedOut,
}

fn state_code(state: crate::State, mode: Mode) -> u64 {
    match mode {
        Mode::ForcedOpen => 3,
        Mode::ForcedClosed => 4,
        Mode::Disabled => 5,
        Mode::Automatic | Mode::MetricsOnly => match state {
            crate::State::Closed => 0,
            crate::State::Open => 1,
            crate::State::HalfOpen => 2,
        },
    }
}

fn code_label(code: u64) -> &'static str {
    match code {
        0 => "closed",
        1 => "open",
        2 => "half_open",
        3 => "forced_open",
        4 => "forced_closed",
        _ => "disabled",
    }
}
