use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderName, HeaderValue, Request, Response};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_resilience_base::clock::CoarseClock;
use tower_resilience_base::grpc::is_grpc;
use tower_resilience_base::CallContext;
use tower_service::Service;

use crate::body::{BodyEnd, Extent, Head};
use crate::codec;
use crate::error::InsufficientBudget;
use crate::future::ClientResponseFuture;
use crate::metrics::ClientMetrics;
use crate::server::{DEFAULT_HTTP_HEADER, GRPC_TIMEOUT};
use crate::{BoxError, Deadline};

/// Propagates and enforces the deadline on outgoing calls; a [`Layer`] that
/// produces [`ClientDeadline`].
///
/// Defaults: no default timeout (a call with no deadline in scope runs
/// unbounded), no network margin, fail fast only when nothing is left,
/// [`DEFAULT_HTTP_HEADER`] on plain HTTP requests and `grpc-timeout` on
/// gRPC requests.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_deadline::ClientDeadlineLayer;
///
/// let layer = ClientDeadlineLayer::new()
///     .default_timeout(Duration::from_secs(2))
///     .margin(Duration::from_millis(5))
///     .min_remaining(Duration::from_millis(10));
/// # let _ = layer;
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct ClientDeadlineLayer<E = BodyEnd> {
    config: ClientConfig,
    _extent: PhantomData<fn() -> E>,
}

#[derive(Debug, Clone)]
struct ClientConfig {
    /// Whether to write the budget on the request (else enforce only).
    propagate: bool,
    http_header: Option<HeaderName>,
    grpc_timeout: bool,
    default_timeout: Option<Duration>,
    /// The default timeout that changes at run time, when set: it replaces
    /// `default_timeout`.
    live_timeout: Option<TimeoutHandle>,
    margin: Duration,
    min_remaining: Duration,
    /// The `dependency` label of the layer's metrics (`default` when
    /// `None`).
    name: Option<Arc<str>>,
    /// The coarse clock to read instead of the real one, if any.
    coarse: Option<&'static CoarseClock>,
}

/// Middleware that gives each outgoing request the caller's remaining
/// budget and cuts the call when it runs out.
///
/// For each request it:
///
/// 1. takes the effective deadline: the earliest of the call's deadline in
///    the [`CallContext`] (set by a `ClientDeadline` above, through a retry
///    layer), a [`Deadline`] in the request's extensions, the task-local
///    [`Deadline::current`] (set while a
///    [`ServerDeadline`](crate::ServerDeadline) serves a request), now
///    plus the default timeout, if configured, and, when no layer above set
///    a deadline, now plus a budget already written in the request's own
///    header (`grpc-timeout` on gRPC requests, as tonic's
///    `Request::set_timeout` does; the millisecond header on others; the
///    shortest valid value when it was sent twice or as a comma-separated
///    list, malformed values skipped); with none of them, the request
///    passes through untouched, except that a budget header with no valid
///    value (`x-request-timeout-ms: banana`) is removed rather than
///    forwarded;
/// 2. fails with [`InsufficientBudget`] without calling the inner service
///    when less than the minimum remains (or the deadline has passed);
/// 3. writes the remaining budget less the margin into `grpc-timeout` (gRPC
///    requests, rounded up by the codec's rules) or into the HTTP header
///    (other requests, whole milliseconds rounded down), replacing any
///    value already there, unless built with
///    [`enforce_only`](ClientDeadlineLayer::enforce_only); this happens in
///    `call`, at the moment the request is sent, so a layer placed below a
///    retry layer writes a fresh value for every attempt;
/// 4. calls the inner service with the deadline in the [`CallContext`], so
///    the layers below (a retry layer, a per-attempt `ClientDeadline`) know
///    it without an entry in the request's extensions;
/// 5. when the deadline passes first, drops the inner future (cancelling
///    the request) and fails with
///    [`DeadlineExceeded`](crate::error::DeadlineExceeded); when the head
///    comes in time, goes on enforcing the deadline over the response body
///    ([`ResponseBody`](crate::body::ResponseBody): a body still being read when the deadline passes
///    fails with `DeadlineExceeded` on its next poll; see
///    [`head_only`](ClientDeadlineLayer::head_only)). The timer is
///    armed only if the inner future (or body) does not answer at once. A
///    per-attempt layer arms its own timer even for the deadline a layer
///    above enforces: its `DeadlineExceeded` is what tells a retry layer
///    and a breaker between them that the attempt timed out (the outer
///    layer's expiry would only drop them, which they count as a
///    cancellation).
///
/// # Clone
///
/// Clones share nothing but the configuration.
#[derive(Debug, Clone)]
pub struct ClientDeadline<S, E = BodyEnd> {
    inner: S,
    /// The configuration and the metrics' handles, shared by the clones: a
    /// client that hands every request its own copy of the stack (a
    /// `reqwest` or `tonic` client, `oneshot` on a clone) pays one
    /// reference count per clone, not a copy of the configuration.
    shared: Arc<ClientShared>,
    _extent: PhantomData<fn() -> E>,
}

