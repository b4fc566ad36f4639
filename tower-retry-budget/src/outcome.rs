use std::fmt;

/// Which limit ended the retries of a request.
///
/// # Example
///
/// ```
/// use tower_retry_budget::StopReason;
///
/// assert_eq!(StopReason::Budget.to_string(), "retry budget");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopReason {
    /// The maximum number of attempts was reached.
    Attempts,
    /// The retry budget refused the retry.
    Budget,
    /// Too little of the deadline was left for a backoff and one more
    /// attempt of the minimum slice.
    Deadline,
    /// The failure or the request could not be retried: not a transient
    /// failure, a request that is not idempotent, a body that cannot be
    /// replayed, a server that asked not to retry (or to wait longer than
    /// allowed).
    NotRetryable,
    /// The answer carried the [`NO_RETRY_HEADER`](crate::NO_RETRY_HEADER)
    /// mark: the retries for this failure were already spent below (or a
    /// layer below refused the call on purpose). The mark stays on the
    /// answer, so the tiers above do not retry it either.
    SpentBelow,
}

/// Inserted into the extensions of a failed response that this layer
/// returns, saying why it stopped there and after how many attempts.
///
/// Present on every response the [`Policy`](crate::Policy) classified as a
/// failure (retryable or not); absent on successes. For
/// [`StopReason::Attempts`], [`StopReason::Budget`] and
/// [`StopReason::Deadline`] the response also carries
/// [`NO_RETRY_HEADER`](crate::NO_RETRY_HEADER).
///
/// # Example
///
/// ```
/// use tower::{service_fn, BoxError, ServiceExt};
/// use tower_retry_budget::body::ReplayBody;
/// use tower_retry_budget::{GaveUp, Retry, StopReason};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let down = service_fn(|_req: http::Request<ReplayBody<String>>| async {
///     let mut response = http::Response::new(());
///     *response.status_mut() = http::StatusCode::BAD_GATEWAY;
///     Ok::<_, BoxError>(response)
/// });
/// let response = Retry::new(down).oneshot(http::Request::new(String::new())).await.unwrap();
/// let gave_up = response.extensions().get::<GaveUp>().unwrap();
/// assert_eq!(gave_up.reason(), StopReason::Attempts);
/// assert_eq!(gave_up.attempts(), 3);
/// assert!(response.headers().contains_key(tower_retry_budget::NO_RETRY_HEADER));
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GaveUp {
    reason: StopReason,
    attempts: u32,
}

// === impl StopReason ===

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StopReason::Attempts => "attempts",
            StopReason::Budget => "retry budget",
            StopReason::Deadline => "deadline",
            StopReason::NotRetryable => "not retryable",
            StopReason::SpentBelow => "retries spent below",
        })
    }
}

// === impl GaveUp ===

impl GaveUp {
    pub(crate) const fn new(reason: StopReason, attempts: u32) -> Self {
        Self { reason, attempts }
    }

    /// Which limit ended the retries.
    #[must_use]
    pub const fn reason(&self) -> StopReason {
        self.reason
    }

    /// How many attempts were made, the first included.
    #[must_use]
    pub const fn attempts(&self) -> u32 {
        self.attempts
    }
}
