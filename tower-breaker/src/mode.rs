//! The modes of [`CircuitBreaker`](crate::CircuitBreaker): what it accepts
//! and how it answers when open.
//!
//! | mode | requests | when open | inner error | attempt hook |
//! |---|---|---|---|---|
//! | [`Client`] (default) | `http::Request<B>` | `Err(`[`CircuitOpen`](crate::error::CircuitOpen)`)` in a [`BoxError`](crate::BoxError) | boxed | yes (feature `retry`) |
//! | [`Server`] | `http::Request<B>`, `B: Default` responses | `503` + `Retry-After`, or gRPC UNAVAILABLE | unchanged | no |
//! | [`Plain`] | any | `Err(`[`CircuitOpen`](crate::error::CircuitOpen)`)` in a [`BoxError`](crate::BoxError) | boxed | no |
//!
//! # Example
//!
//! ```
//! use std::convert::Infallible;
//! use tower::{service_fn, ServiceExt};
//! use tower_breaker::{Breaker, BreakerLayer, Mode};
//! use tower_layer::Layer;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let breaker = Breaker::new("backend");
//! breaker.set_mode(Mode::ForcedOpen);
//!
//! let server = BreakerLayer::new(breaker).http_answers().layer(service_fn(
//!     |_req: http::Request<()>| async { Ok::<_, Infallible>(http::Response::new(String::new())) },
//! ));
//! let response = server.oneshot(http::Request::new(())).await.unwrap();
//! assert_eq!(response.status(), 503);
//! assert_eq!(response.headers()["x-tower-no-retry"], "1");
//! # }
//! ```

/// HTTP client stacks (the default): typed errors, and with the `retry`
/// feature the attempt hook in every request's extensions.
#[derive(Debug, Clone, Copy, Default)]
pub struct Client;

/// HTTP servers (axum, hyper, tonic): rejections become answers and the
/// inner error type passes through unchanged, so the layer fits
/// `axum::Router::layer`. Each call is counted once (no attempt hook). An
/// error of the inner service counts as a failure.
#[derive(Debug, Clone, Copy, Default)]
pub struct Server;

/// Any request type: typed errors, no attempt hook, each call counted
/// once.
#[derive(Debug, Clone, Copy, Default)]
pub struct Plain;
