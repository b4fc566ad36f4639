//! Errors returned by [`ClientDeadline`](crate::ClientDeadline).
//!
//! The client service's error type is [`BoxError`](crate::BoxError); the
//! failures this crate adds are the two structs below, and any error of the
//! inner service passes through unchanged. Match on them with `downcast_ref`
//! or `is`, even when other layers box the error again on top:
//!
//! ```
//! use std::time::Duration;
//! use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
//! use tower_deadline::error::{DeadlineExceeded, InsufficientBudget};
//! use tower_deadline::{ClientDeadlineLayer, Deadline};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let slow = service_fn(|_req: http::Request<()>| async {
//!     tokio::time::sleep(Duration::from_secs(10)).await;
//!     Ok::<_, BoxError>(http::Response::new(()))
//! });
//! let client = ServiceBuilder::new()
//!     .layer(ClientDeadlineLayer::new().default_timeout(Duration::from_millis(100)))
//!     .service(slow);
//!
//! let err = client.oneshot(http::Request::new(())).await.unwrap_err();
//! assert!(err.is::<DeadlineExceeded>());
//! assert!(!err.is::<InsufficientBudget>());
//! # }
//! ```

use std::fmt;
use std::time::Duration;

/// The deadline passed while the call was in flight; the inner future was
/// dropped, which cancels the downstream work.
///
/// Retrying it is pointless: the caller's budget is spent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadlineExceeded {
    _p: (),
}

/// The budget left was below the configured minimum, so the inner service
/// was not called at all (fail fast).
///
/// Carries how much was left and how much was required.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InsufficientBudget {
    remaining: Duration,
    required: Duration,
}

// === impl DeadlineExceeded ===

impl DeadlineExceeded {
    pub(crate) const fn new() -> Self {
        Self { _p: () }
    }
}

impl fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline exceeded")
    }
}

impl std::error::Error for DeadlineExceeded {}

// === impl InsufficientBudget ===

impl InsufficientBudget {
    pub(crate) const fn new(remaining: Duration, required: Duration) -> Self {
        Self {
            remaining,
            required,
        }
    }

    /// The budget that was left when the call was refused (zero if the
    /// deadline had already passed).
    #[must_use]
    pub const fn remaining(&self) -> Duration {
        self.remaining
    }

    /// The configured minimum budget needed to start a call.
    #[must_use]
    pub const fn required(&self) -> Duration {
        self.required
    }
}

impl fmt::Display for InsufficientBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.remaining.is_zero() {
            f.write_str("deadline already passed before the call")
        } else {
            write!(
                f,
                "deadline budget too small to start the call: {:?} left, {:?} required",
                self.remaining, self.required
            )
        }
    }
}

impl std::error::Error for InsufficientBudget {}
