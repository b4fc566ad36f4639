//! The server layer: extraction, clamping, defaults, malformed values, fail
//! fast and expiry.

mod support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use support::{grpc_request, request_with, request_with_lines, CallCounter, DropCounter, Lines};
use tokio::time::{advance, Instant};
use tokio_test::{assert_pending, assert_ready, assert_ready_ok, task};
use tower::{service_fn, Layer, ServiceExt};
use tower_deadline::{Deadline, OnMalformed, ServerDeadlineLayer, DEFAULT_MAX_TIMEOUT};
use tower_service::Service;

type Seen = Arc<Mutex<Vec<Option<Duration>>>>;

/// A handler that records the budget it saw (from the extension, checked
/// against the task-local one) and answers 200.
fn recording_handler(
    seen: Seen,
    calls: CallCounter,
) -> impl Service<Request<()>, Response = Response<()>, Error = Infallible, Future: Send> + Clone {
    service_fn(move |req: Request<()>| {
        let seen = seen.clone();
        calls.hit();
        let in_call = Deadline::current();
        async move {
            let ext = Deadline::from_extensions(req.extensions());
            assert_eq!(
                ext, in_call,
                "task-local in call() must equal the extension"
            );
            assert_eq!(
                ext,
                Deadline::current(),
                "task-local in the future must equal the extension"
            );
            seen.lock().unwrap().push(ext.map(Deadline::remaining));
            Ok::<_, Infallible>(Response::new(()))
        }
    })
}

