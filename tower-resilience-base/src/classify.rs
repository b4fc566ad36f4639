//! One judgement of a response or an error, read by every layer: did the
//! dependency answer well, refuse the request, fail, or fail in a way the
//! next attempt may not meet?
//!
//! The circuit breaker asks "did the dependency fail?", the retry and
//! hedging layers ask "may another attempt succeed, and when?". Both are
//! answers to one question, asked once per response: its [`Class`]. A
//! [`Classify`] decides it from the status and headers (the gRPC code is
//! parsed once there) or from an error; the layers map the class to what
//! they need ([`Class::is_failure`] for the breaker,
//! [`Class::is_retryable`] and [`Class::retry_after`] for retries). A retry
//! layer below a breaker hands the class it decided to the breaker with
//! each attempt ([`ResponseView::class`](crate::hook::ResponseView::class)),
//! so the response is judged once, by the rules the two layers share.
//!
//! | answer | class | breaker | retry |
//! |---|---|---|---|
//! | 1xx, 2xx, 3xx; gRPC `OK` | `Success` | success | returned |
//! | 4xx except 429; gRPC codes about the request (`NOT_FOUND`, `INVALID_ARGUMENT`, ...) | `Rejected` | success | returned |
//! | 429 | `Throttled` | success | retried only with `Retry-After` |
//! | 502, 503, 504; gRPC `UNAVAILABLE` | `Transient` | failure | retried |
//! | other 5xx; gRPC `UNKNOWN`, `DEADLINE_EXCEEDED`, `INTERNAL`, `DATA_LOSS`; a negative `grpc-retry-pushback-ms` on a transient failure | `Failed` | failure | returned |
//! | an error the next attempt may not meet ([`is_transient_error`]) | `Transient` | failure | retried |
//! | any other error of the dependency | `Failed` | failure | returned |
//! | a local rejection ([`is_local_rejection`]) | `Local` | not counted | returned |

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderValue, StatusCode};

use crate::error::{is_local_rejection, DeadlineExceeded};
use crate::grpc::{GrpcCode, GRPC_RETRY_PUSHBACK_MS};

/// What a response or an error says about the dependency; see the
/// [module docs](self) for the table of the defaults.
///
/// # Example
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use tower_resilience_base::classify::{classify_response, Class};
///
/// let none = HeaderMap::new();
/// let class = classify_response(StatusCode::SERVICE_UNAVAILABLE, &none);
/// assert_eq!(class, Class::Transient { reason: "503", after: None });
/// assert!(class.is_failure() && class.is_retryable());
/// let class = classify_response(StatusCode::NOT_FOUND, &none);
/// assert_eq!(class, Class::Rejected);
/// assert!(!class.is_failure() && !class.is_retryable());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Class {
    /// The dependency answered well.
    Success,
    /// The dependency answered, and refused the request (a 4xx, a gRPC
    /// status about the request): it is healthy, and the same request
    /// would be refused again.
    Rejected,
    /// The dependency is shedding load (429): healthy, but asking callers
    /// to slow down, after `after` if it said how long.
    Throttled {
        /// The delay the server asked for (`Retry-After`,
        /// `grpc-retry-pushback-ms`), if any.
        after: Option<Duration>,
    },
    /// The dependency failed, and the next attempt would likely fail the
    /// same way (a 500, a gRPC `INTERNAL`, a TLS failure), or the server
    /// asked not to be retried.
    Failed,
    /// The dependency failed in a way the next attempt may not meet (a
    /// 503, a connection refused, a per-attempt timeout).
    Transient {
        /// A short label for logs (`"503"`, `"transient error"`, ...).
        reason: &'static str,
        /// The least delay the server asked for (`Retry-After`,
        /// `grpc-retry-pushback-ms`), if any.
        after: Option<Duration>,
    },
    /// The dependency was not called: a layer of this process refused the
    /// request (an open circuit, a full bulkhead, a spent deadline).
    Local,
}

