//! The attempt hook: every attempt recorded exactly once, asked before
//! every retry, and able to stop the loop.

mod support;

use std::error::Error;
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use support::{get, status, Log, Scripted};
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_retry_budget::body::ReplayBody;
use tower_retry_budget::{AttemptHandle, AttemptHook, RetryLayer, SeededRandom};

type Res = Response<String>;

/// What the hook saw, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    BeforeRetry,
    Record(Result<u16, String>, Duration),
}

/// A counting hook; it refuses retries once `open_after` failures were
/// recorded.
#[derive(Debug)]
struct Breaker {
    events: Mutex<Vec<Event>>,
    failures: AtomicU32,
    open_after: u32,
}

#[derive(Debug)]
struct CircuitOpen;

impl fmt::Display for CircuitOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("circuit open")
    }
}

impl Error for CircuitOpen {}

impl Breaker {
    fn new(open_after: u32) -> Arc<Self> {
        Arc::new(Self {
            events: Mutex::default(),
            failures: AtomicU32::new(0),
            open_after,
        })
    }

    fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    fn count(&self, pred: impl Fn(&Event) -> bool) -> usize {
        self.events().iter().filter(|e| pred(e)).count()
    }
}

impl AttemptHook<Res> for Breaker {
    fn before_retry(&self) -> Result<(), BoxError> {
        self.events.lock().unwrap().push(Event::BeforeRetry);
        if self.failures.load(Ordering::SeqCst) >= self.open_after {
            return Err(CircuitOpen.into());
        }
        Ok(())
    }

