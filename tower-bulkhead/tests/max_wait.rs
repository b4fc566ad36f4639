//! With `max_wait`, a call that finds its compartment full waits in its
//! response future, bounded in time and in number (`max_waiters`), and is
//! woken in order; every way a wait ends gives its waiter place back.

mod support;

use std::time::Duration;

use support::request;
use tokio::time::advance;
use tokio_test::{assert_pending, assert_ready_err, assert_ready_ok};
use tower_bulkhead::error::BulkheadFull;
use tower_bulkhead::{BulkheadLayer, HttpBulkheadLayer};
use tower_test::mock;

const WAIT: Duration = Duration::from_millis(100);
const MS: Duration = Duration::from_millis(1);

type Spawned = tower_test::mock::Spawn<
    tower_bulkhead::Bulkhead<tower_test::mock::Mock<support::Request, &'static str>>,
>;

type Handle = mock::Handle<support::Request, &'static str>;

/// Limit 1, `max_wait` 100 ms, room for three waiters (more than the
/// default of one, the limit), so that order and hand-over can be seen.
fn setup() -> (BulkheadLayer, Spawned, Handle) {
    setup_with_waiters(3)
}

fn setup_with_waiters(max_waiters: usize) -> (BulkheadLayer, Spawned, Handle) {
    let layer = BulkheadLayer::new("dep", 1)
        .max_wait(WAIT)
        .max_waiters(max_waiters);
    let (service, handle) = mock::spawn_layer(layer.clone());
    (layer, service, handle)
}

type Call = tokio_test::task::Spawn<
    tower_bulkhead::future::ResponseFuture<
        tower_test::mock::Mock<support::Request, &'static str>,
        support::Request,
    >,
>;

/// Makes one call, not yet polled: the bulkhead decides in `call` whether
/// it goes, waits (taking a waiter place) or is refused.
fn call(service: &mut Spawned) -> Call {
    assert_ready_ok!(service.poll_ready());
    tokio_test::task::spawn(service.call(request()))
}

/// Limit 1 and two waiter places: the first call takes the slot (and is
/// answered through the returned sender), the next two wait.
async fn full_with_two_waiters() -> (
    BulkheadLayer,
    Spawned,
    Handle,
    Call,
    mock::SendResponse<&'static str>,
    [Call; 2],
) {
    let (layer, mut service, mut handle) = setup_with_waiters(2);
    let mut first = call(&mut service);
    assert_pending!(first.poll());
    let (_, first_reply) = handle.next_request().await.unwrap();
    let mut second = call(&mut service);
    let mut third = call(&mut service);
    assert_pending!(second.poll());
    assert_pending!(third.poll());
    assert_eq!(layer.handle().waiting(), 2);
    (layer, service, handle, first, first_reply, [second, third])
}