/// The replaceable rules of what a response or an error says about the
/// dependency.
///
/// Both methods have defaults, the rules in the [module docs](self)
/// ([`classify_response`] and [`classify_error`], public so that a
/// classifier can refine rather than replace them). The retry layer's
/// policy is a `Classify`; the circuit breaker takes one through its
/// `by_class` adapter; one type can therefore judge for both.
///
/// The trait is object safe: `Arc<dyn Classify>` and `Box<dyn Classify>`
/// are classifiers too.
///
/// # Example
///
/// Also treat `500 Internal Server Error` as transient:
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use tower_resilience_base::classify::{self, Class, Classify};
///
/// #[derive(Debug, Clone)]
/// struct Also500;
///
/// impl Classify for Also500 {
///     fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Class {
///         if status == StatusCode::INTERNAL_SERVER_ERROR {
///             return Class::Transient { reason: "500", after: None };
///         }
///         classify::classify_response(status, headers)
///     }
/// }
///
/// let none = HeaderMap::new();
/// assert!(Also500.classify_response(StatusCode::INTERNAL_SERVER_ERROR, &none).is_retryable());
/// assert_eq!(Also500.classify_response(StatusCode::OK, &none), Class::Success);
/// ```
pub trait Classify: Send + Sync + 'static {
    /// The class of a response, from its status and headers. Default:
    /// [`classify_response`].
    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Class {
        classify_response(status, headers)
    }

    /// The class of an error of the inner service. Default:
    /// [`classify_error`].
    fn classify_error(&self, error: &(dyn Error + 'static)) -> Class {
        classify_error(error)
    }
}

/// The default [`Classify`]: the rules of the [module docs](self) and
/// nothing else.
///
/// # Example
///
/// ```
/// use std::io;
/// use tower_resilience_base::classify::{Class, Classify, DefaultClassifier};
///
/// let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
/// assert!(DefaultClassifier.classify_error(&refused).is_retryable());
/// let tls = io::Error::from(io::ErrorKind::InvalidData);
/// assert_eq!(DefaultClassifier.classify_error(&tls), Class::Failed);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultClassifier;

impl Classify for DefaultClassifier {}

impl<C: Classify + ?Sized> Classify for Arc<C> {
    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Class {
        (**self).classify_response(status, headers)
    }

    fn classify_error(&self, error: &(dyn Error + 'static)) -> Class {
        (**self).classify_error(error)
    }
}

impl<C: Classify + ?Sized> Classify for Box<C> {
    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Class {
        (**self).classify_response(status, headers)
    }

    fn classify_error(&self, error: &(dyn Error + 'static)) -> Class {
        (**self).classify_error(error)
    }
}

// === impl Class ===

impl Class {
    /// Whether the dependency failed ([`Failed`](Class::Failed) or
    /// [`Transient`](Class::Transient)): what a circuit breaker counts
    /// against it.
    #[must_use]
    pub const fn is_failure(&self) -> bool {
        matches!(self, Self::Failed | Self::Transient { .. })
    }

    /// Whether another attempt may succeed: a
    /// [`Transient`](Class::Transient) failure, or a
    /// [`Throttled`](Class::Throttled) answer that said how long to wait.
    #[must_use]
    pub const fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Transient { .. } | Self::Throttled { after: Some(_) }
        )
    }

    /// The delay the server asked for before another attempt, if any.
    #[must_use]
    pub const fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Transient { after, .. } | Self::Throttled { after } => *after,
            _ => None,
        }
    }

    /// A short label for logs: the reason of a transient failure, else
    /// the class's name (`"429"` for a throttled answer).
    #[must_use]
    pub const fn reason(&self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Rejected => "rejected",
            Self::Throttled { .. } => "429",
            Self::Failed => "failed",
            Self::Transient { reason, .. } => reason,
            Self::Local => "local rejection",
        }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

