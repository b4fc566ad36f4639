//! The HTTP and gRPC answers of an open circuit in server mode.

use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, Response, StatusCode};

use crate::error::CircuitOpen;

/// `x-tower-no-retry`: the same header as `tower_retry_budget::NO_RETRY_HEADER`.
const NO_RETRY: HeaderName = HeaderName::from_static("x-tower-no-retry");
const ONE: HeaderValue = HeaderValue::from_static("1");
const GRPC_CONTENT_TYPE: HeaderValue = HeaderValue::from_static("application/grpc");
const GRPC_UNAVAILABLE: HeaderValue = HeaderValue::from_static("14");

/// Whether a request is a gRPC call: its content type is `application/grpc`
/// or one of its `+proto`, `+json`, `;...` variants.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get(CONTENT_TYPE).is_some_and(|v| {
        let v = v.as_bytes();
        let prefix = b"application/grpc";
        v.len() >= prefix.len()
            && v[..prefix.len()].eq_ignore_ascii_case(prefix)
            && matches!(v.get(prefix.len()), None | Some(b'+' | b';'))
    })
}

/// `503 Service Unavailable` with `Retry-After` (whole seconds until the
/// probe, rounded up) and `x-tower-no-retry: 1`; for gRPC, a trailers-only
/// answer with `grpc-status: 14` (UNAVAILABLE).
pub(crate) fn circuit_open<B: Default>(grpc: bool, open: &CircuitOpen) -> Response<B> {
    let mut response = Response::new(B::default());
    if !grpc {
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    }
    let headers = response.headers_mut();
    headers.insert(NO_RETRY, ONE);
    if grpc {
        headers.insert(CONTENT_TYPE, GRPC_CONTENT_TYPE);
        headers.insert("grpc-status", GRPC_UNAVAILABLE);
        // Fixed ASCII text without '%': no percent-encoding needed.
        headers.insert("grpc-message", HeaderValue::from_static("circuit open"));
    } else {
        let retry_after = open.retry_after();
        let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
        headers.insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn headers(content_type: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        h
    }

    #[test]
    fn recognises_grpc_content_types() {
        assert!(is_grpc(&headers("application/grpc")));
        assert!(is_grpc(&headers("application/grpc+proto")));
        assert!(is_grpc(&headers("Application/GRPC;charset=utf-8")));
        assert!(!is_grpc(&headers("application/grpc-web")));
        assert!(!is_grpc(&headers("application/json")));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn retry_after_rounds_up() {
        let open = CircuitOpen::new(
            std::sync::Arc::new(crate::error::Name("x".into())),
            Duration::from_millis(4001),
            false,
        );
        let r: Response<()> = circuit_open(false, &open);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[RETRY_AFTER], "5");
        assert_eq!(r.headers()["x-tower-no-retry"], "1");
        let open = CircuitOpen::new(
            std::sync::Arc::new(crate::error::Name("x".into())),
            Duration::from_secs(3),
            false,
        );
        let r: Response<()> = circuit_open(false, &open);
        assert_eq!(r.headers()[RETRY_AFTER], "3");
        let r: Response<()> = circuit_open(true, &open);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()["grpc-status"], "14");
        assert_eq!(r.headers()[CONTENT_TYPE], "application/grpc");
    }
}
