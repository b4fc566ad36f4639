//! The overload harness (bin `overload`): a simulated dependency of fixed
//! capacity, open-loop callers with deadlines, and the concurrency limits
//! under test between them, run as a discrete-event simulation on tokio's
//! paused clock.
//!
//! # The dependency
//!
//! [`Dependency`] is a FIFO queue in front of `servers` servers. Each
//! request takes a lognormal service time (a configured mean, `sigma` of the
//! underlying normal). Its capacity is `servers / mean` requests per second;
//! offered more, its queue grows and every request waits longer. It never
//! learns that a caller gave up: a request whose caller's deadline passed
//! while it waited is still served, and that service is *wasted work*.
//!
//! Each server keeps its own exact timeline (the next request starts when
//! the previous one ended, to the nanosecond), so the capacity is exactly
//! `servers / mean` although tokio's timer delivers each answer on its 1 ms
//! grid (on the millisecond nearest to the exact end). In each millisecond,
//! the answers reach their callers (and free their slots) before the
//! arrivals of that millisecond are let in.
//!
//! # The callers
//!
//! Open loop: arrivals are a Poisson process at a multiple of the capacity,
//! whatever the answers; each call is wrapped in
//! [`tokio::time::timeout`] at the caller's deadline, around the whole
//! call through the stack under test (readiness included, so a limiter that
//! waits in `poll_ready` spends the caller's deadline there).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use examples::overload::{run_cell, Cell, Contender};
//!
//! // 8 servers of 5 ms (1,600 requests/s) offered twice that, 100 ms deadline,
//! // behind a fixed bulkhead of 16.
//! let cell = Cell::steady(8, Duration::from_millis(5), Duration::from_millis(100), 2.0)
//!     .with_window(Duration::from_millis(500), Duration::from_secs(1));
//! let result = run_cell(&cell, &Contender::Fixed(16), 7).unwrap();
//! assert!(result.goodput_pct > 90.0, "{result:?}");
//! ```

use std::collections::VecDeque;
use std::fmt::{self, Write as _};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tokio::sync::oneshot;
use tokio::time::{sleep_until, timeout, Instant};
use tower::load_shed::LoadShed;
use tower::util::BoxCloneService;
use tower::{Layer, Service, ServiceExt};
use tower_breaker::throttle::ThrottleLayer;
use tower_bulkhead::adaptive::{Aimd, Gradient};
use tower_bulkhead::BulkheadLayer;
use tower_resilience_adaptive::{AdaptiveService, ConcurrencyAlgorithm};
use tower_resilience_base::criticality::Criticality;
use tower_resilience_base::random::SeededRandom;

/// The boxed error of every stack in the harness.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A stack under test, erased: the contender's layers around the
/// [`Dependency`].
pub type Stack = BoxCloneService<Request<()>, Response<()>, BoxError>;

/// Reads a contender's current concurrency limit (for the limit-over-time
/// series).
pub type LimitProbe = Box<dyn Fn() -> usize + Send + Sync>;

// === impl Rng ===

/// A small seeded random source (SplitMix64): the same seed gives the same
/// arrivals and service times on every machine.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A source started from `seed`.
    ///
    /// # Example
    ///
    /// ```
    /// let mut a = examples::overload::Rng::new(1);
    /// let mut b = examples::overload::Rng::new(1);
    /// assert_eq!(a.next_u64(), b.next_u64());
    /// ```
    #[must_use]
    pub const fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1]: never zero, so its logarithm is finite.
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// Exponentially distributed with the given mean (a Poisson process's
    /// gaps).
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * self.unit().ln()
    }

    /// Standard normal (Box–Muller; one of the pair is discarded).
    pub fn normal(&mut self) -> f64 {
        let r = (-2.0 * self.unit().ln()).sqrt();
        let theta = std::f64::consts::TAU * self.unit();
        r * theta.cos()
    }

    /// Lognormal with the given *mean* (not median) and `sigma` of the
    /// underlying normal: `exp(mu + sigma·N)` with `mu = ln(mean) − sigma²/2`.
    pub fn lognormal(&mut self, mean: f64, sigma: f64) -> f64 {
        let mu = mean.ln() - sigma * sigma / 2.0;
        (mu + sigma * self.normal()).exp()
    }
}

// === impl Dependency ===

/// The simulated dependency: a FIFO queue in front of a number of servers
/// with lognormal service times (see the [module docs](self)).
///
/// # Clone
///
/// Clones share the queue, the servers and the counters.
#[derive(Clone)]
pub struct Dependency {
    shared: Arc<Mutex<DepState>>,
}

struct DepState {
    queue: VecDeque<Job>,
    busy: usize,
    servers: usize,
    mean: f64,
    sigma: f64,
    rng: Rng,
    window: (Instant, Instant),
    served_in_window: u64,
    wasted_in_window: u64,
    max_queue: usize,
}

struct Job {
    reply: oneshot::Sender<Response<()>>,
}

/// What the dependency did during the measurement window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DepStats {
    /// Requests whose service ended in the window.
    pub served: u64,
    /// Of those, the ones whose caller had gone (deadline passed, or the
    /// call dropped): work for nobody.
    pub wasted: u64,
    /// The longest the queue was at any time of the run.
    pub max_queue: usize,
}

