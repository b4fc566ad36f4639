//! gRPC status codes, parsed once, and how to recognise a gRPC call.

use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue};

/// `grpc-status`: the status of a gRPC call, in the trailers, or in the
/// headers of a trailers-only answer.
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// `grpc-message`: the percent-encoded message that goes with
/// [`GRPC_STATUS`].
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// `grpc-retry-pushback-ms`: how long the server asks the client to wait
/// before retrying (a negative or malformed value means "do not retry").
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// The content type of gRPC answers built by the toolkit.
pub const GRPC_CONTENT_TYPE: HeaderValue = HeaderValue::from_static("application/grpc");

/// Whether a request (or response) is gRPC: its content type is
/// `application/grpc` or one of its `+proto`, `+json`, `;...` variants.
///
/// # Example
///
/// ```
/// use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
/// use tower_resilience_base::grpc::is_grpc;
///
/// let mut headers = HeaderMap::new();
/// headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc+proto"));
/// assert!(is_grpc(&headers));
/// headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc-web"));
/// assert!(!is_grpc(&headers));
/// ```
#[must_use]
pub fn is_grpc(headers: &HeaderMap) -> bool {
    const PREFIX: &[u8] = b"application/grpc";
    if headers.is_empty() {
        return false;
    }
    headers.get(CONTENT_TYPE).is_some_and(|v| {
        let v = v.as_bytes();
        v.len() >= PREFIX.len()
            && v[..PREFIX.len()].eq_ignore_ascii_case(PREFIX)
            && matches!(v.get(PREFIX.len()), None | Some(b'+' | b';'))
    })
}

/// A gRPC status code (gRPC's `statuscodes.md`).
///
/// Parsed once per response with [`GrpcCode::from_headers`]; the two
/// questions the layers ask of it are answered here, once:
/// [`is_dependency_failure`](GrpcCode::is_dependency_failure) (the
/// breaker's default) and [`is_transient`](GrpcCode::is_transient) (the
/// retry layer's default).
///
/// # Example
///
/// ```
/// use http::{HeaderMap, HeaderValue};
/// use tower_resilience_base::grpc::GrpcCode;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("grpc-status", HeaderValue::from_static("14"));
/// let code = GrpcCode::from_headers(&headers).unwrap();
/// assert_eq!(code, GrpcCode::Unavailable);
/// assert!(code.is_transient());
/// assert!(code.is_dependency_failure());
/// assert!(!GrpcCode::NotFound.is_dependency_failure());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum GrpcCode {
    /// 0: not an error.
    Ok = 0,
    /// 1: the operation was cancelled, typically by the caller.
    Cancelled = 1,
    /// 2: an unknown error (also what an unrecognised code means).
    Unknown = 2,
    /// 3: the client gave an invalid argument.
    InvalidArgument = 3,
    /// 4: the deadline passed before the operation completed.
    DeadlineExceeded = 4,
    /// 5: an entity was not found.
    NotFound = 5,
    /// 6: the entity already exists.
    AlreadyExists = 6,
    /// 7: the caller may not do this.
    PermissionDenied = 7,
    /// 8: a resource (quota, concurrency) is exhausted.
    ResourceExhausted = 8,
    /// 9: the system is not in a state required for the operation.
    FailedPrecondition = 9,
    /// 10: the operation was aborted (a concurrency conflict).
    Aborted = 10,
    /// 11: out of the valid range.
    OutOfRange = 11,
    /// 12: not implemented.
    Unimplemented = 12,
    /// 13: an internal error.
    Internal = 13,
    /// 14: the service is unavailable, usually transiently.
    Unavailable = 14,
    /// 15: unrecoverable data loss.
    DataLoss = 15,
    /// 16: the caller is not authenticated.
    Unauthenticated = 16,
}

// === impl GrpcCode ===

impl GrpcCode {
    const ALL: [GrpcCode; 17] = [
        Self::Ok,
        Self::Cancelled,
        Self::Unknown,
        Self::InvalidArgument,
        Self::DeadlineExceeded,
        Self::NotFound,
        Self::AlreadyExists,
        Self::PermissionDenied,
        Self::ResourceExhausted,
        Self::FailedPrecondition,
        Self::Aborted,
        Self::OutOfRange,
        Self::Unimplemented,
        Self::Internal,
        Self::Unavailable,
        Self::DataLoss,
        Self::Unauthenticated,
    ];

    const TEXT: [&'static str; 17] = [
        "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
    ];

    /// The code with number `n`; numbers gRPC does not define are
    /// [`Unknown`](GrpcCode::Unknown), as the gRPC spec says clients must
    /// treat them.
    #[must_use]
    pub const fn from_u32(n: u32) -> Self {
        if n < 17 {
            Self::ALL[n as usize]
        } else {
            Self::Unknown
        }
    }

    /// The code in a `grpc-status` value; `None` when the value is not a
    /// decimal number.
    #[must_use]
    pub fn parse(value: &[u8]) -> Option<Self> {
        match value {
            [d @ b'0'..=b'9'] => Some(Self::from_u32(u32::from(d - b'0'))),
            [] => None,
            _ if value.len() <= 9 && value.iter().all(u8::is_ascii_digit) => {
                let n = value.iter().fold(0u32, |n, d| n * 10 + u32::from(d - b'0'));
                Some(Self::from_u32(n))
            }
            _ => None,
        }
    }

    /// The code in the `grpc-status` header, if there is one that parses.
    #[must_use]
    pub fn from_headers(headers: &HeaderMap) -> Option<Self> {
        if headers.is_empty() {
            return None;
        }
        Self::parse(headers.get(GRPC_STATUS)?.as_bytes())
    }

    /// The code's number.
    #[must_use]
    pub const fn as_u32(self) -> u32 {
        self as u32
    }

    /// The code as a `grpc-status` header value (no allocation).
    #[must_use]
    pub const fn header_value(self) -> HeaderValue {
        HeaderValue::from_static(Self::TEXT[self as usize])
    }

    /// Whether the code says the *dependency* failed, so a circuit breaker
    /// counts it: UNKNOWN, DEADLINE_EXCEEDED, INTERNAL, UNAVAILABLE,
    /// DATA_LOSS. The others describe the caller's request (NOT_FOUND,
    /// INVALID_ARGUMENT, ...), a success, or a cancellation by the caller.
    #[must_use]
    pub const fn is_dependency_failure(self) -> bool {
        matches!(
            self,
            Self::Unknown
                | Self::DeadlineExceeded
                | Self::Internal
                | Self::Unavailable
                | Self::DataLoss
        )
    }

    /// Whether the next attempt may succeed, so a retry layer retries it:
    /// UNAVAILABLE only (gRPC's own guidance: the one code that is safe to
    /// retry blindly).
    #[must_use]
    pub const fn is_transient(self) -> bool {
        matches!(self, Self::Unavailable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_code_and_treats_unknown_numbers_as_unknown() {
        for n in 0..17u32 {
            let text = n.to_string();
            let code = GrpcCode::parse(text.as_bytes()).unwrap();
            assert_eq!(code.as_u32(), n);
            assert_eq!(code.header_value(), text.as_str());
        }
        assert_eq!(GrpcCode::parse(b"99"), Some(GrpcCode::Unknown));
        assert_eq!(GrpcCode::parse(b"4294967295"), None, "too long");
        assert_eq!(GrpcCode::parse(b""), None);
        assert_eq!(GrpcCode::parse(b"1a"), None);
        assert_eq!(GrpcCode::parse(b"-1"), None);
    }
}