/// The default class of a response; see the [module docs](self).
///
/// The gRPC status of a trailers-only answer (in the headers) is parsed
/// once. A status sent in the trailers after a body is not seen: the
/// layers judge the response head. `grpc-retry-pushback-ms` (a negative
/// or malformed value means "do not retry": [`Class::Failed`]) overrides
/// `Retry-After`.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, HeaderValue, StatusCode};
/// use tower_resilience_base::classify::{classify_response, Class};
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(classify_response(StatusCode::TOO_MANY_REQUESTS, &headers), Class::Throttled { after: None });
/// headers.insert("retry-after", HeaderValue::from_static("2"));
/// assert_eq!(
///     classify_response(StatusCode::TOO_MANY_REQUESTS, &headers),
///     Class::Throttled { after: Some(Duration::from_secs(2)) },
/// );
/// let mut grpc = HeaderMap::new();
/// grpc.insert("grpc-status", HeaderValue::from_static("13"));
/// assert_eq!(classify_response(StatusCode::OK, &grpc), Class::Failed);
/// ```
#[must_use]
pub fn classify_response(status: StatusCode, headers: &HeaderMap) -> Class {
    let reason = match status.as_u16() {
        502 => "502",
        503 => "503",
        504 => "504",
        429 => {
            return match server_delay(headers) {
                Ok(after) => Class::Throttled { after },
                Err(Never) => Class::Throttled { after: None },
            }
        }
        400..=499 => return Class::Rejected,
        500..=599 => return Class::Failed,
        _ => match GrpcCode::from_headers(headers) {
            None | Some(GrpcCode::Ok) => return Class::Success,
            Some(code) if code.is_transient() => "grpc unavailable",
            Some(code) if code.is_dependency_failure() => return Class::Failed,
            Some(_) => return Class::Rejected,
        },
    };
    match server_delay(headers) {
        Ok(after) => Class::Transient { reason, after },
        Err(Never) => Class::Failed,
    }
}

/// The server asked never to be retried (a negative or malformed
/// `grpc-retry-pushback-ms`).
struct Never;

/// The delay a server asked for: `grpc-retry-pushback-ms` first, else
/// `Retry-After`.
fn server_delay(headers: &HeaderMap) -> Result<Option<Duration>, Never> {
    if headers.is_empty() {
        return Ok(None);
    }
    match headers.get(GRPC_RETRY_PUSHBACK_MS) {
        Some(value) => parse_pushback(value).map(Some).ok_or(Never),
        None => Ok(headers
            .get(RETRY_AFTER)
            .and_then(|v| parse_retry_after(v, SystemTime::now()))),
    }
}

/// The default class of an error: [`Class::Local`] for a local rejection
/// ([`is_local_rejection`]: the dependency was not called),
/// [`Class::Transient`] for an error the next attempt may not meet
/// ([`is_transient_error`]), [`Class::Failed`] for anything else (an
/// invalid URI, a request the client could not build, a TLS or
/// certificate failure, a protocol error, an unknown error).
///
/// # Example
///
/// ```
/// use std::io;
/// use tower_resilience_base::classify::{classify_error, Class};
/// use tower_resilience_base::error::BulkheadFull;
///
/// let reset = io::Error::from(io::ErrorKind::ConnectionReset);
/// assert!(classify_error(&reset).is_retryable());
/// let bad_uri = "http://exa mple".parse::<http::Uri>().unwrap_err();
/// assert_eq!(classify_error(&bad_uri), Class::Failed);
/// assert_eq!(classify_error(&BulkheadFull::new("db", 8, None)), Class::Local);
/// ```
#[must_use]
pub fn classify_error(error: &(dyn Error + 'static)) -> Class {
    if is_local_rejection(error) {
        Class::Local
    } else if is_transient_error(error) {
        Class::Transient {
            reason: "transient error",
            after: None,
        }
    } else {
        Class::Failed
    }
}

/// Whether an error (or an error in its `source()` chain) is one the next
/// attempt may not meet: a connection refused, reset, aborted or not
/// connected, a broken pipe, an unexpected end of stream (the connection
/// closed before the answer was complete), a timed-out I/O, an unreachable
/// host or network, or a network down; that is, a [`std::io::Error`] of
/// one of those kinds anywhere in the chain (hyper, hyper-util, reqwest and
/// tonic's transport put the I/O error of a failed connection there). A
/// per-attempt timeout counts too: [`DeadlineExceeded`], and with the
/// `tower` feature tower's `timeout::error::Elapsed`. With the `hyper`
/// feature, hyper's own transient errors (the connection closed before or
/// while the answer came, a request canceled before it was sent, hyper's
/// timeouts); with the `h2` feature, an HTTP/2 stream refused
/// (REFUSED_STREAM) or a GOAWAY with NO_ERROR, both of which say the
/// server did not process the request.
///
/// Everything else is not transient: an invalid URI, a builder error, a
/// TLS or certificate failure (`InvalidData` and friends), a protocol
/// error.
///
/// # Example
///
/// ```
/// use std::io;
/// use tower_resilience_base::classify::is_transient_error;
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
        if e.is::<DeadlineExceeded>() || known::elapsed(e) || known::hyper(e) || known::h2(e) {
            return true;
        }
        next = e.source();
    }
    false
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
/// use tower_resilience_base::classify::parse_retry_after;
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
/// use tower_resilience_base::classify::parse_pushback;
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

