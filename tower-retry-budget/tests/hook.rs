//! The attempt hook: every attempt recorded exactly once, checked before
//! every backoff, admitted before every retry, and able to stop the loop.

mod support;

use std::error::Error;
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use support::{get, status, Log, Scripted};
use tokio::time::Instant;
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};
use tower_resilience_base::hook::Attempts;
use tower_resilience_base::CallContext;
use tower_retry_budget::body::ReplayBody;
use tower_retry_budget::{AttemptHook, AttemptOutcome, AttemptToken, RetryLayer, SeededRandom};

type Res = Response<String>;

/// What the hook saw, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Check,
    Admit,
    Record(Result<u16, String>),
    Cancel,
}

/// A counting hook; it refuses attempts once `open_after` failures were
/// recorded.
#[derive(Debug)]
struct Breaker {
    events: Mutex<Vec<(Event, Instant)>>,
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

    fn push(&self, event: Event) {
        self.events.lock().unwrap().push((event, Instant::now()));
    }

    fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .map(|(e, _)| e.clone())
            .collect()
    }

    fn last_at(&self) -> Instant {
        self.events.lock().unwrap().last().unwrap().1
    }

    fn count(&self, pred: impl Fn(&Event) -> bool) -> usize {
        self.events().iter().filter(|e| pred(e)).count()
    }

    fn open(&self) -> Result<(), BoxError> {
        if self.failures.load(Ordering::SeqCst) >= self.open_after {
            return Err(CircuitOpen.into());
        }
        Ok(())
    }
}

impl AttemptHook for Breaker {
    fn admit(&self) -> Result<AttemptToken, BoxError> {
        self.push(Event::Admit);
        self.open()?;
        Ok(AttemptToken::new(0, 0))
    }

    fn check(&self) -> Result<(), BoxError> {
        self.push(Event::Check);
        self.open()
    }

    fn record(&self, _token: AttemptToken, outcome: AttemptOutcome<'_>) {
        let outcome = match outcome {
            AttemptOutcome::Response(r) => {
                if r.status().is_server_error() {
                    self.failures.fetch_add(1, Ordering::SeqCst);
                }
                Ok(r.status().as_u16())
            }
            AttemptOutcome::Error(e) => {
                self.failures.fetch_add(1, Ordering::SeqCst);
                Err(e.to_string())
            }
        };
        self.push(Event::Record(outcome));
    }

    fn cancel(&self, _token: AttemptToken) {
        self.push(Event::Cancel);
    }
}