impl Dependency {
    /// A dependency of `servers` servers with lognormal service times of
    /// mean `mean` and shape `sigma`, drawing them from `seed`. Its counters
    /// count the services that end inside `window` (from, to).
    ///
    /// Must be called inside a tokio runtime with the time driver (it
    /// spawns a task per busy server).
    #[must_use]
    pub fn new(
        servers: usize,
        mean: Duration,
        sigma: f64,
        seed: u64,
        window: (Instant, Instant),
    ) -> Self {
        Self {
            shared: Arc::new(Mutex::new(DepState {
                queue: VecDeque::new(),
                busy: 0,
                servers,
                mean: mean.as_secs_f64(),
                sigma,
                rng: Rng::new(seed),
                window,
                served_in_window: 0,
                wasted_in_window: 0,
                max_queue: 0,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, DepState> {
        lock(&self.shared)
    }

    /// Changes the number of servers (a capacity step). Fewer: the servers
    /// beyond the new number finish their current request and stop. More:
    /// the new servers start on the queue at once.
    pub fn set_servers(&self, servers: usize) {
        let mut state = self.lock();
        state.servers = servers;
        let now = Instant::now();
        while state.busy < state.servers {
            let Some(job) = state.queue.pop_front() else {
                break;
            };
            state.busy += 1;
            tokio::spawn(serve(Arc::clone(&self.shared), job, now));
        }
    }

    /// The window's counters so far.
    #[must_use]
    pub fn stats(&self) -> DepStats {
        let state = self.lock();
        DepStats {
            served: state.served_in_window,
            wasted: state.wasted_in_window,
            max_queue: state.max_queue,
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

const HALF_TICK: Duration = Duration::from_micros(500);

/// One busy server: serves `job`, then the queue's head, until the queue
/// is empty or the server is no longer wanted. `free_at` is the exact
/// instant it became free for `job`.
async fn serve(shared: Arc<Mutex<DepState>>, mut job: Job, mut free_at: Instant) {
    loop {
        let finish = {
            let mut state = lock(&shared);
            let (mean, sigma) = (state.mean, state.sigma);
            free_at + Duration::from_secs_f64(state.rng.lognormal(mean, sigma))
        };
        // tokio's timer fires on the next whole millisecond at or after
        // its deadline; half a millisecond earlier, it fires on the
        // millisecond nearest to the exact end: answers are delivered
        // within ±0.5 ms of it, on average on time, so a slot held until
        // the answer is held for the service time on average.
        sleep_until(finish.checked_sub(HALF_TICK).unwrap_or(finish)).await;
        free_at = finish;
        let delivered = job.reply.send(Response::new(())).is_ok();
        let mut state = lock(&shared);
        if (state.window.0..state.window.1).contains(&finish) {
            state.served_in_window += 1;
            if !delivered {
                state.wasted_in_window += 1;
            }
        }
        if state.busy > state.servers {
            state.busy -= 1;
            return;
        }
        match state.queue.pop_front() {
            Some(next) => job = next,
            None => {
                state.busy -= 1;
                return;
            }
        }
    }
}

impl fmt::Debug for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("Dependency")
            .field("servers", &state.servers)
            .field("busy", &state.busy)
            .field("queued", &state.queue.len())
            .finish_non_exhaustive()
    }
}

impl Service<Request<()>> for Dependency {
    type Response = Response<()>;
    type Error = BoxError;
    type Future = DependencyFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: Request<()>) -> Self::Future {
        let (reply, answer) = oneshot::channel();
        let job = Job { reply };
        let mut state = self.lock();
        if state.busy < state.servers {
            state.busy += 1;
            tokio::spawn(serve(Arc::clone(&self.shared), job, Instant::now()));
        } else {
            state.queue.push_back(job);
            state.max_queue = state.max_queue.max(state.queue.len());
        }
        DependencyFuture { answer }
    }
}

/// The answer of the [`Dependency`] (always `200 OK`): ready when a
/// server finished the request.
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct DependencyFuture {
    answer: oneshot::Receiver<Response<()>>,
}

impl Future for DependencyFuture {
    type Output = Result<Response<()>, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.answer)
            .poll(cx)
            .map_err(|_| "the dependency shut down".into())
    }
}

// === impl Contender ===

/// An algorithm of tower-resilience-adaptive (the peer), at its defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerAlgorithm {
    /// `Aimd::builder().build()`: limit 10 (1 to 100), +1 on a success under
    /// 100 ms, ×0.5 on an error.
    Aimd,
    /// `Vegas::builder().build()`: limit 10 (1 to 100), alpha 3, beta 6.
    Vegas,
    /// `Gradient2::builder().build()`: limit 20 (1 to 200), smoothing 0.2.
    Gradient2,
}

/// A stack under test.
#[derive(Debug, Clone, PartialEq)]
pub enum Contender {
    /// No protection: every call goes to the dependency.
    None,
    /// Our `BulkheadLayer::new(name, n)`: at most `n` calls at once, the
    /// others refused at once.
    Fixed(usize),
    /// The peer at its defaults: as shipped (it waits for a permit in
    /// `poll_ready`), or under tower's `LoadShed` (`shed`: a call that
    /// would wait is refused).
    Peer {
        /// Which of its algorithms.
        algorithm: PeerAlgorithm,
        /// Under a `LoadShed`.
        shed: bool,
    },
    /// Our adaptive bulkhead at its defaults:
    /// `BulkheadLayer::adaptive(name, algorithm)`.
    Adaptive(OurAlgorithm),
    /// Our client-side throttle at its defaults
    /// (`ThrottleLayer::new(name)`), alone (no concurrency limit) or in
    /// front of the adaptive bulkhead with [`Gradient`] defaults.
    Throttle {
        /// In front of `BulkheadLayer::adaptive(name, Gradient::new())`.
        adaptive: bool,
    },
}

/// An algorithm of our adaptive bulkhead, at its defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OurAlgorithm {
    /// `tower_bulkhead::adaptive::Aimd::new()`.
    Aimd,
    /// `tower_bulkhead::adaptive::Gradient::new()`.
    Gradient,
}

impl Contender {
    /// Its name in tables and charts.
    #[must_use]
    pub fn name(&self) -> String {
        match self {
            Self::None => "none".to_owned(),
            Self::Fixed(n) => format!("fixed {n}"),
            Self::Peer { algorithm, shed } => {
                let alg = match algorithm {
                    PeerAlgorithm::Aimd => "AIMD",
                    PeerAlgorithm::Vegas => "Vegas",
                    PeerAlgorithm::Gradient2 => "Gradient2",
                };
                if *shed {
                    format!("peer {alg} +LoadShed")
                } else {
                    format!("peer {alg}")
                }
            }
            Self::Adaptive(OurAlgorithm::Aimd) => "adaptive AIMD".to_owned(),
            Self::Adaptive(OurAlgorithm::Gradient) => "adaptive Gradient".to_owned(),
            Self::Throttle { adaptive: false } => "throttle".to_owned(),
            Self::Throttle { adaptive: true } => "throttle + adaptive Gradient".to_owned(),
        }
    }

