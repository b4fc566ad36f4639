//! The three flavours, each a named type with its own layer: the client
//! `CircuitBreaker` (typed errors, attempt hook), the server
//! `HttpCircuitBreaker` (answers while open, inner error unchanged) and the
//! `PlainCircuitBreaker` (any request), and the conversions between their
//! layers.

mod support;

use std::io;

use http::{Request, Response, StatusCode};
use support::*;
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_breaker::classify::{classify_fn, ErrorsOnly};
use tower_breaker::error::CircuitOpen;
use tower_breaker::{
    Breaker, BreakerLayer, CircuitBreaker, HttpBreakerLayer, HttpCircuitBreaker, Mode, Outcome,
    PlainBreakerLayer, PlainCircuitBreaker, State,
};

/// A breaker of a 2-call window, opened by two failures (open for 5 s).
fn tripped() -> Breaker {
    let b = breaker(2);
    record(&b, Outcome::Failure, 2);
    assert_eq!(state(&b), State::Open);
    b
}

/// A handler that answers every request with `status`, counting calls, and
/// never fails (as axum's handlers).
fn handler(
    calls: &CallCounter,
    status: u16,
) -> impl tower::Service<
    Request<String>,
    Response = Response<String>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone
       + Send {
    let calls = calls.clone();
    service_fn(move |_req: Request<String>| {
        calls.hit();
        async move {
            let mut r = Response::new(String::new());
            *r.status_mut() = StatusCode::from_u16(status).unwrap();
            Ok::<_, std::convert::Infallible>(r)
        }
    })
}

/// Sends one request through a clone of a server-side `svc`.
async fn serve<S, B>(svc: &S) -> Response<B>
where
    S: tower::Service<Request<String>, Response = Response<B>, Error = std::convert::Infallible>
        + Clone,
{
    let Ok(response) = svc.clone().oneshot(Request::new(String::new())).await;
    response
}

