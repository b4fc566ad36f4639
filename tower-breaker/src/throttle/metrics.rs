//! What a throttle records through the [`metrics`](https://docs.rs/metrics)
//! facade (feature `metrics`).
//!
//! Every metric carries the label `throttle`, the throttle's name; the
//! label `criticality` takes the four names of
//! [`Criticality`]
//! (`critical-plus`, `critical`, `sheddable-plus`, `sheddable`).
//!
//! | Name | Type | Unit | Labels | What |
//! |------|------|------|--------|------|
//! | `tower_breaker_throttle_requests_total` | counter | requests | `throttle` | requests that reached the throttle, rejected ones included |
//! | `tower_breaker_throttle_accepts_total` | counter | requests | `throttle` | requests the dependency accepted |
//! | `tower_breaker_throttle_rejections_total` | counter | requests | `throttle`, `criticality` | requests rejected locally |
//! | `tower_breaker_throttle_rejection_probability` | gauge | probability | `throttle` | the rejection probability of `Critical` requests, set each time the window moves on (a sixtieth of the window) and when throttling starts or stops |
//!
//! The handles are registered with the recorder installed when the
//! throttle is built, as the breaker's are.
//!
//! # Example
//!
//! ```
//! use metrics_util::debugging::DebuggingRecorder;
//! use tower_breaker::throttle::{metrics, ThrottleHandle};
//! use tower_resilience_base::criticality::Criticality;
//!
//! let recorder = DebuggingRecorder::new();
//! let snapshotter = recorder.snapshotter();
//! ::metrics::with_local_recorder(&recorder, || {
//!     let throttle = ThrottleHandle::new("search");
//!     let _ = throttle.try_acquire(Criticality::Critical);
//! });
//! let names: Vec<String> = snapshotter
//!     .snapshot()
//!     .into_vec()
//!     .into_iter()
//!     .map(|(key, ..)| key.key().name().to_owned())
//!     .collect();
//! assert!(names.iter().any(|n| n == metrics::REQUESTS));
//! ```

use ::metrics::{counter, gauge, Counter, Gauge};
use tower_resilience_base::criticality::Criticality;

/// Counter of requests that reached the throttle.
pub const REQUESTS: &str = "tower_breaker_throttle_requests_total";
/// Counter of requests the dependency accepted.
pub const ACCEPTS: &str = "tower_breaker_throttle_accepts_total";
/// Counter of requests rejected locally, by `criticality`.
pub const REJECTIONS: &str = "tower_breaker_throttle_rejections_total";
/// Gauge of `Critical` requests' rejection probability.
pub const PROBABILITY: &str = "tower_breaker_throttle_rejection_probability";

/// The handles of one throttle, registered once.
pub(crate) struct ThrottleMetrics {
    requests: Counter,
    accepts: Counter,
    rejections: [Counter; 4],
    probability: Gauge,
}

// === impl ThrottleMetrics ===

impl ThrottleMetrics {
    pub(crate) fn new(name: &str) -> Self {
        Self {
            requests: counter!(REQUESTS, "throttle" => name.to_owned()),
            accepts: counter!(ACCEPTS, "throttle" => name.to_owned()),
            rejections: Criticality::ALL.map(|c| {
                counter!(REJECTIONS, "throttle" => name.to_owned(), "criticality" => c.as_str())
            }),
            probability: gauge!(PROBABILITY, "throttle" => name.to_owned()),
        }
    }

    #[inline]
    pub(crate) fn request(&self) {
        self.requests.increment(1);
    }

    #[inline]
    pub(crate) fn accept(&self) {
        self.accepts.increment(1);
    }

    pub(crate) fn rejected(&self, criticality: Criticality) {
        self.rejections[criticality.index()].increment(1);
    }

    pub(crate) fn probability(&self, p: f64) {
        self.probability.set(p);
    }
}