    fn record(&self, outcome: Result<&Res, &(dyn Error + 'static)>, elapsed: Duration) {
        let outcome = match outcome {
            Ok(r) => {
                if r.status().is_server_error() {
                    self.failures.fetch_add(1, Ordering::SeqCst);
                }
                Ok(r.status().as_u16())
            }
            Err(e) => {
                self.failures.fetch_add(1, Ordering::SeqCst);
                Err(e.to_string())
            }
        };
        self.events
            .lock()
            .unwrap()
            .push(Event::Record(outcome, elapsed));
    }
}

fn with_hook(hook: &Arc<Breaker>) -> Request<String> {
    let mut request = get();
    let hook: Arc<dyn AttemptHook<Res>> = hook.clone();
    request
        .extensions_mut()
        .insert(AttemptHandle::from_arc(hook));
    request
}

fn layer() -> RetryLayer {
    RetryLayer::new().random(SeededRandom::new(61))
}

/// A dependency that takes 30 ms and answers `codes[n]` (then 200).
fn timed(
    log: &Arc<Log>,
    codes: &'static [u16],
) -> impl tower::Service<Request<ReplayBody<String>>, Response = Res, Error = BoxError> + Clone {
    let log = log.clone();
    service_fn(move |req: Request<ReplayBody<String>>| {
        let log = log.clone();
        async move {
            let n = log.count();
            let _ = Scripted::always(&log, 200).oneshot(req).await;
            tokio::time::sleep(Duration::from_millis(30)).await;
            Ok::<_, BoxError>(status(codes.get(n).copied().unwrap_or(200)))
        }
    })
}

const MS30: Duration = Duration::from_millis(30);

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn every_attempt_is_recorded_once_and_every_retry_asked_first() {
    let hook = Breaker::new(u32::MAX);
    let log = Log::new();
    let svc = layer().layer(timed(&log, &[503, 502]));
    let response = svc.oneshot(with_hook(&hook)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        hook.events(),
        [
            Event::Record(Ok(503), MS30),
            Event::BeforeRetry,
            Event::Record(Ok(502), MS30),
            Event::BeforeRetry,
            Event::Record(Ok(200), MS30),
        ]
    );
    assert_eq!(log.count(), 3);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_first_time_success_is_recorded_and_nothing_is_asked() {
    let hook = Breaker::new(0);
    let log = Log::new();
    let svc = layer().layer(timed(&log, &[]));
    let _ = svc.oneshot(with_hook(&hook)).await.unwrap();
    assert_eq!(hook.events(), [Event::Record(Ok(200), MS30)]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_last_attempt_and_non_retryable_outcomes_are_recorded() {
    let hook = Breaker::new(u32::MAX);
    let log = Log::new();
    let svc = layer().layer(timed(&log, &[503, 503, 503, 503]));
    let _ = svc.oneshot(with_hook(&hook)).await.unwrap();
    assert_eq!(hook.count(|e| matches!(e, Event::Record(..))), 3);
    assert_eq!(hook.count(|e| *e == Event::BeforeRetry), 2);

    let hook = Breaker::new(u32::MAX);
    let svc = layer().layer(timed(&Log::new(), &[404]));
    let _ = svc.oneshot(with_hook(&hook)).await.unwrap();
    assert_eq!(hook.events(), [Event::Record(Ok(404), MS30)]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_opening_hook_stops_the_loop_with_its_error() {
    let hook = Breaker::new(2);
    let log = Log::new();
    let svc = layer().max_attempts(10).layer(Scripted::always(&log, 503));
    let err = svc.oneshot(with_hook(&hook)).await.unwrap_err();
    // Two failures recorded, the second retry refused: two calls, not ten.
    assert_eq!(log.count(), 2);
    assert!(err.is::<CircuitOpen>(), "{err}");
    assert_eq!(hook.count(|e| matches!(e, Event::Record(..))), 2);
    assert_eq!(hook.count(|e| *e == Event::BeforeRetry), 2);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn errors_are_recorded_as_errors() {
    let hook = Breaker::new(u32::MAX);
    let log = Log::new();
    let svc = layer().layer(Scripted::new(&log, |i| {
        if i == 0 {
            Err(io::Error::new(io::ErrorKind::ConnectionReset, "reset by peer").into())
        } else {
            Ok(status(200))
        }
    }));
    let _ = svc.oneshot(with_hook(&hook)).await.unwrap();
    assert_eq!(
        hook.events(),
        [
            Event::Record(Err("reset by peer".into()), Duration::ZERO),
            Event::BeforeRetry,
            Event::Record(Ok(200), Duration::ZERO),
        ]
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_handle_for_another_response_type_is_ignored() {
    let hook = Breaker::new(0);
    let mut request = get();
    // The wrong response type: `Response<()>`, not `Response<String>`.
    struct Other(Arc<Breaker>);
    impl AttemptHook<Response<()>> for Other {
        fn before_retry(&self) -> Result<(), BoxError> {
            self.0.before_retry()
        }
        fn record(&self, _: Result<&Response<()>, &(dyn Error + 'static)>, _: Duration) {
            self.0.events.lock().unwrap().push(Event::BeforeRetry);
        }
    }
    request
        .extensions_mut()
        .insert(AttemptHandle::new(Other(hook.clone())));
    let log = Log::new();
    let svc = layer().layer(Scripted::fails_then_ok(&log, 503, 1));
    assert_eq!(svc.oneshot(request).await.unwrap().status(), 200);
    assert!(hook.events().is_empty());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_handle_is_taken_out_of_the_requests_sent_below() {
    // The hook belongs to this retry layer: the attempts it sends neither
    // carry it (no clone per attempt) nor let a second retry layer below
    // record the same attempts again.
    let hook = Breaker::new(u32::MAX);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let svc = layer().layer(service_fn({
        let seen = seen.clone();
        move |req: Request<ReplayBody<String>>| {
            seen.lock().unwrap().push(
                req.extensions()
                    .get::<AttemptHandle<Response<String>>>()
                    .is_some(),
            );
            async move { Ok::<_, BoxError>(status(503)) }
        }
    }));
    let _ = svc.oneshot(with_hook(&hook)).await.unwrap();
    assert_eq!(*seen.lock().unwrap(), [false, false, false]);
    assert_eq!(hook.events().len(), 3 + 2, "three records, two asks");
}