/// Fails 429 (and everything the default fails).
fn strict(result: Result<&Response<String>, &(dyn std::error::Error + 'static)>) -> Outcome {
    match result {
        Ok(r) if r.status() == StatusCode::TOO_MANY_REQUESTS || r.status().is_server_error() => {
            Outcome::Failure
        }
        Ok(_) => Outcome::Success,
        Err(_) => Outcome::Failure,
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_client_flavour_fails_with_circuit_open_without_calling_inner() {
    let b = tripped();
    let calls = CallCounter::default();
    let svc = CircuitBreaker::new(answering(&calls, 200), b.clone());

    let err = send(&svc).await.unwrap_err();
    let open = err.downcast_ref::<CircuitOpen>().expect("a CircuitOpen");
    assert_eq!(open.breaker(), "test");
    assert_eq!(calls.calls(), 0);
    assert_eq!(b.snapshot().totals.rejected, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_client_flavour_boxes_the_inner_error_unchanged() {
    let b = breaker(4);
    let calls = CallCounter::default();
    let svc = CircuitBreaker::new(failing(&calls), b.clone());

    let err = send(&svc).await.unwrap_err();
    let io = err
        .downcast_ref::<io::Error>()
        .expect("the inner io::Error");
    assert_eq!(io.kind(), io::ErrorKind::ConnectionReset);
    assert_eq!(b.snapshot().totals.failed, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_http_flavour_answers_503_with_retry_after_without_calling_inner() {
    let b = tripped();
    let calls = CallCounter::default();
    let svc = HttpCircuitBreaker::new(handler(&calls, 200), b.clone());

    let response = serve(&svc).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "5");
    assert_eq!(response.headers()["x-tower-no-retry"], "1");
    assert!(response.body().get_ref().is_empty());
    assert_eq!(calls.calls(), 0);
    assert_eq!(b.snapshot().totals.rejected, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_http_flavour_answers_grpc_requests_with_a_trailers_only_unavailable() {
    let b = tripped();
    let calls = CallCounter::default();
    let svc = HttpCircuitBreaker::new(handler(&calls, 200), b);

    let request = Request::builder()
        .header("content-type", "application/grpc")
        .body(String::new())
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["grpc-status"], "14");
    assert_eq!(calls.calls(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_http_flavour_passes_the_inner_error_through_and_counts_it_as_a_failure() {
    let b = breaker(4);
    let inner = service_fn(|_req: Request<()>| async {
        Err::<Response<String>, io::Error>(io::Error::from(io::ErrorKind::BrokenPipe))
    });
    let svc = HttpCircuitBreaker::new(inner, b.clone());

    // The error type is the inner service's, not a box.
    let err: io::Error = svc.oneshot(Request::new(())).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    assert_eq!(b.snapshot().totals.failed, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_plain_flavour_takes_any_request_and_fails_with_circuit_open() {
    let b = breaker(2);
    let svc = PlainCircuitBreaker::new(
        service_fn(|n: u32| async move { Ok::<_, BoxError>(n + 1) }),
        b.clone(),
    );
    assert_eq!(svc.clone().oneshot(1).await.unwrap(), 2);
    assert_eq!(b.snapshot().totals.successful, 1);

    b.set_mode(Mode::ForcedOpen);
    let err = svc.oneshot(1).await.unwrap_err();
    assert!(err.is::<CircuitOpen>());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn http_answers_keeps_the_breaker_and_the_classifier() {
    let b = breaker(2);
    let calls = CallCounter::default();
    let layer: HttpBreakerLayer<_> = BreakerLayer::new(b.clone())
        .classifier(classify_fn(strict))
        .count_attempts(false)
        .http_answers();
    assert_eq!(layer.breaker().name(), "test");
    let svc = layer.layer(handler(&calls, 429));

    // The strict classifier came along: two 429s open the circuit.
    assert_eq!(serve(&svc).await.status(), 429);
    assert_eq!(serve(&svc).await.status(), 429);
    assert_eq!(state(&b), State::Open);
    assert_eq!(serve(&svc).await.status(), 503);
    assert_eq!(calls.calls(), 2);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn plain_replaces_the_classifier_with_errors_only() {
    let b = breaker(2);
    let calls = CallCounter::default();
    let layer: PlainBreakerLayer<ErrorsOnly> = BreakerLayer::new(b.clone())
        .classifier(classify_fn(strict))
        .plain();
    let svc = layer.layer(answering(&calls, 503));

    // ErrorsOnly: responses succeed, whatever their status.
    for _ in 0..4 {
        assert_eq!(send(&svc).await.unwrap().status(), 503);
    }
    assert_eq!(state(&b), State::Closed);
    assert_eq!(b.snapshot().totals.successful, 4);

    // And the classifier can be set again afterwards.
    let svc = layer
        .classifier(classify_fn(strict))
        .layer(answering(&calls, 503));
    // One 503 next to a success: 50% of the window, and the circuit opens.
    assert_eq!(send(&svc).await.unwrap().status(), 503);
    assert_eq!(state(&b), State::Open);
}

#[test]
fn each_service_names_its_own_layer() {
    let b = Breaker::new("named");
    let client: BreakerLayer = CircuitBreaker::<()>::layer(b.clone());
    let server: HttpBreakerLayer = HttpCircuitBreaker::<()>::layer(b.clone());
    let plain: PlainBreakerLayer = PlainCircuitBreaker::<()>::layer(b);
    assert_eq!(client.breaker().name(), "named");
    assert_eq!(server.breaker().name(), "named");
    assert_eq!(plain.breaker().name(), "named");

    // And each layer builds its own service type.
    let _: CircuitBreaker<()> = client.layer(());
    let _: HttpCircuitBreaker<()> = server.layer(());
    let _: PlainCircuitBreaker<()> = plain.layer(());
}

#[test]
fn each_service_gives_access_to_its_inner_service_and_breaker() {
    let b = Breaker::new("access");

    let mut client = CircuitBreaker::new(1_u8, b.clone());
    *client.get_mut() += 1;
    assert_eq!((*client.get_ref(), client.breaker().name()), (2, "access"));
    assert_eq!(client.into_inner(), 2);

    let mut server = HttpCircuitBreaker::new(1_u8, b.clone());
    *server.get_mut() += 1;
    assert_eq!((*server.get_ref(), server.breaker().name()), (2, "access"));
    assert_eq!(server.into_inner(), 2);

    let mut plain = PlainCircuitBreaker::new(1_u8, b);
    *plain.get_mut() += 1;
    assert_eq!((*plain.get_ref(), plain.breaker().name()), (2, "access"));
    assert_eq!(plain.into_inner(), 2);
}

#[test]
fn debug_names_the_flavour_and_the_breaker() {
    let b = Breaker::new("dbg");
    let client = format!("{:?}", CircuitBreaker::new((), b.clone()));
    let server = format!("{:?}", HttpCircuitBreaker::new((), b.clone()));
    let plain = format!("{:?}", PlainCircuitBreaker::new((), b.clone()));
    assert!(client.starts_with("CircuitBreaker {"), "{client}");
    assert!(server.starts_with("HttpCircuitBreaker {"), "{server}");
    assert!(plain.starts_with("PlainCircuitBreaker {"), "{plain}");
    for s in [&client, &server, &plain] {
        assert!(s.contains("\"dbg\""), "{s}");
    }
    assert!(client.contains("count_attempts: true"), "{client}");
    assert!(plain.contains("ErrorsOnly"), "{plain}");

    let layer = format!("{:?}", HttpBreakerLayer::new(b));
    assert!(layer.starts_with("HttpBreakerLayer {"), "{layer}");
}

/// An error the server's classifier says nothing about.
#[derive(Debug)]
struct ClientWentAway;

impl std::fmt::Display for ClientWentAway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the client went away")
    }
}

impl std::error::Error for ClientWentAway {}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_http_flavour_asks_its_classifier_about_inner_errors() {
    let b = breaker(2);
    let inner = service_fn(|_req: Request<()>| async {
        Err::<Response<String>, ClientWentAway>(ClientWentAway)
    });
    let ignore_went_away = classify_fn(
        |result: Result<&Response<String>, &(dyn std::error::Error + 'static)>| match result {
            Err(e) if e.is::<ClientWentAway>() => Outcome::Ignored,
            other => strict(other),
        },
    );
    let svc = HttpBreakerLayer::new(b.clone())
        .classifier(ignore_went_away)
        .layer(inner);
    for _ in 0..4 {
        let err: ClientWentAway = svc.clone().oneshot(Request::new(())).await.unwrap_err();
        assert_eq!(err.to_string(), "the client went away");
    }
    let totals = b.snapshot().totals;
    assert_eq!((totals.failed, totals.ignored), (0, 4));
    assert_eq!(state(&b), State::Closed);
}