    /// Whether it is the peer (whose latency clock is `std::time::Instant`,
    /// blind to tokio's paused clock; see `docs/overload.md`).
    #[must_use]
    pub const fn is_peer(&self) -> bool {
        matches!(self, Self::Peer { .. })
    }

    /// The stack around `dependency`, and a probe of its limit when it has
    /// one. `seed` seeds the throttle's random draws.
    ///
    /// # Errors
    ///
    /// The peer's builder refusing its own defaults (it does not).
    pub fn build(
        &self,
        dependency: Dependency,
        seed: u64,
    ) -> Result<(Stack, Option<LimitProbe>), BoxError> {
        let throttle =
            || ThrottleLayer::new("dependency").random(Arc::new(SeededRandom::new(seed)));
        Ok(match self {
            Self::None => (Stack::new(dependency), None),
            Self::Fixed(n) => {
                let layer = BulkheadLayer::new("dependency", *n);
                let handle = layer.handle();
                let probe: LimitProbe = Box::new(move || handle.limit());
                (Stack::new(layer.layer(dependency)), Some(probe))
            }
            Self::Peer { algorithm, shed } => match algorithm {
                PeerAlgorithm::Aimd => peer(
                    dependency,
                    tower_resilience_adaptive::Aimd::builder().build()?,
                    *shed,
                ),
                PeerAlgorithm::Vegas => peer(
                    dependency,
                    tower_resilience_adaptive::Vegas::builder().build()?,
                    *shed,
                ),
                PeerAlgorithm::Gradient2 => peer(
                    dependency,
                    tower_resilience_adaptive::Gradient2::builder().build()?,
                    *shed,
                ),
            },
            Self::Adaptive(algorithm) => {
                let layer = match algorithm {
                    OurAlgorithm::Aimd => BulkheadLayer::adaptive("dependency", Aimd::new()),
                    OurAlgorithm::Gradient => {
                        BulkheadLayer::adaptive("dependency", Gradient::new())
                    }
                };
                let handle = layer.handle();
                let probe: LimitProbe = Box::new(move || handle.limit());
                (Stack::new(layer.layer(dependency)), Some(probe))
            }
            Self::Throttle { adaptive: false } => (Stack::new(throttle().layer(dependency)), None),
            Self::Throttle { adaptive: true } => {
                let bulkhead = BulkheadLayer::adaptive("dependency", Gradient::new());
                let handle = bulkhead.handle();
                let probe: LimitProbe = Box::new(move || handle.limit());
                let stack = throttle().layer(bulkhead.layer(dependency));
                (Stack::new(stack), Some(probe))
            }
        })
    }
}

fn peer<A>(dependency: Dependency, algorithm: A, shed: bool) -> (Stack, Option<LimitProbe>)
where
    A: ConcurrencyAlgorithm + 'static,
{
    let algorithm = Arc::new(algorithm);
    let read = Arc::clone(&algorithm);
    let probe: LimitProbe = Box::new(move || read.limit());
    let service = AdaptiveService::new(dependency, algorithm).map_err(BoxError::from);
    let stack = if shed {
        Stack::new(LoadShed::new(service))
    } else {
        Stack::new(service)
    };
    (stack, Some(probe))
}

// === impl Cell ===

/// One measurement: a dependency, a load, a deadline, a window.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// Servers at the start.
    pub servers: usize,
    /// Mean service time.
    pub mean: Duration,
    /// Shape of the lognormal service time (sigma of the underlying
    /// normal).
    pub sigma: f64,
    /// The callers' deadline.
    pub deadline: Duration,
    /// Offered load as a multiple of the starting capacity.
    pub load: f64,
    /// Simulated time before the window (the limits learn; not counted).
    pub warmup: Duration,
    /// The measurement window's length.
    pub measure: Duration,
    /// Capacity steps: at this offset from the start, this many servers.
    pub steps: Vec<(Duration, usize)>,
    /// The share of requests marked [`Criticality::Critical`]; the rest are
    /// [`Criticality::Sheddable`]. `None`: no criticality set.
    pub critical_share: Option<f64>,
}

