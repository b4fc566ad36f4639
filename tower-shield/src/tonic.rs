//! gRPC clients with `tonic` (feature `tonic`): the client
//! stack over a `tonic::transport::Channel` in one call, and every error of
//! the stack as the right [`Status`].
//!
//! [`ClientStack::tonic`] wraps a channel in the [client stack](crate::stack)
//! and returns a [`TonicStack`], which a generated client takes as it is
//! (`StockClient::new(stack)`):
//!
//! - **bodies:** the retry layer replays a request's encoded message (it
//!   buffers up to its body limit, 64 KiB by default, while the first
//!   attempt sends it); [`TonicBody`] at the bottom hands that replayable
//!   body to the channel as tonic's body type;
//! - **errors:** [`StatusService`] on top turns every error of the stack
//!   into a [`Status`] with [`into_status`], so the generated client's
//!   `Result<_, Status>` carries an open circuit as UNAVAILABLE, a full
//!   bulkhead as RESOURCE_EXHAUSTED, and so on. The typed error stays
//!   reachable as the status's [`source`](std::error::Error::source).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tonic::transport::Channel;
//! use tower_shield::stack::client_stack;
//! use tower_shield::tonic::TonicStack;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // Connected on first use; `Endpoint::connect().await` works the same.
//! let channel = Channel::from_static("http://127.0.0.1:50051").connect_lazy();
//! let stack = client_stack("stock")
//!     .timeout(Duration::from_secs(2))
//!     .concurrency(16);
//! let service: TonicStack<Channel> = stack.tonic(channel);
//! // A generated client takes it as it is: `StockClient::new(service)`;
//! // so does tonic's own client, which generated clients are made of.
//! let mut client = tonic::client::Grpc::new(service);
//! # let _ = &mut client;
//! // The stack keeps its handles: the breaker, the retry counters.
//! assert_eq!(stack.breaker_handle().name(), "stock");
//! # }
//! ```
//!
//! # Statuses
//!
//! [`into_status`] (and [`StatusService`], which calls it) decides with
//! the toolkit's own answers ([`Answer::for_error`](crate::Answer::for_error),
//! which servers already send for the same failures), so a client and a
//! server of this toolkit say the same thing about the same failure. The
//! message is the error's `Display`; the typed error is the status's
//! `source`.
//!
//! | error of the stack | code | metadata |
//! |---|---|---|
//! | a [`Status`] (from a layer or transport that produced one) | unchanged | unchanged |
//! | [`CircuitOpen`] | UNAVAILABLE | `grpc-retry-pushback-ms`: until the next probe; `x-tower-no-retry: 1` |
//! | [`BulkheadFull`] | RESOURCE_EXHAUSTED | `grpc-retry-pushback-ms: 1000`; `x-tower-no-retry: 1` |
//! | [`LocalRejection`] (your own load shedder) | UNAVAILABLE | `x-tower-no-retry: 1` |
//! | [`DeadlineExceeded`], [`InsufficientBudget`] (too little left to start) | DEADLINE_EXCEEDED | – |
//! | [`AttemptsExhausted`], [`BudgetExhausted`], [`DeadlineTooClose`] around a [`Status`] | the last attempt's status, its code, message, details and metadata | plus `grpc-retry-pushback-ms: -1`, `x-tower-no-retry: 1` |
//! | `AttemptsExhausted` around another error | UNAVAILABLE | `grpc-retry-pushback-ms: -1`; `x-tower-no-retry: 1` |
//! | `BudgetExhausted` around another error | UNAVAILABLE | `grpc-retry-pushback-ms: -1`; `x-tower-no-retry: 1` |
//! | `DeadlineTooClose` around another error | DEADLINE_EXCEEDED | `grpc-retry-pushback-ms: -1`; `x-tower-no-retry: 1` |
//! | any of the three around an open circuit or a full bulkhead | as that error's row | as that error's row |
//! | any of the three around a passed deadline | DEADLINE_EXCEEDED | `grpc-retry-pushback-ms: -1`; `x-tower-no-retry: 1` |
//! | a transport error tonic recognises (connection refused, an HTTP/2 error, ...) | tonic's own code ([`Status::from_error`]) | – |
//! | another error whose kind says a new attempt may succeed (reset, refused, timed out) | UNAVAILABLE | – |
//! | anything else | UNKNOWN | – |
//!
//! `grpc-retry-pushback-ms` is gRPC's own retry information: a delay
//! before the next attempt, or a negative value for "do not retry" (what
//! the retry layer also writes on a gRPC answer it gave up on).
//! `x-tower-no-retry` is the toolkit's do-not-retry mark
//! ([`NO_RETRY_HEADER`]): a service that answers its own caller with the
//! status it received passes both on, so the tiers above do not retry a
//! failure whose retries were already spent (or that a breaker refused).
//! Strip the mark at the edge, for callers outside your system.
//!
//! Statuses that the server sent are not errors of the stack: the channel
//! returns them as responses, and the generated client reads them as
//! usual (after the retry layer retried an UNAVAILABLE and the breaker
//! counted it).
//!
//! # Requests that are retried
//!
//! gRPC calls are `POST`s: the retry layer repeats them only when they
//! carry an `idempotency-key` metadata entry (or with a
//! [`Policy`](tower_retry_budget::Policy) of your own, or per method as a
//! gRPC service config says, with feature `service-config`: module
//! `service_config`). Retries carry
//! `grpc-previous-rpc-attempts`; the per-attempt deadline layer writes
//! `grpc-timeout` on every attempt, and tonic's `Request::set_timeout`
//! counts as one more deadline (the earliest wins).
//!
//! # Composing by hand
//!
//! [`TonicStack`] is [`StatusLayer`] over the [`ClientStack`] over
//! [`TonicBodyLayer`]; with your own layers in between:
//!
//! ```
//! use tonic::transport::Channel;
//! use tower::ServiceBuilder;
//! use tower_shield::stack::client_stack;
//! use tower_shield::tonic::{StatusLayer, TonicBodyLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let channel = Channel::from_static("http://127.0.0.1:50051").connect_lazy();
//! let service = ServiceBuilder::new()
//!     .layer(StatusLayer::new())
//!     .layer(client_stack("stock"))
//!     .layer(TonicBodyLayer::new())
//!     .service(channel);
//! let _client = tonic::client::Grpc::new(service);
//! # }
//! ```

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use ::tonic::metadata::MetadataMap;
use ::tonic::{Code, Status};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use pin_project_lite::pin_project;
use tower_bulkhead::partition::Single;
use tower_bulkhead::release::BodyEnd;
use tower_bulkhead::Bulkhead;
use tower_deadline::ClientDeadline;
use tower_layer::Layer;
use tower_resilience_base::classify::is_transient_error;
use tower_resilience_base::error::{
    find, is_local_rejection, retries_spent, AttemptsExhausted, BudgetExhausted, BulkheadFull,
    CircuitOpen, DeadlineExceeded, DeadlineTooClose, InsufficientBudget, LocalRejection,
};
use tower_resilience_base::grpc::GRPC_RETRY_PUSHBACK_MS;
use tower_resilience_base::{Answer, NO_RETRY_HEADER};
use tower_retry_budget::{Buffered, DefaultPolicy};
use tower_service::Service;

