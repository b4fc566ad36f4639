//! The variants of the stack benches (`stack` times them, `stack_allocs`
//! counts their allocations): a bare `service_fn`, tower's layers as
//! controls, our layers one at a time and stacked, on a bare request and
//! on one shaped like a real client request.

#![allow(dead_code, unreachable_pub)] // each bench uses what it needs

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::time::Duration;

use http::{Request, Response};
use tokio::time::Instant;
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};
use tower_breaker::throttle::{ThrottleHandle, ThrottleLayer};
use tower_breaker::{Breaker, BreakerLayer, Mode};
use tower_bulkhead::release::BodyEnd;
use tower_bulkhead::BulkheadLayer;
use tower_deadline::{ClientDeadlineLayer, Deadline};
use tower_retry_budget::body::CloneBody;
use tower_retry_budget::{Buffered, DefaultPolicy, RetryLayer};
use tower_shield::stack::{client_stack, ClientStack};

pub type Bare = tower::util::ServiceFn<fn(Request<()>) -> Ready<Result<Response<()>, Infallible>>>;

pub fn bare() -> Bare {
    service_fn(|_req: Request<()>| ready(Ok::<_, Infallible>(Response::new(()))))
}

/// The bare service reading the clock once per call: a control for what a
/// clock read costs on the machine at hand (a layer that must know the
/// time, to write the remaining budget or to count a request in a
/// time-bucketed budget, reads it once per call).
pub fn clocked() -> Bare {
    service_fn(|_req: Request<()>| {
        std::hint::black_box(Instant::now());
        ready(Ok::<_, Infallible>(Response::new(())))
    })
}

/// The bare service allocating (and freeing) 8 bytes per call: a control
/// for what the one allocation a layer may make per call (a boxed error)
/// costs on the machine at hand.
pub fn allocating() -> Bare {
    service_fn(|_req: Request<()>| {
        drop(std::hint::black_box(Box::new(0u64)));
        ready(Ok::<_, Infallible>(Response::new(())))
    })
}

