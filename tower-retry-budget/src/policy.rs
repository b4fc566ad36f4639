//! What is retried: the replaceable classification of requests, responses
//! and errors.

use std::error::Error;
use std::time::{Duration, SystemTime};

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use tower_resilience_base::grpc::GrpcCode;

/// The header that makes a non-idempotent request retryable:
/// `idempotency-key`.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// `grpc-retry-pushback-ms` (the toolkit's one definition, from
/// `tower-resilience-base`): how long a gRPC server asks before a retry; a
/// negative or malformed value means "do not retry".
pub use tower_resilience_base::grpc::GRPC_RETRY_PUSHBACK_MS;

/// What the [`Policy`] says about the outcome of one attempt.
///
/// # Example
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use tower_retry_budget::{DefaultPolicy, Policy, Verdict};
///
/// let policy = DefaultPolicy::new();
/// let headers = HeaderMap::new();
/// assert_eq!(policy.classify_response(StatusCode::OK, &headers), Verdict::Success);
/// assert_eq!(policy.classify_response(StatusCode::NOT_FOUND, &headers), Verdict::Failure);
/// assert!(policy.classify_response(StatusCode::BAD_GATEWAY, &headers).is_retryable());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not a failure: returned as is.
    Success,
    /// A failure that must not be retried (it would fail the same way, or
    /// retrying would only add load): returned as is.
    Failure,
    /// A transient failure, retried if the request, the attempts, the
    /// deadline and the budget allow it.
    Retry {
        /// A short label for logs (`"503"`, `"transport error"`, ...).
        reason: &'static str,
        /// The least delay the server asked for (`Retry-After`,
        /// `grpc-retry-pushback-ms`), waited on top of the backoff.
        after: Option<Duration>,
    },
}

/// The replaceable rules of what is retried.
///
/// Every method has a default, the documented rules of this crate, so a
/// policy overrides only what it changes; the defaults are also public
/// functions ([`is_idempotent`], [`classify_response`], [`classify_error`])
/// for policies that want to refine rather than replace them.
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
/// use tower_retry_budget::{policy, Policy, RetryLayer, Verdict};
///
/// #[derive(Debug, Clone)]
/// struct MyPolicy;
///
/// impl Policy for MyPolicy {
///     fn is_retryable_request(&self, method: &Method, headers: &HeaderMap) -> bool {
///         method == Method::PATCH || policy::is_idempotent(method, headers)
///     }
///
///     fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Verdict {
///         if status == StatusCode::INTERNAL_SERVER_ERROR {
///             return Verdict::Retry { reason: "500", after: None };
///         }
///         policy::classify_response(status, headers)
///     }
/// }
///
/// let layer = RetryLayer::new().policy(MyPolicy);
/// # let _ = layer;
/// ```
pub trait Policy: Send + Sync + 'static {
    /// Whether a request may be sent more than once. Default:
    /// [`is_idempotent`].
    fn is_retryable_request(&self, method: &Method, headers: &HeaderMap) -> bool {
        is_idempotent(method, headers)
    }

    /// The verdict on a response, from its status and headers. Default:
    /// [`classify_response`].
    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Verdict {
        classify_response(status, headers)
    }

    /// The verdict on an error of the inner service. Default:
    /// [`classify_error`].
    fn classify_error(&self, error: &(dyn Error + 'static)) -> Verdict {
        classify_error(error)
    }
}

/// The default [`Policy`]: the crate's documented rules and nothing else.
///
/// - Retryable requests: `GET`, `HEAD`, `OPTIONS`, `PUT`, `DELETE`,
///   `TRACE`, or any request with an `Idempotency-Key` header.
/// - Retryable responses: 502, 503 and 504; 429 only with `Retry-After`;
///   a trailers-only gRPC response with `grpc-status: 14` (UNAVAILABLE).
///   `Retry-After` (delta seconds or HTTP date) and
///   `grpc-retry-pushback-ms` set the least delay; a negative or malformed
///   pushback means never. Every other status is not retried.
/// - Retryable errors: all (connection errors, timeouts), except local
///   rejections ([`is_local_rejection`]).
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

