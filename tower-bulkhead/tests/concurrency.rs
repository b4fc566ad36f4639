//! Races of many tasks on two worker threads: the limit is never exceeded
//! and no slot leaks, with and without waiting, with cancellations.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower::{service_fn, BoxError, Service, ServiceExt};
use tower_bulkhead::error::BulkheadFull;
use tower_bulkhead::BulkheadLayer;
use tower_layer::Layer;

const LIMIT: usize = 8;
const TASKS: usize = 64;
const CALLS: usize = 200;

#[derive(Default)]
struct Observed {
    current: AtomicUsize,
    max: AtomicUsize,
    calls: AtomicUsize,
}

struct Inside(Arc<Observed>);

impl Drop for Inside {
    fn drop(&mut self) {
        self.0.current.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Races `TASKS` tasks of `CALLS` calls each through clones of one
/// bulkhead; every 7th call is cancelled almost at once. Returns the
/// observations and the number of rejections seen by the callers.
async fn race(layer: BulkheadLayer) -> (Arc<Observed>, usize) {
    let observed = Arc::new(Observed::default());
    let inner = {
        let observed = observed.clone();
        service_fn(move |_req: ()| {
            let observed = observed.clone();
            async move {
                observed.calls.fetch_add(1, Ordering::SeqCst);
                let now = observed.current.fetch_add(1, Ordering::SeqCst) + 1;
                observed.max.fetch_max(now, Ordering::SeqCst);
                let _inside = Inside(observed.clone());
                for _ in 0..3 {
                    tokio::task::yield_now().await;
                }
                Ok::<_, BoxError>(())
            }
        })
    };
    let service = layer.layer(inner);
    let rejected = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let mut service = service.clone();
            let rejected = rejected.clone();
            tokio::spawn(async move {
                for i in 0..CALLS {
                    let call = service.ready().await.unwrap().call(());
                    let result = if (t + i) % 7 == 0 {
                        match tokio::time::timeout(Duration::from_micros(1), call).await {
                            Ok(result) => result,
                            Err(_cancelled) => continue,
                        }
                    } else {
                        call.await
                    };
                    if let Err(e) = result {
                        assert!(e.is::<BulkheadFull>(), "unexpected error {e}");
                        rejected.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    (observed, rejected.load(Ordering::SeqCst))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_never_exceeds_the_limit_under_a_race() {
    let layer = BulkheadLayer::new("race", LIMIT);
    let handle = layer.handle();
    let (observed, rejected) = race(layer).await;

    assert!(observed.max.load(Ordering::SeqCst) <= LIMIT);
    assert!(
        rejected > 0,
        "the race must actually saturate the compartment"
    );
    assert_eq!(handle.in_flight(), 0, "no slot leaked");
    assert_eq!(observed.current.load(Ordering::SeqCst), 0);
    assert_eq!(handle.rejected(), rejected as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_calls_never_exceed_the_limit_nor_leak() {
    let layer = BulkheadLayer::new("race", LIMIT).max_wait(Duration::from_millis(20));
    let handle = layer.handle();
    let (observed, rejected) = race(layer).await;

    assert!(observed.max.load(Ordering::SeqCst) <= LIMIT);
    assert_eq!(handle.in_flight(), 0, "no slot leaked");
    assert_eq!(handle.rejected(), rejected as u64);
    // Waiting lets (almost) every call through; most are not refused.
    assert!(observed.calls.load(Ordering::SeqCst) > TASKS * CALLS / 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_compartments_hold_their_limits_under_a_race() {
    let observed: Vec<_> = (0..2).map(|_| Arc::new(Observed::default())).collect();
    let inner = {
        let observed = observed.clone();
        service_fn(move |req: http::Request<()>| {
            let key = usize::from(req.uri().path() == "/b");
            let observed = observed[key].clone();
            async move {
                let now = observed.current.fetch_add(1, Ordering::SeqCst) + 1;
                observed.max.fetch_max(now, Ordering::SeqCst);
                let _inside = Inside(observed.clone());
                tokio::task::yield_now().await;
                Ok::<_, BoxError>(())
            }
        })
    };
    let layer = BulkheadLayer::new("race", LIMIT)
        .per_key(|req: &http::Request<()>| req.uri().path().to_owned());
    let handle = layer.handle();
    let service = layer.layer(inner);
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let mut service = service.clone();
            tokio::spawn(async move {
                for _ in 0..CALLS {
                    let path = if t % 2 == 0 { "/a" } else { "/b" };
                    let req = http::Request::get(path).body(()).unwrap();
                    let _ = service.ready().await.unwrap().call(req).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    for o in &observed {
        assert!(o.max.load(Ordering::SeqCst) <= LIMIT);
    }
    assert_eq!(handle.len(), 2);
    for (_, stats) in handle.snapshot() {
        assert_eq!(stats.in_flight(), 0);
    }
}