use crate::stack::{ClientStack, ClientStackService, NoThrottle};
use crate::BoxError;

/// The client stack over a tonic transport `S` (a
/// `tonic::transport::Channel`, usually), as [`ClientStack::tonic`] builds
/// it: errors become [`Status`]es ([`StatusService`]), then the
/// [client stack](crate::stack), then [`TonicBody`] hands the replayable
/// body to the transport.
///
/// Name it where a client is stored: `StockClient<TonicStack<Channel>>`.
pub type TonicStack<S, P = DefaultPolicy, M = Buffered, R = BodyEnd, T = NoThrottle> =
    StatusService<ClientStackService<TonicBody<S>, P, M, R, T>>;

// === impl ClientStack ===

impl<P: Clone, M, R, T> ClientStack<P, M, R, T> {
    /// This stack around a tonic transport (a `tonic::transport::Channel`,
    /// usually), ready for a generated client: `StockClient::new(stack)`.
    ///
    /// The request bodies the retry layer makes replayable reach the
    /// channel as tonic's body type ([`TonicBody`]), and every error of the
    /// stack reaches the client as a [`Status`] ([`StatusService`]; see the
    /// [module docs](crate::tonic) for the codes).
    ///
    /// # Clone
    ///
    /// The service is as cheap to clone as the channel; clones (and other
    /// services built from this stack) share its breaker, retry budget and
    /// bulkhead.
    ///
    /// # Example
    ///
    /// ```
    /// use tonic::transport::Channel;
    /// use tower_shield::stack::client_stack;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let channel = Channel::from_static("http://127.0.0.1:50051").connect_lazy();
    /// let service = client_stack("stock").max_attempts(2).tonic(channel);
    /// // `StockClient::new(service)` with a generated client.
    /// let _client = tonic::client::Grpc::new(service);
    /// # }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
    pub fn tonic<S>(&self, channel: S) -> TonicStack<S, P, M, R, T>
    where
        T: Layer<Bulkhead<ClientDeadline<TonicBody<S>>, Single, R>>,
    {
        StatusService::new(self.layer(TonicBody::new(channel)))
    }
}

