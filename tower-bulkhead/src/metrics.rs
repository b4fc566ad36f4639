//! What a bulkhead records through the [`metrics`](https://docs.rs/metrics)
//! facade (feature `metrics`).
//!
//! Every metric carries the label `compartment`, the name given to the
//! layer ([`BulkheadLayer::new`](crate::BulkheadLayer::new)). The
//! compartments of a keyed bulkhead
//! ([`BulkheadLayer::per_key`](crate::BulkheadLayer::per_key)) all record
//! under the layer's name, so keys (hosts, tenants: not chosen by you)
//! never become label values; its fallback compartment records under
//! `NAME/fallback`.
//!
//! | Name | Type | Unit | Labels | What |
//! |------|------|------|--------|------|
//! | `tower_bulkhead_in_flight` | gauge | calls | `compartment` | calls holding a slot now (summed over the keys of a keyed bulkhead) |
//! | `tower_bulkhead_rejections_total` | counter | calls | `compartment` | calls refused because the compartment was full (at once, or after the bounded wait) or over their criticality's share |
//! | `tower_bulkhead_limit` | gauge | calls | `compartment` | the compartment's limit: set when it is created, at every change of an adaptive limit (for a keyed bulkhead, the last key's to change) and by `CompartmentHandle::set_limit` |
//!
//! # Registration
//!
//! The handles are registered with the recorder installed when the
//! compartment is created (when the layer is built; for a keyed bulkhead,
//! its first use of a key gets the layer's handles) and kept in it, so no
//! call looks a metric up: install the recorder before building layers.
//!
//! # Example
//!
//! ```
//! use metrics_util::debugging::{DebugValue, DebuggingRecorder};
//! use tower_bulkhead::{metrics, BulkheadLayer};
//!
//! let recorder = DebuggingRecorder::new();
//! let snapshotter = recorder.snapshotter();
//! let layer = ::metrics::with_local_recorder(&recorder, || BulkheadLayer::new("search", 8));
//! # let _ = layer;
//! let in_flight = snapshotter
//!     .snapshot()
//!     .into_vec()
//!     .into_iter()
//!     .find(|(key, ..)| key.key().name() == metrics::IN_FLIGHT)
//!     .map(|(.., value)| value);
//! assert_eq!(in_flight, Some(DebugValue::Gauge(0.0.into())));
//! ```

use ::metrics::{counter, gauge, Counter, Gauge};

/// Gauge of the calls holding a slot.
pub const IN_FLIGHT: &str = "tower_bulkhead_in_flight";
/// Counter of calls refused because the compartment was full.
pub const REJECTIONS: &str = "tower_bulkhead_rejections_total";
/// Gauge of the compartment's limit: set when it is created and at every
/// change of an adaptive limit.
pub const LIMIT: &str = "tower_bulkhead_limit";

/// The handles of one compartment (or of every key of a keyed bulkhead).
#[derive(Clone)]
pub(crate) struct CompartmentMetrics {
    in_flight: Gauge,
    rejected: Counter,
    limit: Gauge,
}

// === impl CompartmentMetrics ===

impl CompartmentMetrics {
    pub(crate) fn new(name: &str) -> Self {
        // Registered, not set: another layer of the same name may have
        // calls in flight.
        Self {
            in_flight: gauge!(IN_FLIGHT, "compartment" => name.to_owned()),
            rejected: counter!(REJECTIONS, "compartment" => name.to_owned()),
            limit: gauge!(LIMIT, "compartment" => name.to_owned()),
        }
    }

    #[inline]
    pub(crate) fn taken(&self) {
        self.in_flight.increment(1.0);
    }

    #[inline]
    pub(crate) fn released(&self) {
        self.in_flight.decrement(1.0);
    }

    pub(crate) fn rejected(&self) {
        self.rejected.increment(1);
    }

    pub(crate) fn limit(&self, limit: usize) {
        self.limit.set(limit as f64);
    }
}
