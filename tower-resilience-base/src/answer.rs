//! The HTTP and gRPC answers of local failures, and the do-not-retry mark.
//!
//! Servers built with axum need layers whose error is `Infallible`, so each
//! server layer turns its rejections into responses; handlers that call a
//! dependency through a client stack turn the stack's errors into
//! responses with [`Answer::for_error`]. Both give the same answers:
//!
//! | failure | HTTP | gRPC (trailers-only) | `Retry-After` (gRPC: `grpc-retry-pushback-ms`) | [`NO_RETRY_HEADER`] |
//! |---|---|---|---|---|
//! | [`CircuitOpen`] | 503 | UNAVAILABLE | until the next probe | yes |
//! | [`BulkheadFull`] | 503 | RESOURCE_EXHAUSTED | the layer's setting (1 s from an error) | yes |
//! | [`Throttled`] | 503 | UNAVAILABLE | – | yes |
//! | [`LocalRejection`] | 503 | UNAVAILABLE | – | yes |
//! | [`DeadlineExceeded`], [`InsufficientBudget`] | 504 | DEADLINE_EXCEEDED | – | if retries were spent |
//! | [`BudgetExhausted`] | 503 | UNAVAILABLE | – | yes |
//! | [`AttemptsExhausted`] | 502 | UNAVAILABLE | – | yes |
//! | [`DeadlineTooClose`] | 504 | DEADLINE_EXCEEDED | – | yes |
//! | any other error of the dependency | 502 | UNAVAILABLE | – | no |
//!
//! A gRPC answer is "trailers-only": HTTP 200 whose header block carries
//! `grpc-status` and `grpc-message`, with an empty body.

use std::error::Error;
use std::time::Duration;

use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, Response, StatusCode};

use crate::error::{
    chain, AttemptsExhausted, BudgetExhausted, BulkheadFull, CircuitOpen, DeadlineExceeded,
    DeadlineTooClose, InsufficientBudget, LocalRejection, Throttled,
};
use crate::grpc::{
    is_grpc, GrpcCode, GRPC_CONTENT_TYPE, GRPC_MESSAGE, GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS,
};

/// `x-tower-no-retry`: the mark on an answer that says "retries for this
/// failure were already spent (or must not be made)": a retry layer of this
/// toolkit that receives it does not retry, and passes the mark on to its
/// own caller, so a chain of services retries in one tier only. Strip it
/// at the edge, from answers to callers that are not yours, with
/// [`strip_no_retry`].
pub const NO_RETRY_HEADER: HeaderName = HeaderName::from_static("x-tower-no-retry");

/// Removes the [`NO_RETRY_HEADER`] mark from a response: for the edge of a
/// system, where answers go to callers that are not part of it (the mark is
/// an internal agreement between tiers).
///
/// # Example
///
/// ```
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_resilience_base::answer::{strip_no_retry, NO_RETRY_HEADER};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // A gateway that forwards a dependency's marked 503.
/// let gateway = service_fn(|_req: http::Request<()>| async {
///     let mut answer = http::Response::new(());
///     *answer.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
///     answer.headers_mut().insert(NO_RETRY_HEADER, http::HeaderValue::from_static("1"));
///     Ok::<_, std::convert::Infallible>(answer)
/// });
/// let edge = ServiceBuilder::new().map_response(strip_no_retry).service(gateway);
/// let answer = edge.oneshot(http::Request::new(())).await.unwrap();
/// assert_eq!(answer.status(), 503);
/// assert!(!answer.headers().contains_key(NO_RETRY_HEADER));
/// # }
/// ```
pub fn strip_no_retry<B>(mut response: Response<B>) -> Response<B> {
    if !response.headers().is_empty() {
        response.headers_mut().remove(NO_RETRY_HEADER);
    }
    response
}

const ONE: HeaderValue = HeaderValue::from_static("1");