impl Cell {
    /// A steady cell: fixed capacity, no criticality, the default window
    /// (2 s of warm-up, then long enough for about 12,000 requests at
    /// capacity, between 3 s and 30 s).
    #[must_use]
    pub fn steady(servers: usize, mean: Duration, deadline: Duration, load: f64) -> Self {
        let capacity = servers as f64 / mean.as_secs_f64();
        let measure = Duration::from_secs_f64((12_000.0 / capacity).clamp(3.0, 30.0));
        Self {
            servers,
            mean,
            sigma: 0.5,
            deadline,
            load,
            warmup: Duration::from_secs(2),
            measure,
            steps: Vec::new(),
            critical_share: None,
        }
    }

    /// The same cell with another warm-up and window.
    #[must_use]
    pub fn with_window(mut self, warmup: Duration, measure: Duration) -> Self {
        self.warmup = warmup;
        self.measure = measure;
        self
    }

    /// The dependency's capacity at the start, in requests per second.
    #[must_use]
    pub fn capacity(&self) -> f64 {
        self.servers as f64 / self.mean.as_secs_f64()
    }
}

/// What one contender did in one cell.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CellResult {
    /// Requests that arrived in the window.
    pub offered: u64,
    /// Of those, answered within the deadline.
    pub successes: u64,
    /// Refused by the stack (an error before the deadline).
    pub rejected: u64,
    /// Cut by the caller's deadline.
    pub timed_out: u64,
    /// Successes per second of window.
    pub goodput: f64,
    /// [`goodput`](Self::goodput) as a share of the starting capacity, in %.
    pub goodput_pct: f64,
    /// Median latency of the successes.
    pub p50: Duration,
    /// 99th percentile latency of the successes.
    pub p99: Duration,
    /// The dependency's counters over the window.
    pub dependency: DepStats,
    /// Critical requests (offered, succeeded), with a criticality mix.
    pub critical: (u64, u64),
    /// Sheddable requests (offered, succeeded), with a criticality mix.
    pub sheddable: (u64, u64),
    /// Every 100 ms from the start: (seconds, the contender's limit).
    pub limit_series: Vec<(f64, usize)>,
    /// Every 100 ms from the start: (seconds, successes per second in that
    /// 100 ms, by completion time).
    pub goodput_series: Vec<(f64, f64)>,
}

impl CellResult {
    /// Wasted work: the share of the dependency's services in the window
    /// that were for a caller who had gone, in %.
    #[must_use]
    pub fn wasted_pct(&self) -> f64 {
        if self.dependency.served == 0 {
            0.0
        } else {
            100.0 * self.dependency.wasted as f64 / self.dependency.served as f64
        }
    }

    /// Critical requests that succeeded, in % (100 with no critical
    /// request).
    #[must_use]
    pub fn critical_pct(&self) -> f64 {
        pct(self.critical.1, self.critical.0)
    }

    /// Sheddable requests that succeeded, in %.
    #[must_use]
    pub fn sheddable_pct(&self) -> f64 {
        pct(self.sheddable.1, self.sheddable.0)
    }
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        100.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

#[derive(Default)]
struct Recorder {
    offered: u64,
    successes: u64,
    rejected: u64,
    timed_out: u64,
    latencies: Vec<Duration>,
    critical: (u64, u64),
    sheddable: (u64, u64),
    /// Successes per 100 ms bucket of completion time.
    buckets: Vec<u64>,
}

const BUCKET: Duration = Duration::from_millis(100);

/// Runs one cell with one contender on a fresh current-thread runtime with
/// tokio's paused clock (a discrete-event simulation: the clock jumps to
/// the next timer whenever every task waits), from `seed`.
///
/// # Errors
///
/// The runtime failing to start, or the contender failing to build.
pub fn run_cell(cell: &Cell, contender: &Contender, seed: u64) -> Result<CellResult, BoxError> {
    run_cell_on(cell, contender, seed, true)
}

/// [`run_cell`] on the paused clock (`paused`), or on the wall clock: real
/// time, for limiters that read `std::time::Instant` (the peer). On the
/// wall clock a cell takes as long as it simulates, and the figures depend
/// on the machine's load.
///
/// # Errors
///
/// As [`run_cell`].
pub fn run_cell_on(
    cell: &Cell,
    contender: &Contender,
    seed: u64,
    paused: bool,
) -> Result<CellResult, BoxError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(paused)
        .build()?;
    let result = runtime.block_on(simulate(cell.clone(), contender.clone(), seed));
    // Shutting down drops the servers still busy and the queue.
    drop(runtime);
    result
}

