//! The breaker's joints with the other three layers, each checked with the
//! real layer below or inside the breaker: a retry layer's attempts counted
//! through the hook (bodies, keyed breakers), a hedge's winner counted once,
//! a bulkhead's rejections not counted, a passed deadline counted.

mod support;

/// A response body's outcome with a retry or hedging layer below.
mod body {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use http::{Request, Response};
    use http_body_util::BodyExt;
    use tower::{service_fn, BoxError, Layer, ServiceBuilder, ServiceExt};
    use tower_breaker::{Breaker, BreakerConfig, BreakerLayer};

    use super::support::{self, config, counts, streaming, Scripted, Step};

    fn breaker(config: BreakerConfig) -> Breaker {
        Breaker::with_config("dependency", config)
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn with_a_retry_layer_below_a_body_failure_counts_once_and_is_not_retried() {
        // The first attempt answers 503 (a retry), the second a good head whose
        // body then fails.
        let calls = Arc::new(AtomicUsize::new(0));
        let dependency = {
            let calls = calls.clone();
            service_fn(move |_req: Request<String>| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    let mut response =
                        Response::new(Scripted::new(vec![Step::Data("a"), Step::Fail]));
                    if n == 0 {
                        *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
                        *response.body_mut() = Scripted::new(vec![]);
                    }
                    Ok::<_, BoxError>(response)
                }
            })
        };
        let breaker = breaker(config());
        let svc = ServiceBuilder::new()
            .layer(BreakerLayer::new(breaker.clone()))
            .layer(support::retry())
            .service(dependency);
        let response = svc.oneshot(Request::new(String::new())).await.unwrap();
        assert_eq!(response.status(), 200);
        let s = breaker.snapshot();
        assert_eq!(
            (s.window.calls, s.window.failures),
            (1, 1),
            "the 503 so far"
        );
        assert!(
            response.body().is_pending(),
            "the hook kept the good head open"
        );
        let err = response.into_body().collect().await.unwrap_err();
        assert_eq!(err.to_string(), "connection reset mid-body");
        let s = breaker.snapshot();
        assert_eq!(
            (s.window.calls, s.window.failures),
            (2, 2),
            "two attempts, two failures: the body's once"
        );
        assert_eq!(s.totals.successful, 0);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "a body failure is not retried"
        );
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn with_a_retry_layer_below_a_good_body_counts_its_success_at_its_end() {
        let calls = Arc::new(AtomicUsize::new(0));
        let breaker = breaker(config());
        let svc = ServiceBuilder::new()
            .layer(BreakerLayer::new(breaker.clone()))
            .layer(support::retry())
            .service(streaming(vec![Step::Wait(5), Step::Data("ok")], &calls));
        let response = svc.oneshot(Request::new(String::new())).await.unwrap();
        assert_eq!(counts(&breaker), (0, 0, 0));
        response.into_body().collect().await.unwrap();
        assert_eq!(counts(&breaker), (1, 0, 0));
    }

    /// Many tasks on two threads, bodies read, failed and dropped half read:
    /// every call is settled exactly once, and nothing stays in flight.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_bodies_are_each_settled_exactly_once() {
        const TASKS: usize = 16;
        const CALLS: usize = 200;
        let calls = Arc::new(AtomicUsize::new(0));
        let breaker = breaker(config().count_window(1000).minimum_calls(1000));
        let read = BreakerLayer::new(breaker.clone())
            .layer(streaming(vec![Step::Data("a"), Step::Data("b")], &calls));
        let fail = BreakerLayer::new(breaker.clone())
            .layer(streaming(vec![Step::Data("a"), Step::Fail], &calls));
        let retried = ServiceBuilder::new()
            .layer(BreakerLayer::new(breaker.clone()))
            .layer(support::retry())
            .service(streaming(vec![Step::Data("a"), Step::Data("b")], &calls));
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let (read, fail, retried) = (read.clone(), fail.clone(), retried.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..CALLS {
                    match (t + i) % 4 {
                        0 => {
                            let r = read
                                .clone()
                                .oneshot(Request::new(String::new()))
                                .await
                                .unwrap();
                            r.into_body().collect().await.unwrap();
                        }
                        1 => {
                            let r = fail
                                .clone()
                                .oneshot(Request::new(String::new()))
                                .await
                                .unwrap();
                            let _ = r.into_body().collect().await;
                        }
                        2 => {
                            let r = read
                                .clone()
                                .oneshot(Request::new(String::new()))
                                .await
                                .unwrap();
                            let mut body = r.into_body();
                            body.frame().await;
                            tokio::task::yield_now().await;
                            drop(body);
                        }
                        _ => {
                            let r = retried
                                .clone()
                                .oneshot(Request::new(String::new()))
                                .await
                                .unwrap();
                            r.into_body().collect().await.unwrap();
                        }
                    }
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let total = (TASKS * CALLS) as u64;
        let (ok, failed, ignored) = counts(&breaker);
        assert_eq!(ok + failed, total, "every call settled once");
        assert_eq!(failed, total / 4);
        assert_eq!(ignored, 0);
        assert_eq!(calls.load(Ordering::SeqCst) as u64, total);
        assert_eq!(breaker.snapshot().probes_in_flight, 0);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn with_a_hedging_layer_below_the_winners_body_failure_counts_once() {
        // The first attempt hangs; the hedge, sent after 10 ms, answers a good
        // head whose body then fails.
        let calls = Arc::new(AtomicUsize::new(0));
        let dependency = {
            let calls = calls.clone();
            service_fn(move |_req: Request<String>| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        std::future::pending::<()>().await;
                    }
                    Ok::<_, BoxError>(Response::new(Scripted::new(vec![
                        Step::Data("a"),
                        Step::Fail,
                    ])))
                }
            })
        };
        let breaker = breaker(config());
        let svc = ServiceBuilder::new()
            .layer(BreakerLayer::new(breaker.clone()))
            .layer(
                tower_retry_budget::hedge::HedgeLayer::new()
                    .fixed_delay(Duration::from_millis(10))
                    .clone_bodies(),
            )
            .service(dependency);
        let response = svc.oneshot(Request::new(String::new())).await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 2, "the hedge won");
        assert!(response.body().is_pending());
        assert!(response.into_body().collect().await.is_err());
        let s = breaker.snapshot();
        assert_eq!(
            (s.window.calls, s.window.failures, s.totals.successful),
            (1, 1, 0),
            "the winner's body, once; the cancelled loser not at all"
        );
    }
}

