//! Replayable request bodies.
//!
//! A request can be retried only if its body can be sent again. The layer
//! has two modes, chosen by a type parameter of [`RetryLayer`]:
//!
//! - [`Buffered`] (the default) accepts any [`http_body::Body`]. It wraps
//!   the body in a [`ReplayBody`] that records the frames (data and
//!   trailers) as the inner service polls them during the first attempt,
//!   up to a limit (64 KiB by default), and replays them byte for byte on a
//!   retry, then continues with the rest of the original body if the first
//!   attempt did not read it all. A body whose size hint already exceeds
//!   the limit is passed through without recording; a body that grows past
//!   the limit while it is sent, or fails, stops being replayable. Either
//!   way the request is sent once and its failure returned. An empty body
//!   costs nothing. The inner service sees `Request<ReplayBody<B>>`, with
//!   `Bytes` data and [`BoxError`] errors, which hyper,
//!   tonic and reqwest-style clients accept.
//! - [`CloneBody`] ([`RetryLayer::clone_bodies`]) is for `Clone` bodies such
//!   as `Full<Bytes>` or `String`: the body is cloned before each attempt
//!   and the inner service sees `Request<B>` unchanged, with no size limit.
//!
//! Two type errors follow from the mode. "The retry layer cannot replay a
//! request body of type `()`" means the mode cannot replay the body: the
//! default [`Buffered`] needs an [`http_body::Body`] (`()` is not one:
//! send a `String`, `Full<Bytes>` or `Empty<Bytes>`), [`CloneBody`] a
//! `Clone` body. An error that the inner service gets
//! `Request<ReplayBody<B>>` where it expects `Request<B>` (a mismatched
//! `service_fn` closure, or the unsatisfied bounds of `oneshot`) means the
//! transport was written for `Request<B>`: make it accept any
//! [`http_body::Body`] (hyper, tonic and reqwest-style clients do), or use
//! [`RetryLayer::clone_bodies`] for a `Clone` body. To call such a
//! transport without the retry layer (in a test, say), wrap the body with
//! [`ReplayBody::new`].
//!
//! [`RetryLayer`]: crate::RetryLayer
//! [`RetryLayer::clone_bodies`]: crate::RetryLayer::clone_bodies

use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::error::ReplaySuperseded;
use crate::BoxError;

/// The default limit of a [`Buffered`] body: 64 KiB.
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// Replay mode that buffers any body up to a limit (the default); see the
/// [module docs](self).
#[derive(Debug, Clone, Copy, Default)]
pub struct Buffered {
    _p: (),
}

/// Replay mode for `Clone` bodies, which are cloned for each attempt; see
/// the [module docs](self).
#[derive(Debug, Clone, Copy, Default)]
pub struct CloneBody {
    _p: (),
}

/// How a replay mode turns the caller's body into the bodies of the
/// attempts. Implemented by [`Buffered`] and [`CloneBody`] only (sealed).
///
/// [`Buffered`] implements it for every [`http_body::Body`], [`CloneBody`]
/// for every `Clone` type. When a request's body does not fit the layer's
/// mode, the compiler says so in this trait's terms (its impls are marked
/// `diagnostic::do_not_recommend`, so the error names the body and the
/// mode rather than a missing `Body` or `Clone` bound deep inside), with
/// both fixes; see the [module docs](self).
#[diagnostic::on_unimplemented(
    message = "the retry layer cannot replay a request body of type `{B}` (replay mode `{Self}`)",
    label = "the retry layer cannot replay this request's body",
    note = "`Buffered` (the default mode) replays any `http_body::Body`; `()` is not one: send a `String`, `Full<Bytes>` or `Empty<Bytes>`",
    note = "`CloneBody` (`RetryLayer::new().clone_bodies()`) replays any `Clone` body by cloning it for each attempt; the inner service then receives `Request<{B}>` unchanged"
)]
pub trait ReplayMode<B>: sealed::Sealed {
    /// The body type the inner service receives.
    type Body;
    /// What the response future keeps in order to replay the body.
    type Saved;

    /// The first attempt's body, and what is needed to replay it (`None`
    /// when it cannot be replayed). `retryable` is false when the request
    /// will not be retried anyway, so nothing needs to be kept.
    #[doc(hidden)]
    fn prepare(body: B, limit: usize, retryable: bool) -> (Self::Body, Option<Self::Saved>);

