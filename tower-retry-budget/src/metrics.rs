//! What the retry and hedging layers record through the
//! [`metrics`](https://docs.rs/metrics) facade (feature `metrics`).
//!
//! Every metric carries the label `dependency`: the name given with
//! [`RetryLayer::name`](crate::RetryLayer::name) or
//! [`HedgeLayer::name`](crate::hedge::HedgeLayer::name), `default` when
//! none was given. Name each layer after the dependency it calls, so the
//! number of series is bounded by the names you choose.
//!
//! | Name | Type | Unit | Labels | What |
//! |------|------|------|--------|------|
//! | `tower_retry_retries_total` | counter | attempts | `dependency` | retries sent: attempts beyond the first |
//! | `tower_retry_budget_refusals_total` | counter | attempts | `dependency`, `kind` | retries (`kind="retry"`) or hedges (`kind="hedge"`) the retry budget refused |
//! | `tower_retry_do_not_retry_total` | counter | calls | `dependency` | retryable failures not retried because a tier below had already spent the retries (they carried the do-not-retry mark) |
//! | `tower_retry_hedges_total` | counter | attempts | `dependency` | hedged attempts sent |
//! | `tower_retry_hedges_won_total` | counter | attempts | `dependency` | hedged attempts whose answer was the one returned |
//!
//! # Registration
//!
//! The handles are registered with the recorder installed when the layer
//! wraps a service ([`Layer::layer`](tower_layer::Layer::layer)) and are
//! shared by that service's clones, so no call looks a metric up: install
//! the recorder before building the stack.
//!
//! # Example
//!
//! ```
//! use metrics_util::debugging::DebuggingRecorder;
//! use tower::{service_fn, Layer};
//! use tower_retry_budget::{metrics, RetryLayer};
//!
//! let recorder = DebuggingRecorder::new();
//! let snapshotter = recorder.snapshotter();
//! let service = ::metrics::with_local_recorder(&recorder, || {
//!     RetryLayer::new().name("inventory").layer(service_fn(|_: http::Request<String>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
//!     }))
//! });
//! # let _ = service;
//! let registered = snapshotter.snapshot().into_vec().into_iter().any(|(key, ..)| {
//!     key.key().name() == metrics::RETRIES
//!         && key.key().labels().any(|l| l.key() == "dependency" && l.value() == "inventory")
//! });
//! assert!(registered);
//! ```

use ::metrics::{counter, Counter};

/// Counter of retries sent (attempts beyond the first).
pub const RETRIES: &str = "tower_retry_retries_total";
/// Counter of retries and hedges refused by the budget, by `kind`.
pub const BUDGET_REFUSALS: &str = "tower_retry_budget_refusals_total";
/// Counter of failures not retried because they carried the do-not-retry
/// mark.
pub const DO_NOT_RETRY: &str = "tower_retry_do_not_retry_total";
/// Counter of hedged attempts sent.
pub const HEDGES: &str = "tower_retry_hedges_total";
/// Counter of hedged attempts that won the race.
pub const HEDGES_WON: &str = "tower_retry_hedges_won_total";

/// The handles of one retry layer's services.
pub(crate) struct RetryMetrics {
    retries: Counter,
    refused: Counter,
    do_not_retry: Counter,
}

/// The handles of one hedging layer's services.
pub(crate) struct HedgeMetrics {
    sent: Counter,
    won: Counter,
    refused: Counter,
}

// === impl RetryMetrics ===

impl RetryMetrics {
    pub(crate) fn new(name: &str) -> Self {
        Self {
            retries: counter!(RETRIES, "dependency" => name.to_owned()),
            refused: counter!(BUDGET_REFUSALS, "dependency" => name.to_owned(), "kind" => "retry"),
            do_not_retry: counter!(DO_NOT_RETRY, "dependency" => name.to_owned()),
        }
    }

    #[inline]
    pub(crate) fn retried(&self) {
        self.retries.increment(1);
    }

    pub(crate) fn refused(&self) {
        self.refused.increment(1);
    }

    pub(crate) fn do_not_retry(&self) {
        self.do_not_retry.increment(1);
    }
}

// === impl HedgeMetrics ===

impl HedgeMetrics {
    pub(crate) fn new(name: &str) -> Self {
        Self {
            sent: counter!(HEDGES, "dependency" => name.to_owned()),
            won: counter!(HEDGES_WON, "dependency" => name.to_owned()),
            refused: counter!(BUDGET_REFUSALS, "dependency" => name.to_owned(), "kind" => "hedge"),
        }
    }

    pub(crate) fn sent(&self) {
        self.sent.increment(1);
    }

    pub(crate) fn won(&self) {
        self.won.increment(1);
    }

    pub(crate) fn refused(&self) {
        self.refused.increment(1);
    }
}
