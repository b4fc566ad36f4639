//! Through a real gRPC server on 127.0.0.1 and a tonic `Channel` wrapped by
//! `client_stack(..).tonic(channel)`: every failure of the stack reaches
//! the client as the right `Status` (an open circuit as UNAVAILABLE with
//! retry information, without calling the server; a full bulkhead as
//! RESOURCE_EXHAUSTED; a passed deadline as DEADLINE_EXCEEDED), and a
//! retried unary call sends the same message again.
//!
//! The service is written by hand with `tonic::server::Grpc` and a prost
//! message, and called with `tonic::client::Grpc`, which is what
//! generated code does.
#![cfg(feature = "tonic")]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::PathAndQuery;
use tokio::sync::{Notify, Semaphore};
use tonic::server::{NamedService, UnaryService};
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Status};
use tonic_prost::ProstCodec;
use tower_breaker::error::CircuitOpen;
use tower_breaker::{Breaker, BreakerConfig};
use tower_service::Service;
use tower_shield::stack::{client_stack, ClientStack};
use tower_shield::tonic::TonicStack;

// ------------------------------------------------------------------ messages

#[derive(Clone, PartialEq, prost::Message)]
struct Order {
    #[prost(string, tag = "1")]
    sku: String,
    #[prost(uint32, tag = "2")]
    quantity: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Receipt {
    #[prost(uint32, tag = "1")]
    attempt: u32,
}

// ------------------------------------------------------------------ server

const HEALTHY: u8 = 0;
/// Every call fails with UNAVAILABLE.
const DOWN: u8 = 1;
/// The first attempt of each order fails with UNAVAILABLE.
const FLAKY: u8 = 2;
/// Calls wait for a permit of `gate` before answering.
const HOLD: u8 = 3;
/// Every call fails with NOT_FOUND and a metadata entry.
const NOT_FOUND: u8 = 4;

struct Shop {
    mode: AtomicU8,
    calls: AtomicUsize,
    /// Every order received, with its `grpc-previous-rpc-attempts`.
    received: Mutex<Vec<(Order, Option<String>)>>,
    gate: Semaphore,
    entered: Notify,
}

impl Shop {
    fn new(mode: u8) -> Self {
        Self {
            mode: AtomicU8::new(mode),
            calls: AtomicUsize::new(0),
            received: Mutex::new(Vec::new()),
            gate: Semaphore::new(0),
            entered: Notify::new(),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    async fn order(&self, request: tonic::Request<Order>) -> Result<Receipt, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let previous = request
            .metadata()
            .get("grpc-previous-rpc-attempts")
            .map(|v| v.to_str().unwrap().to_owned());
        let order = request.into_inner();
        let attempt = previous
            .as_deref()
            .map_or(1, |p| p.parse::<u32>().unwrap() + 1);
        let first = {
            let mut received = self.received.lock().unwrap();
            let first = received.iter().all(|(o, _)| o.sku != order.sku);
            received.push((order, previous));
            first
        };
        match self.mode.load(Ordering::SeqCst) {
            DOWN => Err(Status::unavailable("shop database down")),
            FLAKY if first => Err(Status::unavailable("restarting")),
            HOLD => {
                self.entered.notify_one();
                self.gate.acquire().await.unwrap().forget();
                Ok(Receipt { attempt })
            }
            NOT_FOUND => {
                let mut status = Status::not_found("no such sku");
                status
                    .metadata_mut()
                    .insert("x-shard", "7".parse().unwrap());
                Err(status)
            }
            _ => Ok(Receipt { attempt }),
        }
    }
}

/// The server side of `test.Shop/Order`, as generated code would be.
#[derive(Clone)]
struct ShopServer(Arc<Shop>);

impl NamedService for ShopServer {
    const NAME: &'static str = "test.Shop";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl Service<http::Request<tonic::body::Body>> for ShopServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let shop = self.0.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<Receipt, Order>::default());
            if request.uri().path() == "/test.Shop/Watch" {
                return Ok(grpc.server_streaming(WatchHandler, request).await);
            }
            Ok(grpc.unary(OrderHandler(shop), request).await)
        })
    }
}

