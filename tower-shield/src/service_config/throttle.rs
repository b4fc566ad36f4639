//! gRFC A6's retry throttling: one token bucket per client, shared by
//! every method, that stops retries and hedges while too many attempts
//! fail.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use tower_resilience_base::fleet::{Claim, ClaimFuture, SharedRetries};

use super::config::RetryThrottling;

/// Thousandths of a token per token: A6 keeps `tokenRatio` to three
/// decimal places, so integer thousandths are exact.
const MILLI: u64 = 1_000;

/// gRFC A6's retry throttle (`retryThrottling`): a token count that
/// starts at `maxTokens`, loses 1 for each attempt that fails with one of
/// its method's listed codes, gains `tokenRatio` (up to `maxTokens`) for
/// each attempt that succeeds, and allows retries and hedges only while it
/// is above `maxTokens / 2`.
///
/// A [`ServiceConfigStack`](super::ServiceConfigStack) builds one from the
/// config's [`RetryThrottling`], shared by every method of the client; its
/// policies ([`A6Policy`](super::A6Policy)) record each attempt's outcome
/// in it, and it answers the retry layer's claims (it is the stack's
/// budget's [`SharedRetries`], see below). Read it with
/// [`ServiceConfigStack::retry_throttle`](super::ServiceConfigStack::retry_throttle).
///
/// The count is kept in thousandths of a token in one atomic word:
/// recording an outcome is one compare-and-swap loop, checking it one
/// load. Nothing takes a lock.
///
/// # As the budget's `SharedRetries`
///
/// The stack's [`RetryBudget`](tower_retry_budget::RetryBudget) is
/// [shared](tower_retry_budget::RetryBudget::share) with this throttle, so
/// the retry layer claims each retry from it: at or below the threshold the
/// claim is [`Claim::Refused`] (the retry layer stops with
/// [`StopReason::Budget`](tower_retry_budget::StopReason::Budget)); above
/// it the answer is [`Claim::Unavailable`], which tells the retry layer to
/// decide by its own budget. So both bounds apply: A6's throttle and the
/// toolkit's 10% budget.
///
/// # Clone
///
/// Not `Clone`: share one by `Arc`, as the stack does.
///
/// # Example
///
/// ```
/// use tower_shield::service_config::{RetryThrottle, ServiceConfig};
///
/// let config = ServiceConfig::from_json(
///     r#"{ "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.5 } }"#,
/// )?;
/// let throttle = RetryThrottle::new(config.retry_throttling().unwrap());
/// assert_eq!(throttle.tokens(), 10.0);
/// for _ in 0..5 {
///     throttle.record_failure();
/// }
/// assert_eq!(throttle.tokens(), 5.0);
/// assert!(!throttle.allows(), "5 is not above 10 / 2");
/// throttle.record_success();
/// assert_eq!(throttle.tokens(), 5.5);
/// assert!(throttle.allows());
/// # Ok::<(), tower_shield::service_config::ServiceConfigError>(())
/// ```
pub struct RetryThrottle {
    /// The token count, in thousandths.
    tokens: AtomicU64,
    /// `maxTokens`, in thousandths.
    max: u64,
    /// `tokenRatio`, in thousandths.
    ratio: u64,
}

// === impl RetryThrottle ===

impl RetryThrottle {
    /// A full throttle (`maxTokens` tokens) for `throttling`.
    #[must_use]
    pub fn new(throttling: &RetryThrottling) -> Self {
        let max = u64::from(throttling.max_tokens()) * MILLI;
        Self {
            tokens: AtomicU64::new(max),
            max,
            ratio: u64::from(throttling.token_ratio_milli()),
        }
    }

    /// The tokens now (to three decimal places).
    #[must_use]
    pub fn tokens(&self) -> f64 {
        self.tokens.load(Relaxed) as f64 / MILLI as f64
    }

    /// `maxTokens`: the tokens of a full throttle.
    #[must_use]
    pub fn max_tokens(&self) -> u32 {
        (self.max / MILLI) as u32
    }

    /// `tokenRatio`: the tokens a success gives back (to three decimal
    /// places).
    #[must_use]
    pub fn token_ratio(&self) -> f64 {
        self.ratio as f64 / MILLI as f64
    }

    /// Whether retries and hedges are allowed now: the tokens are above
    /// `maxTokens / 2`.
    #[must_use]
    pub fn allows(&self) -> bool {
        self.tokens.load(Relaxed) * 2 > self.max
    }

    /// An attempt failed with a code its method lists (retryable or
    /// non-fatal): one token less, down to 0.
    pub fn record_failure(&self) {
        let _ = self.tokens.fetch_update(Relaxed, Relaxed, |t| {
            (t > 0).then(|| t.saturating_sub(MILLI))
        });
    }

    /// An attempt succeeded: `tokenRatio` tokens more, up to `maxTokens`.
    pub fn record_success(&self) {
        let (max, ratio) = (self.max, self.ratio);
        let _ = self.tokens.fetch_update(Relaxed, Relaxed, |t| {
            (t < max).then(|| t.saturating_add(ratio).min(max))
        });
    }
}

impl fmt::Debug for RetryThrottle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryThrottle")
            .field("tokens", &self.tokens())
            .field("max_tokens", &self.max_tokens())
            .field("token_ratio", &self.token_ratio())
            .finish()
    }
}

impl SharedRetries for RetryThrottle {
    /// [`Claim::Refused`] at or below the threshold; otherwise
    /// [`Claim::Unavailable`], so that the retry layer's own budget decides
    /// (both bounds apply).
    fn claim(&self) -> ClaimFuture {
        let answer = if self.allows() {
            Claim::Unavailable
        } else {
            Claim::Refused
        };
        Box::pin(std::future::ready(answer))
    }

    /// Nothing to give back: a claim never takes a token (failures do).
    fn give_back(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttle(max_tokens: u32, ratio_milli: u32) -> RetryThrottle {
        RetryThrottle::new(&RetryThrottling::new_unchecked(max_tokens, ratio_milli))
    }

    /// The threshold is strict: exactly half is not enough.
    #[test]
    fn retries_stop_at_half_and_resume_above_it() {
        let t = throttle(3, 250);
        assert!(t.allows());
        t.record_failure(); // 2
        assert!(t.allows(), "2 > 1.5");
        t.record_failure(); // 1
        assert!(!t.allows());
        t.record_success(); // 1.25
        t.record_success(); // 1.5
        assert!(!t.allows(), "1.5 is not above 1.5");
        t.record_success(); // 1.75
        assert!(t.allows());
    }

    #[test]
    fn tokens_stay_between_zero_and_the_maximum() {
        let t = throttle(2, 1_500);
        for _ in 0..5 {
            t.record_failure();
        }
        assert_eq!(t.tokens(), 0.0);
        for _ in 0..5 {
            t.record_success();
        }
        assert_eq!(t.tokens(), 2.0);
        let huge = throttle(1, u32::MAX);
        huge.record_failure();
        huge.record_success();
        assert_eq!(huge.tokens(), 1.0);
    }

    #[tokio::test]
    async fn claims_defer_to_the_budget_above_the_threshold_and_refuse_below() {
        let t = throttle(2, 1_000);
        assert_eq!(t.claim().await, Claim::Unavailable);
        t.record_failure();
        assert_eq!(t.claim().await, Claim::Refused);
        t.give_back();
        assert_eq!(t.tokens(), 1.0, "a claim takes no token");
    }
}