/// Asserts that a call is refused at once, without waiting.
fn assert_refused_at_once(call: &mut Call) {
    let err = assert_ready_err!(call.poll());
    let full = err
        .downcast_ref::<BulkheadFull>()
        .expect("a bulkhead rejection");
    assert_eq!(full.waited(), Duration::ZERO);
    assert!(!full.waited_and_timed_out());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_slot_freed_just_before_max_wait_goes_to_the_waiting_call() {
    let (layer, mut service, mut handle) = setup();

    assert_ready_ok!(service.poll_ready());
    let mut first = tokio_test::task::spawn(service.call(request()));
    assert_pending!(first.poll());
    let (_, first_reply) = handle.next_request().await.unwrap();

    assert_ready_ok!(service.poll_ready());
    let mut waiting = tokio_test::task::spawn(service.call(request()));
    assert_pending!(waiting.poll());

    advance(WAIT - MS).await;
    assert_pending!(waiting.poll());
    // The inner service has not seen the waiting call yet.
    assert!(handle.poll_request().is_pending());

    first_reply.send_response("first");
    assert_eq!(assert_ready_ok!(first.poll()), "first");
    assert!(waiting.is_woken());
    assert_pending!(waiting.poll());
    let (_, reply) = handle.next_request().await.unwrap();
    reply.send_response("second");
    assert_eq!(assert_ready_ok!(waiting.poll()), "second");
    assert_eq!(layer.handle().rejected(), 0);
    assert_eq!(layer.handle().in_flight(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_waiting_call_is_refused_just_after_max_wait() {
    let (layer, mut service, mut handle) = setup();

    assert_ready_ok!(service.poll_ready());
    let mut first = tokio_test::task::spawn(service.call(request()));
    assert_pending!(first.poll());
    let _first_reply = handle.next_request().await.unwrap();

    assert_ready_ok!(service.poll_ready());
    let mut waiting = tokio_test::task::spawn(service.call(request()));
    assert_pending!(waiting.poll());

    advance(WAIT - MS).await;
    assert_pending!(waiting.poll());
    advance(2 * MS).await;
    let err = assert_ready_err!(waiting.poll());
    let full = err.downcast_ref::<BulkheadFull>().unwrap();
    assert!(full.waited_and_timed_out());
    assert_eq!(full.waited(), WAIT);
    assert_eq!(layer.handle().rejected(), 1);
    assert_eq!(
        layer.handle().in_flight(),
        1,
        "the first call still holds its slot"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn waiters_are_woken_in_the_order_they_started_waiting() {
    let (_layer, mut service, mut handle) = setup();

    assert_ready_ok!(service.poll_ready());
    let mut first = tokio_test::task::spawn(service.call(request()));
    assert_pending!(first.poll());
    let (_, first_reply) = handle.next_request().await.unwrap();

    let mut waiters: Vec<_> = (0..3)
        .map(|_| {
            assert_ready_ok!(service.poll_ready());
            let mut w = tokio_test::task::spawn(service.call(request()));
            assert_pending!(w.poll());
            w
        })
        .collect();

    first_reply.send_response("0");
    assert_ready_ok!(first.poll());
    for i in 0..3 {
        assert!(waiters[i].is_woken(), "waiter {i} is next");
        for later in &waiters[i + 1..] {
            assert!(!later.is_woken());
        }
        assert_pending!(waiters[i].poll());
        let (_, reply) = handle.next_request().await.unwrap();
        reply.send_response("done");
        assert_ready_ok!(waiters[i].poll());
    }
    drop(waiters);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_dropped_waiter_passes_its_turn_on() {
    let (layer, mut service, mut handle) = setup();

    assert_ready_ok!(service.poll_ready());
    let mut first = tokio_test::task::spawn(service.call(request()));
    assert_pending!(first.poll());
    let (_, first_reply) = handle.next_request().await.unwrap();

    assert_ready_ok!(service.poll_ready());
    let mut a = tokio_test::task::spawn(service.call(request()));
    assert_pending!(a.poll());
    assert_ready_ok!(service.poll_ready());
    let mut b = tokio_test::task::spawn(service.call(request()));
    assert_pending!(b.poll());

    drop(a);
    first_reply.send_response("0");
    assert_ready_ok!(first.poll());
    assert!(b.is_woken());
    assert_pending!(b.poll());
    let (_, reply) = handle.next_request().await.unwrap();
    reply.send_response("b");
    assert_eq!(assert_ready_ok!(b.poll()), "b");
    assert_eq!(layer.handle().in_flight(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn http_mode_answers_503_after_waiting_in_vain() {
    let layer = HttpBulkheadLayer::new("dep", 1).max_wait(WAIT);
    let (mut service, mut handle) =
        mock::spawn_layer::<support::Request, http::Response<String>, _>(layer.clone());

    assert_ready_ok!(service.poll_ready());
    let mut first = tokio_test::task::spawn(service.call(request()));
    assert_pending!(first.poll());
    let _first_reply = handle.next_request().await.unwrap();

    assert_ready_ok!(service.poll_ready());
    let mut waiting = tokio_test::task::spawn(service.call(support::grpc_request()));
    assert_pending!(waiting.poll());
    advance(WAIT + MS).await;
    let answer = assert_ready_ok!(waiting.poll());
    assert_eq!(answer.headers()["grpc-status"], "8");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_call_past_max_waiters_is_refused_at_once_while_the_others_wait() {
    let (layer, mut service, mut handle, _first, _first_reply, mut waiting) =
        full_with_two_waiters().await;

    // The slot and both waiter places are taken: the fourth call is refused
    // at once, before any time passes, and never reaches the inner service.
    let mut fourth = call(&mut service);
    assert_refused_at_once(&mut fourth);
    assert_eq!(layer.handle().rejected(), 1);
    assert_eq!(layer.handle().waiting(), 2);
    assert!(handle.poll_request().is_pending());

    // The two queued calls still wait, up to `max_wait`.
    advance(WAIT - MS).await;
    for w in &mut waiting {
        assert_pending!(w.poll());
    }
    advance(2 * MS).await;
    for w in &mut waiting {
        let err = assert_ready_err!(w.poll());
        assert_eq!(err.downcast_ref::<BulkheadFull>().unwrap().waited(), WAIT);
    }
    assert_eq!(layer.handle().rejected(), 3);
    assert_eq!(layer.handle().waiting(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn http_mode_answers_a_call_past_max_waiters_at_once() {
    let layer = HttpBulkheadLayer::new("dep", 1)
        .max_wait(WAIT)
        .max_waiters(1);
    let (mut service, mut handle) =
        mock::spawn_layer::<support::Request, http::Response<String>, _>(layer.clone());

    assert_ready_ok!(service.poll_ready());
    let mut first = tokio_test::task::spawn(service.call(request()));
    assert_pending!(first.poll());
    let _first_reply = handle.next_request().await.unwrap();
    assert_ready_ok!(service.poll_ready());
    let mut waiting = tokio_test::task::spawn(service.call(request()));
    assert_pending!(waiting.poll());

    assert_ready_ok!(service.poll_ready());
    let mut refused = tokio_test::task::spawn(service.call(request()));
    let answer = assert_ready_ok!(refused.poll());
    assert_eq!(answer.status(), http::StatusCode::SERVICE_UNAVAILABLE);
    assert_pending!(waiting.poll());
    assert_eq!(layer.handle().waiting(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn dropping_a_waiter_frees_its_place() {
    let (layer, mut service, _handle, _first, _first_reply, [second, mut third]) =
        full_with_two_waiters().await;
    assert_refused_at_once(&mut call(&mut service));

    drop(second);
    assert_eq!(layer.handle().waiting(), 1);
    let mut again = call(&mut service);
    assert_pending!(again.poll());
    assert_eq!(layer.handle().waiting(), 2);
    assert_pending!(third.poll());
    assert_refused_at_once(&mut call(&mut service));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_waiter_that_times_out_frees_its_place() {
    let (layer, mut service, _handle, _first, _first_reply, [mut second, mut third]) =
        full_with_two_waiters().await;

    // Just before `max_wait` both still hold their places.
    advance(WAIT - MS).await;
    assert_pending!(second.poll());
    assert_pending!(third.poll());
    assert_refused_at_once(&mut call(&mut service));

    // Just after, `second` times out: its place is free for a new call.
    advance(2 * MS).await;
    assert!(second.is_woken());
    assert_ready_err!(second.poll());
    assert_eq!(layer.handle().waiting(), 1);
    let mut later = call(&mut service);
    assert_pending!(later.poll());
    assert_eq!(layer.handle().waiting(), 2);
    assert_refused_at_once(&mut call(&mut service));

    // `third` has timed out too; its place is freed as its future ends.
    assert_ready_err!(third.poll());
    assert_eq!(layer.handle().waiting(), 1);

    // `later` waits its own full `max_wait`, from its own call.
    advance(WAIT - MS).await;
    assert_pending!(later.poll());
    advance(2 * MS).await;
    assert!(later.is_woken());
    let err = assert_ready_err!(later.poll());
    assert_eq!(err.downcast_ref::<BulkheadFull>().unwrap().waited(), WAIT);
    assert_eq!(layer.handle().waiting(), 0);
    assert_eq!(
        layer.handle().in_flight(),
        1,
        "the first call still holds the slot"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_waiter_that_gets_the_slot_frees_its_place() {
    let (layer, mut service, mut handle, mut first, first_reply, [mut second, mut third]) =
        full_with_two_waiters().await;

    first_reply.send_response("first");
    assert_eq!(assert_ready_ok!(first.poll()), "first");
    assert!(second.is_woken());
    // `second` takes the slot and leaves the waiters: one place is free.
    assert_pending!(second.poll());
    assert_eq!(layer.handle().in_flight(), 1);
    assert_eq!(layer.handle().waiting(), 1);
    let (_, second_reply) = handle.next_request().await.unwrap();

    let mut fourth = call(&mut service);
    assert_pending!(fourth.poll());
    assert_eq!(layer.handle().waiting(), 2);
    assert_refused_at_once(&mut call(&mut service));

    second_reply.send_response("second");
    assert_eq!(assert_ready_ok!(second.poll()), "second");
    assert_pending!(third.poll());
    assert_eq!(layer.handle().waiting(), 1);
    let (_, third_reply) = handle.next_request().await.unwrap();
    third_reply.send_response("third");
    assert_eq!(assert_ready_ok!(third.poll()), "third");
    assert_pending!(fourth.poll());
    let (_, fourth_reply) = handle.next_request().await.unwrap();
    fourth_reply.send_response("fourth");
    assert_eq!(assert_ready_ok!(fourth.poll()), "fourth");

    let stats = layer.handle().stats();
    assert_eq!((stats.in_flight(), stats.waiting()), (0, 0));
    assert_eq!(stats.rejected(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn by_default_a_compartment_has_as_many_waiter_places_as_slots() {
    let layer = BulkheadLayer::new("dep", 2).max_wait(WAIT);
    let (mut service, _handle) =
        mock::spawn_layer::<support::Request, &'static str, _>(layer.clone());
    let mut calls: Vec<_> = (0..4).map(|_| call(&mut service)).collect();
    for c in &mut calls {
        assert_pending!(c.poll());
    }
    assert_eq!(layer.handle().in_flight(), 2);
    assert_eq!(layer.handle().waiting(), 2);
    assert_refused_at_once(&mut call(&mut service));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn each_key_gets_its_own_waiter_places() {
    let layer = BulkheadLayer::new("upstream", 1)
        .per_key(|req: &support::Request| req.uri().path().to_owned())
        .max_wait(WAIT)
        .max_waiters(1);
    let handle = layer.handle();
    let (mut service, _inner) = mock::spawn_layer::<support::Request, &'static str, _>(layer);
    let mut call_to = |path: &str| {
        assert_ready_ok!(service.poll_ready());
        let req = http::Request::get(path).body(()).unwrap();
        tokio_test::task::spawn(service.call(req))
    };

    let held: Vec<_> = ["/a", "/a", "/b", "/b"].map(&mut call_to).into();
    let refused_a = assert_ready_err!(call_to("/a").poll());
    let refused_b = assert_ready_err!(call_to("/b").poll());
    for err in [refused_a, refused_b] {
        assert_eq!(
            err.downcast_ref::<BulkheadFull>().unwrap().waited(),
            Duration::ZERO
        );
    }
    for key in ["/a", "/b"] {
        let stats = handle.get(&key.to_owned()).unwrap();
        assert_eq!((stats.in_flight(), stats.waiting()), (1, 1), "{key}");
        assert_eq!(stats.rejected(), 1, "{key}");
    }
    drop(held);
    for key in ["/a", "/b"] {
        let stats = handle.get(&key.to_owned()).unwrap();
        assert_eq!((stats.in_flight(), stats.waiting()), (0, 0), "{key}");
    }
}
