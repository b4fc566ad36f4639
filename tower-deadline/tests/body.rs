//! The deadline lasts until the response body ends: a body that stalls
//! after the head fails at the deadline (client: `DeadlineExceeded`;
//! server: an error, or DEADLINE_EXCEEDED trailers on a gRPC stream), a
//! slow but steady body within the deadline succeeds, and a body that is
//! complete in its first poll never arms a timer.

use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, StreamBody};
use tokio::time::{advance, Instant};
use tokio_test::{assert_pending, assert_ready, task};
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
use tower_deadline::body::ResponseBody;
use tower_deadline::error::DeadlineExceeded;
use tower_deadline::{ClientDeadlineLayer, Deadline, ServerDeadlineLayer};

/// One step of a scripted body.
#[derive(Debug, Clone)]
enum Step {
    Wait(u64),
    Data(&'static str),
    Fail,
    Stall,
}

/// A body that plays `steps`: waits (milliseconds of paused time), data
/// frames, a failure, or a stall for ever.
fn scripted(steps: Vec<Step>) -> UnsyncBoxBody<Bytes, BoxError> {
    StreamBody::new(stream::unfold(steps.into_iter(), |mut steps| async move {
        loop {
            match steps.next()? {
                Step::Wait(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                Step::Data(text) => return Some((Ok(Frame::data(Bytes::from(text))), steps)),
                Step::Fail => return Some((Err("connection reset mid-body".into()), steps)),
                Step::Stall => std::future::pending::<()>().await,
            }
        }
    }))
    .boxed_unsync()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A client that gives every call `timeout` around a dependency that
/// answers its head at once with `steps` as the body.
fn client(
    timeout: u64,
    steps: Vec<Step>,
) -> impl tower::Service<
    Request<()>,
    Response = Response<ResponseBody<UnsyncBoxBody<Bytes, BoxError>>>,
    Error = BoxError,
> {
    ServiceBuilder::new()
        .layer(ClientDeadlineLayer::new().default_timeout(ms(timeout)))
        .service(service_fn(move |_req: Request<()>| {
            let body = scripted(steps.clone());
            async move { Ok::<_, BoxError>(Response::new(body)) }
        }))
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_body_that_stalls_after_the_head_fails_at_the_deadline_not_before() {
    let start = Instant::now();
    let response = client(100, vec![Step::Data("first"), Step::Stall])
        .oneshot(Request::new(()))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    assert!(!body.is_end_stream(), "open until it ends or is cut");
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "first");

    let mut next = task::spawn(body.frame());
    assert_pending!(next.poll());
    // t-1: still waiting for the body.
    advance(ms(99)).await;
    assert_pending!(next.poll());
    // t: the deadline.
    advance(ms(1)).await;
    assert!(next.is_woken());
    let err = assert_ready!(next.poll()).unwrap().unwrap_err();
    assert!(err.is::<DeadlineExceeded>(), "{err:?}");
    assert_eq!(start.elapsed(), ms(100));
    drop(next);
    // Cut: nothing more, and the body says it ended.
    assert!(body.is_end_stream());
    assert_eq!(body.size_hint().exact(), Some(0));
    assert!(format!("{body:?}").contains("cut: true"), "{body:?}");
    assert!(body.frame().await.is_none());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_body_passes_on_its_size_hint_and_says_what_it_is() {
    let hello = || {
        http_body_util::Full::new(Bytes::from("hello"))
            .map_err(|never| -> BoxError { match never {} })
            .boxed_unsync()
    };
    let response = ServiceBuilder::new()
        .layer(ClientDeadlineLayer::new().default_timeout(ms(100)))
        .service(service_fn(move |_req: Request<()>| {
            let body = hello();
            async move { Ok::<_, BoxError>(Response::new(body)) }
        }))
        .oneshot(Request::new(()))
        .await
        .unwrap();
    let body = response.into_body();
    assert_eq!(body.size_hint().exact(), Some(5));
    let shown = format!("{body:?}");
    assert!(shown.starts_with("ResponseBody"), "{shown}");
    assert!(shown.contains("cut: false"), "{shown}");
    assert_eq!(body.collect().await.unwrap().to_bytes(), "hello");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_body_cut_while_the_caller_was_not_reading_fails_on_its_next_poll() {
    let response = client(100, vec![Step::Data("a"), Step::Wait(50), Step::Data("b")])
        .oneshot(Request::new(()))
        .await
        .unwrap();
    let mut body = response.into_body();
    body.frame().await.unwrap().unwrap();
    // The second frame arms the timer while it waits, and comes in time.
    let second = body.frame().await.unwrap().unwrap();
    assert_eq!(second.into_data().unwrap(), "b");
    // The caller looks away past the deadline; the next poll is the cut.
    advance(ms(60)).await;
    let err = body.frame().await.unwrap().unwrap_err();
    assert!(err.is::<DeadlineExceeded>());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_slow_but_steady_body_within_the_deadline_succeeds() {
    // 100 chunks, 9 ms apart: 900 ms of a 1 s budget.
    let mut steps = Vec::new();
    for _ in 0..100 {
        steps.push(Step::Wait(9));
        steps.push(Step::Data("0123456789"));
    }
    let start = Instant::now();
    let response = client(1000, steps).oneshot(Request::new(())).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 1000);
    assert_eq!(start.elapsed(), ms(900));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_body_complete_in_its_first_poll_arms_no_timer() {
    let svc = ServiceBuilder::new()
        .layer(ClientDeadlineLayer::new().default_timeout(ms(100)))
        .service(service_fn(|_req: Request<()>| async {
            Ok::<_, BoxError>(Response::new(http_body_util::Full::new(Bytes::from(
                "whole",
            ))))
        }));
    let response = svc.oneshot(Request::new(())).await.unwrap();
    let mut body = response.into_body();
    assert!(body.deadline().is_some(), "bounded until it ends");
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "whole");
    assert!(
        !body.is_timer_armed(),
        "no timer for a body that never waited"
    );
    assert!(body.frame().await.is_none());
    assert_eq!(body.deadline(), None, "released at the end");
    assert!(!body.is_cut());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_timer_is_released_when_the_body_ends() {
    let response = client(100, vec![Step::Wait(10), Step::Data("late")])
        .oneshot(Request::new(()))
        .await
        .unwrap();
    let mut body = response.into_body();
    let mut next = task::spawn(body.frame());
    assert_pending!(next.poll());
    drop(next);
    assert!(body.is_timer_armed(), "armed while it waits");
    body.frame().await.unwrap().unwrap();
    assert!(body.frame().await.is_none());
    assert!(!body.is_timer_armed());
    assert_eq!(body.deadline(), None);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_body_error_passes_through_boxed() {
    let response = client(100, vec![Step::Data("a"), Step::Fail])
        .oneshot(Request::new(()))
        .await
        .unwrap();
    let err = response.into_body().collect().await.unwrap_err();
    assert!(!err.is::<DeadlineExceeded>());
    assert_eq!(err.to_string(), "connection reset mid-body");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_body_goes_on_under_the_timer_the_head_armed() {
    // The head takes 60 ms (the future arms the timer), the body stalls:
    // the cut comes at the call's deadline, 100 ms after the start.
    let start = Instant::now();
    let svc = ServiceBuilder::new()
        .layer(ClientDeadlineLayer::new().default_timeout(ms(100)))
        .service(service_fn(|_req: Request<()>| async {
            tokio::time::sleep(ms(60)).await;
            Ok::<_, BoxError>(Response::new(scripted(vec![Step::Stall])))
        }));
    let response = svc.oneshot(Request::new(())).await.unwrap();
    assert_eq!(start.elapsed(), ms(60));
    let body = response.into_body();
    assert!(body.is_timer_armed(), "the head's timer, handed over");
    let err = body.collect().await.unwrap_err();
    assert!(err.is::<DeadlineExceeded>());
    assert_eq!(start.elapsed(), ms(100));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_head_only_layer_leaves_the_body_unbounded() {
    let svc = ServiceBuilder::new()
        .layer(
            ClientDeadlineLayer::new()
                .default_timeout(ms(100))
                .head_only(),
        )
        .service(service_fn(|_req: Request<()>| async {
            Ok::<_, BoxError>(Response::new(scripted(vec![
                Step::Wait(500),
                Step::Data("late"),
            ])))
        }));
    // The body is the inner service's own: nothing wraps it.
    let response: Response<UnsyncBoxBody<Bytes, BoxError>> =
        svc.oneshot(Request::new(())).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "late");
}

// === server ===

/// A handler whose body streams `steps`, behind a server deadline that
/// gives requests without a budget 100 ms.
fn server(
    steps: Vec<Step>,
) -> impl tower::Service<
    Request<()>,
    Response = Response<impl Body<Data = Bytes, Error = BoxError> + Unpin>,
    Error = std::convert::Infallible,
> {
    ServiceBuilder::new()
        .layer(ServerDeadlineLayer::new().default_timeout(ms(100)))
        .service(service_fn(move |_req: Request<()>| {
            let body = scripted(steps.clone());
            async move { Ok::<_, std::convert::Infallible>(Response::new(body)) }
        }))
}

fn grpc_request() -> Request<()> {
    Request::post("/stock.Stock/Watch")
        .header("content-type", "application/grpc")
        .body(())
        .unwrap()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_streaming_handler_body_is_cut_at_the_callers_deadline() {
    let start = Instant::now();
    let Ok(response) = server(vec![Step::Data("tick"), Step::Stall])
        .oneshot(Request::new(()))
        .await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    body.frame().await.unwrap().unwrap();
    let err = body.frame().await.unwrap().unwrap_err();
    assert!(err.is::<DeadlineExceeded>());
    assert_eq!(start.elapsed(), ms(100));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_grpc_stream_cut_at_the_deadline_ends_with_deadline_exceeded_trailers() {
    let Ok(response) = server(vec![Step::Data("tick"), Step::Stall])
        .oneshot(grpc_request())
        .await;
    let mut body = response.into_body();
    body.frame().await.unwrap().unwrap();
    let trailers: HeaderMap = body
        .frame()
        .await
        .unwrap()
        .unwrap()
        .into_trailers()
        .expect("trailers end the cut stream");
    assert_eq!(trailers["grpc-status"], "4");
    assert!(body.frame().await.is_none());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_streaming_body_is_produced_in_the_deadline_scope() {
    let svc = ServiceBuilder::new()
        .layer(ServerDeadlineLayer::new().default_timeout(ms(100)))
        .service(service_fn(|_req: Request<()>| async {
            // Each frame reports the deadline its producer sees.
            let frames = stream::unfold(0, |n| async move {
                (n < 2).then(|| {
                    let seen = Deadline::current().map(|d| d.remaining().as_millis());
                    let text = format!("{seen:?};");
                    (Ok::<_, BoxError>(Frame::data(Bytes::from(text))), n + 1)
                })
            });
            Ok::<_, std::convert::Infallible>(Response::new(StreamBody::new(frames).boxed_unsync()))
        }));
    let Ok(response) = svc.oneshot(Request::new(())).await;
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "Some(100);Some(100);");
}

/// A body of a gibibyte, read slowly but steadily: 16,384 frames of
/// 64 KiB, 1 ms apart (16.4 s of paused time), within a 30 s deadline.
struct Steady {
    left: usize,
    sleep: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl Body for Steady {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        static CHUNK: [u8; 64 * 1024] = [7; 64 * 1024];
        if self.left == 0 {
            return std::task::Poll::Ready(None);
        }
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(ms(1))));
        std::task::ready!(std::future::Future::poll(sleep.as_mut(), cx));
        self.sleep = None;
        self.left -= 1;
        std::task::Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&CHUNK)))))
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_body_of_a_gibibyte_read_slowly_but_steadily_within_the_deadline_succeeds() {
    let start = Instant::now();
    let svc = ServiceBuilder::new()
        .layer(ClientDeadlineLayer::new().default_timeout(Duration::from_secs(30)))
        .service(service_fn(|_req: Request<()>| async {
            Ok::<_, BoxError>(Response::new(Steady {
                left: 16 * 1024,
                sleep: None,
            }))
        }));
    let mut body = svc.oneshot(Request::new(())).await.unwrap().into_body();
    let mut read = 0usize;
    while let Some(frame) = body.frame().await {
        read += frame.unwrap().into_data().unwrap().len();
    }
    assert_eq!(read, 1 << 30);
    assert_eq!(start.elapsed(), ms(16 * 1024));
    assert!(!body.is_cut());
}