/// The response extension that [`Answer::into_response`] puts on every
/// answer it builds: this response was made here, by a layer that refused
/// the request, and says nothing about the service behind it. A classifier
/// (a circuit breaker's, say) counts such a response as neither a success
/// nor a failure; see [`is_local_answer`].
///
/// # Example
///
/// ```
/// use tower_resilience_base::answer::{is_local_answer, LocalAnswer};
///
/// let mut response = http::Response::new(());
/// assert!(!is_local_answer(&response));
/// response.extensions_mut().insert(LocalAnswer);
/// assert!(is_local_answer(&response));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LocalAnswer;

/// Whether `response` was built by a layer of this process that refused the
/// request ([`Answer::into_response`] marks every answer with
/// [`LocalAnswer`]), rather than by the service behind it.
///
/// # Example
///
/// ```
/// use tower_resilience_base::answer::is_local_answer;
/// use tower_resilience_base::error::BulkheadFull;
/// use tower_resilience_base::Answer;
///
/// let full: http::Response<()> = Answer::for_error(&BulkheadFull::new("db", 4, None)).into_response(false);
/// assert_eq!(full.status(), 503);
/// assert!(is_local_answer(&full));
/// assert!(!is_local_answer(&http::Response::new(())));
/// ```
#[must_use]
pub fn is_local_answer<B>(response: &Response<B>) -> bool {
    response.extensions().get::<LocalAnswer>().is_some()
}

/// How long a caller refused by a full bulkhead is told to wait, when the
/// answer is made from the error alone.
const BULKHEAD_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The answer to give a caller for a failure: an HTTP status, a gRPC code
/// and message, an optional `Retry-After` and the optional do-not-retry
/// mark; see the [module docs](self) for the table.
///
/// # Example
///
/// ```
/// use tower_resilience_base::error::BulkheadFull;
/// use tower_resilience_base::Answer;
///
/// let full = BulkheadFull::new("stock", 8, None);
/// let answer = Answer::for_error(&full);
///
/// let http: http::Response<()> = answer.clone().into_response(false);
/// assert_eq!(http.status(), 503);
/// assert_eq!(http.headers()["retry-after"], "1");
///
/// let grpc: http::Response<()> = answer.into_response(true);
/// assert_eq!(grpc.status(), 200);
/// assert_eq!(grpc.headers()["grpc-status"], "8"); // RESOURCE_EXHAUSTED
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    status: StatusCode,
    grpc: GrpcCode,
    message: &'static str,
    retry_after: Option<Duration>,
    no_retry: bool,
    local: bool,
}

// === impl Answer ===

impl Answer {
    /// An answer with HTTP `status`, gRPC `grpc` and `message` (fixed ASCII
    /// text without `%`, sent as `grpc-message`), no `Retry-After` and no
    /// mark.
    #[must_use]
    pub const fn new(status: StatusCode, grpc: GrpcCode, message: &'static str) -> Self {
        Self {
            status,
            grpc,
            message,
            retry_after: None,
            no_retry: false,
            local: true,
        }
    }

    /// This answer with `Retry-After` (whole seconds, rounded up) on HTTP,
    /// `grpc-retry-pushback-ms` (milliseconds) on gRPC.
    #[must_use]
    pub const fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// This answer stands for a service that *was* called and failed (a
    /// handler cut off by its deadline, say): its response will not carry
    /// the [`LocalAnswer`] extension, so classifiers judge it as the
    /// service's own answer.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_resilience_base::answer::is_local_answer;
    /// use tower_resilience_base::Answer;
    ///
    /// let cut: http::Response<()> = Answer::deadline_exceeded().service_called().into_response(false);
    /// assert_eq!(cut.status(), 504);
    /// assert!(!is_local_answer(&cut));
    /// ```
    #[must_use]
    pub const fn service_called(mut self) -> Self {
        self.local = false;
        self
    }

    /// This answer with the [`NO_RETRY_HEADER`] mark.
    #[must_use]
    pub const fn with_no_retry(mut self) -> Self {
        self.no_retry = true;
        self
    }