impl<P: Policy + ?Sized> Policy for std::sync::Arc<P> {
    fn is_retryable_request(&self, method: &Method, headers: &HeaderMap) -> bool {
        (**self).is_retryable_request(method, headers)
    }

    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Verdict {
        (**self).classify_response(status, headers)
    }

    fn classify_error(&self, error: &(dyn Error + 'static)) -> Verdict {
        (**self).classify_error(error)
    }
}

impl<P: Policy + ?Sized> Policy for Box<P> {
    fn is_retryable_request(&self, method: &Method, headers: &HeaderMap) -> bool {
        (**self).is_retryable_request(method, headers)
    }

    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Verdict {
        (**self).classify_response(status, headers)
    }

    fn classify_error(&self, error: &(dyn Error + 'static)) -> Verdict {
        (**self).classify_error(error)
    }
}

// === impl Verdict ===

impl Verdict {
    /// Whether this is [`Verdict::Retry`].
    #[must_use]
    pub const fn is_retryable(&self) -> bool {
        matches!(self, Verdict::Retry { .. })
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

/// The default verdict on a response; see [`DefaultPolicy`].
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, HeaderValue, StatusCode};
/// use tower_retry_budget::{policy::classify_response, Verdict};
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(classify_response(StatusCode::TOO_MANY_REQUESTS, &headers), Verdict::Failure);
/// headers.insert("retry-after", HeaderValue::from_static("2"));
/// assert_eq!(
///     classify_response(StatusCode::TOO_MANY_REQUESTS, &headers),
///     Verdict::Retry { reason: "429", after: Some(Duration::from_secs(2)) },
/// );
/// ```
#[must_use]
pub fn classify_response(status: StatusCode, headers: &HeaderMap) -> Verdict {
    let (reason, needs_delay) = match status.as_u16() {
        502 => ("502", false),
        503 => ("503", false),
        504 => ("504", false),
        429 => ("429", true),
        200 => match GrpcCode::from_headers(headers) {
            None | Some(GrpcCode::Ok) => return Verdict::Success,
            Some(code) if code.is_transient() => ("grpc unavailable", false),
            Some(_) => return Verdict::Failure,
        },
        _ if status.is_client_error() || status.is_server_error() => return Verdict::Failure,
        _ => return Verdict::Success,
    };
    let after = match headers.get(GRPC_RETRY_PUSHBACK_MS) {
        Some(value) => match parse_pushback(value) {
            Some(after) => Some(after),
            // Negative or malformed: the server asks us not to retry.
            None => return Verdict::Failure,
        },
        None => headers
            .get(RETRY_AFTER)
            .and_then(|v| parse_retry_after(v, SystemTime::now())),
    };
    if needs_delay && after.is_none() {
        return Verdict::Failure;
    }
    Verdict::Retry { reason, after }
}

/// The default verdict on an error: retry it only when its kind says the
/// next attempt may succeed ([`is_transient_error`]), and never a local
/// rejection ([`is_local_rejection`]).
///
/// Errors whose kind says the next attempt would fail the same way (an
/// invalid URI, a request the client could not build, a TLS or certificate
/// failure, a protocol error) are not retried. Replace the rule with your
/// own [`Policy::classify_error`].
///
/// # Example
///
/// ```
/// use std::io;
/// use tower_retry_budget::{policy::classify_error, Verdict};
///
/// let reset = io::Error::from(io::ErrorKind::ConnectionReset);
/// assert!(classify_error(&reset).is_retryable());
///
/// let bad_uri = "http://exa mple".parse::<http::Uri>().unwrap_err();
/// assert_eq!(classify_error(&bad_uri), Verdict::Failure);
/// ```
#[must_use]
pub fn classify_error(error: &(dyn Error + 'static)) -> Verdict {
    if !is_local_rejection(error) && is_transient_error(error) {
        Verdict::Retry {
            reason: "transient error",
            after: None,
        }
    } else {
        Verdict::Failure
    }
}

/// Whether an error (or an error in its `source()` chain) is one the next
/// attempt may not meet: a connection refused, reset, aborted or not
/// connected, a broken pipe, an unexpected end of stream (the connection
/// closed before the answer was complete), a timed-out I/O, an unreachable
/// host or network, or a network down; that is, a [`std::io::Error`] of
/// one of those kinds anywhere in the chain (hyper, hyper-util, reqwest and
/// tonic's transport put the I/O error of a failed connection there). A
/// per-attempt timeout counts too: `tower-deadline`'s `DeadlineExceeded`,
/// and with the `tower` feature tower's `timeout::error::Elapsed`. With the
/// `hyper` feature, hyper's own transient errors (the connection closed
/// before or while the answer came, a request canceled before it was sent,
/// hyper's timeouts); with the `h2` feature, an HTTP/2 stream refused
/// (REFUSED_STREAM) or a GOAWAY with NO_ERROR, both of which say the server
/// did not process the request.
///
/// Everything else is not transient: an invalid URI, a builder error, a
/// TLS or certificate failure (`InvalidData` and friends), a protocol
/// error.
///
/// # Example
///
/// ```
/// use std::io;
/// use tower_retry_budget::policy::is_transient_error;
///
/// assert!(is_transient_error(&io::Error::from(io::ErrorKind::ConnectionRefused)));
/// assert!(!is_transient_error(&io::Error::from(io::ErrorKind::InvalidData)));
/// ```
#[must_use]
pub fn is_transient_error(error: &(dyn Error + 'static)) -> bool {
    use std::io::ErrorKind::*;

    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                ConnectionRefused
                    | ConnectionReset
                    | ConnectionAborted
                    | NotConnected
                    | BrokenPipe
                    | UnexpectedEof
                    | TimedOut
                    | HostUnreachable
                    | NetworkUnreachable
                    | NetworkDown
            ) {
                return true;
            }
        }
        if e.is::<tower_resilience_base::error::DeadlineExceeded>()
            || is_timeout_elapsed(e)
            || crate::known::hyper(e)
            || crate::known::h2(e)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// tower's `timeout::error::Elapsed` (feature `tower`).
#[cfg(feature = "tower")]
fn is_timeout_elapsed(e: &(dyn Error + 'static)) -> bool {
    e.is::<tower::timeout::error::Elapsed>()
}

#[cfg(not(feature = "tower"))]
fn is_timeout_elapsed(_e: &(dyn Error + 'static)) -> bool {
    false
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

/// Parses `Retry-After`: delta seconds (`"120"`) or an HTTP date (`"Wed, 21
/// Oct 2015 07:28:00 GMT"`, and the two obsolete date forms), as a delay
/// from `now`. A date in the past is a zero delay; a malformed value is
/// `None`.
///
/// # Example
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use http::HeaderValue;
/// use tower_retry_budget::policy::parse_retry_after;
///
/// let now = UNIX_EPOCH + Duration::from_secs(1_445_412_470);
/// let secs = HeaderValue::from_static("120");
/// assert_eq!(parse_retry_after(&secs, now), Some(Duration::from_secs(120)));
/// let date = HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT");
/// assert_eq!(parse_retry_after(&date, now), Some(Duration::from_secs(10)));
/// ```
#[must_use]
pub fn parse_retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        // Saturate absurdly long delays rather than failing.
        return Some(Duration::from_secs(text.parse().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Parses `grpc-retry-pushback-ms`: `Some(delay)` for a non-negative integer
/// of milliseconds, `None` (do not retry) for anything else.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use http::HeaderValue;
/// use tower_retry_budget::policy::parse_pushback;
///
/// assert_eq!(parse_pushback(&HeaderValue::from_static("250")), Some(Duration::from_millis(250)));
/// assert_eq!(parse_pushback(&HeaderValue::from_static("-1")), None);
/// ```
#[must_use]
pub fn parse_pushback(value: &HeaderValue) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Duration::from_millis(text.parse().unwrap_or(u64::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (HeaderName::from_static(k), HeaderValue::from_static(v)))
            .collect()
    }

    #[test]
    fn retry_after_forms() {
        let now = UNIX_EPOCH + Duration::from_secs(1_445_412_470);
        let parse = |s: &'static str| parse_retry_after(&HeaderValue::from_static(s), now);
        assert_eq!(parse("0"), Some(Duration::ZERO));
        assert_eq!(parse(" 3 "), Some(Duration::from_secs(3)));
        assert_eq!(
            parse("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::from_secs(10))
        );
        // RFC 850 and asctime forms.
        assert_eq!(
            parse("Wednesday, 21-Oct-15 07:28:00 GMT"),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse("Wed Oct 21 07:28:00 2015"),
            Some(Duration::from_secs(10))
        );
        // In the past: retry now.
        assert_eq!(parse("Wed, 21 Oct 2015 07:00:00 GMT"), Some(Duration::ZERO));
        assert_eq!(parse("-1"), None);
        assert_eq!(parse("soon"), None);
        assert_eq!(parse(""), None);
        assert_eq!(
            parse("99999999999999999999999"),
            Some(Duration::from_secs(u64::MAX))
        );
    }

    #[test]
    fn pushback_forms() {
        let parse = |s: &'static str| parse_pushback(&HeaderValue::from_static(s));
        assert_eq!(parse("0"), Some(Duration::ZERO));
        assert_eq!(parse("1500"), Some(Duration::from_millis(1500)));
        assert_eq!(parse("-5"), None);
        assert_eq!(parse("1.5"), None);
        assert_eq!(parse(""), None);
    }

    #[test]
    fn statuses() {
        let none = HeaderMap::new();
        for code in [502, 503, 504] {
            let status = StatusCode::from_u16(code).unwrap();
            assert!(classify_response(status, &none).is_retryable(), "{code}");
        }
        for code in [400, 401, 403, 404, 409, 422, 429, 500, 501] {
            let status = StatusCode::from_u16(code).unwrap();
            assert_eq!(classify_response(status, &none), Verdict::Failure, "{code}");
        }
        for code in [200, 201, 204, 301, 304] {
            let status = StatusCode::from_u16(code).unwrap();
            assert_eq!(classify_response(status, &none), Verdict::Success, "{code}");
        }
    }

    #[test]
    fn pushback_overrides_retry_after_and_negative_means_never() {
        let h = headers(&[("grpc-retry-pushback-ms", "-1"), ("retry-after", "1")]);
        assert_eq!(
            classify_response(StatusCode::SERVICE_UNAVAILABLE, &h),
            Verdict::Failure
        );
        let h = headers(&[("grpc-status", "14"), ("grpc-retry-pushback-ms", "40")]);
        assert_eq!(
            classify_response(StatusCode::OK, &h),
            Verdict::Retry {
                reason: "grpc unavailable",
                after: Some(Duration::from_millis(40))
            }
        );
        let h = headers(&[("grpc-status", "8")]);
        assert_eq!(classify_response(StatusCode::OK, &h), Verdict::Failure);
        let h = headers(&[("grpc-status", "0")]);
        assert_eq!(classify_response(StatusCode::OK, &h), Verdict::Success);
    }

    /// A per-attempt timeout is transient (the next attempt may be
    /// faster), though `classify_error` never retries a passed deadline.
    #[test]
    fn a_deadline_exceeded_is_transient_but_never_retried_by_default() {
        use tower_resilience_base::error::DeadlineExceeded;

        assert!(is_transient_error(&DeadlineExceeded::new()));
        assert_eq!(classify_error(&DeadlineExceeded::new()), Verdict::Failure);
    }

    #[cfg(feature = "tower")]
    #[test]
    fn towers_timeout_is_a_transient_error() {
        let elapsed = tower::timeout::error::Elapsed::new();
        assert!(is_transient_error(&elapsed));
        assert!(classify_error(&elapsed).is_retryable());
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

            fn classify_response(&self, status: StatusCode, _: &HeaderMap) -> Verdict {
                if status == StatusCode::INTERNAL_SERVER_ERROR {
                    Verdict::Retry {
                        reason: "500",
                        after: None,
                    }
                } else {
                    Verdict::Success
                }
            }

            fn classify_error(&self, _: &(dyn Error + 'static)) -> Verdict {
                Verdict::Failure
            }
        }

        fn answers<P: Policy>(policy: &P) -> (bool, bool, Verdict, Verdict) {
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
        let retry_500 = Verdict::Retry {
            reason: "500",
            after: None,
        };
        assert_eq!(direct, (true, false, retry_500, Verdict::Failure));
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
        let keyed = headers(&[("idempotency-key", "abc")]);
        assert!(is_idempotent(&Method::POST, &keyed));
    }
}
