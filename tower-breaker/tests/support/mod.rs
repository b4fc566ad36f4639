//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower::{service_fn, BoxError, Service, ServiceExt};
use tower_breaker::{Breaker, BreakerConfig, Outcome, SeededRandom, State, Transition};

/// A deterministic configuration: no jitter, a fixed seed.
pub fn config() -> BreakerConfig {
    BreakerConfig::new()
        .jitter(0.0)
        .random(SeededRandom::new(7))
}

/// A breaker of `window` calls that opens at 50% once `window` calls are
/// in, with exact periods.
pub fn breaker(window: usize) -> Breaker {
    Breaker::with_config(
        "test",
        config().count_window(window).minimum_calls(window as u32),
    )
}

/// A breaker that opens at 50% failures of a full window of `window` calls.
pub fn counted(window: usize) -> Breaker {
    Breaker::with_config(
        "dependency",
        config()
            .count_window(window)
            .minimum_calls(window as u32)
            .failure_rate(0.5),
    )
}

/// Records `n` outcomes through permits.
pub fn record(breaker: &Breaker, outcome: Outcome, n: usize) {
    for _ in 0..n {
        breaker
            .try_acquire()
            .expect("the breaker should admit")
            .record(outcome);
    }
}

pub fn state(breaker: &Breaker) -> State {
    breaker.snapshot().state
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

pub async fn advance(d: Duration) {
    tokio::time::advance(d).await;
}

/// Counts calls.
#[derive(Debug, Clone, Default)]
pub struct CallCounter(Arc<AtomicUsize>);

impl CallCounter {
    pub fn hit(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst)
    }

    pub fn calls(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// An HTTP service that answers every call with `status`, counting calls.
pub fn answering(
    calls: &CallCounter,
    status: u16,
) -> impl Service<Request<String>, Response = Response<String>, Error = BoxError, Future = impl Send>
       + Clone
       + Send {
    let calls = calls.clone();
    service_fn(move |_req: Request<String>| {
        calls.hit();
        async move {
            let mut r = Response::new(String::new());
            *r.status_mut() = StatusCode::from_u16(status).unwrap();
            Ok::<_, BoxError>(r)
        }
    })
}

/// An HTTP service that always fails with an I/O error, counting calls.
pub fn failing(
    calls: &CallCounter,
) -> impl Service<Request<String>, Response = Response<String>, Error = BoxError, Future = impl Send>
       + Clone
       + Send {
    let calls = calls.clone();
    service_fn(move |_req: Request<String>| {
        calls.hit();
        async move {
            Err::<Response<String>, BoxError>(
                std::io::Error::from(std::io::ErrorKind::ConnectionReset).into(),
            )
        }
    })
}

/// Sends one request through a clone of `svc`.
pub async fn send<S, B>(svc: &S) -> Result<Response<B>, BoxError>
where
    S: Service<Request<String>, Response = Response<B>, Error = BoxError> + Clone,
{
    svc.clone().oneshot(Request::new(String::new())).await
}

/// A listener that keeps every transition.
#[derive(Debug, Clone, Default)]
pub struct Transitions(Arc<Mutex<Vec<(State, State)>>>);

impl Transitions {
    pub fn listener(&self) -> impl Fn(&Transition) + Send + Sync + 'static {
        let seen = self.0.clone();
        move |t: &Transition| seen.lock().unwrap().push((t.from, t.to))
    }

    pub fn seen(&self) -> Vec<(State, State)> {
        self.0.lock().unwrap().clone()
    }
}

pub fn ok_infallible(
) -> impl Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone {
    service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(Response::new(String::new())) })
}

/// A `tracing` subscriber that records the `INFO`, `WARN` and `ERROR`
/// events, with their fields.
#[allow(unused_imports)] // not every test binary records events
pub use resilience_testkit::{Event, Events};

/// One step of a [`Scripted`] body.
#[derive(Debug, Clone)]
pub enum Step {
    /// Wait this many milliseconds (tokio time, so paused time applies).
    Wait(u64),
    /// A data frame.
    Data(&'static str),
    /// The body fails (a reset connection, say).
    Fail,
    /// Trailers carrying this `grpc-status`; they end the body.
    GrpcStatus(u8),
    /// Never another frame.
    Stall,
}

/// A response body that plays its steps in order, then ends.
pub struct Scripted {
    steps: std::collections::VecDeque<Step>,
    sleep: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl Scripted {
    pub fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        Self {
            steps: steps.into_iter().collect(),
            sleep: None,
        }
    }
}

impl http_body::Body for Scripted {
    type Data = bytes::Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, BoxError>>> {
        use std::future::Future as _;
        use std::task::Poll;
        loop {
            if let Some(sleep) = self.sleep.as_mut() {
                std::task::ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            let Some(step) = self.steps.pop_front() else {
                return Poll::Ready(None);
            };
            return Poll::Ready(Some(match step {
                Step::Wait(ms) => {
                    self.sleep = Some(Box::pin(tokio::time::sleep(Duration::from_millis(ms))));
                    continue;
                }
                Step::Data(text) => Ok(http_body::Frame::data(bytes::Bytes::from(text))),
                Step::Fail => Err("connection reset mid-body".into()),
                Step::GrpcStatus(code) => {
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("grpc-status", http::HeaderValue::from(u16::from(code)));
                    Ok(http_body::Frame::trailers(trailers))
                }
                Step::Stall => {
                    self.steps.push_front(Step::Stall);
                    return Poll::Pending;
                }
            }));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.steps.is_empty() && self.sleep.is_none()
    }
}

/// A dependency whose every answer is `200` with `steps` as the body;
/// counts its calls in `calls`.
pub fn streaming(
    steps: Vec<Step>,
    calls: &Arc<AtomicUsize>,
) -> impl Service<Request<String>, Response = Response<Scripted>, Error = BoxError, Future = impl Send>
       + Clone {
    let calls = calls.clone();
    service_fn(move |_req: Request<String>| {
        calls.fetch_add(1, Ordering::SeqCst);
        let body = Scripted::new(steps.clone());
        async move { Ok::<_, BoxError>(Response::new(body)) }
    })
}

/// A breaker's (successful, failed, ignored) totals.
pub fn counts(breaker: &Breaker) -> (u64, u64, u64) {
    let t = breaker.snapshot().totals;
    (t.successful, t.failed, t.ignored)
}

/// Judges 503 a success (the dependency sheds load on purpose) and every
/// other status like the default classifier.
#[derive(Debug, Clone, Copy)]
pub struct Lenient503;

impl<B> tower_breaker::Classify<Response<B>> for Lenient503 {
    fn classify_response(&self, response: &Response<B>) -> Outcome {
        if response.status() == StatusCode::SERVICE_UNAVAILABLE {
            Outcome::Success
        } else {
            tower_breaker::Classify::<Response<B>>::classify_response(
                &tower_breaker::DefaultClassifier,
                response,
            )
        }
    }
}

/// A classifier with state (not zero-sized): only `status` fails.
#[derive(Debug, Clone, Copy)]
pub struct FailsOn(pub u16);

impl<B> tower_breaker::Classify<Response<B>> for FailsOn {
    fn classify_response(&self, response: &Response<B>) -> Outcome {
        if response.status().as_u16() == self.0 {
            Outcome::Failure
        } else {
            Outcome::Success
        }
    }
}
