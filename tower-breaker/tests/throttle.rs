//! Client-side adaptive throttling: the SRE rule, its window, its cap, its
//! criticalities, and how its rejections meet the other layers. Paused
//! time and seeded randomness throughout (except the race, on real
//! threads).

mod support;

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use support::{advance, ms, secs, Events};
use tower::{service_fn, BoxError, Layer, ServiceBuilder, ServiceExt};
use tower_breaker::throttle::{
    Criticality, PlainThrottle, ThrottleConfig, ThrottleConfigError, ThrottleHandle, ThrottleLayer,
    Throttled, MAX_WINDOW, MIN_WINDOW,
};
use tower_breaker::{Breaker, BreakerConfig, DefaultClassifier, Outcome, PlainBreakerLayer};
use tower_resilience_base::answer::LocalAnswer;
use tower_resilience_base::classify::{classify_error, Class};
use tower_resilience_base::error::{is_local_rejection, BulkheadFull};
use tower_resilience_base::random::{unit, RandomSource, SeededRandom};
use tower_resilience_base::Answer;

/// A throttle with seeded draws and `config`'s other settings.
fn throttle(config: ThrottleConfig, seed: u64) -> ThrottleHandle {
    ThrottleHandle::try_with_config("dep", config.random(Arc::new(SeededRandom::new(seed))))
        .expect("valid settings")
}

/// A dependency that fails each call with probability `failure` (drawn
/// from its own seeded source) and counts the calls it gets.
#[derive(Clone)]
struct Flaky {
    failure: f64,
    random: Arc<SeededRandom>,
    calls: Arc<AtomicUsize>,
}

impl Flaky {
    fn new(failure: f64, seed: u64) -> Self {
        Self {
            failure,
            random: Arc::new(SeededRandom::new(seed)),
            calls: Arc::default(),
        }
    }

    fn service(
        &self,
    ) -> impl tower::Service<u32, Response = u32, Error = BoxError, Future = impl Send> + Clone
    {
        let this = self.clone();
        service_fn(move |n: u32| {
            this.calls.fetch_add(1, Relaxed);
            let fails = unit(&*this.random) < this.failure;
            async move {
                if fails {
                    Err::<u32, BoxError>("refused".into())
                } else {
                    Ok(n)
                }
            }
        })
    }

    fn calls(&self) -> usize {
        self.calls.load(Relaxed)
    }
}

/// What a run of calls saw.
#[derive(Debug, Default)]
struct Run {
    calls: u64,
    throttled: u64,
    /// The sum of the rejection probabilities of the calls, read from the
    /// handle just before each.
    expected: f64,
    /// The sum of p(1 - p), for the binomial spread.
    variance: f64,
}

/// Offers `per_second` calls a second for `seconds` through `service`, at
/// the criticality in scope.
async fn offer<S>(
    service: &S,
    handle: &ThrottleHandle,
    criticality: Criticality,
    per_second: u64,
    seconds: u64,
) -> Run
where
    S: tower::Service<u32, Response = u32, Error = BoxError> + Clone,
{
    let mut run = Run::default();
    let gap = Duration::from_nanos(1_000_000_000 / per_second);
    for _ in 0..seconds * per_second {
        let p = handle.rejection_probability(criticality);
        run.expected += p;
        run.variance += p * (1.0 - p);
        run.calls += 1;
        let result = criticality.scope(service.clone().oneshot(1)).await;
        if let Err(e) = result {
            if e.is::<Throttled>() {
                run.throttled += 1;
            }
        }
        advance(gap).await;
    }
    run
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_healthy_dependency_is_never_throttled() {
    let handle = throttle(ThrottleConfig::new().window(secs(10)), 1);
    let flaky = Flaky::new(0.0, 2);
    let svc = PlainThrottle::new(flaky.service(), handle.clone());
    let run = offer(&svc, &handle, Criticality::Sheddable, 100, 30).await;
    assert_eq!(run.throttled, 0);
    assert_eq!(run.expected, 0.0);
    let s = handle.snapshot();
    assert_eq!((s.rejected, s.throttling), (0, false));
    assert_eq!(s.requests, s.accepts);
    assert_eq!(flaky.calls(), 3000);
}

/// With half of the calls failing and K = 2, the rule sits on its edge:
/// the share rejected is whatever the window's noise makes of the formula.
/// Whatever it is, the calls rejected are the formula's draws: their
/// number is the sum of the probabilities read before each call, within
/// the binomial spread.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn at_half_failures_with_k_2_rejections_follow_the_formula() {
    let handle = throttle(ThrottleConfig::new().window(secs(10)).k(2.0), 3);
    let svc = PlainThrottle::new(Flaky::new(0.5, 4).service(), handle.clone());
    let run = offer(&svc, &handle, Criticality::Critical, 100, 60).await;
    let spread = 4.0 * run.variance.sqrt() + 5.0;
    assert!(
        (run.throttled as f64 - run.expected).abs() <= spread,
        "{run:?}"
    );
    // And the snapshot's probability is the formula on its counts.
    let s = handle.snapshot();
    let formula =
        ((s.requests as f64 - 2.0 * s.accepts as f64) / (s.requests as f64 + 1.0)).clamp(0.0, 0.9);
    assert!((s.rejection_probability - formula).abs() < 1e-12, "{s:?}");
}

