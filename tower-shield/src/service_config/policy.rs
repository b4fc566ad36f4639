//! The retry and hedging policy of a method: its status codes decide what
//! is retried (or does not end a hedged call), and every attempt's outcome
//! goes to the client's retry throttle.

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, Method, StatusCode};
use tower_resilience_base::grpc::{GrpcCode, GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS};
use tower_retry_budget::policy::{
    classify_error, classify_response, is_transient_error, parse_pushback, Class, Classify,
};
use tower_retry_budget::Policy;

use super::codes::{StatusCodes, NAMES};
use super::throttle::RetryThrottle;

/// The [`Policy`] of a method of a [`ServiceConfigStack`](super::ServiceConfigStack):
/// its A6 status codes decide what is retried (or, for hedging, which
/// answers do not end the call), instead of the toolkit's defaults.
///
/// - **Requests:** a method with a `retryPolicy` (or a `hedgingPolicy`)
///   may be sent again whatever its HTTP method: gRPC calls are all
///   `POST`s, and a service config is the statement that the method is
///   safe to repeat (no `idempotency-key` needed). A hedged method is not
///   hedged at all while the [`RetryThrottle`] is at or below its
///   threshold when the call starts.
/// - **The code of an answer:** the `grpc-status` of a trailers-only
///   answer; `OK` for a `2xx` head without one (the trailers of a body are
///   not seen: the stack judges the head); for another HTTP status, the
///   code gRPC maps it to (`429`, `502`, `503`, `504`: UNAVAILABLE; `400`:
///   INTERNAL; `401`: UNAUTHENTICATED; `403`: PERMISSION_DENIED; `404`:
///   UNIMPLEMENTED; others: UNKNOWN). The code of an error: a
///   [`tonic::Status`] in its chain, else UNAVAILABLE when its kind says
///   a new attempt may succeed (a connection refused or reset), else
///   UNKNOWN; a local rejection (an open circuit, a full bulkhead) is
///   never retried.
/// - **Listed codes** are retried (hedged on), after at least the
///   server's `grpc-retry-pushback-ms` when it sent one; a negative one
///   means never. **Other codes** are not, not even UNAVAILABLE when it is
///   not listed.
/// - **The breaker's view is unchanged**: a listed code that the toolkit
///   counts as a dependency failure (UNAVAILABLE, INTERNAL, UNKNOWN,
///   DEADLINE_EXCEEDED, DATA_LOSS) is a [`Class::Transient`] failure; any
///   other listed code (RESOURCE_EXHAUSTED, ABORTED, ...) is retried as a
///   [`Class::Throttled`] answer, which a breaker does not count, as it
///   would not count it without the service config.
/// - **The throttle**: the retry layer's policy records every attempt in
///   the client's [`RetryThrottle`]: a listed code as a failure, `OK` as a
///   success, anything else not at all.
///
/// The stack builds one for each method config; it is public because it
/// names the stack's types.
///
/// # Clone
///
/// Clones share the throttle.
#[derive(Debug, Clone)]
pub struct A6Policy {
    codes: StatusCodes,
    /// Whether requests may be sent more than once.
    resend: bool,
    role: Role,
    throttle: Option<Arc<RetryThrottle>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The retry layer's: classifies for the breaker, records in the
    /// throttle.
    Retry,
    /// The hedge layer's: judges a race, records nothing (the retry layer
    /// below sees the same attempts).
    Hedge,
}

/// The outcome of an attempt, as the throttle counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Count {
    Success,
    Failure,
    Neither,
}

// === impl A6Policy ===

impl A6Policy {
    /// The policy of a retry layer: `codes` are retried when `resend`.
    pub(crate) fn retrying(
        codes: StatusCodes,
        resend: bool,
        throttle: Option<Arc<RetryThrottle>>,
    ) -> Self {
        Self {
            codes,
            resend,
            role: Role::Retry,
            throttle,
        }
    }

