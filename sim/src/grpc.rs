//! The same dependency over gRPC: tonic's routes (`sim.Shop/Order`, unary,
//! and `sim.Shop/Watch`, a server stream) under the server stack, served
//! by hyper's HTTP/2 server (see [`serve`] for why not tonic's), and a
//! tonic `Channel` under `client_stack(..).tonic(..)`, both over the
//! simulated network. Written by hand with `tonic::server::Grpc` and
//! `tonic::client::Grpc`, as generated code would be.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{self, Stream, StreamExt};
use http::uri::PathAndQuery;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tonic::server::{NamedService, ServerStreamingService, UnaryService};
use tonic::service::{RecoverErrorLayer, Routes};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};
use tonic_prost::ProstCodec;
use tower::{Service, ServiceBuilder};
use tower_shield::stack::ServerStack;

use crate::scenario::Phase;
use crate::{Attempted, Ending, ServerWorld, Shared};

/// The gRPC server's port.
pub(crate) const PORT: u16 = 50051;

/// A request.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Order {
    #[prost(uint32, tag = "1")]
    pub(crate) call: u32,
}

/// An answer (one of a stream's messages).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Receipt {
    #[prost(uint32, tag = "1")]
    pub(crate) part: u32,
}

// === the server ===

/// Serves `sim.Shop` under `stack` until the host crashes.
///
/// Over hyper's HTTP/2 server rather than tonic's `Server`, so that two
/// runs of a seed send the same bytes: hyper writes a `date` header from
/// the wall clock unless told not to, which tonic's `Server` does not
/// offer, and under HTTP/2 its HPACK encoding (a new literal each second
/// of real time, an index in between) changes the size of the frames the
/// simulated network carries. Otherwise the server is tonic's: its routes,
/// and its recovery of a handler's `Status` as a trailers-only answer.
/// (tonic's own `grpc-timeout` enforcement is left out: the server stack's
/// deadline is the one under test.)
pub(crate) async fn serve(world: Arc<ServerWorld>, stack: ServerStack) -> turmoil::Result {
    let listener =
        turmoil::net::TcpListener::bind((IpAddr::from(Ipv4Addr::UNSPECIFIED), PORT)).await?;
    let routes = Routes::new(Shop(world)).prepare();
    let service = ServiceBuilder::new()
        .map_request(|request: http::Request<Incoming>| request.map(tonic::body::Body::new))
        .layer(RecoverErrorLayer::new())
        .layer(stack)
        .service(routes);
    loop {
        let (stream, _) = listener.accept().await?;
        let service = TowerToHyperService::new(service.clone());
        tokio::spawn(async move {
            // A connection that breaks (a crash, a partition) ends here.
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .auto_date_header(false)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

#[derive(Clone)]
struct Shop(Arc<ServerWorld>);

impl NamedService for Shop {
    const NAME: &'static str = "sim.Shop";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl Service<http::Request<tonic::body::Body>> for Shop {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let world = Arc::clone(&self.0);
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<Receipt, Order>::default());
            if request.uri().path() == "/sim.Shop/Watch" {
                return Ok(grpc.server_streaming(Watch(world), request).await);
            }
            Ok(grpc.unary(OrderOne(world), request).await)
        })
    }
}

/// `sim.Shop/Order`: the phase's answer as one message or a status.
struct OrderOne(Arc<ServerWorld>);

impl UnaryService<Order> for OrderOne {
    type Response = Receipt;
    type Future = BoxFuture<Result<tonic::Response<Receipt>, Status>>;

    fn call(&mut self, _request: tonic::Request<Order>) -> Self::Future {
        let (phase, draw, wait) = self.0.draw();
        Box::pin(async move {
            if let Some(status) = failure(phase, draw) {
                return Err(status);
            }
            tokio::time::sleep(wait).await;
            if phase == Phase::Stalling {
                // A unary answer that never comes: the server's deadline
                // ends it.
                std::future::pending::<()>().await;
            }
            Ok(tonic::Response::new(Receipt { part: 1 }))
        })
    }
}

/// `sim.Shop/Watch`: a first message, then by phase nothing ever
/// (stalling), an error in the trailers (failing, flaky, overloaded),
/// twenty messages 2 ms apart (dribbling), or two more and the end.
struct Watch(Arc<ServerWorld>);

type ReceiptStream = Pin<Box<dyn Stream<Item = Result<Receipt, Status>> + Send>>;

impl ServerStreamingService<Order> for Watch {
    type Response = Receipt;
    type ResponseStream = ReceiptStream;
    type Future = BoxFuture<Result<tonic::Response<ReceiptStream>, Status>>;

