//! The response future of [`FallbackService`](super::FallbackService).

use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tower_resilience_base::BoxError;
use tower_service::Service;

use crate::cause::Cause;
use crate::layer::{Core, Shard};
use crate::snapshot::AsyncPermit;
use crate::source::{Reason, SourceFuture};

pin_project! {
    /// Response future of [`FallbackService`](super::FallbackService).
    ///
    /// Either answers at once (a call the exercise mode answered), or waits
    /// for the inner future and then decides: the response as is, or the
    /// fallback's answer for a selected failure, or the original error.
    /// Synchronous sources run inside the last `poll`; an asynchronous
    /// source is awaited here, within the layer's bounds. Dropping the
    /// future drops the inner one and any source it awaits.
    ///
    /// The type parameters are the inner service, the request, the
    /// response and the fallback's key.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, Req, Res, K>
    where
        S: Service<Req>,
    {
        #[pin]
        kind: Kind<S, Req, Res, K>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, Req, Res, K>
    where
        S: Service<Req>,
    {
        // The inner service's call.
        Called {
            #[pin]
            future: S::Future,
            pending: Option<Pending<Res, K>>,
        },
        // An exercise awaits an asynchronous source; the inner service
        // (the ready one) and the request wait for it to give nothing,
        // boxed: the other states' futures stay as small as they were.
        Exercising {
            call: Option<Box<(S, Req)>>,
            pending: Option<Pending<Res, K>>,
            run: Option<Box<Run<Res>>>,
        },
        // The inner call finished; an asynchronous source is awaited.
        Falling {
            pending: Option<Pending<Res, K>>,
            run: Option<Box<Run<Res>>>,
        },
        Served {
            response: Option<Res>,
        },
    }
}

/// What the call needs when it completes.
pub(crate) struct Pending<Res, K> {
    shard: Arc<Shard<Res, K>>,
    key: K,
    shadow: bool,
}

/// An asynchronous source being awaited, and what to do after it.
pub(crate) struct Run<Res> {
    future: SourceFuture<Res>,
    /// The source after the awaited one.
    next: usize,
    /// Held while the source is awaited (the layer's `async_limit`).
    permit: AsyncPermit,
    pub(crate) trail: Trail,
    pub(crate) cause: Cause,
    pub(crate) original: Original<Res>,
}

/// What the fallback would replace.
pub(crate) enum Original<Res> {
    /// The inner service's error.
    Error(BoxError),
    /// The inner service's failed response.
    Response(Res),
    /// A good response, sampled for the shadow mode: the caller gets it.
    Primary(Res),
    /// Nothing: the exercise mode asks before calling.
    Exercise,
}

/// What the sources that gave nothing said, for the counts and the logs.
#[derive(Debug, Default)]
pub(crate) struct Trail {
    pub(crate) why: Option<String>,
    /// `Some(true)` while every source that gave nothing was a last-good
    /// cache without a fresh entry for the key.
    cold: Option<bool>,
}

/// Where a walk along the chain stopped.
pub(crate) enum Walk<Res> {
    /// A source answered; a cached answer with its age.
    Answer(Res, Option<Duration>),
    /// No source answered.
    Nothing,
    /// An asynchronous source was called: its future, the source after
    /// it, and its permit.
    Await(SourceFuture<Res>, usize, AsyncPermit),
}

/// What [`Core::finish`] decided.
pub(crate) enum Finish<Res, K> {
    Done(Result<Res, BoxError>),
    /// An asynchronous source to await; the key, for what follows it.
    Run(Box<Run<Res>>, K),
}

/// What the exercise mode decided in `call`.
pub(crate) enum Exercised<Res> {
    /// Answer with this at once.
    Served(Res),
    /// The fallback gave nothing: call the inner service.
    Call,
    /// Await this source before polling the inner call.
    Await(Box<Run<Res>>),
}

// === impl ResponseFuture ===

impl<S: Service<Req>, Req, Res, K> ResponseFuture<S, Req, Res, K> {
    #[inline]
    pub(crate) fn called(
        future: S::Future,
        shard: Arc<Shard<Res, K>>,
        key: K,
        shadow: bool,
    ) -> Self {
        Self {
            kind: Kind::Called {
                future,
                pending: Some(Pending { shard, key, shadow }),
            },
        }
    }

    /// An exercise that awaits `run` first; `service` (ready) gets
    /// `request` only if the fallback gives nothing.
    pub(crate) fn exercising(
        service: S,
        request: Req,
        shard: Arc<Shard<Res, K>>,
        key: K,
        run: Box<Run<Res>>,
    ) -> Self {
        Self {
            kind: Kind::Exercising {
                call: Some(Box::new((service, request))),
                pending: Some(Pending {
                    shard,
                    key,
                    shadow: false,
                }),
                run: Some(run),
            },
        }
    }

    pub(crate) fn served(response: Res) -> Self {
        Self {
            kind: Kind::Served {
                response: Some(response),
            },
        }
    }
}

impl<S, Req, Res, K> Future for ResponseFuture<S, Req, Res, K>
where
    S: Service<Req, Response = Res>,
    S::Error: Into<BoxError>,
    Res: 'static,
{
    type Output = Result<Res, BoxError>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut kind = self.as_mut().project().kind;
            match kind.as_mut().project() {
                KindProj::Exercising { call, pending, run } => {
                    let p = pending
                        .as_ref()
                        .expect("ResponseFuture polled after completion");
                    let running = run
                        .as_mut()
                        .expect("ResponseFuture polled after completion");
                    let found = ready!(running.poll(&p.shard.core, &p.key, cx));
                    let exercise = run.take().expect("the run just polled");
                    if let Some(response) = p.shard.core.settle_exercise(*exercise, found) {
                        pending.take();
                        return Poll::Ready(Ok(response));
                    }
                    // The fallback gave nothing: the call goes to the
                    // inner service, ready since `poll_ready`.
                    let (mut service, request) = *call.take().expect("the deferred call");
                    let future = service.call(request);
                    let pending = pending.take();
                    kind.set(Kind::Called { future, pending });
                }
                KindProj::Called { future, pending } => {
                    let result = ready!(future.poll(cx)).map_err(Into::into);
                    let Pending { shard, key, shadow } = pending
                        .take()
                        .expect("ResponseFuture polled after completion");
                    match shard.core.finish(key, shadow, result) {
                        Finish::Done(result) => return Poll::Ready(result),
                        Finish::Run(run, key) => kind.set(Kind::Falling {
                            pending: Some(Pending { shard, key, shadow }),
                            run: Some(run),
                        }),
                    }
                }
                KindProj::Falling { pending, run } => {
                    let p = pending
                        .as_ref()
                        .expect("ResponseFuture polled after completion");
                    let running = run
                        .as_mut()
                        .expect("ResponseFuture polled after completion");
                    let found = ready!(running.poll(&p.shard.core, &p.key, cx));
                    let run = *run.take().expect("a run to settle");
                    let Pending { shard, key, .. } = pending.take().expect("a pending call");
                    let settled = shard.core.settle(key, run, found);
                    return Poll::Ready(settled.expect("only an exercise settles to nothing"));
                }
                KindProj::Served { response } => {
                    return Poll::Ready(Ok(response
                        .take()
                        .expect("ResponseFuture polled after completion")))
                }
            }
        }
    }
}