    /// The policy of a hedge layer: every request may be hedged (while the
    /// throttle allows it) and `codes` do not end the call.
    pub(crate) fn hedging(codes: StatusCodes, throttle: Option<Arc<RetryThrottle>>) -> Self {
        Self {
            codes,
            resend: true,
            role: Role::Hedge,
            throttle,
        }
    }

    /// The codes this policy retries (or, for hedging, that do not end the
    /// call).
    #[must_use]
    pub const fn status_codes(&self) -> StatusCodes {
        self.codes
    }

    /// The class of an answer with gRPC code `code` (its number), whose
    /// class by the toolkit's defaults is `default`; `after` is the
    /// server's pushback (`Err` for "never").
    fn judge(&self, code: u32, default: Class, after: Result<Option<Duration>, ()>) -> Class {
        if code == 0 {
            self.count(Count::Success);
            return Class::Success;
        }
        if !self.codes.contains_number(code) {
            self.count(Count::Neither);
            return not_retried(default);
        }
        self.count(Count::Failure);
        let Ok(after) = after else {
            return not_retried(default);
        };
        if default.is_failure() || self.role == Role::Hedge {
            Class::Transient {
                reason: NAMES[code as usize],
                after,
            }
        } else {
            // Retried, but not a failure of the dependency: a breaker above
            // does not count it (as without the service config).
            Class::Throttled {
                after: Some(after.unwrap_or(Duration::ZERO)),
            }
        }
    }

    fn count(&self, count: Count) {
        let Some(throttle) = self.throttle.as_ref().filter(|_| self.role == Role::Retry) else {
            return;
        };
        match count {
            Count::Success => throttle.record_success(),
            Count::Failure => throttle.record_failure(),
            Count::Neither => {}
        }
    }
}

impl Policy for A6Policy {
    /// Whether the method may be sent again: it has a policy (and, for
    /// hedging, the throttle allows hedges now). The HTTP method and an
    /// `idempotency-key` do not matter.
    fn is_retryable_request(&self, _method: &Method, _headers: &HeaderMap) -> bool {
        self.resend
            && (self.role == Role::Retry || self.throttle.as_ref().is_none_or(|t| t.allows()))
    }
}

impl Classify for A6Policy {
    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Class {
        let default = classify_response(status, headers);
        let after = match headers.get(GRPC_RETRY_PUSHBACK_MS) {
            None => Ok(None),
            Some(value) => parse_pushback(value).map(Some).ok_or(()),
        };
        self.judge(response_code(status, headers), default, after)
    }