// === statuses ===

/// The [`Status`] for an error of the stack, as the table in the
/// [module docs](crate::tonic) says; the error becomes the status's
/// [`source`](Error::source), so callers can still downcast it.
///
/// A [`Status`] passes through unchanged.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tonic::Code;
/// use tower_breaker::error::CircuitOpen;
/// use tower_shield::tonic::into_status;
/// use tower_breaker::BoxError;
///
/// let open: BoxError = Box::new(CircuitOpen::new("stock", Duration::from_millis(2500), false));
/// let status = into_status(open);
/// assert_eq!(status.code(), Code::Unavailable);
/// assert_eq!(status.metadata().get("grpc-retry-pushback-ms").unwrap(), "2500");
/// assert_eq!(status.metadata().get("x-tower-no-retry").unwrap(), "1");
///
/// // The typed error is still there.
/// let source = std::error::Error::source(&status).unwrap();
/// assert_eq!(source.downcast_ref::<CircuitOpen>().unwrap().breaker(), "stock");
/// ```
#[must_use]
pub fn into_status(error: BoxError) -> Status {
    let error = match error.downcast::<Status>() {
        Ok(status) => return *status,
        Err(error) => error,
    };
    if let Some(mut status) = toolkit_status(&*error) {
        status.set_source(Arc::from(error));
        return status;
    }
    match Status::try_from_error(error) {
        Ok(status) => status,
        Err(error) => {
            let mut status = Status::new(other_code(&*error), error.to_string());
            status.set_source(Arc::from(error));
            status
        }
    }
}

/// The [`Status`] for an error of the stack, borrowed: the same code,
/// message and metadata as [`into_status`], without the error as the
/// status's source (a borrowed error cannot be kept).
///
/// # Example
///
/// ```
/// use tonic::Code;
/// use tower_bulkhead::error::BulkheadFull;
/// use tower_shield::tonic::to_status;
///
/// let status = to_status(&BulkheadFull::new("stock", 16, None));
/// assert_eq!(status.code(), Code::ResourceExhausted);
/// assert_eq!(status.message(), "bulkhead compartment `stock` is full (16 in flight)");
/// ```
#[must_use]
pub fn to_status(error: &(dyn Error + 'static)) -> Status {
    if let Some(status) = error.downcast_ref::<Status>() {
        return copy(status, HeaderMap::new());
    }
    if let Some(status) = toolkit_status(error) {
        return status;
    }
    // What `Status::from_error` finds in the chain (a status, a connect
    // error, an HTTP/2 error), without taking the error.
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(status) = e.downcast_ref::<Status>() {
            return copy(status, HeaderMap::new());
        }
        next = e.source();
    }
    Status::new(other_code(error), error.to_string())
}

