//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::Semaphore;
use tower::BoxError;
use tower_service::Service;

pub type Request = http::Request<()>;

pub fn request() -> Request {
    http::Request::new(())
}

pub fn request_to(host: &str) -> Request {
    http::Request::builder()
        .uri(format!("http://{host}/"))
        .body(())
        .unwrap()
}

pub fn grpc_request() -> Request {
    http::Request::builder()
        .header(http::header::CONTENT_TYPE, "application/grpc+proto")
        .body(())
        .unwrap()
}

/// An inner service whose calls block until the test opens the gate, and
/// which records how many calls are inside it now and at most.
#[derive(Clone, Default)]
pub struct Gate {
    inner: Arc<GateInner>,
}

struct GateInner {
    open: Semaphore,
    calls: AtomicUsize,
    current: AtomicUsize,
    max: AtomicUsize,
}

impl Default for GateInner {
    fn default() -> Self {
        Self {
            open: Semaphore::new(0),
            calls: AtomicUsize::new(0),
            current: AtomicUsize::new(0),
            max: AtomicUsize::new(0),
        }
    }
}

/// Counts a call as inside the gate until dropped (completion or
/// cancellation alike).
struct Inside(Arc<GateInner>);

impl Drop for Inside {
    fn drop(&mut self) {
        self.0.current.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Gate {
    pub fn new() -> Self {
        Self::default()
    }

    /// Lets `n` blocked (or future) calls finish.
    pub fn open(&self, n: usize) {
        self.inner.open.add_permits(n);
    }

    /// Lets every call, now and later, finish.
    pub fn open_all(&self) {
        self.inner.open.add_permits(Semaphore::MAX_PERMITS / 2);
    }

    /// Calls that reached the inner service.
    pub fn calls(&self) -> usize {
        self.inner.calls.load(Ordering::SeqCst)
    }

    /// Calls inside the inner service right now.
    pub fn current(&self) -> usize {
        self.inner.current.load(Ordering::SeqCst)
    }

    /// The most calls ever inside the inner service at once.
    pub fn max(&self) -> usize {
        self.inner.max.load(Ordering::SeqCst)
    }

    /// The inner service: each call waits for the gate, then answers 200
    /// with the request's path as body.
    pub fn service(&self) -> GateService {
        GateService { gate: self.clone() }
    }
}

#[derive(Clone)]
pub struct GateService {
    gate: Gate,
}

impl Service<Request> for GateService {
    type Response = http::Response<String>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let inner = self.gate.inner.clone();
        let path = req.uri().path().to_owned();
        Box::pin(async move {
            inner.calls.fetch_add(1, Ordering::SeqCst);
            let now = inner.current.fetch_add(1, Ordering::SeqCst) + 1;
            inner.max.fetch_max(now, Ordering::SeqCst);
            let _inside = Inside(inner.clone());
            inner.open.acquire().await?.forget();
            Ok(http::Response::new(path))
        })
    }
}

#[allow(unused_imports)] // not every test binary records events
pub use resilience_testkit::{Event, Events};

/// A `tracing` subscriber that records the `WARN` and `ERROR` events.
pub fn warnings() -> Events {
    Events::at_least(tracing::Level::WARN)
}

/// An event's `suppressed` field (0 when absent).
pub fn suppressed(event: &Event) -> u64 {
    event.1.get("suppressed").map_or(0, |n| n.parse().unwrap())
}

/// A dependency that answers after `latency`.
pub fn answers_after(
    latency: std::time::Duration,
) -> impl Service<Request, Response = http::Response<()>, Error = BoxError, Future = impl Send> + Clone
{
    tower::service_fn(move |_req: Request| async move {
        tokio::time::sleep(latency).await;
        Ok::<_, BoxError>(http::Response::new(()))
    })
}

/// Runs all `futures` at once on their own tasks, collecting their
/// outputs in the given order.
pub async fn together<F>(futures: Vec<F>) -> Vec<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let tasks: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut outputs = Vec::new();
    for task in tasks {
        outputs.push(task.await.unwrap());
    }
    outputs
}
