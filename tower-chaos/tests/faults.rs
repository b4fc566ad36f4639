//! Fault injection: off by default, each kind of fault as a caller meets
//! it, shares within their statistics, scope, run-time switching under
//! racing calls, marks, and how our other layers take injected faults.
//! Paused time and seeded draws throughout (except the race).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes_free::body_frames;
use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_chaos::{
    is_injected, FaultHandle, FaultKind, FaultLayer, FaultPlan, Injected, InjectedFault,
    INJECTED_FAULT_HEADER,
};
use tower_resilience_base::answer::is_local_answer;
use tower_resilience_base::classify::is_transient_error;
use tower_resilience_base::criticality::Criticality;
use tower_resilience_base::random::SeededRandom;

/// Reading a response body to its end (or its error) with
/// `http-body-util`.
mod bytes_free {
    use http_body_util::BodyExt;

    /// The data frames read before the body ended or failed, and the
    /// error if it failed.
    pub(crate) type BodyResult = (Vec<String>, Option<tower::BoxError>);

    pub(crate) async fn body_frames<B>(mut body: B) -> BodyResult
    where
        B: http_body::Body<Error = tower::BoxError> + Unpin,
        B::Data: AsRef<[u8]>,
    {
        let mut frames = Vec::new();
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        frames.push(String::from_utf8_lossy(data.as_ref()).into_owned());
                    }
                }
                Err(error) => return (frames, Some(error)),
            }
        }
        (frames, None)
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn seeded(seed: u64) -> FaultHandle {
    FaultHandle::with_random("dep", Arc::new(SeededRandom::new(seed)))
}

/// A body of two frames, `"a"` and `"b"`.
#[derive(Debug)]
struct TwoFrames(std::collections::VecDeque<&'static [u8]>);

impl http_body::Body for TwoFrames {
    type Data = &'static [u8];
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(|d| Ok(http_body::Frame::data(d))))
    }
}

/// A dependency answering `"ab"` in two frames, counting its calls.
fn dependency(
    calls: Arc<AtomicUsize>,
) -> impl tower::Service<
    Request<()>,
    Response = Response<TwoFrames>,
    Error = BoxError,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    service_fn(move |_req: Request<()>| {
        calls.fetch_add(1, Relaxed);
        async move {
            Ok::<_, BoxError>(Response::new(TwoFrames(
                [b"a".as_slice(), b"b".as_slice()].into(),
            )))
        }
    })
}

fn request() -> Request<()> {
    Request::new(())
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn off_by_default_every_call_passes_unmarked() {
    let calls = Arc::new(AtomicUsize::new(0));
    let faults = seeded(1);
    let svc = FaultLayer::new(faults.clone()).layer(dependency(calls.clone()));
    for _ in 0..1_000 {
        let response = svc.clone().oneshot(request()).await.expect("passes");
        assert!(response.headers().get(INJECTED_FAULT_HEADER).is_none());
        assert!(response.extensions().get::<Injected>().is_none());
        let (frames, error) = body_frames(response.into_body()).await;
        assert_eq!((frames.concat(), error.is_none()), ("ab".to_owned(), true));
    }
    assert_eq!(calls.load(Relaxed), 1_000);
    let s = faults.snapshot();
    assert!(!s.on);
    assert_eq!((s.eligible, s.injected), (0, [0; 5]));
}

/// 10% errors over 10,000 calls: within five standard deviations of
/// 1,000 (sqrt(10,000 * 0.1 * 0.9) = 30), and every other call reached
/// the dependency.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_ten_percent_share_lands_within_five_sigma() {
    let calls = Arc::new(AtomicUsize::new(0));
    let faults = seeded(2);
    faults.set(FaultPlan::new().error(0.1)).unwrap();
    let svc = FaultLayer::new(faults.clone()).layer(dependency(calls.clone()));
    let mut injected = 0;
    for _ in 0..10_000 {
        if let Err(error) = svc.clone().oneshot(request()).await {
            assert!(is_injected(&*error), "{error}");
            injected += 1;
        }
    }
    assert!((850..=1_150).contains(&injected), "{injected}");
    assert_eq!(calls.load(Relaxed), 10_000 - injected);
    let s = faults.snapshot();
    assert_eq!(s.injected[FaultKind::Error.index()], injected as u64);
    assert_eq!(s.eligible, 10_000);
}