/// The code of an error that is neither the toolkit's nor one tonic
/// recognises: UNAVAILABLE when its kind says a new attempt may succeed,
/// UNKNOWN otherwise.
fn other_code(error: &(dyn Error + 'static)) -> Code {
    if is_transient_error(error) {
        Code::Unavailable
    } else {
        Code::Unknown
    }
}

/// Whether `e` is an error of the toolkit that decides the answer by
/// itself (the retry layer's give-ups only say that retries were spent).
fn decides(e: &(dyn Error + 'static)) -> bool {
    e.is::<CircuitOpen>()
        || e.is::<BulkheadFull>()
        || e.is::<LocalRejection>()
        || e.is::<DeadlineExceeded>()
        || e.is::<InsufficientBudget>()
}

fn is_give_up(e: &(dyn Error + 'static)) -> bool {
    e.is::<AttemptsExhausted>() || e.is::<BudgetExhausted>() || e.is::<DeadlineTooClose>()
}

/// The status of an error of the toolkit; `None` when the chain holds
/// none of the toolkit's errors.
fn toolkit_status(error: &(dyn Error + 'static)) -> Option<Status> {
    let mut spent = false;
    let mut next = Some(error);
    while let Some(e) = next {
        if decides(e) {
            break;
        }
        if is_give_up(e) {
            spent = true;
        } else if let Some(status) = e.downcast_ref::<Status>() {
            // A retry layer gave up on a status: the last attempt's status
            // is the answer, marked as spent. A status wrapped in other
            // errors only is tonic's to find.
            return spent.then(|| copy(status, spent_marks()));
        }
        next = e.source();
    }
    if !(spent || is_local_rejection(error) || find::<DeadlineExceeded>(error).is_some()) {
        return None;
    }
    let answer = Answer::for_error(error);
    let mut marks = HeaderMap::new();
    if let Some(after) = answer.retry_after() {
        let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        marks.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(ms));
    } else if retries_spent(error) {
        marks.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
    }
    if answer.is_no_retry() {
        marks.insert(NO_RETRY_HEADER, HeaderValue::from_static("1"));
    }
    let code = Code::from(answer.grpc_code().as_u32() as i32);
    Some(Status::with_metadata(
        code,
        error.to_string(),
        MetadataMap::from_headers(marks),
    ))
}

/// The marks of a failure whose retries were spent below: gRPC's "do not
/// retry" and the toolkit's.
fn spent_marks() -> HeaderMap {
    let mut marks = HeaderMap::with_capacity(2);
    marks.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
    marks.insert(NO_RETRY_HEADER, HeaderValue::from_static("1"));
    marks
}

/// A copy of `status` (statuses are not `Clone`) with `marks` added to its
/// metadata; the source stays with the original.
fn copy(status: &Status, marks: HeaderMap) -> Status {
    let mut metadata = status.metadata().clone().into_headers();
    metadata.extend(marks);
    Status::with_details_and_metadata(
        status.code(),
        status.message(),
        Bytes::copy_from_slice(status.details()),
        MetadataMap::from_headers(metadata),
    )
}

// === StatusLayer ===

/// A [`Layer`] that turns its service's errors into [`Status`]es with
/// [`into_status`]; the top of a [`TonicStack`].
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tonic::Code;
/// use tower::{service_fn, Layer, ServiceExt};
/// use tower_breaker::error::CircuitOpen;
/// use tower_shield::tonic::StatusLayer;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let refusing = service_fn(|_: http::Request<()>| async {
///     Err::<http::Response<String>, _>(CircuitOpen::new("stock", Duration::from_secs(1), false))
/// });
/// let status = StatusLayer::new()
///     .layer(refusing)
///     .oneshot(http::Request::new(()))
///     .await
///     .unwrap_err();
/// assert_eq!(status.code(), Code::Unavailable);
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct StatusLayer {
    _p: (),
}

impl StatusLayer {
    /// The layer; it has no settings.
    #[must_use]
    pub const fn new() -> Self {
        Self { _p: () }
    }
}

impl<S> Layer<S> for StatusLayer {
    type Service = StatusService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        StatusService::new(inner)
    }
}

/// A service whose errors are [`Status`]es: `inner`'s, converted by
/// [`into_status`], and those of its response bodies too
/// ([`StatusBody`]: a body cut by the deadline while a stream is read
/// fails with DEADLINE_EXCEEDED, not UNKNOWN). Readiness is `inner`'s.
///
/// # Clone
///
/// A clone wraps a clone of `inner`.
#[derive(Debug, Clone)]
pub struct StatusService<S> {
    inner: S,
}

impl<S> StatusService<S> {
    /// Wraps `inner`; [`StatusLayer`] does the same as a layer.
    ///
    /// # Example
    ///
    /// ```
    /// use tower::service_fn;
    /// use tower_shield::tonic::StatusService;
    ///
    /// let service = StatusService::new(service_fn(|_: http::Request<()>| async {
    ///     Ok::<_, std::io::Error>(http::Response::new(String::new()))
    /// }));
    /// let _inner = service.get_ref();
    /// ```
    pub const fn new(inner: S) -> Self {
        Self { inner }
    }

    /// The wrapped service.
    pub const fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The wrapped service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, R, B> Service<R> for StatusService<S>
where
    S: Service<R, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
{
    type Response = http::Response<StatusBody<B>>;
    type Error = Status;
    type Future = StatusFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx).map_err(|e| into_status(e.into()))
    }

    fn call(&mut self, request: R) -> Self::Future {
        StatusFuture {
            inner: self.inner.call(request),
        }
    }
}

pin_project! {
    /// The response future of [`StatusService`].
    pub struct StatusFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F> fmt::Debug for StatusFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatusFuture").finish_non_exhaustive()
    }
}