/// A dependency that accepts 20 calls a second, offered 100 a second: with
/// K = 2 the client settles where it sends 2 x 20 = 40 a second, so 60% of
/// the calls are rejected, which is also the formula's value there.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn against_a_fixed_capacity_the_client_sends_k_times_the_accepts() {
    let handle = throttle(ThrottleConfig::new().window(secs(10)), 5);
    let served = Arc::new(Mutex::new((0u64, tokio::time::Instant::now())));
    let capacity = {
        let served = Arc::clone(&served);
        service_fn(move |n: u32| {
            let mut guard = served.lock().unwrap();
            let now = tokio::time::Instant::now();
            if now.duration_since(guard.1) >= secs(1) {
                *guard = (0, now);
            }
            guard.0 += 1;
            let accepted = guard.0 <= 20;
            async move {
                if accepted {
                    Ok::<u32, BoxError>(n)
                } else {
                    Err("over capacity".into())
                }
            }
        })
    };
    let svc = PlainThrottle::new(capacity, handle.clone());
    // Warm up for three windows, then measure over three more.
    offer(&svc, &handle, Criticality::Critical, 100, 30).await;
    let run = offer(&svc, &handle, Criticality::Critical, 100, 30).await;
    let share = run.throttled as f64 / run.calls as f64;
    assert!((share - 0.6).abs() < 0.05, "{share} {run:?}");
    let s = handle.snapshot();
    assert!((s.rejection_probability - 0.6).abs() < 0.08, "{s:?}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn max_rejection_caps_the_share() {
    let handle = throttle(ThrottleConfig::new().window(secs(10)).max_rejection(0.5), 6);
    let svc = PlainThrottle::new(Flaky::new(1.0, 7).service(), handle.clone());
    offer(&svc, &handle, Criticality::Critical, 100, 10).await;
    assert_eq!(handle.snapshot().rejection_probability, 0.5);
    let run = offer(&svc, &handle, Criticality::Critical, 100, 20).await;
    let share = run.throttled as f64 / run.calls as f64;
    assert!((share - 0.5).abs() < 0.04, "{share}");
    assert_eq!(run.expected, 0.5 * run.calls as f64);
}

