//! The error of [`Bulkhead`](crate::Bulkhead) when a compartment is full.
//!
//! [`Bulkhead`](crate::Bulkhead)'s error type is [`BoxError`](crate::BoxError):
//! either the inner service's error, unchanged, or a [`BulkheadFull`]. Tell
//! them apart with `is` or `downcast_ref`, which keeps working when other
//! layers above box the error again:
//!
//! ```
//! use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};
//! use tower_bulkhead::error::BulkheadFull;
//! use tower_bulkhead::BulkheadLayer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let (release, wait) = tokio::sync::oneshot::channel::<()>();
//! let wait = std::sync::Arc::new(tokio::sync::Mutex::new(Some(wait)));
//! let slow = service_fn(move |_req: &'static str| {
//!     let wait = wait.clone();
//!     async move {
//!         if let Some(wait) = wait.lock().await.take() {
//!             let _ = wait.await;
//!         }
//!         Ok::<_, BoxError>("done")
//!     }
//! });
//! let mut client = ServiceBuilder::new()
//!     .map_err(|e: BoxError| e) // a second layer that passes the box on
//!     .layer(BulkheadLayer::new("payments", 1))
//!     .service(slow);
//!
//! // The first call holds the only slot...
//! let first = client.ready().await.unwrap().call("a");
//! let first = tokio::spawn(first);
//! tokio::task::yield_now().await;
//!
//! // ...so the second is refused at once.
//! let err = client.ready().await.unwrap().call("b").await.unwrap_err();
//! let full = err.downcast_ref::<BulkheadFull>().expect("a bulkhead rejection");
//! assert_eq!(full.compartment(), "payments");
//! assert_eq!(full.limit(), 1);
//! assert!(!full.waited_and_timed_out());
//!
//! release.send(()).unwrap();
//! assert_eq!(first.await.unwrap().unwrap(), "done");
//! # }
//! ```

pub use tower_resilience_base::error::BulkheadFull;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn display_is_lowercase_and_names_the_compartment() {
        let e = BulkheadFull::new("payments", 8, None);
        assert_eq!(
            e.to_string(),
            "bulkhead compartment `payments` is full (8 in flight)"
        );
        let e = BulkheadFull::new("payments", 8, Some(Duration::from_millis(50)));
        assert_eq!(
            e.to_string(),
            "bulkhead compartment `payments` is full (8 in flight) after waiting 50ms"
        );
        assert_eq!(e.waited(), Duration::from_millis(50));
        assert!(e.waited_and_timed_out());
    }
}