/// Transient errors of the stacks known by type (features `tower`, `hyper`
/// and `h2`); without the feature, each check says no.
mod known {
    use std::error::Error;

    /// tower's `timeout::error::Elapsed`.
    #[cfg(feature = "tower")]
    pub(super) fn elapsed(e: &(dyn Error + 'static)) -> bool {
        e.is::<tower::timeout::error::Elapsed>()
    }

    #[cfg(not(feature = "tower"))]
    pub(super) fn elapsed(_e: &(dyn Error + 'static)) -> bool {
        false
    }

    /// hyper's own transient errors: the connection closed (before or
    /// while the answer came), the request was canceled before it was
    /// sent, or a timeout of hyper's.
    #[cfg(feature = "hyper")]
    pub(super) fn hyper(e: &(dyn Error + 'static)) -> bool {
        e.downcast_ref::<hyper::Error>().is_some_and(|e| {
            e.is_incomplete_message() || e.is_closed() || e.is_canceled() || e.is_timeout()
        })
    }

    #[cfg(not(feature = "hyper"))]
    pub(super) fn hyper(_e: &(dyn Error + 'static)) -> bool {
        false
    }

    /// HTTP/2 refusals that say the server did not process the request: a
    /// stream reset with REFUSED_STREAM, or a GOAWAY with NO_ERROR (a
    /// graceful shutdown that did not take this stream).
    #[cfg(feature = "h2")]
    pub(super) fn h2(e: &(dyn Error + 'static)) -> bool {
        e.downcast_ref::<h2::Error>()
            .is_some_and(|e| match e.reason() {
                Some(h2::Reason::REFUSED_STREAM) => true,
                Some(h2::Reason::NO_ERROR) => e.is_go_away(),
                _ => false,
            })
    }

    #[cfg(not(feature = "h2"))]
    pub(super) fn h2(_e: &(dyn Error + 'static)) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderName;
    use std::time::UNIX_EPOCH;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (HeaderName::from_static(k), HeaderValue::from_static(v)))
            .collect()
    }

    fn status(code: u16) -> StatusCode {
        StatusCode::from_u16(code).unwrap()
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

    /// Every HTTP status range lands in its class, and the two views of a
    /// class agree: failures for the breaker, retryable for the retries.
    #[test]
    fn statuses() {
        let none = HeaderMap::new();
        for code in [502, 503, 504] {
            let class = classify_response(status(code), &none);
            assert!(class.is_retryable() && class.is_failure(), "{code}");
            assert_eq!(class.reason(), code.to_string(), "{code}");
        }
        for code in [500, 501, 505, 511, 599] {
            assert_eq!(classify_response(status(code), &none), Class::Failed);
        }
        for code in [400, 401, 403, 404, 409, 422, 499] {
            assert_eq!(classify_response(status(code), &none), Class::Rejected);
        }
        let throttled = classify_response(status(429), &none);
        assert_eq!(throttled, Class::Throttled { after: None });
        assert!(!throttled.is_failure() && !throttled.is_retryable());
        for code in [100, 200, 201, 204, 301, 304] {
            assert_eq!(classify_response(status(code), &none), Class::Success);
        }
    }

    #[test]
    fn grpc_codes() {
        let of = |code: &'static str| {
            classify_response(StatusCode::OK, &headers(&[("grpc-status", code)]))
        };
        assert_eq!(of("0"), Class::Success);
        assert_eq!(
            of("14"),
            Class::Transient {
                reason: "grpc unavailable",
                after: None
            }
        );
        for code in ["2", "4", "13", "15", "99"] {
            assert_eq!(of(code), Class::Failed, "{code}");
        }
        for code in ["1", "3", "5", "6", "7", "8", "9", "10", "11", "12", "16"] {
            assert_eq!(of(code), Class::Rejected, "{code}");
        }
    }

    #[test]
    fn pushback_overrides_retry_after_and_negative_means_never() {
        let h = headers(&[("grpc-retry-pushback-ms", "-1"), ("retry-after", "1")]);
        assert_eq!(classify_response(status(503), &h), Class::Failed);
        assert_eq!(
            classify_response(status(429), &h),
            Class::Throttled { after: None }
        );
        let h = headers(&[("grpc-status", "14"), ("grpc-retry-pushback-ms", "40")]);
        let class = classify_response(StatusCode::OK, &h);
        assert_eq!(
            class,
            Class::Transient {
                reason: "grpc unavailable",
                after: Some(Duration::from_millis(40))
            }
        );
        assert_eq!(class.retry_after(), Some(Duration::from_millis(40)));
        let h = headers(&[("retry-after", "2")]);
        let class = classify_response(status(429), &h);
        assert!(class.is_retryable());
        assert_eq!(class.retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(class.to_string(), "429");
    }

    #[test]
    fn errors() {
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(classify_error(&reset).reason(), "transient error");
        let tls = std::io::Error::from(std::io::ErrorKind::InvalidData);
        assert_eq!(classify_error(&tls), Class::Failed);
        let full = crate::error::BulkheadFull::new("db", 1, None);
        assert_eq!(classify_error(&full), Class::Local);
        assert!(!Class::Local.is_failure() && !Class::Local.is_retryable());
        // A per-attempt timeout is transient: the next attempt may be
        // faster.
        assert!(is_transient_error(&DeadlineExceeded::new()));
        // Found anywhere in the source chain.
        let wrapped = crate::error::AttemptsExhausted::new(3, Box::new(reset));
        assert!(is_transient_error(&wrapped));
        assert!(!is_transient_error(&crate::error::AttemptsExhausted::new(
            3,
            Box::new(tls)
        )));
    }

    /// A stream refused by HTTP/2 was not processed: transient. Any other
    /// reset (a protocol error, a reset with NO_ERROR that is not a
    /// GOAWAY) is not.
    #[cfg(feature = "h2")]
    #[test]
    fn an_http2_refusal_is_transient() {
        assert!(is_transient_error(&h2::Error::from(
            h2::Reason::REFUSED_STREAM
        )));
        assert!(!is_transient_error(&h2::Error::from(
            h2::Reason::PROTOCOL_ERROR
        )));
        assert!(!is_transient_error(&h2::Error::from(h2::Reason::NO_ERROR)));
    }

    #[cfg(feature = "tower")]
    #[test]
    fn towers_timeout_is_a_transient_error() {
        let elapsed = tower::timeout::error::Elapsed::new();
        assert!(classify_error(&elapsed).is_retryable());
    }

    /// `Arc` and `Box` of a classifier, `dyn` or not, answer as the
    /// classifier inside, not with the defaults.
    #[test]
    fn shared_and_boxed_classifiers_answer_as_the_classifier_inside() {
        #[derive(Debug)]
        struct Inverted;

        impl Classify for Inverted {
            fn classify_response(&self, status: StatusCode, _: &HeaderMap) -> Class {
                if status.is_success() {
                    Class::Failed
                } else {
                    Class::Success
                }
            }

            fn classify_error(&self, _: &(dyn Error + 'static)) -> Class {
                Class::Success
            }
        }

        fn answers<C: Classify>(c: &C) -> (Class, Class) {
            let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
            (
                c.classify_response(StatusCode::OK, &HeaderMap::new()),
                c.classify_error(&reset),
            )
        }

        let direct = answers(&Inverted);
        assert_eq!(direct, (Class::Failed, Class::Success));
        assert_eq!(answers(&Arc::new(Inverted)), direct);
        let shared: Arc<dyn Classify> = Arc::new(Inverted);
        assert_eq!(answers(&shared), direct);
        let boxed: Box<dyn Classify> = Box::new(Inverted);
        assert_eq!(answers(&boxed), direct);
    }
}