/// The window slides by buckets of a sixtieth of it (100 ms for 6 s):
/// failures counted in one bucket weigh until the window has passed over
/// that bucket, and not one bucket longer.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn failures_leave_the_window_when_it_has_passed() {
    let handle = throttle(ThrottleConfig::new().window(secs(6)).min_requests(1), 8);
    // Align to the start of a bucket.
    let now = handle.snapshot();
    assert_eq!(now.requests, 0);
    for _ in 0..20 {
        if let Ok(permit) = handle.try_acquire(Criticality::Critical) {
            permit.record(Outcome::Failure);
        }
    }
    assert!(handle.snapshot().rejection_probability > 0.0);
    // The bucket of those calls began at most 100 ms ago: it is still in
    // the window 5.8 s later, and gone 6.1 s later.
    advance(ms(5_800)).await;
    let s = handle.snapshot();
    assert_eq!(s.requests, 20);
    assert!(s.rejection_probability > 0.0);
    advance(ms(300)).await;
    let s = handle.snapshot();
    assert_eq!(
        (s.requests, s.accepts, s.rejection_probability),
        (0, 0, 0.0)
    );
    assert!(!s.throttling);
}

/// After an outage, the dependency answers again: the throttle lets more
/// through as accepts come back and stops rejecting within about two
/// windows; a window after the last rejection, its
/// counts hold successes only.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn rejection_returns_to_zero_after_recovery() {
    let handle = throttle(ThrottleConfig::new().window(secs(6)), 9);
    let failing = PlainThrottle::new(Flaky::new(1.0, 10).service(), handle.clone());
    offer(&failing, &handle, Criticality::Critical, 100, 12).await;
    assert_eq!(handle.snapshot().rejection_probability, 0.9);
    let healthy = PlainThrottle::new(Flaky::new(0.0, 11).service(), handle.clone());
    let mut windows = 0;
    while handle.snapshot().rejection_probability > 0.0 {
        offer(&healthy, &handle, Criticality::Critical, 100, 6).await;
        windows += 1;
        // Measured: 0.655 after one window, 0 after two.
        assert!(windows <= 3, "{:?}", handle.snapshot());
    }
    let run = offer(&healthy, &handle, Criticality::Critical, 100, 6).await;
    assert_eq!(run.throttled, 0);
    let s = handle.snapshot();
    assert_eq!(s.requests, s.accepts, "{s:?}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn rejections_are_local_rejections_answered_503_and_not_retried() {
    let handle = throttle(ThrottleConfig::new().min_requests(1), 12);
    for _ in 0..50 {
        if let Ok(permit) = handle.try_acquire(Criticality::Critical) {
            permit.record(Outcome::Failure);
        }
    }
    // A throttle that never rejects fails here, within 10,000 draws.
    let error: BoxError = (0..10_000)
        .find_map(|_| handle.try_acquire(Criticality::Critical).err())
        .map(Box::new)
        .expect("a rejection after 50 refusals");
    assert!(is_local_rejection(&*error));
    let throttled = error.downcast_ref::<Throttled>().unwrap();
    assert_eq!(throttled.throttle(), "dep");
    assert!(throttled.probability() > 0.5 && throttled.probability() <= 0.9);
    // The retry layer's classification: local, so not retried.
    assert_eq!(classify_error(&*error), Class::Local);
    assert!(!classify_error(&*error).is_retryable());
    // The breaker's: ignored.
    assert_eq!(DefaultClassifier_outcome(&*error), Outcome::Ignored);
    let answer = Answer::for_error(&*error);
    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(answer.is_no_retry());
}

#[allow(non_snake_case)]
fn DefaultClassifier_outcome(error: &(dyn std::error::Error + 'static)) -> Outcome {
    use tower_breaker::Classify;
    <DefaultClassifier as Classify<Response<()>>>::classify_error(&DefaultClassifier, error)
}

/// A breaker stacked outside the throttle counts the calls that reached
/// the dependency, and ignores the throttle's rejections.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_breaker_outside_does_not_count_rejections() {
    let handle = throttle(ThrottleConfig::new().window(secs(10)), 13);
    let breaker = Breaker::with_config(
        "dep",
        BreakerConfig::new()
            .minimum_calls(1_000_000)
            .count_window(1_000),
    );
    let flaky = Flaky::new(1.0, 14);
    let svc = ServiceBuilder::new()
        .layer(PlainBreakerLayer::new(breaker.clone()))
        .layer(ThrottleLayer::with_handle(handle.clone()).plain())
        .service(flaky.service());
    let mut throttled = 0;
    for _ in 0..500 {
        match svc.clone().oneshot(1).await {
            Err(e) if e.is::<Throttled>() => throttled += 1,
            _ => {}
        }
        advance(ms(10)).await;
    }
    assert!(throttled > 300, "{throttled}");
    let totals = breaker.snapshot().totals;
    assert_eq!(totals.failed, flaky.calls() as u64);
    assert_eq!(totals.ignored, throttled);
    assert_eq!(totals.failed + totals.ignored, 500);
    assert_eq!(handle.snapshot().rejected, throttled);
}

