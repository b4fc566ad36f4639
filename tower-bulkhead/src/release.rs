//! When a bulkhead gives a call's slot back: when the response head is
//! ready ([`Head`], the default of both layers) or when the response body
//! has been read to its end, has failed or has been dropped ([`BodyEnd`]).
//!
//! Choose with
//! [`BulkheadLayer::hold_until_body_end`](crate::BulkheadLayer::hold_until_body_end)
//! (clients) or
//! [`HttpBulkheadLayer::hold_until_body_end`](crate::HttpBulkheadLayer::hold_until_body_end)
//! (servers). The one-line stacks of `tower-breaker` use [`BodyEnd`]: a body
//! that streams or stalls after the head still occupies the dependency.

use http::Response;

use crate::body::ResponseBody;
use crate::compartment::Permit;

/// When the slot is given back. Sealed: implemented by [`Head`] and
/// [`BodyEnd`] only.
pub trait Release: sealed::Sealed + Send + Sync + 'static {
    /// The response body type of the HTTP bulkhead: the inner body `B` for
    /// [`Head`], [`ResponseBody<B>`] for [`BodyEnd`].
    type Body<B>;

    /// Hands the inner service's response over, with the slot.
    #[doc(hidden)]
    fn finish<B>(response: Response<B>, permit: Option<Permit>) -> Response<Self::Body<B>>;

    /// Adapts one of the bulkhead's own answers.
    #[doc(hidden)]
    fn answer<B>(response: Response<B>) -> Response<Self::Body<B>>;
}

/// Release the slot as soon as the inner service has produced the response
/// head (or failed, or the future was dropped). The response body type is
/// unchanged. The default.
#[derive(Debug, Clone, Copy, Default)]
pub struct Head {
    _p: (),
}

/// Keep the slot until the response body has been read to its end, has
/// failed, or has been dropped: a streaming body still occupies the
/// dependency. The response body is wrapped in
/// [`ResponseBody`], which carries the slot.
#[derive(Debug, Clone, Copy, Default)]
pub struct BodyEnd {
    _p: (),
}

// === impl Head ===

impl sealed::Sealed for Head {}

impl Release for Head {
    type Body<B> = B;

    #[inline]
    fn finish<B>(response: Response<B>, permit: Option<Permit>) -> Response<B> {
        drop(permit);
        response
    }

    #[inline]
    fn answer<B>(response: Response<B>) -> Response<B> {
        response
    }
}

// === impl BodyEnd ===

impl sealed::Sealed for BodyEnd {}

impl Release for BodyEnd {
    type Body<B> = ResponseBody<B>;

    #[inline]
    fn finish<B>(response: Response<B>, permit: Option<Permit>) -> Response<ResponseBody<B>> {
        response.map(|body| ResponseBody::new(body, permit))
    }

    #[inline]
    fn answer<B>(response: Response<B>) -> Response<ResponseBody<B>> {
        response.map(|body| ResponseBody::new(body, None))
    }
}

pub(crate) mod sealed {
    /// Keeps [`Release`](super::Release) closed to other implementations.
    #[allow(unreachable_pub)]
    pub trait Sealed {}
}
