//! The fallback layer: each cause maps to the fallback, the last-good
//! cache serves within its maximum staleness and refuses beyond it, the
//! exercise and shadow shares are honoured within statistical bounds, and a
//! fallback that fails yields the original error, never a hang or a panic.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use resilience_testkit::Events;
use tokio_test::{assert_pending, assert_ready_ok};
use tower::{service_fn, BoxError, Layer, Service, ServiceBuilder, ServiceExt};
use tower_breaker::error::CircuitOpen;
use tower_breaker::{Breaker, BreakerLayer, Mode, SeededRandom};
use tower_degrade::{
    Cause, Causes, Fallback, FallbackLayer, FallbackServed, FALLBACK_AGE_HEADER, FALLBACK_HEADER,
};
use tower_resilience_base::error::{
    AttemptsExhausted, BudgetExhausted, BulkheadFull, DeadlineExceeded, DeadlineTooClose,
    InsufficientBudget, LocalRejection,
};
use tower_resilience_base::Answer;

type Req = Request<()>;
type Res = Response<String>;

fn ok(body: &str) -> Res {
    Response::new(body.to_owned())
}

fn with_status(status: u16) -> Res {
    let mut r = ok("");
    *r.status_mut() = StatusCode::from_u16(status).unwrap();
    r
}

fn get(path: &str) -> Req {
    Request::get(path).body(()).unwrap()
}

fn refused() -> BoxError {
    io::Error::from(io::ErrorKind::ConnectionRefused).into()
}

fn open() -> CircuitOpen {
    CircuitOpen::new("dependency", Duration::from_secs(5), false)
}

/// A fallback that answers with its cause, so tests see which one it got.
fn by_cause() -> Fallback<Req, Res> {
    Fallback::from_fn(|_, why| Ok(ok(&format!("fallback: {}", why.cause()))))
}

/// A service whose every call returns what `make` makes.
fn returning<F>(make: F) -> impl Service<Req, Response = Res, Error = BoxError> + Clone
where
    F: Fn() -> Result<Res, BoxError> + Clone + Send + 'static,
{
    service_fn(move |_req: Req| {
        let result = make();
        async move { result }
    })
}

fn served(response: &Res) -> Option<FallbackServed> {
    response.extensions().get::<FallbackServed>().copied()
}

/// A service that answers `200 "fresh <path>"` while `up`, and fails with a
/// refused connection otherwise; counts its calls.
#[derive(Clone)]
struct Dependency {
    up: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
}

