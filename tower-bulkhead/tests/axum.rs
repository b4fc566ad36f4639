//! End to end over real sockets on 127.0.0.1: an axum app with the HTTP
//! bulkhead. These tests assert the order of events, never tight timings.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use http::header::RETRY_AFTER;
use http::StatusCode;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tower_bulkhead::{HttpBulkhead, HttpBulkheadLayer, NO_RETRY_HEADER};
use tower_layer::Layer;
use tower_service::Service;

const N: usize = 4;
const K: usize = 6;
/// Generous: the rejected requests come back in far less on any machine.
const FAST: Duration = Duration::from_secs(5);

/// A handler that counts the requests reaching it and holds them until the
/// test opens the gate.
#[derive(Clone)]
struct Slow {
    reached: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
}

impl Default for Slow {
    fn default() -> Self {
        Self {
            reached: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }
}

impl Slow {
    fn router(&self) -> Router {
        let slow = self.clone();
        Router::new().route(
            "/",
            get(move || {
                let slow = slow.clone();
                async move {
                    slow.reached.fetch_add(1, Ordering::SeqCst);
                    slow.gate.acquire().await.unwrap().forget();
                    "done"
                }
            }),
        )
    }

    fn reached(&self) -> usize {
        self.reached.load(Ordering::SeqCst)
    }

    async fn wait_until_reached(&self, n: usize) {
        while self.reached() < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// One GET on a connection of its own; the status and headers.
async fn get_on_new_connection(addr: SocketAddr) -> (StatusCode, http::HeaderMap) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = http::Request::get(format!("http://{addr}/"))
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    (response.status(), response.headers().clone())
}

async fn bind() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_n_reach_the_handler_and_the_rest_get_a_fast_503() {
    let slow = Slow::default();
    let layer = HttpBulkheadLayer::new("api", N);
    let handle = layer.handle();
    let app = slow.router().layer(layer);
    let (listener, addr) = bind().await;
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    // N + K requests at once, each on its own connection.
    let (tx, mut answers) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..N + K {
        let tx = tx.clone();
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let answer = get_on_new_connection(addr).await;
            let _ = tx.send((answer, started.elapsed()));
        });
    }

    // The K rejections come back while the N admitted requests are still
    // held in the handler.
    for _ in 0..K {
        let ((status, headers), took) = answers.recv().await.unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(headers[RETRY_AFTER], "1");
        assert_eq!(headers[NO_RETRY_HEADER], "1");
        assert!(took < FAST, "a rejection took {took:?}");
    }
    slow.wait_until_reached(N).await;
    assert_eq!(slow.reached(), N);
    assert_eq!(handle.in_flight(), N);
    assert!(
        answers.try_recv().is_err(),
        "no admitted request has finished yet"
    );

    slow.gate.add_permits(N);
    for _ in 0..N {
        let ((status, _), _) = answers.recv().await.unwrap();
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(
        slow.reached(),
        N,
        "no rejected request ever reached the handler"
    );
    assert_eq!(handle.rejected(), K as u64);
    assert_eq!(handle.in_flight(), 0);
    server.abort();
}

/// A make-service that wraps the router anew for every connection, calling
/// `Layer::layer` once per connection.
#[derive(Clone)]
struct PerConnection {
    layer: HttpBulkheadLayer,
    router: Router,
    layered: Arc<AtomicUsize>,
}

impl<'a> Service<axum::serve::IncomingStream<'a, TcpListener>> for PerConnection {
    type Response = HttpBulkhead<Router>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _conn: axum::serve::IncomingStream<'a, TcpListener>) -> Self::Future {
        self.layered.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(self.layer.layer(self.router.clone())))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_on_different_connections_share_one_compartment() {
    let slow = Slow::default();
    let layer = HttpBulkheadLayer::new("api", N);
    let handle = layer.handle();
    let layered = Arc::new(AtomicUsize::new(0));
    let make = PerConnection {
        layer,
        router: slow.router(),
        layered: layered.clone(),
    };
    let (listener, addr) = bind().await;
    let server = tokio::spawn(async move { axum::serve(listener, make).await.unwrap() });

    let admitted: Vec<_> = (0..N)
        .map(|_| tokio::spawn(get_on_new_connection(addr)))
        .collect();
    slow.wait_until_reached(N).await;
    assert_eq!(handle.in_flight(), N);

    // One more connection: its own service, the same compartment.
    let (status, _) = get_on_new_connection(addr).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        layered.load(Ordering::SeqCst),
        N + 1,
        "one layer call per connection"
    );

    slow.gate.add_permits(N);
    for call in admitted {
        assert_eq!(call.await.unwrap().0, StatusCode::OK);
    }
    assert_eq!(slow.reached(), N);
    server.abort();
}
