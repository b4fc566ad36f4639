use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderName, HeaderValue, Request, Response};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::ResponseBody;
use crate::codec::{self, BudgetList, MalformedTimeout};
use crate::future::ServerResponseFuture;
use crate::metrics::ServerMetrics;
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

/// The largest budget a caller may ask for when
/// [`ServerDeadlineLayer::max_timeout`] is not set: five minutes.
///
/// Without a limit, `grpc-timeout: 99999999H` (over eleven thousand years)
/// is a valid request for a handler that never has to stop. Five minutes is
/// well above what any interactive caller waits and above the idle timeouts
/// of common proxies and load balancers (typically one to a few minutes), so
/// an honest budget is practically never shortened, yet a bogus or hostile
/// one holds a task, a connection and a slot of concurrency for minutes,
/// not for ever. It only clamps budgets sent by callers: your own
/// [`default_timeout`](ServerDeadlineLayer::default_timeout) is never
/// shortened by a limit you did not set.
pub const DEFAULT_MAX_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// What the server layer does with a budget header it cannot parse.
///
/// A header may carry several values (two lines, or one line with a
/// comma-separated list, which HTTP treats as the same thing); each value is
/// judged on its own, see [`codec::parse_list`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnMalformed {
    /// Log the problem at `DEBUG` level (the value comes from the network,
    /// so a louder level would let any client flood the logs) and carry on
    /// as if the malformed value were absent: the shortest valid value of
    /// the header counts, and when there is none the default budget, if
    /// any, applies.
    #[default]
    Ignore,
    /// Answer at once with `400 Bad Request`, or for gRPC requests a
    /// trailers-only response with `grpc-status: 3` (INVALID_ARGUMENT),
    /// when any value is malformed, even if others are valid; the inner
    /// service is not called.
    ///
    /// More than one `grpc-timeout` value is rejected too, even when every
    /// one is valid: the gRPC protocol allows the header once, and
    /// implementations disagree on which of several they obey (the first,
    /// the last), so a strict server reports the request instead of
    /// guessing. Several values of the millisecond header are accepted and
    /// the shortest counts: it is a plain HTTP header, for which repeated
    /// lines are by definition one list (a proxy that appends its own value
    /// is legal), and the shortest is the reading no hop can lengthen.
    Reject,
}

/// Reads the caller's budget from each request and enforces it on the
/// inner service; a [`Layer`] that produces [`ServerDeadline`].
///
/// Defaults: reads `grpc-timeout` and [`DEFAULT_HTTP_HEADER`]; no default
/// budget (requests without a header run unbounded); budgets sent by
/// callers are clamped to [`DEFAULT_MAX_TIMEOUT`] (five minutes); fail fast
/// only when nothing is left; malformed values are ignored, and of several
/// values the shortest counts.
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
    /// `None`: [`DEFAULT_MAX_TIMEOUT`] for callers' budgets, and no clamp
    /// on the configured default budget.
    max_timeout: Option<Duration>,
    min_remaining: Duration,
    on_malformed: OnMalformed,
    grpc_lead: Duration,
    /// The `service` label of the layer's metrics (`default` when `None`).
    name: Option<Arc<str>>,
}

/// Middleware that turns the caller's budget into a [`Deadline`] and
/// enforces it on the inner service.
///
/// For each request it:
///
/// 1. reads the budget from `grpc-timeout` and from the configured HTTP
///    header (relative milliseconds); every value counts (a header sent
///    twice, or a comma-separated list) and the shortest valid one wins,
///    across both headers; malformed values are skipped or rejected as
///    [`OnMalformed`] says; when no valid value is present, the default
///    budget applies, if configured;
/// 2. clamps it to the maximum ([`DEFAULT_MAX_TIMEOUT`] unless set), and
///    takes the earlier of it and any [`Deadline`] already in the
///    request's extensions;
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
    metrics: ServerMetrics,
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
                name: None,
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
    /// unbounded). It is clamped to a maximum set with
    /// [`max_timeout`](Self::max_timeout), but not to
    /// [`DEFAULT_MAX_TIMEOUT`]: a default you chose is used as given.
    pub const fn default_timeout(mut self, budget: Duration) -> Self {
        self.config.default_timeout = Some(budget);
        self
    }

    /// The largest budget a caller may ask for (default
    /// [`DEFAULT_MAX_TIMEOUT`], five minutes). Larger budgets are clamped to
    /// it, not rejected. Once set, it also clamps the
    /// [`default_timeout`](Self::default_timeout).
    ///
    /// `max_timeout(Duration::MAX)` lifts the limit: a caller's budget is
    /// then used as sent, however large.
    pub const fn max_timeout(mut self, max: Duration) -> Self {
        self.config.max_timeout = Some(max);
        self
    }

    /// Names the service this layer guards (default `default`): the
    /// `service` label of what the layer records with the `metrics`
    /// feature (see the crate's `metrics` module); without the feature the
    /// name is kept but unused.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_deadline::ServerDeadlineLayer;
    ///
    /// let layer = ServerDeadlineLayer::new().name("checkout");
    /// # let _ = layer;
    /// ```
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.config.name = Some(name.into());
        self
    }

    /// The least budget worth starting the handler with (default: zero,
    /// only an already expired deadline fails fast). Below it, the layer
    /// answers 504 / DEADLINE_EXCEEDED without calling the inner service.
    pub const fn min_remaining(mut self, min: Duration) -> Self {
        self.config.min_remaining = min;
        self
    }

    /// What to do with a budget header that does not parse, or (for
    /// `grpc-timeout`, under [`OnMalformed::Reject`]) that carries more than
    /// one value (default [`OnMalformed::Ignore`]).
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
            metrics: ServerMetrics::new(self.config.name.as_deref().unwrap_or("default")),
        }
    }
}

