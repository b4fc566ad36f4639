//! Finding the `reqwest::Client` at the bottom of a stack.

use tower_bulkhead::Bulkhead;
use tower_deadline::ClientDeadline;
use tower_retry_budget::Retry;

use super::service::ReqwestService;
use crate::criticality::PropagateCriticality;
use tower_breaker::throttle::Throttle;
use tower_breaker::CircuitBreaker;

/// A stack of this crate's client layers (the criticality's
/// propagation, the client deadline, the breaker, the retry layer, the
/// throttle, the bulkhead, in any order and number) with a
/// [`ReqwestService`] at the bottom: what
/// [`client_stack`](crate::stack::client_stack)`(..).layer(ReqwestService::new(..))`
/// and the same layers put together by hand build.
/// [`Client::new`](super::Client::new) takes the `reqwest::Client` it
/// starts request builders with from there.
///
/// Sealed: a stack with other layers goes to
/// [`Client::from_parts`](super::Client::from_parts) with its
/// `reqwest::Client` instead.
///
/// # Example
///
/// ```
/// use tower::Layer;
/// use tower_shield::reqwest::{ReqwestService, ReqwestStack};
/// use tower_shield::stack::client_stack;
///
/// let transport = reqwest::Client::new();
/// let stack = client_stack("catalog").layer(ReqwestService::new(transport));
/// let _bottom: &reqwest::Client = stack.reqwest_client();
/// ```
pub trait ReqwestStack: sealed::Sealed {
    /// The `reqwest::Client` of the [`ReqwestService`] at the bottom.
    fn reqwest_client(&self) -> &::reqwest::Client;
}

impl ReqwestStack for ReqwestService {
    fn reqwest_client(&self) -> &::reqwest::Client {
        self.get_ref()
    }
}

impl<S: ReqwestStack, E> ReqwestStack for ClientDeadline<S, E> {
    fn reqwest_client(&self) -> &::reqwest::Client {
        self.get_ref().reqwest_client()
    }
}

impl<S: ReqwestStack, C> ReqwestStack for CircuitBreaker<S, C> {
    fn reqwest_client(&self) -> &::reqwest::Client {
        self.get_ref().reqwest_client()
    }
}

impl<S: ReqwestStack, P, M> ReqwestStack for Retry<S, P, M> {
    fn reqwest_client(&self) -> &::reqwest::Client {
        self.get_ref().reqwest_client()
    }
}

impl<S: ReqwestStack, K, R> ReqwestStack for Bulkhead<S, K, R> {
    fn reqwest_client(&self) -> &::reqwest::Client {
        self.get_ref().reqwest_client()
    }
}

impl<S: ReqwestStack, C> ReqwestStack for Throttle<S, C> {
    fn reqwest_client(&self) -> &::reqwest::Client {
        self.get_ref().reqwest_client()
    }
}

impl<S: ReqwestStack> ReqwestStack for PropagateCriticality<S> {
    fn reqwest_client(&self) -> &::reqwest::Client {
        self.get_ref().reqwest_client()
    }
}

mod sealed {
    use super::*;

    /// Keeps [`ReqwestStack`](super::ReqwestStack) closed to other
    /// implementations.
    #[allow(unreachable_pub)]
    pub trait Sealed {}

    impl Sealed for ReqwestService {}
    impl<S: Sealed, E> Sealed for ClientDeadline<S, E> {}
    impl<S: Sealed, C> Sealed for CircuitBreaker<S, C> {}
    impl<S: Sealed, P, M> Sealed for Retry<S, P, M> {}
    impl<S: Sealed, K, R> Sealed for Bulkhead<S, K, R> {}
    impl<S: Sealed> Sealed for PropagateCriticality<S> {}
    impl<S: Sealed, C> Sealed for Throttle<S, C> {}
}
