//! Replayable bodies: buffered bodies are replayed byte for byte, bodies
//! over the limit are sent once, Clone bodies are cloned.

mod support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::stream;
use http::{HeaderMap, Request};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use support::status;
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_retry_budget::body::ReplayBody;
use tower_retry_budget::error::ReplaySuperseded;
use tower_retry_budget::{GaveUp, RetryLayer, SeededRandom, StopReason};

type Frames = Vec<Result<Frame<Bytes>, Infallible>>;
type Streaming = StreamBody<stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

/// A streaming, non-`Clone` body with no size hint.
fn streaming(frames: Frames) -> Streaming {
    StreamBody::new(stream::iter(frames))
}

fn data(chunks: &[&'static str]) -> Frames {
    chunks
        .iter()
        .map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes()))))
        .collect()
}

fn trailers() -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("x-checksum", "abc123".parse().unwrap());
    t
}

/// What one attempt read: its data and trailers.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Received {
    data: Vec<u8>,
    trailers: Option<HeaderMap>,
}

type Seen = Arc<Mutex<Vec<Received>>>;

/// A dependency that reads the whole body, then answers 503 to the first
/// `fail` attempts and 200 after.
fn reader<B>(
    seen: &Seen,
    fail: usize,
) -> impl tower::Service<Request<ReplayBody<B>>, Response = http::Response<String>, Error = BoxError>
       + Clone
where
    B: http_body::Body<Data = Bytes, Error = Infallible> + 'static,
{
    let seen = Arc::clone(seen);
    service_fn(move |req: Request<ReplayBody<B>>| {
        let seen = Arc::clone(&seen);
        async move {
            let collected = req.into_body().collect().await?;
            let trailers = collected.trailers().cloned();
            let data = collected.to_bytes().to_vec();
            let mut seen = seen.lock().unwrap();
            seen.push(Received { data, trailers });
            Ok::<_, BoxError>(status(if seen.len() <= fail { 503 } else { 200 }))
        }
    })
}

