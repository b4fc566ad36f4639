//! A client stack with a service config applied: one copy of the stack
//! per method config, routed by method.

use std::sync::Arc;

use tower_breaker::Breaker;
use tower_bulkhead::release::{BodyEnd, Release};
use tower_bulkhead::CompartmentHandle;
use tower_layer::Layer;
use tower_retry_budget::{Buffered, Counters, Hedge, HedgeLayer, RetryBudget, RetryLayer};

use super::config::{ServiceConfig, Table};
use super::policy::A6Policy;
use super::router::MethodRouter;
use super::throttle::RetryThrottle;
use crate::stack::{ClientStack, ClientStackService, OptionalThrottle, ThrottleSlot};
use crate::tonic::{StatusService, TonicBody};

/// The service of one method config: the client stack with the method's
/// retry layer, under its hedge layer (which passes every call through
/// unless the method has a `hedgingPolicy`).
pub type MethodService<S, R = BodyEnd> =
    Hedge<ClientStackService<S, A6Policy, Buffered, R, OptionalThrottle>, A6Policy, Buffered>;

/// The service a [`ServiceConfigStack`] builds around a transport `S`:
/// the [`MethodRouter`] over one [`MethodService`] per method config.
pub type ServiceConfigService<S, R = BodyEnd> = MethodRouter<MethodService<S, R>>;

/// The service [`ServiceConfigStack::tonic`] builds around a tonic
/// transport `S` (a `tonic::transport::Channel`, usually): as
/// [`TonicStack`](crate::tonic::TonicStack), errors become
/// [`tonic::Status`]es and bodies reach the channel as tonic's.
///
/// Name it where a client is stored: `StockClient<ServiceConfigTonic<Channel>>`.
pub type ServiceConfigTonic<S, R = BodyEnd> = StatusService<ServiceConfigService<TonicBody<S>, R>>;

/// A [`ClientStack`] with a [`ServiceConfig`] applied: the retries,
/// hedges and throttling of each method as the config says; built by
/// [`ClientStack::service_config`] or [`ServiceConfig::apply`].
///
/// It is a [`Layer`] (producing a [`ServiceConfigService`]) and, like the
/// client stack, wraps a tonic channel in one call with
/// [`tonic`](Self::tonic).
///
/// What it holds, for a config with `k` method configs that have a policy:
/// `k + 1` copies of the client stack (the first for methods without a
/// policy), each with its own [`RetryLayer`] (the method's
/// [`A6Policy`], attempts and backoff, or one attempt) and
/// [`HedgeLayer`] (the method's hedging, or none), sharing everything
/// else: the breaker, the bulkhead's compartment, the throttle layer, the
/// deadline settings, one [`RetryBudget`] and the config's
/// [`RetryThrottle`]. The module docs say how A6 maps onto the layers and
/// where it differs.
///
/// # Clone
///
/// Clones share the breaker, the bulkhead, the budget and the throttle
/// (and each method's hedge state): one dependency, one stack.
///
/// # Example
///
/// Through a transport that answers UNAVAILABLE once, with tokio's time
/// paused:
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use tower::{service_fn, BoxError, Layer, ServiceExt};
/// use tower_shield::service_config::ServiceConfig;
/// use tower_shield::stack::client_stack;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let config = ServiceConfig::from_json(r#"{
///   "methodConfig": [{
///     "name": [{ "service": "shop.Stock" }],
///     "retryPolicy": {
///       "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
///       "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]
///     }
///   }]
/// }"#)?;
/// let calls = Arc::new(AtomicUsize::new(0));
/// let transport = service_fn({
///     let calls = calls.clone();
///     move |req: http::Request<_>| {
///         let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
///         let _body: tower_retry_budget::body::ReplayBody<_> = req.into_body();
///         async move {
///             // A trailers-only answer: the status in the head.
///             let status = if first { "14" } else { "0" };
///             let response = http::Response::builder()
///                 .header("content-type", "application/grpc")
///                 .header("grpc-status", status)
///                 .body(String::new())?;
///             Ok::<_, BoxError>(response)
///         }
///     }
/// });
/// let stack = client_stack("stock").service_config(&config);
/// let client = stack.layer(transport);
///
/// let request = http::Request::post("http://stock/shop.Stock/Reserve")
///     .header("content-type", "application/grpc")
///     .body(String::new())?;
/// let response = client.oneshot(request).await?;
/// assert_eq!(response.headers()["grpc-status"], "0");
/// assert_eq!(calls.load(Ordering::SeqCst), 2, "retried once");
/// assert_eq!(stack.retry_counters().retries, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct ServiceConfigStack<R = BodyEnd> {
    /// Route 0: methods without a policy; then one per config with one.
    routes: Vec<Route<R>>,
    of_config: Arc<[usize]>,
    table: Arc<Table>,
    budget: Arc<RetryBudget>,
    throttle: Option<Arc<RetryThrottle>>,
}