    fn classify_error(&self, error: &(dyn Error + 'static)) -> Class {
        let default = classify_error(error);
        if default == Class::Local {
            return default;
        }
        self.judge(error_code(error), default, Ok(None))
    }
}

/// `class`, made one that is not retried, with the same meaning for a
/// breaker.
fn not_retried(class: Class) -> Class {
    match class {
        Class::Transient { .. } => Class::Failed,
        Class::Throttled { .. } => Class::Throttled { after: None },
        other => other,
    }
}

/// The gRPC code of a response head (its number): see [`A6Policy`].
fn response_code(status: StatusCode, headers: &HeaderMap) -> u32 {
    if status.is_success() {
        return match headers.get(GRPC_STATUS) {
            None => 0,
            Some(value) => GrpcCode::parse(value.as_bytes()).map_or(2, GrpcCode::as_u32),
        };
    }
    // gRPC's mapping of HTTP statuses to codes, for answers without one.
    match status.as_u16() {
        400 => 13,
        401 => 16,
        403 => 7,
        404 => 12,
        429 | 502 | 503 | 504 => 14,
        _ => 2,
    }
}

/// The gRPC code of an error (its number): see [`A6Policy`].
fn error_code(error: &(dyn Error + 'static)) -> u32 {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(status) = e.downcast_ref::<tonic::Status>() {
            return status.code() as u32;
        }
        next = e.source();
    }
    if is_transient_error(error) {
        14
    } else {
        2
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use tonic::Code;

    fn grpc(code: &'static str, pushback: Option<&'static str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-status", HeaderValue::from_static(code));
        if let Some(ms) = pushback {
            headers.insert("grpc-retry-pushback-ms", HeaderValue::from_static(ms));
        }
        headers
    }

    fn unavailable() -> StatusCodes {
        StatusCodes::new().with(Code::Unavailable)
    }

    #[test]
    fn only_listed_codes_are_retried() {
        let policy = A6Policy::retrying(
            StatusCodes::new()
                .with(Code::Unavailable)
                .with(Code::ResourceExhausted),
            true,
            None,
        );
        let of = |code, pushback| policy.classify_response(StatusCode::OK, &grpc(code, pushback));
        assert_eq!(
            of("14", None),
            Class::Transient {
                reason: "UNAVAILABLE",
                after: None
            }
        );
        // Retried, and still not a failure for a breaker.
        let exhausted = of("8", None);
        assert!(exhausted.is_retryable() && !exhausted.is_failure());
        assert_eq!(
            of("14", Some("30")).retry_after(),
            Some(Duration::from_millis(30))
        );
        assert_eq!(of("14", Some("-1")), Class::Failed, "a negative pushback");
        assert_eq!(of("3", None), Class::Rejected);
        assert_eq!(of("13", None), Class::Failed);
        assert_eq!(of("0", None), Class::Success);
        let http =
            |code| policy.classify_response(StatusCode::from_u16(code).unwrap(), &HeaderMap::new());
        assert!(http(503).is_retryable());
        assert_eq!(http(500), Class::Failed);
        assert_eq!(http(200), Class::Success);
    }

    #[test]
    fn unavailable_is_not_retried_unless_listed() {
        let policy = A6Policy::retrying(StatusCodes::new().with(Code::Internal), true, None);
        let class = policy.classify_response(StatusCode::OK, &grpc("14", None));
        assert_eq!(class, Class::Failed, "still a failure for the breaker");
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(policy.classify_error(&reset), Class::Failed);
        let internal = tonic::Status::internal("boom");
        assert!(policy.classify_error(&internal).is_retryable());
    }

    #[test]
    fn errors_take_their_status_code_or_unavailable_when_transient() {
        let policy = A6Policy::retrying(unavailable(), true, None);
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(policy.classify_error(&refused).is_retryable());
        let bad = std::io::Error::from(std::io::ErrorKind::InvalidData);
        assert_eq!(policy.classify_error(&bad), Class::Failed);
        let full = tower_resilience_base::error::BulkheadFull::new("x", 1, None);
        assert_eq!(policy.classify_error(&full), Class::Local);
    }

    #[test]
    fn the_retry_layers_policy_counts_and_the_hedge_layers_does_not() {
        use super::super::config::RetryThrottling;
        let throttle = Arc::new(RetryThrottle::new(&RetryThrottling::new_unchecked(10, 500)));
        let retry = A6Policy::retrying(unavailable(), true, Some(throttle.clone()));
        let hedge = A6Policy::hedging(unavailable(), Some(throttle.clone()));
        let failed = grpc("14", None);
        hedge.classify_response(StatusCode::OK, &failed);
        assert_eq!(throttle.tokens(), 10.0);
        retry.classify_response(StatusCode::OK, &failed);
        retry.classify_response(StatusCode::OK, &grpc("5", None)); // not listed
        assert_eq!(throttle.tokens(), 9.0);
        retry.classify_response(StatusCode::OK, &HeaderMap::new());
        assert_eq!(throttle.tokens(), 9.5);
        for _ in 0..5 {
            retry.classify_response(StatusCode::OK, &failed);
        }
        let none = HeaderMap::new();
        assert!(
            !hedge.is_retryable_request(&Method::POST, &none),
            "throttled"
        );
        assert!(
            retry.is_retryable_request(&Method::POST, &none),
            "decided per retry"
        );
        let once = A6Policy::retrying(unavailable(), false, None);
        assert!(!once.is_retryable_request(&Method::GET, &none));
    }
}
