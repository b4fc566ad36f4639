//! The error of a breaker that rejects a call.
//!
//! The error type of [`CircuitBreaker`](crate::CircuitBreaker) and
//! [`PlainCircuitBreaker`](crate::PlainCircuitBreaker) is
//! [`BoxError`](crate::BoxError): either the inner
//! service's error, unchanged, or a [`CircuitOpen`]. Tell them apart with
//! `is` or `downcast_ref`, which keeps working when other layers above box
//! the error again:
//!
//! ```
//! use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
//! use tower_breaker::error::CircuitOpen;
//! use tower_breaker::{Breaker, BreakerLayer, Mode};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let breaker = Breaker::new("payments");
//! breaker.set_mode(Mode::ForcedOpen);
//!
//! let client = ServiceBuilder::new()
//!     .map_err(|e: BoxError| e) // a second layer that passes the box on
//!     .layer(BreakerLayer::new(breaker))
//!     .service(service_fn(|_req: http::Request<()>| async {
//!         Ok::<_, BoxError>(http::Response::new(()))
//!     }));
//!
//! let err = client.oneshot(http::Request::new(())).await.unwrap_err();
//! assert!(err.is::<CircuitOpen>());
//! let open = err.downcast_ref::<CircuitOpen>().unwrap();
//! assert_eq!(open.breaker(), "payments");
//! assert!(open.is_forced());
//! # }
//! ```

pub use tower_resilience_base::error::CircuitOpen;
