//! The one-line stacks behave exactly like the stacks built by hand: every
//! scenario runs against `client_stack(..)` (or `server_stack(..)`) and
//! against the `ServiceBuilder` of the `tower_shield::stack` module docs,
//! checks what each of them must do, and checks that both saw the same.

mod support;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use http::{HeaderMap, HeaderName, Request, Response, StatusCode};
use support::*;
use tokio::sync::{Barrier, Semaphore};
use tokio_test::{assert_pending, assert_ready_ok};
use tower::{service_fn, BoxError, Layer, Service, ServiceBuilder, ServiceExt};
use tower_breaker::error::CircuitOpen;
use tower_breaker::snapshot::{Totals, WindowCounts};
use tower_breaker::{Breaker, BreakerConfig, BreakerLayer, HttpBreakerLayer, Mode, Outcome, State};
use tower_bulkhead::error::BulkheadFull;
use tower_bulkhead::{BulkheadLayer, HttpBulkheadLayer, DEFAULT_RETRY_AFTER};
use tower_deadline::error::DeadlineExceeded;
use tower_deadline::{ClientDeadlineLayer, Deadline, ServerDeadlineLayer, DEFAULT_GRPC_LEAD};
use tower_resilience_base::criticality::{Criticality, CRITICALITY_HEADER};
use tower_retry_budget::body::ReplayBody;
use tower_retry_budget::{Counters, RetryLayer, NO_RETRY_HEADER, RETRY_ATTEMPT_HEADER};
use tower_shield::criticality::{AcceptCriticalityLayer, PropagateCriticalityLayer};
use tower_shield::stack::{
    client_stack, server_stack, ClientStack, ClientStackService, ServerStackService,
    DEFAULT_CLIENT_CONCURRENCY, DEFAULT_SERVER_CONCURRENCY,
};

/// The dependency's (and the breaker's and the compartment's) name.
const NAME: &str = "inventory";
/// The header the per-attempt deadline layer writes by default.
const BUDGET: &str = "x-request-timeout-ms";
/// Tasks racing for the probe.
const TASKS: usize = 150;

/// How a scenario's stack is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Build {
    /// `client_stack(NAME)` / `server_stack(NAME)` and their setters.
    OneLine,
    /// The same layers with `tower::ServiceBuilder`, as in the module docs.
    ByHand,
}

const BUILDS: [Build; 2] = [Build::OneLine, Build::ByHand];

// === the client side ===

/// The settings of a client scenario, applied the same way to both builds.
#[derive(Clone)]
struct Knobs {
    timeout: Option<Duration>,
    concurrency: usize,
    breaker: BreakerConfig,
    attempt: ClientDeadlineLayer,
}

impl Knobs {
    fn new(breaker: BreakerConfig) -> Self {
        Self {
            timeout: None,
            concurrency: DEFAULT_CLIENT_CONCURRENCY,
            breaker,
            attempt: ClientDeadlineLayer::new(),
        }
    }
}

/// A client stack and the handles a scenario observes it through.
struct Client<S> {
    service: ClientStackService<S>,
    breaker: Breaker,
    retry: RetryHandle,
}

/// Where the retry counters of each build are read.
enum RetryHandle {
    Stack(Box<ClientStack>),
    Layer(RetryLayer),
}

impl RetryHandle {
    fn counters(&self) -> Counters {
        match self {
            Self::Stack(stack) => stack.retry_counters(),
            Self::Layer(layer) => layer.counters(),
        }
    }
}

/// The client stack around `transport`, built the `build` way. The return
/// type also checks that both builds are the very same service type.
fn client<S>(build: Build, knobs: &Knobs, transport: S) -> Client<S> {
    match build {
        Build::OneLine => {
            let mut stack = client_stack(NAME)
                .breaker_config(knobs.breaker.clone())
                .concurrency(knobs.concurrency)
                .attempt_deadline(knobs.attempt.clone());
            if let Some(timeout) = knobs.timeout {
                stack = stack.timeout(timeout);
            }
            Client {
                breaker: stack.breaker_handle().clone(),
                service: stack.layer(transport),
                retry: RetryHandle::Stack(Box::new(stack)),
            }
        }
        Build::ByHand => {
            let breaker = Breaker::with_config(NAME, knobs.breaker.clone());
            let mut call = ClientDeadlineLayer::new();
            if let Some(timeout) = knobs.timeout {
                call = call.default_timeout(timeout);
            }
            let retry = RetryLayer::new();
            let service = ServiceBuilder::new()
                .layer(PropagateCriticalityLayer::new())
                .layer(BreakerLayer::new(breaker.clone()))
                .layer(call.enforce_only().head_only())
                .layer(retry.clone())
                .layer(BulkheadLayer::new(NAME, knobs.concurrency).hold_until_body_end())
                .layer(knobs.attempt.clone())
                .service(transport);
            Client {
                service,
                breaker,
                retry: RetryHandle::Layer(retry),
            }
        }
    }
}

/// The dependency behind a client stack: it records the headers of every
/// call it receives.
#[derive(Debug, Clone, Default)]
struct Dependency(Arc<Mutex<Vec<HeaderMap>>>);

impl Dependency {
    /// A transport that records each call, then answers with `answer(n)`,
    /// `n` counting the calls from 0.
    fn serve<F, Fut>(
        &self,
        answer: F,
    ) -> impl Service<
        Request<ReplayBody<String>>,
        Response = Response<String>,
        Error = BoxError,
        Future = impl Send,
    > + Clone
           + Send
           + 'static
    where
        F: Fn(usize) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = Result<Response<String>, BoxError>> + Send + 'static,
    {
        let seen = self.0.clone();
        service_fn(move |req: Request<ReplayBody<String>>| {
            let n = {
                let mut seen = seen.lock().unwrap();
                seen.push(req.headers().clone());
                seen.len() - 1
            };
            answer(n)
        })
    }

    fn calls(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Every value of `header`, for each call.
    fn values(&self, header: &str) -> Vec<Vec<String>> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|headers| {
                headers
                    .get_all(header)
                    .iter()
                    .map(|v| v.to_str().unwrap().to_owned())
                    .collect()
            })
            .collect()
    }
}

