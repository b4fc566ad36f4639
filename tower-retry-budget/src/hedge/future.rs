//! The response future of [`Hedge`](super::Hedge).

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::RETRY_AFTER;
use http::request::Parts;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Instant, Sleep};
use tower_resilience_base::grpc::GRPC_RETRY_PUSHBACK_MS;
use tower_resilience_base::hook::{AttemptHook, AttemptOutcome, Attempts, ResponseView};
use tower_resilience_base::{wake, CallContext, Deadline};
use tower_service::Service;

use super::decide;
use super::shared::{Charge, Refusal, Shared, MAX_PAUSE};
use crate::body::ReplayMode;
use crate::error::ReplaySuperseded;
use crate::future::{clone_head, mark_attempt};
use crate::policy::{is_local_rejection, Class, Policy};
use crate::{BoxError, NO_RETRY_HEADER};

pin_project! {
    /// Response future of [`Hedge`](super::Hedge).
    ///
    /// Polls the first attempt and every hedge in flight, arms the hedge
    /// timer when the first attempt is still pending, sends a hedge when it
    /// fires (if the rules allow), and completes with the first answer that
    /// is not a retryable failure. Dropping it cancels every attempt in
    /// flight.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, B, M>
    where
        M: ReplayMode<B>,
        S: Service<Request<M::Body>>,
    {
        #[pin]
        first: First<S::Future>,
        // `None` for a request that is not hedged.
        race: Option<Race<S, B, M>>,
    }
}

pin_project! {
    #[project = FirstProj]
    enum First<F> {
        Running {
            #[pin]
            future: F,
        },
        Done,
    }
}

/// Everything a hedged request keeps beside its first attempt.
pub(crate) struct Race<S, B, M>
where
    M: ReplayMode<B>,
    S: Service<Request<M::Body>>,
{
    shared: Arc<Shared<dyn Policy>>,
    /// A clone of the inner service, polled ready before each hedge.
    service: S,
    template: Parts,
    saved: M::Saved,
    /// The hook of a breaker above, to admit hedges.
    hook: Option<Arc<dyn AttemptHook>>,
    /// The first attempt's admission, when no layer below took it.
    first_attempts: Option<Attempts>,
    first_running: bool,
    /// The call's clock reading: when the first attempt started.
    start: Instant,
    deadline: Option<Instant>,
    /// Whether a layer above enforces `deadline` (then every hedge is sent
    /// with it in the call context).
    enforced: bool,
    hedges: Vec<Lane<S::Future>>,
    // On the heap, and only once the first attempt pends: a call answered
    // at once arms no timer.
    timer: Option<Pin<Box<Sleep>>>,
    phase: Phase,
    /// The delay of this call, fixed when its timer is first armed.
    delay: Option<Duration>,
    /// When the next hedge is due, after the first.
    next_at: Option<Instant>,
    sent: u32,
    pushed_back: bool,
    /// Whether the future has returned `Pending` (an answer before that
    /// took no measurable time).
    pended: bool,
    /// The failure to return if every attempt fails: the earliest lane's.
    /// On the heap: needed only when an attempt fails while another runs,
    /// and the future (moved by every layer above) stays smaller.
    kept: Option<Box<Kept<S::Response>>>,
    finished: bool,
    _body: PhantomData<fn(B)>,
}

/// A failed attempt's outcome, kept in case every attempt fails: the
/// attempt's lane (0 for the first attempt) and its outcome.
type Kept<R> = (usize, Result<R, BoxError>);

/// A hedge in flight.
struct Lane<F> {
    future: Option<Pin<Box<F>>>,
    start: Instant,
    /// Its admission by the hook, when no layer below took it.
    attempts: Option<Attempts>,
    /// What the budget was paid for it: given back if a layer below
    /// refuses it without calling the dependency.
    charge: Option<Charge>,
}

/// Where the hedge timer of a call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The next timer is not armed yet.
    Idle,
    /// Waiting for the timer.
    Armed,
    /// The timer fired: a hedge is due (waiting for the service to be
    /// ready, perhaps).
    Due,
    /// No more hedges for this call.
    Stopped,
}

/// The hook's share of a call, as [`Race::new`] takes it: the hook to
/// admit hedges with, and the first attempt's admission if no layer below
/// took it.
pub(crate) type HookShare = (Option<Arc<dyn AttemptHook>>, Option<Attempts>);

