//! The response body of [`FaultInjection`](crate::FaultInjection).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_resilience_base::BoxError;

use crate::error::InjectedFault;
use crate::plan::FaultKind;

pin_project! {
    /// The response body of a fault layer: the service's body, passed
    /// through; or, for an [`AbortBody`](FaultKind::AbortBody) fault, that
    /// body cut after a number of frames by an [`InjectedFault`] error (the
    /// rest of the body is dropped unread); or the empty body of an
    /// injected status. Errors of the service's body are boxed, unchanged.
    #[derive(Debug)]
    pub struct FaultBody<B> {
        #[pin]
        inner: Option<B>,
        // Frames left before the abort, for an aborted body.
        abort: Option<(u32, Arc<str>)>,
    }
}

impl<B> FaultBody<B> {
    pub(crate) fn pass(inner: B) -> Self {
        Self {
            inner: Some(inner),
            abort: None,
        }
    }

    pub(crate) fn aborted(inner: B, after_frames: u32, layer: Arc<str>) -> Self {
        Self {
            inner: Some(inner),
            abort: Some((after_frames, layer)),
        }
    }
}

impl<B> Default for FaultBody<B> {
    /// An empty body (an injected status's).
    fn default() -> Self {
        Self {
            inner: None,
            abort: None,
        }
    }
}

impl<B> Body for FaultBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        if matches!(this.abort, Some((0, _))) {
            let layer = this
                .abort
                .take()
                .map(|(_, layer)| layer)
                .unwrap_or_default();
            this.inner.set(None);
            return Poll::Ready(Some(Err(Box::new(InjectedFault::new(
                layer,
                FaultKind::AbortBody,
            )))));
        }
        let Some(inner) = this.inner.as_mut().as_pin_mut() else {
            return Poll::Ready(None);
        };
        match inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some((left, _)) = this.abort {
                    *left -= 1;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(error.into()))),
            Poll::Ready(None) => {
                // Ended before the abort: the abort still comes, in place
                // of the end (a connection lost before the last frame).
                if let Some((_, layer)) = this.abort.take() {
                    this.inner.set(None);
                    return Poll::Ready(Some(Err(Box::new(InjectedFault::new(
                        layer,
                        FaultKind::AbortBody,
                    )))));
                }
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.abort.is_none() && self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.inner, &self.abort) {
            (Some(inner), None) => inner.size_hint(),
            (Some(inner), Some(_)) => {
                // It may end early.
                let mut hint = SizeHint::new();
                if let Some(upper) = inner.size_hint().upper() {
                    hint.set_upper(upper);
                }
                hint
            }
            (None, _) => SizeHint::with_exact(0),
        }
    }
}