async fn simulate(cell: Cell, contender: Contender, seed: u64) -> Result<CellResult, BoxError> {
    let start = Instant::now();
    let window = (start + cell.warmup, start + cell.warmup + cell.measure);
    let end = window.1;
    let dependency = Dependency::new(
        cell.servers,
        cell.mean,
        cell.sigma,
        seed ^ 0x005E_ED0F_5E47_1CE5,
        window,
    );
    let (stack, probe) = contender.build(dependency.clone(), seed)?;
    let recorder = Arc::new(Mutex::new(Recorder {
        buckets: vec![0; ((end - start).as_millis() / BUCKET.as_millis() + 2) as usize],
        ..Recorder::default()
    }));

    // The capacity steps.
    for &(at, servers) in &cell.steps {
        let dependency = dependency.clone();
        tokio::spawn(async move {
            sleep_until(start + at).await;
            dependency.set_servers(servers);
        });
    }

    // The limit, every 100 ms.
    let limits = Arc::new(Mutex::new(Vec::new()));
    if let Some(probe) = probe {
        let limits = Arc::clone(&limits);
        tokio::spawn(async move {
            let mut at = start;
            while at <= end {
                sleep_until(at).await;
                lock(&limits).push(((at - start).as_secs_f64(), probe()));
                at += BUCKET;
            }
        });
    }

    // Open-loop arrivals.
    let mut rng = Rng::new(seed);
    let gap = 1.0 / (cell.capacity() * cell.load);
    let mut next = start + Duration::from_secs_f64(rng.exponential(gap));
    while next < end {
        sleep_until(next).await;
        // Let the answers of this millisecond reach their callers (and
        // free their slots) before its arrivals: timers fire on a 1 ms
        // grid, and without this an arrival would find a slot taken by a
        // call whose answer came in the same millisecond. A yielded task
        // runs again without the paused clock moving.
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        let now = Instant::now();
        while next <= now && next < end {
            let measured = (window.0..window.1).contains(&next);
            let criticality = cell.critical_share.map(|share| {
                if rng.unit() <= share {
                    Criticality::Critical
                } else {
                    Criticality::Sheddable
                }
            });
            tokio::spawn(call(
                stack.clone(),
                cell.deadline,
                criticality,
                measured,
                start,
                Arc::clone(&recorder),
            ));
            next += Duration::from_secs_f64(rng.exponential(gap));
        }
    }
    // Every call of the window has its answer or its timeout by then.
    sleep_until(end + cell.deadline + Duration::from_millis(2)).await;

    let mut recorder = std::mem::take(&mut *lock(&recorder));
    recorder.latencies.sort_unstable();
    let secs = cell.measure.as_secs_f64();
    let goodput = recorder.successes as f64 / secs;
    let quantile = |q: f64| {
        if recorder.latencies.is_empty() {
            Duration::ZERO
        } else {
            let i = ((recorder.latencies.len() as f64 * q).ceil() as usize)
                .clamp(1, recorder.latencies.len());
            recorder.latencies[i - 1]
        }
    };
    let per_second = 1.0 / BUCKET.as_secs_f64();
    let limit_series = std::mem::take(&mut *lock(&limits));
    Ok(CellResult {
        offered: recorder.offered,
        successes: recorder.successes,
        rejected: recorder.rejected,
        timed_out: recorder.timed_out,
        goodput,
        goodput_pct: 100.0 * goodput / cell.capacity(),
        p50: quantile(0.50),
        p99: quantile(0.99),
        dependency: dependency.stats(),
        critical: recorder.critical,
        sheddable: recorder.sheddable,
        limit_series,
        goodput_series: recorder
            .buckets
            .iter()
            .enumerate()
            .take_while(|(i, _)| BUCKET * (*i as u32) < end - start)
            .map(|(i, n)| ((BUCKET * i as u32).as_secs_f64(), *n as f64 * per_second))
            .collect(),
    })
}

async fn call(
    stack: Stack,
    deadline: Duration,
    criticality: Option<Criticality>,
    measured: bool,
    start: Instant,
    recorder: Arc<Mutex<Recorder>>,
) {
    let mut request = Request::new(());
    if let Some(c) = criticality {
        request.extensions_mut().insert(c);
    }
    let began = Instant::now();
    let attempt = timeout(deadline, stack.oneshot(request));
    let outcome = match criticality {
        Some(c) => c.scope(attempt).await,
        None => attempt.await,
    };
    let now = Instant::now();
    let mut r = lock(&recorder);
    let ok = matches!(outcome, Ok(Ok(_)));
    if ok {
        let bucket = ((now - start).as_millis() / BUCKET.as_millis()) as usize;
        if let Some(n) = r.buckets.get_mut(bucket) {
            *n += 1;
        }
    }
    if !measured {
        return;
    }
    r.offered += 1;
    match outcome {
        Ok(Ok(_)) => {
            r.successes += 1;
            r.latencies.push(now - began);
        }
        Ok(Err(_)) => r.rejected += 1,
        Err(_) => r.timed_out += 1,
    }
    let slot = match criticality {
        Some(Criticality::Sheddable) => Some(&mut r.sheddable),
        Some(_) => Some(&mut r.critical),
        None => None,
    };
    if let Some((offered, succeeded)) = slot {
        *offered += 1;
        *succeeded += u64::from(ok);
    }
}