/// When and until when a hedged call runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) start: Instant,
    pub(crate) deadline: Option<Instant>,
    pub(crate) enforced: bool,
}

/// How an answer stands in the race.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Judgement {
    /// Not a retryable failure: it ends the race.
    wins: bool,
    /// A server pushed back (or a layer below rejected the attempt): no
    /// more hedges for this call.
    pushback: bool,
    /// How long the server asked to wait: hedging pauses that long.
    pause: Option<Duration>,
    /// The attempt lost its body to a newer attempt: it was not a
    /// dependency failure, so the hook is told it was cancelled.
    superseded: bool,
    /// The policy's class of a response, handed to the hook with it.
    class: Option<Class>,
}

/// Calls `service` with `request` while `attempts` (if any) is on offer in
/// the call context and `context` changes it; returns the future and the
/// admission if no layer below took it.
#[inline]
pub(crate) fn send<S, R>(
    service: &mut S,
    request: R,
    attempts: Option<Attempts>,
    context: impl FnOnce(&mut CallContext),
) -> (S::Future, Option<Attempts>)
where
    S: Service<R>,
{
    match attempts {
        Some(attempts) => CallContext::offer_attempts(attempts, || {
            CallContext::scoped(context, || service.call(request))
        }),
        None => (CallContext::scoped(context, || service.call(request)), None),
    }
}

// === impl ResponseFuture ===

impl<S, B, M> ResponseFuture<S, B, M>
where
    M: ReplayMode<B>,
    S: Service<Request<M::Body>>,
{
    /// A request that is not hedged: the inner future as it is.
    #[inline]
    pub(crate) fn passthrough(future: S::Future) -> Self {
        Self {
            first: First::Running { future },
            race: None,
        }
    }

    /// A hedged request whose first attempt is `future`.
    #[inline]
    pub(crate) fn race(future: S::Future, race: Race<S, B, M>) -> Self {
        Self {
            first: First::Running { future },
            race: Some(race),
        }
    }
}

impl<S, B, M, ResB: 'static> Future for ResponseFuture<S, B, M>
where
    M: ReplayMode<B>,
    S: Service<Request<M::Body>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<Response<ResB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let Some(race) = this.race.as_mut() else {
            return match this.first.project() {
                FirstProj::Running { future } => future.poll(cx).map_err(Into::into),
                FirstProj::Done => panic!("ResponseFuture polled after completion"),
            };
        };
        assert!(!race.finished, "ResponseFuture polled after completion");
        loop {
            if let FirstProj::Running { future } = this.first.as_mut().project() {
                if let Poll::Ready(result) = future.poll(cx) {
                    this.first.set(First::Done);
                    race.first_running = false;
                    if let Some(out) = race.settle(0, result.map_err(Into::into)) {
                        return Poll::Ready(out);
                    }
                }
            }
            if let Some(out) = race.poll_hedges(cx) {
                // A hedge won: the first attempt, if still running, lost.
                this.first.set(First::Done);
                return Poll::Ready(out);
            }
            match race.drive(cx) {
                // A hedge went out: poll it (and the others) again.
                Poll::Ready(()) => continue,
                Poll::Pending => {
                    race.pended = true;
                    return Poll::Pending;
                }
            }
        }
    }
}

impl<S, B, M> fmt::Debug for ResponseFuture<S, B, M>
where
    M: ReplayMode<B>,
    S: Service<Request<M::Body>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("ResponseFuture");
        d.field(
            "first_running",
            &matches!(self.first, First::Running { .. }),
        );
        match &self.race {
            None => d.field("hedged", &false),
            Some(race) => d
                .field("hedged", &true)
                .field("phase", &race.phase)
                .field("hedges", &race.sent)
                .field("delay", &race.delay),
        };
        d.finish()
    }
}

// === impl Race ===