fn layer() -> RetryLayer {
    RetryLayer::new().random(SeededRandom::new(53))
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_buffered_body_is_replayed_byte_for_byte_with_trailers() {
    let seen = Seen::default();
    let svc = layer().layer(reader(&seen, 2));
    let mut frames = data(&["hello, ", "replayable ", "world"]);
    frames.push(Ok(Frame::trailers(trailers())));
    let request = Request::put("/doc").body(streaming(frames)).unwrap();

    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    let expected = Received {
        data: b"hello, replayable world".to_vec(),
        trailers: Some(trailers()),
    };
    assert!(seen.iter().all(|r| *r == expected), "{seen:?}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_partly_read_body_is_replayed_in_full() {
    let seen = Seen::default();
    let svc = layer().layer(service_fn({
        let seen = Arc::clone(&seen);
        move |req: Request<ReplayBody<_>>| {
            let seen = Arc::clone(&seen);
            async move {
                let mut body = req.into_body();
                let first_attempt = seen.lock().unwrap().is_empty();
                let data = if first_attempt {
                    // Answer early, after the first frame only.
                    let frame = body.frame().await.unwrap()?;
                    frame.into_data().unwrap().to_vec()
                } else {
                    body.collect().await?.to_bytes().to_vec()
                };
                seen.lock().unwrap().push(Received {
                    data,
                    trailers: None,
                });
                Ok::<_, BoxError>(status(if first_attempt { 503 } else { 200 }))
            }
        }
    }));
    let request = Request::put("/doc")
        .body(streaming(data(&["ab", "cd", "ef"])))
        .unwrap();
    assert_eq!(svc.oneshot(request).await.unwrap().status(), 200);
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].data, b"ab");
    assert_eq!(seen[1].data, b"abcdef");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_body_over_the_limit_is_sent_once() {
    let seen = Seen::default();
    let svc = layer().body_limit(1024).layer(reader(&seen, usize::MAX));
    let chunk: &'static str = Box::leak("x".repeat(512).into_boxed_str());
    let request = Request::put("/big")
        .body(streaming(data(&[chunk; 4])))
        .unwrap();

    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 503);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "sent once");
    assert_eq!(seen[0].data.len(), 2048, "sent whole");
    assert_eq!(
        response.extensions().get::<GaveUp>().unwrap().reason(),
        StopReason::NotRetryable
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_body_known_to_exceed_the_limit_is_not_buffered() {
    let seen = Seen::default();
    let svc = layer().layer(reader(&seen, usize::MAX));
    let big = Full::new(Bytes::from(vec![7u8; 100 * 1024]));
    let response = svc
        .oneshot(Request::put("/big").body(big).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_endless_body_is_sent_once() {
    let read = Arc::new(Mutex::new(Vec::new()));
    let svc = layer().layer(service_fn({
        let read = Arc::clone(&read);
        move |req: Request<ReplayBody<_>>| {
            let read = Arc::clone(&read);
            async move {
                // Read 100 KiB of a body that never ends, then give up.
                let mut body = req.into_body();
                let mut n = 0;
                while n < 100 * 1024 {
                    n += body.frame().await.unwrap()?.into_data().unwrap().len();
                }
                read.lock().unwrap().push(n);
                Ok::<_, BoxError>(status(503))
            }
        }
    }));
    let endless = StreamBody::new(stream::repeat_with(|| {
        Ok::<_, Infallible>(Frame::data(Bytes::from_static(&[1u8; 1024])))
    }));
    let response = svc
        .oneshot(Request::put("/stream").body(endless).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(*read.lock().unwrap(), [100 * 1024]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_empty_body_is_replayed_without_buffering() {
    let seen = Seen::default();
    let svc = layer().layer(reader(&seen, 1));
    let request = Request::get("/")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    assert_eq!(svc.oneshot(request).await.unwrap().status(), 200);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|r| r.data.is_empty()));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn clone_bodies_are_cloned_whatever_their_size() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let svc = layer().clone_bodies().layer(service_fn({
        let seen = Arc::clone(&seen);
        move |req: Request<Full<Bytes>>| {
            let seen = Arc::clone(&seen);
            async move {
                let bytes = req.into_body().collect().await?.to_bytes();
                let mut seen = seen.lock().unwrap();
                seen.push(bytes);
                Ok::<_, BoxError>(status(if seen.len() < 3 { 503 } else { 200 }))
            }
        }
    }));
    let body = Bytes::from(vec![9u8; 200 * 1024]);
    let request = Request::put("/big").body(Full::new(body.clone())).unwrap();
    assert_eq!(svc.oneshot(request).await.unwrap().status(), 200);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|b| *b == body));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_body_of_a_superseded_attempt_fails() {
    let stash: Arc<Mutex<Vec<ReplayBody<_>>>> = Arc::default();
    let svc = layer().layer(service_fn({
        let stash = Arc::clone(&stash);
        move |req: Request<ReplayBody<_>>| {
            let stash = Arc::clone(&stash);
            async move {
                let mut stash = stash.lock().unwrap();
                stash.push(req.into_body());
                Ok::<_, BoxError>(status(if stash.len() == 1 { 503 } else { 200 }))
            }
        }
    }));
    let request = Request::put("/doc")
        .body(streaming(data(&["a", "b"])))
        .unwrap();
    assert_eq!(svc.oneshot(request).await.unwrap().status(), 200);

    let mut bodies = std::mem::take(&mut *stash.lock().unwrap());
    let current = bodies.pop().unwrap();
    let mut old = bodies.pop().unwrap();
    let err = old.frame().await.unwrap().unwrap_err();
    assert!(err.is::<ReplaySuperseded>());
    assert_eq!(current.collect().await.unwrap().to_bytes(), "ab");
}
