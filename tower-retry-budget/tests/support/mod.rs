//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

use std::future::{ready, Ready};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, Method, Request, Response, StatusCode};
use tokio::time::Instant;
use tower::Service;
use tower_retry_budget::{BoxError, RetryLayer, SeededRandom};

/// What the inner service saw of one call.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Instant,
    pub method: Method,
    pub headers: HeaderMap,
}

/// The calls an inner service received.
#[derive(Debug, Default)]
pub struct Log {
    seen: Mutex<Vec<Seen>>,
}

impl Log {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    pub fn calls(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn times(&self) -> Vec<Instant> {
        self.calls().iter().map(|s| s.at).collect()
    }

    fn push(&self, seen: Seen) -> usize {
        let mut v = self.seen.lock().unwrap();
        v.push(seen);
        v.len() - 1
    }
}

type Answer = dyn Fn(usize) -> Result<Response<String>, BoxError> + Send + Sync;

/// An inner service that logs every call and answers with `answer(n)`,
/// where `n` counts calls from 0. Generic over the request body.
#[derive(Clone)]
pub struct Scripted {
    log: Arc<Log>,
    answer: Arc<Answer>,
}

impl std::fmt::Debug for Scripted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scripted").finish_non_exhaustive()
    }
}

impl Scripted {
    pub fn new(
        log: &Arc<Log>,
        answer: impl Fn(usize) -> Result<Response<String>, BoxError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            log: Arc::clone(log),
            answer: Arc::new(answer),
        }
    }

    /// Always answers with `code`.
    pub fn always(log: &Arc<Log>, code: u16) -> Self {
        Self::new(log, move |_| Ok(status(code)))
    }

    /// Answers `first` for the first `n` calls, then 200.
    pub fn fails_then_ok(log: &Arc<Log>, first: u16, n: usize) -> Self {
        Self::new(log, move |i| Ok(status(if i < n { first } else { 200 })))
    }
}

impl<B> Service<Request<B>> for Scripted {
    type Response = Response<String>;
    type Error = BoxError;
    type Future = Ready<Result<Response<String>, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let n = self.log.push(Seen {
            at: Instant::now(),
            method: req.method().clone(),
            headers: req.headers().clone(),
        });
        ready((self.answer)(n))
    }
}

/// A response with this status and an empty body.
pub fn status(code: u16) -> Response<String> {
    let mut r = Response::new(String::new());
    *r.status_mut() = StatusCode::from_u16(code).unwrap();
    r
}

/// A response with this status and one header.
pub fn status_with(code: u16, name: &'static str, value: &str) -> Response<String> {
    let mut r = status(code);
    r.headers_mut().insert(name, value.parse().unwrap());
    r
}

pub fn get() -> Request<String> {
    Request::get("http://dependency/items")
        .body(String::new())
        .unwrap()
}

pub fn post() -> Request<String> {
    Request::post("http://dependency/orders")
        .body("{\"qty\":1}".to_owned())
        .unwrap()
}

/// A layer with a deterministic random source.
pub fn seeded_layer(seed: u64) -> RetryLayer {
    RetryLayer::new().random(SeededRandom::new(seed))
}

/// Differences between successive instants.
pub fn gaps(times: &[Instant]) -> Vec<Duration> {
    times.windows(2).map(|w| w[1] - w[0]).collect()
}

pub const MS: Duration = Duration::from_millis(1);