/// What the clones of one [`ClientDeadline`] share.
#[derive(Debug)]
struct ClientShared {
    config: ClientConfig,
    metrics: ClientMetrics,
}

// === impl ClientConfig ===

impl ClientConfig {
    #[inline]
    fn default_timeout(&self) -> Option<Duration> {
        match &self.live_timeout {
            Some(live) => live.get(),
            None => self.default_timeout,
        }
    }
}

/// A default timeout that changes while the layers that read it run
/// ([`ClientDeadlineLayer::timeout_handle`]). Clones share it.
#[derive(Clone)]
pub struct TimeoutHandle(Arc<std::sync::atomic::AtomicU64>);

/// `TimeoutHandle`'s "no timeout".
const NO_TIMEOUT: u64 = u64::MAX;

impl TimeoutHandle {
    /// A handle holding `timeout` (`None`: no default timeout).
    #[must_use]
    pub fn new(timeout: Option<Duration>) -> Self {
        Self(Arc::new(std::sync::atomic::AtomicU64::new(Self::encode(
            timeout,
        ))))
    }

    fn encode(timeout: Option<Duration>) -> u64 {
        timeout.map_or(NO_TIMEOUT, |t| {
            u64::try_from(t.as_nanos())
                .unwrap_or(NO_TIMEOUT - 1)
                .min(NO_TIMEOUT - 1)
        })
    }

    /// The timeout now.
    #[must_use]
    #[inline]
    pub fn get(&self) -> Option<Duration> {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            NO_TIMEOUT => None,
            nanos => Some(Duration::from_nanos(nanos)),
        }
    }

    /// Sets it, for the calls that start from now on.
    pub fn set(&self, timeout: Option<Duration>) {
        self.0
            .store(Self::encode(timeout), std::sync::atomic::Ordering::Relaxed);
    }
}

impl fmt::Debug for TimeoutHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TimeoutHandle").field(&self.get()).finish()
    }
}

// === impl ClientDeadlineLayer ===

impl ClientDeadlineLayer {
    /// A layer with the defaults listed on [`ClientDeadlineLayer`].
    pub const fn new() -> Self {
        Self {
            config: ClientConfig {
                propagate: true,
                http_header: Some(DEFAULT_HTTP_HEADER),
                grpc_timeout: true,
                default_timeout: None,
                live_timeout: None,
                margin: Duration::ZERO,
                min_remaining: Duration::ZERO,
                name: None,
                coarse: None,
            },
            _extent: PhantomData,
        }
    }
}

impl<E> ClientDeadlineLayer<E> {
    /// The header that carries the budget in milliseconds on plain HTTP
    /// requests (default [`DEFAULT_HTTP_HEADER`]).
    pub fn http_header(mut self, name: HeaderName) -> Self {
        self.config.http_header = Some(name);
        self
    }

    /// Do not write a millisecond header on plain HTTP requests (the
    /// deadline is still enforced locally).
    pub fn no_http_header(mut self) -> Self {
        self.config.http_header = None;
        self
    }

    /// Enforce the deadline without writing it on the request: for the
    /// outer layer of a stack whose per-attempt `ClientDeadline` (below the
    /// retry layer) writes a fresh budget on every attempt. The outer layer
    /// then does no work for a call that a breaker or bulkhead between them
    /// refuses. [`tower_shield::client_stack`]-built stacks do this.
    ///
    /// [`tower_shield::client_stack`]: https://docs.rs/tower-shield
    pub const fn enforce_only(mut self) -> Self {
        self.config.propagate = false;
        self
    }