struct OrderHandler(Arc<Shop>);

impl UnaryService<Order> for OrderHandler {
    type Response = Receipt;
    type Future = BoxFuture<Result<tonic::Response<Receipt>, Status>>;

    fn call(&mut self, request: tonic::Request<Order>) -> Self::Future {
        let shop = self.0.clone();
        Box::pin(async move { shop.order(request).await.map(tonic::Response::new) })
    }
}

/// `test.Shop/Watch`, a server stream: one receipt, then, by the order's
/// sku, nothing ever (`stall`), an UNAVAILABLE in the trailers (`fail`), or
/// two more receipts and the end.
struct WatchHandler;

type ReceiptStream = Pin<Box<dyn futures_util::Stream<Item = Result<Receipt, Status>> + Send>>;

impl tonic::server::ServerStreamingService<Order> for WatchHandler {
    type Response = Receipt;
    type ResponseStream = ReceiptStream;
    type Future = BoxFuture<Result<tonic::Response<ReceiptStream>, Status>>;

    fn call(&mut self, request: tonic::Request<Order>) -> Self::Future {
        use futures_util::stream::{self, StreamExt};
        let sku = request.into_inner().sku;
        Box::pin(async move {
            let first = stream::once(async { Ok(Receipt { attempt: 1 }) });
            let rest: ReceiptStream = match sku.as_str() {
                "stall" => Box::pin(first.chain(stream::pending())),
                "fail" => Box::pin(first.chain(stream::once(async {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    Err(Status::unavailable("feed lost"))
                }))),
                _ => Box::pin(first.chain(stream::iter([
                    Ok(Receipt { attempt: 2 }),
                    Ok(Receipt { attempt: 3 }),
                ]))),
            };
            Ok(tonic::Response::new(rest))
        })
    }
}

async fn start(mode: u8) -> (SocketAddr, Arc<Shop>) {
    let shop = Arc::new(Shop::new(mode));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let server = ShopServer(shop.clone());
    tokio::spawn(async move {
        Server::builder()
            .add_service(server)
            .serve_with_incoming(incoming)
            .await
    });
    (addr, shop)
}

// ------------------------------------------------------------------ client

type Client = tonic::client::Grpc<TonicStack<Channel>>;

async fn connect(addr: SocketAddr, stack: &ClientStack) -> Client {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    tonic::client::Grpc::new(stack.tonic(channel))
}

/// Calls `test.Shop/Order` as a generated client would; `idempotent`
/// orders carry an `idempotency-key`, so the retry layer may repeat them.
async fn order(client: &mut Client, sku: &str, idempotent: bool) -> Result<Receipt, Status> {
    client.ready().await?;
    let mut request = tonic::Request::new(Order {
        sku: sku.into(),
        quantity: 3,
    });
    if idempotent {
        request
            .metadata_mut()
            .insert("idempotency-key", sku.parse().unwrap());
    }
    let path = PathAndQuery::from_static("/test.Shop/Order");
    let codec = ProstCodec::<Order, Receipt>::default();
    client
        .unary(request, path, codec)
        .await
        .map(tonic::Response::into_inner)
}

/// Opens `test.Shop/Watch` for `sku`, as a generated client would.
async fn watch(client: &mut Client, sku: &str) -> Result<tonic::codec::Streaming<Receipt>, Status> {
    client.ready().await?;
    let request = tonic::Request::new(Order {
        sku: sku.into(),
        quantity: 1,
    });
    let path = PathAndQuery::from_static("/test.Shop/Watch");
    let codec = ProstCodec::<Order, Receipt>::default();
    client
        .server_streaming(request, path, codec)
        .await
        .map(tonic::Response::into_inner)
}

fn metadata<'a>(status: &'a Status, key: &str) -> Option<&'a str> {
    status.metadata().get(key).map(|v| v.to_str().unwrap())
}

// ------------------------------------------------------------------ tests

