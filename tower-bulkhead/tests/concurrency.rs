//! Races of many tasks on two worker threads: the limit and the waiter
//! bound are never exceeded and no slot or waiter place leaks, with and
//! without waiting, with cancellations.

mod support;

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use support::Gate;
use tower::{service_fn, BoxError, Service, ServiceExt};
use tower_bulkhead::error::BulkheadFull;
use tower_bulkhead::{Bulkhead, BulkheadLayer};
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
    // Room for every task to wait: this race is about slots, not places.
    let layer = BulkheadLayer::new("race", LIMIT)
        .max_wait(Duration::from_millis(20))
        .max_waiters(TASKS);
    let handle = layer.handle();
    let (observed, rejected) = race(layer).await;

    assert!(observed.max.load(Ordering::SeqCst) <= LIMIT);
    assert_eq!(handle.in_flight(), 0, "no slot leaked");
    assert_eq!(handle.waiting(), 0, "no waiter place leaked");
    assert_eq!(handle.rejected(), rejected as u64);
    // Waiting lets (almost) every call through; most are not refused.
    assert!(observed.calls.load(Ordering::SeqCst) > TASKS * CALLS / 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn few_waiter_places_leak_nothing_under_a_race_with_cancellations() {
    // Waiters get a slot, time out, or are cancelled while waiting; each
    // way must give the place back.
    let layer = BulkheadLayer::new("race", LIMIT)
        .max_wait(Duration::from_millis(20))
        .max_waiters(2);
    let handle = layer.handle();
    let (observed, rejected) = race(layer).await;

    assert!(observed.max.load(Ordering::SeqCst) <= LIMIT);
    assert!(rejected > 0, "the waiter places must actually run out");
    assert_eq!(handle.in_flight(), 0, "no slot leaked");
    assert_eq!(handle.waiting(), 0, "no waiter place leaked");
    assert_eq!(handle.rejected(), rejected as u64);
}

const WAITERS: usize = 8;
const BURST: usize = 400;

/// Fires `BURST` calls from as many tasks at a compartment whose slot is
/// held, and waits until each has been decided. Returns the tasks of the
/// calls that queued (they finish once they get the slot) and the number
/// refused at once.
async fn burst(
    service: &Bulkhead<support::GateService>,
) -> (Vec<tokio::task::JoinHandle<Option<()>>>, usize) {
    let (verdicts, mut decided) = tokio::sync::mpsc::unbounded_channel();
    let tasks: Vec<_> = (0..BURST)
        .map(|i| {
            let mut service = service.clone();
            let verdicts = verdicts.clone();
            tokio::spawn(async move {
                let call = service.ready().await.unwrap().call(support::request());
                let mut call = pin!(call);
                match poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await {
                    Poll::Ready(Ok(_)) => panic!("the slot is held"),
                    Poll::Ready(Err(e)) => {
                        let full = e.downcast_ref::<BulkheadFull>().expect("a rejection");
                        assert_eq!(full.waited(), Duration::ZERO, "refused at once");
                        verdicts.send((i, false)).unwrap();
                        None
                    }
                    Poll::Pending => {
                        verdicts.send((i, true)).unwrap();
                        call.await.expect("a queued call gets the slot");
                        Some(())
                    }
                }
            })
        })
        .collect();
    let mut queued = vec![false; BURST];
    for _ in 0..BURST {
        let (i, waits) = decided.recv().await.unwrap();
        queued[i] = waits;
    }
    let mut waiting = Vec::new();
    for (task, waits) in tasks.into_iter().zip(queued) {
        if waits {
            waiting.push(task);
        } else {
            assert_eq!(task.await.unwrap(), None);
        }
    }
    let refused = BURST - waiting.len();
    (waiting, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_never_queues_more_than_max_waiters_and_leaks_no_place() {
    let gate = Gate::new();
    // A wait far longer than the test: only the slot frees the waiters.
    let layer = BulkheadLayer::new("burst", 1)
        .max_wait(Duration::from_secs(3600))
        .max_waiters(WAITERS);
    let handle = layer.handle();
    let mut service = layer.layer(gate.service());
    let held = tokio::spawn(service.ready().await.unwrap().call(support::request()));
    assert_eq!(handle.in_flight(), 1);

    // Samples the waiter count for as long as the bursts run.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (handle, stop) = (handle.clone(), stop.clone());
        tokio::spawn(async move {
            let mut most = 0;
            while !stop.load(Ordering::SeqCst) {
                most = most.max(handle.waiting());
                tokio::task::yield_now().await;
            }
            most
        })
    };

    // Exactly `WAITERS` calls queue; all the others are refused at once.
    let (queued, refused) = burst(&service).await;
    assert_eq!(queued.len(), WAITERS);
    assert_eq!(refused, BURST - WAITERS);
    assert_eq!(handle.waiting(), WAITERS);

    // Cancelling the queued calls frees every place...
    for task in queued {
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
    }
    assert_eq!(handle.waiting(), 0, "a dropped waiter frees its place");

    // ...so the next burst queues exactly as many again.
    let (queued, refused) = burst(&service).await;
    assert_eq!(queued.len(), WAITERS);
    assert_eq!(refused, BURST - WAITERS);
    assert_eq!(handle.rejected(), 2 * (BURST - WAITERS) as u64);

    // Once the slot frees, each waiter gets it in turn and leaves.
    gate.open_all();
    held.await.unwrap().unwrap();
    for task in queued {
        assert_eq!(task.await.unwrap(), Some(()));
    }
    stop.store(true, Ordering::SeqCst);
    assert!(watcher.await.unwrap() <= WAITERS);

    let stats = handle.stats();
    assert_eq!(
        (stats.in_flight(), stats.waiting()),
        (0, 0),
        "nothing leaked"
    );
    assert_eq!(gate.calls(), 1 + WAITERS);
    assert_eq!(gate.max(), 1, "the limit held throughout");
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
