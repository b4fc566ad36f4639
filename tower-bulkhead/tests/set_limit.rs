//! A fixed compartment's limit changed at run time: calls in flight keep
//! their slots, waiters take new slots, the counters go on, and under a
//! race of callers against many changes no slot is lost or made up.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_bulkhead::adaptive::Aimd;
use tower_bulkhead::{BulkheadLayer, SetLimitError};

/// `layer` over a service whose calls end one per `gate.notify_one()`.
fn gated(
    layer: BulkheadLayer,
) -> (
    impl tower::Service<(), Response = (), Error = BoxError, Future = impl Send> + Clone,
    Arc<Notify>,
) {
    let gate = Arc::new(Notify::new());
    let svc = layer.layer(service_fn({
        let gate = gate.clone();
        move |_: ()| {
            let gate = gate.clone();
            async move {
                gate.notified().await;
                Ok::<_, BoxError>(())
            }
        }
    }));
    (svc, gate)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_cut_keeps_the_calls_in_flight_and_refuses_new_ones_until_they_end() {
    let layer = BulkheadLayer::new("dep", 4);
    let handle = layer.handle();
    let (svc, gate) = gated(layer);
    let calls: Vec<_> = (0..4)
        .map(|_| tokio::spawn(svc.clone().oneshot(())))
        .collect();
    tokio::task::yield_now().await;
    assert_eq!(handle.in_flight(), 4);
    assert_eq!(handle.set_limit(2), Ok(4));
    assert_eq!(handle.in_flight(), 4, "nobody loses a slot");
    assert!(
        svc.clone().oneshot(()).await.is_err(),
        "4 in flight, limit 2"
    );
    let rejected = handle.rejected();
    // Two end: still at the new limit, still refused.
    gate.notify_one();
    gate.notify_one();
    tokio::task::yield_now().await;
    tokio::task::yield_now().await;
    assert_eq!(handle.in_flight(), 2);
    assert!(svc.clone().oneshot(()).await.is_err());
    assert_eq!(handle.rejected(), rejected + 1, "the counters go on");
    // Raised again: room at once.
    assert_eq!(handle.set_limit(8), Ok(2));
    let more = tokio::spawn(svc.clone().oneshot(()));
    tokio::task::yield_now().await;
    assert_eq!(handle.in_flight(), 3);
    for _ in 0..3 {
        gate.notify_one();
        tokio::task::yield_now().await;
    }
    for call in calls {
        call.await.unwrap().unwrap();
    }
    more.await.unwrap().unwrap();
    assert_eq!(handle.in_flight(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_raise_wakes_the_calls_waiting_for_a_slot() {
    let layer = BulkheadLayer::new("dep", 1)
        .max_wait(Duration::from_secs(10))
        .max_waiters(4);
    let handle = layer.handle();
    let (svc, gate) = gated(layer);
    let first = tokio::spawn(svc.clone().oneshot(()));
    tokio::task::yield_now().await;
    let waiting: Vec<_> = (0..2)
        .map(|_| tokio::spawn(svc.clone().oneshot(())))
        .collect();
    tokio::task::yield_now().await;
    assert_eq!((handle.in_flight(), handle.waiting()), (1, 2));
    handle.set_limit(3).unwrap();
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        (handle.in_flight(), handle.waiting()),
        (3, 0),
        "woken at once"
    );
    for _ in 0..3 {
        gate.notify_one();
        tokio::task::yield_now().await;
    }
    first.await.unwrap().unwrap();
    for call in waiting {
        call.await.unwrap().unwrap();
    }
}

#[test]
fn an_adaptive_limit_or_zero_is_refused_and_nothing_changes() {
    let adaptive = BulkheadLayer::adaptive("dep", Aimd::new()).handle();
    let before = adaptive.limit();
    assert_eq!(adaptive.set_limit(5), Err(SetLimitError::Adaptive));
    assert_eq!(adaptive.limit(), before);
    let fixed = BulkheadLayer::new("dep", 3).handle();
    assert_eq!(fixed.set_limit(0), Err(SetLimitError::Zero));
    assert_eq!(fixed.limit(), 3);
    assert!(SetLimitError::Adaptive.to_string().contains("adaptive"));
}

/// Eight tasks on four threads calling while another changes the limit
/// between 1 and 8 a thousand times: never more calls inside than the
/// largest limit, every call admitted or refused, and the compartment
/// empty at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_calls_and_changes_lose_no_slot() {
    let layer = BulkheadLayer::new("dep", 4);
    let handle = layer.handle();
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let svc = layer.layer(service_fn({
        let (inside, most) = (inside.clone(), most.clone());
        move |_: ()| {
            let (inside, most) = (inside.clone(), most.clone());
            async move {
                let now = inside.fetch_add(1, SeqCst) + 1;
                most.fetch_max(now, SeqCst);
                tokio::task::yield_now().await;
                inside.fetch_sub(1, SeqCst);
                Ok::<_, std::io::Error>(())
            }
        }
    }));
    let changer = {
        let handle = handle.clone();
        tokio::spawn(async move {
            for i in 0..1_000usize {
                handle.set_limit(1 + i % 8).unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let (mut ok, mut refused) = (0, 0);
                for _ in 0..2_000 {
                    let call = svc.clone().oneshot(());
                    if call.await.is_ok() {
                        ok += 1;
                    } else {
                        refused += 1;
                    }
                }
                (ok, refused)
            })
        })
        .collect();
    changer.await.unwrap();
    let mut total = 0;
    for task in tasks {
        let (ok, refused) = task.await.unwrap();
        total += ok + refused;
    }
    assert_eq!(total, 16_000);
    assert!(
        most.load(SeqCst) <= 8,
        "{} inside at once",
        most.load(SeqCst)
    );
    assert_eq!(handle.in_flight(), 0, "no slot lost");
    assert_eq!(inside.load(SeqCst), 0);
}