/// The layers of one route.
#[derive(Debug, Clone)]
struct Route<R> {
    stack: ClientStack<A6Policy, Buffered, R, OptionalThrottle>,
    hedge: HedgeLayer<A6Policy>,
}

// === impl ServiceConfigStack ===

impl<R: Release + Clone> ServiceConfigStack<R> {
    pub(crate) fn new<P, M, T: ThrottleSlot>(
        config: &ServiceConfig,
        stack: ClientStack<P, M, R, T>,
    ) -> Self {
        let stack = stack.into_optional_throttle();
        let name: Arc<str> = Arc::from(stack.breaker_handle().name());
        let throttle = config
            .retry_throttling()
            .map(|throttling| Arc::new(RetryThrottle::new(throttling)));
        let budget = Arc::new(RetryBudget::new());
        if let Some(throttle) = &throttle {
            // Every retry is claimed from the throttle first; it defers to
            // the budget while it allows retries. Shared before the stack
            // is layered, so the breaker's fleet store does not take it.
            budget.share(throttle.clone());
        }
        // The stack's random source, if it was given one, draws the
        // jitter of every route's retries.
        let random = stack.random_source().cloned();
        let retry = |policy: A6Policy| {
            let layer = RetryLayer::new()
                .name(Arc::clone(&name))
                .budget(Arc::clone(&budget))
                .policy(policy)
                .max_attempts(1);
            match &random {
                Some(random) => layer.random(Arc::clone(random)),
                None => layer,
            }
        };
        // Methods without a policy: one attempt, and counted in the
        // throttle (every outgoing call is, in A6).
        let once = retry(A6Policy::retrying(
            Default::default(),
            false,
            throttle.clone(),
        ));
        let base = stack.retry(once.clone());
        let mut routes = vec![Route {
            hedge: HedgeLayer::above(&once).max_hedges(0),
            stack: base.clone(),
        }];
        let mut of_config = Vec::with_capacity(config.method_configs().len());
        for method in config.method_configs() {
            let route = if let Some(policy) = method.retry_policy() {
                let layer = retry(A6Policy::retrying(
                    policy.retryable_status_codes(),
                    true,
                    throttle.clone(),
                ))
                .max_attempts(policy.max_attempts())
                .backoff(policy.backoff());
                Route {
                    hedge: HedgeLayer::above(&layer).max_hedges(0),
                    stack: base.clone().retry(layer),
                }
            } else if let Some(policy) = method.hedging_policy() {
                // No retries below the hedges (A6); the retry layer's
                // policy still classifies each attempt and counts it.
                let codes = policy.non_fatal_status_codes();
                let layer = retry(A6Policy::retrying(codes, false, throttle.clone()));
                let hedge = HedgeLayer::above(&layer)
                    .policy(A6Policy::hedging(codes, throttle.clone()))
                    .fixed_delay(policy.hedging_delay())
                    .max_hedges(policy.max_attempts() - 1);
                Route {
                    hedge,
                    stack: base.clone().retry(layer),
                }
            } else {
                of_config.push(0);
                continue;
            };
            of_config.push(routes.len());
            routes.push(route);
        }
        Self {
            routes,
            of_config: of_config.into(),
            table: Arc::new(config.table.clone()),
            budget,
            throttle,
        }
    }
}

impl<R: Release> ServiceConfigStack<R> {
    /// This stack around a tonic transport (a `tonic::transport::Channel`,
    /// usually), ready for a generated client: `StockClient::new(service)`.
    /// As [`ClientStack::tonic`]: the replayable bodies reach the channel
    /// as tonic's ([`TonicBody`]), and every error of the stack reaches the
    /// client as a [`tonic::Status`] ([`StatusService`]).
    ///
    /// # Clone
    ///
    /// The service is as cheap to clone as a channel per method config;
    /// clones (and other services built from this stack) share its
    /// breaker, budget, throttle and bulkhead.
    ///
    /// # Example
    ///
    /// ```
    /// use tonic::transport::Channel;
    /// use tower_shield::service_config::{ServiceConfig, ServiceConfigTonic};
    /// use tower_shield::stack::client_stack;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let config: ServiceConfig = r#"{ "methodConfig": [] }"#.parse()?;
    /// let channel = Channel::from_static("http://127.0.0.1:50051").connect_lazy();
    /// let service: ServiceConfigTonic<Channel> =
    ///     client_stack("stock").service_config(&config).tonic(channel);
    /// // `StockClient::new(service)` with a generated client.
    /// let _client = tonic::client::Grpc::new(service);
    /// # Ok(())
    /// # }
    /// ```
    pub fn tonic<S: Clone>(&self, channel: S) -> ServiceConfigTonic<S, R> {
        StatusService::new(self.layer(TonicBody::new(channel)))
    }