/// Keyed breakers over a retry layer: each key's hook.
mod keyed {
    use http::{Request, Response};
    use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
    use tower_breaker::{BreakerRegistry, KeyedBreakerLayer};

    use super::support::*;

    fn by_host(req: &Request<String>) -> String {
        req.uri().host().unwrap_or("none").to_owned()
    }

    async fn get<S, B>(svc: &S, host: &str) -> Result<Response<B>, BoxError>
    where
        S: Service<Request<String>, Response = Response<B>, Error = BoxError> + Clone,
    {
        let req = Request::get(format!("http://{host}/"))
            .body(String::new())
            .unwrap();
        svc.clone().oneshot(req).await
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn each_keys_hook_counts_every_attempt_with_the_layers_classifier() {
        let registry = BreakerRegistry::new("hosts", config().count_window(20).minimum_calls(20));
        let calls = CallCounter::default();
        let lenient = ServiceBuilder::new()
            .layer(KeyedBreakerLayer::new(registry.clone(), by_host).classifier(Lenient503))
            .layer(retry())
            .service(answering(&calls, 503));
        get(&lenient, "a.example").await.unwrap();
        assert_eq!(
            calls.calls(),
            3,
            "the retry layer below made three attempts"
        );
        let a = registry.find(&"a.example".to_owned()).unwrap().snapshot();
        assert_eq!(
            (a.window.calls, a.window.failures),
            (3, 0),
            "three attempts, judged by the layer's classifier"
        );

        // The default classifier, on another key of the same registry.
        let strict = ServiceBuilder::new()
            .layer(KeyedBreakerLayer::new(registry.clone(), by_host))
            .layer(retry())
            .service(answering(&calls, 503));
        get(&strict, "b.example").await.unwrap();
        let b = registry.find(&"b.example".to_owned()).unwrap().snapshot();
        assert_eq!((b.window.calls, b.window.failures), (3, 3));
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn layers_sharing_a_registry_each_count_with_their_own_classifier() {
        // Regression guard for the per-key hook cache: the key keeps the hook
        // of the first layer's classifier; the other layers (another type, or
        // the same type with other values) must still be judged by their own.
        let registry = BreakerRegistry::new("hosts", config().count_window(50).minimum_calls(50));
        let calls = CallCounter::default();
        type ByHost = fn(&Request<String>) -> String;
        let stack = |layer: KeyedBreakerLayer<String, ByHost, FailsOn>| {
            ServiceBuilder::new()
                .layer(layer)
                .layer(retry())
                .service(answering(&calls, 503))
        };
        let key: ByHost = by_host;
        let on_503 = stack(KeyedBreakerLayer::new(registry.clone(), key).classifier(FailsOn(503)));
        let on_500 = stack(KeyedBreakerLayer::new(registry.clone(), key).classifier(FailsOn(500)));
        let default = ServiceBuilder::new()
            .layer(KeyedBreakerLayer::new(registry.clone(), by_host).classifier(Lenient503))
            .layer(retry())
            .service(answering(&calls, 503));

        get(&on_503, "shared.example").await.unwrap();
        get(&on_500, "shared.example").await.unwrap();
        get(&default, "shared.example").await.unwrap();
        get(&on_503, "shared.example").await.unwrap();
        let s = registry
            .find(&"shared.example".to_owned())
            .unwrap()
            .snapshot();
        assert_eq!(s.window.calls, 12, "four requests of three attempts each");
        assert_eq!(
            s.window.failures, 6,
            "only the FailsOn(503) layer's attempts"
        );
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn without_the_hook_a_retried_call_counts_once() {
        let registry = BreakerRegistry::new("hosts", config());
        let calls = CallCounter::default();
        let svc = ServiceBuilder::new()
            .layer(KeyedBreakerLayer::new(registry.clone(), by_host).count_attempts(false))
            .layer(retry())
            .service(answering(&calls, 503));
        get(&svc, "a.example").await.unwrap();
        assert_eq!(calls.calls(), 3);
        let s = registry.find(&"a.example".to_owned()).unwrap().snapshot();
        assert_eq!(s.window.calls, 1);
    }
}

/// What the breaker counts of the other layers' own errors.
mod classify {
    use std::error::Error;
    use std::sync::Arc;
    use std::time::Duration;

    use futures_util::FutureExt;
    use tower::{service_fn, BoxError, ServiceBuilder};
    use tower_breaker::{classify, BreakerLayer, Outcome, State};

    use super::support::*;

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_bulkhead_rejection_is_not_counted() {
        let b = breaker(2);
        let calls = CallCounter::default();
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        let wait = Arc::new(tokio::sync::Mutex::new(Some(wait)));
        let slow = service_fn(move |_req: http::Request<String>| {
            let wait = wait.clone();
            calls.hit();
            async move {
                if let Some(wait) = wait.lock().await.take() {
                    let _ = wait.await;
                }
                Ok::<_, BoxError>(http::Response::new(String::new()))
            }
        });
        let client = ServiceBuilder::new()
            .layer(BreakerLayer::new(b.clone()))
            .map_err(|e: BoxError| e) // the rejection arrives boxed once more
            .layer(tower_bulkhead::BulkheadLayer::new("dep", 1))
            .service(slow);
        let mut first = Box::pin(send(&client));
        assert!(first.as_mut().now_or_never().is_none());
        for _ in 0..10 {
            let err = send(&client).await.unwrap_err();
            assert!(err.is::<tower_bulkhead::error::BulkheadFull>());
        }
        let s = b.snapshot();
        assert_eq!(s.state, State::Closed);
        assert_eq!(s.window.calls, 0);
        assert_eq!(s.totals.ignored, 10);
        release.send(()).unwrap();
        first.await.unwrap();
        assert_eq!(b.snapshot().window.calls, 1);
    }

    #[test]
    fn the_bulkhead_rejection_is_found_in_the_source_chain() {
        #[derive(Debug)]
        struct Wrapper(BoxError);
        impl std::fmt::Display for Wrapper {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("wrapped")
            }
        }
        impl Error for Wrapper {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&*self.0)
            }
        }
        let full = ServiceBuilder::new()
            .layer(tower_bulkhead::BulkheadLayer::new("dep", 0))
            .service(service_fn(|_: ()| async { Ok::<_, BoxError>(()) }));
        let err = futures_util::FutureExt::now_or_never(tower::ServiceExt::oneshot(full, ()))
            .unwrap()
            .unwrap_err();
        let wrapped = Wrapper(err);
        assert_eq!(classify::classify_error(&wrapped), Outcome::Ignored);
        let io = std::io::Error::from(std::io::ErrorKind::TimedOut);
        assert_eq!(classify::classify_error(&io), Outcome::Failure);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_deadline_exceeded_counts_as_a_failure() {
        let b = breaker(2);
        let client = ServiceBuilder::new()
            .layer(BreakerLayer::new(b.clone()))
            .layer(
                tower_deadline::ClientDeadlineLayer::new()
                    .default_timeout(Duration::from_millis(100)),
            )
            .service(service_fn(|_req: http::Request<String>| async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok::<_, BoxError>(http::Response::new(String::new()))
            }));
        for _ in 0..2 {
            let err = send(&client).await.unwrap_err();
            assert!(err.is::<tower_deadline::error::DeadlineExceeded>());
        }
        assert_eq!(state(&b), State::Open);
    }
}

