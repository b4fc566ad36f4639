//! Helpers of the hedging tests: a dependency of scripted replicas whose
//! answers take time (paused time), and a model of the breaker's hook.
#![allow(dead_code, unreachable_pub)]

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::time::Instant;
use tower::Service;
use tower_retry_budget::{AttemptHook, AttemptOutcome, AttemptToken, BoxError};

pub const MS: Duration = Duration::from_millis(1);

/// What one call to the dependency does.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Answers with this status after the delay.
    Status(u16),
    /// Answers with this status and header after the delay.
    With(u16, &'static str, &'static str),
    /// Fails with an I/O error of this kind after the delay.
    Io(io::ErrorKind),
    /// Never answers.
    Hang,
}

/// What the dependency saw of one call.
#[derive(Debug, Clone)]
pub struct Call {
    pub at: Instant,
    pub method: Method,
    pub headers: HeaderMap,
    pub body: Option<Bytes>,
}

type Script = dyn Fn(usize) -> (Duration, Reply) + Send + Sync;

/// A dependency whose call number `n` (from 0) takes `script(n).0` and then
/// replies `script(n).1`. It logs every call (and its body), and counts the
/// calls in flight and those cancelled (dropped before answering).
#[derive(Clone)]
pub struct Replicas {
    script: Arc<Script>,
    state: Arc<Counts>,
}

#[derive(Debug, Default)]
pub struct Counts {
    calls: Mutex<Vec<Call>>,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    cancelled: AtomicUsize,
}

impl fmt::Debug for Replicas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replicas").finish_non_exhaustive()
    }
}

impl Replicas {
    pub fn new(script: impl Fn(usize) -> (Duration, Reply) + Send + Sync + 'static) -> Self {
        Self {
            script: Arc::new(script),
            state: Arc::default(),
        }
    }

    /// The first call takes `first`, every other `rest`; all answer 200.
    pub fn first_slow(first: Duration, rest: Duration) -> Self {
        Self::new(move |n| (if n == 0 { first } else { rest }, Reply::Status(200)))
    }

    /// Every call takes `latency` and answers 200.
    pub fn all(latency: Duration) -> Self {
        Self::new(move |_| (latency, Reply::Status(200)))
    }

    pub fn calls(&self) -> Vec<Call> {
        self.state.calls.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.state.calls.lock().unwrap().len()
    }

    pub fn in_flight(&self) -> usize {
        self.state.in_flight.load(SeqCst)
    }

    pub fn peak(&self) -> usize {
        self.state.peak.load(SeqCst)
    }

    pub fn cancelled(&self) -> usize {
        self.state.cancelled.load(SeqCst)
    }
}

/// Counts a call in flight until dropped; a drop before `done` is a
/// cancellation.
struct InFlight {
    state: Arc<Counts>,
    done: bool,
}

impl InFlight {
    /// The call answered: not a cancellation.
    fn complete(mut self) {
        self.done = true;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, SeqCst);
        if !self.done {
            self.state.cancelled.fetch_add(1, SeqCst);
        }
    }
}

impl<B> Service<Request<B>> for Replicas
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = Response<String>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<String>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let n = {
            let mut calls = self.state.calls.lock().unwrap();
            calls.push(Call {
                at: Instant::now(),
                method: req.method().clone(),
                headers: req.headers().clone(),
                body: None,
            });
            calls.len() - 1
        };
        let now = self.state.in_flight.fetch_add(1, SeqCst) + 1;
        self.state.peak.fetch_max(now, SeqCst);
        let guard = InFlight {
            state: Arc::clone(&self.state),
            done: false,
        };
        let (delay, reply) = (self.script)(n);
        Box::pin(async move {
            let body = req
                .into_body()
                .collect()
                .await
                .map_err(Into::into)?
                .to_bytes();
            guard.state.calls.lock().unwrap()[n].body = Some(body);
            if let Reply::Hang = reply {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(delay).await;
            guard.complete();
            match reply {
                Reply::Status(code) => Ok(status(code)),
                Reply::With(code, name, value) => {
                    let mut r = status(code);
                    r.headers_mut().insert(name, value.parse().unwrap());
                    Ok(r)
                }
                Reply::Io(kind) => Err(io::Error::from(kind).into()),
                Reply::Hang => unreachable!(),
            }
        })
    }
}

/// A response with this status, and the call number in the body.
pub fn status(code: u16) -> Response<String> {
    let mut r = Response::new(String::new());
    *r.status_mut() = StatusCode::from_u16(code).unwrap();
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

/// What the model hook saw, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Check,
    Admit,
    Refused,
    Record(Result<u16, String>),
    Cancel,
}

/// A model of the breaker's hook: it admits while closed; `check` and
/// `admit` refuse while open; in half-open, `check` says yes and `admit`
/// refuses (the probe slot is taken).
#[derive(Debug, Default)]
pub struct ModelBreaker {
    events: Mutex<Vec<Event>>,
    open: AtomicBool,
    half_open: AtomicBool,
}

#[derive(Debug)]
pub struct CircuitOpen;

impl fmt::Display for CircuitOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("circuit open")
    }
}

impl Error for CircuitOpen {}

impl ModelBreaker {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    pub fn open(&self) {
        self.open.store(true, SeqCst);
    }

    pub fn half_open(&self) {
        self.half_open.store(true, SeqCst);
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    pub fn count(&self, event: &Event) -> usize {
        self.events().iter().filter(|e| *e == event).count()
    }

    pub fn records(&self) -> usize {
        self.events()
            .iter()
            .filter(|e| matches!(e, Event::Record(_)))
            .count()
    }

    fn push(&self, event: Event) {
        self.events.lock().unwrap().push(event);
    }
}

impl AttemptHook for ModelBreaker {
    fn admit(&self) -> Result<AttemptToken, BoxError> {
        if self.open.load(SeqCst) || self.half_open.load(SeqCst) {
            self.push(Event::Refused);
            return Err(CircuitOpen.into());
        }
        self.push(Event::Admit);
        Ok(AttemptToken::new(1, 0))
    }

    fn check(&self) -> Result<(), BoxError> {
        self.push(Event::Check);
        if self.open.load(SeqCst) {
            return Err(CircuitOpen.into());
        }
        Ok(())
    }

    fn record(&self, _token: AttemptToken, outcome: AttemptOutcome<'_>) {
        self.push(Event::Record(match outcome {
            AttemptOutcome::Response(r) => Ok(r.status().as_u16()),
            AttemptOutcome::Error(e) => Err(e.to_string()),
        }));
    }

    fn cancel(&self, _token: AttemptToken) {
        self.push(Event::Cancel);
    }
}

/// Percentile `p` (0..=1) of sorted durations, nearest rank.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}
