use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderName, Request, Response};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use crate::codec::{self, MalformedTimeout};
use crate::future::ServerResponseFuture;
use crate::Deadline;
use tower_resilience_base::grpc::is_grpc;
use tower_resilience_base::Answer;

/// The default header carrying a relative budget in milliseconds on plain
/// HTTP requests: `x-request-timeout-ms`.
pub const DEFAULT_HTTP_HEADER: HeaderName = HeaderName::from_static("x-request-timeout-ms");

/// How much earlier than the caller's deadline a gRPC request expires by
/// default: one tick of tokio's timer. See
/// [`ServerDeadlineLayer::grpc_lead`].
pub const DEFAULT_GRPC_LEAD: Duration = Duration::from_millis(1);

/// The gRPC timeout header, `grpc-timeout`.
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// What the server layer does with a budget header it cannot parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnMalformed {
    /// Log the problem at `DEBUG` level (the value comes from the network,
    /// so a louder level would let any client flood the logs) and carry on
    /// as if the header were absent: the default budget, if any, applies.
    #[default]
    Ignore,
    /// Answer at once with `400 Bad Request`, or for gRPC requests a
    /// trailers-only response with `grpc-status: 3` (INVALID_ARGUMENT); the
    /// inner service is not called.
    Reject,
}

/// Reads the caller's budget from each request and enforces it on the
/// inner service; a [`Layer`] that produces [`ServerDeadline`].
///
/// Defaults: reads `grpc-timeout` and [`DEFAULT_HTTP_HEADER`]; no default
/// budget (requests without a header run unbounded); no maximum; fail fast
/// only when nothing is left; malformed values are ignored.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_deadline::{OnMalformed, ServerDeadlineLayer};
///
/// let layer = ServerDeadlineLayer::new()
///     .default_timeout(Duration::from_secs(10))
///     .max_timeout(Duration::from_secs(30))
///     .min_remaining(Duration::from_millis(5))
///     .on_malformed(OnMalformed::Reject);
/// # let _ = layer;
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct ServerDeadlineLayer {
    config: ServerConfig,
}

#[derive(Debug, Clone)]
struct ServerConfig {
    http_header: Option<HeaderName>,
    grpc_timeout: bool,
    default_timeout: Option<Duration>,
    max_timeout: Option<Duration>,
    min_remaining: Duration,
    on_malformed: OnMalformed,
    grpc_lead: Duration,
}

/// Middleware that turns the caller's budget into a [`Deadline`] and
/// enforces it on the inner service.
///
/// For each request it:
///
/// 1. reads the budget from `grpc-timeout` and from the configured HTTP
///    header (relative milliseconds); when both are present the shorter
///    wins; when neither is, the default budget applies, if configured;
/// 2. clamps it to the maximum, and takes the earlier of it and any
///    [`Deadline`] already in the request's extensions;
/// 3. fails fast with `504` (gRPC: `grpc-status: 4`) without calling the
///    inner service when less than the minimum remains;
/// 4. inserts the deadline into the request's extensions and calls the
///    inner service inside a task-local scope, so that
///    [`Deadline::current`] and [`ClientDeadline`](crate::ClientDeadline)
///    see it for the whole handler;
/// 5. when the deadline passes first, drops the inner future (cancelling
///    the handler and whatever it was waiting for) and answers `504`, or
///    for gRPC an HTTP 200 trailers-only response with `grpc-status: 4`
///    (DEADLINE_EXCEEDED).
///
/// Rejections are responses, not errors: the inner error type passes
/// through unchanged, so the layer works with `axum::Router::layer` as is.
/// The response body type must implement [`Default`] (the answers have an
/// empty body), as axum's and tonic's bodies do.
///
/// # Clone
///
/// Clones share nothing but the configuration; there is no shared state.
#[derive(Debug, Clone)]
pub struct ServerDeadline<S> {
    inner: S,
    config: ServerConfig,
}

/// What the server layer decided for one request, before calling the inner
/// service.
enum Decision<B> {
    /// Call the inner service, with this deadline if any; the flag says
    /// whether the request is a gRPC call.
    Run(Option<Deadline>, bool),
    Answer(Response<B>),
}

// === impl ServerDeadlineLayer ===

impl ServerDeadlineLayer {
    /// A layer with the defaults listed on [`ServerDeadlineLayer`].
    pub const fn new() -> Self {
        Self {
            config: ServerConfig {
                http_header: Some(DEFAULT_HTTP_HEADER),
                grpc_timeout: true,
                default_timeout: None,
                max_timeout: None,
                min_remaining: Duration::ZERO,
                on_malformed: OnMalformed::Ignore,
                grpc_lead: DEFAULT_GRPC_LEAD,
            },
        }
    }

    /// The header to read a relative budget in milliseconds from (default
    /// [`DEFAULT_HTTP_HEADER`]). It must match the header the caller's
    /// [`ClientDeadlineLayer::http_header`](crate::ClientDeadlineLayer::http_header)
    /// writes.
    pub fn http_header(mut self, name: HeaderName) -> Self {
        self.config.http_header = Some(name);
        self
    }

    /// Do not read any millisecond header: only `grpc-timeout` (if enabled)
    /// and the default budget apply.
    pub fn no_http_header(mut self) -> Self {
        self.config.http_header = None;
        self
    }

    /// Whether to read `grpc-timeout` (default: yes). It is read on any
    /// request that carries it, gRPC or not.
    pub const fn grpc_timeout(mut self, read: bool) -> Self {
        self.config.grpc_timeout = read;
        self
    }