/// A full bulkhead below (an error) or a local answer (an HTTP 503 a layer
/// below built) never reached the dependency: neither a request nor an
/// accept.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn local_rejections_from_below_are_not_counted() {
    let handle = ThrottleHandle::new("dep");
    let full = service_fn(|_n: u32| async {
        Err::<u32, BoxError>(Box::new(BulkheadFull::new("b", 1, None)))
    });
    let svc = PlainThrottle::new(full, handle.clone());
    for _ in 0..5 {
        assert!(svc.clone().oneshot(1).await.is_err());
    }
    let local = service_fn(|_req: Request<()>| async {
        let answer: Response<()> = Answer::bulkhead_full(secs(1)).into_response(false);
        assert!(answer.extensions().get::<LocalAnswer>().is_some());
        Ok::<_, BoxError>(answer)
    });
    let http = ThrottleLayer::with_handle(handle.clone()).layer(local);
    for _ in 0..5 {
        assert_eq!(
            http.clone()
                .oneshot(Request::new(()))
                .await
                .unwrap()
                .status(),
            503
        );
    }
    let s = handle.snapshot();
    assert_eq!((s.requests, s.accepts), (0, 0));
}

/// 429 and 503 are not accepts for the default classifier; 404 is.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn http_answers_are_judged_by_the_throttle_classifier() {
    let layer = ThrottleLayer::new("dep");
    let handle = layer.handle().clone();
    let svc = layer.layer(service_fn(|req: Request<u16>| async move {
        let mut answer = Response::new(());
        *answer.status_mut() = StatusCode::from_u16(*req.body()).unwrap();
        Ok::<_, BoxError>(answer)
    }));
    for status in [200, 404, 429, 503, 500] {
        svc.clone().oneshot(Request::new(status)).await.unwrap();
    }
    let s = handle.snapshot();
    assert_eq!((s.requests, s.accepts), (5, 2));
    // The breaker's classifier counts 429 as accepted.
    let layer = ThrottleLayer::new("dep").classifier(DefaultClassifier);
    let handle = layer.handle().clone();
    let svc = layer.layer(service_fn(|_req: Request<()>| async {
        let mut answer = Response::new(());
        *answer.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        Ok::<_, BoxError>(answer)
    }));
    svc.oneshot(Request::new(())).await.unwrap();
    assert_eq!(handle.snapshot().accepts, 1);
}

/// A caller that gives up (drops the response future) leaves a request
/// that was not accepted: congestion, not nothing.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_dropped_call_is_a_request_not_accepted() {
    let handle = ThrottleHandle::new("dep");
    let hanging = service_fn(|_n: u32| std::future::pending::<Result<u32, BoxError>>());
    let svc = PlainThrottle::new(hanging, handle.clone());
    let call = svc.oneshot(1);
    assert!(tokio::time::timeout(ms(10), call).await.is_err());
    let s = handle.snapshot();
    assert_eq!((s.requests, s.accepts), (1, 0));
}

