//! What is retried: which requests may be sent again (the [`Policy`]),
//! and what a response or an error says (the policy's [`Classify`], the
//! toolkit's one classification, shared with the circuit breaker).

use std::error::Error;

use http::{HeaderMap, HeaderName, Method};

/// The header that makes a non-idempotent request retryable:
/// `idempotency-key`.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// `grpc-retry-pushback-ms` (the toolkit's one definition, from
/// `tower-resilience-base`): how long a gRPC server asks before a retry; a
/// negative or malformed value means "do not retry".
pub use tower_resilience_base::grpc::GRPC_RETRY_PUSHBACK_MS;

/// The toolkit's classification (from `tower-resilience-base`): the
/// [`Class`] of a response or an error, the [`Classify`] trait every policy
/// implements, and its default rules.
pub use tower_resilience_base::classify::{
    classify_error, classify_response, is_transient_error, parse_pushback, parse_retry_after,
    Class, Classify,
};

/// The replaceable rules of what is retried: which requests may be sent
/// again, and (as a [`Classify`]) what a response or an error says.
///
/// Every method has a default, the documented rules of the toolkit, so a
/// policy overrides only what it changes; the defaults are also public
/// functions ([`is_idempotent`], [`classify_response`], [`classify_error`])
/// for policies that want to refine rather than replace them. A response
/// or error is retried when its [`Class`] is retryable
/// ([`Class::is_retryable`]: a transient failure, or a 429 that said when
/// to come back), after at least the delay the server asked for
/// ([`Class::retry_after`]).
///
/// The classification is the one the circuit breaker reads: with the
/// retry layer below a breaker, each attempt's class is handed to the
/// breaker, which counts it by the same rules
/// ([`Class::is_failure`]).
///
/// Whatever the policy says, the layer never retries a response that
/// carries [`NO_RETRY_HEADER`](crate::NO_RETRY_HEADER), nor an error that
/// [`is_local_rejection`] recognises (this crate's and `tower-deadline`'s
/// errors, and other local rejections).
///
/// The trait is object safe: `Arc<dyn Policy>` and `Box<dyn Policy>` are
/// policies too.
///
/// # Example
///
/// Also retry `500 Internal Server Error`, and treat `PATCH` as idempotent:
///
/// ```
/// use http::{HeaderMap, Method, StatusCode};
/// use tower_retry_budget::policy::{self, Class, Classify, Policy};
/// use tower_retry_budget::RetryLayer;
///
/// #[derive(Debug, Clone)]
/// struct MyPolicy;
///
/// impl Policy for MyPolicy {
///     fn is_retryable_request(&self, method: &Method, headers: &HeaderMap) -> bool {
///         method == Method::PATCH || policy::is_idempotent(method, headers)
///     }
/// }
///
/// impl Classify for MyPolicy {
///     fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Class {
///         if status == StatusCode::INTERNAL_SERVER_ERROR {
///             return Class::Transient { reason: "500", after: None };
///         }
///         policy::classify_response(status, headers)
///     }
/// }
///
/// let layer = RetryLayer::new().policy(MyPolicy);
/// # let _ = layer;
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a retry policy",
    note = "a policy implements both `Policy` (which requests may be retried) and \
            `Classify` (what a response says); both have defaults: \
            `impl Policy for {Self} {{}}` and `impl Classify for {Self} {{}}`"
)]
pub trait Policy: Classify {
    /// Whether a request may be sent more than once. Default:
    /// [`is_idempotent`].
    fn is_retryable_request(&self, method: &Method, headers: &HeaderMap) -> bool {
        is_idempotent(method, headers)
    }
}

/// The default [`Policy`]: the toolkit's documented rules and nothing
/// else.
///
/// - Retryable requests: `GET`, `HEAD`, `OPTIONS`, `PUT`, `DELETE`,
///   `TRACE`, or any request with an `Idempotency-Key` header.
/// - Retryable responses: 502, 503 and 504; 429 only with `Retry-After`;
///   a trailers-only gRPC response with `grpc-status: 14` (UNAVAILABLE).
///   `Retry-After` (delta seconds or HTTP date) and
///   `grpc-retry-pushback-ms` set the least delay; a negative or malformed
///   pushback means never. Every other status is not retried (see the
///   table of [`Class`]).
/// - Retryable errors: those of [`is_transient_error`] (connection errors,
///   timeouts), except local rejections ([`is_local_rejection`]).
///
/// # Example
///
/// ```
/// use http::{HeaderMap, Method};
/// use tower_retry_budget::{DefaultPolicy, Policy};
///
/// let policy = DefaultPolicy::new();
/// assert!(policy.is_retryable_request(&Method::GET, &HeaderMap::new()));
/// assert!(!policy.is_retryable_request(&Method::POST, &HeaderMap::new()));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultPolicy {
    _p: (),
}

// === impl DefaultPolicy ===

impl DefaultPolicy {
    /// The default rules.
    #[must_use]
    pub const fn new() -> Self {
        Self { _p: () }
    }
}

impl Policy for DefaultPolicy {}

impl Classify for DefaultPolicy {}

impl<P: Policy + ?Sized> Policy for std::sync::Arc<P> {
    fn is_retryable_request(&self, method: &Method, headers: &HeaderMap) -> bool {
        (**self).is_retryable_request(method, headers)
    }
}

impl<P: Policy + ?Sized> Policy for Box<P> {
    fn is_retryable_request(&self, method: &Method, headers: &HeaderMap) -> bool {
        (**self).is_retryable_request(method, headers)
    }
}