    /// The budget for requests that carry none (default: none, they run
    /// unbounded). It is clamped to the maximum like any other budget.
    pub const fn default_timeout(mut self, budget: Duration) -> Self {
        self.config.default_timeout = Some(budget);
        self
    }

    /// The largest budget a caller may ask for (default: no limit). Larger
    /// budgets are clamped to it, not rejected.
    pub const fn max_timeout(mut self, max: Duration) -> Self {
        self.config.max_timeout = Some(max);
        self
    }

    /// The least budget worth starting the handler with (default: zero,
    /// only an already expired deadline fails fast). Below it, the layer
    /// answers 504 / DEADLINE_EXCEEDED without calling the inner service.
    pub const fn min_remaining(mut self, min: Duration) -> Self {
        self.config.min_remaining = min;
        self
    }

    /// What to do with a budget header that does not parse (default
    /// [`OnMalformed::Ignore`]).
    pub const fn on_malformed(mut self, policy: OnMalformed) -> Self {
        self.config.on_malformed = policy;
        self
    }

    /// How much earlier than the caller's deadline gRPC requests expire
    /// (default [`DEFAULT_GRPC_LEAD`], 1 ms).
    ///
    /// tonic's `Server` runs its own `grpc-timeout` timer *outside* any
    /// layer added with `Server::builder().layer(..)`, started a few
    /// microseconds before this one, and answers CANCELLED when it fires
    /// first. Expiring one timer tick (1 ms) earlier makes this layer's
    /// DEADLINE_EXCEEDED the answer the caller sees. Plain HTTP requests
    /// are not affected.
    pub const fn grpc_lead(mut self, lead: Duration) -> Self {
        self.config.grpc_lead = lead;
        self
    }
}

impl Default for ServerDeadlineLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for ServerDeadlineLayer {
    type Service = ServerDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ServerDeadline {
            inner,
            config: self.config.clone(),
        }
    }
}

// === impl ServerConfig ===

impl ServerConfig {
    fn decide<ReqB, ResB: Default>(&self, request: &Request<ReqB>) -> Decision<ResB> {
        let headers = request.headers();
        let grpc = is_grpc(headers);
        let mut budget: Option<Duration> = None;
        let mut read =
            |name: &HeaderName, parse: fn(&[u8]) -> Result<Duration, MalformedTimeout>| {
                let Some(value) = headers.get(name) else {
                    return Ok(());
                };
                match parse(value.as_bytes()) {
                    Ok(b) => {
                        budget = Some(budget.map_or(b, |prev| prev.min(b)));
                        Ok(())
                    }
                    Err(e) => match self.on_malformed {
                        OnMalformed::Ignore => {
                            tracing::debug!(header = %name, error = %e, "ignoring malformed budget header");
                            Ok(())
                        }
                        OnMalformed::Reject => Err(e),
                    },
                }
            };
        if self.grpc_timeout {
            if let Err(e) = read(&GRPC_TIMEOUT, codec::parse_grpc_timeout) {
                return Decision::Answer(Answer::malformed_timeout(e.reason()).into_response(grpc));
            }
        }
        if let Some(name) = &self.http_header {
            if let Err(e) = read(name, codec::parse_millis) {
                return Decision::Answer(Answer::malformed_timeout(e.reason()).into_response(grpc));
            }
        }

        let Some(mut budget) = budget.or(self.default_timeout) else {
            // No budget from the caller and none by default; an outer layer
            // may still have set one.
            return Decision::Run(Deadline::from_extensions(request.extensions()), grpc);
        };
        if let Some(max) = self.max_timeout {
            budget = budget.min(max);
        }
        if grpc {
            budget = budget.saturating_sub(self.grpc_lead);
        }
        let now = Instant::now();
        let mut deadline = Deadline::after_from(now, budget);
        if let Some(outer) = Deadline::from_extensions(request.extensions()) {
            deadline = deadline.earliest(outer);
        }
        let remaining = deadline.remaining_at(now);
        if remaining.is_zero() || remaining < self.min_remaining {
            tracing::debug!(
                remaining_ms = remaining.as_millis() as u64,
                min_remaining_ms = self.min_remaining.as_millis() as u64,
                "budget too small; failing fast"
            );
            return Decision::Answer(Answer::deadline_exceeded().into_response(grpc));
        }
        Decision::Run(Some(deadline), grpc)
    }
}

// === impl ServerDeadline ===

impl<S> ServerDeadline<S> {
    /// Wraps `inner` with the default configuration of
    /// [`ServerDeadlineLayer::new`].
    pub fn new(inner: S) -> Self {
        ServerDeadlineLayer::new().layer(inner)
    }

    /// A layer that wraps services in [`ServerDeadline`]; the same as
    /// [`ServerDeadlineLayer::new`].
    pub const fn layer() -> ServerDeadlineLayer {
        ServerDeadlineLayer::new()
    }

    /// A reference to the inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// A mutable reference to the inner service.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for ServerDeadline<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ServerResponseFuture<S::Future, ResBody>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        match self.config.decide(&request) {
            Decision::Answer(response) => ServerResponseFuture::answer(response),
            Decision::Run(None, _) => ServerResponseFuture::unbounded(self.inner.call(request)),
            Decision::Run(Some(deadline), grpc) => {
                request.extensions_mut().insert(deadline);
                let inner = &mut self.inner;
                let future = deadline.sync_scope(|| inner.call(request));
                ServerResponseFuture::bounded(deadline, future, grpc)
            }
        }
    }
}
