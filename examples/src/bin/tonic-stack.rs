//! A tonic client whose `Channel` is wrapped in the client stack in one
//! call, `client_stack("stock").tonic(channel)` (feature `tonic` of
//! `tower-breaker`), against a small gRPC service on 127.0.0.1.
//!
//! The service (`proto/stock.proto`, compiled in `build.rs` by protox, a
//! protobuf compiler in Rust: no `protoc` needed) runs behind
//! `ServerDeadlineLayer`. The client stack is `ClientDeadline -> Breaker ->
//! Retry (budget, buffered bodies) -> Bulkhead -> ClientDeadline (per
//! attempt) -> Channel`; `ClientStack::tonic` hands the retry layer's
//! replayable body to the channel and turns the layers' errors into gRPC
//! statuses (`tower_shield::tonic::into_status`), so the generated client
//! takes it as it is. tonic's `Request::set_timeout` writes `grpc-timeout`,
//! which the outer `ClientDeadlineLayer` takes as one more deadline (the
//! earliest wins). It shows:
//!
//! 1. `grpc-timeout` propagated: the client's 1500 ms deadline arrives at
//!    the server as what is left of it;
//! 2. a unary call retried after UNAVAILABLE, its encoded body replayed
//!    (the server sees the same message on both attempts);
//! 3. the breaker counting every attempt, opening on UNAVAILABLE, and then
//!    answering UNAVAILABLE in microseconds without calling the server,
//!    with `grpc-retry-pushback-ms` saying when it will probe.
//!
//! Run it with:
//!
//! ```text
//! cargo run -p examples --bin tonic-stack
//! ```

use examples::demo::check;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status};
use tower::BoxError;
use tower_breaker::{Breaker, BreakerConfig};
use tower_deadline::{codec, ServerDeadlineLayer};
use tower_shield::stack::client_stack;

/// The code generated from `proto/stock.proto`.
mod stock {
    #![allow(missing_docs, unreachable_pub, missing_debug_implementations)]
    #![allow(clippy::all)]
    tonic::include_proto!("stock");
}

use stock::stock_client::StockClient;
use stock::stock_server::{Stock, StockServer};
use stock::{ReserveReply, ReserveRequest};

// ------------------------------------------------------------------ server

const HEALTHY: u8 = 0;
const FLAKY: u8 = 1;
const DOWN: u8 = 2;

/// The gRPC service: healthy, flaky (the first attempt of each request
/// fails with UNAVAILABLE) or down (every call fails with UNAVAILABLE).
#[derive(Default)]
struct StockService {
    mode: Arc<AtomicU8>,
    calls: Arc<AtomicUsize>,
    seen: Mutex<HashSet<String>>,
}

#[tonic::async_trait]
impl Stock for StockService {
    async fn reserve(
        &self,
        request: Request<ReserveRequest>,
    ) -> Result<Response<ReserveReply>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let budget_ms = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| codec::parse_grpc_timeout(v.as_bytes()).ok())
            .map_or(0, |d| d.as_millis() as u64);
        let attempt = request
            .metadata()
            .get("grpc-previous-rpc-attempts")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u32>().ok())
            .map_or(1, |earlier| earlier + 1);
        let message = request.into_inner();
        match self.mode.load(Ordering::SeqCst) {
            DOWN => Err(Status::unavailable("stock database down")),
            FLAKY => {
                println!(
                    "     server: attempt {attempt} got sku={} quantity={} request_id={}",
                    message.sku, message.quantity, message.request_id
                );
                let first = self
                    .seen
                    .lock()
                    .expect("not poisoned")
                    .insert(message.request_id.clone());
                if first {
                    Err(Status::unavailable("restarting, try again"))
                } else {
                    Ok(Response::new(ReserveReply {
                        reserved: true,
                        budget_ms,
                        attempt,
                    }))
                }
            }
            _ => Ok(Response::new(ReserveReply {
                reserved: true,
                budget_ms,
                attempt,
            })),
        }
    }
}

async fn start_server(service: StockService) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local address");
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(async move {
        Server::builder()
            .layer(ServerDeadlineLayer::new().max_timeout(Duration::from_secs(10)))
            .add_service(StockServer::new(service))
            .serve_with_incoming(incoming)
            .await
    });
    addr
}

// ------------------------------------------------------------------ client