impl Dependency {
    fn new() -> Self {
        Self {
            up: Arc::new(AtomicBool::new(true)),
            calls: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::SeqCst);
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn service(
        &self,
    ) -> impl Service<
        Req,
        Response = Res,
        Error = BoxError,
        Future = impl Future<Output = Result<Res, BoxError>> + Send,
    > + Clone
           + Send
           + Sync {
        let this = self.clone();
        service_fn(move |req: Req| {
            this.calls.fetch_add(1, Ordering::SeqCst);
            let result = if this.up.load(Ordering::SeqCst) {
                Ok(ok(&format!("fresh {}", req.uri().path())))
            } else {
                Err(refused())
            };
            async move { result }
        })
    }
}

// --- causes ---

#[tokio::test]
async fn each_cause_maps_to_the_fallback() {
    type Make = fn() -> Result<Res, BoxError>;
    let cases: Vec<(&str, Make, Cause)> = vec![
        ("circuit open", || Err(Box::new(open())), Cause::CircuitOpen),
        (
            "bulkhead full",
            || Err(Box::new(BulkheadFull::new("dependency", 8, None))),
            Cause::BulkheadFull,
        ),
        (
            "shed",
            || Err(Box::new(LocalRejection::new("load shed"))),
            Cause::LocalRejection,
        ),
        (
            "deadline",
            || Err(Box::new(DeadlineExceeded::new())),
            Cause::DeadlineExceeded,
        ),
        (
            "no budget to start",
            || {
                Err(Box::new(InsufficientBudget::new(
                    Duration::ZERO,
                    Duration::ZERO,
                )))
            },
            Cause::DeadlineExceeded,
        ),
        (
            "no time to retry",
            || Err(Box::new(DeadlineTooClose::new(2, refused()))),
            Cause::DeadlineExceeded,
        ),
        (
            "attempts spent",
            || Err(Box::new(AttemptsExhausted::new(3, refused()))),
            Cause::RetriesExhausted,
        ),
        (
            "budget refused",
            || Err(Box::new(BudgetExhausted::new(1, refused()))),
            Cause::BudgetExhausted,
        ),
        (
            "circuit opened during retries",
            || Err(Box::new(AttemptsExhausted::new(2, Box::new(open())))),
            Cause::CircuitOpen,
        ),
        ("transport error", || Err(refused()), Cause::Failure),
        ("503", || Ok(with_status(503)), Cause::Failure),
        (
            "grpc unavailable",
            || {
                let mut r = ok("");
                r.headers_mut().insert("grpc-status", "14".parse().unwrap());
                Ok(r)
            },
            Cause::Failure,
        ),
        (
            "local 503 of a full http bulkhead",
            || Ok(Answer::bulkhead_full(Duration::from_secs(1)).into_response(false)),
            Cause::LocalRejection,
        ),
        (
            "local grpc answer of a full bulkhead",
            || Ok(Answer::bulkhead_full(Duration::from_secs(1)).into_response(true)),
            Cause::BulkheadFull,
        ),
        (
            "local 503 of an open http breaker",
            || Ok(Answer::circuit_open(&open()).into_response(false)),
            Cause::LocalRejection,
        ),
        (
            "local 504 of a deadline",
            || Ok(Answer::deadline_exceeded().into_response(false)),
            Cause::DeadlineExceeded,
        ),
    ];
    let layer = FallbackLayer::new(by_cause());
    for (what, make, cause) in &cases {
        let response = layer
            .layer(returning(*make))
            .oneshot(get("/"))
            .await
            .unwrap_or_else(|e| panic!("{what}: not answered: {e}"));
        assert_eq!(*response.body(), format!("fallback: {cause}"), "{what}");
        assert_eq!(response.status(), 200, "{what}");
        assert_eq!(served(&response).unwrap().cause(), *cause, "{what}");
        assert_eq!(
            response.headers()[FALLBACK_HEADER],
            cause.as_str(),
            "{what}"
        );
        assert!(!response.headers().contains_key(FALLBACK_AGE_HEADER));
    }
    let snapshot = layer.snapshot();
    for cause in Cause::ALL {
        let expected = cases.iter().filter(|(_, _, c)| *c == cause).count() as u64;
        assert_eq!(snapshot.served.get(cause), expected, "{cause}");
    }
    assert_eq!(snapshot.unanswered.total(), 0);
}

#[tokio::test]
async fn good_answers_and_unselected_failures_pass_through_unchanged() {
    let local = FallbackLayer::new(by_cause()).causes(Causes::LOCAL);

    for status in [200, 204, 404, 429] {
        let r = local
            .layer(returning(move || Ok(with_status(status))))
            .oneshot(get("/"))
            .await
            .unwrap();
        assert_eq!(r.status(), status);
        assert!(served(&r).is_none());
        assert!(r.headers().is_empty());
    }

    // A transport error is not local: the original error, as it was.
    let err = local
        .layer(returning(|| Err(refused())))
        .oneshot(get("/"))
        .await
        .unwrap_err();
    assert_eq!(
        err.downcast_ref::<io::Error>().unwrap().kind(),
        io::ErrorKind::ConnectionRefused
    );

    // A 5xx is not local either: the original response.
    let r = local
        .layer(returning(|| Ok(with_status(503))))
        .oneshot(get("/"))
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(served(&r).is_none());

    // Nothing selected: even an open circuit passes, still downcastable.
    let none = FallbackLayer::new(by_cause()).causes(Causes::NONE);
    let err = none
        .layer(returning(|| Err(Box::new(open()))))
        .oneshot(get("/"))
        .await
        .unwrap_err();
    assert_eq!(
        err.downcast_ref::<CircuitOpen>().unwrap().breaker(),
        "dependency"
    );

    assert_eq!(local.snapshot().served.total(), 0);
    assert_eq!(none.snapshot().served.total(), 0);
}

#[tokio::test]
async fn only_the_selected_causes_are_answered() {
    let layer = FallbackLayer::new(by_cause())
        .causes(Causes::only(Cause::DeadlineExceeded).with(Cause::BudgetExhausted));
    let deadline = layer
        .layer(returning(|| Err(Box::new(DeadlineExceeded::new()))))
        .oneshot(get("/"))
        .await
        .unwrap();
    assert_eq!(served(&deadline).unwrap().cause(), Cause::DeadlineExceeded);
    let err = layer
        .layer(returning(|| {
            Err(Box::new(AttemptsExhausted::new(3, refused())))
        }))
        .oneshot(get("/"))
        .await
        .unwrap_err();
    assert!(err.is::<AttemptsExhausted>());
}

// --- fallbacks that fail ---

#[tokio::test]
async fn a_fallback_that_fails_yields_the_original_error() {
    let failing: Fallback<Req, Res> = Fallback::from_fn(|_, _| Err("no default today".into()));
    let layer = FallbackLayer::new(failing);
    let err = layer
        .layer(returning(|| Err(Box::new(open()))))
        .oneshot(get("/"))
        .await
        .unwrap_err();
    assert_eq!(err.downcast_ref::<CircuitOpen>().unwrap(), &open());

    // For a failed response: the original response.
    let r = layer
        .layer(returning(|| Ok(with_status(502))))
        .oneshot(get("/"))
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    assert!(served(&r).is_none());

    let snapshot = layer.snapshot();
    assert_eq!(snapshot.served.total(), 0);
    assert_eq!(snapshot.unanswered.get(Cause::CircuitOpen), 1);
    assert_eq!(snapshot.unanswered.get(Cause::Failure), 1);
}

#[tokio::test]
async fn a_panicking_fallback_yields_the_original_error_without_panicking() {
    let panicking: Fallback<Req, Res> = Fallback::from_fn(|_, _| panic!("fallback bug"));
    let layer = FallbackLayer::new(panicking);
    let err = layer
        .layer(returning(|| Err(refused())))
        .oneshot(get("/"))
        .await
        .unwrap_err();
    assert!(err.is::<io::Error>());
    assert_eq!(layer.snapshot().unanswered.get(Cause::Failure), 1);
}

#[tokio::test]
async fn the_chain_tries_each_source_in_order() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let chain: Fallback<Req, Res> = Fallback::from_fn(move |_, _| {
        counted.fetch_add(1, Ordering::SeqCst);
        Err("first source down".into())
    })
    .or_else(|_, _| panic!("second source broken"))
    .or_value(ok("third"))
    .or_value(ok("never asked"));
    let layer = FallbackLayer::new(chain);
    let r = layer
        .layer(returning(|| Err(refused())))
        .oneshot(get("/"))
        .await
        .unwrap();
    assert_eq!(r.body(), "third");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(layer.snapshot().unanswered.total(), 0);
}

#[tokio::test]
async fn the_function_sees_the_key_and_the_failure() {
    let fallback: Fallback<Req, Res, String> = Fallback::keyed(
        |req: &Req| req.uri().path().to_owned(),
        |path, why| {
            let error = why.error().map(ToString::to_string).unwrap_or_default();
            let status = why
                .response()
                .map(|r: &Res| r.status().as_u16())
                .unwrap_or(0);
            Ok(ok(&format!("{path} {} [{error}] {status}", why.cause())))
        },
    );
    let layer = FallbackLayer::new(fallback);
    let r = layer
        .layer(returning(|| Err(Box::new(open()))))
        .oneshot(get("/menu/7"))
        .await
        .unwrap();
    assert_eq!(
        r.body(),
        "/menu/7 circuit-open [circuit `dependency` is open, next probe in 5000 ms] 0"
    );
    let r = layer
        .layer(returning(|| Ok(with_status(500))))
        .oneshot(get("/menu/8"))
        .await
        .unwrap();
    assert_eq!(r.body(), "/menu/8 failure [] 500");
}