async fn budget_seen(
    layer: ServerDeadlineLayer,
    req: Request<()>,
) -> (StatusCode, Option<Duration>, usize) {
    let seen = Seen::default();
    let calls = CallCounter::default();
    let svc = layer.layer(recording_handler(seen.clone(), calls.clone()));
    let response = svc.oneshot(req).await.unwrap();
    let budget = seen.lock().unwrap().first().copied().flatten();
    (response.status(), budget, calls.calls())
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn http_header_sets_the_deadline_in_extensions_and_task_local() {
    let (status, budget, _) = budget_seen(
        ServerDeadlineLayer::new(),
        request_with("x-request-timeout-ms", "300"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(budget, Some(Duration::from_millis(300)));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn grpc_timeout_is_read_with_its_unit() {
    let (_, budget, _) = budget_seen(
        ServerDeadlineLayer::new().grpc_lead(Duration::ZERO),
        request_with("grpc-timeout", "2S"),
    )
    .await;
    assert_eq!(budget, Some(Duration::from_secs(2)));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn grpc_requests_expire_one_lead_early() {
    let (_, budget, _) = budget_seen(ServerDeadlineLayer::new(), grpc_request("100m")).await;
    assert_eq!(budget, Some(Duration::from_millis(99)));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_shorter_of_two_headers_wins() {
    let req = Request::builder()
        .header("grpc-timeout", "5S")
        .header("x-request-timeout-ms", "700")
        .body(())
        .unwrap();
    let (_, budget, _) = budget_seen(ServerDeadlineLayer::new(), req).await;
    assert_eq!(budget, Some(Duration::from_millis(700)));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn duplicate_header_lines_take_the_shortest() {
    // Regression: the first line used to win, so a hop appending a shorter
    // budget after a longer one was ignored.
    let layer = ServerDeadlineLayer::new().grpc_lead(Duration::ZERO);
    let cases: [(Lines, u64); 4] = [
        (
            &[
                ("x-request-timeout-ms", "200"),
                ("x-request-timeout-ms", "100"),
            ],
            100,
        ),
        (
            &[
                ("x-request-timeout-ms", "100"),
                ("x-request-timeout-ms", "200"),
            ],
            100,
        ),
        (&[("grpc-timeout", "2S"), ("grpc-timeout", "300m")], 300),
        (&[("grpc-timeout", "300m"), ("grpc-timeout", "2S")], 300),
    ];
    for (lines, want) in cases {
        let (status, budget, _) = budget_seen(layer.clone(), request_with_lines(lines)).await;
        assert_eq!(status, StatusCode::OK, "{lines:?}");
        assert_eq!(budget, Some(Duration::from_millis(want)), "{lines:?}");
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_comma_separated_list_takes_the_shortest() {
    let layer = ServerDeadlineLayer::new().grpc_lead(Duration::ZERO);
    for (name, value, want) in [
        ("x-request-timeout-ms", "200, 100", 100),
        ("x-request-timeout-ms", "100,200", 100),
        ("x-request-timeout-ms", "300 ,\t250, 400", 250),
        ("grpc-timeout", "1S, 400m", 400),
    ] {
        let (status, budget, _) = budget_seen(layer.clone(), request_with(name, value)).await;
        assert_eq!(status, StatusCode::OK, "{value:?}");
        assert_eq!(budget, Some(Duration::from_millis(want)), "{value:?}");
    }
    // Lists and lines mix, and across both headers the shortest still wins.
    let req = request_with_lines(&[
        ("x-request-timeout-ms", "900, 800"),
        ("x-request-timeout-ms", "700"),
        ("grpc-timeout", "1S, 750m"),
    ]);
    let (_, budget, _) = budget_seen(layer, req).await;
    assert_eq!(budget, Some(Duration::from_millis(700)));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_malformed_value_among_several_is_skipped_by_default() {
    let layer = ServerDeadlineLayer::new()
        .grpc_lead(Duration::ZERO)
        .default_timeout(Duration::from_secs(3));
    let cases: [(Lines, u64); 5] = [
        (
            &[
                ("x-request-timeout-ms", "banana"),
                ("x-request-timeout-ms", "200"),
            ],
            200,
        ),
        (&[("x-request-timeout-ms", "200, banana")], 200),
        (&[("x-request-timeout-ms", "-1, 150")], 150),
        (&[("x-request-timeout-ms", "150,,900")], 150),
        (&[("grpc-timeout", "1s"), ("grpc-timeout", "250m")], 250),
    ];
    for (lines, want) in cases {
        let (status, budget, calls) = budget_seen(layer.clone(), request_with_lines(lines)).await;
        assert_eq!((status, calls), (StatusCode::OK, 1), "{lines:?}");
        assert_eq!(budget, Some(Duration::from_millis(want)), "{lines:?}");
    }
    // All malformed: the default budget applies, as for a single one.
    let req = request_with_lines(&[("x-request-timeout-ms", "banana, -1")]);
    let (_, budget, _) = budget_seen(layer, req).await;
    assert_eq!(budget, Some(Duration::from_secs(3)));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_malformed_value_among_several_is_rejected_under_reject() {
    let layer = ServerDeadlineLayer::new().on_malformed(OnMalformed::Reject);
    for lines in [
        &[
            ("x-request-timeout-ms", "200"),
            ("x-request-timeout-ms", "banana"),
        ][..],
        &[("x-request-timeout-ms", "200, banana")],
        &[("x-request-timeout-ms", "200,")],
    ] {
        let (status, _, calls) = budget_seen(layer.clone(), request_with_lines(lines)).await;
        assert_eq!((status, calls), (StatusCode::BAD_REQUEST, 0), "{lines:?}");
    }

    // On a gRPC request: trailers-only INVALID_ARGUMENT.
    let calls = CallCounter::default();
    let svc = layer.layer(recording_handler(Seen::default(), calls.clone()));
    let req = request_with_lines(&[
        ("content-type", "application/grpc"),
        ("x-request-timeout-ms", "100, 1.5"),
    ]);
    let response = svc.oneshot(req).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["grpc-status"], "3");
    assert_eq!(calls.calls(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn under_reject_several_grpc_timeouts_are_rejected_but_several_millis_values_are_not() {
    // The gRPC protocol allows one grpc-timeout, and implementations differ
    // on which of several they obey: strict mode reports it.
    let layer = ServerDeadlineLayer::new().on_malformed(OnMalformed::Reject);
    let calls = CallCounter::default();
    let svc = layer
        .clone()
        .layer(recording_handler(Seen::default(), calls.clone()));
    for timeouts in [&["1S", "200m"][..], &["1S, 200m"]] {
        let mut req = grpc_request(timeouts[0]);
        for more in &timeouts[1..] {
            req.headers_mut()
                .append("grpc-timeout", http::HeaderValue::from_static(more));
        }
        let response = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(response.headers()["grpc-status"], "3", "{timeouts:?}");
        assert_eq!(
            response.headers()["grpc-message"],
            "more than one grpc-timeout value"
        );
    }
    assert_eq!(calls.calls(), 0);

    // The millisecond header is a plain HTTP list: the shortest counts.
    let req = request_with_lines(&[
        ("x-request-timeout-ms", "200"),
        ("x-request-timeout-ms", "100, 300"),
    ]);
    let (status, budget, calls) = budget_seen(layer, req).await;
    assert_eq!((status, calls), (StatusCode::OK, 1));
    assert_eq!(budget, Some(Duration::from_millis(100)));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_huge_grpc_timeout_is_clamped_to_the_default_maximum() {
    // Regression: with no maximum configured, `99999999H` (about 11,000
    // years) was used as sent.
    assert_eq!(DEFAULT_MAX_TIMEOUT, Duration::from_secs(300));
    let start = Instant::now();
    let seen = Arc::new(Mutex::new(None));
    let svc = ServerDeadlineLayer::new().layer(service_fn({
        let seen = seen.clone();
        move |req: Request<()>| {
            *seen.lock().unwrap() = Deadline::from_extensions(req.extensions());
            async { Ok::<_, Infallible>(Response::new(())) }
        }
    }));
    svc.clone()
        .oneshot(request_with("grpc-timeout", "99999999H"))
        .await
        .unwrap();
    let deadline = seen.lock().unwrap().take().unwrap();
    assert_eq!(deadline.instant(), start + DEFAULT_MAX_TIMEOUT);
    assert_eq!(deadline.remaining(), DEFAULT_MAX_TIMEOUT);

    // On a gRPC request the lead applies after the clamp.
    svc.clone()
        .oneshot(grpc_request("99999999H"))
        .await
        .unwrap();
    let deadline = seen.lock().unwrap().take().unwrap();
    assert_eq!(
        deadline.instant(),
        start + DEFAULT_MAX_TIMEOUT - Duration::from_millis(1)
    );

    // The millisecond header too; a budget just below the maximum is kept.
    let (_, budget, _) = budget_seen(
        ServerDeadlineLayer::new(),
        request_with("x-request-timeout-ms", "9999999999"),
    )
    .await;
    assert_eq!(budget, Some(DEFAULT_MAX_TIMEOUT));
    let (_, budget, _) = budget_seen(
        ServerDeadlineLayer::new(),
        request_with("x-request-timeout-ms", "299999"),
    )
    .await;
    assert_eq!(budget, Some(Duration::from_millis(299_999)));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_handler_under_a_huge_budget_is_cut_at_the_default_maximum() {
    let drops = DropCounter::default();
    let mut svc = ServerDeadlineLayer::new().layer(hanging_handler(drops.clone()));
    let mut fut = task::spawn(svc.call(request_with("grpc-timeout", "99999999H")));
    assert_pending!(fut.poll());
    advance(DEFAULT_MAX_TIMEOUT - Duration::from_millis(1)).await;
    assert_pending!(fut.poll());
    advance(Duration::from_millis(1)).await;
    let response = assert_ready_ok!(fut.poll());
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(drops.dropped(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn max_timeout_duration_max_lifts_the_limit() {
    let layer = ServerDeadlineLayer::new().max_timeout(Duration::MAX);
    let (_, budget, _) = budget_seen(layer, request_with("grpc-timeout", "1000H")).await;
    assert_eq!(budget, Some(Duration::from_secs(1000 * 3600)));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_built_in_maximum_does_not_shorten_a_configured_default() {
    let ten_minutes = Duration::from_secs(600);
    let layer = ServerDeadlineLayer::new().default_timeout(ten_minutes);
    let (_, budget, _) = budget_seen(layer.clone(), Request::new(())).await;
    assert_eq!(budget, Some(ten_minutes));
    // A caller asking for as much is still clamped.
    let (_, budget, _) = budget_seen(layer, request_with("x-request-timeout-ms", "600000")).await;
    assert_eq!(budget, Some(DEFAULT_MAX_TIMEOUT));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn custom_header_name_is_read_and_default_name_ignored() {
    let layer = ServerDeadlineLayer::new().http_header(http::HeaderName::from_static("x-budget"));
    let (_, budget, _) = budget_seen(layer.clone(), request_with("x-budget", "42")).await;
    assert_eq!(budget, Some(Duration::from_millis(42)));
    let (_, budget, _) = budget_seen(layer, request_with("x-request-timeout-ms", "42")).await;
    assert_eq!(budget, None);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn budget_is_clamped_to_the_maximum() {
    let layer = ServerDeadlineLayer::new().max_timeout(Duration::from_secs(1));
    let (_, budget, _) =
        budget_seen(layer.clone(), request_with("x-request-timeout-ms", "10000")).await;
    assert_eq!(budget, Some(Duration::from_secs(1)));
    // Below the maximum it is left alone.
    let (_, budget, _) = budget_seen(layer, request_with("x-request-timeout-ms", "999")).await;
    assert_eq!(budget, Some(Duration::from_millis(999)));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn default_applies_when_absent_and_is_clamped_too() {
    let layer = ServerDeadlineLayer::new().default_timeout(Duration::from_secs(5));
    let (_, budget, _) = budget_seen(layer.clone(), Request::new(())).await;
    assert_eq!(budget, Some(Duration::from_secs(5)));

    let (_, budget, _) =
        budget_seen(layer.max_timeout(Duration::from_secs(2)), Request::new(())).await;
    assert_eq!(budget, Some(Duration::from_secs(2)));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn without_header_or_default_there_is_no_deadline() {
    let (status, budget, calls) = budget_seen(ServerDeadlineLayer::new(), Request::new(())).await;
    assert_eq!((status, budget, calls), (StatusCode::OK, None, 1));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_earlier_deadline_already_in_extensions_wins() {
    let mut req = request_with("x-request-timeout-ms", "500");
    req.extensions_mut()
        .insert(Deadline::after(Duration::from_millis(200)));
    let (_, budget, _) = budget_seen(ServerDeadlineLayer::new(), req).await;
    assert_eq!(budget, Some(Duration::from_millis(200)));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn malformed_values_are_ignored_by_default_and_the_default_applies() {
    let layer = ServerDeadlineLayer::new().default_timeout(Duration::from_secs(3));
    for bad in ["", "-5", "5ms", "12345678901", " 7"] {
        let req = Request::builder()
            .header("x-request-timeout-ms", bad)
            .body(())
            .unwrap();
        let (status, budget, calls) = budget_seen(layer.clone(), req).await;
        assert_eq!(status, StatusCode::OK, "{bad:?}");
        assert_eq!(budget, Some(Duration::from_secs(3)), "{bad:?}");
        assert_eq!(calls, 1);
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn malformed_values_are_rejected_with_400_when_configured() {
    let layer = ServerDeadlineLayer::new().on_malformed(OnMalformed::Reject);
    let (status, _, calls) =
        budget_seen(layer.clone(), request_with("x-request-timeout-ms", "1.5")).await;
    assert_eq!((status, calls), (StatusCode::BAD_REQUEST, 0));
    let (status, _, calls) = budget_seen(layer, request_with("grpc-timeout", "1s")).await;
    assert_eq!((status, calls), (StatusCode::BAD_REQUEST, 0));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn malformed_grpc_timeout_on_grpc_request_is_invalid_argument() {
    let layer = ServerDeadlineLayer::new().on_malformed(OnMalformed::Reject);
    let calls = CallCounter::default();
    let svc = layer.layer(recording_handler(Seen::default(), calls.clone()));
    let response = svc.oneshot(grpc_request("123456789m")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["grpc-status"], "3");
    assert_eq!(response.headers()["content-type"], "application/grpc");
    assert_eq!(calls.calls(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn fails_fast_below_the_minimum_without_calling_inner() {
    let layer = ServerDeadlineLayer::new().min_remaining(Duration::from_millis(50));
    // One below the minimum: refused.
    let (status, _, calls) =
        budget_seen(layer.clone(), request_with("x-request-timeout-ms", "49")).await;
    assert_eq!((status, calls), (StatusCode::GATEWAY_TIMEOUT, 0));
    // At the minimum: served.
    let (status, _, calls) =
        budget_seen(layer.clone(), request_with("x-request-timeout-ms", "50")).await;
    assert_eq!((status, calls), (StatusCode::OK, 1));
    // Above: served.
    let (status, _, calls) = budget_seen(layer, request_with("x-request-timeout-ms", "51")).await;
    assert_eq!((status, calls), (StatusCode::OK, 1));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_zero_budget_fails_fast_even_with_no_minimum() {
    let (status, _, calls) = budget_seen(
        ServerDeadlineLayer::new(),
        request_with("x-request-timeout-ms", "0"),
    )
    .await;
    assert_eq!((status, calls), (StatusCode::GATEWAY_TIMEOUT, 0));

    let calls = CallCounter::default();
    let svc = ServerDeadlineLayer::new().layer(recording_handler(Seen::default(), calls.clone()));
    let response = svc.oneshot(grpc_request("0n")).await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "4");
    assert!(
        tower_resilience_base::answer::is_local_answer(&response),
        "refused before the handler: a local answer"
    );
    assert_eq!(calls.calls(), 0);
}

/// A handler that never finishes and reports when its future is dropped.
fn hanging_handler(
    drops: DropCounter,
) -> impl Service<Request<()>, Response = Response<()>, Error = Infallible> + Clone {
    service_fn(move |_req: Request<()>| {
        let guard = drops.guard();
        async move {
            let _guard = guard;
            std::future::pending::<()>().await;
            Ok::<_, Infallible>(Response::new(()))
        }
    })
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn expiry_answers_504_at_the_deadline_and_drops_the_handler() {
    let drops = DropCounter::default();
    let mut svc = ServerDeadlineLayer::new().layer(hanging_handler(drops.clone()));
    let start = Instant::now();
    let mut fut = task::spawn(svc.call(request_with("x-request-timeout-ms", "100")));

    assert_pending!(fut.poll());
    advance(Duration::from_millis(99)).await;
    assert_pending!(fut.poll());
    assert_eq!(drops.dropped(), 0, "handler dropped before the deadline");

    advance(Duration::from_millis(1)).await;
    assert!(fut.is_woken());
    let response = assert_ready_ok!(fut.poll());
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert!(
        !tower_resilience_base::answer::is_local_answer(&response),
        "the handler ran: its failure, not a local refusal"
    );
    assert_eq!(Instant::now() - start, Duration::from_millis(100));
    // Dropped when the deadline fired, while the response future is still
    // alive.
    assert_eq!(drops.dropped(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn grpc_expiry_is_trailers_only_deadline_exceeded() {
    let drops = DropCounter::default();
    let mut svc = ServerDeadlineLayer::new().layer(hanging_handler(drops.clone()));
    let mut fut = task::spawn(svc.call(grpc_request("50m")));
    assert_pending!(fut.poll());
    // 1 ms lead: the answer comes at 49 ms, not 50.
    advance(Duration::from_millis(48)).await;
    assert_pending!(fut.poll());
    advance(Duration::from_millis(1)).await;
    let response = assert_ready_ok!(fut.poll());
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["grpc-status"], "4");
    assert_eq!(response.headers()["content-type"], "application/grpc");
    assert_eq!(drops.dropped(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_handler_finishing_in_time_is_answered_normally() {
    let svc = ServerDeadlineLayer::new().layer(service_fn(|_req: Request<()>| async {
        tokio::time::sleep(Duration::from_millis(99)).await;
        Ok::<_, Infallible>(Response::new(()))
    }));
    let response = svc
        .oneshot(request_with("x-request-timeout-ms", "100"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_handler_answering_because_its_own_call_hit_the_deadline_still_yields_504() {
    // The handler's outgoing call is cut by the same deadline and the
    // handler turns that into a 502 in the same timer tick; the caller must
    // still see the deadline's answer.
    let svc = ServerDeadlineLayer::new().layer(service_fn(|_req: Request<()>| async {
        let deadline = Deadline::current().unwrap();
        tokio::time::sleep_until(deadline.instant()).await;
        let mut response = Response::new(());
        *response.status_mut() = StatusCode::BAD_GATEWAY;
        Ok::<_, Infallible>(response)
    }));
    let response = svc
        .oneshot(request_with("x-request-timeout-ms", "100"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn inner_errors_pass_through_unchanged() {
    #[derive(Debug, PartialEq)]
    struct Boom;
    let svc = ServerDeadlineLayer::new().layer(service_fn(|_req: Request<()>| async {
        Err::<Response<()>, _>(Boom)
    }));
    let err = svc
        .oneshot(request_with("x-request-timeout-ms", "100"))
        .await
        .unwrap_err();
    assert_eq!(err, Boom);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn readiness_is_forwarded_from_the_inner_service() {
    let (mut svc, mut handle) =
        tower_test::mock::spawn_layer::<Request<()>, Response<()>, _>(ServerDeadlineLayer::new());
    handle.allow(0);
    assert_pending!(svc.poll_ready());
    handle.allow(1);
    assert!(svc.is_woken());
    assert_ready_ok!(svc.poll_ready());

    let fut = svc.call(request_with("x-request-timeout-ms", "100"));
    let (req, send) = handle.next_request().await.unwrap();
    assert!(Deadline::from_extensions(req.extensions()).is_some());
    send.send_response(Response::new(()));
    assert_eq!(fut.await.unwrap().status(), StatusCode::OK);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn dropping_the_response_future_drops_the_handler() {
    let drops = DropCounter::default();
    let mut svc = ServerDeadlineLayer::new().layer(hanging_handler(drops.clone()));
    let mut fut = task::spawn(svc.call(request_with("x-request-timeout-ms", "1000")));
    assert_pending!(fut.poll());
    drop(fut);
    assert_eq!(drops.dropped(), 1);
    // And an unbounded request too.
    let mut fut = task::spawn(svc.call(Request::new(())));
    assert_pending!(fut.poll());
    drop(fut);
    assert_eq!(drops.dropped(), 2);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn answer_futures_are_ready_at_once() {
    let mut svc = ServerDeadlineLayer::new().layer(hanging_handler(DropCounter::default()));
    let mut fut = task::spawn(svc.call(request_with("x-request-timeout-ms", "0")));
    let response = assert_ready!(fut.poll()).unwrap();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
}
