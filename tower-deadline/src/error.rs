//! Errors returned by [`ClientDeadline`](crate::ClientDeadline).
//!
//! The client service's error type is [`BoxError`](crate::BoxError); the
//! failures this crate adds are the two structs below, and any error of the
//! inner service passes through unchanged. Match on them with `downcast_ref`
//! or `is`, even when other layers box the error again on top:
//!
//! ```
//! use std::time::Duration;
//! use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
//! use tower_deadline::error::{DeadlineExceeded, InsufficientBudget};
//! use tower_deadline::{ClientDeadlineLayer, Deadline};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let slow = service_fn(|_req: http::Request<()>| async {
//!     tokio::time::sleep(Duration::from_secs(10)).await;
//!     Ok::<_, BoxError>(http::Response::new(()))
//! });
//! let client = ServiceBuilder::new()
//!     .layer(ClientDeadlineLayer::new().default_timeout(Duration::from_millis(100)))
//!     .service(slow);
//!
//! let err = client.oneshot(http::Request::new(())).await.unwrap_err();
//! assert!(err.is::<DeadlineExceeded>());
//! assert!(!err.is::<InsufficientBudget>());
//! # }
//! ```

pub use tower_resilience_base::error::{DeadlineExceeded, InsufficientBudget};
