//! Transient errors of the HTTP stacks the layer knows by type (features
//! `hyper` and `h2`); without a feature, its check says no.

use std::error::Error;

/// hyper's own transient errors: the connection closed (before or while
/// the answer came), the request was canceled before it was sent, or a
/// timeout of hyper's.
#[cfg(feature = "hyper")]
pub(crate) fn hyper(e: &(dyn Error + 'static)) -> bool {
    e.downcast_ref::<hyper::Error>().is_some_and(|e| {
        e.is_incomplete_message() || e.is_closed() || e.is_canceled() || e.is_timeout()
    })
}

#[cfg(not(feature = "hyper"))]
pub(crate) fn hyper(_e: &(dyn Error + 'static)) -> bool {
    false
}

/// HTTP/2 refusals that say the server did not process the request: a
/// stream reset with REFUSED_STREAM, or a GOAWAY with NO_ERROR (a graceful
/// shutdown that did not take this stream).
#[cfg(feature = "h2")]
pub(crate) fn h2(e: &(dyn Error + 'static)) -> bool {
    e.downcast_ref::<h2::Error>()
        .is_some_and(|e| match e.reason() {
            Some(h2::Reason::REFUSED_STREAM) => true,
            Some(h2::Reason::NO_ERROR) => e.is_go_away(),
            _ => false,
        })
}

#[cfg(not(feature = "h2"))]
pub(crate) fn h2(_e: &(dyn Error + 'static)) -> bool {
    false
}