    /// Stop enforcing the deadline when the response head arrives: the
    /// response body is then the inner service's own, not wrapped and not
    /// bounded by this layer (by default it is a
    /// [`ResponseBody`](crate::body::ResponseBody), bounded until the body
    /// ends); the layer's type says so ([`Head`]).
    ///
    /// Only for the outer layer of a stack whose per-attempt
    /// `ClientDeadline` below already bounds the body by the same or an
    /// earlier deadline: the outer timer would be a second one for the same
    /// instant. `tower_shield::client_stack` builds its outer layer this
    /// way. Alone, a head-only deadline leaves a caller waiting for ever on
    /// a body that stalls after the head.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_deadline::ClientDeadlineLayer;
    ///
    /// // The outer layer of a hand-built stack; the per-attempt layer
    /// // below (ClientDeadlineLayer::new()) bounds the body.
    /// let outer = ClientDeadlineLayer::new()
    ///     .default_timeout(Duration::from_secs(2))
    ///     .enforce_only()
    ///     .head_only();
    /// # let _ = outer;
    /// ```
    pub fn head_only(self) -> ClientDeadlineLayer<Head> {
        ClientDeadlineLayer {
            config: self.config,
            _extent: PhantomData,
        }
    }

    /// Whether to write `grpc-timeout` on gRPC requests (default: yes).
    pub const fn grpc_timeout(mut self, write: bool) -> Self {
        self.config.grpc_timeout = write;
        self
    }

    /// A timeout for calls made with no deadline in scope, and an upper
    /// bound for those made with one (default: none).
    pub const fn default_timeout(mut self, timeout: Duration) -> Self {
        self.config.default_timeout = Some(timeout);
        self
    }

    /// Take the default timeout from `handle`, which changes it at run
    /// time for this layer and every service it built (it replaces
    /// [`default_timeout`](Self::default_timeout)). A call reads it as it
    /// starts: calls in flight keep the deadline they were given.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_deadline::{ClientDeadlineLayer, TimeoutHandle};
    ///
    /// let timeout = TimeoutHandle::new(Some(Duration::from_secs(2)));
    /// let layer = ClientDeadlineLayer::new().timeout_handle(timeout.clone());
    /// // Later, from a settings reload:
    /// timeout.set(Some(Duration::from_millis(800)));
    /// # let _ = layer;
    /// ```
    pub fn timeout_handle(mut self, handle: TimeoutHandle) -> Self {
        self.config.live_timeout = Some(handle);
        self
    }

    /// Time subtracted from the budget written into the header, to leave
    /// room for the network and for this side to receive the answer
    /// (default: zero). It does not shorten the local enforcement.
    pub const fn margin(mut self, margin: Duration) -> Self {
        self.config.margin = margin;
        self
    }

    /// Names the dependency this layer calls (default `default`): the
    /// `dependency` label of what the layer records with the `metrics`
    /// feature (see the crate's `metrics` module); without the feature the
    /// name is kept but unused.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_deadline::ClientDeadlineLayer;
    ///
    /// let layer = ClientDeadlineLayer::new().name("inventory");
    /// # let _ = layer;
    /// ```
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.config.name = Some(name.into());
        self
    }

    /// Read the time from a coarse clock (off by default): a reading of the
    /// real clock that one background thread per process advances every
    /// millisecond ([`CoarseClock`]), one atomic load instead of a clock
    /// read (about 20 ns on a virtual machine). The reading is also the one
    /// this layer hands to the layers below (`CallContext::now`), so in the
    /// recommended stack (`client_stack(..).coarse_clock(true)` in
    /// `tower-breaker`) a call, or a rejection while the circuit is open,
    /// reads no real clock.
    ///
    /// Its error: a reading is never ahead of the real clock and lags it by
    /// at most a millisecond plus the delay the operating system adds to
    /// the clock thread's wake-ups. So a deadline this layer sets from a
    /// timeout is up to that lag early (the call is cut early, never late),
    /// and the budget written on the wire may be up to that lag more than
    /// what is really left (the callee may work up to that lag past the
    /// caller's deadline). Use it with timeouts of tens of milliseconds or
    /// more.
    ///
    /// The coarse clock follows the real clock, not tokio's paused test
    /// clock: a layer that uses it does not see `tokio::time::advance`. If
    /// its thread cannot be started, the layer reads the real clock.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_deadline::ClientDeadlineLayer;
    ///
    /// let layer = ClientDeadlineLayer::new()
    ///     .default_timeout(Duration::from_secs(2))
    ///     .coarse_clock(true);
    /// # let _ = layer;
    /// ```
    pub fn coarse_clock(mut self, on: bool) -> Self {
        self.config.coarse = if on { CoarseClock::shared() } else { None };
        self
    }

    /// The least budget worth starting a call with (default: zero, only an
    /// expired deadline fails fast).
    pub const fn min_remaining(mut self, min: Duration) -> Self {
        self.config.min_remaining = min;
        self
    }
}