fn status(code: u16) -> Response<String> {
    let mut response = Response::new(String::new());
    *response.status_mut() = StatusCode::from_u16(code).unwrap();
    response
}

/// Every call answers `code` at once.
fn answers(
    code: u16,
) -> impl Fn(usize) -> std::future::Ready<Result<Response<String>, BoxError>> + Clone {
    move |_| std::future::ready(Ok(status(code)))
}

/// A boxed answer of the dependency.
type Answer = std::pin::Pin<Box<dyn Future<Output = Result<Response<String>, BoxError>> + Send>>;

/// Calls wait for a permit of `release`, then answer 200.
fn held(release: &Arc<Semaphore>) -> impl Fn(usize) -> Answer + Clone {
    let release = release.clone();
    move |_| {
        let release = release.clone();
        Box::pin(async move {
            release.acquire().await?.forget();
            Ok(status(200))
        })
    }
}

/// What a call returned, comparable across builds.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answered {
    /// A response: its status and whether it carries the no-retry mark.
    Status(u16, bool),
    CircuitOpen,
    BulkheadFull,
    DeadlineExceeded,
    /// Anything else (a wrapped error, say): its description.
    Other(String),
}

fn answered<B>(result: Result<Response<B>, BoxError>) -> Answered {
    match result {
        Ok(response) => Answered::Status(
            response.status().as_u16(),
            response.headers().contains_key(NO_RETRY_HEADER),
        ),
        Err(e) if e.is::<CircuitOpen>() => Answered::CircuitOpen,
        Err(e) if e.is::<BulkheadFull>() => Answered::BulkheadFull,
        Err(e) if e.is::<DeadlineExceeded>() => Answered::DeadlineExceeded,
        Err(e) => Answered::Other(format!("{e:?}")),
    }
}

/// The breaker's figures after a step of a scenario.
#[derive(Debug, Clone, PartialEq)]
struct Figures {
    state: State,
    window: WindowCounts,
    totals: Totals,
}

fn figures(breaker: &Breaker) -> Figures {
    let s = breaker.snapshot();
    Figures {
        state: s.state,
        window: s.window,
        totals: s.totals,
    }
}

/// The calls and failures in a breaker's window.
fn counted(window: WindowCounts) -> (u64, u64) {
    (window.calls, window.failures)
}

// === (a) every attempt counted ===

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn every_attempt_is_counted_and_once_open_the_dependency_is_not_called() {
    let mut seen = Vec::new();
    for build in BUILDS {
        // Opens after 4 failures: the 3 attempts of the first call are
        // counted as 3, so the first attempt of the second call opens it.
        let knobs = Knobs::new(config().count_window(4).minimum_calls(4).failure_rate(0.5));
        let dependency = Dependency::default();
        let c = client(build, &knobs, dependency.serve(answers(503)));
        let mut steps = Vec::new();

        let first = answered(send(&c.service).await);
        assert_eq!(first, Answered::Status(503, true), "{build:?}");
        assert_eq!(dependency.calls(), 3, "{build:?}: three attempts");
        let after_first = figures(&c.breaker);
        assert_eq!(
            counted(after_first.window),
            (3, 3),
            "{build:?}: every attempt counted, not every call"
        );
        assert_eq!(after_first.state, State::Closed, "{build:?}");
        steps.push((first, dependency.calls(), after_first));

        let second = answered(send(&c.service).await);
        assert_eq!(
            second,
            Answered::CircuitOpen,
            "{build:?}: the 4th failed attempt opens the circuit, and the retry stops"
        );
        assert_eq!(dependency.calls(), 4, "{build:?}: no retry once open");
        let after_second = figures(&c.breaker);
        assert_eq!(after_second.state, State::Open, "{build:?}");
        assert_eq!(after_second.totals.failed, 4, "{build:?}");
        steps.push((second, dependency.calls(), after_second));

        for _ in 0..3 {
            let next = answered(send(&c.service).await);
            assert_eq!(next, Answered::CircuitOpen, "{build:?}");
            steps.push((next, dependency.calls(), figures(&c.breaker)));
        }
        assert_eq!(
            dependency.calls(),
            4,
            "{build:?}: the dependency is not called while the circuit is open"
        );
        let end = figures(&c.breaker);
        assert_eq!(end.totals.failed, 4, "{build:?}");
        assert_eq!(end.totals.successful, 0, "{build:?}");
        assert_eq!(
            end.totals.rejected, 4,
            "{build:?}: the refused retry and three calls"
        );
        assert_eq!(end.totals.opened, 1, "{build:?}");
        let counters = c.retry.counters();
        assert_eq!((counters.requests, counters.retries), (2, 2), "{build:?}");
        seen.push((steps, counters));
    }
    assert_eq!(seen[0], seen[1], "one line and by hand differ");
}

// === (b) one probe ===

/// Sends `TASKS` calls at once through clones of `svc` (the dependency holds
/// every call it receives until `release` has permits); returns how many
/// reached the dependency while the others were answered, and every
/// answer.
async fn race<C, B>(
    svc: &C,
    dependency: &Dependency,
    release: &Arc<Semaphore>,
) -> (usize, Vec<Answered>)
where
    B: Send + 'static,
    C: Service<Request<String>, Response = Response<B>, Error = BoxError> + Clone + Send + 'static,
    C::Future: Send,
{
    let answered_count = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(TASKS));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let svc = svc.clone();
            let barrier = barrier.clone();
            let answered_count = answered_count.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                let answer = answered(svc.oneshot(Request::new(String::new())).await);
                answered_count.fetch_add(1, Ordering::SeqCst);
                answer
            })
        })
        .collect();
    // Every task is either answered or held by the dependency.
    while answered_count.load(Ordering::SeqCst) + dependency.calls() < TASKS {
        tokio::task::yield_now().await;
    }
    let reached = dependency.calls();
    // Exactly the held calls: a spare permit would let a later call through.
    release.add_permits(reached);
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    (reached, answers)
}