    /// Whether the body can still be replayed (without starting a replay).
    #[doc(hidden)]
    fn can_replay(saved: &Self::Saved) -> bool;

    /// The body of another attempt, or `None` when it can no longer be
    /// replayed. Any body of an earlier attempt is superseded.
    #[doc(hidden)]
    fn replay(saved: &Self::Saved) -> Option<Self::Body>;
}

mod sealed {
    #[allow(unreachable_pub)]
    pub trait Sealed {}
}

pin_project! {
    /// A request body that can be sent more than once; see the
    /// [module docs](self).
    ///
    /// Frames are yielded as `Bytes`; errors of the original body are boxed.
    /// When a retry starts, the body of the previous attempt is superseded
    /// and fails with [`ReplaySuperseded`] if it is polled again.
    pub struct ReplayBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Once {
            #[pin]
            body: B,
        },
        Empty,
        Tee {
            shared: Arc<Mutex<Tee<B>>>,
            generation: u64,
            // Recorded frames this body has yielded.
            pos: usize,
            // Recorded bytes this body has yielded.
            sent: usize,
            trailers_sent: bool,
        },
    }
}

/// The state shared by all attempts of one request: the original body and
/// what has been read of it.
struct Tee<B> {
    body: Option<Pin<Box<B>>>,
    frames: Vec<Bytes>,
    trailers: Option<HeaderMap>,
    len: usize,
    limit: usize,
    ended: bool,
    overflowed: bool,
    failed: bool,
    generation: u64,
}

/// What a [`Buffered`] request keeps to replay its body.
pub struct BufferedReplay<B> {
    shared: Option<Arc<Mutex<Tee<B>>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

// === impl Buffered ===

impl sealed::Sealed for Buffered {}

// Not recommended in errors: a body that is not an `http_body::Body` is
// reported as "cannot replay" by `ReplayMode`'s own message.
#[diagnostic::do_not_recommend]
impl<B> ReplayMode<B> for Buffered
where
    B: Body,
{
    type Body = ReplayBody<B>;
    type Saved = BufferedReplay<B>;

    fn prepare(
        body: B,
        limit: usize,
        retryable: bool,
    ) -> (ReplayBody<B>, Option<BufferedReplay<B>>) {
        if body.is_end_stream() {
            return (ReplayBody::empty(), Some(BufferedReplay { shared: None }));
        }
        if !retryable || body.size_hint().lower() > limit as u64 {
            return (ReplayBody::new(body), None);
        }
        let shared = Arc::new(Mutex::new(Tee {
            body: Some(Box::pin(body)),
            frames: Vec::new(),
            trailers: None,
            len: 0,
            limit,
            ended: false,
            overflowed: false,
            failed: false,
            generation: 0,
        }));
        let first = ReplayBody::tee(Arc::clone(&shared), 0);
        (
            first,
            Some(BufferedReplay {
                shared: Some(shared),
            }),
        )
    }

    fn can_replay(saved: &BufferedReplay<B>) -> bool {
        saved.shared.as_ref().is_none_or(|shared| {
            let tee = lock(shared);
            !tee.overflowed && !tee.failed
        })
    }

    fn replay(saved: &BufferedReplay<B>) -> Option<ReplayBody<B>> {
        let Some(shared) = &saved.shared else {
            return Some(ReplayBody::empty());
        };
        let generation = {
            let mut tee = lock(shared);
            if tee.overflowed || tee.failed {
                return None;
            }
            tee.generation += 1;
            tee.generation
        };
        Some(ReplayBody::tee(Arc::clone(shared), generation))
    }
}

// === impl CloneBody ===

impl sealed::Sealed for CloneBody {}

// Likewise for a body that is not `Clone`.
#[diagnostic::do_not_recommend]
impl<B: Clone> ReplayMode<B> for CloneBody {
    type Body = B;
    type Saved = B;

    fn prepare(body: B, _limit: usize, retryable: bool) -> (B, Option<B>) {
        if retryable {
            (body.clone(), Some(body))
        } else {
            (body, None)
        }
    }

    fn can_replay(_saved: &B) -> bool {
        true
    }