impl Default for ClientDeadlineLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S, E> Layer<S> for ClientDeadlineLayer<E> {
    type Service = ClientDeadline<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        ClientDeadline {
            inner,
            shared: Arc::new(ClientShared {
                config: self.config.clone(),
                metrics: ClientMetrics::new(self.config.name.as_deref().unwrap_or("default")),
            }),
            _extent: PhantomData,
        }
    }
}

// === impl ClientConfig ===

impl ClientConfig {
    /// The budget already written in the request's own header (the one
    /// this layer would write): the shortest valid value, when the header
    /// was sent twice or holds a comma-separated list; malformed values are
    /// skipped.
    ///
    /// A header with no valid value at all is removed, so it is never
    /// forwarded: with a deadline from another source the layer writes a
    /// fresh value in its place, and with none the callee sees no budget
    /// rather than one it cannot read. A header with at least one valid
    /// value is left for `write_budget` to replace (an `enforce_only`
    /// layer writes nothing and leaves it as it is; a server reading it
    /// takes its shortest valid value).
    fn header_budget<B>(&self, request: &mut Request<B>, grpc: bool) -> Option<Duration> {
        let (name, parse): (&HeaderName, fn(&[u8]) -> _) = if grpc {
            if !self.grpc_timeout {
                return None;
            }
            (&GRPC_TIMEOUT, codec::parse_grpc_timeout)
        } else {
            (self.http_header.as_ref()?, codec::parse_millis)
        };
        let headers = request.headers_mut();
        if headers.is_empty() || !headers.contains_key(name) {
            // The common case: no budget written by the caller.
            return None;
        }
        let values = headers.get_all(name).iter().map(HeaderValue::as_bytes);
        let list = codec::parse_list(values, parse);
        if let (None, Some(e)) = (list.shortest(), list.malformed()) {
            tracing::debug!(header = %name, error = %e, "removing a malformed budget header");
            headers.remove(name);
        }
        list.shortest()
    }
}

// === impl ClientDeadline ===

impl<S> ClientDeadline<S> {
    /// Wraps `inner` with the default configuration of
    /// [`ClientDeadlineLayer::new`].
    pub fn new(inner: S) -> Self {
        ClientDeadlineLayer::new().layer(inner)
    }

    /// A layer that wraps services in [`ClientDeadline`]; the same as
    /// [`ClientDeadlineLayer::new`].
    pub const fn layer() -> ClientDeadlineLayer {
        ClientDeadlineLayer::new()
    }
}

