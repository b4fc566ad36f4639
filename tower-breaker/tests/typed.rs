//! The plain flavour's typed form, `TypedCircuitBreaker`: the same
//! counting as `PlainCircuitBreaker`, an unboxed `BreakerError`, and a
//! refusal that says what it is after any number of boxes (its
//! allocations are counted in `typed_allocs.rs`).

mod support;

use std::convert::Infallible;
use std::error::Error;
use std::future::ready;
use std::io;
use std::task::{Context, Poll};

use support::*;
use tower::{service_fn, BoxError, Layer, Service, ServiceBuilder, ServiceExt};
use tower_breaker::classify::classify_fn;
use tower_breaker::error::{BreakerError, CircuitOpen};
use tower_breaker::{
    Answer, Breaker, Mode, Outcome, PlainBreakerLayer, State, TypedBreakerLayer,
    TypedCircuitBreaker,
};
use tower_resilience_base::error::{find, is_local_rejection};

/// A breaker of a 2-call window, opened by two failures (open for 5 s).
fn tripped() -> Breaker {
    let b = breaker(2);
    record(&b, Outcome::Failure, 2);
    assert_eq!(state(&b), State::Open);
    b
}

fn doubling() -> impl Service<u32, Response = u32, Error = Infallible, Future = impl Send> + Clone {
    service_fn(|n: u32| ready(Ok::<_, Infallible>(n * 2)))
}

#[tokio::test(start_paused = true)]
async fn an_answer_passes_through_and_counts_a_success() {
    let b = breaker(2);
    let svc = TypedCircuitBreaker::new(doubling(), b.clone());
    assert_eq!(svc.oneshot(21).await.unwrap(), 42);
    assert_eq!(b.snapshot().totals.successful, 1);
}

#[tokio::test(start_paused = true)]
async fn an_inner_error_comes_back_unboxed_and_counts_a_failure() {
    let b = breaker(2);
    let svc = TypedBreakerLayer::new(b.clone()).layer(service_fn(|_n: u32| async {
        Err::<u32, _>(io::Error::from(io::ErrorKind::ConnectionReset))
    }));
    let err = svc.oneshot(1).await.unwrap_err();
    assert!(!err.is_open());
    assert!(err.open().is_none());
    let inner: io::Error = err.into_inner().expect("the inner error");
    assert_eq!(inner.kind(), io::ErrorKind::ConnectionReset);
    assert_eq!(b.snapshot().totals.failed, 1);
}

#[tokio::test(start_paused = true)]
async fn an_open_circuit_refuses_with_the_breakers_name_without_calling() {
    let b = tripped();
    let calls = CallCounter::default();
    let counter = calls.clone();
    let svc = PlainBreakerLayer::new(b.clone())
        .typed()
        .layer(service_fn(move |n: u32| {
            counter.hit();
            ready(Ok::<_, Infallible>(n))
        }));
    match svc.oneshot(1).await {
        Err(BreakerError::Open(open)) => {
            assert_eq!(open.breaker(), "test");
            assert_eq!(open.retry_after(), secs(5));
            assert!(!open.is_forced());
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(calls.calls(), 0);
    assert_eq!(b.snapshot().totals.rejected, 1);
}

#[tokio::test(start_paused = true)]
async fn a_refusal_boxed_above_is_still_a_circuit_open_for_the_answers_and_retries() {
    let b = Breaker::new("users-db");
    b.set_mode(Mode::ForcedOpen);
    let svc = ServiceBuilder::new()
        .map_err(BoxError::from)
        .layer(TypedBreakerLayer::new(b))
        .service(doubling());
    let err = svc.oneshot(1).await.unwrap_err();
    assert!(is_local_rejection(&*err));
    let open = find::<CircuitOpen>(&*err).expect("a CircuitOpen in the chain");
    assert!(open.is_forced());
    let answer = Answer::for_error(&*err);
    assert_eq!(answer.status(), 503);
    assert!(answer.is_no_retry());
    // The chain names the refusal once: the wrapper's own words, then the
    // refusal as its source.
    assert_eq!(err.to_string(), "the circuit breaker refused the call");
    let source = std::error::Error::source(&*err).unwrap();
    assert_eq!(source.to_string(), "circuit `users-db` is forced open");
}

#[tokio::test(start_paused = true)]
async fn the_classifier_judges_responses() {
    let b = breaker(2);
    let svc = TypedBreakerLayer::new(b.clone())
        .classifier(classify_fn(
            |result: Result<&u32, &(dyn Error + 'static)>| match result {
                Ok(n) if *n > 10 => Outcome::Failure,
                Ok(_) => Outcome::Success,
                Err(_) => Outcome::Failure,
            },
        ))
        .layer(doubling());
    assert_eq!(svc.clone().oneshot(3).await.unwrap(), 6);
    assert_eq!(svc.clone().oneshot(30).await.unwrap(), 60);
    let totals = b.snapshot().totals;
    assert_eq!((totals.successful, totals.failed), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn an_inner_readiness_error_is_the_inner_error() {
    let b = breaker(2);
    let mut svc = TypedCircuitBreaker::new(NotReady, b.clone());
    assert!(matches!(
        svc.ready().await,
        Err(BreakerError::Inner(e)) if e.kind() == io::ErrorKind::BrokenPipe
    ));
    assert_eq!(b.snapshot().totals.failed, 0, "readiness is not a call");
}

#[tokio::test(start_paused = true)]
async fn a_dropped_probe_frees_its_slot() {
    let b = Breaker::with_config(
        "test",
        config()
            .count_window(2)
            .minimum_calls(2)
            .permitted_probes(1),
    );
    record(&b, Outcome::Failure, 2);
    advance(secs(5)).await;
    let svc = TypedBreakerLayer::new(b.clone()).layer(service_fn(|n: u32| async move {
        tokio::time::sleep(secs(60)).await;
        Ok::<_, Infallible>(n)
    }));

    let mut probe = Box::pin(svc.clone().oneshot(1));
    assert!(futures_util::poll!(probe.as_mut()).is_pending());
    assert_eq!(state(&b), State::HalfOpen);
    assert!(
        matches!(svc.clone().oneshot(2).await, Err(BreakerError::Open(_))),
        "the slot is taken"
    );
    drop(probe);
    assert_eq!(b.snapshot().probes_in_flight, 0);
    let mut next = Box::pin(svc.oneshot(3));
    assert!(
        futures_util::poll!(next.as_mut()).is_pending(),
        "the next call probes"
    );
    assert_eq!(b.snapshot().probes_in_flight, 1);
}

/// A service whose readiness fails.
#[derive(Clone)]
struct NotReady;

impl Service<u32> for NotReady {
    type Response = u32;
    type Error = io::Error;
    type Future = std::future::Ready<Result<u32, io::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Err(io::Error::from(io::ErrorKind::BrokenPipe)))
    }

    fn call(&mut self, n: u32) -> Self::Future {
        ready(Ok(n))
    }
}