fn count(answers: &[Answered], which: &Answered) -> usize {
    answers.iter().filter(|a| *a == which).count()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn after_the_open_period_concurrent_calls_make_exactly_one_probe() {
    let mut seen = Vec::new();
    for build in BUILDS {
        let knobs = Knobs::new(config().count_window(1).minimum_calls(1));
        let dependency = Dependency::default();
        let release = Arc::new(Semaphore::new(0));
        let c = client(build, &knobs, dependency.serve(held(&release)));
        record(&c.breaker, Outcome::Failure, 1);
        let open_for = c.breaker.snapshot().retry_after.unwrap();
        assert!(open_for > ms(1), "{build:?}: {open_for:?}");

        // t-1: still open, nobody gets through.
        advance(open_for - ms(1)).await;
        let (reached_early, early) = race(&c.service, &dependency, &release).await;
        assert_eq!(reached_early, 0, "{build:?}: open until the period ends");
        assert_eq!(count(&early, &Answered::CircuitOpen), TASKS, "{build:?}");

        // t: one probe, every other call fails fast.
        advance(ms(1)).await;
        let (reached, answers) = race(&c.service, &dependency, &release).await;
        assert_eq!(reached, 1, "{build:?}: exactly one probe");
        assert_eq!(dependency.calls(), 1, "{build:?}");
        assert_eq!(
            count(&answers, &Answered::Status(200, false)),
            1,
            "{build:?}"
        );
        assert_eq!(
            count(&answers, &Answered::CircuitOpen),
            TASKS - 1,
            "{build:?}"
        );
        let end = figures(&c.breaker);
        assert_eq!(end.state, State::Closed, "{build:?}: the probe closed it");
        assert_eq!(end.totals.rejected, (2 * TASKS - 1) as u64, "{build:?}");
        seen.push((reached_early, reached, early, answers, end));
    }
    assert_eq!(seen[0], seen[1], "one line and by hand differ");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_tasks_on_two_threads_make_exactly_one_probe() {
    for build in BUILDS {
        // No open period: the race starts the moment the circuit may probe
        // (no timer, so real threads race for the slot).
        let knobs = Knobs::new(
            config()
                .count_window(1)
                .minimum_calls(1)
                .open_period(Duration::ZERO),
        );
        let dependency = Dependency::default();
        let release = Arc::new(Semaphore::new(0));
        let c = client(build, &knobs, dependency.serve(held(&release)));
        record(&c.breaker, Outcome::Failure, 1);
        while c.breaker.snapshot().retry_after != Some(Duration::ZERO) {
            tokio::task::yield_now().await;
        }
        assert_eq!(c.breaker.snapshot().state, State::Open, "{build:?}");

        let (reached, answers) = race(&c.service, &dependency, &release).await;
        assert_eq!(reached, 1, "{build:?}: exactly one probe");
        assert_eq!(
            count(&answers, &Answered::Status(200, false)),
            1,
            "{build:?}"
        );
        assert_eq!(
            count(&answers, &Answered::CircuitOpen),
            TASKS - 1,
            "{build:?}"
        );
        assert_eq!(c.breaker.snapshot().state, State::Closed, "{build:?}");
    }
}

// === (c) deadline propagation ===

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_deadline_in_scope_reaches_the_dependency_in_one_header() {
    let mut seen = Vec::new();
    for build in BUILDS {
        let knobs = Knobs {
            timeout: Some(secs(2)),
            ..Knobs::new(config())
        };
        let dependency = Dependency::default();
        let c = client(build, &knobs, dependency.serve(answers(200)));
        let answer = Deadline::after(ms(300))
            .scope(send(&c.service))
            .await
            .map(|r| r.status());
        assert_eq!(answer.unwrap(), 200, "{build:?}");
        let values = dependency.values(BUDGET);
        assert_eq!(values.len(), 1, "{build:?}: one call");
        assert_eq!(
            values[0].len(),
            1,
            "{build:?}: exactly one value: {values:?}"
        );
        let budget: u64 = values[0][0].parse().unwrap();
        assert!(
            0 < budget && budget <= 300,
            "{build:?}: the caller's 300 ms, not the stack's 2 s: {budget}"
        );
        seen.push(values);
    }
    assert_eq!(seen[0], seen[1], "one line and by hand differ");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_criticality_in_scope_reaches_every_attempt_in_one_header() {
    let mut seen = Vec::new();
    for build in BUILDS {
        let dependency = Dependency::default();
        // Two 503s and a 200: three attempts, each must carry it.
        let c = client(
            build,
            &Knobs::new(config()),
            dependency.serve(|n| std::future::ready(Ok(status(if n < 2 { 503 } else { 200 })))),
        );
        let answer = Criticality::Sheddable
            .scope(send(&c.service))
            .await
            .map(|r| r.status());
        assert_eq!(answer.unwrap(), 200, "{build:?}");
        let values = dependency.values(CRITICALITY_HEADER.as_str());
        assert_eq!(
            values,
            vec![vec!["sheddable".to_owned()]; 3],
            "{build:?}: one value on each attempt"
        );
        // Outside any scope and without an extension nothing is written.
        let quiet = Dependency::default();
        let c = client(build, &Knobs::new(config()), quiet.serve(answers(200)));
        send(&c.service).await.unwrap();
        assert_eq!(
            quiet.values(CRITICALITY_HEADER.as_str()),
            vec![Vec::<String>::new()]
        );
        seen.push(values);
    }
    assert_eq!(seen[0], seen[1], "one line and by hand differ");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_server_stack_hands_the_callers_criticality_to_its_client_stacks() {
    let dependency = Dependency::default();
    let downstream = client(
        Build::OneLine,
        &Knobs::new(config()),
        dependency.serve(answers(200)),
    );
    let downstream = downstream.service;
    let handler = service_fn(move |_req: Request<String>| {
        let downstream = downstream.clone();
        async move {
            let status = send(&downstream).await.unwrap().status();
            Ok::<_, std::convert::Infallible>(Response::new(status.to_string()))
        }
    });
    let server = server_stack(NAME).layer(handler);
    // A caller claiming more than the server grants is clamped to Critical.
    for (claimed, expected) in [
        ("sheddable-plus", "sheddable-plus"),
        ("critical-plus", "critical"),
    ] {
        let response = server
            .clone()
            .oneshot(
                Request::get("/stock")
                    .header(CRITICALITY_HEADER, claimed)
                    .body(String::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            dependency
                .values(CRITICALITY_HEADER.as_str())
                .last()
                .unwrap(),
            &vec![expected.to_owned()],
            "claimed {claimed}"
        );
    }
}

/// A body streamed after the handler returned (a server stream, a body
/// whose frames come from calls it makes as it is read) calls out with the
/// caller's criticality too: the server stack reads the body in the
/// request's scope, as its deadline does. Both ways of building the server
/// stack.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_server_stacks_streamed_body_calls_out_with_the_callers_criticality() {
    use futures_util::StreamExt;
    use http_body_util::{BodyExt, StreamBody};

    for build in [Build::OneLine, Build::ByHand] {
        let dependency = Dependency::default();
        let downstream = client(
            Build::OneLine,
            &Knobs::new(config()),
            dependency.serve(answers(200)),
        )
        .service;
        let handler = service_fn(move |_req: Request<String>| {
            let downstream = downstream.clone();
            async move {
                // The call is made as the body is read, after the handler's
                // future has ended.
                let frames = futures_util::stream::once(async move {
                    let status = send(&downstream).await?.status();
                    Ok::<_, BoxError>(http_body::Frame::data(bytes::Bytes::from(
                        status.to_string(),
                    )))
                })
                .boxed();
                // (A boxed body: the stack's own answers need a default one.)
                Ok::<_, std::convert::Infallible>(Response::new(
                    StreamBody::new(frames).boxed_unsync(),
                ))
            }
        });
        let (server, _) = server(build, 8, handler);
        let response = server
            .oneshot(
                Request::get("/stock")
                    .header(CRITICALITY_HEADER, "sheddable")
                    .body(String::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{build:?}");
        assert!(
            dependency.values(CRITICALITY_HEADER.as_str()).is_empty(),
            "{build:?}: nothing called before the body is read"
        );
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "200 OK", "{build:?}");
        assert_eq!(
            dependency.values(CRITICALITY_HEADER.as_str()),
            vec![vec!["sheddable".to_owned()]],
            "{build:?}: the dependency was told the caller's criticality"
        );
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_throttled_attempt_is_local_not_counted_by_the_breaker_nor_retried() {
    use tower_breaker::throttle::ThrottleLayer;
    use tower_resilience_base::error::Throttled;

    let dependency = Dependency::default();
    // A breaker that never opens here, so that only the throttle sheds.
    let stack = client_stack(NAME)
        .breaker_config(config().count_window(10_000).minimum_calls(10_000))
        .throttle(ThrottleLayer::new(NAME).random(Arc::new(tower_breaker::SeededRandom::new(5))));
    let breaker = stack.breaker_handle().clone();
    let throttle = stack.throttle_handle().unwrap().clone();
    let service = stack.layer(dependency.serve(answers(503)));
    let mut throttled = 0;
    for _ in 0..300 {
        match send(&service).await {
            Err(e) if tower_resilience_base::error::find::<Throttled>(&*e).is_some() => {
                assert!(tower_resilience_base::error::is_local_rejection(&*e));
                throttled += 1;
            }
            Ok(r) => assert_eq!(r.status(), 503),
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    let snapshot = throttle.snapshot();
    assert!(
        throttled > 150,
        "a dependency that accepts nothing is throttled: {throttled}"
    );
    // Every attempt reached the throttle; the rejected ones not the dependency.
    assert_eq!(
        snapshot.requests,
        dependency.calls() as u64 + snapshot.rejected
    );
    assert_eq!(snapshot.accepts, 0);
    // The breaker counted the attempts that reached the dependency only.
    let (calls, _) = counted(breaker.snapshot().window);
    assert_eq!(calls, dependency.calls() as u64);
    // A rejection ends its call: one rejection per throttled call.
    assert_eq!(
        snapshot.rejected, throttled as u64,
        "a throttled attempt is not retried"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_optional_throttle_is_one_stack_type_that_throttles_only_when_given_one() {
    use tower_breaker::throttle::ThrottleLayer;
    use tower_resilience_base::error::Throttled;
    use tower_shield::stack::OptionalThrottle;

    let breaker = || config().count_window(10_000).minimum_calls(10_000);
    let on = client_stack(NAME)
        .breaker_config(breaker())
        .optional_throttle(Some(
            ThrottleLayer::new(NAME).random(Arc::new(tower_breaker::SeededRandom::new(5))),
        ));
    let off = client_stack(NAME)
        .breaker_config(breaker())
        .optional_throttle(None);
    // One type either way: a settings file may choose at run time.
    let stacks: [ClientStack<_, _, _, OptionalThrottle>; 2] = [on, off];
    let mut throttled = [0u32; 2];
    let mut reached = [0usize; 2];
    for (i, stack) in stacks.iter().enumerate() {
        let dependency = Dependency::default();
        let service = stack.layer(dependency.serve(answers(503)));
        for _ in 0..300 {
            match send(&service).await {
                Err(e) if tower_resilience_base::error::find::<Throttled>(&*e).is_some() => {
                    throttled[i] += 1;
                }
                Ok(r) => assert_eq!(r.status(), 503),
                Err(e) => panic!("unexpected error: {e}"),
            }
        }
        reached[i] = dependency.calls();
    }
    let [on, off] = &stacks;
    let snapshot = on.throttle_handle().expect("a throttle").snapshot();
    assert!(throttled[0] > 150, "given one, it throttles: {throttled:?}");
    assert_eq!(snapshot.rejected, u64::from(throttled[0]));
    assert_eq!(snapshot.requests, reached[0] as u64 + snapshot.rejected);
    assert!(off.throttle_handle().is_none());
    assert_eq!(throttled[1], 0, "without one, every attempt goes through");
    // 300 calls of up to 3 attempts each; the budget pays for few retries.
    assert!(reached[1] >= 300, "{reached:?}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_stack_without_a_throttle_has_no_throttle_layer() {
    // The stack's service names no `Throttle` unless one was asked for: a
    // stack that never throttles pays for no layer.
    let plain = client_stack(NAME).layer(Dependency::default().serve(answers(200)));
    let name = std::any::type_name_of_val(&plain);
    assert!(!name.contains("Throttle"), "{name}");
    assert!(client_stack(NAME).throttle_handle().is_none());
    let throttled = client_stack(NAME)
        .throttle(tower_breaker::throttle::ThrottleLayer::new(NAME))
        .layer(Dependency::default().serve(answers(200)));
    let name = std::any::type_name_of_val(&throttled);
    assert!(name.contains("::Throttle<"), "{name}");
    assert_eq!(send(&plain).await.unwrap().status(), 200);
    assert_eq!(send(&throttled).await.unwrap().status(), 200);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn only_the_per_attempt_layer_writes_the_budget() {
    // The per-attempt layer writes its own header name: the default one
    // would be there only if the outer (enforce-only) layer wrote it.
    let attempt_header = HeaderName::from_static("x-attempt-budget-ms");
    let mut seen = Vec::new();
    for build in BUILDS {
        let knobs = Knobs {
            timeout: Some(secs(2)),
            attempt: ClientDeadlineLayer::new().http_header(attempt_header.clone()),
            ..Knobs::new(config())
        };
        let dependency = Dependency::default();
        let c = client(build, &knobs, dependency.serve(answers(200)));
        let answer = Deadline::after(ms(300)).scope(send(&c.service)).await;
        assert_eq!(answer.unwrap().status(), 200, "{build:?}");
        let outer = dependency.values(BUDGET);
        let attempt = dependency.values(attempt_header.as_str());
        assert_eq!(
            outer,
            vec![Vec::<String>::new()],
            "{build:?}: the outer layer wrote a header"
        );
        assert_eq!(attempt.len(), 1, "{build:?}");
        assert_eq!(attempt[0].len(), 1, "{build:?}: {attempt:?}");
        let budget: u64 = attempt[0][0].parse().unwrap();
        assert!(0 < budget && budget <= 300, "{build:?}: {budget}");
        seen.push(attempt);
    }
    assert_eq!(seen[0], seen[1], "one line and by hand differ");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn each_attempt_carries_the_budget_left_when_it_is_sent() {
    let mut seen = Vec::new();
    for build in BUILDS {
        let knobs = Knobs::new(config());
        let dependency = Dependency::default();
        // The first attempt takes 100 ms and fails; the retry succeeds.
        let transport = dependency.serve(|n| async move {
            if n == 0 {
                tokio::time::sleep(ms(100)).await;
                Ok(status(503))
            } else {
                Ok(status(200))
            }
        });
        let c = client(build, &knobs, transport);
        let answer = Deadline::after(ms(300)).scope(send(&c.service)).await;
        assert_eq!(answer.unwrap().status(), 200, "{build:?}");
        let values = dependency.values(BUDGET);
        assert_eq!(values.len(), 2, "{build:?}: two attempts");
        assert!(
            values.iter().all(|v| v.len() == 1),
            "{build:?}: one value per attempt: {values:?}"
        );
        let first: u64 = values[0][0].parse().unwrap();
        let second: u64 = values[1][0].parse().unwrap();
        assert!(0 < first && first <= 300, "{build:?}: {first}");
        assert!(
            0 < second && second <= 200,
            "{build:?}: the retry is told what is left after 100 ms and the backoff: {second}"
        );
        assert_eq!(
            dependency.values(RETRY_ATTEMPT_HEADER.as_str()),
            vec![vec![], vec!["2".to_owned()]],
            "{build:?}"
        );
        // The backoff is random: compare the first attempt's value only.
        seen.push(first);
    }
    assert_eq!(seen[0], seen[1], "one line and by hand differ");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn without_a_scope_the_dependency_sees_the_stacks_timeout() {
    let mut seen = Vec::new();
    for build in BUILDS {
        let knobs = Knobs {
            timeout: Some(ms(1500)),
            ..Knobs::new(config())
        };
        let dependency = Dependency::default();
        let c = client(build, &knobs, dependency.serve(answers(200)));
        assert_eq!(send(&c.service).await.unwrap().status(), 200, "{build:?}");
        let values = dependency.values(BUDGET);
        assert_eq!(values, vec![vec!["1500".to_owned()]], "{build:?}");
        seen.push(values);
    }
    assert_eq!(seen[0], seen[1], "one line and by hand differ");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_call_is_cut_when_the_deadline_in_scope_passes() {
    let mut seen = Vec::new();
    for build in BUILDS {
        let knobs = Knobs {
            timeout: Some(secs(2)),
            ..Knobs::new(config())
        };
        let dependency = Dependency::default();
        let transport = dependency.serve(|_| std::future::pending());
        let c = client(build, &knobs, transport);
        let mut call = tokio_test::task::spawn(Deadline::after(ms(300)).scope(send(&c.service)));
        assert_pending!(call.poll());
        advance(ms(299)).await;
        assert_pending!(call.poll(), "{build:?}: cut before the deadline");
        advance(ms(1)).await;
        let answer = match call.poll() {
            std::task::Poll::Ready(result) => answered(result),
            std::task::Poll::Pending => panic!("{build:?}: not cut at the deadline"),
        };
        assert_eq!(answer, Answered::DeadlineExceeded, "{build:?}");
        assert_eq!(
            dependency.calls(),
            1,
            "{build:?}: no retry after the deadline"
        );
        seen.push(answer);
    }
    assert_eq!(seen[0], seen[1], "one line and by hand differ");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_dependency_that_hangs_past_the_stacks_timeout_opens_the_circuit() {
    // The breaker counts timeouts as failures (`classify_error`): a
    // dependency that never answers must open the circuit like one that
    // answers 503, or the stack's breaker never stops the waiting it exists
    // to stop.
    let mut seen = Vec::new();
    for build in BUILDS {
        let knobs = Knobs {
            timeout: Some(ms(300)),
            ..Knobs::new(config().count_window(2).minimum_calls(2))
        };
        let dependency = Dependency::default();
        let transport = dependency.serve(|_| std::future::pending());
        let c = client(build, &knobs, transport);
        let mut answers = Vec::new();
        for _ in 0..2 {
            let mut call = tokio_test::task::spawn(send(&c.service));
            assert_pending!(call.poll());
            advance(ms(300)).await;
            let answer = match call.poll() {
                std::task::Poll::Ready(result) => answered(result),
                std::task::Poll::Pending => panic!("{build:?}: not cut at the timeout"),
            };
            assert_eq!(answer, Answered::DeadlineExceeded, "{build:?}");
            answers.push(answer);
        }
        let s = figures(&c.breaker);
        assert_eq!(
            (counted(s.window), s.state),
            ((2, 2), State::Open),
            "{build:?}: two timed-out calls are two failures ({:?})",
            s.totals
        );
        let third = send(&c.service).now_or_never().map(answered);
        assert_eq!(third, Some(Answered::CircuitOpen), "{build:?}");
        assert_eq!(dependency.calls(), 2, "{build:?}: not called once open");
        seen.push((answers, s));
    }
    assert_eq!(seen[0], seen[1], "one line and by hand differ");
}

// === (d) bulkhead rejection ===

/// Sends one request whose own deadline has already passed.
async fn send_late<S, B>(svc: &S) -> Result<Response<B>, BoxError>
where
    S: Service<Request<String>, Response = Response<B>, Error = BoxError> + Clone,
{
    let mut request = Request::new(String::new());
    request
        .extensions_mut()
        .insert(Deadline::after(Duration::ZERO));
    svc.clone().oneshot(request).await
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_open_circuit_refuses_before_the_calls_deadline_is_looked_at() {
    let mut seen = Vec::new();
    for build in BUILDS {
        let knobs = Knobs {
            timeout: Some(Duration::from_secs(2)),
            ..Knobs::new(config())
        };
        let dependency = Dependency::default();
        let c = client(build, &knobs, dependency.serve(answers(200)));
        c.breaker.set_mode(Mode::ForcedOpen);

        // The breaker is the first to judge the call: an open circuit is
        // the answer even for a call whose budget is already spent (the
        // deadline below it would have refused it too, after its work).
        let late = answered(send_late(&c.service).await);
        assert_eq!(late, Answered::CircuitOpen, "{build:?}");
        let on_time = answered(send(&c.service).await);
        assert_eq!(on_time, Answered::CircuitOpen, "{build:?}");
        assert_eq!(dependency.calls(), 0, "{build:?}");
        let totals = c.breaker.snapshot().totals;
        assert_eq!((totals.rejected, totals.ignored), (2, 0), "{build:?}");
        seen.push((late, on_time, totals));
    }
    assert_eq!(seen[0], seen[1], "one line and by hand differ");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_call_refused_for_its_deadline_leaves_the_half_open_probe_to_the_next() {
    let mut seen = Vec::new();
    for build in BUILDS {
        // One counted failure opens this breaker, for one second; one probe.
        let knobs = Knobs::new(
            config()
                .count_window(10)
                .minimum_calls(1)
                .open_period(Duration::from_secs(1))
                .permitted_probes(1)
                .successes_to_close(1),
        );
        let dependency = Dependency::default();
        let c = client(
            build,
            &knobs,
            dependency.serve(|n| std::future::ready(Ok(status(if n == 0 { 500 } else { 200 })))),
        );
        // 500 is permanent, not retried: one failed attempt opens it.
        assert_eq!(
            answered(send(&c.service).await),
            Answered::Status(500, false),
            "{build:?}"
        );
        assert_eq!(c.breaker.snapshot().state, State::Open, "{build:?}");
        tokio::time::advance(Duration::from_secs(1)).await;

        // The first call after the open period is admitted as the probe,
        // and refused below for its spent budget: a local rejection, not
        // counted, and the probe is free again.
        let late = send_late(&c.service).await.unwrap_err();
        assert!(
            late.is::<tower_deadline::error::InsufficientBudget>(),
            "{build:?}: {late:?}"
        );
        assert_eq!(dependency.calls(), 1, "{build:?}: not sent");
        let after_late = figures(&c.breaker);
        assert_eq!(after_late.totals.failed, 1, "{build:?}: not counted");
        assert_eq!(after_late.totals.rejected, 0, "{build:?}");

        let probe = answered(send(&c.service).await);
        assert_eq!(
            probe,
            Answered::Status(200, false),
            "{build:?}: the next call probes"
        );
        let end = figures(&c.breaker);
        assert_eq!(end.state, State::Closed, "{build:?}");
        seen.push((after_late, probe, end));
    }
    assert_eq!(seen[0], seen[1], "one line and by hand differ");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_full_bulkhead_fails_at_once_and_the_breaker_does_not_count_it() {
    let mut seen = Vec::new();
    for build in BUILDS {
        // One counted failure would open this breaker.
        let knobs = Knobs {
            concurrency: 1,
            ..Knobs::new(config().count_window(10).minimum_calls(1))
        };
        let dependency = Dependency::default();
        let release = Arc::new(Semaphore::new(0));
        let c = client(build, &knobs, dependency.serve(held(&release)));

        let mut first = tokio_test::task::spawn(send(&c.service));
        assert_pending!(first.poll());
        assert_eq!(dependency.calls(), 1, "{build:?}");

        let second = send(&c.service)
            .now_or_never()
            .expect("a full bulkhead refuses at once");
        let err = second.unwrap_err();
        let full = err
            .downcast_ref::<BulkheadFull>()
            .unwrap_or_else(|| panic!("{build:?}: not BulkheadFull: {err:?}"));
        assert_eq!(full.compartment(), NAME, "{build:?}");
        assert_eq!(dependency.calls(), 1, "{build:?}: not sent");
        let refused = figures(&c.breaker);
        assert_eq!(refused.state, State::Closed, "{build:?}");
        assert_eq!(counted(refused.window), (0, 0), "{build:?}: not counted");
        assert_eq!(refused.totals.failed, 0, "{build:?}");
        assert_eq!(refused.totals.ignored, 1, "{build:?}");
        assert_eq!(c.retry.counters().retries, 0, "{build:?}: not retried");

        release.add_permits(1);
        let first = answered(first.await);
        assert_eq!(first, Answered::Status(200, false), "{build:?}");
        let end = figures(&c.breaker);
        assert_eq!(counted(end.window), (1, 0), "{build:?}");
        assert_eq!(end.totals.successful, 1, "{build:?}");
        seen.push((first, refused, end, c.retry.counters()));
    }
    assert_eq!(seen[0], seen[1], "one line and by hand differ");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_stacks_bulkhead_handle_sees_attempts_in_flight() {
    let dependency = Dependency::default();
    let release = Arc::new(Semaphore::new(0));
    // A bulkhead given to the stack is the one the stack uses.
    let layer = BulkheadLayer::new(NAME, 2);
    let kept = layer.handle();
    let stack = client_stack(NAME).bulkhead(layer);
    let handle = stack.bulkhead_handle();
    let service = stack.layer(dependency.serve(held(&release)));

    let mut first = tokio_test::task::spawn(send(&service));
    assert_pending!(first.poll());
    assert_eq!(handle.in_flight(), 1);
    assert_eq!(kept.in_flight(), 1, "the stack uses the layer it was given");
    let mut second = tokio_test::task::spawn(send(&service));
    assert_pending!(second.poll());
    assert_eq!(handle.in_flight(), 2);
    let third = send(&service)
        .now_or_never()
        .expect("full: refused at once");
    assert!(third.unwrap_err().is::<BulkheadFull>());
    assert_eq!(handle.rejected(), 1);

    release.add_permits(2);
    assert_eq!(answered(first.await), Answered::Status(200, false));
    assert_eq!(answered(second.await), Answered::Status(200, false));
    assert_eq!(handle.in_flight(), 0, "every permit came back");

    let server = server_stack(NAME).concurrency(3);
    assert_eq!(server.bulkhead_handle().in_flight(), 0);
    assert_eq!(server.bulkhead_handle().limit(), 3);
}

// === the server stack ===

/// The server stack around `handler`, built the `build` way.
fn server<S>(build: Build, concurrency: usize, handler: S) -> (ServerStackService<S>, Breaker) {
    match build {
        Build::OneLine => {
            let stack = server_stack(NAME).concurrency(concurrency);
            (stack.layer(handler), stack.breaker_handle().clone())
        }
        Build::ByHand => {
            let breaker = Breaker::new(NAME);
            let service = ServiceBuilder::new()
                .layer(AcceptCriticalityLayer::new())
                .layer(ServerDeadlineLayer::new())
                .layer(HttpBulkheadLayer::new(NAME, concurrency).hold_until_body_end())
                .layer(HttpBreakerLayer::new(breaker.clone()))
                .service(handler);
            (service, breaker)
        }
    }
}

/// A handler that counts its calls and answers 200 once `release` has a
/// permit.
fn handler(
    handled: &CallCounter,
    release: &Arc<Semaphore>,
) -> impl Service<
    Request<String>,
    Response = Response<String>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone
       + Send {
    let handled = handled.clone();
    let release = release.clone();
    service_fn(move |_req: Request<String>| {
        handled.hit();
        let release = release.clone();
        async move {
            release.acquire().await.unwrap().forget();
            Ok(status(200))
        }
    })
}

fn request(grpc: bool) -> http::request::Builder {
    if grpc {
        Request::post("/inventory.Stock/Get").header("content-type", "application/grpc")
    } else {
        Request::get("/stock")
    }
}

/// The parts of an answer the scenarios compare.
fn head<B>(response: &Response<B>) -> (u16, Vec<(String, String)>) {
    let mut headers: Vec<_> = response
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
        .collect();
    headers.sort();
    (response.status().as_u16(), headers)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn server_stack_answers_504_at_the_callers_deadline() {
    let mut seen = [Vec::new(), Vec::new()];
    for (i, build) in BUILDS.into_iter().enumerate() {
        for grpc in [false, true] {
            let handled = CallCounter::default();
            let never = Arc::new(Semaphore::new(0));
            let (svc, _) = server(build, DEFAULT_SERVER_CONCURRENCY, handler(&handled, &never));
            let (req, expires) = if grpc {
                // gRPC requests expire `grpc_lead` early, to answer before
                // tonic's own timer.
                let req = request(true).header("grpc-timeout", "100m");
                (req, ms(100) - DEFAULT_GRPC_LEAD)
            } else {
                (request(false).header(BUDGET, "100"), ms(100))
            };
            let mut answer = tokio_test::task::spawn(svc.oneshot(req.body(String::new()).unwrap()));
            assert_pending!(answer.poll());
            assert_eq!(handled.calls(), 1, "{build:?} grpc={grpc}");
            advance(expires - ms(1)).await;
            assert_pending!(answer.poll(), "{build:?} grpc={grpc}: answered early");
            advance(ms(1)).await;
            let response = assert_ready_ok!(answer.poll());
            if grpc {
                assert_eq!(response.status(), 200, "{build:?}: trailers-only");
                assert_eq!(response.headers()["grpc-status"], "4", "{build:?}");
            } else {
                assert_eq!(response.status(), 504, "{build:?}");
            }
            seen[i].push(head(&response));
        }
    }
    assert_eq!(seen[0], seen[1], "one line and by hand differ");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn server_stack_answers_503_with_retry_after_when_the_bulkhead_is_full() {
    let mut seen = Vec::new();
    for build in BUILDS {
        let handled = CallCounter::default();
        let release = Arc::new(Semaphore::new(0));
        let (svc, breaker) = server(build, 1, handler(&handled, &release));

        let mut first = tokio_test::task::spawn(
            svc.clone()
                .oneshot(request(false).body(String::new()).unwrap()),
        );
        assert_pending!(first.poll());
        let second = svc
            .clone()
            .oneshot(request(false).body(String::new()).unwrap())
            .now_or_never()
            .expect("a full bulkhead answers at once")
            .unwrap();
        assert_eq!(second.status(), 503, "{build:?}");
        let retry_after = DEFAULT_RETRY_AFTER.as_secs().to_string();
        assert_eq!(second.headers()["retry-after"], *retry_after, "{build:?}");
        assert_eq!(second.headers()[NO_RETRY_HEADER], "1", "{build:?}");
        assert_eq!(handled.calls(), 1, "{build:?}: the handler was not called");

        release.add_permits(1);
        assert_eq!(first.await.unwrap().status(), 200, "{build:?}");
        assert_eq!(
            counted(breaker.snapshot().window),
            (1, 0),
            "{build:?}: the breaker below the bulkhead saw one call"
        );
        seen.push(head(&second));
    }
    assert_eq!(seen[0], seen[1], "one line and by hand differ");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn server_stack_answers_503_when_the_breaker_is_forced_open() {
    let mut seen = Vec::new();
    for build in BUILDS {
        let handled = CallCounter::default();
        let release = Arc::new(Semaphore::new(0));
        let (svc, breaker) = server(
            build,
            DEFAULT_SERVER_CONCURRENCY,
            handler(&handled, &release),
        );
        breaker.set_mode(Mode::ForcedOpen);

        let http = svc
            .clone()
            .oneshot(request(false).body(String::new()).unwrap())
            .now_or_never()
            .expect("an open circuit answers at once")
            .unwrap();
        assert_eq!(http.status(), 503, "{build:?}");
        let retry_after: u64 = http.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(retry_after >= 1, "{build:?}");
        assert_eq!(http.headers()[NO_RETRY_HEADER], "1", "{build:?}");

        let grpc = svc
            .clone()
            .oneshot(request(true).body(String::new()).unwrap())
            .now_or_never()
            .expect("an open circuit answers at once")
            .unwrap();
        assert_eq!(grpc.status(), 200, "{build:?}: trailers-only");
        assert_eq!(
            grpc.headers()["grpc-status"],
            "14",
            "{build:?}: UNAVAILABLE"
        );

        assert_eq!(handled.calls(), 0, "{build:?}: the handler was not called");
        assert_eq!(breaker.snapshot().totals.rejected, 2, "{build:?}");
        seen.push((head(&http), head(&grpc)));
    }
    assert_eq!(seen[0], seen[1], "one line and by hand differ");
}

#[test]
fn the_stacks_coarse_clock_is_its_outer_deadlines() {
    // The layer's own tests show what the coarse clock changes (with a
    // clock only the test moves); here, that the stack hands the setting
    // to its outer deadline, whose reading the layers below take.
    let off = format!("{:?}", client_stack("catalog"));
    let on = format!("{:?}", client_stack("catalog").coarse_clock(true));
    assert_eq!(off.matches("coarse: None").count(), 2, "{off}");
    assert_eq!(on.matches("coarse: Some(").count(), 1, "{on}");
    assert_eq!(on.matches("coarse: None").count(), 1, "{on}");
    let outer = on.find("call: ").expect("the outer deadline");
    let attempt = on.find("attempt: ").expect("the per-attempt deadline");
    let coarse = on.find("coarse: Some(").expect("set");
    assert!(outer < coarse && coarse < attempt, "{on}");
}

/// `coarse_clock(true)` reaches the stack's own breaker, in whatever order
/// the stack is built, and leaves a breaker handed to the stack on its own
/// clock. Told apart by what each sees of tokio's paused clock: the coarse
/// clock follows the real one, so a breaker on it is still open after a
/// paused minute; a breaker on tokio's clock has seen its open period end.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_stacks_coarse_clock_reaches_its_own_breaker_and_not_one_handed_to_it() {
    let config = || {
        BreakerConfig::new()
            .minimum_calls(2)
            .open_period(Duration::from_secs(30))
    };
    let coarse = [
        client_stack("config, then coarse")
            .breaker_config(config())
            .coarse_clock(true),
        client_stack("coarse, then config")
            .coarse_clock(true)
            .breaker_config(config()),
        client_stack("coarse, config, then random")
            .coarse_clock(true)
            .breaker_config(config())
            .random(tower_breaker::SeededRandom::new(1)),
    ];
    let real = [
        client_stack("no coarse clock").breaker_config(config()),
        client_stack("a breaker of its own")
            .coarse_clock(true)
            .breaker(Breaker::with_config("a breaker of its own", config())),
        client_stack("coarse, then off")
            .breaker_config(config())
            .coarse_clock(true)
            .coarse_clock(false),
    ];
    let breakers: Vec<(Breaker, bool)> = coarse
        .iter()
        .map(|stack| (stack.breaker_handle().clone(), true))
        .chain(
            real.iter()
                .map(|stack| (stack.breaker_handle().clone(), false)),
        )
        .collect();
    // The clock is switched in place: a handle taken before is still the
    // stack's breaker (as a settings handle's is).
    let stack = client_stack("handle taken before").breaker_config(config());
    let early = stack.breaker_handle().clone();
    let stack = stack.coarse_clock(true);
    assert!(early.config().get_coarse_clock());
    early.try_acquire().unwrap().record(Outcome::Failure);
    assert_eq!(stack.breaker_handle().snapshot().totals.failed, 1);
    for (breaker, on) in &breakers {
        assert_eq!(
            breaker.config().get_coarse_clock(),
            *on,
            "{}",
            breaker.name()
        );
        for _ in 0..2 {
            breaker.try_acquire().unwrap().record(Outcome::Failure);
        }
        assert_eq!(breaker.snapshot().state, State::Open, "{}", breaker.name());
    }
    tokio::time::advance(Duration::from_secs(60)).await;
    for (breaker, on) in &breakers {
        assert_eq!(
            breaker.try_acquire().is_err(),
            *on,
            "{}: a coarse breaker is still open, one on tokio's clock probes",
            breaker.name()
        );
    }
}