/// What a request carries besides its head: an extension of the caller's.
#[derive(Clone, Copy, Debug)]
pub struct RequestId(#[allow(dead_code)] u64);

/// Which request each call sends.
#[derive(Clone, Copy)]
pub enum Shape {
    /// `Request::new(())`: no headers, no extensions.
    Bare,
    /// A GET with a URI, three headers and one extension, as a real client
    /// request has (built the same way for the bare service, so only the
    /// layers' own cost shows).
    Real,
}

pub fn request(shape: Shape) -> Request<()> {
    match shape {
        Shape::Bare => Request::new(()),
        Shape::Real => {
            let mut request = Request::get("http://catalog.internal/items?page=2")
                .header("host", "catalog.internal")
                .header("user-agent", "bench/1.0")
                .header("accept", "*/*")
                .body(())
                .unwrap();
            request.extensions_mut().insert(RequestId(42));
            request
        }
    }
}

/// `iters` calls of `svc` inside the task-local scope of a 60 s deadline,
/// timed.
pub async fn run<S>(mut svc: S, shape: Shape, iters: u64) -> Duration
where
    S: Service<Request<()>>,
{
    Deadline::after(Duration::from_secs(60))
        .scope(async move {
            let start = Instant::now();
            for _ in 0..iters {
                let _ = svc.ready().await;
                let out = svc.call(request(shape)).await;
                std::hint::black_box(out.is_ok());
            }
            start.elapsed()
        })
        .await
}

/// As [`run`], with a clone of `svc` per call, as clients that hand each
/// request a copy of the stack do (`tower_shield::reqwest::Client`,
/// `tonic` clients, `ServiceExt::oneshot` on a clone): the stack's clone
/// and drop are then part of every call.
pub async fn run_cloned<S>(svc: S, shape: Shape, iters: u64) -> Duration
where
    S: Service<Request<()>> + Clone,
{
    Deadline::after(Duration::from_secs(60))
        .scope(async move {
            let start = Instant::now();
            for _ in 0..iters {
                let out = svc.clone().oneshot(request(shape)).await;
                std::hint::black_box(out.is_ok());
            }
            start.elapsed()
        })
        .await
}

pub fn tower_two<S>(inner: S) -> impl Service<Request<()>> + Clone
where
    S: Service<Request<()>, Response = Response<()>> + Clone,
    S::Error: Into<tower::BoxError>,
{
    ServiceBuilder::new()
        .timeout(Duration::from_secs(60))
        .concurrency_limit(1024)
        .service(inner)
}

pub fn tower_timeout(inner: Bare) -> impl Service<Request<()>> + Clone {
    ServiceBuilder::new()
        .timeout(Duration::from_secs(60))
        .service(inner)
}

pub fn step_bulkhead(inner: Bare) -> impl Service<Request<()>> + Clone {
    BulkheadLayer::new("bench", 1024).layer(inner)
}

pub fn step_retry(inner: Bare) -> impl Service<Request<()>> + Clone {
    ServiceBuilder::new()
        .layer(RetryLayer::new().clone_bodies())
        .layer(BulkheadLayer::new("bench", 1024))
        .service(inner)
}

pub fn step_breaker(inner: Bare) -> impl Service<Request<()>> + Clone {
    ServiceBuilder::new()
        .layer(BreakerLayer::new(Breaker::new("bench")))
        .layer(RetryLayer::new().clone_bodies())
        .layer(BulkheadLayer::new("bench", 1024))
        .service(inner)
}

/// The full stack by hand, as the module docs of `tower_shield::stack`
/// show it.
pub fn full_by_hand(inner: Bare, breaker: Breaker) -> impl Service<Request<()>> + Clone {
    ServiceBuilder::new()
        .layer(BreakerLayer::new(breaker))
        .layer(
            ClientDeadlineLayer::new()
                .default_timeout(Duration::from_secs(60))
                .enforce_only()
                .head_only(),
        )
        .layer(RetryLayer::new().clone_bodies())
        .layer(BulkheadLayer::new("bench", 1024).hold_until_body_end())
        .layer(ClientDeadlineLayer::new())
        .service(inner)
}

/// The same stack in one line, as `configure` leaves `client_stack`.
fn one_line_with<T>(
    inner: Bare,
    configure: impl FnOnce(ClientStack) -> ClientStack<DefaultPolicy, Buffered, BodyEnd, T>,
) -> impl Service<Request<()>> + Clone
where
    ClientStack<DefaultPolicy, CloneBody, BodyEnd, T>: Layer<Bare>,
    <ClientStack<DefaultPolicy, CloneBody, BodyEnd, T> as Layer<Bare>>::Service:
        Service<Request<()>> + Clone,
{
    configure(client_stack("bench").timeout(Duration::from_secs(60)))
        .retry(RetryLayer::new().clone_bodies())
        .concurrency(1024)
        .layer(inner)
}

/// A breaker forced open.
fn forced_open() -> Breaker {
    let breaker = Breaker::new("bench");
    breaker.set_mode(Mode::ForcedOpen);
    breaker
}

/// The same stack in one line.
pub fn one_line(inner: Bare) -> impl Service<Request<()>> + Clone {
    one_line_with(inner, |stack| stack)
}

/// One throttle for every round: a throttle admits its calls without
/// computing the rule once its window has a past (two buckets, 4 s with
/// the default window), which a throttle built per round of milliseconds
/// never reaches.
fn shared_throttle() -> ThrottleHandle {
    static THROTTLE: std::sync::OnceLock<ThrottleHandle> = std::sync::OnceLock::new();
    THROTTLE
        .get_or_init(|| ThrottleHandle::new("bench"))
        .clone()
}

/// The one-line stack with the client-side throttle (one shared throttle,
/// see [`shared_throttle`]).
pub fn one_line_throttled(inner: Bare) -> impl Service<Request<()>> + Clone {
    one_line_with(inner, |stack| {
        stack.throttle(ThrottleLayer::with_handle(shared_throttle()))
    })
}

/// The one-line stack whose breaker detects slow calls: the breaker then
/// needs the time of every call, as one with a fleet's store does.
pub fn one_line_slow_calls(inner: Bare) -> impl Service<Request<()>> + Clone {
    one_line_with(inner, |stack| {
        stack.breaker(Breaker::with_config(
            "bench",
            tower_breaker::BreakerConfig::new().slow_calls(Duration::from_secs(10), 0.5),
        ))
    })
}

/// The one-line stack on the coarse clock.
pub fn one_line_coarse(inner: Bare) -> impl Service<Request<()>> + Clone {
    one_line_with(inner, |stack| stack.coarse_clock(true))
}

/// The one-line stack on the coarse clock, its circuit forced open.
pub fn open_coarse(inner: Bare) -> impl Service<Request<()>> + Clone {
    one_line_with(inner, |stack| {
        stack.breaker(forced_open()).coarse_clock(true)
    })
}

/// A breaker opened by a failed call, for an hour: a refusal then reads
/// the clock, to know whether the open period is over.
fn tripped_open() -> Breaker {
    let breaker = Breaker::with_config(
        "bench",
        tower_breaker::BreakerConfig::new()
            .minimum_calls(1)
            .open_period(Duration::from_secs(3600)),
    );
    trip(&breaker);
    breaker
}

/// Opens `breaker` (one whose minimum is a single call) by a failed call.
fn trip(breaker: &Breaker) {
    breaker
        .try_acquire()
        .expect("closed")
        .record(tower_breaker::Outcome::Failure);
    assert!(breaker.try_acquire().is_err(), "opened");
}

/// The one-line stack on the coarse clock, its own breaker (on the coarse
/// clock too) opened by failures: a refusal reads the coarse clock.
pub fn open_tripped_coarse(inner: Bare) -> impl Service<Request<()>> + Clone {
    one_line_with(inner, |stack| {
        let stack = stack
            .breaker_config(
                tower_breaker::BreakerConfig::new()
                    .minimum_calls(1)
                    .open_period(Duration::from_secs(3600)),
            )
            .coarse_clock(true);
        trip(stack.breaker_handle());
        stack
    })
}

/// The full stack whose circuit was opened by failures.
pub fn open_tripped(inner: Bare) -> impl Service<Request<()>> + Clone {
    full_by_hand(inner, tripped_open())
}

/// The full stack whose circuit is forced open.
pub fn open(inner: Bare) -> impl Service<Request<()>> + Clone {
    full_by_hand(inner, forced_open())
}

/// Each layer alone, for the joints' own targets.
pub fn retry_alone(inner: Bare) -> impl Service<Request<()>> + Clone {
    RetryLayer::new().clone_bodies().layer(inner)
}

/// The policy of the tower `Retry` controls: up to two retries of an error,
/// with or without tower's `TpsBudget` (which counts every request, as our
/// budget does); a retry keeps a copy of the request head.
#[derive(Clone)]
struct TowerPolicy {
    retries: usize,
    budget: Option<std::sync::Arc<tower::retry::budget::TpsBudget>>,
}

impl<E> tower::retry::Policy<Request<()>, Response<()>, E> for TowerPolicy {
    type Future = Ready<()>;

    fn retry(
        &mut self,
        _: &mut Request<()>,
        result: &mut Result<Response<()>, E>,
    ) -> Option<Self::Future> {
        use tower::retry::budget::Budget;
        match (result, &self.budget) {
            (Ok(_), Some(budget)) => {
                budget.deposit();
                None
            }
            (Ok(_), None) => None,
            (Err(_), Some(budget)) => budget.withdraw().then(|| ready(())),
            (Err(_), None) if self.retries > 0 => {
                self.retries -= 1;
                Some(ready(()))
            }
            (Err(_), None) => None,
        }
    }

    fn clone_request(&mut self, req: &Request<()>) -> Option<Request<()>> {
        let mut copy = Request::new(());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.headers_mut() = req.headers().clone();
        *copy.extensions_mut() = req.extensions().clone();
        Some(copy)
    }
}

pub fn tower_retry(inner: Bare) -> impl Service<Request<()>> + Clone {
    let policy = TowerPolicy {
        retries: 2,
        budget: None,
    };
    tower::retry::Retry::new(policy, inner)
}

/// tower's `Retry` with its `TpsBudget` (10 s window, 10 retries per
/// second floor, 10 %): the control for the retry layer, which also counts
/// every request in a time-bucketed budget (and reads the clock for it).
pub fn tower_retry_budgeted(inner: Bare) -> impl Service<Request<()>> + Clone {
    let budget = tower::retry::budget::TpsBudget::new(Duration::from_secs(10), 10, 0.1);
    let policy = TowerPolicy {
        retries: 2,
        budget: Some(std::sync::Arc::new(budget)),
    };
    tower::retry::Retry::new(policy, inner)
}

/// tower's own layers doing the work of the full stack but the breaker's:
/// an outer `Timeout`, `Retry` with `TpsBudget` (keeping a copy of the
/// head), `ConcurrencyLimit`, a per-attempt `Timeout`, and a `map_request`
/// that writes the remaining budget of the task's deadline as a header, as
/// the per-attempt `ClientDeadline` does (the value formatted on the stack,
/// one allocation, as ours). The control for the full stack's target: what
/// the same work costs when composed from tower's layers.
pub fn tower_equivalent(inner: Bare) -> impl Service<Request<()>> + Clone {
    let budget = tower::retry::budget::TpsBudget::new(Duration::from_secs(10), 10, 0.1);
    let policy = TowerPolicy {
        retries: 2,
        budget: Some(std::sync::Arc::new(budget)),
    };
    ServiceBuilder::new()
        .timeout(Duration::from_secs(60))
        .layer(tower::retry::RetryLayer::new(policy))
        .concurrency_limit(1024)
        .timeout(Duration::from_secs(60))
        .map_request(write_remaining)
        .service(inner)
}

/// Writes the remaining budget of the task's deadline into `request`, as
/// the client deadline does, in a `map_request` (the value formatted on the
/// stack: one allocation, as ours).
fn write_remaining(mut request: Request<()>) -> Request<()> {
    let remaining = Deadline::current().map_or(Duration::from_secs(60), Deadline::remaining);
    let millis = u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX);
    let mut buf = [0u8; 20];
    let len = {
        use std::io::Write;
        let mut cursor = std::io::Cursor::new(&mut buf[..]);
        let _ = write!(cursor, "{millis}");
        cursor.position() as usize
    };
    if let Ok(value) = http::HeaderValue::from_bytes(&buf[..len]) {
        request
            .headers_mut()
            .insert(tower_deadline::DEFAULT_HTTP_HEADER, value);
    }
    request
}

