//! The hedging layer's race: when a hedge goes out, which answer wins,
//! what is cancelled, which requests are never hedged, and when the
//! server's pushback or the deadline stop hedging.

mod hedge_support;

use std::io;
use std::time::Duration;

use hedge_support::{get, post, Replicas, Reply, MS};
use http::Request;
use tokio::time::Instant;
use tokio_test::{assert_pending, assert_ready_ok};
use tower::{Layer, Service, ServiceExt};
use tower_deadline::Deadline;
use tower_retry_budget::hedge::{HedgeLayer, HEDGE_ATTEMPT_HEADER};
use tower_retry_budget::policy::IDEMPOTENCY_KEY;
use tower_retry_budget::NO_RETRY_HEADER;

/// A fixed delay of 20 ms: the learned delay is tested in
/// `hedge_estimate.rs`.
fn layer() -> HedgeLayer {
    HedgeLayer::new().fixed_delay(20 * MS)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_fast_answer_passes_through_without_a_hedge() {
    let replicas = Replicas::all(5 * MS);
    let layer = layer();
    let start = Instant::now();
    let response = layer.layer(replicas.clone()).oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), 5 * MS);
    assert_eq!(replicas.count(), 1);
    let c = layer.counters();
    assert_eq!((c.requests, c.hedges, c.cancelled), (1, 0, 0));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_slow_first_attempt_gets_a_hedge_after_the_delay_and_the_hedge_wins() {
    let replicas = Replicas::first_slow(500 * MS, 5 * MS);
    let layer = layer();
    let start = Instant::now();
    let call = tokio::spawn(layer.layer(replicas.clone()).oneshot(get()));

    tokio::time::sleep(19 * MS).await;
    assert_eq!(replicas.count(), 1, "t-1: no hedge yet");
    tokio::time::sleep(MS).await;
    tokio::task::yield_now().await;
    assert_eq!(replicas.count(), 2, "t: the hedge is out");

    let response = call.await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        start.elapsed(),
        25 * MS,
        "the hedge's 5 ms after the 20 ms delay"
    );
    let calls = replicas.calls();
    assert!(!calls[0].headers.contains_key(HEDGE_ATTEMPT_HEADER));
    assert_eq!(calls[1].headers[HEDGE_ATTEMPT_HEADER], "2");
    assert_eq!(
        replicas.in_flight(),
        0,
        "the slow first attempt was dropped"
    );
    assert_eq!(replicas.cancelled(), 1);
    let c = layer.counters();
    assert_eq!((c.hedges, c.hedges_won, c.cancelled), (1, 1, 1));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_first_attempt_still_wins_when_it_answers_first() {
    // Slower than the delay, but faster than the hedge.
    let replicas = Replicas::new(|n| {
        (
            if n == 0 { 30 * MS } else { 100 * MS },
            hedge_support::Reply::Status(200),
        )
    });
    let layer = layer();
    let start = Instant::now();
    layer.layer(replicas.clone()).oneshot(get()).await.unwrap();
    assert_eq!(start.elapsed(), 30 * MS);
    assert_eq!(replicas.count(), 2);
    assert_eq!((replicas.in_flight(), replicas.cancelled()), (0, 1));
    let c = layer.counters();
    assert_eq!((c.hedges, c.hedges_won, c.cancelled), (1, 0, 1));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn at_most_max_hedges_each_one_delay_after_the_previous() {
    let replicas = Replicas::all(Duration::from_secs(1));
    let svc = layer().max_hedges(2).layer(replicas.clone());
    tokio::spawn(svc.oneshot(get()));
    // Long enough for every hedge to have gone out.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls = replicas.calls();
    let at: Vec<Duration> = calls.iter().map(|c| c.at - calls[0].at).collect();
    assert_eq!(at, [Duration::ZERO, 20 * MS, 40 * MS]);
    let headers: Vec<_> = calls
        .iter()
        .map(|c| c.headers.get(HEDGE_ATTEMPT_HEADER).cloned())
        .collect();
    assert_eq!(
        headers,
        [None, Some("2".parse().unwrap()), Some("3".parse().unwrap())]
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_request_that_is_not_idempotent_is_never_hedged() {
    let replicas = Replicas::first_slow(500 * MS, 5 * MS);
    let layer = layer();
    let start = Instant::now();
    let response = layer.layer(replicas.clone()).oneshot(post()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), 500 * MS, "waited for the only attempt");
    assert_eq!(replicas.count(), 1);
    assert_eq!(layer.counters().hedges, 0);

    // An idempotency key makes it safe to send twice.
    let replicas = Replicas::first_slow(500 * MS, 5 * MS);
    let mut keyed = post();
    keyed
        .headers_mut()
        .insert(IDEMPOTENCY_KEY, "order-42".parse().unwrap());
    let response = layer.layer(replicas.clone()).oneshot(keyed).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(replicas.count(), 2);
    let bodies: Vec<_> = replicas
        .calls()
        .into_iter()
        .map(|c| c.body.unwrap())
        .collect();
    assert_eq!(bodies[0], bodies[1], "the hedge replays the body");
    assert_eq!(&bodies[1][..], b"{\"qty\":1}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn clone_bodies_replays_by_cloning() {
    let replicas = Replicas::first_slow(500 * MS, 5 * MS);
    let layer = layer().clone_bodies();
    let request = Request::put("http://dependency/items/1")
        .body(String::from("new value"))
        .unwrap();
    let response = layer
        .layer(replicas.clone())
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let bodies: Vec<_> = replicas
        .calls()
        .into_iter()
        .map(|c| c.body.unwrap())
        .collect();
    assert_eq!(bodies, ["new value", "new value"]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_retryable_failure_never_beats_an_attempt_in_flight() {
    // The hedge fails fast with a 503; the first attempt answers later.
    let replicas = Replicas::new(|n| match n {
        0 => (50 * MS, Reply::Status(200)),
        _ => (5 * MS, Reply::Status(503)),
    });
    let layer = layer();
    let start = Instant::now();
    let response = layer.layer(replicas.clone()).oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), 50 * MS);

    // Nor does a reset connection.
    let replicas = Replicas::new(|n| match n {
        0 => (50 * MS, Reply::Status(200)),
        _ => (5 * MS, Reply::Io(io::ErrorKind::ConnectionReset)),
    });
    let response = layer.layer(replicas).oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_answer_that_is_not_a_retryable_failure_wins() {
    // A 404 is the dependency's answer, not a failure worth waiting out.
    let replicas = Replicas::new(|n| match n {
        0 => (500 * MS, Reply::Status(200)),
        _ => (5 * MS, Reply::Status(404)),
    });
    let start = Instant::now();
    let response = layer()
        .layer(replicas.clone())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(start.elapsed(), 25 * MS);
    assert_eq!(replicas.cancelled(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn when_every_attempt_fails_the_first_attempts_failure_is_returned() {
    let replicas = Replicas::new(|n| match n {
        0 => (50 * MS, Reply::Status(503)),
        _ => (5 * MS, Reply::Status(502)),
    });
    let start = Instant::now();
    let response = layer()
        .layer(replicas.clone())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(response.status(), 503, "the first attempt's failure");
    assert_eq!(start.elapsed(), 50 * MS, "once nothing else is in flight");
    assert_eq!(replicas.cancelled(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_failure_before_the_delay_is_returned_at_once() {
    let replicas = Replicas::new(|_| (5 * MS, Reply::Status(503)));
    let layer = layer();
    let start = Instant::now();
    let response = layer.layer(replicas.clone()).oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(
        start.elapsed(),
        5 * MS,
        "hedges answer slowness, not failures"
    );
    assert_eq!(replicas.count(), 1);

    let replicas = Replicas::new(|_| (5 * MS, Reply::Io(io::ErrorKind::ConnectionRefused)));
    let err = layer.layer(replicas).oneshot(get()).await.unwrap_err();
    let io = err
        .downcast_ref::<io::Error>()
        .expect("the inner error, unchanged");
    assert_eq!(io.kind(), io::ErrorKind::ConnectionRefused);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_servers_retry_after_pauses_hedging_for_every_call() {
    // The hedge of the first call is told to come back in 2 s.
    let replicas = Replicas::new(|n| match n {
        0 => (50 * MS, Reply::Status(200)),
        1 => (5 * MS, Reply::With(503, "retry-after", "2")),
        _ => (500 * MS, Reply::Status(200)),
    });
    let layer = layer();
    let svc = layer.layer(replicas.clone());
    let start = Instant::now();
    svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(replicas.count(), 2);

    // A slow call within the pause: no hedge.
    svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(replicas.count(), 3);
    assert_eq!(layer.counters().refused_by_pushback, 1);

    // The pause ends 2 s after the pushback (at 25 ms): a call whose delay
    // ends 1 ms before is still paused, one whose delay ends then is not.
    tokio::time::sleep_until(start + 25 * MS + Duration::from_secs(2) - 21 * MS).await;
    svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(replicas.count(), 4, "t-1: still paused");
    tokio::time::sleep_until(start + 25 * MS + Duration::from_secs(2) - 20 * MS).await;
    svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(replicas.count(), 6, "t: a hedge again");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_do_not_retry_mark_stops_the_calls_hedging() {
    let replicas = Replicas::new(|n| match n {
        0 => (100 * MS, Reply::Status(200)),
        1 => (5 * MS, Reply::With(503, "x-tower-no-retry", "1")),
        _ => (5 * MS, Reply::Status(200)),
    });
    let layer = layer().max_hedges(3);
    let response = layer.layer(replicas.clone()).oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(!response.headers().contains_key(NO_RETRY_HEADER));
    assert_eq!(replicas.count(), 2, "no hedge after the mark");
    assert_eq!(layer.counters().refused_by_pushback, 1);

    // So do a negative gRPC pushback (which does not beat the attempt in
    // flight either) and a malformed `Retry-After`.
    for (name, value) in [("grpc-retry-pushback-ms", "-1"), ("retry-after", "soon")] {
        let replicas = Replicas::new(move |n| match n {
            0 => (100 * MS, Reply::Status(200)),
            1 => (5 * MS, Reply::With(503, name, value)),
            _ => (5 * MS, Reply::Status(200)),
        });
        let response = layer.layer(replicas.clone()).oneshot(get()).await.unwrap();
        assert_eq!(response.status(), 200, "{name}: {value}");
        assert_eq!(replicas.count(), 2, "{name}: {value}");
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn no_hedge_with_less_than_the_minimum_slice_of_the_deadline() {
    let request = |left: Duration| {
        let mut request = get();
        request.extensions_mut().insert(Deadline::after(left));
        request
    };
    let layer = layer().min_remaining(10 * MS);
    // At the 20 ms delay, 10 ms are left: exactly enough.
    let replicas = Replicas::first_slow(100 * MS, 5 * MS);
    layer
        .layer(replicas.clone())
        .oneshot(request(30 * MS))
        .await
        .unwrap();
    assert_eq!(replicas.count(), 2);
    // One millisecond less: no hedge.
    let replicas = Replicas::first_slow(100 * MS, 5 * MS);
    layer
        .layer(replicas.clone())
        .oneshot(request(29 * MS))
        .await
        .unwrap();
    assert_eq!(replicas.count(), 1);
    assert_eq!(layer.counters().refused_by_deadline, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn dropping_the_call_cancels_every_attempt() {
    let replicas = Replicas::all(Duration::from_secs(1));
    let layer = layer();
    let mut svc = layer.layer(replicas.clone());
    let mut call = tokio_test::task::spawn(svc.call(get()));
    assert_pending!(call.poll());
    tokio::time::sleep(20 * MS).await;
    assert!(call.is_woken());
    assert_pending!(call.poll());
    assert_eq!(replicas.in_flight(), 2);
    drop(call);
    assert_eq!((replicas.in_flight(), replicas.cancelled()), (0, 2));
    assert_eq!(layer.counters().cancelled, 2);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn inner_readiness_is_forwarded_and_waited_for_before_a_hedge() {
    let (mock, mut handle) = tower_test::mock::pair::<
        Request<tower_retry_budget::body::ReplayBody<String>>,
        http::Response<String>,
    >();
    let mut svc = tower_test::mock::Spawn::new(layer().layer(mock));
    handle.allow(0);
    assert_pending!(svc.poll_ready());
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let mut call = tokio_test::task::spawn(svc.call(get()));
    let (_first, first_reply) = handle.next_request().await.unwrap();
    assert_pending!(call.poll());
    // The delay passes while the service is not ready: the hedge waits.
    tokio::time::sleep(50 * MS).await;
    assert_pending!(call.poll());
    handle.allow(1);
    assert!(call.is_woken());
    assert_pending!(call.poll());
    let (hedge, hedge_reply) = handle.next_request().await.unwrap();
    assert_eq!(hedge.headers()[HEDGE_ATTEMPT_HEADER], "2");
    hedge_reply.send_response(hedge_support::status(200));
    let response = assert_ready_ok!(call.poll());
    assert_eq!(response.status(), 200);
    drop(first_reply);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn clones_share_the_counters_and_the_budget() {
    let layer = layer();
    let replicas = Replicas::first_slow(100 * MS, 5 * MS);
    let svc = layer.layer(replicas);
    let clone = svc.clone();
    clone.oneshot(get()).await.unwrap();
    assert_eq!(svc.counters().hedges, 1);
    assert_eq!(layer.counters().hedges, 1);
    assert_eq!(layer.shared_budget().counters().requests, 1);
    assert_eq!(
        layer.shared_budget().counters().retries,
        1,
        "the hedge's token"
    );
}
