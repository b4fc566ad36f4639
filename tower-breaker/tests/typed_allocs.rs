//! The typed plain flavour allocates nothing to refuse a call, where the
//! boxed one allocates its box. In a binary of its own, with one test:
//! the counting allocator counts every thread's allocations.

use std::alloc::System;
use std::convert::Infallible;
use std::future::{ready, Future};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tower::{service_fn, Layer, Service};
use tower_breaker::error::{BreakerError, CircuitOpen};
use tower_breaker::{Breaker, BreakerConfig, Outcome, PlainBreakerLayer, State, TypedBreakerLayer};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Calls `svc` once and polls the future by hand, without a runtime: a
/// ready inner service completes in the first poll.
fn call_now<S: Service<u32>>(svc: &mut S) -> Result<S::Response, S::Error> {
    let mut cx = Context::from_waker(Waker::noop());
    match svc.poll_ready(&mut cx) {
        Poll::Ready(Ok(())) => {}
        Poll::Ready(Err(e)) => return Err(e),
        Poll::Pending => panic!("the service should be ready"),
    }
    let mut future = pin!(svc.call(7));
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(result) => result,
        Poll::Pending => panic!("the call should complete in its first poll"),
    }
}

fn doubling() -> impl Service<u32, Response = u32, Error = Infallible> + Clone {
    service_fn(|n: u32| ready(Ok::<_, Infallible>(n * 2)))
}

fn allocations(region: &Region<'_, System>) -> usize {
    region.change().allocations
}

#[test]
fn refusals_and_closed_calls_allocate_nothing_where_the_boxed_flavour_allocates_its_box() {
    let b = Breaker::with_config(
        "test",
        BreakerConfig::new()
            .count_window(2)
            .minimum_calls(2)
            .open_period(Duration::from_secs(3600))
            .max_open_period(Duration::from_secs(3600)),
    );
    let mut typed = TypedBreakerLayer::new(b.clone()).layer(doubling());
    let mut plain = PlainBreakerLayer::new(b.clone()).layer(doubling());

    // Closed: a call that completes in its first poll.
    assert_eq!(call_now(&mut typed).unwrap(), 14);
    let region = Region::new(GLOBAL);
    for _ in 0..50 {
        assert_eq!(call_now(&mut typed).unwrap(), 14);
    }
    assert_eq!(allocations(&region), 0, "closed calls allocated");

    // A success and a failure in the window of two: 50%, open.
    b.try_acquire().unwrap().record(Outcome::Failure);
    assert_eq!(b.snapshot().state, State::Open);
    // The first refusal of each may set up what later ones reuse (the
    // rate limit of the rejection event).
    assert!(call_now(&mut typed).is_err());
    assert!(call_now(&mut plain).is_err());

    let region = Region::new(GLOBAL);
    for _ in 0..100 {
        assert!(matches!(call_now(&mut typed), Err(BreakerError::Open(_))));
    }
    assert_eq!(allocations(&region), 0, "typed refusals allocated");

    let region = Region::new(GLOBAL);
    for _ in 0..100 {
        assert!(call_now(&mut plain).unwrap_err().is::<CircuitOpen>());
    }
    assert_eq!(allocations(&region), 100, "one box per boxed refusal");
    assert_eq!(b.snapshot().totals.rejected, 202);
}
