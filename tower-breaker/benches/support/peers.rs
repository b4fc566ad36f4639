//! The peer circuit breakers of the overhead benches, `recloser` and
//! `failsafe`, each behind the few lines of a `Service` adapter a tower
//! user would write: the inner service's future goes into the peer's
//! `call`. Dev-dependencies of tower-breaker only, so a bench of another
//! crate that borrows `overhead.rs` does not need them.

#![allow(dead_code, unreachable_pub)] // each bench uses what it needs

use std::task::{Context, Poll};
use std::time::Duration;

use http::Request;
use tower::Service;

use super::overhead::{bare, Bare};

/// A tower adapter over a peer's future-wrapping call, as a user of
/// `recloser` writes it: the inner service's future goes into the
/// breaker's.
#[derive(Clone)]
pub struct Recloser<S> {
    inner: S,
    breaker: recloser::AsyncRecloser,
}

impl<S: Service<Request<()>>> Service<Request<()>> for Recloser<S> {
    type Response = S::Response;
    type Error = recloser::Error<S::Error>;
    type Future = recloser::RecloserFuture<S::Future, recloser::AnyError>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(recloser::Error::Inner)
    }

    fn call(&mut self, req: Request<()>) -> Self::Future {
        self.breaker.call(self.inner.call(req))
    }
}

/// `recloser` with its defaults (a ring of 100 calls, open at 50%).
pub fn recloser_closed() -> Recloser<Bare> {
    Recloser {
        inner: bare(),
        breaker: recloser::Recloser::default().into(),
    }
}

/// `recloser` opened by failures, for an hour.
pub fn recloser_open() -> Recloser<Bare> {
    let breaker = recloser::Recloser::custom()
        .closed_len(2)
        .open_wait(Duration::from_secs(3600))
        .build();
    // Failures until it refuses (its ring must fill first).
    let opened = (0..10).any(|_| {
        matches!(
            breaker.call(|| Err::<(), ()>(())),
            Err(recloser::Error::Rejected)
        )
    });
    assert!(opened, "recloser should be open");
    Recloser {
        inner: bare(),
        breaker: breaker.into(),
    }
}

/// The same adapter over `failsafe`.
#[derive(Clone)]
pub struct Failsafe<S, B> {
    inner: S,
    breaker: B,
}

impl<S, B> Service<Request<()>> for Failsafe<S, B>
where
    S: Service<Request<()>>,
    B: failsafe::futures::CircuitBreaker,
{
    type Response = S::Response;
    type Error = failsafe::Error<S::Error>;
    type Future = failsafe::futures::ResponseFuture<
        S::Future,
        B::FailurePolicy,
        B::Instrument,
        failsafe::Any,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(failsafe::Error::Inner)
    }

    fn call(&mut self, req: Request<()>) -> Self::Future {
        self.breaker.call(self.inner.call(req))
    }
}

/// `failsafe` with its defaults.
pub fn failsafe_closed(
) -> Failsafe<Bare, impl failsafe::futures::CircuitBreaker + Clone + Send + Sync> {
    Failsafe {
        inner: bare(),
        breaker: failsafe::Config::new().build(),
    }
}

/// `failsafe` opened by one failure, for an hour.
pub fn failsafe_open(
) -> Failsafe<Bare, impl failsafe::futures::CircuitBreaker + Clone + Send + Sync> {
    use failsafe::CircuitBreaker as _;
    let breaker = failsafe::Config::new()
        .failure_policy(failsafe::failure_policy::consecutive_failures(
            1,
            failsafe::backoff::constant(Duration::from_secs(3600)),
        ))
        .build();
    let _ = breaker.call(|| Err::<(), ()>(()));
    assert!(!breaker.is_call_permitted(), "failsafe should be open");
    Failsafe {
        inner: bare(),
        breaker,
    }
}