#[tokio::test]
async fn open_circuit_answers_unavailable_with_retry_info_without_calling_the_server() {
    let (addr, shop) = start(DOWN).await;
    let breaker = Breaker::with_config(
        "shop",
        BreakerConfig::new()
            .count_window(4)
            .minimum_calls(4)
            .open_period(Duration::from_secs(30)),
    );
    let stack = client_stack("shop").breaker(breaker.clone());
    let mut client = connect(addr, &stack).await;

    // The server's own UNAVAILABLE, four times: the circuit opens.
    for i in 0..4 {
        let status = order(&mut client, &format!("down-{i}"), false)
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.message(), "shop database down");
    }
    assert_eq!(shop.calls(), 4);
    assert_eq!(breaker.snapshot().totals.opened, 1);

    // Now the breaker answers, and the server is not called.
    let status = order(&mut client, "refused", false).await.unwrap_err();
    assert_eq!(shop.calls(), 4, "the open circuit did not call the server");
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        status.message().contains("circuit `shop` is open"),
        "{}",
        status.message()
    );
    let pushback: u64 = metadata(&status, "grpc-retry-pushback-ms")
        .expect("retry information")
        .parse()
        .unwrap();
    // The open period is 30 s with its jitter of +-10%.
    assert!(
        (1..=33_000).contains(&pushback),
        "until the next probe: {pushback}"
    );
    assert_eq!(metadata(&status, "x-tower-no-retry"), Some("1"));
    let source = std::error::Error::source(&status).expect("the typed error");
    assert_eq!(
        source.downcast_ref::<CircuitOpen>().unwrap().breaker(),
        "shop"
    );
    assert_eq!(breaker.snapshot().totals.rejected, 1);
}

#[tokio::test]
async fn full_bulkhead_answers_resource_exhausted() {
    let (addr, shop) = start(HOLD).await;
    let stack = client_stack("shop").concurrency(1);
    let mut client = connect(addr, &stack).await;

    // One call in flight fills the compartment.
    let mut first = client.clone();
    let held = tokio::spawn(async move { order(&mut first, "held", false).await });
    shop.entered.notified().await;

    let status = order(&mut client, "second", false).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("is full"), "{}", status.message());
    assert_eq!(metadata(&status, "grpc-retry-pushback-ms"), Some("1000"));
    assert_eq!(metadata(&status, "x-tower-no-retry"), Some("1"));
    assert_eq!(shop.calls(), 1, "the refused call did not reach the server");

    // The held call completes, and the slot is free again.
    shop.gate.add_permits(2);
    assert_eq!(held.await.unwrap().unwrap().attempt, 1);
    order(&mut client, "third", false).await.unwrap();
    assert_eq!(shop.calls(), 2);
}

#[tokio::test]
async fn passed_deadline_answers_deadline_exceeded() {
    let (addr, shop) = start(HOLD).await;
    let stack = client_stack("shop").timeout(Duration::from_millis(200));
    let mut client = connect(addr, &stack).await;

    let status = order(&mut client, "slow", false).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert!(
        status.message().contains("deadline exceeded"),
        "{}",
        status.message()
    );
    assert_eq!(shop.calls(), 1, "the server was called, then cut off");
    // Cut off by the caller's deadline: not a reason to refuse retries above.
    assert_eq!(metadata(&status, "x-tower-no-retry"), None);
}

#[tokio::test]
async fn retried_unary_call_replays_the_same_message() {
    let (addr, shop) = start(FLAKY).await;
    let stack = client_stack("shop");
    let mut client = connect(addr, &stack).await;

    let receipt = order(&mut client, "pears", true).await.unwrap();
    assert_eq!(receipt.attempt, 2);
    let received = shop.received.lock().unwrap().clone();
    let sent = Order {
        sku: "pears".into(),
        quantity: 3,
    };
    assert_eq!(
        received,
        vec![(sent.clone(), None), (sent, Some("1".to_owned()))],
        "the same message on both attempts, the second one numbered"
    );
    assert_eq!(stack.retry_counters().retries, 1);
    let totals = stack.breaker_handle().snapshot().totals;
    assert_eq!(
        (totals.failed, totals.successful),
        (1, 1),
        "every attempt counted"
    );
}