#[derive(Debug, Default)]
struct Seen {
    latency: usize,
    error: usize,
    status: usize,
    hang: usize,
    abort: usize,
    clean: usize,
}

/// Every kind of fault in one plan, each observed as a caller meets it:
/// a slower answer, a transient error, a 503 that is the dependency's
/// (not a local answer), a call that never answers before its deadline,
/// a body that fails after its first frame; each marked.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn each_kind_is_observed_as_a_caller_meets_it_and_marked() {
    let calls = Arc::new(AtomicUsize::new(0));
    let faults = seeded(3);
    faults
        .set(
            FaultPlan::new()
                .latency(0.2, ms(50))
                .error(0.1)
                .status(0.1, StatusCode::SERVICE_UNAVAILABLE)
                .hang(0.1)
                .abort_body(0.1, 1),
        )
        .unwrap();
    let svc = FaultLayer::new(faults.clone()).layer(dependency(calls.clone()));
    let mut seen = Seen::default();
    for _ in 0..1_000 {
        let started = Instant::now();
        let outcome = tokio::time::timeout(ms(500), svc.clone().oneshot(request())).await;
        let elapsed = started.elapsed();
        let Ok(result) = outcome else {
            assert!(elapsed >= ms(500));
            seen.hang += 1;
            continue;
        };
        let delayed = elapsed >= ms(50);
        match result {
            Err(error) => {
                let fault = error.downcast_ref::<InjectedFault>().expect("injected");
                assert_eq!(fault.kind(), FaultKind::Error);
                assert!(is_transient_error(&*error), "retried as a reset would be");
                seen.error += 1;
                seen.latency += usize::from(delayed);
            }
            Ok(response) => {
                let mark = response.extensions().get::<Injected>().copied();
                assert_eq!(
                    mark.is_some_and(|m| m.contains(FaultKind::Latency)),
                    delayed,
                    "{elapsed:?}"
                );
                seen.latency += usize::from(delayed);
                if response.status() == 503 {
                    assert!(mark.unwrap().contains(FaultKind::Status));
                    assert!(!is_local_answer(&response), "the dependency's answer");
                    assert!(response.headers()[INJECTED_FAULT_HEADER]
                        .to_str()
                        .unwrap()
                        .contains("status"));
                    seen.status += 1;
                    continue;
                }
                let aborted = mark.is_some_and(|m| m.contains(FaultKind::AbortBody));
                let (frames, error) = body_frames(response.into_body()).await;
                if aborted {
                    assert_eq!(frames, ["a"]);
                    let error = error.expect("cut after one frame");
                    let fault = error.downcast_ref::<InjectedFault>().expect("injected");
                    assert_eq!(fault.kind(), FaultKind::AbortBody);
                    seen.abort += 1;
                } else {
                    assert_eq!((frames.concat(), error.is_none()), ("ab".to_owned(), true));
                    if !delayed {
                        seen.clean += 1;
                    }
                }
            }
        }
    }
    let s = faults.snapshot();
    // A hung call may have drawn latency too, unseen behind the hang.
    let latency = s.injected[FaultKind::Latency.index()];
    assert!(
        (seen.latency as u64..=(seen.latency + seen.hang) as u64).contains(&latency),
        "{latency} {seen:?}"
    );
    assert_eq!(s.injected[FaultKind::Error.index()], seen.error as u64);
    assert_eq!(s.injected[FaultKind::Status.index()], seen.status as u64);
    assert_eq!(s.injected[FaultKind::Hang.index()], seen.hang as u64);
    assert_eq!(s.injected[FaultKind::AbortBody.index()], seen.abort as u64);
    for (n, expected) in [
        (latency as usize, 200),
        (seen.error, 100),
        (seen.status, 100),
        (seen.hang, 100),
        (seen.abort, 100),
    ] {
        // Five standard deviations of a binomial share of 1,000.
        let sigma =
            (1_000.0 * (expected as f64 / 1_000.0) * (1.0 - expected as f64 / 1_000.0)).sqrt();
        assert!(
            (n as f64 - expected as f64).abs() <= 5.0 * sigma,
            "{seen:?}"
        );
    }
    assert!(seen.clean > 0);
    // Error, status and hang never reached the dependency.
    assert_eq!(
        calls.load(Relaxed),
        1_000 - seen.error - seen.status - seen.hang
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_hang_without_a_deadline_fails_after_max_hang() {
    let faults = seeded(4);
    faults
        .set(FaultPlan::new().hang(1.0).max_hang(Duration::from_secs(3)))
        .unwrap();
    let svc = FaultLayer::new(faults).layer(dependency(Arc::default()));
    let started = Instant::now();
    let error = svc.oneshot(request()).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    let fault = error.downcast_ref::<InjectedFault>().expect("injected");
    assert_eq!((fault.kind(), fault.layer()), (FaultKind::Hang, "dep"));
    assert!(is_transient_error(&*error), "a timed out read");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_status_on_a_grpc_request_is_trailers_only() {
    let faults = seeded(5);
    faults
        .set(FaultPlan::new().status(1.0, StatusCode::TOO_MANY_REQUESTS))
        .unwrap();
    let svc = FaultLayer::new(faults).layer(dependency(Arc::default()));
    let grpc = Request::builder()
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let response = svc.clone().oneshot(grpc).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["grpc-status"], "8"); // RESOURCE_EXHAUSTED
    assert_eq!(response.headers()[INJECTED_FAULT_HEADER], "status");
    let response = svc.oneshot(request()).await.unwrap();
    assert_eq!(response.status(), 429);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_plan_changes_and_stops_at_run_time() {
    let calls = Arc::new(AtomicUsize::new(0));
    let faults = seeded(6);
    let svc = FaultLayer::new(faults.clone()).layer(dependency(calls.clone()));
    faults.set(FaultPlan::new().error(1.0)).unwrap();
    assert!(svc.clone().oneshot(request()).await.is_err());
    faults
        .set(FaultPlan::new().status(1.0, StatusCode::BAD_GATEWAY))
        .unwrap();
    assert_eq!(svc.clone().oneshot(request()).await.unwrap().status(), 502);
    faults.off();
    assert_eq!(svc.clone().oneshot(request()).await.unwrap().status(), 200);
    faults.on();
    assert_eq!(svc.clone().oneshot(request()).await.unwrap().status(), 502);
    // A plan that injects nothing is off.
    faults.set(FaultPlan::new()).unwrap();
    assert!(!faults.is_on());
    // Only the call made while it was off reached the dependency.
    assert_eq!(calls.load(Relaxed), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn scope_by_criticality_and_host() {
    let faults = seeded(7);
    faults
        .set(
            FaultPlan::new()
                .error(1.0)
                .only_criticalities([Criticality::Sheddable])
                .only_keys(["search.internal"]),
        )
        .unwrap();
    let svc = FaultLayer::new(faults.clone()).layer(dependency(Arc::default()));
    let to = |host: &str, criticality: Option<Criticality>| {
        let mut request = Request::builder()
            .uri(format!("http://{host}:8080/q"))
            .body(())
            .unwrap();
        if let Some(c) = criticality {
            request.extensions_mut().insert(c);
        }
        request
    };
    assert!(svc
        .clone()
        .oneshot(to("search.internal", Some(Criticality::Sheddable)))
        .await
        .is_err());
    assert!(svc
        .clone()
        .oneshot(to("search.internal", None))
        .await
        .is_ok());
    assert!(svc
        .clone()
        .oneshot(to("payments.internal", Some(Criticality::Sheddable)))
        .await
        .is_ok());
    // The Host header, port dropped, when the URI has no host.
    let mut by_header = Request::builder()
        .uri("/q")
        .header("host", "search.internal:8080")
        .body(())
        .unwrap();
    by_header.extensions_mut().insert(Criticality::Sheddable);
    assert!(svc.clone().oneshot(by_header).await.is_err());
    // In scope from a server's criticality too.
    assert!(Criticality::Sheddable
        .scope(svc.oneshot(to("search.internal", None)))
        .await
        .is_err());
    assert_eq!(faults.snapshot().eligible, 3);
}

#[test]
fn invalid_plans_are_refused_with_the_setting_named() {
    let faults = FaultHandle::new("dep");
    for (plan, setting) in [
        (FaultPlan::new().error(1.5), "error"),
        (FaultPlan::new().hang(-0.1), "hang"),
        (FaultPlan::new().latency(f64::NAN, ms(1)), "latency"),
        (
            FaultPlan::new()
                .error(0.5)
                .status(0.3, StatusCode::IM_A_TEAPOT)
                .abort_body(0.3, 0),
            "error + status + hang + abort_body",
        ),
    ] {
        let error = faults.set(plan).unwrap_err();
        assert_eq!(error.setting(), setting, "{error}");
        assert!(!faults.is_on(), "an invalid plan changes nothing");
    }
    assert!(FaultPlan::new().error(0.5).hang(0.5).validate().is_ok());
}

/// Calls racing on four threads while another switches the plan on and
/// off and changes it: no call panics or sees a torn plan (each call is
/// either passed through or failed with the error kind of one plan), and
/// the counts add up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_calls_and_switches_count_exactly() {
    let calls = Arc::new(AtomicUsize::new(0));
    let faults = FaultHandle::new("dep");
    let svc = FaultLayer::new(faults.clone()).layer(dependency(calls.clone()));
    let failed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let switcher = {
        let faults = faults.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut n = 0u32;
            while !stop.load(Relaxed) {
                match n % 3 {
                    0 => faults.set(FaultPlan::new().error(0.5)).unwrap(),
                    1 => faults
                        .set(FaultPlan::new().status(0.5, StatusCode::SERVICE_UNAVAILABLE))
                        .unwrap(),
                    _ => faults.off(),
                }
                n += 1;
                tokio::task::yield_now().await;
            }
        })
    };
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let svc = svc.clone();
            let failed = failed.clone();
            tokio::spawn(async move {
                let mut statuses = 0u64;
                for _ in 0..2_000 {
                    match svc.clone().oneshot(request()).await {
                        Ok(response) if response.status() == 503 => statuses += 1,
                        Ok(response) => assert_eq!(response.status(), 200),
                        Err(error) => {
                            assert!(is_injected(&*error));
                            failed.fetch_add(1, Relaxed);
                        }
                    }
                }
                statuses
            })
        })
        .collect();
    let mut statuses = 0;
    for task in tasks {
        statuses += task.await.unwrap();
    }
    stop.store(true, Relaxed);
    switcher.await.unwrap();
    let s = faults.snapshot();
    assert_eq!(s.injected[FaultKind::Error.index()], failed.load(Relaxed));
    assert_eq!(s.injected[FaultKind::Status.index()], statuses);
    assert_eq!(
        calls.load(Relaxed) as u64 + failed.load(Relaxed) + statuses,
        16_000
    );
}