/// tower `Timeout` plus the header write of [`write_remaining`]: the
/// control for the client deadline, which bounds the call and writes the
/// remaining budget.
pub fn tower_timeout_writing_budget(inner: Bare) -> impl Service<Request<()>> + Clone {
    ServiceBuilder::new()
        .timeout(Duration::from_secs(60))
        .map_request(write_remaining)
        .service(inner)
}

pub fn breaker_client(inner: Bare) -> impl Service<Request<()>> + Clone {
    BreakerLayer::new(Breaker::new("bench")).layer(inner)
}

pub fn deadline_client(inner: Bare) -> impl Service<Request<()>> + Clone {
    ClientDeadlineLayer::new().layer(inner)
}

/// The client-side throttle alone, admitting (nothing is ever refused by
/// the bare service): issue 30's happy-path target.
pub fn throttle_alone(inner: Bare) -> impl Service<Request<()>> + Clone {
    ThrottleLayer::with_handle(shared_throttle()).layer(inner)
}

/// The client-side throttle alone on the coarse clock, admitting.
pub fn throttle_alone_coarse(inner: Bare) -> impl Service<Request<()>> + Clone {
    ThrottleLayer::new("bench").coarse_clock(true).layer(inner)
}

/// The client-mode breaker alone, detecting slow calls: it reads the
/// clock for every call and counts the call in flight until it ends.
pub fn breaker_slow_calls(inner: Bare) -> impl Service<Request<()>> + Clone {
    BreakerLayer::new(Breaker::with_config(
        "bench",
        tower_breaker::BreakerConfig::new().slow_calls(Duration::from_secs(10), 0.5),
    ))
    .layer(inner)
}