/// A server breaker over an HTTP bulkhead.
mod flavours {
    use http::{Request, Response, StatusCode};
    use tower::{service_fn, ServiceExt};
    use tower_breaker::{HttpBreakerLayer, State};

    use super::support::*;

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_full_http_bulkhead_inside_a_server_breaker_is_not_a_failure() {
        let b = breaker(2);
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        let wait = std::sync::Arc::new(tokio::sync::Mutex::new(Some(wait)));
        let handler = service_fn(move |_req: Request<()>| {
            let wait = wait.clone();
            async move {
                // The first request holds the bulkhead's only permit.
                if let Some(wait) = wait.lock().await.take() {
                    let _ = wait.await;
                }
                Ok::<_, std::convert::Infallible>(Response::new(String::from("ok")))
            }
        });
        let svc = tower::ServiceBuilder::new()
            .layer(HttpBreakerLayer::new(b.clone()))
            .layer(tower_bulkhead::HttpBulkheadLayer::new("handler", 1))
            .service(handler);

        let held = tokio::spawn(svc.clone().oneshot(Request::new(())));
        tokio::task::yield_now().await;
        for _ in 0..5 {
            let refused = svc.clone().oneshot(Request::new(())).await.unwrap();
            assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        }
        assert_eq!(
            state(&b),
            State::Closed,
            "the bulkhead's 503s are not the handler's"
        );
        release.send(()).unwrap();
        assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
        let totals = b.snapshot().totals;
        assert_eq!(
            (totals.failed, totals.ignored, totals.successful),
            (0, 5, 1)
        );
    }
}