/// Calls `svc` as a breaker above it would: with the hook, and the first
/// attempt already admitted, offered in the call context.
async fn call_with_hook<S>(
    mut svc: S,
    hook: &Arc<Breaker>,
    request: Request<String>,
) -> Result<Res, BoxError>
where
    S: Service<Request<String>, Response = Res, Error = BoxError>,
{
    svc.ready().await?;
    let attempts = Attempts::new(hook.clone(), AttemptToken::new(0, 0));
    let (future, left) = CallContext::offer_attempts(attempts, || svc.call(request));
    assert!(left.is_none(), "the retry layer takes the hook");
    future.await
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

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn every_attempt_is_recorded_once_and_every_retry_checked_and_admitted_first() {
    let hook = Breaker::new(u32::MAX);
    let log = Log::new();
    let svc = layer().layer(timed(&log, &[503, 502]));
    let response = call_with_hook(svc, &hook, get()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        hook.events(),
        [
            Event::Record(Ok(503)),
            Event::Check,
            Event::Admit,
            Event::Record(Ok(502)),
            Event::Check,
            Event::Admit,
            Event::Record(Ok(200)),
        ]
    );
    assert_eq!(log.count(), 3);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_first_time_success_is_recorded_and_nothing_is_asked() {
    let hook = Breaker::new(0);
    let log = Log::new();
    let svc = layer().layer(timed(&log, &[]));
    let _ = call_with_hook(svc, &hook, get()).await.unwrap();
    assert_eq!(hook.events(), [Event::Record(Ok(200))]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_last_attempt_and_non_retryable_outcomes_are_recorded() {
    let hook = Breaker::new(u32::MAX);
    let log = Log::new();
    let svc = layer().layer(timed(&log, &[503, 503, 503, 503]));
    let _ = call_with_hook(svc, &hook, get()).await.unwrap();
    assert_eq!(hook.count(|e| matches!(e, Event::Record(..))), 3);
    assert_eq!(hook.count(|e| *e == Event::Admit), 2);
    assert_eq!(hook.count(|e| *e == Event::Cancel), 0);

    let hook = Breaker::new(u32::MAX);
    let svc = layer().layer(timed(&Log::new(), &[404]));
    let _ = call_with_hook(svc, &hook, get()).await.unwrap();
    assert_eq!(hook.events(), [Event::Record(Ok(404))]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_opening_hook_stops_the_loop_with_its_error_without_sleeping() {
    let hook = Breaker::new(2);
    let log = Log::new();
    let svc = layer().max_attempts(10).layer(Scripted::always(&log, 503));
    let err = call_with_hook(svc, &hook, get()).await.unwrap_err();
    // Two failures recorded, then the check before the next backoff says
    // open: two calls, not ten, and no sleep after the second failure.
    assert_eq!(log.count(), 2);
    assert!(err.is::<CircuitOpen>(), "{err}");
    assert_eq!(
        hook.events(),
        [
            Event::Record(Ok(503)),
            Event::Check,
            Event::Admit,
            Event::Record(Ok(503)),
            Event::Check,
        ]
    );
    assert_eq!(
        Instant::now(),
        hook.last_at(),
        "no virtual time passed after the check"
    );
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
    let _ = call_with_hook(svc, &hook, get()).await.unwrap();
    assert_eq!(
        hook.events(),
        [
            Event::Record(Err("reset by peer".into())),
            Event::Check,
            Event::Admit,
            Event::Record(Ok(200)),
        ]
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_call_dropped_mid_attempt_cancels_the_attempt_in_flight() {
    // Regression: a cancelled attempt used to be neither recorded nor given
    // back, so a probe's slot waited for the breaker's half-open timeout.
    let hook = Breaker::new(u32::MAX);
    let log = Log::new();
    let mut svc = layer().layer(timed(&log, &[503]));
    svc.ready().await.unwrap();
    let attempts = Attempts::new(hook.clone(), AttemptToken::new(0, 0));
    let (future, _) = CallContext::offer_attempts(attempts, || svc.call(get()));
    let mut task = tokio_test::task::spawn(future);
    assert!(task.poll().is_pending());
    tokio::time::advance(Duration::from_millis(31)).await;
    // The first attempt failed; the retry is in its backoff or in flight.
    let _ = task.poll();
    drop(task);
    let events = hook.events();
    assert_eq!(events.first(), Some(&Event::Record(Ok(503))));
    let admitted = hook.count(|e| *e == Event::Admit);
    assert_eq!(hook.count(|e| *e == Event::Cancel), admitted, "{events:?}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_hook_is_taken_so_no_layer_below_sees_it() {
    // The hook belongs to this retry layer: a second retry layer below
    // cannot record the same attempts again.
    let hook = Breaker::new(u32::MAX);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let svc = layer().layer(service_fn({
        let seen = seen.clone();
        move |_req: Request<ReplayBody<String>>| {
            seen.lock()
                .unwrap()
                .push(CallContext::current(|cx| (cx.has_attempts(), cx.attempt())));
            async move { Ok::<_, BoxError>(status(503)) }
        }
    }));
    let _ = call_with_hook(svc, &hook, get()).await.unwrap();
    assert_eq!(*seen.lock().unwrap(), [(false, 1), (false, 2), (false, 3)]);
    assert_eq!(hook.count(|e| matches!(e, Event::Record(..))), 3);
}