/// The marks in tracing: the switch's events and one debug event per
/// fault, with `injected = true`.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn every_fault_is_an_event_marked_injected() {
    let capture = resilience_testkit::Capture::default();
    let _guard = resilience_testkit::set_default(capture.clone());
    let faults = seeded(8);
    let svc = FaultLayer::new(faults.clone()).layer(dependency(Arc::default()));
    faults.set(FaultPlan::new().error(1.0)).unwrap();
    for _ in 0..3 {
        let _ = svc.clone().oneshot(request()).await;
    }
    faults.off();
    assert_eq!(capture.lines("fault_injection_on").len(), 1);
    assert_eq!(capture.lines("fault_injection_off").len(), 1);
    let injected = capture.lines("fault_injected ");
    assert_eq!(injected.len(), 3, "{injected:#?}");
    for line in &injected {
        assert!(line.contains("injected=true"), "{line}");
        assert!(line.contains(r#"fault="error""#), "{line}");
        assert!(line.contains("layer=dep"), "{line}");
    }
}

/// Our own layers meet injected faults as real ones: the breaker counts
/// injected errors as failures and opens.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_breaker_counts_injected_errors_and_opens() {
    use tower_breaker::{Breaker, BreakerConfig, BreakerLayer, State};
    let faults = seeded(9);
    faults.set(FaultPlan::new().error(1.0)).unwrap();
    let breaker = Breaker::with_config(
        "dep",
        BreakerConfig::new().count_window(10).minimum_calls(5),
    );
    let svc = BreakerLayer::new(breaker.clone())
        .layer(FaultLayer::new(faults).layer(dependency(Arc::default())));
    for _ in 0..10 {
        let _ = svc.clone().oneshot(request()).await;
    }
    assert_eq!(breaker.snapshot().state, State::Open);
}