/// Calls `$callback!` with every variant, as `name => service`, in the
/// order the tables list them.
macro_rules! for_each_variant {
    ($callback:ident) => {
        $callback! {
        "bare service_fn" => bare(),
        "bare service_fn reading the clock (control)" => clocked(),
        "bare service_fn allocating once (control)" => allocating(),
        "tower Timeout" => tower_timeout(bare()),
        "tower Timeout + ConcurrencyLimit" => tower_two(bare()),
        "tower Retry (policy cloning the request)" => tower_retry(bare()),
        "tower Retry + TpsBudget" => tower_retry_budgeted(bare()),
        "bulkhead" => step_bulkhead(bare()),
        "retry alone" => retry_alone(bare()),
        "breaker alone (client mode, hook offered)" => breaker_client(bare()),
        "client deadline alone (deadline in scope)" => deadline_client(bare()),
        "throttle alone (admitting)" => throttle_alone(bare()),
        "throttle alone, coarse clock" => throttle_alone_coarse(bare()),
        "breaker alone (client mode, slow-call detection)" => breaker_slow_calls(bare()),
        "tower Timeout + map_request writing the budget" => tower_timeout_writing_budget(bare()),
        "retry + bulkhead" => step_retry(bare()),
        "breaker + retry + bulkhead" => step_breaker(bare()),
        "full stack by hand" => full_by_hand(bare(), Breaker::new("bench")),
        "client_stack (one line)" => one_line(bare()),
        "client_stack with the throttle" => one_line_throttled(bare()),
        "tower equivalent of the stack, no breaker" => tower_equivalent(bare()),
        "full stack, circuit open (rejection)" => open(bare()),
        "full stack, circuit opened by failures (rejection)" => open_tripped(bare()),
        "client_stack, slow-call detection" => one_line_slow_calls(bare()),
        "client_stack, coarse clock" => one_line_coarse(bare()),
        "client_stack, coarse clock, circuit open" => open_coarse(bare()),
        "client_stack, coarse clock, circuit opened by failures" => open_tripped_coarse(bare()),
            }
    };
}
