//! What the deadline layers record through the
//! [`metrics`](https://docs.rs/metrics) facade (feature `metrics`).
//!
//! The server layer's metrics carry the label `service`, the name given
//! with [`ServerDeadlineLayer::name`](crate::ServerDeadlineLayer::name);
//! the client layer's carry `dependency`, the name given with
//! [`ClientDeadlineLayer::name`](crate::ClientDeadlineLayer::name). Both
//! are `default` when no name was given, so the number of series is
//! bounded by the names you choose.
//!
//! | Name | Type | Unit | Labels | What |
//! |------|------|------|--------|------|
//! | `tower_deadline_received_seconds` | histogram | seconds | `service` | the budget a caller sent (`grpc-timeout` or the HTTP header; the shortest valid value), as received, before clamping; requests without one record nothing |
//! | `tower_deadline_server_expired_total` | counter | requests | `service` | handlers cut off because the deadline passed (answered `504` or `DEADLINE_EXCEEDED`) |
//! | `tower_deadline_server_rejected_total` | counter | requests | `service` | requests failed fast without calling the handler: less than the minimum remaining (or nothing) |
//! | `tower_deadline_client_expired_total` | counter | calls | `dependency` | outgoing calls cut off because the deadline passed ([`DeadlineExceeded`](crate::error::DeadlineExceeded)) |
//! | `tower_deadline_client_rejected_total` | counter | calls | `dependency` | outgoing calls refused without being sent: less than the minimum remaining ([`InsufficientBudget`](crate::error::InsufficientBudget)) |
//!
//! # Registration
//!
//! The handles are registered with the recorder installed when the layer
//! wraps a service ([`Layer::layer`](tower_layer::Layer::layer)) and are
//! shared by that service's clones, so no request looks a metric up:
//! install the recorder before building the stack.
//!
//! # Example
//!
//! ```
//! use metrics_util::debugging::DebuggingRecorder;
//! use tower::{service_fn, Layer};
//! use tower_deadline::{metrics, ServerDeadlineLayer};
//!
//! let recorder = DebuggingRecorder::new();
//! let snapshotter = recorder.snapshotter();
//! let service = ::metrics::with_local_recorder(&recorder, || {
//!     ServerDeadlineLayer::new().name("checkout").layer(service_fn(|_: http::Request<()>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
//!     }))
//! });
//! # let _ = service;
//! let registered = snapshotter.snapshot().into_vec().into_iter().any(|(key, ..)| {
//!     key.key().name() == metrics::SERVER_EXPIRED
//!         && key.key().labels().any(|l| l.key() == "service" && l.value() == "checkout")
//! });
//! assert!(registered);
//! ```

use std::fmt;
use std::time::Duration;

use ::metrics::{counter, histogram, Counter, Histogram};

/// Histogram of the budgets callers sent, in seconds.
pub const RECEIVED: &str = "tower_deadline_received_seconds";
/// Counter of handlers cut off by the deadline.
pub const SERVER_EXPIRED: &str = "tower_deadline_server_expired_total";
/// Counter of requests failed fast for too little budget.
pub const SERVER_REJECTED: &str = "tower_deadline_server_rejected_total";
/// Counter of outgoing calls cut off by the deadline.
pub const CLIENT_EXPIRED: &str = "tower_deadline_client_expired_total";
/// Counter of outgoing calls refused for too little budget.
pub const CLIENT_REJECTED: &str = "tower_deadline_client_rejected_total";

/// The handles of one server layer's services.
#[derive(Clone)]
pub(crate) struct ServerMetrics {
    received: Histogram,
    expired: Expiry,
    rejected: Counter,
}

/// The handles of one client layer's services.
#[derive(Clone)]
pub(crate) struct ClientMetrics {
    expired: Expiry,
    rejected: Counter,
}

/// The counter a bounded response future bumps when its deadline wins.
#[derive(Clone)]
pub(crate) struct Expiry(Counter);

// === impl ServerMetrics ===

impl ServerMetrics {
    pub(crate) fn new(name: &str) -> Self {
        Self {
            received: histogram!(RECEIVED, "service" => name.to_owned()),
            expired: Expiry(counter!(SERVER_EXPIRED, "service" => name.to_owned())),
            rejected: counter!(SERVER_REJECTED, "service" => name.to_owned()),
        }
    }

    #[inline]
    pub(crate) fn received(&self, budget: Duration) {
        self.received.record(budget.as_secs_f64());
    }

    pub(crate) fn rejected(&self) {
        self.rejected.increment(1);
    }

    #[inline]
    pub(crate) fn expiry(&self) -> Expiry {
        self.expired.clone()
    }
}

impl fmt::Debug for ServerMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerMetrics").finish_non_exhaustive()
    }
}

// === impl ClientMetrics ===

impl ClientMetrics {
    pub(crate) fn new(name: &str) -> Self {
        Self {
            expired: Expiry(counter!(CLIENT_EXPIRED, "dependency" => name.to_owned())),
            rejected: counter!(CLIENT_REJECTED, "dependency" => name.to_owned()),
        }
    }

    pub(crate) fn rejected(&self) {
        self.rejected.increment(1);
    }

    #[inline]
    pub(crate) fn expiry(&self) -> Expiry {
        self.expired.clone()
    }
}

impl fmt::Debug for ClientMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientMetrics").finish_non_exhaustive()
    }
}

// === impl Expiry ===

impl Expiry {
    pub(crate) fn fire(&self) {
        self.0.increment(1);
    }
}