impl<S, E> ClientDeadline<S, E> {
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

impl<S, B, RB, E> Service<Request<B>> for ClientDeadline<S, E>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    E: Extent,
{
    type Response = Response<E::Body<RB>>;
    type Error = BoxError;
    type Future = ClientResponseFuture<S::Future, E>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let ClientShared { config, metrics } = &*self.shared;
        let (above, enforced_above, now) =
            CallContext::current(|cx| (cx.deadline(), cx.is_enforced(), cx.now()));
        let grpc = is_grpc(request.headers());
        let (from_request, from_header, in_scope) = if enforced_above {
            // A `ClientDeadline` above already took the earliest of the
            // request's extension, its header and the task-local deadline.
            (None, None, None)
        } else {
            let from_request = Deadline::from_extensions(request.extensions());
            // A budget the caller wrote into the request itself (tonic's
            // `Request::set_timeout` writes `grpc-timeout`) is one more
            // deadline. When a layer above set the deadline, the header, if
            // any, was written from it and is not read again.
            let from_header = if above.is_none() && from_request.is_none() {
                config.header_budget(&mut request, grpc)
            } else {
                None
            };
            (from_request, from_header, Deadline::current())
        };
        if above.is_none()
            && from_request.is_none()
            && from_header.is_none()
            && in_scope.is_none()
            && config.default_timeout().is_none()
        {
            return ClientResponseFuture::unbounded(self.inner.call(request));
        }
        // One clock reading per call: the one a layer above made, if any.
        let now = now.unwrap_or_else(|| config.coarse.map_or_else(Instant::now, CoarseClock::now));
        let by_default = config
            .default_timeout()
            .map(|t| Deadline::after_from(now, t));
        let by_header = from_header.map(|t| Deadline::after_from(now, t));
        // At least one is Some, checked above.
        let Some(deadline) = [above, from_request, by_header, in_scope, by_default]
            .into_iter()
            .flatten()
            .min()
        else {
            return ClientResponseFuture::unbounded(self.inner.call(request));
        };
        let remaining = deadline.remaining_at(now);
        if remaining.is_zero() || remaining < config.min_remaining {
            metrics.rejected();
            return ClientResponseFuture::refused(InsufficientBudget::new(
                remaining,
                config.min_remaining,
            ));
        }
        if config.propagate {
            write_budget(
                config,
                &mut request,
                grpc,
                remaining.saturating_sub(config.margin),
            );
        }
        let inner = &mut self.inner;
        let expiry = metrics.expiry();
        // Armed even when a layer above enforces the same deadline: this
        // layer's `DeadlineExceeded` is how the layers in between (a retry
        // layer, a breaker's attempt hook) learn that the attempt timed out;
        // the outer layer's expiry would only drop them, as a cancellation.
        // (Built inside the scope so the inner future is written in place,
        // not moved: a deep stack's futures are hundreds of bytes.)
        CallContext::scoped(
            |cx| {
                cx.set_deadline(deadline, true);
                cx.set_now(now);
            },
            || ClientResponseFuture::bounded(deadline, inner.call(request), expiry),
        )
    }
}

/// Writes `budget` into the request's budget header: `grpc-timeout` on gRPC
/// requests, the millisecond header on others. One allocation, for the
/// value (the header map owns its bytes).
fn write_budget<B>(config: &ClientConfig, request: &mut Request<B>, grpc: bool, budget: Duration) {
    if grpc {
        if config.grpc_timeout {
            let mut buf = [0; codec::GRPC_TIMEOUT_MAX_DIGITS + 1];
            let len = codec::write_grpc_timeout(budget, &mut buf);
            // Digits and a unit letter: always a valid header value.
            if let Ok(value) = HeaderValue::from_bytes(&buf[..len]) {
                request.headers_mut().insert(GRPC_TIMEOUT, value);
            }
        }
    } else if let Some(name) = &config.http_header {
        let millis = u64::try_from(budget.as_millis()).unwrap_or(u64::MAX);
        let mut buf = [0; 20];
        let digits = codec::write_decimal(millis, &mut buf);
        // `from_bytes` copies into an exactly sized buffer: one
        // allocation, where `HeaderValue::from(u64)` makes two.
        if let Ok(value) = HeaderValue::from_bytes(digits) {
            request.headers_mut().insert(name.clone(), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::{Request, Response};
    use tower::{service_fn, ServiceExt};

    use super::*;

    #[tokio::test]
    async fn the_coarse_clock_sets_the_deadline_and_the_reading_below() {
        let clock = CoarseClock::manual();
        // An hour ahead of the real clock: whichever clock the layer read
        // shows in what the inner service sees.
        clock.advance(Duration::from_secs(3600));
        let mut layer = ClientDeadlineLayer::new().default_timeout(Duration::from_secs(2));
        layer.config.coarse = Some(clock);
        let svc = layer.layer(service_fn(|req: Request<()>| {
            // Read during `call`, where the context lives.
            let seen = CallContext::current(|cx| (cx.now(), cx.deadline()));
            let header = req.headers().get("x-request-timeout-ms").cloned();
            std::future::ready(Ok::<_, BoxError>(Response::new((seen, header))))
        }));
        let ((now, deadline), header) = svc
            .oneshot(Request::new(()))
            .await
            .unwrap()
            .into_body()
            .into_inner();
        assert_eq!(now, Some(clock.now()), "the coarse reading is handed down");
        assert_eq!(
            deadline.map(Deadline::instant),
            Some(clock.now() + Duration::from_secs(2))
        );
        assert_eq!(
            header.unwrap(),
            "2000",
            "the budget from the coarse reading"
        );
    }
}