// === impl ServerConfig ===

impl ServerConfig {
    fn decide<ReqB, ResB: Default>(
        &self,
        request: &Request<ReqB>,
        metrics: &ServerMetrics,
    ) -> Decision<ResB> {
        let headers = request.headers();
        let grpc = is_grpc(headers);
        let mut sent: Option<Duration> = None;
        let mut read = |name: &HeaderName,
                        parse: fn(&[u8]) -> Result<Duration, MalformedTimeout>,
                        single: bool| {
            let values = headers.get_all(name).iter().map(HeaderValue::as_bytes);
            let list = codec::parse_list(values, parse);
            let budget = self.judge(name, &list, single)?;
            sent = match (sent, budget) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            Ok(())
        };
        if self.grpc_timeout {
            if let Err(reason) = read(&GRPC_TIMEOUT, codec::parse_grpc_timeout, true) {
                return Decision::Answer(Answer::malformed_timeout(reason).into_response(grpc));
            }
        }
        if let Some(name) = &self.http_header {
            if let Err(reason) = read(name, codec::parse_millis, false) {
                return Decision::Answer(Answer::malformed_timeout(reason).into_response(grpc));
            }
        }

        if let Some(sent) = sent {
            metrics.received(sent);
        }
        let mut budget = match (sent, self.default_timeout) {
            // A caller's budget: clamped to the maximum, the built-in one
            // when none was set.
            (Some(sent), _) => sent.min(self.max_timeout.unwrap_or(DEFAULT_MAX_TIMEOUT)),
            // Our own default: clamped only by a maximum we also chose.
            (None, Some(default)) => self.max_timeout.map_or(default, |max| default.min(max)),
            // No budget from the caller and none by default; an outer layer
            // may still have set one.
            (None, None) => {
                return Decision::Run(Deadline::from_extensions(request.extensions()), grpc);
            }
        };
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
            metrics.rejected();
            return Decision::Answer(Answer::deadline_exceeded().into_response(grpc));
        }
        Decision::Run(Some(deadline), grpc)
    }

    /// The budget one header gives under the malformed-value policy, or the
    /// reason to reject the request. `single` marks a header the protocol
    /// allows once (`grpc-timeout`).
    fn judge(
        &self,
        name: &HeaderName,
        list: &BudgetList,
        single: bool,
    ) -> Result<Option<Duration>, &'static str> {
        match self.on_malformed {
            OnMalformed::Ignore => {
                if let Some(e) = list.malformed() {
                    tracing::debug!(header = %name, error = %e, values = list.len(), "ignoring malformed budget value");
                } else if list.len() > 1 {
                    tracing::debug!(header = %name, values = list.len(), "several budget values; the shortest counts");
                }
                Ok(list.shortest())
            }
            OnMalformed::Reject => {
                let budget = list.strict().map_err(|e| e.reason())?;
                if single && list.len() > 1 {
                    return Err("more than one grpc-timeout value");
                }
                Ok(budget)
            }
        }
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
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ServerResponseFuture<S::Future, ResBody>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        match self.config.decide(&request, &self.metrics) {
            Decision::Answer(response) => ServerResponseFuture::answer(response),
            Decision::Run(None, _) => ServerResponseFuture::unbounded(self.inner.call(request)),
            Decision::Run(Some(deadline), grpc) => {
                request.extensions_mut().insert(deadline);
                let inner = &mut self.inner;
                let future = deadline.sync_scope(|| inner.call(request));
                ServerResponseFuture::bounded(deadline, future, grpc, self.metrics.expiry())
            }
        }
    }
}
