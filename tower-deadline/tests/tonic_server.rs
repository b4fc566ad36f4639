//! Under tonic's `Server`, which runs its own `grpc-timeout` timer outside
//! our layer, the caller must see DEADLINE_EXCEEDED (our answer), not
//! CANCELLED (tonic's).
//!
//! Real sockets on 127.0.0.1; the assertions are about which status comes
//! back, not about timings.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::transport::Server;
use tower_deadline::ServerDeadlineLayer;
use tower_service::Service;

/// A gRPC service that never answers in time.
#[derive(Clone)]
struct Hanging;

impl NamedService for Hanging {
    const NAME: &'static str = "test.Hanging";
}

impl Service<Request<Body>> for Hanging {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<Body>) -> Self::Future {
        Box::pin(async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(Response::new(Body::empty()))
        })
    }
}

/// A plain HTTP/2 client: tonic's `Channel` would run a `grpc-timeout`
/// timer of its own and race the server's answer.
type H2 = Client<HttpConnector, Full<Bytes>>;

async fn start(with_layer: bool) -> (H2, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(async move {
        if with_layer {
            Server::builder()
                .layer(ServerDeadlineLayer::new())
                .add_service(Hanging)
                .serve_with_incoming(incoming)
                .await
        } else {
            Server::builder()
                .add_service(Hanging)
                .serve_with_incoming(incoming)
                .await
        }
    });
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    (client, format!("http://{addr}/test.Hanging/Call"))
}

/// Sends a raw unary gRPC request with `grpc-timeout: 50m` and returns the
/// `grpc-status` of the trailers-only answer.
async fn grpc_status((client, uri): &(H2, String)) -> String {
    let request = Request::post(uri.as_str())
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "50m")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client.request(request).await.unwrap();
    response
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_alone_answers_cancelled() {
    // The baseline this crate fixes: tonic's own timer answers CANCELLED (1).
    let server = start(false).await;
    assert_eq!(grpc_status(&server).await, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_layer_every_expiry_is_deadline_exceeded() {
    let server = start(true).await;
    // Repeat, since the two timers race by design: every answer must be ours.
    for i in 0..20 {
        assert_eq!(grpc_status(&server).await, "4", "request {i}");
    }
}