    fn call(&mut self, _request: tonic::Request<Order>) -> Self::Future {
        let (phase, draw, wait) = self.0.draw();
        Box::pin(async move {
            tokio::time::sleep(wait).await;
            let first = stream::once(async { Ok(Receipt { part: 1 }) });
            let rest: ReceiptStream = match (phase, failure(phase, draw)) {
                (Phase::Stalling, _) => Box::pin(first.chain(stream::pending())),
                (_, Some(status)) => Box::pin(first.chain(stream::once(async move {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    Err(status)
                }))),
                (Phase::Dribbling, _) => {
                    Box::pin(first.chain(stream::iter(2..=20).then(|part| async move {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        Ok(Receipt { part })
                    })))
                }
                _ => Box::pin(first.chain(stream::iter([
                    Ok(Receipt { part: 2 }),
                    Ok(Receipt { part: 3 }),
                ]))),
            };
            Ok(tonic::Response::new(rest))
        })
    }
}

/// The status a phase fails with, for a draw in `[0, 1)`, as the HTTP
/// server's answers: INTERNAL for a 500, UNAVAILABLE for a 502 or 503.
fn failure(phase: Phase, draw: f64) -> Option<Status> {
    match phase {
        Phase::Failing if draw < 0.35 => Some(Status::internal("the dependency failed")),
        Phase::Failing if draw < 0.7 => Some(Status::unavailable("bad gateway")),
        Phase::Flaky if draw < 0.3 => Some(Status::unavailable("flaky")),
        Phase::Overloaded if draw < 0.5 => Some(Status::resource_exhausted("overloaded")),
        _ => None,
    }
}

// === the client ===

/// A `Channel` over the simulated network, connected on first use (and
/// again after a connection breaks).
pub(crate) fn channel() -> Channel {
    Endpoint::from_static("http://server:50051").connect_with_connector_lazy(tower::service_fn(
        |_| async {
            let stream = turmoil::net::TcpStream::connect(("server", PORT)).await?;
            Ok::<_, std::io::Error>(TokioIo::new(stream))
        },
    ))
}

/// The channel, each request written in the journal as an attempt.
#[derive(Clone)]
pub(crate) struct Logged {
    pub(crate) channel: Channel,
    pub(crate) journal: Shared,
}

impl Service<http::Request<tonic::body::Body>> for Logged {
    type Response = http::Response<Attempted<tonic::body::Body>>;
    type Error = tonic::transport::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.channel.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let end = crate::start_attempt(&self.journal, request.headers());
        let response = self.channel.call(request);
        Box::pin(async move { Ok(response.await?.map(|body| Attempted { body, end })) })
    }
}

/// The client's view of the stack over gRPC.
pub(crate) type Client<S> = tonic::client::Grpc<S>;

/// Makes call `n`: a unary order (idempotent, so the stack may retry it)
/// or, one call in three, a watch read to the end of its stream.
pub(crate) async fn call<S>(mut client: Client<S>, n: u32) -> Ending
where
    S: tonic::client::GrpcService<tonic::body::Body>,
    S::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <S::ResponseBody as http_body::Body>::Error: Into<tower::BoxError> + Send,
{
    if let Err(e) = client.ready().await {
        return ending(&Status::from_error(e.into()));
    }
    let mut request = tonic::Request::new(Order { call: n });
    request.metadata_mut().insert("x-call", n.into());
    let codec = ProstCodec::<Order, Receipt>::default();
    if n.is_multiple_of(3) {
        let path = PathAndQuery::from_static("/sim.Shop/Watch");
        let mut stream = match client.server_streaming(request, path, codec).await {
            Ok(response) => response.into_inner(),
            Err(status) => return ending(&status),
        };
        loop {
            match stream.message().await {
                Ok(Some(_)) => {}
                Ok(None) => return Ending::Ok,
                Err(status) => return ending(&status),
            }
        }
    }
    request.metadata_mut().insert(
        "idempotency-key",
        n.to_string().parse().expect("digits are valid metadata"),
    );
    let path = PathAndQuery::from_static("/sim.Shop/Order");
    match client.unary(request, path, codec).await {
        Ok(_) => Ending::Ok,
        Err(status) => ending(&status),
    }
}

fn ending(status: &Status) -> Ending {
    match crate::classify(status) {
        Ending::OtherError if status.code() == Code::DeadlineExceeded => Ending::DeadlineExceeded,
        Ending::OtherError => Ending::Status(status.code() as u16),
        found => found,
    }
}