impl<S, B, M> Race<S, B, M>
where
    M: ReplayMode<B>,
    S: Service<Request<M::Body>>,
{
    pub(crate) fn new(
        shared: Arc<Shared<dyn Policy>>,
        service: S,
        template: Parts,
        saved: M::Saved,
        (hook, first_attempts): HookShare,
        timing: Timing,
    ) -> Self {
        Self {
            shared,
            service,
            template,
            saved,
            hook,
            first_attempts,
            first_running: true,
            start: timing.start,
            deadline: timing.deadline,
            enforced: timing.enforced,
            hedges: Vec::new(),
            timer: None,
            phase: Phase::Idle,
            delay: None,
            next_at: None,
            sent: 0,
            pushed_back: false,
            pended: false,
            kept: None,
            finished: false,
            _body: PhantomData,
        }
    }

    /// Whether any attempt is still in flight.
    fn running(&self) -> bool {
        self.first_running || self.hedges.iter().any(|lane| lane.future.is_some())
    }

    /// The clock now, or the call's start if the future never pended (an
    /// answer at the first poll took no time worth a clock read).
    fn now(&self) -> Instant {
        if self.pended {
            Instant::now()
        } else {
            self.start
        }
    }

    /// How an answer stands: see [`Judgement`].
    fn judge<ResB>(&self, result: &Result<Response<ResB>, BoxError>) -> Judgement {
        let policy = &self.shared.policy;
        let mut judgement = Judgement {
            wins: false,
            pushback: false,
            pause: None,
            superseded: false,
            class: None,
        };
        match result {
            Ok(response) => {
                let headers = response.headers();
                let class = policy.classify_response(response.status(), headers);
                judgement.class = Some(class);
                match class {
                    Class::Success => judgement.wins = true,
                    // A failure the server asked not to retry (a negative
                    // gRPC pushback, the do-not-retry mark) stops hedging
                    // but does not beat an attempt still in flight; any
                    // other failure that is not retried is the answer.
                    _ if !class.is_retryable() => {
                        judgement.pushback = headers.contains_key(NO_RETRY_HEADER)
                            || headers.contains_key(GRPC_RETRY_PUSHBACK_MS);
                        judgement.wins = !judgement.pushback;
                    }
                    _ => {
                        let after = class.retry_after();
                        judgement.pause = after;
                        judgement.pushback = after.is_some()
                            || headers.contains_key(NO_RETRY_HEADER)
                            || headers.contains_key(RETRY_AFTER)
                            || headers.contains_key(GRPC_RETRY_PUSHBACK_MS);
                    }
                }
            }
            Err(e) => {
                let e: &(dyn Error + 'static) = &**e;
                if tower_resilience_base::error::find::<ReplaySuperseded>(e).is_some() {
                    judgement.superseded = true;
                } else if is_local_rejection(e) {
                    // Overload below (a full bulkhead, an open circuit),
                    // retries spent below, or the deadline: no more hedges.
                    judgement.pushback = true;
                } else {
                    judgement.wins = !policy.classify_error(e).is_retryable();
                }
            }
        }
        judgement
    }

    /// Takes the answer of lane `lane` (0 for the first attempt): the
    /// call's outcome if it wins or was the last attempt in flight.
    fn settle<ResB: 'static>(
        &mut self,
        lane: usize,
        result: Result<Response<ResB>, BoxError>,
    ) -> Option<Result<Response<ResB>, BoxError>>
    where
        S: Service<Request<M::Body>, Response = Response<ResB>>,
    {
        let judgement = self.judge(&result);
        let attempts = match lane {
            0 => self.first_attempts.take(),
            n => self.hedges[n - 1].attempts.take(),
        };
        if let Some(mut attempts) = attempts {
            if !judgement.superseded {
                attempts.record(match &result {
                    Ok(response) => {
                        let view = ResponseView::of(response);
                        AttemptOutcome::Response(match judgement.class {
                            Some(class) => view.with_class(class),
                            None => view,
                        })
                    }
                    Err(e) => AttemptOutcome::Error(&**e),
                });
            }
            // Dropped unrecorded: cancelled.
        }
        if judgement.wins {
            return Some(self.finish(Some(lane), result));
        }
        if judgement.pushback {
            self.pushed_back = true;
            if let Some(pause) = judgement.pause.filter(|p| !p.is_zero()) {
                let now = self.now();
                self.shared.state.pause_until(now + pause.min(MAX_PAUSE));
                tracing::debug!(
                    pause_ms = pause.as_millis() as u64,
                    "server pushed back: hedging paused"
                );
            }
        }
        if !self.running() {
            // Every attempt failed: the earliest one's failure.
            let failure = match self.kept.take() {
                Some(kept) if kept.0 < lane => kept.1,
                _ => result,
            };
            return Some(self.finish(None, failure));
        }
        match self.kept.as_mut() {
            Some(kept) if kept.0 < lane => {}
            Some(kept) => **kept = (lane, result),
            None => self.kept = Some(Box::new((lane, result))),
        }
        None
    }

    /// Polls the hedges in flight; the call's outcome if one settles it.
    fn poll_hedges<ResB: 'static>(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Option<Result<Response<ResB>, BoxError>>
    where
        S: Service<Request<M::Body>, Response = Response<ResB>>,
        S::Error: Into<BoxError>,
    {
        for i in 0..self.hedges.len() {
            let Some(future) = self.hedges[i].future.as_mut() else {
                continue;
            };
            if let Poll::Ready(result) = future.as_mut().poll(cx) {
                self.hedges[i].future = None;
                let result = result.map_err(Into::into);
                if let (Err(e), Some(charge)) = (&result, self.hedges[i].charge.take()) {
                    if tower_resilience_base::error::is_local_rejection(&**e) {
                        // A full bulkhead or a throttle below refused the
                        // hedge: the dependency never saw it.
                        let shared = &*self.shared;
                        shared.state.refund(&shared.budget, charge);
                    }
                }
                if let Some(out) = self.settle(i + 1, result) {
                    return Some(out);
                }
            }
        }
        None
    }

    /// Ends the race with `result` (won by `winner`, if any): records the
    /// winner's latency, cancels the attempts still in flight (recording
    /// the elapsed time of those already slower than the delay), and
    /// counts.
    fn finish<T>(
        &mut self,
        winner: Option<usize>,
        result: Result<T, BoxError>,
    ) -> Result<T, BoxError> {
        self.finished = true;
        self.timer = None;
        let state = &self.shared.state;
        let now = self.now();
        if let (Some(lane), Ok(_)) = (winner, &result) {
            let start = match lane {
                0 => self.start,
                n => self.hedges[n - 1].start,
            };
            state.record(now, now.saturating_duration_since(start), false);
            if lane > 0 {
                state.count_won();
                self.shared.metrics.won();
                tracing::debug!(attempt = lane + 1, "hedge won");
            }
        }
        self.cancel_running(now);
        result
    }

    /// Cancels every attempt still in flight at `now`. Each counts in the
    /// estimate as taking at least its elapsed time, so that the slow
    /// attempts that hedges beat are not lost to it (it would drift low).
    fn cancel_running(&mut self, now: Instant) {
        let state = &self.shared.state;
        let record = |start: Instant| state.record(now, now.saturating_duration_since(start), true);
        let mut cancelled = 0;
        if self.first_running {
            self.first_running = false;
            cancelled += 1;
            record(self.start);
            // Unreported: the hook counts it as cancelled.
            drop(self.first_attempts.take());
        }
        for lane in self.hedges.drain(..) {
            if lane.future.is_some() {
                cancelled += 1;
                record(lane.start);
            }
        }
        state.count_cancelled(cancelled);
    }

    /// Drives the hedge timer: `Ready` when a hedge was just sent,
    /// `Pending` otherwise (waiting for the timer or the service, or no
    /// more hedges).
    fn drive(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            match self.phase {
                Phase::Stopped => return Poll::Pending,
                // idle -> armed: the first attempt pends (or a hedge just
                // went out and another is allowed).
                Phase::Idle => {
                    let at = match self.next_at {
                        Some(at) => at,
                        None => {
                            let config = &self.shared.config;
                            let Some(delay) = self.shared.state.delay(config, self.start) else {
                                // idle -> stopped: nothing learned yet, no
                                // fallback.
                                self.phase = Phase::Stopped;
                                return Poll::Pending;
                            };
                            self.delay = Some(delay);
                            self.start + delay
                        }
                    };
                    match self.timer.as_mut() {
                        Some(timer) => timer.as_mut().reset(at),
                        None => self.timer = Some(Box::pin(sleep_until(at))),
                    }
                    self.phase = Phase::Armed;
                }
                // armed -> due: the delay passed without an answer.
                Phase::Armed => {
                    let Some(timer) = self.timer.as_mut() else {
                        unreachable!("an armed phase has a timer");
                    };
                    if timer.as_mut().poll(cx).is_pending() {
                        wake::note(timer.deadline());
                        return Poll::Pending;
                    }
                    self.phase = Phase::Due;
                }
                // due -> idle (another hedge allowed) | stopped: send.
                Phase::Due => return self.try_send(cx),
            }
        }
    }

    /// Sends a hedge if the rules, the service, the hook and the budget
    /// allow it, in that order: `Ready` when sent, `Pending` when the
    /// service is not ready yet or the hedge was refused (then the call
    /// sends no more).
    fn try_send(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let now = Instant::now();
        let shared = Arc::clone(&self.shared);
        let (config, state) = (&shared.config, &shared.state);
        let race = decide::Race {
            sent: self.sent,
            max: config.max_hedges,
            pushed_back: self.pushed_back,
        };
        if let Err(refusal) = decide::may_hedge(
            race,
            state.paused(now),
            self.deadline,
            now,
            config.min_remaining,
        ) {
            return self.refuse(refusal, None);
        }
        if let Some(Err(e)) = self.hook.as_ref().map(|h| h.check()) {
            // Asked before the budget: a circuit that is not closed costs
            // no token.
            return self.refuse(Refusal::Breaker, Some(&*e));
        }
        if !M::can_replay(&self.saved) {
            return self.refuse(Refusal::Other, None);
        }
        match self.service.poll_ready(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(_)) => {
                tracing::debug!("hedge not sent: the inner service failed to become ready");
                return self.refuse(Refusal::Other, None);
            }
            Poll::Ready(Ok(())) => {}
        }
        let Some(charge) = state.charge(config.charging, &shared.budget, now) else {
            return self.refuse(Refusal::Budget, None);
        };
        let token = match self.hook.as_ref().map(|h| h.admit()) {
            None => None,
            Some(Ok(token)) => Some(token),
            Some(Err(e)) => {
                state.refund(&shared.budget, charge);
                return self.refuse(Refusal::Breaker, Some(&*e));
            }
        };
        // Last, because a replay supersedes the bodies of earlier
        // attempts' replays.
        let Some(body) = M::replay(&self.saved) else {
            state.refund(&shared.budget, charge);
            if let (Some(hook), Some(token)) = (self.hook.as_ref(), token) {
                hook.cancel(token);
            }
            return self.refuse(Refusal::Other, None);
        };
        let mut request = Request::from_parts(clone_head(&self.template), body);
        mark_attempt(
            request.headers_mut(),
            self.sent + 1,
            config.attempt_header.as_ref(),
        );
        self.sent += 1;
        let attempt = self.sent + 1;
        let attempts = self
            .hook
            .as_ref()
            .zip(token)
            .map(|(hook, token)| Attempts::new(Arc::clone(hook), token));
        let deadline = self.deadline.filter(|_| self.enforced);
        let (future, left) = send(&mut self.service, request, attempts, |cx| {
            if let Some(at) = deadline {
                cx.set_deadline(Deadline::at(at), true);
            }
            cx.set_attempt(attempt);
            cx.set_now(now);
        });
        self.hedges.push(Lane {
            future: Some(Box::pin(future)),
            start: now,
            attempts: left,
            charge: Some(charge),
        });
        state.count_hedge();
        shared.metrics.sent();
        tracing::debug!(
            attempt,
            delay_ms = self.delay.unwrap_or_default().as_millis() as u64,
            "hedge sent"
        );
        self.phase = match self.delay {
            Some(delay) if self.sent < config.max_hedges => {
                self.next_at = Some(now + delay);
                Phase::Idle
            }
            _ => Phase::Stopped,
        };
        Poll::Ready(())
    }

    /// Stops the call's hedging for `refusal`: counted, and said at
    /// `DEBUG`.
    fn refuse(&mut self, refusal: Refusal, error: Option<&(dyn Error + Send + Sync)>) -> Poll<()> {
        self.phase = Phase::Stopped;
        self.timer = None;
        self.shared.state.count_refusal(refusal);
        if refusal == Refusal::Budget {
            self.shared.metrics.refused();
        }
        if refusal != Refusal::Other {
            let attempt = self.sent + 2;
            match error {
                Some(e) => {
                    tracing::debug!(attempt, reason = refusal.as_str(), error = %e, "hedge refused")
                }
                None => tracing::debug!(attempt, reason = refusal.as_str(), "hedge refused"),
            }
        }
        Poll::Pending
    }
}

impl<S, B, M> Drop for Race<S, B, M>
where
    M: ReplayMode<B>,
    S: Service<Request<M::Body>>,
{
    fn drop(&mut self) {
        // The caller gave up on the call: every attempt in flight is
        // cancelled (their futures drop with this one).
        if !self.finished && self.running() {
            let now = Instant::now();
            self.cancel_running(now);
        }
    }
}