// === settling ===

/// How long after `step` (seconds) a series (goodput, or a limit) settles
/// within `tolerance` (0.1 for 10%) of its new steady value, from
/// (seconds, value) points: the steady value is the mean over the last 40%
/// of `[step, until)`; each point is averaged with the two before it (in
/// the segment); the answer is the time from `step` to the first point
/// from which every averaged point before `until` stays within the
/// tolerance. `None` if the last one is not within it.
///
/// # Example
///
/// ```
/// use examples::overload::settle_time;
///
/// // 100 before the step at 1 s, 50 from 1.3 s on: the averages of
/// // 1.3 s and 1.4 s still hold the old value, 1.5 s is settled.
/// let series: Vec<(f64, f64)> = (0..30)
///     .map(|i| {
///         let t = i as f64 / 10.0;
///         (t, if t < 1.25 { 100.0 } else { 50.0 })
///     })
///     .collect();
/// let settled = settle_time(&series, 1.0, 3.0, 0.1).unwrap();
/// assert!((settled - 0.5).abs() < 1e-9, "{settled}");
/// ```
#[must_use]
pub fn settle_time(series: &[(f64, f64)], step: f64, until: f64, tolerance: f64) -> Option<f64> {
    let segment: Vec<(f64, f64)> = series
        .iter()
        .copied()
        .filter(|(t, _)| *t >= step && *t < until)
        .collect();
    if segment.len() < 5 {
        return None;
    }
    let tail_from = step + 0.6 * (until - step);
    let tail: Vec<f64> = segment
        .iter()
        .filter(|(t, _)| *t >= tail_from)
        .map(|(_, g)| *g)
        .collect();
    let steady = tail.iter().sum::<f64>() / tail.len() as f64;
    let smoothed: Vec<(f64, f64)> = (0..segment.len())
        .map(|i| {
            let lo = i.saturating_sub(2);
            let avg = segment[lo..=i].iter().map(|(_, g)| g).sum::<f64>() / (i - lo + 1) as f64;
            (segment[i].0, avg)
        })
        .collect();
    let within = |g: f64| (g - steady).abs() <= tolerance * steady.abs();
    let mut settled_at = None;
    for &(t, g) in smoothed.iter().rev() {
        if within(g) {
            settled_at = Some(t);
        } else {
            break;
        }
    }
    settled_at.map(|t| t - step)
}

// === the chart ===

/// One line of a chart: a name and its points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The legend's label.
    pub name: String,
    /// (x, y) points in order of x.
    pub points: Vec<(f64, f64)>,
}

/// One panel of the chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// Its title.
    pub title: String,
    /// The x axis' label.
    pub x_label: String,
    /// The y axis' label.
    pub y_label: String,
    /// The lines.
    pub series: Vec<Series>,
}

const COLOURS: [&str; 16] = [
    "#000000", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173",
];