    /// An open circuit: 503 (UNAVAILABLE), `Retry-After` until the next
    /// probe, marked.
    #[must_use]
    pub fn circuit_open(open: &CircuitOpen) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            GrpcCode::Unavailable,
            "circuit open",
        )
        .with_retry_after(open.retry_after())
        .with_no_retry()
    }

    /// A full bulkhead: 503 (RESOURCE_EXHAUSTED), `Retry-After`, marked.
    #[must_use]
    pub const fn bulkhead_full(retry_after: Duration) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            GrpcCode::ResourceExhausted,
            "bulkhead full",
        )
        .with_retry_after(retry_after)
        .with_no_retry()
    }

    /// A request refused by client-side adaptive throttling
    /// ([`Throttled`]): 503 (UNAVAILABLE), marked, without `Retry-After`
    /// (the throttle rejects a share of requests, not all of them for a
    /// known time).
    ///
    /// # Example
    ///
    /// ```
    /// use tower_resilience_base::error::Throttled;
    /// use tower_resilience_base::Answer;
    ///
    /// let answer = Answer::for_error(&Throttled::new("search", 0.5));
    /// assert_eq!(answer, Answer::throttled());
    /// assert_eq!(answer.status(), 503);
    /// assert!(answer.is_no_retry());
    /// assert_eq!(answer.retry_after(), None);
    /// ```
    #[must_use]
    pub const fn throttled() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            GrpcCode::Unavailable,
            "throttled",
        )
        .with_no_retry()
    }

    /// A passed deadline: 504 (DEADLINE_EXCEEDED).
    #[must_use]
    pub const fn deadline_exceeded() -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            GrpcCode::DeadlineExceeded,
            "deadline exceeded",
        )
    }

    /// A malformed timeout header: 400 (INVALID_ARGUMENT) with `reason`.
    #[must_use]
    pub const fn malformed_timeout(reason: &'static str) -> Self {
        Self::new(StatusCode::BAD_REQUEST, GrpcCode::InvalidArgument, reason)
    }

    /// The answer for an error of a client stack (see the table in the
    /// [module docs](self)): the first error of the toolkit found in the
    /// source chain decides, and the mark is set when a retry layer below
    /// gave up.
    ///
    /// # Example
    ///
    /// ```
    /// use std::io;
    /// use tower_resilience_base::error::{AttemptsExhausted, DeadlineExceeded};
    /// use tower_resilience_base::Answer;
    ///
    /// // Every attempt timed out: the deadline decides, and retries were spent.
    /// let e = AttemptsExhausted::new(3, DeadlineExceeded::new().into());
    /// let answer = Answer::for_error(&e);
    /// assert_eq!(answer.status(), 504);
    /// assert!(answer.is_no_retry());
    ///
    /// // A plain transport error: 502, and the caller may retry it.
    /// let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
    /// let answer = Answer::for_error(&refused);
    /// assert_eq!(answer.status(), 502);
    /// assert!(!answer.is_no_retry());
    /// ```
    #[must_use]
    pub fn for_error(error: &(dyn Error + 'static)) -> Self {
        let mut spent = false;
        let mut budget = false;
        let mut too_close = false;
        for e in chain(error) {
            if let Some(open) = e.downcast_ref::<CircuitOpen>() {
                return Self::circuit_open(open);
            }
            if e.is::<BulkheadFull>() {
                return Self::bulkhead_full(BULKHEAD_RETRY_AFTER);
            }
            if e.is::<Throttled>() {
                return Self::throttled();
            }
            if e.is::<LocalRejection>() {
                return Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    GrpcCode::Unavailable,
                    "rejected locally",
                )
                .with_no_retry();
            }
            if e.is::<DeadlineExceeded>() || e.is::<InsufficientBudget>() {
                let answer = Self::deadline_exceeded();
                return if spent {
                    answer.with_no_retry()
                } else {
                    answer
                };
            }
            if e.is::<BudgetExhausted>() {
                (spent, budget) = (true, true);
            } else if e.is::<DeadlineTooClose>() {
                (spent, too_close) = (true, true);
            } else if e.is::<AttemptsExhausted>() {
                spent = true;
            }
        }
        let answer = if budget {
            Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                GrpcCode::Unavailable,
                "retry budget exhausted",
            )
        } else if too_close {
            Self::deadline_exceeded()
        } else {
            Self::new(
                StatusCode::BAD_GATEWAY,
                GrpcCode::Unavailable,
                "dependency failed",
            )
        };
        if spent {
            answer.with_no_retry()
        } else {
            answer
        }
    }

    /// The HTTP status of the answer.
    #[must_use]
    pub const fn status(&self) -> StatusCode {
        self.status
    }

    /// The gRPC code of the answer.
    #[must_use]
    pub const fn grpc_code(&self) -> GrpcCode {
        self.grpc
    }

    /// The message of the answer (gRPC's `grpc-message`).
    #[must_use]
    pub const fn message(&self) -> &'static str {
        self.message
    }

    /// The `Retry-After` of the answer, if any.
    #[must_use]
    pub const fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Whether the answer carries the [`NO_RETRY_HEADER`] mark.
    #[must_use]
    pub const fn is_no_retry(&self) -> bool {
        self.no_retry
    }

    /// The response: HTTP with the status (and `Retry-After`), or for
    /// `grpc` a trailers-only gRPC answer; both with the mark when set, and
    /// with the [`LocalAnswer`] extension unless the answer stands for a
    /// [called service](Self::service_called).
    #[must_use]
    pub fn into_response<B: Default>(self, grpc: bool) -> Response<B> {
        let mut response = Response::new(B::default());
        if self.local {
            response.extensions_mut().insert(LocalAnswer);
        }
        let headers = response.headers_mut();
        if grpc {
            headers.insert(CONTENT_TYPE, GRPC_CONTENT_TYPE);
            headers.insert(GRPC_STATUS, self.grpc.header_value());
            headers.insert(GRPC_MESSAGE, HeaderValue::from_static(self.message));
            if let Some(after) = self.retry_after {
                let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
                headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(ms));
            }
        } else if let Some(after) = self.retry_after {
            headers.insert(RETRY_AFTER, seconds(after));
        }
        if self.no_retry {
            headers.insert(NO_RETRY_HEADER, ONE);
        }
        if !grpc {
            *response.status_mut() = self.status;
        }
        response
    }

    /// The response for a request with `request_headers`: gRPC when the
    /// request is ([`is_grpc`]), HTTP otherwise.
    #[must_use]
    pub fn into_response_for<B: Default>(self, request_headers: &HeaderMap) -> Response<B> {
        self.into_response(is_grpc(request_headers))
    }
}