    fn replay(saved: &B) -> Option<B> {
        Some(saved.clone())
    }
}

// === impl ReplayBody ===

impl<B> ReplayBody<B> {
    /// A body sent once and never replayed: `body` itself, with its data
    /// frames turned into `Bytes` and its errors boxed.
    ///
    /// The retry layer builds the bodies of its attempts itself (this is
    /// also what it sends when a request will not be retried). This
    /// constructor is for requests made *without* it to a service written
    /// for it, one that takes `Request<ReplayBody<B>>`: a transport called
    /// directly, the inner service of a [`Retry`](crate::Retry) in a test.
    ///
    /// # Example
    ///
    /// ```
    /// use http_body_util::BodyExt;
    /// use tower::{service_fn, BoxError, ServiceExt};
    /// use tower_retry_budget::body::ReplayBody;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), BoxError> {
    /// // A transport written for the retry layer's bodies...
    /// let transport = service_fn(|req: http::Request<ReplayBody<String>>| async move {
    ///     let body = req.into_body().collect().await?.to_bytes();
    ///     Ok::<_, BoxError>(http::Response::new(body.len()))
    /// });
    ///
    /// // ...called without one.
    /// let request = http::Request::new(ReplayBody::new(String::from("hello")));
    /// let response = transport.oneshot(request).await?;
    /// assert_eq!(*response.body(), 5);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(body: B) -> Self {
        Self {
            kind: Kind::Once { body },
        }
    }

    fn empty() -> Self {
        Self { kind: Kind::Empty }
    }

    fn tee(shared: Arc<Mutex<Tee<B>>>, generation: u64) -> Self {
        Self {
            kind: Kind::Tee {
                shared,
                generation,
                pos: 0,
                sent: 0,
                trailers_sent: false,
            },
        }
    }
}

impl<B> Body for ReplayBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Empty => Poll::Ready(None),
            KindProj::Once { body } => body
                .poll_frame(cx)
                .map(|frame| frame.map(|r| r.map(|f| f.map_data(into_bytes)).map_err(Into::into))),
            KindProj::Tee {
                shared,
                generation,
                pos,
                sent,
                trailers_sent,
            } => {
                let mut tee = lock(shared);
                if tee.generation != *generation {
                    return Poll::Ready(Some(Err(ReplaySuperseded::new().into())));
                }
                if let Some(data) = tee.frames.get(*pos) {
                    *pos += 1;
                    *sent += data.len();
                    return Poll::Ready(Some(Ok(Frame::data(data.clone()))));
                }
                if tee.ended {
                    if !*trailers_sent {
                        *trailers_sent = true;
                        if let Some(trailers) = &tee.trailers {
                            return Poll::Ready(Some(Ok(Frame::trailers(trailers.clone()))));
                        }
                    }
                    return Poll::Ready(None);
                }
                let Some(body) = tee.body.as_mut() else {
                    return Poll::Ready(None);
                };
                let frame = match body.as_mut().poll_frame(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(frame) => frame,
                };
                match frame {
                    None => {
                        tee.ended = true;
                        tee.body = None;
                        *trailers_sent = true;
                        Poll::Ready(None)
                    }
                    Some(Err(e)) => {
                        tee.failed = true;
                        tee.frames = Vec::new();
                        Poll::Ready(Some(Err(e.into())))
                    }
                    Some(Ok(frame)) => {
                        let frame = frame.map_data(into_bytes);
                        let tee = &mut *tee;
                        if let Some(data) = frame.data_ref() {
                            if !tee.overflowed && tee.len + data.len() <= tee.limit {
                                tee.len += data.len();
                                tee.frames.push(data.clone());
                                *pos = tee.frames.len();
                                *sent = tee.len;
                            } else if !tee.overflowed {
                                tracing::debug!(
                                    limit = tee.limit,
                                    "request body over the replay limit; it will not be retried"
                                );
                                tee.overflowed = true;
                                tee.frames = Vec::new();
                            }
                        } else if let Some(trailers) = frame.trailers_ref() {
                            tee.trailers = Some(trailers.clone());
                            tee.ended = true;
                            tee.body = None;
                            *trailers_sent = true;
                        }
                        Poll::Ready(Some(Ok(frame)))
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Empty => true,
            Kind::Once { body } => body.is_end_stream(),
            Kind::Tee { .. } => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Empty => SizeHint::with_exact(0),
            Kind::Once { body } => body.size_hint(),
            Kind::Tee {
                shared,
                generation,
                sent,
                ..
            } => {
                let tee = lock(shared);
                if tee.generation != *generation || tee.overflowed {
                    return SizeHint::default();
                }
                let recorded = tee.len.saturating_sub(*sent) as u64;
                match &tee.body {
                    None => SizeHint::with_exact(recorded),
                    Some(body) => {
                        let rest = body.size_hint();
                        let mut hint = SizeHint::new();
                        hint.set_lower(rest.lower().saturating_add(recorded));
                        if let Some(upper) = rest.upper() {
                            hint.set_upper(upper.saturating_add(recorded));
                        }
                        hint
                    }
                }
            }
        }
    }
}

