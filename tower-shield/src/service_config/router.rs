//! Routing a call to its method's stack by the request's path.

use std::sync::Arc;
use std::task::{Context, Poll};

use tower_service::Service;

use super::config::Table;

/// A service that sends each request to the service of its method, chosen
/// by the request's path (`/package.Service/Method`) with A6's lookup: the
/// config that names the service and the method, else the one that names
/// the service alone, else the default `{}`, else the service for methods
/// without a config.
///
/// Built by a [`ServiceConfigStack`](super::ServiceConfigStack), with one
/// service per method config that has a policy, each a copy of the client
/// stack with that method's retry layer (and hedge layer).
///
/// # Readiness
///
/// `poll_ready` polls every route's service and is ready when all of them
/// are (as tower's `Steer`): the route is only known in `call`. The
/// routes are copies of one stack over clones of one transport, so they
/// are ready together; the stack's layers forward their transport's
/// readiness and reject in `call` (see [`crate::stack`]). With a tonic
/// `Channel`, each route's clone of it reserves its own slot in the
/// channel's buffer.
///
/// # Clone
///
/// Clones clone each route's service and share the lookup table.
#[derive(Debug, Clone)]
pub struct MethodRouter<S> {
    routes: Vec<S>,
    /// The route of each method config.
    of_config: Arc<[usize]>,
    table: Arc<Table>,
}

// === impl MethodRouter ===

impl<S> MethodRouter<S> {
    /// `routes[of_config[i]]` serves the methods of config `i`; `routes[0]`
    /// those of no config.
    pub(crate) fn new(routes: Vec<S>, of_config: Arc<[usize]>, table: Arc<Table>) -> Self {
        debug_assert!(!routes.is_empty());
        Self {
            routes,
            of_config,
            table,
        }
    }

    /// The index of the route of a request path.
    fn route(&self, path: &str) -> usize {
        self.table
            .find_path(path)
            .map_or(0, |config| self.of_config[config])
    }

    /// The services of the routes: the first for methods without a policy,
    /// then one per method config with a policy, in the document's order.
    pub fn get_ref(&self) -> &[S] {
        &self.routes
    }

    /// The services of the routes, mutably.
    pub fn get_mut(&mut self) -> &mut [S] {
        &mut self.routes
    }

    /// The services of the routes, unwrapped.
    pub fn into_inner(self) -> Vec<S> {
        self.routes
    }
}

impl<S, B> Service<http::Request<B>> for MethodRouter<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        let mut pending = false;
        for route in &mut self.routes {
            match route.poll_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => pending = true,
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(Ok(()))
        }
    }

    fn call(&mut self, request: http::Request<B>) -> S::Future {
        let route = self.route(request.uri().path());
        self.routes[route].call(request)
    }
}