/// The plain flavour: latency delays the service's own answer; a status
/// or an aborted body of the plan fail the call, marked, since there is
/// no head or body to put them in.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn plain_services_get_latency_errors_and_the_rest_as_errors() {
    use tower_chaos::PlainFaultLayer;
    let faults = seeded(10);
    let svc = PlainFaultLayer::new(faults.clone())
        .layer(service_fn(|n: u32| async move { Ok::<_, BoxError>(n + 1) }));
    faults.set(FaultPlan::new().latency(1.0, ms(40))).unwrap();
    let started = Instant::now();
    assert_eq!(svc.clone().oneshot(1).await.unwrap(), 2);
    assert_eq!(started.elapsed(), ms(40));
    for (plan, kind) in [
        (
            FaultPlan::new().status(1.0, StatusCode::SERVICE_UNAVAILABLE),
            FaultKind::Status,
        ),
        (FaultPlan::new().abort_body(1.0, 3), FaultKind::AbortBody),
    ] {
        faults.set(plan).unwrap();
        let error = svc.clone().oneshot(1).await.unwrap_err();
        assert_eq!(error.downcast_ref::<InjectedFault>().unwrap().kind(), kind);
    }
    // A keyed plan has nothing to match here.
    faults
        .set(FaultPlan::new().error(1.0).only_keys(["x"]))
        .unwrap();
    assert_eq!(svc.oneshot(1).await.unwrap(), 2);
}

/// An abort at the first read, and one set after more frames than the
/// body has: the body still fails, in place of its end.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_abort_comes_at_its_frame_or_in_place_of_the_end() {
    let faults = seeded(11);
    let svc = FaultLayer::new(faults.clone()).layer(dependency(Arc::default()));
    for (after, read) in [(0, vec![]), (5, vec!["a", "b"])] {
        faults.set(FaultPlan::new().abort_body(1.0, after)).unwrap();
        let response = svc.clone().oneshot(request()).await.unwrap();
        assert_eq!(response.headers()[INJECTED_FAULT_HEADER], "abort_body");
        let (frames, error) = body_frames(response.into_body()).await;
        assert_eq!(frames, read);
        assert!(is_injected(&*error.expect("aborted")));
    }
}