impl<F, B, E> Future for StatusFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<http::Response<StatusBody<B>>, Status>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx).map(|result| match result {
            Ok(response) => Ok(response.map(|inner| StatusBody { inner })),
            Err(e) => Err(into_status(e.into())),
        })
    }
}

pin_project! {
    /// The response body of [`StatusService`]: frames pass through, and an
    /// error is turned into a [`Status`] by [`into_status`] (tonic's
    /// `Streaming` hands a `Status` it finds to the caller as it is, so a
    /// stream cut by the stack's deadline ends with DEADLINE_EXCEEDED, the
    /// typed error as the status's source).
    pub struct StatusBody<B> {
        #[pin]
        inner: B,
    }
}

impl<B> StatusBody<B> {
    /// The wrapped body, unwrapped.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B> fmt::Debug for StatusBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatusBody").finish_non_exhaustive()
    }
}

impl<B> http_body::Body for StatusBody<B>
where
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = Status;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, Status>>> {
        self.project()
            .inner
            .poll_frame(cx)
            .map(|frame| frame.map(|r| r.map_err(|e| into_status(e.into()))))
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

// === TonicBodyLayer ===

/// A [`Layer`] that hands any request body (the retry layer's replayable
/// body, say) to a tonic transport as tonic's body type; the bottom of a
/// [`TonicStack`].
///
/// # Example
///
/// ```
/// use tonic::transport::Channel;
/// use tower::Layer;
/// use tower_shield::tonic::TonicBodyLayer;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let channel = Channel::from_static("http://127.0.0.1:50051").connect_lazy();
/// // Takes `http::Request<B>` for any body `B` of `Bytes`.
/// let _transport = TonicBodyLayer::new().layer(channel);
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct TonicBodyLayer {
    _p: (),
}

impl TonicBodyLayer {
    /// The layer; it has no settings.
    #[must_use]
    pub const fn new() -> Self {
        Self { _p: () }
    }
}

impl<S> Layer<S> for TonicBodyLayer {
    type Service = TonicBody<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TonicBody::new(inner)
    }
}

/// A tonic transport that takes requests with any body of [`Bytes`]
/// (`ReplayBody<tonic::body::Body>`, from the retry layer) and sends them
/// as `tonic::body::Body`. It does what a
/// `.map_request(|r| r.map(tonic::body::Body::new))` would, with a type you
/// can name. Readiness, responses and errors are the transport's.
///
/// # Clone
///
/// A clone wraps a clone of the transport (a channel's clones share its
/// connection).
#[derive(Debug, Clone)]
pub struct TonicBody<S> {
    inner: S,
}

impl<S> TonicBody<S> {
    /// Wraps `transport`; [`TonicBodyLayer`] does the same as a layer.
    ///
    /// # Example
    ///
    /// ```
    /// use tonic::transport::Channel;
    /// use tower_shield::tonic::TonicBody;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let transport = TonicBody::new(Channel::from_static("http://127.0.0.1:50051").connect_lazy());
    /// let _channel: &Channel = transport.get_ref();
    /// # }
    /// ```
    pub const fn new(transport: S) -> Self {
        Self { inner: transport }
    }

    /// The wrapped transport.
    pub const fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped transport, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The wrapped transport, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B> Service<http::Request<B>> for TonicBody<S>
where
    S: Service<http::Request<::tonic::body::Body>>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        self.inner.call(request.map(::tonic::body::Body::new))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::time::Duration;

