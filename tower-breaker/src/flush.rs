//! Flushing a fleet's pending store work before a process is frozen or
//! stopped: [`Breaker::flush`](crate::Breaker::flush),
//! [`FleetConfig::flush`](crate::FleetConfig::flush) and [`FlushLayer`].
//!
//! A breaker with a store reports its outcomes and writes its transitions
//! in tasks spawned beside the calls, so that no call waits for the store.
//! A process that keeps running makes those store calls a few
//! milliseconds later. A process that does not is another matter:
//!
//! - AWS Lambda freezes an instance as soon as its handler returns. The
//!   spawned tasks then run, if ever, at the instance's next invocation,
//!   by when the store's timeout has lapsed on the thawed clock; an
//!   instance that is scaled in loses them for good.
//! - A job, a CLI or a test that exits after its last call drops them.
//!
//! A flush reports the outcomes counted and not yet reported (one store
//! call per breaker that has any), then waits until every store call the
//! breakers started has ended: the report, the queued writes of an
//! opening or a close, and what their answers lead to. It is bounded by
//! [`FleetConfig::flush_timeout`](crate::FleetConfig::flush_timeout), and
//! makes no store call at all when nothing is pending.
//!
//! [`FlushLayer`] is the serverless mode: around a Lambda handler (or any
//! service whose process may be frozen once a call returns), it flushes
//! every breaker of a fleet configuration after each call and before the
//! response is returned. The flush batches a whole invocation's outcomes
//! into one report per breaker, so an invocation costs one store round
//! trip more than its own calls, and none when it made no call through a
//! breaker with a store.
//!
//! Outcomes of calls still running when the flush starts are not waited
//! for: a flush reports what has been counted. Calls a handler awaited have
//! been counted (their response body too, once read to its end).
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
//! use tower_breaker::store::MemoryStore;
//! use tower_breaker::{Breaker, BreakerConfig, FleetConfig, FlushLayer, Outcome};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let fleet = FleetConfig::new(Arc::new(MemoryStore::new()));
//! let breaker = Breaker::with_config("inventory", BreakerConfig::new().fleet(fleet.clone()));
//!
//! // The handler calls its dependency through the breaker ...
//! let handler = service_fn(move |order: u32| {
//!     let breaker = breaker.clone();
//!     async move {
//!         let permit = breaker.acquire().await?;
//!         permit.record(Outcome::Success);
//!         Ok::<_, BoxError>(order)
//!     }
//! });
//! // ... and returns only once its outcomes are in the store.
//! let handler = ServiceBuilder::new().layer(FlushLayer::new(fleet.clone())).service(handler);
//! assert_eq!(handler.oneshot(7).await.unwrap(), 7);
//! assert!(!fleet.has_pending());
//! # }
//! ```

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::breaker::Core;
use crate::FleetConfig;

/// What a flush left undone when its bound ran out or a report failed.
///
/// The outcomes that were not reported stay counted and go with the
/// breaker's next report; a failed report whose failure tells that the
/// store did not apply it (a refused connection, throttling) is carried
/// by the next one too, and any other (a timeout) may or may not have
/// been applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unflushed {
    /// Breakers with something left.
    pub breakers: usize,
    /// Calls counted and not reported to the store.
    pub unreported_calls: u64,
    /// Store calls still running.
    pub in_flight: usize,
    /// Reports that failed while the flush waited.
    pub failed_reports: u64,
}

impl Unflushed {
    fn add(&mut self, other: Unflushed) {
        self.breakers += other.breakers;
        self.unreported_calls += other.unreported_calls;
        self.in_flight += other.in_flight;
        self.failed_reports += other.failed_reports;
    }
}

impl fmt::Display for Unflushed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "flush incomplete: {} breaker(s) with {} unreported call(s), {} store call(s) still \
             running, {} failed report(s)",
            self.breakers, self.unreported_calls, self.in_flight, self.failed_reports
        )
    }
}

impl Error for Unflushed {}

/// The breakers built from one [`FleetConfig`] or its clones, for
/// [`FleetConfig::flush`].
#[derive(Default)]
pub(crate) struct Members {
    list: Mutex<Vec<Weak<Core>>>,
}