impl<S: Service<Req>, Req, Res, K> fmt::Debug for ResponseFuture<S, Req, Res, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.kind {
            Kind::Exercising { .. } => "exercising",
            Kind::Called { .. } => "called",
            Kind::Falling { .. } => "falling back",
            Kind::Served { .. } => "served",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

// === impl Run ===

impl<Res: 'static> Run<Res> {
    pub(crate) fn new(
        future: SourceFuture<Res>,
        next: usize,
        permit: AsyncPermit,
        trail: Trail,
        cause: Cause,
        original: Original<Res>,
    ) -> Self {
        Self {
            future,
            next,
            permit,
            trail,
            cause,
            original,
        }
    }

    /// Awaits the source, and on its failure walks on from the next one:
    /// the chain's answer, or `None` when no source answered.
    fn poll<K>(
        &mut self,
        core: &Core<Res, K>,
        key: &K,
        cx: &mut Context<'_>,
    ) -> Poll<Option<(Res, Option<Duration>)>> {
        loop {
            let result = match catch_unwind(AssertUnwindSafe(|| self.future.as_mut().poll(cx))) {
                Ok(Poll::Pending) => return Poll::Pending,
                Ok(Poll::Ready(result)) => result,
                Err(_) => Err(BoxError::from("the asynchronous fallback panicked")),
            };
            match result {
                Ok(answer) => return Poll::Ready(Some((answer, None))),
                Err(error) => self.trail.failed(error.to_string()),
            }
            let reason = self.original.reason(self.cause);
            match core.walk(self.next, key, &reason, &mut self.trail) {
                Walk::Answer(answer, age) => return Poll::Ready(Some((answer, age))),
                Walk::Nothing => return Poll::Ready(None),
                Walk::Await(future, next, permit) => {
                    self.future = future;
                    self.next = next;
                    self.permit = permit;
                }
            }
        }
    }
}

impl<Res> fmt::Debug for Run<Res> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Run")
            .field("next", &self.next)
            .field("cause", &self.cause)
            .field("permit", &self.permit)
            .finish_non_exhaustive()
    }
}

// === impl Original ===

impl<Res> Original<Res> {
    /// The reason the sources are told.
    fn reason(&self, cause: Cause) -> Reason<'_, Res> {
        match self {
            Original::Error(error) => Reason::new(cause, Some(&**error), None),
            Original::Response(response) => Reason::new(cause, None, Some(response)),
            Original::Primary(_) | Original::Exercise => Reason::new(cause, None, None),
        }
    }
}

// === impl Trail ===

impl Trail {
    /// A source failed.
    pub(crate) fn failed(&mut self, why: String) {
        self.why = Some(why);
        self.cold = Some(false);
    }

    /// A last-good cache had nothing fresh for the key.
    pub(crate) fn missed(&mut self, why: String) {
        self.why = Some(why);
        self.cold.get_or_insert(true);
    }

    /// Whether every source that gave nothing was a cache miss.
    pub(crate) fn is_cold(&self) -> bool {
        self.cold == Some(true)
    }
}
