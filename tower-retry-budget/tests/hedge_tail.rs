//! The tail-latency check, in paused time: a dependency where 5% of calls
//! take 200 ms and the rest 2 ms, at a steady rate. Without hedging the
//! caller's p99 is the slow calls' 200 ms; with the hedging layer it falls
//! to within 10 ms of the p95, for at most 7% more calls at the dependency.
//! tower's `Hedge` is measured in the same run as the anchor. With one
//! hedge, a request whose hedge is slow too (5% of 5%) still takes 200 ms:
//! the p99.9 stays there. (The demo
//! `cargo run --release -p examples --bin hedge` does the same over real
//! sockets.)

mod hedge_support;

use std::time::Duration;

use hedge_support::{get, percentile, Replicas, Reply, MS};
use http::Request;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_retry_budget::hedge::HedgeLayer;

const RATE: u64 = 500;
const WARM_UP: usize = 1_000;
const MEASURED: usize = 6_000;

/// Whether call `n` of the dependency is one of the slow 5%: a hash of
/// `n`, so that the slow calls are spread evenly and hedges are as likely
/// to be slow as any call.
fn slow(n: usize) -> bool {
    let mut x = (n as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (x ^ (x >> 31)) % 100 < 5
}

fn dependency() -> Replicas {
    Replicas::new(|n| (if slow(n) { 200 * MS } else { 2 * MS }, Reply::Status(200)))
}

/// The figures of one caller.
#[derive(Debug)]
struct Figures {
    p50: Duration,
    p95: Duration,
    p99: Duration,
    p999: Duration,
    extra: f64,
}

/// Open-loop load at [`RATE`]: the latencies of the measured requests,
/// and the extra calls the dependency saw over the whole run.
async fn run<S>(mut svc: S, dependency: &Replicas) -> Figures
where
    S: Service<Request<String>, Response = http::Response<String>>,
    S::Error: std::fmt::Debug + Send + 'static,
    S::Future: Send + 'static,
{
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
    let mut tasks = Vec::with_capacity(WARM_UP + MEASURED);
    for _ in 0..WARM_UP + MEASURED {
        tick.tick().await;
        let start = Instant::now();
        let future = svc.ready().await.unwrap().call(get());
        tasks.push(tokio::spawn(async move {
            let response = future.await.unwrap();
            assert_eq!(response.status(), 200);
            start.elapsed()
        }));
    }
    let mut latencies = Vec::with_capacity(MEASURED);
    for (i, task) in tasks.into_iter().enumerate() {
        let latency = task.await.unwrap();
        if i >= WARM_UP {
            latencies.push(latency);
        }
    }
    latencies.sort_unstable();
    let requests = WARM_UP + MEASURED;
    Figures {
        p50: percentile(&latencies, 0.5),
        p95: percentile(&latencies, 0.95),
        p99: percentile(&latencies, 0.99),
        p999: percentile(&latencies, 0.999),
        extra: (dependency.count() - requests) as f64 / requests as f64,
    }
}

/// tower's hedge policy for these requests.
#[derive(Debug, Clone)]
struct CloneGet;

impl tower::hedge::Policy<Request<String>> for CloneGet {
    fn clone_request(&self, req: &Request<String>) -> Option<Request<String>> {
        let mut copy = Request::new(req.body().clone());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.headers_mut() = req.headers().clone();
        Some(copy)
    }

    fn can_retry(&self, _req: &Request<String>) -> bool {
        true
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn hedging_brings_the_p99_down_to_the_p95_for_a_few_percent_more_calls() {
    let bare = dependency();
    let none = run(bare.clone(), &bare).await;

    let dep = dependency();
    let layer = HedgeLayer::new();
    let ours = run(layer.layer(dep.clone()), &dep).await;

    // tower hedges only once a whole period of latencies is in its read
    // histogram: a period of 1 s, well within the 2 s warm-up.
    let dep = dependency();
    let tower_hedge =
        tower::hedge::Hedge::new(dep.clone(), CloneGet, 100, 0.95, Duration::from_secs(1));
    let tower = run(tower_hedge, &dep).await;

    println!("caller        p50     p95     p99   p99.9  extra calls");
    for (name, f) in [
        ("no hedging", &none),
        ("ours", &ours),
        ("tower::hedge", &tower),
    ] {
        println!(
            "{name:<12} {:>5.1}ms {:>5.1}ms {:>5.1}ms {:>5.1}ms {:>6.2}%",
            f.p50.as_secs_f64() * 1e3,
            f.p95.as_secs_f64() * 1e3,
            f.p99.as_secs_f64() * 1e3,
            f.p999.as_secs_f64() * 1e3,
            f.extra * 100.0
        );
    }
    println!(
        "ours: {:?}, delay {:?}",
        layer.counters(),
        layer.current_delay()
    );

    assert!(
        none.p99 >= 200 * MS,
        "without hedging, the slow 5%: {none:?}"
    );
    assert!(ours.p99 <= ours.p95 + 10 * MS, "{ours:?}");
    assert!(ours.extra <= 0.07, "{ours:?}");
}
