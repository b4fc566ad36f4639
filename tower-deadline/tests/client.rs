//! The client layer: effective deadline, header written at send time,
//! enforcement and typed errors.

mod support;

use std::time::Duration;

use http::{Request, Response};
use support::{request_with_lines, CallCounter, DropCounter, Lines};
use tokio::time::advance;
use tokio_test::{assert_pending, assert_ready, assert_ready_ok, task};
use tower::{service_fn, BoxError, Layer, ServiceBuilder, ServiceExt};
use tower_deadline::error::{DeadlineExceeded, InsufficientBudget};
use tower_deadline::{CallContext, ClientDeadlineLayer, Deadline};
use tower_service::Service;

/// What `echo` saw: the millisecond header, `grpc-timeout` and the deadline.
type Echo = (Option<String>, Option<String>, Option<Deadline>);

/// An inner service that echoes the request's budget header and deadline.
fn echo(
    calls: CallCounter,
) -> impl Service<Request<()>, Response = Response<Echo>, Error = BoxError> + Clone {
    service_fn(move |req: Request<()>| {
        calls.hit();
        let header = |name: &str| {
            req.headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        let body = (
            header("x-request-timeout-ms"),
            header("grpc-timeout"),
            CallContext::current(|cx| cx.deadline()),
        );
        async move { Ok::<_, BoxError>(Response::new(body)) }
    })
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn without_any_deadline_the_request_passes_untouched() {
    let calls = CallCounter::default();
    let svc = ClientDeadlineLayer::new().layer(echo(calls.clone()));
    let (ms, grpc, ext) = svc
        .oneshot(Request::new(()))
        .await
        .unwrap()
        .into_body()
        .into_inner();
    assert_eq!((ms, grpc, ext), (None, None, None));
    assert_eq!(calls.calls(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn default_timeout_is_written_and_inserted() {
    let svc = ClientDeadlineLayer::new()
        .default_timeout(Duration::from_millis(750))
        .layer(echo(CallCounter::default()));
    let (ms, grpc, ext) = svc
        .oneshot(Request::new(()))
        .await
        .unwrap()
        .into_body()
        .into_inner();
    assert_eq!(ms.as_deref(), Some("750"));
    assert_eq!(grpc, None);
    assert_eq!(ext.unwrap().remaining(), Duration::from_millis(750));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn task_local_deadline_is_inherited_and_measured_at_send_time() {
    let svc = ClientDeadlineLayer::new()
        .margin(Duration::from_millis(10))
        .layer(echo(CallCounter::default()));
    let deadline = Deadline::after(Duration::from_millis(300));
    let (ms, _, ext) = deadline
        .scope(async move {
            // Time spent in the handler before the call shrinks the budget.
            tokio::time::sleep(Duration::from_millis(120)).await;
            svc.oneshot(Request::new(())).await
        })
        .await
        .unwrap()
        .into_body()
        .into_inner();
    // 300 - 120 - 10 (margin)
    assert_eq!(ms.as_deref(), Some("170"));
    assert_eq!(ext, Some(deadline));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_earliest_of_extension_task_local_and_default_wins() {
    let svc = ClientDeadlineLayer::new()
        .default_timeout(Duration::from_millis(500))
        .layer(echo(CallCounter::default()));

    let cases = [
        // (extension, task-local, expected header)
        (Some(100), Some(200), "100"),
        (Some(300), Some(200), "200"),
        (Some(900), Some(800), "500"),
        (None, Some(50), "50"),
        (Some(70), None, "70"),
        (None, None, "500"),
    ];
    for (ext, scoped, want) in cases {
        let mut req = Request::new(());
        if let Some(ms) = ext {
            req.extensions_mut()
                .insert(Deadline::after(Duration::from_millis(ms)));
        }
        let call = svc.clone().oneshot(req);
        let response = match scoped {
            Some(ms) => Deadline::after(Duration::from_millis(ms)).scope(call).await,
            None => call.await,
        };
        let (ms, _, _) = response.unwrap().into_body().into_inner();
        assert_eq!(ms.as_deref(), Some(want), "{ext:?} {scoped:?}");
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn grpc_requests_get_grpc_timeout_instead_of_the_http_header() {
    let svc = ClientDeadlineLayer::new()
        .default_timeout(Duration::from_millis(1500))
        .layer(echo(CallCounter::default()));
    let req = Request::builder()
        .header("content-type", "application/grpc+proto")
        .header("grpc-timeout", "1H") // replaced
        .body(())
        .unwrap();
    let (ms, grpc, _) = svc.oneshot(req).await.unwrap().into_body().into_inner();
    assert_eq!(ms, None);
    assert_eq!(grpc.as_deref(), Some("1500m"));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_shorter_budget_already_in_the_request_header_is_kept() {
    // Regression: tonic's `Request::set_timeout(1500ms)` writes
    // `grpc-timeout: 1500m`; a longer default used to overwrite it, silently
    // lengthening the caller's deadline.
    let svc = ClientDeadlineLayer::new()
        .default_timeout(Duration::from_secs(2))
        .layer(echo(CallCounter::default()));
    let req = Request::builder()
        .header("content-type", "application/grpc")
        .header("grpc-timeout", "1500m")
        .body(())
        .unwrap();
    let (_, grpc, ext) = svc
        .clone()
        .oneshot(req)
        .await
        .unwrap()
        .into_body()
        .into_inner();
    assert_eq!(grpc.as_deref(), Some("1500m"));
    assert_eq!(ext.unwrap().remaining(), Duration::from_millis(1500));

    // Same for the millisecond header on plain HTTP requests; a longer one
    // is shortened to the default.
    for (sent, want) in [("700", "700"), ("9000", "2000")] {
        let req = Request::builder()
            .header("x-request-timeout-ms", sent)
            .body(())
            .unwrap();
        let (ms, _, _) = svc
            .clone()
            .oneshot(req)
            .await
            .unwrap()
            .into_body()
            .into_inner();
        assert_eq!(ms.as_deref(), Some(want), "sent {sent}");
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_header_written_from_the_extension_is_not_read_again() {
    // Two client layers (around a retry layer, say): the inner one must
    // not shrink the budget by re-reading the outer one's header less its
    // margin.
    let svc = ServiceBuilder::new()
        .layer(ClientDeadlineLayer::new().margin(Duration::from_millis(50)))
        .layer(ClientDeadlineLayer::new().margin(Duration::from_millis(50)))
        .service(echo(CallCounter::default()));
    let deadline = Deadline::after(Duration::from_millis(1000));
    let (ms, _, ext) = deadline
        .scope(svc.oneshot(Request::new(())))
        .await
        .unwrap()
        .into_body()
        .into_inner()
        .into_inner();
    assert_eq!(ms.as_deref(), Some("950"));
    assert_eq!(ext, Some(deadline));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_existing_header_is_replaced_not_duplicated() {
    let svc = ClientDeadlineLayer::new()
        .default_timeout(Duration::from_millis(40))
        .layer(service_fn(|req: Request<()>| async move {
            let values: Vec<_> = req
                .headers()
                .get_all("x-request-timeout-ms")
                .iter()
                .cloned()
                .collect();
            Ok::<_, BoxError>(Response::new(values))
        }));
    let req = Request::builder()
        .header("x-request-timeout-ms", "99999")
        .header("x-request-timeout-ms", "88888")
        .body(())
        .unwrap();
    let values = svc.oneshot(req).await.unwrap().into_body().into_inner();
    assert_eq!(values, ["40"]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_request_with_other_headers_gets_the_budget_beside_them() {
    let svc = ClientDeadlineLayer::new()
        .default_timeout(Duration::from_millis(40))
        .layer(service_fn(|req: Request<()>| async move {
            let mut lines: Vec<_> = req
                .headers()
                .iter()
                .map(|(name, value)| format!("{name}: {}", value.to_str().unwrap()))
                .collect();
            lines.sort();
            Ok::<_, BoxError>(Response::new(lines))
        }));
    let req = Request::builder()
        .header("accept", "*/*")
        .header("x-request-id", "7")
        .header("x-request-id", "8")
        .body(())
        .unwrap();
    let lines = svc.oneshot(req).await.unwrap().into_body().into_inner();
    assert_eq!(
        lines,
        [
            "accept: */*",
            "x-request-id: 7",
            "x-request-id: 8",
            "x-request-timeout-ms: 40"
        ]
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_grpc_request_with_a_shorter_grpc_timeout_keeps_one_value() {
    let svc = ClientDeadlineLayer::new()
        .default_timeout(Duration::from_secs(1))
        .layer(service_fn(|req: Request<()>| async move {
            let values: Vec<_> = req
                .headers()
                .get_all("grpc-timeout")
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect();
            Ok::<_, BoxError>(Response::new(values))
        }));
    let req = Request::builder()
        .header("content-type", "application/grpc")
        .header("grpc-timeout", "200m")
        .header("grpc-timeout", "900m")
        .body(())
        .unwrap();
    let values = svc.oneshot(req).await.unwrap().into_body().into_inner();
    assert_eq!(values, ["200m"], "the shortest, written once");
}

/// What `echo_all` saw: every value of the millisecond header, every value
/// of `grpc-timeout`, and the deadline.
type EchoAll = (Vec<String>, Vec<String>, Option<Deadline>);

/// An inner service that echoes every line of both budget headers.
fn echo_all(
    calls: CallCounter,
) -> impl Service<Request<()>, Response = Response<EchoAll>, Error = BoxError> + Clone {
    service_fn(move |req: Request<()>| {
        calls.hit();
        let lines = |name: &str| -> Vec<String> {
            req.headers()
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect()
        };
        let body = (
            lines("x-request-timeout-ms"),
            lines("grpc-timeout"),
            CallContext::current(|cx| cx.deadline()),
        );
        async move { Ok::<_, BoxError>(Response::new(body)) }
    })
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_malformed_header_with_no_deadline_in_scope_is_not_forwarded() {
    // Regression: with no deadline from any source the request passed
    // through untouched, `x-request-timeout-ms: banana` included.
    let calls = CallCounter::default();
    let svc = ClientDeadlineLayer::new().layer(echo_all(calls.clone()));
    let cases: [Lines; 5] = [
        &[("x-request-timeout-ms", "banana")],
        &[("x-request-timeout-ms", "")],
        &[
            ("x-request-timeout-ms", "banana"),
            ("x-request-timeout-ms", "-1, 1.5"),
        ],
        &[
            ("content-type", "application/grpc"),
            ("grpc-timeout", "10s"),
        ],
        &[
            ("content-type", "application/grpc"),
            ("grpc-timeout", "123456789m"),
        ],
    ];
    for lines in cases {
        let before = calls.calls();
        let (ms, grpc, deadline) = svc
            .clone()
            .oneshot(request_with_lines(lines))
            .await
            .unwrap()
            .into_body()
            .into_inner();
        assert!(ms.is_empty(), "{lines:?} forwarded {ms:?}");
        assert!(grpc.is_empty(), "{lines:?} forwarded {grpc:?}");
        assert_eq!(deadline, None, "{lines:?}");
        assert_eq!(calls.calls() - before, 1, "the call is still made");
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_malformed_header_is_replaced_when_a_deadline_is_in_scope() {
    let svc = ClientDeadlineLayer::new().layer(echo_all(CallCounter::default()));
    let req = Request::builder()
        .header("x-request-timeout-ms", "banana")
        .body(())
        .unwrap();
    let (ms, _, _) = Deadline::after(Duration::from_millis(300))
        .scope(svc.oneshot(req))
        .await
        .unwrap()
        .into_body()
        .into_inner();
    assert_eq!(ms, ["300"]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn duplicates_on_an_outgoing_request_give_the_shortest_budget() {
    // Regression: only the first line was read, so a later, shorter budget
    // was lengthened to the first one.
    let svc = ClientDeadlineLayer::new().layer(echo_all(CallCounter::default()));
    let cases: [(Lines, u64, &str, &str); 5] = [
        (
            &[
                ("x-request-timeout-ms", "700"),
                ("x-request-timeout-ms", "300"),
            ],
            300,
            "x-request-timeout-ms",
            "300",
        ),
        (
            &[("x-request-timeout-ms", "900, 400")],
            400,
            "x-request-timeout-ms",
            "400",
        ),
        (
            &[
                ("x-request-timeout-ms", "banana"),
                ("x-request-timeout-ms", "250, -1"),
            ],
            250,
            "x-request-timeout-ms",
            "250",
        ),
        (
            &[
                ("content-type", "application/grpc"),
                ("grpc-timeout", "2S"),
                ("grpc-timeout", "500m"),
            ],
            500,
            "grpc-timeout",
            "500m",
        ),
        (
            &[
                ("content-type", "application/grpc"),
                ("grpc-timeout", "1S, 600m"),
            ],
            600,
            "grpc-timeout",
            "600m",
        ),
    ];
    for (lines, want_ms, header, written) in cases {
        let (ms, grpc, deadline) = svc
            .clone()
            .oneshot(request_with_lines(lines))
            .await
            .unwrap()
            .into_body()
            .into_inner();
        assert_eq!(
            deadline.unwrap().remaining(),
            Duration::from_millis(want_ms),
            "{lines:?}"
        );
        // One line, freshly written, replaces them all.
        let seen = if header == "grpc-timeout" { grpc } else { ms };
        assert_eq!(seen, [written], "{lines:?}");
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn no_http_header_still_enforces_locally() {
    let drops = DropCounter::default();
    let svc = ClientDeadlineLayer::new()
        .no_http_header()
        .default_timeout(Duration::from_millis(10))
        .layer(hanging(drops.clone(), CallCounter::default()));
    let err = svc.oneshot(Request::new(())).await.unwrap_err();
    assert!(err.is::<DeadlineExceeded>());
    assert_eq!(drops.dropped(), 1);
}

fn hanging(
    drops: DropCounter,
    calls: CallCounter,
) -> impl Service<Request<()>, Response = Response<()>, Error = BoxError> + Clone {
    service_fn(move |_req: Request<()>| {
        calls.hit();
        let guard = drops.guard();
        async move {
            let _guard = guard;
            std::future::pending::<()>().await;
            Ok::<_, BoxError>(Response::new(()))
        }
    })
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_call_is_cut_exactly_at_the_deadline() {
    let drops = DropCounter::default();
    let mut svc = ClientDeadlineLayer::new()
        .default_timeout(Duration::from_millis(200))
        .layer(hanging(drops.clone(), CallCounter::default()));
    let mut fut = task::spawn(svc.call(Request::new(())));
    assert_pending!(fut.poll());
    advance(Duration::from_millis(199)).await;
    assert_pending!(fut.poll());
    assert_eq!(drops.dropped(), 0);
    advance(Duration::from_millis(1)).await;
    assert!(fut.is_woken());
    let err = assert_ready!(fut.poll()).unwrap_err();
    assert!(err.is::<DeadlineExceeded>(), "{err}");
    assert_eq!(err.to_string(), "deadline exceeded");
    assert_eq!(
        drops.dropped(),
        1,
        "the inner call must be cancelled at the deadline"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_expired_deadline_fails_without_calling_inner() {
    let calls = CallCounter::default();
    let svc = ClientDeadlineLayer::new().layer(hanging(DropCounter::default(), calls.clone()));
    let deadline = Deadline::after(Duration::from_millis(5));
    advance(Duration::from_millis(5)).await;
    let err = deadline
        .scope(svc.oneshot(Request::new(())))
        .await
        .unwrap_err();
    let refused = err
        .downcast_ref::<InsufficientBudget>()
        .expect("typed error");
    assert_eq!(refused.remaining(), Duration::ZERO);
    assert_eq!(err.to_string(), "deadline already passed before the call");
    assert_eq!(calls.calls(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn min_remaining_is_a_boundary_one_below_at_and_above() {
    let calls = CallCounter::default();
    let svc = ClientDeadlineLayer::new()
        .min_remaining(Duration::from_millis(20))
        .layer(echo(calls.clone()));
    for (budget, called) in [(19, false), (20, true), (21, true)] {
        let before = calls.calls();
        let result = Deadline::after(Duration::from_millis(budget))
            .scope(svc.clone().oneshot(Request::new(())))
            .await;
        assert_eq!(result.is_ok(), called, "budget {budget}");
        assert_eq!(calls.calls() - before, usize::from(called));
        if let Err(err) = result {
            let refused = err.downcast_ref::<InsufficientBudget>().unwrap();
            assert_eq!(refused.remaining(), Duration::from_millis(budget));
            assert_eq!(refused.required(), Duration::from_millis(20));
        }
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn errors_downcast_behind_a_second_layer() {
    let svc = ServiceBuilder::new()
        .map_err(|e: BoxError| -> BoxError { e })
        .layer(tower::timeout::TimeoutLayer::new(Duration::from_secs(60)))
        .layer(ClientDeadlineLayer::new().default_timeout(Duration::from_millis(10)))
        .service(hanging(DropCounter::default(), CallCounter::default()));
    let err = svc.oneshot(Request::new(())).await.unwrap_err();
    assert!(err.is::<DeadlineExceeded>());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_inner_timeout_in_the_deadline_tick_is_reported_as_deadline_exceeded() {
    // tonic's Channel runs its own timer from the grpc-timeout header we
    // write; when it fires in the same tick as ours, the caller must get our
    // typed error, not the transport's.
    let svc = ClientDeadlineLayer::new()
        .default_timeout(Duration::from_millis(30))
        .layer(service_fn(|_req: Request<()>| {
            // Read during `call`, where the context lives.
            let deadline = CallContext::current(|cx| cx.deadline()).unwrap();
            async move {
                tokio::time::sleep_until(deadline.instant()).await;
                Err::<Response<()>, BoxError>("transport timer expired".into())
            }
        }));
    let err = svc.oneshot(Request::new(())).await.unwrap_err();
    assert!(err.is::<DeadlineExceeded>(), "{err}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_local_rejection_in_the_deadline_tick_is_kept() {
    // A layer below that refused the call (the circuit open, the bulkhead
    // full) never sent it, so no timer below can have fired: its refusal is
    // the answer even when it comes in the tick of the deadline.
    use tower_resilience_base::error::{BulkheadFull, CircuitOpen};
    for refusal in ["circuit", "bulkhead", "plain"] {
        let svc = ClientDeadlineLayer::new()
            .default_timeout(Duration::from_millis(30))
            .layer(service_fn(move |_req: Request<()>| {
                let deadline = CallContext::current(|cx| cx.deadline()).unwrap();
                async move {
                    tokio::time::sleep_until(deadline.instant()).await;
                    Err::<Response<()>, BoxError>(match refusal {
                        "circuit" => CircuitOpen::new("db", Duration::from_secs(1), false).into(),
                        "bulkhead" => BulkheadFull::new("db", 4, None).into(),
                        _ => "connection reset".into(),
                    })
                }
            }));
        let err = svc.oneshot(Request::new(())).await.unwrap_err();
        match refusal {
            "circuit" => assert!(err.is::<CircuitOpen>(), "{err}"),
            "bulkhead" => assert!(err.is::<BulkheadFull>(), "{err}"),
            // Anything else in that tick is taken for a timer below.
            _ => assert!(err.is::<DeadlineExceeded>(), "{err}"),
        }
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_response_in_the_deadline_tick_is_kept() {
    let svc = ClientDeadlineLayer::new()
        .default_timeout(Duration::from_millis(30))
        .layer(service_fn(|_req: Request<()>| {
            // Read during `call`, where the context lives.
            let deadline = CallContext::current(|cx| cx.deadline()).unwrap();
            async move {
                tokio::time::sleep_until(deadline.instant()).await;
                Ok::<_, BoxError>(Response::new("late but here"))
            }
        }));
    let response = svc.oneshot(Request::new(())).await.unwrap();
    assert_eq!(response.into_body().into_inner(), "late but here");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn inner_errors_pass_through() {
    let svc = ClientDeadlineLayer::new()
        .default_timeout(Duration::from_secs(1))
        .layer(service_fn(|_req: Request<()>| async {
            Err::<Response<()>, BoxError>("connection refused".into())
        }));
    let err = svc.oneshot(Request::new(())).await.unwrap_err();
    assert_eq!(err.to_string(), "connection refused");
    assert!(!err.is::<DeadlineExceeded>());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn readiness_is_forwarded_and_calls_pass_through() {
    let (mut svc, mut handle) = tower_test::mock::spawn_layer::<Request<()>, Response<()>, _>(
        ClientDeadlineLayer::new().default_timeout(Duration::from_secs(1)),
    );
    handle.allow(0);
    assert_pending!(svc.poll_ready());
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let fut = svc.call(Request::new(()));
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(req.headers()["x-request-timeout-ms"], "1000");
    send.send_response(Response::new(()));
    fut.await.unwrap();
}