    /// The stack's breaker (shared by every method).
    #[must_use]
    pub fn breaker_handle(&self) -> &Breaker {
        self.routes[0].stack.breaker_handle()
    }

    /// The stack's bulkhead compartment (shared by every method).
    #[must_use]
    pub fn bulkhead_handle(&self) -> CompartmentHandle {
        self.routes[0].stack.bulkhead_handle()
    }

    /// The counters of the retry budget every method shares: requests,
    /// retries (hedges included), refusals (the throttle's included).
    #[must_use]
    pub fn retry_counters(&self) -> Counters {
        self.budget.counters()
    }

    /// The retry budget every method shares (the toolkit's 10% budget,
    /// with the throttle as its [`SharedRetries`](tower_resilience_base::fleet::SharedRetries)
    /// when the config has `retryThrottling`).
    #[must_use]
    pub fn retry_budget(&self) -> &Arc<RetryBudget> {
        &self.budget
    }

    /// The config's retry throttle, if it has `retryThrottling`.
    #[must_use]
    pub fn retry_throttle(&self) -> Option<&Arc<RetryThrottle>> {
        self.throttle.as_ref()
    }
}

impl<S: Clone, R> Layer<S> for ServiceConfigStack<R> {
    type Service = ServiceConfigService<S, R>;

    fn layer(&self, transport: S) -> Self::Service {
        let routes = self
            .routes
            .iter()
            .map(|route| route.hedge.layer(route.stack.layer(transport.clone())))
            .collect();
        MethodRouter::new(routes, Arc::clone(&self.of_config), Arc::clone(&self.table))
    }
}

// === impl ClientStack ===

impl<P, M, R: Release + Clone, T: ThrottleSlot> ClientStack<P, M, R, T> {
    /// This stack with the retries, hedges and throttling of a gRPC
    /// service config (gRFC A6), per method; see
    /// [`crate::service_config`]. Its [`tonic`](ServiceConfigStack::tonic)
    /// wraps a channel as [`ClientStack::tonic`] does.
    ///
    /// The stack's retry layer is replaced by one per method config (and
    /// its budget by one new budget that all of them share); everything
    /// else (the breaker, the bulkhead, the throttle layer, the deadlines)
    /// is kept and shared by every method.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tonic::transport::Channel;
    /// use tower_shield::service_config::ServiceConfig;
    /// use tower_shield::stack::client_stack;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = ServiceConfig::from_json(r#"{
    ///   "methodConfig": [{
    ///     "name": [{ "service": "shop.Stock", "method": "Reserve" }],
    ///     "retryPolicy": {
    ///       "maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "2s",
    ///       "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]
    ///     }
    ///   }],
    ///   "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 }
    /// }"#)?;
    /// let stack = client_stack("stock")
    ///     .timeout(Duration::from_secs(2))
    ///     .service_config(&config);
    /// let channel = Channel::from_static("http://127.0.0.1:50051").connect_lazy();
    /// let _client = tonic::client::Grpc::new(stack.tonic(channel));
    /// assert_eq!(stack.retry_throttle().unwrap().tokens(), 10.0);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "service-config")))]
    pub fn service_config(self, config: &ServiceConfig) -> ServiceConfigStack<R> {
        ServiceConfigStack::new(config, self)
    }
}

// === impl ServiceConfig ===

impl ServiceConfig {
    /// `stack` with this config applied: the same as
    /// [`stack.service_config(self)`](ClientStack::service_config).
    ///
    /// # Example
    ///
    /// ```
    /// use tower_shield::service_config::ServiceConfig;
    /// use tower_shield::stack::client_stack;
    ///
    /// let config = ServiceConfig::from_json("{}")?;
    /// let stack = config.apply(client_stack("stock"));
    /// assert_eq!(stack.breaker_handle().name(), "stock");
    /// # Ok::<(), tower_shield::service_config::ServiceConfigError>(())
    /// ```
    pub fn apply<P, M, R: Release + Clone, T: ThrottleSlot>(
        &self,
        stack: ClientStack<P, M, R, T>,
    ) -> ServiceConfigStack<R> {
        ServiceConfigStack::new(self, stack)
    }
}
