//! The response body of an HTTP bulkhead in body mode.

use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::compartment::Permit;

pin_project! {
    /// A response body that holds its call's bulkhead slot until the body
    /// has been read to its end, fails, or is dropped; the body of
    /// [`Bulkhead`](crate::Bulkhead) and
    /// [`HttpBulkhead`](crate::HttpBulkhead) in
    /// [`BodyEnd`](crate::release::BodyEnd) mode.
    ///
    /// Frames pass through unchanged. The bulkhead's own answers (503, gRPC
    /// RESOURCE_EXHAUSTED) carry no slot.
    pub struct ResponseBody<B> {
        #[pin]
        inner: B,
        permit: Option<Permit>,
    }
}

// === impl ResponseBody ===

impl<B> ResponseBody<B> {
    pub(crate) fn new(inner: B, permit: Option<Permit>) -> Self {
        Self { inner, permit }
    }

    /// Whether this body still holds a bulkhead slot.
    #[must_use]
    pub fn holds_permit(&self) -> bool {
        self.permit.is_some()
    }

    /// A reference to the wrapped body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// Consumes the wrapper, returning the wrapped body; the slot is given
    /// back now.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B: Default> Default for ResponseBody<B> {
    fn default() -> Self {
        Self::new(B::default(), None)
    }
}

impl<B: Body> Body for ResponseBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        let done = match &frame {
            Some(Ok(_)) => this.inner.is_end_stream(),
            Some(Err(_)) | None => true,
        };
        if done {
            this.permit.take();
        }
        Poll::Ready(frame)
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseBody")
            .field("holds_permit", &self.permit.is_some())
            .finish_non_exhaustive()
    }
}