fn into_bytes<D: Buf>(mut data: D) -> Bytes {
    data.copy_to_bytes(data.remaining())
}

impl<B> fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Once { .. } => "once",
            Kind::Empty => "empty",
            Kind::Tee { .. } => "replayable",
        };
        f.debug_struct("ReplayBody").field("kind", &kind).finish()
    }
}

// === impl BufferedReplay ===

impl<B> fmt::Debug for BufferedReplay<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferedReplay")
            .field("empty", &self.shared.is_none())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    //! The replay modes alone, polled by hand: what is recorded, what a
    //! replay yields and in which order, when a body stops being
    //! replayable, and what each body says of its size.

    use std::collections::VecDeque;
    use std::task::Waker;

    use http_body_util::Full;

    use super::*;

    /// A request body that plays its steps; its size hint is exactly the
    /// data still to come, or unknown when `hinted` is false.
    struct Script {
        steps: VecDeque<Step>,
        hinted: bool,
    }

    enum Step {
        Data(&'static str),
        Trailers,
        Fail,
        Pending,
    }

    fn script(steps: impl IntoIterator<Item = Step>) -> Script {
        Script {
            steps: steps.into_iter().collect(),
            hinted: true,
        }
    }

    fn data(chunks: &[&'static str]) -> Vec<Step> {
        chunks.iter().map(|c| Step::Data(c)).collect()
    }

    impl Body for Script {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            // Polled by hand: a pause needs no wake-up.
            Poll::Ready(Some(match self.steps.pop_front() {
                None => return Poll::Ready(None),
                Some(Step::Pending) => return Poll::Pending,
                Some(Step::Data(text)) => Ok(Frame::data(Bytes::from_static(text.as_bytes()))),
                Some(Step::Trailers) => Ok(Frame::trailers(trailers())),
                Some(Step::Fail) => Err("connection reset".into()),
            }))
        }

        fn is_end_stream(&self) -> bool {
            self.steps.is_empty()
        }

        fn size_hint(&self) -> SizeHint {
            if !self.hinted {
                return SizeHint::default();
            }
            let left = self.steps.iter().map(|step| match step {
                Step::Data(text) => text.len() as u64,
                _ => 0,
            });
            SizeHint::with_exact(left.sum())
        }
    }

    fn trailers() -> HeaderMap {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        trailers
    }

    /// What one poll gave, as text: `"ab"`, `"trailers"`, `"end"`,
    /// `"pending"`, or the error.
    fn poll<B: Body<Data = Bytes, Error = BoxError> + Unpin>(body: &mut B) -> String {
        match Pin::new(body).poll_frame(&mut Context::from_waker(Waker::noop())) {
            Poll::Pending => "pending".to_owned(),
            Poll::Ready(None) => "end".to_owned(),
            Poll::Ready(Some(Err(e))) => format!("error: {e}"),
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => String::from_utf8(data.to_vec()).unwrap(),
                Err(frame) => {
                    assert_eq!(frame.into_trailers().unwrap(), trailers());
                    "trailers".to_owned()
                }
            },
        }
    }

    fn read_all<B: Body<Data = Bytes, Error = BoxError> + Unpin>(body: &mut B) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            let frame = poll(body);
            let done = frame == "end" || frame.starts_with("error");
            seen.push(frame);
            if done {
                return seen;
            }
        }
    }

    fn hint<B: Body>(body: &B) -> (u64, Option<u64>) {
        let hint = body.size_hint();
        (hint.lower(), hint.upper())
    }

    type Saved = BufferedReplay<Script>;

    fn prepare(steps: Vec<Step>, limit: usize) -> (ReplayBody<Script>, Option<Saved>) {
        <Buffered as ReplayMode<Script>>::prepare(script(steps), limit, true)
    }

    /// Like [`prepare`], for a body that does not say its size.
    fn prepare_unhinted(steps: Vec<Step>, limit: usize) -> (ReplayBody<Script>, Saved) {
        let body = Script {
            steps: steps.into_iter().collect(),
            hinted: false,
        };
        let (first, saved) = <Buffered as ReplayMode<Script>>::prepare(body, limit, true);
        (first, saved.expect("nothing known: kept"))
    }

    fn replay(saved: &Saved) -> Option<ReplayBody<Script>> {
        <Buffered as ReplayMode<Script>>::replay(saved)
    }

    fn can_replay(saved: &Saved) -> bool {
        <Buffered as ReplayMode<Script>>::can_replay(saved)
    }

    #[test]
    fn an_ended_body_is_sent_as_empty_and_replayed_for_free() {
        let (mut body, saved) = prepare(Vec::new(), 10);
        let saved = saved.expect("an empty body can be retried");
        assert_eq!(format!("{body:?}"), r#"ReplayBody { kind: "empty" }"#);
        assert_eq!(format!("{saved:?}"), "BufferedReplay { empty: true }");
        assert!(body.is_end_stream());
        assert_eq!(hint(&body), (0, Some(0)));
        assert_eq!(poll(&mut body), "end");
        assert!(can_replay(&saved));
        let mut again = replay(&saved).unwrap();
        assert!(again.is_end_stream());
        assert_eq!(poll(&mut again), "end");
    }

    #[test]
    fn a_body_that_will_not_be_retried_is_passed_through() {
        let (mut body, saved) =
            <Buffered as ReplayMode<Script>>::prepare(script(data(&["ab"])), 10, false);
        assert!(saved.is_none(), "not retryable: nothing kept");
        assert_eq!(format!("{body:?}"), r#"ReplayBody { kind: "once" }"#);
        assert!(!body.is_end_stream());
        assert_eq!(hint(&body), (2, Some(2)), "the body's own hint");
        assert_eq!(read_all(&mut body), ["ab", "end"]);
        assert!(body.is_end_stream(), "the body's own end");

        let (body, saved) = prepare(data(&["abc", "de"]), 4);
        assert!(saved.is_none(), "5 bytes known, over a limit of 4");
        assert_eq!(format!("{body:?}"), r#"ReplayBody { kind: "once" }"#);
        let (body, saved) = prepare(data(&["abc", "de"]), 5);
        assert!(saved.is_some(), "exactly at the limit: kept");
        assert_eq!(format!("{body:?}"), r#"ReplayBody { kind: "replayable" }"#);
        assert!(!body.is_end_stream(), "a recorded body never says it ended");
    }

    #[test]
    fn a_retry_replays_what_was_read_then_reads_on() {
        let mut steps = data(&["ab", "cd"]);
        steps.push(Step::Pending);
        steps.extend(data(&["efg"]));
        steps.push(Step::Trailers);
        let (mut first, saved) = prepare(steps, 100);
        let saved = saved.unwrap();
        assert_eq!(format!("{saved:?}"), "BufferedReplay { empty: false }");
        assert_eq!(hint(&first), (7, Some(7)));
        assert_eq!(poll(&mut first), "ab");
        assert_eq!(poll(&mut first), "cd");
        assert_eq!(hint(&first), (3, Some(3)), "nothing recorded is unsent");
        assert_eq!(poll(&mut first), "pending");

        let mut second = replay(&saved).unwrap();
        assert_eq!(
            poll(&mut first),
            "error: request body superseded by a newer attempt",
            "the first attempt's body is superseded"
        );
        assert_eq!(hint(&first), (0, None), "a superseded body knows nothing");
        assert_eq!(hint(&second), (7, Some(7)), "4 recorded and 3 to read");
        assert_eq!(poll(&mut second), "ab");
        assert_eq!(hint(&second), (5, Some(5)));
        assert_eq!(poll(&mut second), "cd");
        assert_eq!(hint(&second), (3, Some(3)));
        assert_eq!(read_all(&mut second), ["efg", "trailers", "end"]);
        assert_eq!(poll(&mut second), "end", "the trailers are sent once");

        let mut third = replay(&saved).unwrap();
        assert_eq!(hint(&third), (7, Some(7)), "all recorded, nothing to read");
        assert_eq!(poll(&mut third), "ab");
        assert_eq!(hint(&third), (5, Some(5)));
        assert_eq!(read_all(&mut third), ["cd", "efg", "trailers", "end"]);
        assert_eq!(hint(&third), (0, Some(0)));
    }

    #[test]
    fn a_body_read_to_its_end_without_trailers_ends_once_for_each_attempt() {
        let (mut first, saved) = prepare(data(&["ab", "c"]), 100);
        let saved = saved.unwrap();
        assert_eq!(read_all(&mut first), ["ab", "c", "end"]);
        assert_eq!(poll(&mut first), "end");
        let mut second = replay(&saved).unwrap();
        assert_eq!(read_all(&mut second), ["ab", "c", "end"]);
        assert_eq!(poll(&mut second), "end");
    }

    #[test]
    fn a_body_over_the_limit_stops_being_replayable_but_reaches_its_end() {
        // Exactly at the limit: still replayable.
        let (mut first, saved) = prepare_unhinted(data(&["ab", "cd"]), 4);
        assert_eq!(read_all(&mut first), ["ab", "cd", "end"]);
        assert!(can_replay(&saved));
        assert_eq!(read_all(&mut replay(&saved).unwrap()), ["ab", "cd", "end"]);

        // One byte over it: sent whole, once.
        let (mut first, saved) = prepare_unhinted(data(&["ab", "cd", "e", "f"]), 4);
        assert_eq!(read_all(&mut first), ["ab", "cd", "e", "f", "end"]);
        assert!(!can_replay(&saved));
        assert!(replay(&saved).is_none());
        assert_eq!(hint(&first), (0, None), "an overflowed body knows nothing");

        // A first frame over the limit on its own.
        let (mut first, saved) = prepare_unhinted(data(&["abcde"]), 4);
        assert_eq!(read_all(&mut first), ["abcde", "end"]);
        assert!(!can_replay(&saved));
    }

    #[test]
    fn the_default_limit_is_64_kib() {
        let body = |len: usize| {
            let text: &'static str = "x".repeat(len).leak();
            prepare(data(&[text]), DEFAULT_BODY_LIMIT).1
        };
        assert!(body(64 * 1024).is_some(), "exactly 64 KiB: kept");
        assert!(body(64 * 1024 + 1).is_none(), "one byte more: sent once");
    }

    #[test]
    fn a_body_that_fails_is_not_replayable() {
        let mut steps = data(&["ab"]);
        steps.push(Step::Fail);
        let (mut first, saved) = prepare(steps, 100);
        let saved = saved.unwrap();
        assert!(can_replay(&saved), "until it fails");
        assert_eq!(read_all(&mut first), ["ab", "error: connection reset"]);
        assert!(!can_replay(&saved));
        assert!(replay(&saved).is_none());
    }

    #[test]
    fn clone_bodies_are_cloned_for_every_attempt() {
        let body = Full::new(Bytes::from_static(b"abc"));
        let (sent, saved) = <CloneBody as ReplayMode<Full<Bytes>>>::prepare(body.clone(), 0, true);
        let saved = saved.expect("kept whatever its size");
        assert_eq!(hint(&sent), (3, Some(3)));
        assert!(<CloneBody as ReplayMode<Full<Bytes>>>::can_replay(&saved));
        let again = <CloneBody as ReplayMode<Full<Bytes>>>::replay(&saved).unwrap();
        assert_eq!(hint(&again), (3, Some(3)));
        let (_, saved) = <CloneBody as ReplayMode<Full<Bytes>>>::prepare(body, 0, false);
        assert!(saved.is_none(), "not retryable: nothing kept");
    }

    #[test]
    fn data_of_any_buffer_becomes_bytes() {
        assert_eq!(into_bytes(&b"abc"[..]), Bytes::from_static(b"abc"));
        let chained = Buf::chain(&b"ab"[..], &b"cd"[..]);
        assert_eq!(into_bytes(chained), Bytes::from_static(b"abcd"));
    }
}