/// A `Retry-After` value: whole seconds, rounded up; the usual small values
/// need no allocation.
fn seconds(after: Duration) -> HeaderValue {
    const SMALL: [&str; 11] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10"];
    let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    match SMALL.get(secs as usize) {
        Some(s) => HeaderValue::from_static(s),
        None => HeaderValue::from(secs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BoxError;
    use std::io;

    fn http(answer: Answer) -> Response<()> {
        answer.into_response(false)
    }

    #[test]
    fn retry_after_rounds_up() {
        let open = CircuitOpen::new("x", Duration::from_millis(4001), false);
        let r = http(Answer::circuit_open(&open));
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[RETRY_AFTER], "5");
        assert_eq!(r.headers()[NO_RETRY_HEADER], "1");
        let r = http(Answer::bulkhead_full(Duration::from_secs(30)));
        assert_eq!(r.headers()[RETRY_AFTER], "30");
    }

    #[test]
    fn grpc_answers_are_trailers_only_with_the_code() {
        let r: Response<()> = Answer::deadline_exceeded().into_response(true);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[CONTENT_TYPE], "application/grpc");
        assert_eq!(r.headers()[GRPC_STATUS], "4");
        assert_eq!(r.headers()[GRPC_MESSAGE], "deadline exceeded");
        assert!(r.headers().get(RETRY_AFTER).is_none());
        assert!(r.headers().get(NO_RETRY_HEADER).is_none());
        assert!(r.headers().get(GRPC_RETRY_PUSHBACK_MS).is_none());
    }

    #[test]
    fn grpc_answers_carry_the_retry_delay_as_pushback_in_milliseconds() {
        let open = CircuitOpen::new("x", Duration::from_millis(4001), false);
        let r: Response<()> = Answer::circuit_open(&open).into_response(true);
        assert_eq!(r.headers()[GRPC_STATUS], "14");
        assert_eq!(r.headers()[GRPC_RETRY_PUSHBACK_MS], "4001");
        assert_eq!(r.headers()[NO_RETRY_HEADER], "1");
        assert!(r.headers().get(RETRY_AFTER).is_none(), "HTTP's header only");
        let r: Response<()> = Answer::bulkhead_full(Duration::from_secs(1)).into_response(true);
        assert_eq!(r.headers()[GRPC_STATUS], "8");
        assert_eq!(r.headers()[GRPC_RETRY_PUSHBACK_MS], "1000");
        // HTTP answers keep `Retry-After` and never send the gRPC header.
        let r: Response<()> = Answer::circuit_open(&open).into_response(false);
        assert!(r.headers().get(GRPC_RETRY_PUSHBACK_MS).is_none());
    }

    /// Every row of the module docs' table.
    #[test]
    fn each_error_gets_its_documented_answer() {
        let refused = || -> BoxError { io::Error::from(io::ErrorKind::ConnectionRefused).into() };
        let open = CircuitOpen::new("b", Duration::from_millis(1500), false);
        let cases: Vec<(BoxError, u16, GrpcCode, Option<&str>, bool)> = vec![
            (
                Box::new(open.clone()),
                503,
                GrpcCode::Unavailable,
                Some("2"),
                true,
            ),
            (
                Box::new(AttemptsExhausted::new(2, Box::new(open))),
                503,
                GrpcCode::Unavailable,
                Some("2"),
                true,
            ),
            (
                Box::new(BulkheadFull::new("c", 1, None)),
                503,
                GrpcCode::ResourceExhausted,
                Some("1"),
                true,
            ),
            (
                Box::new(Throttled::new("t", 0.5)),
                503,
                GrpcCode::Unavailable,
                None,
                true,
            ),
            (
                Box::new(LocalRejection::new("shed")),
                503,
                GrpcCode::Unavailable,
                None,
                true,
            ),
            (
                Box::new(DeadlineExceeded::new()),
                504,
                GrpcCode::DeadlineExceeded,
                None,
                false,
            ),
            (
                Box::new(InsufficientBudget::new(Duration::ZERO, Duration::ZERO)),
                504,
                GrpcCode::DeadlineExceeded,
                None,
                false,
            ),
            (
                Box::new(BudgetExhausted::new(1, refused())),
                503,
                GrpcCode::Unavailable,
                None,
                true,
            ),
            (
                Box::new(AttemptsExhausted::new(3, refused())),
                502,
                GrpcCode::Unavailable,
                None,
                true,
            ),
            (
                Box::new(DeadlineTooClose::new(2, refused())),
                504,
                GrpcCode::DeadlineExceeded,
                None,
                true,
            ),
            (refused(), 502, GrpcCode::Unavailable, None, false),
        ];
        for (error, status, code, retry_after, marked) in cases {
            let answer = Answer::for_error(&*error);
            let r = http(answer.clone());
            assert_eq!(r.status().as_u16(), status, "{error}");
            assert_eq!(
                r.headers().get(RETRY_AFTER).map(|v| v.to_str().unwrap()),
                retry_after,
                "{error}"
            );
            assert_eq!(r.headers().contains_key(NO_RETRY_HEADER), marked, "{error}");
            let g: Response<()> = answer.into_response(true);
            assert_eq!(g.headers()[GRPC_STATUS], code.header_value(), "{error}");
            assert_eq!(g.headers().contains_key(NO_RETRY_HEADER), marked, "{error}");
        }
    }
}