/// A call in flight has not been refused: a throttle that starts (or whose
/// window has emptied) in front of a healthy dependency whose answers take
/// a second rejects none of the calls made before the first answer comes
/// back. (Counted as not accepted until they end, the first second's calls
/// alone would make the rule reject 90% of them.)
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn slow_healthy_calls_in_flight_are_not_throttled() {
    let handle = throttle(ThrottleConfig::new(), 31);
    let slow = service_fn(|n: u32| async move {
        tokio::time::sleep(secs(1)).await;
        Ok::<u32, BoxError>(n)
    });
    let svc = PlainThrottle::new(slow, handle.clone());
    let mut calls = Vec::new();
    for n in 0..300 {
        calls.push(tokio::spawn(svc.clone().oneshot(n)));
        tokio::time::sleep(ms(5)).await;
    }
    let mut rejected = 0;
    for call in calls {
        if call.await.expect("no panic").is_err() {
            rejected += 1;
        }
    }
    assert_eq!(rejected, 0, "{:?}", handle.snapshot());
    let s = handle.snapshot();
    assert_eq!((s.requests, s.accepts, s.rejected), (300, 300, 0));
}

/// Under the same failures (40% of the calls: above `Sheddable`'s 33%
/// threshold, under `Critical`'s 50%), sheddable requests are rejected and
/// critical ones are not, and critical-plus no more than critical;
/// criticality comes from the request's extension (HTTP) or the scope.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn lower_criticalities_are_rejected_first() {
    let handle = throttle(ThrottleConfig::new().window(secs(10)), 15);
    let flaky = Flaky::new(0.4, 16);
    let inner = flaky.service();
    let svc =
        ThrottleLayer::with_handle(handle.clone()).layer(service_fn(move |req: Request<u32>| {
            let call = inner.clone().oneshot(*req.body());
            async move { call.await.map(Response::new) }
        }));
    let mut rejected = [0u32; 4];
    let mut offered = [0u32; 4];
    for i in 0..8_000usize {
        let c = Criticality::ALL[i % 4];
        let mut req = Request::new(1);
        if i % 8 < 4 {
            // Half by extension, half by scope.
            req.extensions_mut().insert(c);
            if let Err(e) = svc.clone().oneshot(req).await {
                rejected[c.index()] += u32::from(e.is::<Throttled>());
            }
        } else if let Err(e) = c.scope(svc.clone().oneshot(req)).await {
            rejected[c.index()] += u32::from(e.is::<Throttled>());
        }
        offered[c.index()] += 1;
        advance(ms(5)).await;
    }
    let share = |c: Criticality| f64::from(rejected[c.index()]) / f64::from(offered[c.index()]);
    let (sheddable, plus, critical, critical_plus) = (
        share(Criticality::Sheddable),
        share(Criticality::SheddablePlus),
        share(Criticality::Critical),
        share(Criticality::CriticalPlus),
    );
    eprintln!("rejected of 2000 each (sheddable .. critical-plus): {rejected:?}");
    // Measured: [216, 0, 0, 0] (the fixed point: 1 - 1.5 x 0.6 x (1 - p / 4), 13%).
    assert!(sheddable > 0.05, "{rejected:?}");
    assert!(sheddable > plus && plus >= critical, "{rejected:?}");
    assert!(critical < 0.03, "{rejected:?}");
    assert!(critical_plus <= critical + 0.01, "{rejected:?}");
    let s = handle.snapshot();
    assert!(s.probabilities[0] >= s.probabilities[1]);
    assert!(s.probabilities[1] >= s.probabilities[2]);
    assert!(s.probabilities[2] >= s.probabilities[3]);
    assert_eq!(s.requests_by_criticality.iter().sum::<u64>(), s.requests);
    assert_eq!(s.rejected_by_criticality.iter().sum::<u64>(), s.rejected);
}

/// A higher K for critical-plus is allowed, a lower one refused.
#[test]
fn critical_plus_is_never_below_critical() {
    let err = ThrottleConfig::new()
        .criticality_k(Criticality::CriticalPlus, 1.5)
        .validate()
        .unwrap_err();
    assert_eq!(
        err,
        ThrottleConfigError::KOutOfOrder {
            lower: Criticality::Critical,
            lower_k: 2.0,
            higher: Criticality::CriticalPlus,
            higher_k: 1.5
        }
    );
    assert!(ThrottleConfig::new()
        .criticality_k(Criticality::CriticalPlus, 3.0)
        .validate()
        .is_ok());
    // The layer's setters clamp instead: raised to Critical's.
    let layer = ThrottleLayer::new("dep").criticality_k(Criticality::CriticalPlus, 1.5);
    assert_eq!(
        layer.handle().config().get_k(Criticality::CriticalPlus),
        2.0
    );
}