// --- marking ---

#[tokio::test]
async fn the_header_can_be_turned_off_but_the_extension_stays() {
    let layer = FallbackLayer::new(Fallback::value(ok("default"))).header(false);
    let r = layer
        .layer(returning(|| Err(refused())))
        .oneshot(get("/"))
        .await
        .unwrap();
    assert!(r.headers().is_empty());
    assert_eq!(served(&r).unwrap().cause(), Cause::Failure);
}

#[tokio::test]
async fn a_fallback_answer_from_an_inner_layer_is_not_replaced() {
    let inner = FallbackLayer::new(Fallback::value(ok("inner")));
    let outer = FallbackLayer::new(Fallback::value(ok("outer")));
    let client = ServiceBuilder::new()
        .layer(outer.clone())
        .layer(inner)
        .service(returning(|| Err(refused())));
    let r = client.oneshot(get("/")).await.unwrap();
    assert_eq!(r.body(), "inner");
    assert_eq!(outer.snapshot().served.total(), 0);
}

#[derive(Debug, Clone, PartialEq)]
struct Quote {
    price: u32,
    degraded: Option<Cause>,
}

#[tokio::test]
async fn the_plain_flavour_takes_any_types_and_marks_with_a_callback() {
    let layer = FallbackLayer::plain(Fallback::value(Quote {
        price: 0,
        degraded: None,
    }))
    .mark_with(|quote: &mut Quote, served| quote.degraded = Some(served.cause()));
    let quotes = service_fn(|id: u32| async move {
        if id == 0 {
            Err::<Quote, BoxError>(Box::new(BulkheadFull::new("quotes", 4, None)))
        } else {
            Ok(Quote {
                price: id * 10,
                degraded: None,
            })
        }
    });
    let client = layer.layer(quotes);
    assert_eq!(
        client.clone().oneshot(3).await.unwrap(),
        Quote {
            price: 30,
            degraded: None
        }
    );
    assert_eq!(
        client.oneshot(0).await.unwrap(),
        Quote {
            price: 0,
            degraded: Some(Cause::BulkheadFull)
        }
    );
}