/// A self-contained SVG of the panels, two per row, each line in its own
/// colour with a legend under each panel.
///
/// # Example
///
/// ```
/// use examples::overload::{svg, Panel, Series};
///
/// let panel = Panel {
///     title: "goodput".into(),
///     x_label: "offered (x capacity)".into(),
///     y_label: "% of capacity".into(),
///     series: vec![Series { name: "none".into(), points: vec![(1.0, 99.0), (2.0, 0.0)] }],
/// };
/// let chart = svg(&[panel]);
/// assert!(chart.starts_with("<svg") && chart.contains("<polyline"));
/// ```
#[must_use]
pub fn svg(panels: &[Panel]) -> String {
    const W: f64 = 520.0;
    const PLOT_H: f64 = 240.0;
    const LEFT: f64 = 56.0;
    const TOP: f64 = 30.0;
    let legend_rows = |p: &Panel| p.series.len().div_ceil(3);
    let panel_h = |p: &Panel| TOP + PLOT_H + 40.0 + 14.0 * legend_rows(p) as f64 + 10.0;
    let rows: Vec<&[Panel]> = panels.chunks(2).collect();
    let row_h: Vec<f64> = rows
        .iter()
        .map(|r| r.iter().map(panel_h).fold(0.0, f64::max))
        .collect();
    let height: f64 = row_h.iter().sum();
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height:.0}" viewBox="0 0 {w} {height:.0}" font-family="sans-serif" font-size="11">"#,
        w = 2.0 * W
    );
    out.push_str(r#"<rect width="100%" height="100%" fill="white"/>"#);
    let mut y0 = 0.0;
    for (r, row) in rows.iter().enumerate() {
        for (c, panel) in row.iter().enumerate() {
            let x0 = c as f64 * W;
            let (xs, ys): (Vec<f64>, Vec<f64>) = panel
                .series
                .iter()
                .flat_map(|s| s.points.iter().copied())
                .unzip();
            let xmin = xs.iter().copied().fold(f64::INFINITY, f64::min);
            let xmax = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let ymax = nice_ceiling(ys.iter().copied().fold(0.0, f64::max).max(1.0));
            let (xmin, xmax) = if xmin.is_finite() && xmax > xmin {
                (xmin, xmax)
            } else {
                (0.0, 1.0)
            };
            let plot_w = W - LEFT - 20.0;
            let px = |x: f64| x0 + LEFT + (x - xmin) / (xmax - xmin) * plot_w;
            let py = |y: f64| y0 + TOP + PLOT_H - y / ymax * PLOT_H;
            let _ = write!(
                out,
                r#"<text x="{:.1}" y="{:.1}" font-weight="bold">{}</text>"#,
                x0 + LEFT,
                y0 + 18.0,
                escape(&panel.title)
            );
            let _ = write!(
                out,
                r##"<rect x="{:.1}" y="{:.1}" width="{plot_w:.1}" height="{PLOT_H}" fill="none" stroke="#999"/>"##,
                x0 + LEFT,
                y0 + TOP
            );
            for i in 0..=4 {
                let v = ymax * f64::from(i) / 4.0;
                let _ = write!(
                    out,
                    r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">{v:.0}</text>"##,
                    x0 + LEFT - 4.0,
                    py(v) + 4.0
                );
                let v = xmin + (xmax - xmin) * f64::from(i) / 4.0;
                let _ = write!(
                    out,
                    r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#555">{v:.1}</text>"##,
                    px(v),
                    y0 + TOP + PLOT_H + 14.0
                );
            }
            let _ = write!(
                out,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#333">{}</text>"##,
                x0 + LEFT + plot_w / 2.0,
                y0 + TOP + PLOT_H + 28.0,
                escape(&panel.x_label)
            );
            let _ = write!(
                out,
                r##"<text x="{:.1}" y="{:.1}" fill="#333">{}</text>"##,
                x0 + LEFT + 4.0,
                y0 + TOP + 12.0,
                escape(&panel.y_label)
            );
            for (i, s) in panel.series.iter().enumerate() {
                let colour = COLOURS[i % COLOURS.len()];
                let dash = if i >= COLOURS.len() {
                    r#" stroke-dasharray="4 2""#
                } else {
                    ""
                };
                let points: Vec<String> = s
                    .points
                    .iter()
                    .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                    .collect();
                let _ = write!(
                    out,
                    r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5"{dash} points="{}"/>"#,
                    points.join(" ")
                );
                let lx = x0 + LEFT + (i % 3) as f64 * 150.0;
                let ly = y0 + TOP + PLOT_H + 44.0 + (i / 3) as f64 * 14.0;
                let _ = write!(
                    out,
                    r#"<line x1="{lx:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{colour}" stroke-width="2"/><text x="{:.1}" y="{:.1}">{}</text>"#,
                    ly - 4.0,
                    lx + 16.0,
                    ly - 4.0,
                    lx + 20.0,
                    ly,
                    escape(&s.name)
                );
            }
        }
        y0 += row_h[r];
    }
    out.push_str("</svg>\n");
    out
}

