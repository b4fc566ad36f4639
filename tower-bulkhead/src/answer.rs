//! The HTTP and gRPC answers an HTTP bulkhead gives instead of calling the
//! inner service.

use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};

use crate::NO_RETRY_HEADER;

/// gRPC status code 8.
const GRPC_RESOURCE_EXHAUSTED: HeaderValue = HeaderValue::from_static("8");
const GRPC_CONTENT_TYPE: HeaderValue = HeaderValue::from_static("application/grpc");
const NO_RETRY: HeaderValue = HeaderValue::from_static("1");

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

/// 503 with `Retry-After` and the no-retry mark, or a trailers-only gRPC
/// answer with `grpc-status: 8` (RESOURCE_EXHAUSTED).
pub(crate) fn bulkhead_full<B: Default>(grpc: bool, retry_after_secs: u64) -> Response<B> {
    let mut response = Response::new(B::default());
    if !grpc {
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    }
    let headers = response.headers_mut();
    if grpc {
        // A "trailers-only" response: HTTP 200 whose header block carries
        // the status, with an empty body (gRPC over HTTP/2, "Responses").
        headers.insert(CONTENT_TYPE, GRPC_CONTENT_TYPE);
        headers.insert("grpc-status", GRPC_RESOURCE_EXHAUSTED);
        // Fixed ASCII text without '%': no percent-encoding needed.
        headers.insert("grpc-message", HeaderValue::from_static("bulkhead full"));
    } else {
        headers.insert(RETRY_AFTER, seconds(retry_after_secs));
    }
    headers.insert(NO_RETRY_HEADER, NO_RETRY);
    response
}

/// A header value of whole seconds; the usual small values need no
/// allocation.
fn seconds(secs: u64) -> HeaderValue {
    const SMALL: [&str; 11] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10"];
    match SMALL.get(secs as usize) {
        Some(s) => HeaderValue::from_static(s),
        None => HeaderValue::from(secs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn http_answer_is_503_with_retry_after_and_no_retry_mark() {
        let r: Response<()> = bulkhead_full(false, 3);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[RETRY_AFTER], "3");
        assert_eq!(r.headers()[NO_RETRY_HEADER], "1");
        let r: Response<()> = bulkhead_full(false, 3600);
        assert_eq!(r.headers()[RETRY_AFTER], "3600");
    }

    #[test]
    fn grpc_answer_is_trailers_only_resource_exhausted() {
        let r: Response<()> = bulkhead_full(true, 1);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[CONTENT_TYPE], "application/grpc");
        assert_eq!(r.headers()["grpc-status"], "8");
        assert_eq!(r.headers()["grpc-message"], "bulkhead full");
        assert!(r.headers().get(RETRY_AFTER).is_none());
    }
}