// --- in a real stack ---

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn answers_for_an_open_breaker_below_without_calling_the_dependency() {
    let dependency = Dependency::new();
    let breaker = Breaker::new("menu");
    let fallback = FallbackLayer::new(Fallback::value(ok("cached menu")));
    let client = ServiceBuilder::new()
        .layer(fallback.clone())
        // The breaker's body settles the outcome; the fallback serves plain
        // bodies.
        .map_response(|r: Response<_>| r.map(tower_breaker::body::ResponseBody::into_inner))
        .layer(BreakerLayer::new(breaker.clone()))
        .service(dependency.service());

    assert_eq!(
        client.clone().oneshot(get("/")).await.unwrap().body(),
        "fresh /"
    );
    breaker.set_mode(Mode::ForcedOpen);
    let r = client.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(r.body(), "cached menu");
    assert_eq!(served(&r).unwrap().cause(), Cause::CircuitOpen);
    assert_eq!(dependency.calls(), 1);
    assert_eq!(breaker.snapshot().totals.rejected, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn answers_when_the_retry_layer_below_gives_up() {
    let dependency = Dependency::new();
    dependency.set_up(false);
    let retry = tower_retry_budget::RetryLayer::new()
        .max_attempts(3)
        .random(SeededRandom::new(3))
        .clone_bodies();
    let fallback = FallbackLayer::new(by_cause());
    let client = ServiceBuilder::new()
        .layer(fallback.clone())
        .layer(retry)
        .service(dependency.service());
    let r = client.oneshot(get("/")).await.unwrap();
    assert_eq!(served(&r).unwrap().cause(), Cause::RetriesExhausted);
    assert_eq!(dependency.calls(), 3);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn answers_when_the_retry_budget_refuses() {
    let dependency = Dependency::new();
    dependency.set_up(false);
    let budget = tower_retry_budget::RetryBudget::new()
        .ratio(0.0)
        .min_per_sec(0);
    let retry = tower_retry_budget::RetryLayer::new()
        .max_attempts(3)
        .budget(Arc::new(budget))
        .random(SeededRandom::new(3))
        .clone_bodies();
    let client = ServiceBuilder::new()
        .layer(FallbackLayer::new(by_cause()))
        .layer(retry)
        .service(dependency.service());
    let r = client.oneshot(get("/")).await.unwrap();
    assert_eq!(served(&r).unwrap().cause(), Cause::BudgetExhausted);
    assert_eq!(dependency.calls(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn answers_when_the_deadline_cuts_the_call() {
    let hangs = service_fn(|_req: Req| std::future::pending::<Result<Res, BoxError>>());
    let client = ServiceBuilder::new()
        .layer(FallbackLayer::new(by_cause()))
        .map_response(|r: Response<_>| r.map(tower_deadline::body::ResponseBody::into_inner))
        .layer(
            tower_deadline::ClientDeadlineLayer::new().default_timeout(Duration::from_millis(200)),
        )
        .service(hangs);
    let start = tokio::time::Instant::now();
    let r = client.oneshot(get("/")).await.unwrap();
    assert_eq!(served(&r).unwrap().cause(), Cause::DeadlineExceeded);
    assert_eq!(start.elapsed(), Duration::from_millis(200));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn answers_when_the_bulkhead_below_is_full() {
    let hangs = service_fn(|_req: Req| std::future::pending::<Result<Res, BoxError>>());
    let client = ServiceBuilder::new()
        .layer(FallbackLayer::new(by_cause()))
        .layer(tower_bulkhead::BulkheadLayer::new("menu", 1))
        .service(hangs);
    let mut holder = tokio_test::task::spawn(client.clone().oneshot(get("/")));
    assert_pending!(holder.poll());
    let r = client.oneshot(get("/")).await.unwrap();
    assert_eq!(served(&r).unwrap().cause(), Cause::BulkheadFull);
}

// --- readiness and clones ---

#[tokio::test]
async fn readiness_is_the_inner_services() {
    let (mut service, mut handle) =
        tower_test::mock::spawn_layer::<Req, Res, _>(FallbackLayer::new(by_cause()));
    handle.allow(0);
    assert_pending!(service.poll_ready());
    handle.allow(1);
    assert_ready_ok!(service.poll_ready());
    let future = service.call(get("/"));
    let (_request, send) = handle.next_request().await.unwrap();
    send.send_error(refused());
    let r = future.await.unwrap();
    assert_eq!(served(&r).unwrap().cause(), Cause::Failure);
}

#[tokio::test]
async fn clones_share_the_counters_and_the_cache() {
    let dependency = Dependency::new();
    let layer = FallbackLayer::new(Fallback::last_good(
        |req: &Req| req.uri().path().to_owned(),
        16,
        Duration::from_secs(60),
    ));
    let a = layer.clone().layer(dependency.service());
    assert_eq!(a.oneshot(get("/x")).await.unwrap().body(), "fresh /x");

    // Another service from a clone of the layer serves what the first saw.
    let b = layer
        .clone()
        .name("other")
        .layer(returning(|| Err(refused())));
    let r = b.oneshot(get("/x")).await.unwrap();
    assert_eq!(r.body(), "fresh /x");
    let snapshot = layer.snapshot();
    assert_eq!(snapshot.served.get(Cause::Failure), 1);
    assert_eq!(snapshot.cached, 1);
    assert_eq!(&*snapshot.name, "fallback");
}

// --- the last-good cache ---

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_cache_serves_within_the_maximum_staleness_and_refuses_beyond() {
    let max = Duration::from_secs(60);
    let dependency = Dependency::new();
    let layer = FallbackLayer::new(Fallback::last_good(
        |req: &Req| req.uri().path().to_owned(),
        100,
        max,
    ));
    let client = layer.layer(dependency.service());
    assert_eq!(
        client.clone().oneshot(get("/a")).await.unwrap().body(),
        "fresh /a"
    );
    dependency.set_up(false);

    // t - 1 ms: served, marked with its age.
    tokio::time::advance(max - Duration::from_millis(1)).await;
    let r = client.clone().oneshot(get("/a")).await.unwrap();
    assert_eq!(r.body(), "fresh /a");
    let mark = served(&r).unwrap();
    assert_eq!(mark.cause(), Cause::Failure);
    assert_eq!(mark.stale_for(), Some(max - Duration::from_millis(1)));
    assert_eq!(r.headers()[FALLBACK_AGE_HEADER], "59");

    // t: still served (the bound is inclusive).
    tokio::time::advance(Duration::from_millis(1)).await;
    let r = client.clone().oneshot(get("/a")).await.unwrap();
    assert_eq!(served(&r).unwrap().stale_for(), Some(max));
    assert_eq!(r.headers()[FALLBACK_AGE_HEADER], "60");

    // t + 1 ms: refused; the caller gets the original error.
    tokio::time::advance(Duration::from_millis(1)).await;
    let err = client.clone().oneshot(get("/a")).await.unwrap_err();
    assert!(err.is::<io::Error>());

    // Another key was never remembered.
    let err = client.clone().oneshot(get("/b")).await.unwrap_err();
    assert!(err.is::<io::Error>());

    let snapshot = layer.snapshot();
    assert_eq!(snapshot.served.get(Cause::Failure), 2);
    assert_eq!(snapshot.unanswered.get(Cause::Failure), 2);
    assert_eq!(snapshot.stale.served, 2);
    assert_eq!(snapshot.stale.max_age, max);
    assert_eq!(snapshot.stale.total_age, max * 2 - Duration::from_millis(1));

    // A new good answer restarts the age.
    dependency.set_up(true);
    client.clone().oneshot(get("/a")).await.unwrap();
    dependency.set_up(false);
    let r = client.oneshot(get("/a")).await.unwrap();
    assert_eq!(served(&r).unwrap().stale_for(), Some(Duration::ZERO));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn too_stale_falls_through_to_the_next_source() {
    let dependency = Dependency::new();
    let layer = FallbackLayer::new(
        Fallback::last_good(|_: &Req| (), 1, Duration::from_secs(10)).or_value(ok("default")),
    );
    let client = layer.layer(dependency.service());
    client.clone().oneshot(get("/")).await.unwrap();
    dependency.set_up(false);
    tokio::time::advance(Duration::from_secs(11)).await;
    let r = client.oneshot(get("/")).await.unwrap();
    assert_eq!(r.body(), "default");
    assert_eq!(served(&r).unwrap().stale_for(), None);
    assert!(!r.headers().contains_key(FALLBACK_AGE_HEADER));
}

#[tokio::test]
async fn failures_and_local_answers_are_never_remembered() {
    let answers = Arc::new(Mutex::new(vec![
        Ok(with_status(503)),
        Ok(Answer::bulkhead_full(Duration::from_secs(1)).into_response(false)),
        Ok(with_status(500)),
    ]));
    let next = answers.clone();
    let inner = service_fn(move |_req: Req| {
        let result = next.lock().unwrap().pop().unwrap_or_else(|| Err(refused()));
        async move { result }
    });
    let layer = FallbackLayer::new(Fallback::last_good(
        |_: &Req| (),
        8,
        Duration::from_secs(60),
    ));
    let mut client = layer.layer(inner);
    for _ in 0..4 {
        let result = client.ready().await.unwrap().call(get("/")).await;
        match result {
            Ok(r) => assert!(served(&r).is_none() && r.status() != 200),
            Err(e) => assert!(e.is::<io::Error>()),
        }
    }
    let snapshot = layer.snapshot();
    assert_eq!(snapshot.cached, 0);
    assert_eq!(snapshot.served.total(), 0);
    assert_eq!(snapshot.unanswered.total(), 4);
}

#[tokio::test]
async fn the_cache_holds_at_most_its_capacity() {
    let dependency = Dependency::new();
    let layer = FallbackLayer::new(Fallback::last_good(
        |req: &Req| req.uri().path().to_owned(),
        3,
        Duration::from_secs(60),
    ));
    let mut client = layer.layer(dependency.service());
    for i in 0..50 {
        let path = format!("/{i}");
        client
            .ready()
            .await
            .unwrap()
            .call(get(&path))
            .await
            .unwrap();
        assert!(layer.snapshot().cached <= 3);
    }
    assert_eq!(layer.snapshot().cached, 3);
    // The most recent key is there.
    dependency.set_up(false);
    let r = client.oneshot(get("/49")).await.unwrap();
    assert_eq!(r.body(), "fresh /49");
}

// --- exercise mode ---

/// Calls `client` `n` times on healthy traffic; returns how many answers
/// were exercised.
async fn exercised<S>(mut client: S, n: usize) -> usize
where
    S: Service<Req, Response = Res, Error = BoxError>,
{
    let mut exercised = 0;
    for _ in 0..n {
        let r = client.ready().await.unwrap().call(get("/")).await.unwrap();
        match served(&r) {
            Some(mark) => {
                assert_eq!(mark.cause(), Cause::Exercise);
                assert!(mark.is_exercise());
                assert_eq!(r.headers()[FALLBACK_HEADER], "exercise");
                assert_eq!(r.body(), "fallback: exercise");
                exercised += 1;
            }
            None => assert_eq!(r.body(), "fresh /"),
        }
    }
    exercised
}

#[tokio::test]
async fn the_exercise_share_is_honoured_within_statistical_bounds() {
    const N: usize = 20_000;
    for (seed, share) in [(1, 0.1), (2, 0.1), (3, 0.01), (4, 0.5)] {
        let dependency = Dependency::new();
        let layer = FallbackLayer::new(by_cause())
            .exercise(share)
            .random(SeededRandom::new(seed));
        let served = exercised(layer.layer(dependency.service()), N).await;
        // Binomial: mean N p, standard deviation sqrt(N p (1 - p)); allow
        // five deviations (a false alarm about once in 1.7 million runs).
        let mean = N as f64 * share;
        let sd = (N as f64 * share * (1.0 - share)).sqrt();
        assert!(
            (served as f64 - mean).abs() <= 5.0 * sd,
            "share {share}: {served} of {N} exercised, expected {mean} +- {}",
            5.0 * sd
        );
        // Exercised calls never reach the dependency.
        assert_eq!(dependency.calls(), N - served);
        let snapshot = layer.snapshot();
        assert_eq!(snapshot.served.get(Cause::Exercise), served as u64);
        assert_eq!(snapshot.served.total(), served as u64);
    }
}

#[tokio::test]
async fn exercise_all_or_nothing() {
    let dependency = Dependency::new();
    let all = FallbackLayer::new(by_cause()).exercise(1.0);
    assert_eq!(exercised(all.layer(dependency.service()), 100).await, 100);
    assert_eq!(dependency.calls(), 0);
    let none = FallbackLayer::new(by_cause()).exercise(0.0);
    assert_eq!(exercised(none.layer(dependency.service()), 100).await, 0);
    assert_eq!(dependency.calls(), 100);
}

#[tokio::test]
async fn an_exercise_without_an_answer_calls_the_dependency() {
    let dependency = Dependency::new();
    let layer = FallbackLayer::new(Fallback::last_good(
        |req: &Req| req.uri().path().to_owned(),
        8,
        Duration::from_secs(60),
    ))
    .exercise(1.0);
    let client = layer.layer(dependency.service());
    // Nothing remembered yet: the exercise finds nothing, the dependency answers.
    let r = client.clone().oneshot(get("/a")).await.unwrap();
    assert!(served(&r).is_none());
    assert_eq!(dependency.calls(), 1);
    // Now the exercise serves the remembered answer.
    let r = client.oneshot(get("/a")).await.unwrap();
    assert_eq!(served(&r).unwrap().cause(), Cause::Exercise);
    assert_eq!(dependency.calls(), 1);
    let snapshot = layer.snapshot();
    assert_eq!(
        snapshot.unanswered.get(Cause::Exercise),
        0,
        "a cold key is not a broken fallback"
    );
    assert_eq!(snapshot.cold, 1);
    assert_eq!(snapshot.served.get(Cause::Exercise), 1);
    assert_eq!(snapshot.stale.served, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn cold_keys_raise_no_alarm_in_the_exercise_and_shadow_modes_but_a_broken_source_does() {
    let events = Events::at_least(tracing::Level::TRACE);
    let _guard = resilience_testkit::set_default(events.clone());
    let last_good = || {
        Fallback::last_good(
            |req: &Req| req.uri().path().to_owned(),
            64,
            Duration::from_secs(60),
        )
    };
    let dependency = Dependency::new();
    for layer in [
        FallbackLayer::new(last_good()).exercise(1.0),
        FallbackLayer::new(last_good()).shadow(1.0),
    ] {
        let client = layer.layer(dependency.service());
        for key in ["/a", "/b", "/c"] {
            client.clone().oneshot(get(key)).await.unwrap();
        }
        let s = layer.snapshot();
        assert_eq!(s.cold, 3, "three first calls of three keys");
        assert_eq!(s.unanswered.total(), 0);
        assert_eq!(s.shadow.unanswered, 0);
    }
    assert_eq!(events.count("fallback_failed"), 0);
    assert_eq!(events.count("fallback_shadow_differs"), 0);

    // Past the maximum staleness, a key that was not called is cold again.
    let layer = FallbackLayer::new(last_good()).shadow(1.0);
    let client = layer.layer(dependency.service());
    client.clone().oneshot(get("/a")).await.unwrap();
    tokio::time::advance(Duration::from_secs(61)).await;
    client.clone().oneshot(get("/a")).await.unwrap();
    assert_eq!(layer.snapshot().cold, 2);

    // A source that fails after the cache missed is a broken fallback.
    let broken =
        FallbackLayer::new(last_good().or_else(|_, _| Err("no default".into()))).exercise(1.0);
    broken
        .layer(dependency.service())
        .oneshot(get("/z"))
        .await
        .unwrap();
    let s = broken.snapshot();
    assert_eq!((s.cold, s.unanswered.get(Cause::Exercise)), (0, 1));
    assert_eq!(events.count("fallback_failed"), 1);
}

#[tokio::test]
async fn a_cold_key_is_unanswered_when_the_dependency_really_fails() {
    let layer = FallbackLayer::new(Fallback::last_good(
        |req: &Req| req.uri().path().to_owned(),
        8,
        Duration::from_secs(60),
    ));
    let failing = service_fn(|_req: Req| async { Err::<Res, BoxError>("refused".into()) });
    let err = layer.layer(failing).oneshot(get("/a")).await.unwrap_err();
    assert_eq!(err.to_string(), "refused");
    let s = layer.snapshot();
    assert_eq!((s.cold, s.unanswered.get(Cause::Failure)), (0, 1));
}

// --- shadow mode ---

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn shadow_serves_the_primary_and_reports_differences() {
    let events = Events::at_least(tracing::Level::TRACE);
    let _guard = resilience_testkit::set_default(events.clone());

    let dependency = Dependency::new();
    let agrees = FallbackLayer::new(Fallback::value(ok("default"))).shadow(1.0);
    let differs = FallbackLayer::new(Fallback::value(with_status(503))).shadow(1.0);
    for layer in [&agrees, &differs] {
        let mut client = layer.layer(dependency.service());
        for _ in 0..10 {
            let r = client.ready().await.unwrap().call(get("/")).await.unwrap();
            assert_eq!(r.body(), "fresh /");
            assert!(served(&r).is_none());
        }
    }
    let a = agrees.snapshot().shadow;
    assert_eq!((a.agreed, a.differed, a.unanswered), (10, 0, 0));
    let d = differs.snapshot().shadow;
    assert_eq!((d.agreed, d.differed, d.unanswered), (0, 10, 0));
    assert_eq!(agrees.snapshot().served.total(), 0);

    // Rate limited: one event for ten differences, another after the interval.
    assert_eq!(events.count("fallback_shadow_differs"), 1);
    tokio::time::advance(Duration::from_millis(999)).await;
    differs
        .layer(dependency.service())
        .oneshot(get("/"))
        .await
        .unwrap();
    assert_eq!(events.count("fallback_shadow_differs"), 1);
    tokio::time::advance(Duration::from_millis(1)).await;
    differs
        .layer(dependency.service())
        .oneshot(get("/"))
        .await
        .unwrap();
    assert_eq!(events.count("fallback_shadow_differs"), 2);
    assert_eq!(dependency.calls(), 22);
}

#[tokio::test]
async fn the_shadow_share_is_honoured_within_statistical_bounds() {
    const N: usize = 20_000;
    let dependency = Dependency::new();
    let layer = FallbackLayer::new(Fallback::value(ok("default")))
        .shadow(0.25)
        .random(SeededRandom::new(9));
    let mut client = layer.layer(dependency.service());
    for _ in 0..N {
        let r = client.ready().await.unwrap().call(get("/")).await.unwrap();
        assert_eq!(r.body(), "fresh /");
    }
    let compared = layer.snapshot().shadow.compared() as f64;
    let (mean, sd) = (N as f64 * 0.25, (N as f64 * 0.25 * 0.75).sqrt());
    assert!(
        (compared - mean).abs() <= 5.0 * sd,
        "{compared} shadowed of {N}"
    );
    assert_eq!(dependency.calls(), N);
}

#[tokio::test]
async fn shadow_with_a_last_good_cache_compares_with_the_previous_answer() {
    let version = Arc::new(AtomicUsize::new(1));
    let v = version.clone();
    let inner = service_fn(move |_req: Req| {
        let body = format!("v{}", v.load(Ordering::SeqCst));
        async move { Ok::<_, BoxError>(ok(&body)) }
    });
    let layer = FallbackLayer::new(Fallback::last_good(
        |_: &Req| (),
        4,
        Duration::from_secs(60),
    ))
    .shadow(1.0)
    .compare(|primary: &Res, fallback: &Res| primary.body() == fallback.body());
    let mut client = layer.layer(inner);
    let mut call = || {
        let f = client.call(get("/"));
        async move { f.await.unwrap() }
    };
    call().await; // nothing remembered yet: a cold key
    call().await; // v1 against v1: agreed
    version.store(2, Ordering::SeqCst);
    let r = call().await; // v2 against the remembered v1: differed
    assert_eq!(r.body(), "v2");
    let s = layer.snapshot();
    assert_eq!(
        (s.shadow.agreed, s.shadow.differed, s.shadow.unanswered),
        (1, 1, 0)
    );
    assert_eq!(s.cold, 1);
}

#[tokio::test]
async fn a_panicking_comparison_counts_as_a_difference() {
    let layer = FallbackLayer::new(Fallback::value(ok("default")))
        .shadow(1.0)
        .compare(|_: &Res, _: &Res| panic!("comparison bug"));
    let r = layer
        .layer(Dependency::new().service())
        .oneshot(get("/"))
        .await
        .unwrap();
    assert_eq!(r.body(), "fresh /");
    assert_eq!(layer.snapshot().shadow.differed, 1);
}

#[tokio::test]
async fn failing_calls_are_answered_not_shadowed() {
    let layer = FallbackLayer::new(Fallback::value(ok("default"))).shadow(1.0);
    let r = layer
        .layer(returning(|| Err(refused())))
        .oneshot(get("/"))
        .await
        .unwrap();
    assert_eq!(r.body(), "default");
    let snapshot = layer.snapshot();
    assert_eq!(snapshot.shadow.compared() + snapshot.shadow.unanswered, 0);
    assert_eq!(snapshot.served.get(Cause::Failure), 1);
}

#[tokio::test]
async fn exercise_and_shadow_never_overlap() {
    const N: usize = 10_000;
    let dependency = Dependency::new();
    let layer = FallbackLayer::new(by_cause())
        .exercise(0.2)
        .shadow(0.3)
        .random(SeededRandom::new(5));
    let exercised = exercised(layer.layer(dependency.service()), N).await;
    let shadowed = layer.snapshot().shadow.compared() as usize;
    assert_eq!(dependency.calls(), N - exercised);
    let within = |count: usize, p: f64| {
        let (mean, sd) = (N as f64 * p, (N as f64 * p * (1.0 - p)).sqrt());
        (count as f64 - mean).abs() <= 5.0 * sd
    };
    assert!(within(exercised, 0.2), "{exercised} exercised");
    assert!(within(shadowed, 0.3), "{shadowed} shadowed");
}

// --- events ---

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn served_and_failed_events_are_rate_limited() {
    let events = Events::at_least(tracing::Level::TRACE);
    let _guard = resilience_testkit::set_default(events.clone());

    let layer =
        FallbackLayer::new(Fallback::value(ok("default"))).event_interval(Duration::from_secs(10));
    let failing: Fallback<Req, Res> = Fallback::from_fn(|_, _| Err("broken".into()));
    let broken = FallbackLayer::new(failing).event_interval(Duration::from_secs(10));
    for _ in 0..5 {
        layer
            .layer(returning(|| Err(refused())))
            .oneshot(get("/"))
            .await
            .unwrap();
        broken
            .layer(returning(|| Err(refused())))
            .oneshot(get("/"))
            .await
            .unwrap_err();
    }
    assert_eq!(events.count("fallback_served"), 1);
    assert_eq!(events.count("fallback_failed"), 1);
    tokio::time::advance(Duration::from_secs(10)).await;
    layer
        .layer(returning(|| Err(refused())))
        .oneshot(get("/"))
        .await
        .unwrap();
    assert_eq!(events.count("fallback_served"), 2);
    assert_eq!(layer.snapshot().served.total(), 6);
    assert_eq!(broken.snapshot().unanswered.total(), 5);
}

#[tokio::test]
async fn works_as_an_axum_style_infallible_stack() {
    // Inner errors of any `Into<BoxError>` type, `Infallible` included.
    let handler = service_fn(|_req: Req| async { Ok::<_, Infallible>(with_status(500)) });
    let r = FallbackLayer::new(Fallback::value(ok("sorry")))
        .layer(handler)
        .oneshot(get("/"))
        .await
        .unwrap();
    assert_eq!(r.body(), "sorry");
}

#[tokio::test]
async fn services_and_futures_are_send_and_debug() {
    fn send<T: Send + Sync>(_: &T) {}
    let mut client = FallbackLayer::new(
        Fallback::last_good(
            |req: &Req| req.uri().path().to_owned(),
            8,
            Duration::from_secs(1),
        )
        .or_value(ok("default")),
    )
    .shadow(0.5)
    .layer(Dependency::new().service());
    send(&client);
    let future = client.call(get("/"));
    fn send_future<T: Send>(_: &T) {}
    send_future(&future);
    assert_eq!(
        format!("{future:?}"),
        "ResponseFuture { state: \"called\" }"
    );
    assert!(format!("{:?}", FallbackLayer::new(by_cause())).starts_with("FallbackLayer {"));
    future.await.unwrap();
}

// --- asynchronous sources ---

mod asynchronous {
    use super::*;
    use tokio::sync::Notify;
    use tokio::time::Instant;
    use tower_resilience_base::Deadline;

    /// A dependency that always fails.
    fn down() -> impl Service<Req, Response = Res, Error = BoxError> + Clone {
        returning(|| Err(refused()))
    }

    /// A source that answers `body` after `delay`.
    fn after(delay: Duration, body: &'static str) -> Fallback<Req, Res> {
        Fallback::from_async(move |_, _| async move {
            tokio::time::sleep(delay).await;
            Ok::<_, BoxError>(ok(body))
        })
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn an_async_source_answers_a_failure_marked_and_counted() {
        let layer = FallbackLayer::new(after(Duration::from_millis(30), "secondary"));
        let start = Instant::now();
        let r = layer.layer(down()).oneshot(get("/")).await.unwrap();
        assert_eq!(r.body(), "secondary");
        assert_eq!(start.elapsed(), Duration::from_millis(30));
        assert_eq!(served(&r).unwrap().cause(), Cause::Failure);
        assert_eq!(r.headers()[FALLBACK_HEADER], "failure");
        let s = layer.snapshot();
        assert_eq!((s.served.get(Cause::Failure), s.async_waiting), (1, 0));
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_slow_async_source_is_cut_at_the_async_timeout_and_the_next_source_answers() {
        let layer =
            FallbackLayer::new(after(Duration::from_secs(5), "too late").or_value(ok("default")))
                .async_timeout(Duration::from_millis(200));
        let start = Instant::now();
        let r = layer.layer(down()).oneshot(get("/")).await.unwrap();
        assert_eq!(r.body(), "default");
        assert_eq!(start.elapsed(), Duration::from_millis(200));
        assert_eq!(layer.snapshot().async_waiting, 0);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn the_wait_ends_at_the_deadline_of_the_request_being_served() {
        let layer = FallbackLayer::new(after(Duration::from_millis(200), "too late"));
        let client = layer.layer(down());
        let start = Instant::now();
        let err = Deadline::after(Duration::from_millis(50))
            .scope(client.oneshot(get("/")))
            .await
            .unwrap_err();
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(50),
            "not the 1 s default"
        );
        assert!(
            err.to_string().contains("refused"),
            "the original error: {err}"
        );
        assert_eq!(layer.snapshot().unanswered.get(Cause::Failure), 1);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn with_the_deadline_passed_an_async_source_is_skipped_without_a_wait() {
        let called = Arc::new(AtomicUsize::new(0));
        let seen = called.clone();
        let source = Fallback::from_async(move |_, _| {
            seen.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, BoxError>(ok("late")) }
        })
        .or_value(ok("default"));
        let deadline = Deadline::after(Duration::from_millis(10));
        let slow = service_fn(|_req: Req| async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Err::<Res, BoxError>(refused())
        });
        let client = FallbackLayer::new(source).layer(slow);
        let start = Instant::now();
        let r = deadline.scope(client.oneshot(get("/"))).await.unwrap();
        assert_eq!(r.body(), "default");
        assert_eq!(start.elapsed(), Duration::from_millis(20));
        assert_eq!(called.load(Ordering::SeqCst), 0, "never started");
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_failing_or_panicking_async_source_passes_to_the_next() {
        let failing: Fallback<Req, Res> =
            Fallback::from_async(|_, _| async { Err::<Res, BoxError>("secondary down".into()) })
                .or_value(ok("default"));
        let r = FallbackLayer::new(failing)
            .layer(down())
            .oneshot(get("/"))
            .await
            .unwrap();
        assert_eq!(r.body(), "default");

        let panicking: Fallback<Req, Res> = Fallback::from_async(|_, _| async {
            if true {
                panic!("fallback bug");
            }
            Ok::<_, BoxError>(ok("never"))
        })
        .or_async(|_, _| async { Ok::<_, BoxError>(ok("second async")) });
        let layer = FallbackLayer::new(panicking);
        let r = layer.layer(down()).oneshot(get("/")).await.unwrap();
        assert_eq!(r.body(), "second async");
        assert_eq!(layer.snapshot().async_waiting, 0);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn the_async_limit_bounds_the_waits_and_dropped_calls_free_their_place() {
        let release = Arc::new(Notify::new());
        let gate = release.clone();
        let source = Fallback::from_async(move |_, _| {
            let gate = gate.clone();
            async move {
                gate.notified().await;
                Ok::<_, BoxError>(ok("secondary"))
            }
        })
        .or_value(ok("default"));
        let layer = FallbackLayer::new(source).async_limit(2);
        let client = layer.layer(down());
        let mut waiting: Vec<_> = (0..2)
            .map(|_| tokio_test::task::spawn(client.clone().oneshot(get("/"))))
            .collect();
        for call in &mut waiting {
            assert_pending!(call.poll());
        }
        assert_eq!(layer.snapshot().async_waiting, 2);
        // The third finds no place: the next source, at once.
        let r = client.clone().oneshot(get("/")).await.unwrap();
        assert_eq!(r.body(), "default");
        // A dropped call frees its place.
        drop(waiting.pop());
        assert_eq!(layer.snapshot().async_waiting, 1);
        let mut third = tokio_test::task::spawn(client.clone().oneshot(get("/")));
        assert_pending!(third.poll());
        assert_eq!(layer.snapshot().async_waiting, 2);
        release.notify_waiters();
        assert_eq!(assert_ready_ok!(waiting[0].poll()).body(), "secondary");
        assert_eq!(assert_ready_ok!(third.poll()).body(), "secondary");
        assert_eq!(layer.snapshot().async_waiting, 0);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn an_exercise_awaits_the_async_source_and_calls_the_dependency_only_if_it_fails() {
        let dependency = Dependency::new();
        let answers =
            FallbackLayer::new(after(Duration::from_millis(5), "secondary")).exercise(1.0);
        let r = answers
            .layer(dependency.service())
            .oneshot(get("/"))
            .await
            .unwrap();
        assert_eq!(r.body(), "secondary");
        assert_eq!(served(&r).unwrap().cause(), Cause::Exercise);
        assert_eq!(dependency.calls(), 0);

        let fails: Fallback<Req, Res> =
            Fallback::from_async(|_, _| async { Err::<Res, BoxError>("secondary down".into()) });
        let layer = FallbackLayer::new(fails).exercise(1.0);
        let r = layer
            .layer(dependency.service())
            .oneshot(get("/a"))
            .await
            .unwrap();
        assert_eq!(r.body(), "fresh /a");
        assert_eq!(dependency.calls(), 1);
        assert_eq!(layer.snapshot().unanswered.get(Cause::Exercise), 1);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn the_shadow_mode_compares_with_the_async_source_and_serves_the_primary() {
        let dependency = Dependency::new();
        let layer = FallbackLayer::new(after(Duration::from_millis(5), "fresh /"))
            .shadow(1.0)
            .compare(|primary: &Res, fallback: &Res| primary.body() == fallback.body());
        let client = layer.layer(dependency.service());
        let r = client.clone().oneshot(get("/")).await.unwrap();
        assert_eq!(r.body(), "fresh /");
        assert!(served(&r).is_none());
        let r = client.oneshot(get("/other")).await.unwrap();
        assert_eq!(r.body(), "fresh /other");
        let s = layer.snapshot().shadow;
        assert_eq!((s.agreed, s.differed, s.unanswered), (1, 1, 0));
    }

    /// Many tasks on two threads: the limit is never exceeded and every
    /// place is given back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_calls_never_hold_more_places_than_the_limit() {
        const LIMIT: usize = 4;
        let peak = Arc::new(AtomicUsize::new(0));
        let now = Arc::new(AtomicUsize::new(0));
        let (p, n) = (peak.clone(), now.clone());
        let source = Fallback::from_async(move |_, _| {
            let (p, n) = (p.clone(), n.clone());
            async move {
                let inside = n.fetch_add(1, Ordering::SeqCst) + 1;
                p.fetch_max(inside, Ordering::SeqCst);
                tokio::task::yield_now().await;
                n.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, BoxError>(ok("secondary"))
            }
        })
        .or_value(ok("default"));
        let layer = FallbackLayer::new(source).async_limit(LIMIT);
        let dependency = Dependency::new();
        dependency.set_up(false);
        let client = layer.layer(dependency.service());
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let client = client.clone();
                tokio::spawn(async move {
                    let mut bodies = Vec::new();
                    for _ in 0..200 {
                        let r = client.clone().oneshot(get("/")).await.unwrap();
                        bodies.push(r.into_body());
                    }
                    bodies
                })
            })
            .collect();
        let mut answered = 0;
        for task in tasks {
            for body in task.await.unwrap() {
                assert!(body == "secondary" || body == "default", "{body}");
                answered += 1;
            }
        }
        assert_eq!(answered, 16 * 200);
        assert!(
            peak.load(Ordering::SeqCst) <= LIMIT,
            "peak {}",
            peak.load(Ordering::SeqCst)
        );
        assert_eq!(layer.snapshot().async_waiting, 0);
        assert_eq!(layer.snapshot().served.get(Cause::Failure), 16 * 200);
    }
}