    fn refused() -> BoxError {
        io::Error::from(io::ErrorKind::ConnectionRefused).into()
    }

    fn pushback(status: &Status) -> Option<&str> {
        status
            .metadata()
            .get("grpc-retry-pushback-ms")
            .map(|v| v.to_str().unwrap())
    }

    fn marked(status: &Status) -> bool {
        status.metadata().get("x-tower-no-retry").is_some()
    }

    /// Every row of the module docs' table.
    #[test]
    fn each_error_gets_its_documented_status() {
        let open = || CircuitOpen::new("b", Duration::from_millis(1500), false);
        let last = || -> BoxError {
            let mut s = Status::unavailable("restarting");
            s.metadata_mut().insert("x-shard", "7".parse().unwrap());
            Box::new(s)
        };
        let cases: Vec<(BoxError, Code, Option<&str>, bool)> = vec![
            (Box::new(open()), Code::Unavailable, Some("1500"), true),
            (
                Box::new(BulkheadFull::new("c", 1, None)),
                Code::ResourceExhausted,
                Some("1000"),
                true,
            ),
            (
                Box::new(LocalRejection::new("shed")),
                Code::Unavailable,
                None,
                true,
            ),
            (
                Box::new(DeadlineExceeded::new()),
                Code::DeadlineExceeded,
                None,
                false,
            ),
            (
                Box::new(InsufficientBudget::new(Duration::ZERO, Duration::ZERO)),
                Code::DeadlineExceeded,
                None,
                false,
            ),
            (
                Box::new(AttemptsExhausted::new(3, last())),
                Code::Unavailable,
                Some("-1"),
                true,
            ),
            (
                Box::new(AttemptsExhausted::new(3, refused())),
                Code::Unavailable,
                Some("-1"),
                true,
            ),
            (
                Box::new(BudgetExhausted::new(1, refused())),
                Code::Unavailable,
                Some("-1"),
                true,
            ),
            (
                Box::new(DeadlineTooClose::new(2, refused())),
                Code::DeadlineExceeded,
                Some("-1"),
                true,
            ),
            (
                Box::new(AttemptsExhausted::new(2, Box::new(open()))),
                Code::Unavailable,
                Some("1500"),
                true,
            ),
            (
                Box::new(AttemptsExhausted::new(3, Box::new(DeadlineExceeded::new()))),
                Code::DeadlineExceeded,
                Some("-1"),
                true,
            ),
            (refused(), Code::Unavailable, None, false),
            ("bad config".into(), Code::Unknown, None, false),
        ];
        for (error, code, after, mark) in cases {
            let text = error.to_string();
            let borrowed = to_status(&*error);
            let status = into_status(error);
            for s in [&status, &borrowed] {
                assert_eq!(s.code(), code, "{text}");
                assert_eq!(pushback(s), after, "{text}");
                assert_eq!(marked(s), mark, "{text}");
            }
            assert!(status.source().is_some(), "{text}");
        }
    }

    #[test]
    fn a_status_passes_through_unchanged() {
        let mut original = Status::with_details(Code::NotFound, "no such sku", Bytes::from("d"));
        original
            .metadata_mut()
            .insert("x-shard", "7".parse().unwrap());
        let status = into_status(Box::new(original));
        assert_eq!(status.code(), Code::NotFound);
        assert_eq!(status.message(), "no such sku");
        assert_eq!(status.details(), b"d");
        assert_eq!(status.metadata().get("x-shard").unwrap(), "7");
        assert!(!marked(&status));
    }

    #[test]
    fn spent_retries_keep_the_last_status() {
        let mut last = Status::with_details(Code::Unavailable, "restarting", Bytes::from("d"));
        last.metadata_mut().insert("x-shard", "7".parse().unwrap());
        let status = into_status(Box::new(BudgetExhausted::new(1, Box::new(last))));
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.message(), "restarting");
        assert_eq!(status.details(), b"d");
        assert_eq!(status.metadata().get("x-shard").unwrap(), "7");
        assert_eq!(pushback(&status), Some("-1"));
        assert!(marked(&status));
        assert!(status.source().unwrap().is::<BudgetExhausted>());
    }
}