/// The default idempotency rule: the method is `GET`, `HEAD`, `OPTIONS`,
/// `PUT`, `DELETE` or `TRACE`, or the request carries an `Idempotency-Key`
/// header.
///
/// # Example
///
/// ```
/// use http::{HeaderMap, HeaderValue, Method};
/// use tower_retry_budget::policy::{is_idempotent, IDEMPOTENCY_KEY};
///
/// let mut headers = HeaderMap::new();
/// assert!(!is_idempotent(&Method::POST, &headers));
/// headers.insert(IDEMPOTENCY_KEY, HeaderValue::from_static("order-42"));
/// assert!(is_idempotent(&Method::POST, &headers));
/// ```
#[must_use]
pub fn is_idempotent(method: &Method, headers: &HeaderMap) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE | Method::TRACE
    ) || headers.contains_key(IDEMPOTENCY_KEY)
}

/// Whether an error, or any error in its `source()` chain, is one this
/// layer never retries, whatever its policy says:
///
/// - a local rejection
///   ([`tower_resilience_base::error::is_local_rejection`]: an open
///   circuit, a full bulkhead, a budget too small to start, or a
///   [`LocalRejection`](crate::error::LocalRejection) of your own): the
///   dependency was not called, and a retry would only add load;
/// - spent retries ([`tower_resilience_base::error::retries_spent`]): a
///   retry layer below already gave up, so this tier must not start again;
/// - a passed deadline
///   ([`DeadlineExceeded`](tower_resilience_base::error::DeadlineExceeded)):
///   the caller's budget is spent (the layer itself still retries a
///   `DeadlineExceeded` raised below it while the call's own deadline has
///   time left, since that is a per-attempt timeout);
/// - a [`ReplaySuperseded`](crate::error::ReplaySuperseded) body.
///
/// # Example
///
/// ```
/// use std::io;
/// use tower_retry_budget::error::LocalRejection;
/// use tower_retry_budget::policy::is_local_rejection;
///
/// assert!(!is_local_rejection(&io::Error::from(io::ErrorKind::TimedOut)));
/// assert!(is_local_rejection(&LocalRejection::new("shed")));
/// ```
#[must_use]
pub fn is_local_rejection(error: &(dyn Error + 'static)) -> bool {
    use tower_resilience_base::error::{self, DeadlineExceeded};

    error::is_local_rejection(error)
        || error::retries_spent(error)
        || error::find::<DeadlineExceeded>(error).is_some()
        || error::find::<crate::error::ReplaySuperseded>(error).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderValue, StatusCode};

    /// A passed deadline is transient by kind (a per-attempt timeout may
    /// pass), but this layer never retries it on the policy's word: it is
    /// one of its local rejections.
    #[test]
    fn a_deadline_exceeded_is_transient_but_never_retried_by_default() {
        use tower_resilience_base::error::DeadlineExceeded;

        assert!(is_transient_error(&DeadlineExceeded::new()));
        assert!(is_local_rejection(&DeadlineExceeded::new()));
    }

    /// `Arc` and `Box` of a policy, `dyn` or not, answer every question as
    /// the policy inside, not with the defaults.
    #[test]
    fn shared_and_boxed_policies_answer_as_the_policy_inside() {
        #[derive(Debug)]
        struct PostOnly;

        impl Policy for PostOnly {
            fn is_retryable_request(&self, method: &Method, _: &HeaderMap) -> bool {
                method == Method::POST
            }
        }

        impl Classify for PostOnly {
            fn classify_response(&self, status: StatusCode, _: &HeaderMap) -> Class {
                if status == StatusCode::INTERNAL_SERVER_ERROR {
                    Class::Transient {
                        reason: "500",
                        after: None,
                    }
                } else {
                    Class::Success
                }
            }

            fn classify_error(&self, _: &(dyn Error + 'static)) -> Class {
                Class::Failed
            }
        }

        fn answers<P: Policy>(policy: &P) -> (bool, bool, Class, Class) {
            let none = HeaderMap::new();
            let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
            (
                policy.is_retryable_request(&Method::POST, &none),
                policy.is_retryable_request(&Method::GET, &none),
                policy.classify_response(StatusCode::INTERNAL_SERVER_ERROR, &none),
                policy.classify_error(&reset),
            )
        }

        let direct = answers(&PostOnly);
        let retry_500 = Class::Transient {
            reason: "500",
            after: None,
        };
        assert_eq!(direct, (true, false, retry_500, Class::Failed));
        assert_eq!(answers(&std::sync::Arc::new(PostOnly)), direct);
        let shared: std::sync::Arc<dyn Policy> = std::sync::Arc::new(PostOnly);
        assert_eq!(answers(&shared), direct);
        assert_eq!(answers(&Box::new(PostOnly)), direct);
        let boxed: Box<dyn Policy> = Box::new(PostOnly);
        assert_eq!(answers(&boxed), direct);
    }

    #[test]
    fn idempotency() {
        let none = HeaderMap::new();
        for m in ["GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"] {
            assert!(is_idempotent(
                &Method::from_bytes(m.as_bytes()).unwrap(),
                &none
            ));
        }
        for m in ["POST", "PATCH", "CONNECT"] {
            assert!(!is_idempotent(
                &Method::from_bytes(m.as_bytes()).unwrap(),
                &none
            ));
        }
        let mut keyed = HeaderMap::new();
        keyed.insert(IDEMPOTENCY_KEY, HeaderValue::from_static("abc"));
        assert!(is_idempotent(&Method::POST, &keyed));
    }
}
