//! Helpers for a store's fleet tests (several breakers, in one process or
//! in several, sharing one circuit through the store): call them all from
//! many tasks and see who is let through. They use the real clock, as the
//! clauses do.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tokio::time::Instant;
//! use tower_breaker::store::MemoryStore;
//! use tower_breaker::{Breaker, BreakerConfig};
//! use tower_breaker_conformance::fleet::hammer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store = Arc::new(MemoryStore::new());
//! let fleet: Arc<Vec<Breaker>> = Arc::new(
//!     (0..3)
//!         .map(|_| Breaker::with_config("dep", BreakerConfig::new().store(store.clone())))
//!         .collect(),
//! );
//! // Closed: every call of 10 tasks for 20 ms is let through (and held).
//! let held = hammer(&fleet, 10, Instant::now() + Duration::from_millis(20)).await;
//! assert!(!held.is_empty());
//! # }
//! ```

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::{sleep, Instant};
use tower_breaker::{Breaker, Outcome, Permit};

/// Calls every breaker of `fleet` (each admitted call counted as ignored)
/// every 5 ms until each rejects; panics after `limit`.
///
/// # Panics
///
/// When some breaker still admits calls after `limit`.
pub async fn until_all_reject(fleet: &[Breaker], limit: Duration) {
    let start = Instant::now();
    while !fleet.iter().all(|b| match b.try_acquire() {
        Ok(p) => {
            p.record(Outcome::Ignored);
            false
        }
        Err(_) => true,
    }) {
        assert!(start.elapsed() < limit, "every breaker rejects in time");
        sleep(Duration::from_millis(5)).await;
    }
}

/// Calls the breakers of `fleet` from `tasks` tasks (task `i` on breaker
/// `i % len`) every 3 ms until `stop`; every admitted call is kept, not
/// completed (a probe stays in flight), and returned.
pub async fn hammer(fleet: &Arc<Vec<Breaker>>, tasks: usize, stop: Instant) -> Vec<Permit> {
    hammer_after_first(fleet, tasks, stop, None).await.0
}

/// [`hammer`], stopping `after` the first admission when it comes before
/// `stop` (long enough to see a second prober, shorter than a probe's
/// lease); also returns when the first admission came.
pub async fn hammer_after_first(
    fleet: &Arc<Vec<Breaker>>,
    tasks: usize,
    stop: Instant,
    after: Option<Duration>,
) -> (Vec<Permit>, Option<Instant>) {
    let held: Arc<Mutex<Vec<Permit>>> = Arc::default();
    let first: Arc<Mutex<Option<Instant>>> = Arc::default();
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let (fleet, held, first) = (fleet.clone(), held.clone(), first.clone());
            tokio::spawn(async move {
                let b = &fleet[i % fleet.len()];
                loop {
                    let now = Instant::now();
                    let seen = *first.lock().unwrap_or_else(PoisonError::into_inner);
                    let end = match (seen, after) {
                        (Some(at), Some(after)) => stop.min(at + after),
                        _ => stop,
                    };
                    if now >= end {
                        break;
                    }
                    if let Ok(permit) = b.try_acquire() {
                        first
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .get_or_insert(now);
                        held.lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(permit);
                    }
                    sleep(Duration::from_millis(3)).await;
                }
            })
        })
        .collect();
    for h in handles {
        if let Err(e) = h.await {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    let held = std::mem::take(&mut *held.lock().unwrap_or_else(PoisonError::into_inner));
    let first = *first.lock().unwrap_or_else(PoisonError::into_inner);
    (held, first)
}
