//! Which errors are retried: only those whose kind says the next attempt
//! may succeed (connection refused, reset, timeouts, ...), never those that
//! would fail the same way again (an invalid URI, a TLS failure, a builder
//! error).

mod support;

use std::error::Error;
use std::fmt;
use std::io;

use http::{Request, Response};
use support::{get, Log};
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_retry_budget::body::ReplayBody;
use tower_retry_budget::policy::{classify_error, is_transient_error};
use tower_retry_budget::{Class, RetryLayer, SeededRandom};

/// A client error that wraps its cause, as hyper-util's and reqwest's do.
#[derive(Debug)]
struct Wrapped(BoxError);

impl fmt::Display for Wrapped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("client error")
    }
}

impl Error for Wrapped {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.0)
    }
}

#[test]
fn the_documented_kinds_are_transient_and_nothing_else_is() {
    use io::ErrorKind::*;

    let table = [
        (ConnectionRefused, true),
        (ConnectionReset, true),
        (ConnectionAborted, true),
        (NotConnected, true),
        (BrokenPipe, true),
        (UnexpectedEof, true),
        (TimedOut, true),
        (HostUnreachable, true),
        (NetworkUnreachable, true),
        (NetworkDown, true),
        // What TLS and certificate failures surface as.
        (InvalidData, false),
        (InvalidInput, false),
        (PermissionDenied, false),
        (NotFound, false),
        (AddrInUse, false),
        (Other, false),
    ];
    for (kind, transient) in table {
        let bare = io::Error::from(kind);
        assert_eq!(is_transient_error(&bare), transient, "{kind:?}");
        // Found anywhere in the source chain.
        let wrapped = Wrapped(Box::new(io::Error::from(kind)));
        assert_eq!(is_transient_error(&wrapped), transient, "wrapped {kind:?}");
        assert_eq!(
            classify_error(&wrapped).is_retryable(),
            transient,
            "classify {kind:?}"
        );
    }
    assert_eq!(
        classify_error(&Wrapped("no such thing".into())),
        Class::Failed,
        "an error of unknown kind is not retried"
    );
}

/// How many attempts a retry layer makes over a transport whose every
/// attempt fails with `error()`.
async fn attempts_against(error: impl Fn() -> BoxError + Send + Sync + 'static) -> usize {
    let log = Log::new();
    let error = std::sync::Arc::new(error);
    let transport = service_fn({
        let log = log.clone();
        move |req: Request<ReplayBody<String>>| {
            let error = error.clone();
            let log = log.clone();
            async move {
                let _ = support::Scripted::always(&log, 200).oneshot(req).await;
                Err::<Response<String>, BoxError>(error())
            }
        }
    });
    let svc = RetryLayer::new()
        .random(SeededRandom::new(9))
        .layer(transport);
    let _ = svc.oneshot(get()).await.unwrap_err();
    log.count()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_refused_connection_to_a_closed_local_port_is_retried() {
    // A port that was free a moment ago: nothing listens on it now.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    // Each attempt really connects, and fails as a client would.
    let calls = attempts_against(move || {
        let refused = std::net::TcpStream::connect(addr).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
        Box::new(Wrapped(Box::new(refused)))
    })
    .await;
    assert_eq!(calls, 3, "all three attempts");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_invalid_uri_is_not_retried() {
    let calls = attempts_against(|| {
        let e = "http://exa mple/".parse::<http::Uri>().unwrap_err();
        Box::new(Wrapped(Box::new(e)))
    })
    .await;
    assert_eq!(calls, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_tls_failure_is_not_retried() {
    // rustls and native-tls report a failed handshake with a plain-TCP peer
    // (or a bad certificate) as `InvalidData` I/O errors.
    let calls = attempts_against(|| {
        Box::new(Wrapped(Box::new(io::Error::new(
            io::ErrorKind::InvalidData,
            "received corrupt message of type InvalidContentType",
        ))))
    })
    .await;
    assert_eq!(calls, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_builder_error_is_not_retried() {
    let calls = attempts_against(|| "builder error: relative URL without a base".into()).await;
    assert_eq!(calls, 1);
}

#[cfg(feature = "h2")]
#[test]
fn an_http2_refused_stream_is_transient_and_a_protocol_error_is_not() {
    let refused = h2::Error::from(h2::Reason::REFUSED_STREAM);
    assert!(is_transient_error(&refused));
    assert!(is_transient_error(&Wrapped(Box::new(refused))));
    let protocol = h2::Error::from(h2::Reason::PROTOCOL_ERROR);
    assert!(!is_transient_error(&protocol));
}

/// A server that reads each request and closes the connection without an
/// answer: hyper reports "connection closed before message completed".
#[cfg(feature = "hyper")]
#[tokio::test(flavor = "current_thread")]
async fn a_connection_closed_before_the_answer_is_retried() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::AsyncReadExt;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let server = tokio::spawn({
        let accepted = accepted.clone();
        async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                accepted.fetch_add(1, Ordering::Relaxed);
                let mut buf = [0u8; 4096];
                let _ = socket.read(&mut buf).await;
                drop(socket);
            }
        }
    });
    let transport = service_fn(move |req: Request<ReplayBody<String>>| async move {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(connection);
        let answer = sender.send_request(req).await?;
        Ok::<_, BoxError>(answer.map(|_| String::new()))
    });
    let svc = RetryLayer::new()
        .random(SeededRandom::new(5))
        .layer(transport);
    let err = svc.oneshot(get()).await.unwrap_err();
    let hyper_error = tower_resilience_base::error::find::<hyper::Error>(&*err);
    assert!(
        hyper_error.is_some_and(hyper::Error::is_incomplete_message),
        "{err}"
    );
    assert_eq!(accepted.load(Ordering::Relaxed), 3, "all three attempts");
    server.abort();
}
