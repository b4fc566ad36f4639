//! The response future of [`FallbackService`](super::FallbackService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;

use crate::layer::Shard;
use tower_resilience_base::BoxError;

pin_project! {
    /// Response future of [`FallbackService`](super::FallbackService).
    ///
    /// Either answers at once (a call the exercise mode answered), or waits
    /// for the inner future and then decides: the response as is, or the
    /// fallback's answer for a selected failure, or the original error.
    /// The fallback runs synchronously inside the last `poll`, so it adds
    /// no wait of its own. Dropping the future drops the inner one.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<F, Res, K> {
        #[pin]
        kind: Kind<F, Res, K>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, Res, K> {
        Called {
            #[pin]
            future: F,
            pending: Option<Pending<Res, K>>,
        },
        Served {
            response: Option<Res>,
        },
    }
}

/// What the call needs when it completes.
struct Pending<Res, K> {
    shard: Arc<Shard<Res, K>>,
    key: K,
    shadow: bool,
}

// === impl ResponseFuture ===

impl<F, Res, K> ResponseFuture<F, Res, K> {
    #[inline]
    pub(crate) fn called(future: F, shard: Arc<Shard<Res, K>>, key: K, shadow: bool) -> Self {
        Self {
            kind: Kind::Called {
                future,
                pending: Some(Pending { shard, key, shadow }),
            },
        }
    }

    pub(crate) fn served(response: Res) -> Self {
        Self {
            kind: Kind::Served {
                response: Some(response),
            },
        }
    }
}

impl<F, Res, K, E> Future for ResponseFuture<F, Res, K>
where
    F: Future<Output = Result<Res, E>>,
    E: Into<BoxError>,
    Res: 'static,
{
    type Output = Result<Res, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Called { future, pending } => {
                let result = ready!(future.poll(cx)).map_err(Into::into);
                let Pending { shard, key, shadow } = pending
                    .take()
                    .expect("ResponseFuture polled after completion");
                Poll::Ready(shard.core.finish(key, shadow, result))
            }
            KindProj::Served { response } => Poll::Ready(Ok(response
                .take()
                .expect("ResponseFuture polled after completion"))),
        }
    }
}

impl<F, Res, K> fmt::Debug for ResponseFuture<F, Res, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.kind {
            Kind::Called { .. } => "called",
            Kind::Served { .. } => "served",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