impl Members {
    /// Adds a breaker; the dropped ones are swept when the list is full,
    /// so a keyed registry that evicts breakers keeps it bounded.
    pub(crate) fn register(&self, core: &Arc<Core>) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        if list.len() == list.capacity() {
            list.retain(|member| member.strong_count() > 0);
        }
        list.push(Arc::downgrade(core));
    }

    /// The breakers still alive.
    pub(crate) fn live(&self) -> Vec<Arc<Core>> {
        let list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        list.iter().filter_map(Weak::upgrade).collect()
    }

    /// Whether any breaker has something to flush.
    pub(crate) fn pending(&self) -> bool {
        let list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        list.iter()
            .filter_map(Weak::upgrade)
            .any(|core| core.flush_pending())
    }
}

impl fmt::Debug for Members {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("Members")
            .field("registered", &list.len())
            .finish()
    }
}

/// Flushes every breaker of `members` at once, until `deadline`.
pub(crate) async fn flush_all(
    members: &Members,
    deadline: tokio::time::Instant,
) -> Result<(), Unflushed> {
    let cores: Vec<Arc<Core>> = members
        .live()
        .into_iter()
        .filter(|core| core.flush_pending())
        .collect();
    // Every report starts first, so they run side by side.
    let started: Vec<u64> = cores.iter().map(Core::start_flush).collect();
    let mut left: Option<Unflushed> = None;
    for (core, failed_before) in cores.iter().zip(started) {
        if let Err(error) = core.finish_flush(failed_before, deadline).await {
            match &mut left {
                Some(left) => left.add(error),
                None => left = Some(error),
            }
        }
    }
    left.map_or(Ok(()), Err)
}

/// Flushes a fleet's breakers after every call of the service it wraps,
/// before the call's response is returned: the serverless mode (see the
/// [module docs](self)).
///
/// A flush that cannot finish within the fleet's
/// [`flush_timeout`](FleetConfig::flush_timeout) logs a
/// `circuit_flush_incomplete` warning; the response is returned either
/// way, unchanged.
#[derive(Debug, Clone)]
pub struct FlushLayer {
    fleet: FleetConfig,
}

impl FlushLayer {
    /// Flushes the breakers built from `fleet` (or its clones) after each
    /// call.
    #[must_use]
    pub fn new(fleet: FleetConfig) -> Self {
        Self { fleet }
    }
}

impl<S> Layer<S> for FlushLayer {
    type Service = Flush<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Flush {
            inner,
            fleet: self.fleet.clone(),
        }
    }
}

/// The service of [`FlushLayer`].
#[derive(Debug, Clone)]
pub struct Flush<S> {
    inner: S,
    fleet: FleetConfig,
}

impl<S, Request> Service<Request> for Flush<S>
where
    S: Service<Request>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = FlushFuture<S::Future, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        FlushFuture {
            inner: self.inner.call(request),
            fleet: self.fleet.clone(),
            flushing: None,
            output: None,
        }
    }
}

type Flushing = Pin<Box<dyn Future<Output = Result<(), Unflushed>> + Send>>;

pin_project! {
    /// The response future of [`Flush`]: the inner call, then the flush.
    #[must_use = "futures do nothing unless polled"]
    pub struct FlushFuture<F, O> {
        #[pin]
        inner: F,
        fleet: FleetConfig,
        flushing: Option<Flushing>,
        output: Option<O>,
    }
}

impl<F, O> Future for FlushFuture<F, O>
where
    F: Future<Output = O>,
{
    type Output = O;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<O> {
        let mut this = self.project();
        if this.output.is_none() {
            let output = ready!(this.inner.as_mut().poll(cx));
            if !this.fleet.has_pending() {
                return Poll::Ready(output);
            }
            *this.output = Some(output);
            let fleet = this.fleet.clone();
            *this.flushing = Some(Box::pin(async move { fleet.flush().await }));
        }
        if let Some(flushing) = this.flushing.as_mut() {
            if let Err(left) = ready!(flushing.as_mut().poll(cx)) {
                tracing::warn!(
                    unreported_calls = left.unreported_calls,
                    in_flight = left.in_flight,
                    failed_reports = left.failed_reports,
                    "circuit_flush_incomplete"
                );
            }
            *this.flushing = None;
        }
        Poll::Ready(
            this.output
                .take()
                .expect("FlushFuture polled after completion"),
        )
    }
}

impl<F, O> fmt::Debug for FlushFuture<F, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlushFuture")
            .field("flushing", &self.flushing.is_some())
            .finish()
    }
}