#[test]
fn invalid_settings_give_typed_errors() {
    let check =
        |config: ThrottleConfig| ThrottleHandle::try_with_config("dep", config).unwrap_err();
    assert_eq!(
        check(ThrottleConfig::new().k(0.99)),
        ThrottleConfigError::InvalidK {
            criticality: Criticality::Critical,
            value: 0.99
        }
    );
    assert!(matches!(
        check(ThrottleConfig::new().k(f64::NAN)),
        ThrottleConfigError::InvalidK { .. }
    ));
    assert!(matches!(
        check(ThrottleConfig::new().k(f64::INFINITY)),
        ThrottleConfigError::InvalidK { .. }
    ));
    assert!(matches!(
        check(ThrottleConfig::new().criticality_k(Criticality::Sheddable, 0.5)),
        ThrottleConfigError::InvalidK {
            criticality: Criticality::Sheddable,
            ..
        }
    ));
    assert!(matches!(
        check(ThrottleConfig::new().criticality_k(Criticality::Sheddable, 3.0)),
        ThrottleConfigError::KOutOfOrder {
            lower: Criticality::Sheddable,
            ..
        }
    ));
    assert_eq!(
        check(ThrottleConfig::new().max_rejection(-0.1)),
        ThrottleConfigError::InvalidMaxRejection { value: -0.1 }
    );
    assert!(matches!(
        check(ThrottleConfig::new().max_rejection(f64::NAN)),
        ThrottleConfigError::InvalidMaxRejection { .. }
    ));
    assert_eq!(
        check(ThrottleConfig::new().window(MIN_WINDOW - ms(1))),
        ThrottleConfigError::InvalidWindow {
            value: MIN_WINDOW - ms(1)
        }
    );
    assert!(matches!(
        check(ThrottleConfig::new().window(MAX_WINDOW + secs(1))),
        ThrottleConfigError::InvalidWindow { .. }
    ));
    assert!(
        ThrottleHandle::try_with_config("dep", ThrottleConfig::new().window(MIN_WINDOW)).is_ok()
    );
    assert!(
        ThrottleLayer::try_with_config("dep", ThrottleConfig::new().max_rejection(2.0)).is_err()
    );
}

/// Every service a layer builds, and every clone, shares one window.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn services_and_clones_share_the_throttle() {
    let layer = ThrottleLayer::new("dep").plain();
    let ok = service_fn(|n: u32| async move { Ok::<u32, BoxError>(n) });
    let a = layer.layer(ok);
    let b = layer.layer(ok);
    a.clone().oneshot(1).await.unwrap();
    a.oneshot(1).await.unwrap();
    b.oneshot(1).await.unwrap();
    assert_eq!(layer.handle().snapshot().accepts, 3);
}

async fn answer_ok(n: u32) -> Result<u32, BoxError> {
    Ok(n)
}

async fn answer_err(_n: u32) -> Result<u32, BoxError> {
    Err(Box::new(std::io::Error::from(
        std::io::ErrorKind::ConnectionRefused,
    )))
}