/// The smallest of 1, 1.2, 2, 4 or 5 times a power of ten, at least `x` (axis
/// ticks at quarters of it stay round).
fn nice_ceiling(x: f64) -> f64 {
    let power = 10f64.powf(x.log10().floor());
    [1.0, 1.2, 2.0, 4.0, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|&v| v >= x)
        .unwrap_or(10.0 * power)
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn short(servers: usize, mean_ms: u64, deadline_ms: u64, load: f64) -> Cell {
        Cell::steady(servers, MS * mean_ms as u32, MS * deadline_ms as u32, load)
            .with_window(Duration::from_secs(1), Duration::from_secs(3))
    }

    #[test]
    fn lognormal_has_the_asked_mean_and_exponential_its_mean() {
        let mut rng = Rng::new(42);
        let n = 200_000;
        let mean = (0..n).map(|_| rng.lognormal(5.0, 0.5)).sum::<f64>() / f64::from(n);
        assert!((mean - 5.0).abs() < 0.05, "{mean}");
        let mean = (0..n).map(|_| rng.exponential(2.0)).sum::<f64>() / f64::from(n);
        assert!((mean - 2.0).abs() < 0.03, "{mean}");
    }

    #[test]
    fn under_capacity_everything_succeeds_with_no_waste() {
        let r = run_cell(&short(8, 5, 100, 0.5), &Contender::None, 1).unwrap();
        // Offered 800/s for 3 s.
        assert!((2_200..2_600).contains(&r.offered), "{r:?}");
        assert_eq!(r.successes, r.offered, "{r:?}");
        assert_eq!(r.dependency.wasted, 0);
        // Service 5 ms mean (lognormal, sigma 0.5) and little queueing:
        // the median is under the mean plus the 1 ms timer grid.
        assert!(r.p50 <= MS * 6, "{r:?}");
    }

    #[test]
    fn the_dependency_serves_at_its_capacity_and_no_faster() {
        // Twice the capacity, a deadline long enough for the whole run:
        // the dependency is busy all along and serves servers / mean.
        let mut cell = short(8, 5, 100_000, 2.0);
        cell.deadline = Duration::from_secs(60);
        let r = run_cell(&cell, &Contender::None, 2).unwrap();
        let served_per_s = r.dependency.served as f64 / 3.0;
        assert!(
            (served_per_s - 1_600.0).abs() < 50.0,
            "{served_per_s} {r:?}"
        );
        assert!(r.dependency.max_queue > 1_000, "{r:?}");
    }

    #[test]
    fn without_protection_overload_wastes_the_dependency() {
        // 3x with a 100 ms deadline: the queue outgrows the deadline and
        // the dependency serves callers who have gone.
        let r = run_cell(&short(8, 5, 100, 3.0), &Contender::None, 3).unwrap();
        assert!(r.goodput_pct < 10.0, "{r:?}");
        assert!(r.wasted_pct() > 90.0, "{r:?}");
    }

    #[test]
    fn a_fixed_bulkhead_of_the_right_size_holds_the_overload() {
        let r = run_cell(&short(8, 5, 100, 3.0), &Contender::Fixed(16), 3).unwrap();
        assert!(r.goodput_pct > 95.0, "{r:?}");
        assert!(r.rejected > r.offered / 2, "{r:?}");
        assert!(r.wasted_pct() < 1.0, "{r:?}");
        assert!(r.limit_series.iter().all(|&(_, l)| l == 16));
    }

    // Regression: with answers delivered on the next millisecond and the
    // arrivals of a millisecond let in before its answers freed their
    // slots, a limit of exactly the number of servers held each slot about
    // 1.5 ms too long and served 77% of capacity at 5x, where a loss
    // system of 8 servers offered 40 erlangs carries nearly all of it.
    #[test]
    fn a_limit_of_the_servers_count_carries_the_capacity_under_overload() {
        let r = run_cell(&short(8, 5, 100, 5.0), &Contender::Fixed(8), 8).unwrap();
        assert!(r.goodput_pct > 97.0, "{r:?}");
        // No queue: the latency is the service time (median 4.4 ms, p99
        // 14.1 ms for a lognormal of mean 5 ms, sigma 0.5), ±0.5 ms.
        assert!(r.p50 >= MS * 4 && r.p50 <= MS * 5, "{r:?}");
        assert!(r.p99 >= MS * 12 && r.p99 <= MS * 16, "{r:?}");
    }

    #[test]
    fn a_seed_gives_the_same_run() {
        let cell = short(8, 5, 25, 2.0);
        let a = run_cell(&cell, &Contender::Fixed(32), 9).unwrap();
        let b = run_cell(&cell, &Contender::Fixed(32), 9).unwrap();
        assert_eq!(a, b);
        let c = run_cell(&cell, &Contender::Fixed(32), 10).unwrap();
        assert_ne!(a.offered, c.offered);
    }

    #[test]
    fn a_capacity_step_halves_the_service_rate_and_restores_it() {
        let mut cell = short(8, 5, 60_000, 2.0).with_window(Duration::ZERO, Duration::from_secs(6));
        cell.deadline = Duration::from_secs(60);
        cell.steps = vec![(Duration::from_secs(2), 4), (Duration::from_secs(4), 8)];
        let r = run_cell(&cell, &Contender::None, 4).unwrap();
        let rate = |from: f64, to: f64| {
            let pts: Vec<f64> = r
                .goodput_series
                .iter()
                .filter(|(t, _)| *t >= from && *t < to)
                .map(|(_, g)| *g)
                .collect();
            pts.iter().sum::<f64>() / pts.len() as f64
        };
        assert!(
            (rate(0.5, 2.0) - 1_600.0).abs() < 100.0,
            "{}",
            rate(0.5, 2.0)
        );
        assert!((rate(2.2, 4.0) - 800.0).abs() < 80.0, "{}", rate(2.2, 4.0));
        assert!(
            (rate(4.2, 6.0) - 1_600.0).abs() < 100.0,
            "{}",
            rate(4.2, 6.0)
        );
    }

    #[test]
    fn criticality_is_counted_per_class() {
        let mut cell = short(8, 5, 100, 0.5);
        cell.critical_share = Some(0.4);
        let r = run_cell(&cell, &Contender::None, 5).unwrap();
        assert_eq!(r.critical.0 + r.sheddable.0, r.offered);
        let share = r.critical.0 as f64 / r.offered as f64;
        assert!((share - 0.4).abs() < 0.05, "{share}");
        assert_eq!(r.critical_pct(), 100.0);
    }

    #[test]
    fn settling_is_none_for_a_series_that_never_settles() {
        let series: Vec<(f64, f64)> = (0..40)
            .map(|i| (f64::from(i) / 10.0, if i % 2 == 0 { 100.0 } else { 10.0 }))
            .collect();
        assert_eq!(settle_time(&series, 1.0, 4.0, 0.1), None);
    }

    #[test]
    fn the_peer_waits_in_poll_ready_and_under_load_shed_refuses() {
        // Both build and answer under no overload.
        for shed in [false, true] {
            let peer = Contender::Peer {
                algorithm: PeerAlgorithm::Aimd,
                shed,
            };
            let r = run_cell(&short(8, 5, 100, 0.5), &peer, 6).unwrap();
            assert!(r.goodput_pct > 45.0, "{r:?}");
            assert!(!r.limit_series.is_empty());
        }
    }
}
