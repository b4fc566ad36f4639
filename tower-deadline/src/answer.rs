//! The HTTP and gRPC answers the server layer gives instead of calling (or
//! instead of waiting for) the inner service.

use http::header::{HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, Response, StatusCode};

/// gRPC status code 3.
const GRPC_INVALID_ARGUMENT: HeaderValue = HeaderValue::from_static("3");
/// gRPC status code 4.
const GRPC_DEADLINE_EXCEEDED: HeaderValue = HeaderValue::from_static("4");
const GRPC_CONTENT_TYPE: HeaderValue = HeaderValue::from_static("application/grpc");

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

/// 504, or a trailers-only gRPC answer with `grpc-status: 4`.
pub(crate) fn deadline_exceeded<B: Default>(grpc: bool) -> Response<B> {
    if grpc {
        grpc_trailers_only(GRPC_DEADLINE_EXCEEDED, "deadline exceeded")
    } else {
        status(StatusCode::GATEWAY_TIMEOUT)
    }
}

/// 400, or a trailers-only gRPC answer with `grpc-status: 3`.
pub(crate) fn malformed_timeout<B: Default>(grpc: bool, reason: &'static str) -> Response<B> {
    if grpc {
        grpc_trailers_only(GRPC_INVALID_ARGUMENT, reason)
    } else {
        status(StatusCode::BAD_REQUEST)
    }
}

fn status<B: Default>(status: StatusCode) -> Response<B> {
    let mut response = Response::new(B::default());
    *response.status_mut() = status;
    response
}

/// A "trailers-only" gRPC response: HTTP 200 whose header block carries the
/// status, with an empty body (gRPC over HTTP/2, "Responses").
fn grpc_trailers_only<B: Default>(code: HeaderValue, message: &'static str) -> Response<B> {
    let mut response = Response::new(B::default());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, GRPC_CONTENT_TYPE);
    headers.insert("grpc-status", code);
    // The messages are fixed ASCII text without '%', so they need no
    // percent-encoding.
    headers.insert("grpc-message", HeaderValue::from_static(message));
    response
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
    fn grpc_answers_are_trailers_only() {
        let r: Response<()> = deadline_exceeded(true);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()["grpc-status"], "4");
        assert_eq!(r.headers()[CONTENT_TYPE], "application/grpc");
        let r: Response<()> = malformed_timeout(true, "malformed timeout: unknown unit");
        assert_eq!(r.headers()["grpc-status"], "3");
        let r: Response<()> = deadline_exceeded(false);
        assert_eq!(r.status(), StatusCode::GATEWAY_TIMEOUT);
    }
}