#[tokio::test]
async fn server_status_reaches_the_client_unchanged() {
    let (addr, shop) = start(NOT_FOUND).await;
    let stack = client_stack("shop");
    let mut client = connect(addr, &stack).await;

    let status = order(&mut client, "kiwis", true).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    assert_eq!(status.message(), "no such sku");
    assert_eq!(metadata(&status, "x-shard"), Some("7"));
    assert_eq!(metadata(&status, "x-tower-no-retry"), None);
    assert_eq!(shop.calls(), 1, "NOT_FOUND is not retried");
    let totals = stack.breaker_handle().snapshot().totals;
    assert_eq!(totals.failed, 0, "NOT_FOUND describes the caller");
}

#[tokio::test]
async fn unreachable_server_answers_unavailable() {
    // A port that was free a moment ago: connections are refused.
    let addr = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    };
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let stack = client_stack("shop");
    let mut client = tonic::client::Grpc::new(stack.tonic(channel));

    let status = order(&mut client, "figs", true).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(stack.breaker_handle().snapshot().totals.failed >= 1);
}

#[tokio::test]
async fn healthy_server_answers_through_the_stack() {
    let (addr, shop) = start(HEALTHY).await;
    let stack = client_stack("shop");
    let mut client = connect(addr, &stack).await;

    let receipt = order(&mut client, "plums", true).await.unwrap();
    assert_eq!(receipt.attempt, 1);
    assert_eq!(shop.calls(), 1);
    assert_eq!(stack.breaker_handle().snapshot().totals.successful, 1);
}

// --------------------------------------------------------- server streams

#[tokio::test]
async fn a_server_stream_that_stalls_fails_at_the_deadline_and_counts_a_failure() {
    let (addr, _shop) = start(HEALTHY).await;
    let deadline = Duration::from_millis(300);
    let stack = client_stack("watch-stall").timeout(deadline);
    let (breaker, bulkhead) = (stack.breaker_handle().clone(), stack.bulkhead_handle());
    let mut client = connect(addr, &stack).await;

    let start = tokio::time::Instant::now();
    let mut stream = watch(&mut client, "stall").await.unwrap();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.attempt, 1);
    assert_eq!(bulkhead.in_flight(), 1, "the stream is still open");
    let status = stream.message().await.unwrap_err();
    let elapsed = start.elapsed();
    println!("stalled stream cut after {elapsed:?} (deadline {deadline:?})");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(elapsed >= deadline, "cut early: {elapsed:?}");
    assert!(
        elapsed < deadline + Duration::from_secs(2),
        "cut late: {elapsed:?}"
    );
    let s = breaker.snapshot();
    assert_eq!((s.totals.successful, s.totals.failed), (0, 1));
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test]
async fn a_grpc_error_in_the_trailers_after_messages_counts_a_failure() {
    let (addr, _shop) = start(HEALTHY).await;
    let stack = client_stack("watch-fail").timeout(Duration::from_secs(5));
    let breaker = stack.breaker_handle().clone();
    let mut client = connect(addr, &stack).await;

    let mut stream = watch(&mut client, "fail").await.unwrap();
    assert_eq!(stream.message().await.unwrap().unwrap().attempt, 1);
    let status = stream.message().await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "feed lost");
    let s = breaker.snapshot();
    assert_eq!((s.totals.successful, s.totals.failed), (0, 1));

    // A stream that ends well counts a success at its end.
    let mut stream = watch(&mut client, "all").await.unwrap();
    let mut received = Vec::new();
    while let Some(receipt) = stream.message().await.unwrap() {
        received.push(receipt.attempt);
    }
    assert_eq!(received, [1, 2, 3]);
    let s = breaker.snapshot();
    assert_eq!((s.totals.successful, s.totals.failed), (1, 1));
}

#[tokio::test]
async fn a_server_stream_dropped_half_read_frees_the_bulkhead_slot() {
    let (addr, _shop) = start(HEALTHY).await;
    let stack = client_stack("watch-drop").timeout(Duration::from_secs(5));
    let bulkhead = stack.bulkhead_handle();
    let mut client = connect(addr, &stack).await;

    let mut stream = watch(&mut client, "stall").await.unwrap();
    stream.message().await.unwrap().unwrap();
    assert_eq!(bulkhead.in_flight(), 1);
    drop(stream);
    assert_eq!(bulkhead.in_flight(), 0);
}