/// 16 tasks on real threads race through one throttle: every call is
/// counted once, as a request and (for a success) as an accept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_tasks_count_exactly() {
    const TASKS: u64 = 16;
    const CALLS: u64 = 2_000;
    let handle = ThrottleHandle::new("race");
    let ok = PlainThrottle::new(service_fn(answer_ok), handle.clone());
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let svc = ok.clone();
            tokio::spawn(async move {
                for _ in 0..CALLS {
                    svc.clone().oneshot(1).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let s = handle.snapshot();
    assert_eq!(
        (s.requests, s.accepts, s.rejected),
        (TASKS * CALLS, TASKS * CALLS, 0)
    );

    // Failing calls: every one is a request, rejected or not.
    let handle = ThrottleHandle::new("race-failing");
    let failing = PlainThrottle::new(service_fn(answer_err), handle.clone());
    let reached = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let svc = failing.clone();
            let reached = Arc::clone(&reached);
            tokio::spawn(async move {
                for _ in 0..CALLS {
                    if let Err(e) = svc.clone().oneshot(1).await {
                        if !e.is::<Throttled>() {
                            reached.fetch_add(1, Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let s = handle.snapshot();
    assert_eq!(s.requests, TASKS * CALLS);
    assert_eq!(s.accepts, 0);
    assert_eq!(s.rejected + reached.load(Relaxed) as u64, TASKS * CALLS);
    assert!(s.rejected > TASKS * CALLS / 2, "{s:?}");
}

/// Throttling starting and stopping is told once each, with the name.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn start_and_stop_are_told_once_each() {
    let events = Events::default();
    let _guard = tracing::subscriber::set_default(events.clone());
    let handle = throttle(ThrottleConfig::new().window(secs(6)), 17);
    let failing = PlainThrottle::new(Flaky::new(1.0, 18).service(), handle.clone());
    offer(&failing, &handle, Criticality::Critical, 100, 3).await;
    assert_eq!(events.mentioning("throttling_started"), 1);
    assert_eq!(events.mentioning("throttling_stopped"), 0);
    let seen = events.take();
    assert_eq!(seen[0].1["throttle"], "dep");
    // Idle for a window: the next call finds nothing to throttle.
    advance(secs(7)).await;
    let healthy = PlainThrottle::new(Flaky::new(0.0, 19).service(), handle.clone());
    offer(&healthy, &handle, Criticality::Critical, 100, 3).await;
    assert_eq!(events.mentioning("throttling_stopped"), 1);
    assert_eq!(events.mentioning("throttling_started"), 0);
}

/// The random source is the handle's: two throttles with the same seed
/// and the same history reject the same calls.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn draws_are_reproducible_with_a_seeded_source() {
    let mut runs = Vec::new();
    for _ in 0..2 {
        let handle = throttle(ThrottleConfig::new().window(secs(10)), 20);
        let svc = PlainThrottle::new(Flaky::new(0.8, 21).service(), handle.clone());
        let mut pattern = Vec::new();
        for _ in 0..300 {
            pattern.push(matches!(svc.clone().oneshot(1).await, Err(e) if e.is::<Throttled>()));
            advance(ms(10)).await;
        }
        runs.push(pattern);
    }
    assert_eq!(runs[0], runs[1]);
    assert!(runs[0].iter().any(|&t| t));
    let _ = SeededRandom::new(0).next_u64();
}

/// Fewer requests than `min_requests` in the window: nothing is rejected,
/// however they went; the one that reaches it may be.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn nothing_is_rejected_below_min_requests() {
    let handle = throttle(ThrottleConfig::new().min_requests(5).k(1.0), 22);
    for _ in 0..5 {
        assert_eq!(handle.rejection_probability(Criticality::Critical), 0.0);
        handle
            .try_acquire(Criticality::Critical)
            .expect("below min_requests")
            .record(Outcome::Failure);
    }
    // 5 requests, no accept: (5 - 0) / 6, under the 0.9 cap.
    let p = handle.rejection_probability(Criticality::Critical);
    assert!((p - 5.0 / 6.0).abs() < 1e-12, "{p}");
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the layer's setters are given, the throttle they build
        /// has valid settings.
        #[test]
        fn layer_setters_always_give_valid_settings(
            window_ms in 0u64..10_000_000_000,
            k in prop::num::f64::ANY,
            shed in prop::num::f64::ANY,
            plus in prop::num::f64::ANY,
            max in prop::num::f64::ANY,
        ) {
            let layer = ThrottleLayer::new("p")
                .window(ms(window_ms))
                .k(k)
                .criticality_k(Criticality::Sheddable, shed)
                .criticality_k(Criticality::CriticalPlus, plus)
                .max_rejection(max);
            prop_assert_eq!(layer.handle().config().validate(), Ok(()));
        }

        /// Whatever the calls and their outcomes, the probabilities are
        /// within the cap and never rise with criticality, and the least
        /// critical one is the rule on every request.
        #[test]
        fn probabilities_are_ordered_and_capped(
            calls in prop::collection::vec((0usize..4, 0u8..3), 0..300),
            max in 0.0f64..=1.0,
        ) {
            let handle = throttle(ThrottleConfig::new().max_rejection(max).min_requests(0), 23);
            for (c, outcome) in calls {
                if let Ok(permit) = handle.try_acquire(Criticality::ALL[c]) {
                    permit.record([Outcome::Success, Outcome::Failure, Outcome::Ignored][usize::from(outcome)]);
                }
            }
            let s = handle.snapshot();
            for pair in s.probabilities.windows(2) {
                prop_assert!(pair[0] >= pair[1], "{:?}", s);
            }
            prop_assert!(s.probabilities.iter().all(|p| (0.0..=max).contains(p)));
            let (r, a) = (s.requests as f64, s.accepts as f64);
            let rule = ((r - 1.5 * a) / (r + 1.0)).clamp(0.0, max);
            prop_assert!((s.probabilities[0] - rule).abs() < 1e-12, "{:?}", s);
        }
    }
}

/// `poll_ready` is the inner service's; the decision is taken in `call`.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn readiness_is_the_inner_services() {
    use tokio_test::{assert_pending, assert_ready_ok};
    use tower_test::mock;

    let layer = ThrottleLayer::new("dep");
    let handle = layer.handle().clone();
    let (mut svc, mut inner) = mock::spawn_layer::<Request<()>, Response<()>, _>(layer);
    inner.allow(0);
    assert_pending!(svc.poll_ready());
    inner.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let call = svc.call(Request::new(()));
    let (_req, send) = inner.next_request().await.unwrap();
    send.send_response(Response::new(()));
    call.await.unwrap();
    assert_eq!(handle.snapshot().accepts, 1);
}

/// The inner service's errors pass through unchanged (and count as not
/// accepted); the throttle's own error downcasts behind another layer.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn errors_pass_through_and_downcast_behind_another_layer() {
    let handle = throttle(ThrottleConfig::new().min_requests(1).max_rejection(1.0), 24);
    let svc = ServiceBuilder::new()
        .map_err(|e: BoxError| e)
        .layer(ThrottleLayer::with_handle(handle.clone()).plain())
        .service(service_fn(answer_err));
    let first = svc.clone().oneshot(1).await.unwrap_err();
    assert!(first.is::<std::io::Error>());
    assert_eq!(handle.snapshot().accepts, 0);
    // Every request failed: with the cap at 100%, the next ones are
    // rejected (the rule: (n - 0) / (n + 1)).
    let mut throttled = None;
    for _ in 0..50 {
        if let Err(e) = svc.clone().oneshot(1).await {
            if let Some(t) = e.downcast_ref::<Throttled>() {
                throttled = Some(t.clone());
            }
        }
    }
    let throttled = throttled.expect("rejected");
    assert_eq!(throttled.throttle(), "dep");
}

/// Throttling that starts and stops many times within a second is told
/// at most once a second.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn events_are_rate_limited() {
    let events = Events::default();
    let _guard = tracing::subscriber::set_default(events.clone());
    // A 60 ms window: throttling starts and stops every few milliseconds.
    let handle = throttle(ThrottleConfig::new().window(MIN_WINDOW).min_requests(1), 25);
    let flaky = PlainThrottle::new(Flaky::new(0.5, 26).service(), handle.clone());
    for _ in 0..1_000 {
        let _ = flaky.clone().oneshot(1).await;
        advance(ms(1)).await;
    }
    let told = events.mentioning("throttling_started") + events.mentioning("throttling_stopped");
    assert!(handle.snapshot().rejected > 50);
    assert!((1..=2).contains(&told), "{told} events in 1 s");
}
