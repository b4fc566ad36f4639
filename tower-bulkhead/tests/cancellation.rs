//! Every way a call can end gives its slot back: completion, error, a
//! dropped future, a dropped service, and in body mode a dropped body.

mod support;

use bytes::Bytes;
use http_body_util::BodyExt;
use support::{request, Gate};
use tokio_test::assert_ready_ok;
use tower::{Service, ServiceExt};
use tower_bulkhead::{BulkheadLayer, HttpBulkheadLayer};
use tower_layer::Layer;
use tower_test::mock;

const N: usize = 4;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn dropping_in_flight_futures_frees_the_full_capacity_at_once() {
    let gate = Gate::new();
    let layer = BulkheadLayer::new("dep", N);
    let mut service = layer.layer(gate.service());

    let mut futures = Vec::new();
    for _ in 0..N {
        let mut f = tokio_test::task::spawn(service.ready().await.unwrap().call(request()));
        assert!(f.poll().is_pending());
        futures.push(f);
    }
    assert_eq!(layer.handle().in_flight(), N);
    let err = service.ready().await.unwrap().call(request()).await;
    assert!(err.is_err(), "full before the drop");

    drop(futures);
    assert_eq!(layer.handle().in_flight(), 0);
    assert_eq!(gate.current(), 0, "the inner calls were cancelled too");

    // The whole capacity is there again, without any time passing.
    let mut again = Vec::new();
    for _ in 0..N {
        let mut f = tokio_test::task::spawn(service.ready().await.unwrap().call(request()));
        assert!(f.poll().is_pending());
        again.push(f);
    }
    assert_eq!(gate.current(), N);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn futures_that_were_never_polled_release_when_dropped() {
    let gate = Gate::new();
    let layer = BulkheadLayer::new("dep", N);
    let mut service = layer.layer(gate.service());
    let futures: Vec<_> = (0..N).map(|_| service.call(request())).collect::<Vec<_>>();
    assert_eq!(layer.handle().in_flight(), N);
    drop(futures);
    assert_eq!(layer.handle().in_flight(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn dropping_the_service_leaves_in_flight_calls_holding_their_slots() {
    let gate = Gate::new();
    let layer = BulkheadLayer::new("dep", 2);
    let mut service = layer.layer(gate.service());
    let call = tokio::spawn(service.ready().await.unwrap().call(request()));
    drop(service);
    tokio::task::yield_now().await;
    assert_eq!(layer.handle().in_flight(), 1);
    gate.open(1);
    call.await.unwrap().unwrap();
    assert_eq!(layer.handle().in_flight(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn head_mode_releases_when_the_response_head_is_ready() {
    let layer = HttpBulkheadLayer::new("dep", 1);
    let (mut service, mut handle) =
        mock::spawn_layer::<support::Request, http::Response<String>, _>(layer.clone());
    assert_ready_ok!(service.poll_ready());
    let mut response = tokio_test::task::spawn(service.call(request()));
    let (_, send) = handle.next_request().await.unwrap();
    send.send_response(http::Response::new("streaming".to_owned()));
    let response = assert_ready_ok!(response.poll());
    assert_eq!(layer.handle().in_flight(), 0);
    drop(response);
}

/// A response body whose frames the test sends through a channel.
#[derive(Default)]
struct ChannelBody(Option<tokio::sync::mpsc::Receiver<Bytes>>);

fn channel_body() -> (tokio::sync::mpsc::Sender<Bytes>, ChannelBody) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    (tx, ChannelBody(Some(rx)))
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        match self.0.as_mut() {
            Some(rx) => rx
                .poll_recv(cx)
                .map(|next| next.map(|data| Ok(http_body::Frame::data(data)))),
            None => std::task::Poll::Ready(None),
        }
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn body_mode_holds_the_slot_until_a_half_read_body_is_dropped() {
    let layer = HttpBulkheadLayer::new("stream", N).hold_until_body_end();
    let (mock, mut handle) = mock::pair::<support::Request, http::Response<ChannelBody>>();
    let mut service = layer.layer(mock);

    let mut bodies = Vec::new();
    let mut senders = Vec::new();
    for _ in 0..N {
        let call = service.ready().await.unwrap().call(request());
        let (_, send) = handle.next_request().await.unwrap();
        let (tx, body) = channel_body();
        send.send_response(http::Response::new(body));
        let mut body = call.await.unwrap().into_body();
        assert!(body.holds_permit());
        // Read half of it: one frame of two.
        tx.send(Bytes::from_static(b"half")).await.unwrap();
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "half");
        senders.push(tx);
        bodies.push(body);
    }
    assert_eq!(
        layer.handle().in_flight(),
        N,
        "the response heads are out, the bodies are not"
    );
    let answer = service
        .ready()
        .await
        .unwrap()
        .call(request())
        .await
        .unwrap();
    assert_eq!(answer.status(), http::StatusCode::SERVICE_UNAVAILABLE);

    drop(bodies);
    assert_eq!(layer.handle().in_flight(), 0);
    drop(senders);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn body_mode_releases_when_the_body_is_read_to_its_end() {
    let layer = HttpBulkheadLayer::new("stream", 1).hold_until_body_end();
    let (mock, mut handle) = mock::pair::<support::Request, http::Response<ChannelBody>>();
    let mut service = layer.layer(mock);

    let call = service.ready().await.unwrap().call(request());
    let (_, send) = handle.next_request().await.unwrap();
    let (tx, body) = channel_body();
    send.send_response(http::Response::new(body));
    let mut body = call.await.unwrap().into_body();

    tx.send(Bytes::from_static(b"a")).await.unwrap();
    body.frame().await.unwrap().unwrap();
    assert_eq!(layer.handle().in_flight(), 1);
    drop(tx);
    assert!(body.frame().await.is_none());
    assert!(!body.holds_permit());
    assert_eq!(
        layer.handle().in_flight(),
        0,
        "released at the end, before the drop"
    );
    drop(body);
}

// --- the client bulkhead in body mode ---

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn client_body_mode_counts_a_call_until_its_body_ends_and_refuses_meanwhile() {
    let layer = BulkheadLayer::new("catalog", 1).hold_until_body_end();
    let (mock, mut handle) = mock::pair::<support::Request, http::Response<ChannelBody>>();
    let mut service = layer.layer(mock);

    let call = service.ready().await.unwrap().call(request());
    let (_, send) = handle.next_request().await.unwrap();
    let (tx, body) = channel_body();
    send.send_response(http::Response::new(body));
    let mut body = call.await.unwrap().into_body();
    assert!(body.holds_permit());
    assert_eq!(
        layer.handle().in_flight(),
        1,
        "the head is out, the body is not"
    );

    // The only slot is held by the body being read: the next call is refused.
    let refused = service
        .ready()
        .await
        .unwrap()
        .call(request())
        .await
        .unwrap_err();
    assert!(refused.is::<tower_bulkhead::error::BulkheadFull>());

    tx.send(Bytes::from_static(b"items")).await.unwrap();
    body.frame().await.unwrap().unwrap();
    drop(tx);
    assert!(body.frame().await.is_none());
    assert_eq!(layer.handle().in_flight(), 0, "released at the body's end");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn client_body_mode_frees_the_slot_of_a_half_read_body_when_it_is_dropped() {
    let layer = BulkheadLayer::new("catalog", N).hold_until_body_end();
    let (mock, mut handle) = mock::pair::<support::Request, http::Response<ChannelBody>>();
    let mut service = layer.layer(mock);

    let call = service.ready().await.unwrap().call(request());
    let (_, send) = handle.next_request().await.unwrap();
    let (tx, body) = channel_body();
    send.send_response(http::Response::new(body));
    let mut body = call.await.unwrap().into_body();
    tx.send(Bytes::from_static(b"half")).await.unwrap();
    body.frame().await.unwrap().unwrap();
    assert_eq!(layer.handle().in_flight(), 1);
    drop(body);
    assert_eq!(layer.handle().in_flight(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn client_head_mode_releases_the_slot_with_the_head() {
    let layer = BulkheadLayer::new("catalog", 1);
    let (mock, mut handle) = mock::pair::<support::Request, http::Response<ChannelBody>>();
    let mut service = layer.layer(mock);

    let call = service.ready().await.unwrap().call(request());
    let (_, send) = handle.next_request().await.unwrap();
    let (_tx, body) = channel_body();
    send.send_response(http::Response::new(body));
    let response = call.await.unwrap();
    assert_eq!(
        layer.handle().in_flight(),
        0,
        "head mode: released at the head"
    );
    drop(response);
}
