//! A retry budget shared by a fleet: how a retry layer asks a store, through
//! the circuit breaker that already talks to it, for retries beyond what
//! its own process has earned.
//!
//! A process's own retry budget bounds its retries by a share of its own
//! requests, with a floor for quiet clients. In a fleet of short-lived
//! processes (Lambda instances, jobs, autoscaled pods) every process is
//! quiet: each one's floor covers every retry it can make, and the fleet's
//! retries are bounded by nothing but the attempts limit. A
//! [`SharedRetries`] moves the bound to the fleet: the requests of every
//! process earn credit in one place, and a retry is granted only while the
//! fleet's retries stay within its share of the fleet's requests, plus one
//! small floor for the whole fleet.
//!
//! The retry layer (`tower-retry-budget`) is the caller; the circuit
//! breaker's fleet store (`tower-breaker`) the usual implementation, whose
//! reports carry the credit so that a request that needs no retry costs no
//! network call. The trait lives here so that neither depends on the other.
//!
//! # Example
//!
//! ```
//! use std::future::Future;
//! use std::pin::Pin;
//! use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
//! use tower_resilience_base::fleet::{Claim, SharedRetries};
//!
//! /// Three retries for everyone, then none: a stand-in for a store.
//! #[derive(Debug, Default)]
//! struct Three(AtomicU64);
//!
//! impl SharedRetries for Three {
//!     fn claim(&self) -> Pin<Box<dyn Future<Output = Claim> + Send + 'static>> {
//!         let granted = self.0.fetch_add(1, Relaxed) < 3;
//!         Box::pin(async move { if granted { Claim::Granted } else { Claim::Refused } })
//!     }
//!     fn give_back(&self) {
//!         self.0.fetch_sub(1, Relaxed);
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let fleet = Three::default();
//! for _ in 0..3 {
//!     assert_eq!(fleet.claim().await, Claim::Granted);
//! }
//! assert_eq!(fleet.claim().await, Claim::Refused);
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;

/// The answer to a [`SharedRetries::claim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Claim {
    /// The fleet has room: the retry may be sent (and is counted).
    Granted,
    /// The fleet's retries are at their bound: do not send it.
    Refused,
    /// The fleet could not answer (its store is failing or slow): decide
    /// as a process alone would, by its own budget.
    Unavailable,
}

/// The future of a [`SharedRetries::claim`].
pub type ClaimFuture = Pin<Box<dyn Future<Output = Claim> + Send + 'static>>;

/// A fleet's retry budget, as a retry layer sees it: one claim per retry
/// the process's own earnings cannot pay for.
///
/// Implementations count the process's requests on their own (the usual
/// one reads the retry budget's counters when it reports); a claim is the
/// only call a retry layer makes, and only for a retry it would send.
pub trait SharedRetries: Send + Sync + fmt::Debug + 'static {
    /// Asks the fleet for one retry. The answer should come within the
    /// store's timeout; [`Claim::Unavailable`] when it cannot.
    fn claim(&self) -> ClaimFuture;

    /// A granted retry that was not sent after all (the caller gave up
    /// during the backoff, the circuit opened): the fleet gets it back.
    fn give_back(&self);
}