fn reserve(sku: &str, request_id: &str) -> Request<ReserveRequest> {
    let mut request = Request::new(ReserveRequest {
        sku: sku.into(),
        quantity: 3,
        request_id: request_id.into(),
    });
    // gRPC calls are POSTs: the retry layer repeats them only when they
    // say they are idempotent. Reserve is idempotent per request id.
    if let Ok(key) = request_id.parse() {
        request.metadata_mut().insert("idempotency-key", key);
    }
    request
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mode = Arc::new(AtomicU8::new(HEALTHY));
    let calls = Arc::new(AtomicUsize::new(0));
    let addr = start_server(StockService {
        mode: mode.clone(),
        calls: calls.clone(),
        ..StockService::default()
    })
    .await;
    let mut failures = Vec::new();

    let channel: Channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_millis(200))
        .connect()
        .await?;
    let breaker = Breaker::with_config(
        "stock",
        BreakerConfig::new()
            .count_window(10)
            .minimum_calls(6)
            .open_period(Duration::from_secs(5)),
    );
    let resilience = client_stack("stock")
        .breaker(breaker.clone())
        .timeout(Duration::from_secs(2)) // or tonic's set_timeout, if shorter
        .concurrency(16);
    // Deadline, breaker, retry (replayable bodies), bulkhead, per-attempt
    // deadline (which writes grpc-timeout), errors as `Status`: one call.
    let stack = resilience.tonic(channel);
    let mut client = StockClient::new(stack);

    println!("1. grpc-timeout propagated: a call with a 1500 ms deadline");
    let mut request = reserve("apples", "r-1");
    request.set_timeout(Duration::from_millis(1500));
    let reply = client.reserve(request).await?.into_inner();
    println!(
        "   reserved: {}, the server saw grpc-timeout = {} ms",
        reply.reserved, reply.budget_ms
    );
    check(
        reply.reserved && (1000..=1500).contains(&reply.budget_ms),
        "the remaining budget reached the server",
        &mut failures,
    );

    println!("\n2. UNAVAILABLE once: the unary call is retried, its body replayed");
    mode.store(FLAKY, Ordering::SeqCst);
    let reply = client.reserve(reserve("pears", "r-2")).await?.into_inner();
    println!(
        "   reserved: {}, answered by attempt {}",
        reply.reserved, reply.attempt
    );
    check(
        reply.reserved && reply.attempt == 2 && resilience.retry_counters().retries == 1,
        "retried once, the same message on both attempts",
        &mut failures,
    );

    println!("\n3. The server is down: UNAVAILABLE on every call");
    mode.store(DOWN, Ordering::SeqCst);
    let before = calls.load(Ordering::SeqCst);
    let mut last = None;
    for i in 1..=5 {
        let start = Instant::now();
        let result = client.reserve(reserve("plums", &format!("r-3-{i}"))).await;
        let took = start.elapsed();
        let code = result.as_ref().err().map_or(Code::Ok, Status::code);
        let message = result.as_ref().err().map(|s| s.message().to_owned());
        // An open circuit says when it will probe, in gRPC's own words.
        let pushback = result.as_ref().err().and_then(|s| {
            let v = s.metadata().get("grpc-retry-pushback-ms")?;
            v.to_str().ok()?.parse::<i64>().ok()
        });
        println!(
            "   call {i}: {code:?} after {:>6} us: {}{}",
            took.as_micros(),
            message.unwrap_or_default(),
            match pushback {
                Some(ms) if ms < 0 => " (pushback: do not retry)".to_owned(),
                Some(ms) => format!(" (pushback: retry in {ms} ms)"),
                None => String::new(),
            }
        );
        last = Some((code, took, pushback));
    }
    let reached = calls.load(Ordering::SeqCst) - before;
    let s = breaker.snapshot();
    println!(
        "   the server was called {reached} times for 5 calls; {} attempt failures counted, {} rejected",
        s.totals.failed, s.totals.rejected
    );
    let (code, took, pushback) = last.expect("five calls");
    check(
        s.totals.opened == 1
            && code == Code::Unavailable
            && took < Duration::from_millis(5)
            && pushback.is_some_and(|ms| (1..=5500).contains(&ms))
            && reached < 5 * 3,
        "the breaker opened on UNAVAILABLE and answers at once without calling the server",
        &mut failures,
    );

    if !failures.is_empty() {
        eprintln!("\nnot demonstrated: {failures:?}");
        std::process::exit(1);
    }
    Ok(())
}
