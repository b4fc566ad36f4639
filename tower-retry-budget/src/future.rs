//! The response future of [`Retry`](crate::Retry).

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::request::Parts;
use http::{HeaderMap, HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_resilience_base::error::DeadlineExceeded;
use tower_resilience_base::fleet::{Claim, ClaimFuture};
use tower_resilience_base::grpc::{is_grpc, GRPC_RETRY_PUSHBACK_MS};
use tower_resilience_base::hook::{AttemptOutcome, Attempts, ResponseView};
use tower_resilience_base::{wake, CallContext, Deadline};
use tower_service::Service;

use crate::backoff::Jitter;
use crate::body::ReplayMode;
use crate::budget::RetryBudget;
use crate::decide::{self, Plan};
use crate::error::{AttemptsExhausted, BudgetExhausted, DeadlineTooClose};
use crate::outcome::{GaveUp, StopReason};
use crate::policy::{is_local_rejection, Class, Policy};
use crate::service::Shared;
use crate::{BoxError, GRPC_PREVIOUS_RPC_ATTEMPTS, NO_RETRY_HEADER};

pin_project! {
    /// Response future of [`Retry`](crate::Retry).
    ///
    /// Drives the attempts of one request: waits for the current attempt,
    /// classifies its outcome, sleeps the backoff, waits for the inner
    /// service to be ready and sends the next attempt, until an outcome is
    /// final. Dropping it cancels the attempt or the backoff in progress.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, B, M>
    where
        M: ReplayMode<B>,
        S: Service<Request<M::Body>>,
    {
        #[pin]
        state: State<S::Future, S::Response>,
        retry: Option<Retrying<S, M::Saved, M::Body>>,
        shared: Arc<Shared<S, dyn Policy>>,
        hook: Option<Attempts>,
        deadline: Option<Instant>,
        attempt: u32,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, R> {
        Attempt {
            #[pin]
            future: F,
        },
        // A retry claimed from the fleet's budget, during its backoff (on
        // the heap: only a call that retries with a shared budget pays
        // for it, and the future moved by every layer stays small).
        Claiming {
            claiming: Box<Claiming<R>>,
        },
        // On the heap: allocated only when a retry is decided, so the
        // future (moved by every layer above) does not carry a `Sleep`.
        Backoff {
            sleep: Pin<Box<Sleep>>,
        },
        Ready,
        Done,
    }
}

/// What a retryable request keeps for its retries.
struct Retrying<S, Saved, Body> {
    template: Parts,
    saved: Saved,
    /// Whether the call's deadline was set and enforced by a layer above,
    /// to hand it to the layers below again on each retry.
    enforced: bool,
    /// What only a call that retries needs, on the heap: allocated when
    /// the first retry is decided, so that a call that needs none carries
    /// none of it (the service alone is a whole stack's worth of bytes,
    /// moved with the future by every layer above).
    cold: Option<Box<Cold<S, Body>>>,
}

/// The part of [`Retrying`] that a call needs once it retries.
struct Cold<S, Body> {
    /// The service the retries go through: a clone of the layer's spare,
    /// made when the first retry is about to be sent.
    service: Option<S>,
    /// The body of the next attempt, taken from `saved` when the retry was
    /// decided (which supersedes the previous attempt's body).
    next: Option<Body>,
    /// This request's random sequence for its backoff delays, drawn on the
    /// first retry.
    jitter: Option<Jitter>,
    /// The budget's payment for the retry being prepared: refunded if that
    /// retry is not sent after all (the hook refuses it, the service fails,
    /// the caller drops the call during the backoff).
    paid: Paid,
}

impl<S, Body> Cold<S, Body> {
    /// The part for retries in `slot`, allocated on first use.
    fn of(slot: &mut Option<Box<Self>>) -> &mut Self {
        slot.get_or_insert_with(|| {
            Box::new(Cold {
                service: None,
                next: None,
                jitter: None,
                paid: Paid::default(),
            })
        })
    }
}

enum Step<T> {
    Return(Result<T, BoxError>),
    Sleep(Duration),
    /// Claim the retry from the fleet during the backoff of `Duration`.
    Claim(Duration, ClaimFuture, Result<T, BoxError>, Instant),
}

/// A retry being claimed from the fleet: the claim, the backoff running
/// meanwhile, the last outcome (returned if the fleet refuses) and when
/// the retry was decided.
struct Claiming<R> {
    claim: Pending<ClaimFuture>,
    sleep: Pin<Box<Sleep>>,
    last: Option<Result<R, BoxError>>,
    at: Instant,
}

/// A future only ever polled through `&mut`: in a `Mutex` (never locked,
/// `get_mut` needs no lock) so that holding it keeps the response future
/// `Sync`, as a boxed `dyn Future + Send` alone would not.
struct Pending<F>(std::sync::Mutex<F>);

impl<F: Future + Unpin> Pending<F> {
    fn new(future: F) -> Self {
        Self(std::sync::Mutex::new(future))
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<F::Output> {
        let future = self.0.get_mut().unwrap_or_else(|e| e.into_inner());
        Pin::new(future).poll(cx)
    }
}

// === impl ResponseFuture ===

impl<S, B, M> ResponseFuture<S, B, M>
where
    M: ReplayMode<B>,
    S: Service<Request<M::Body>>,
{
    /// The response future of a call whose first attempt is not sent yet:
    /// [`start`](Self::start) it with the first attempt's future, after
    /// [`keep_for_retries`](Self::keep_for_retries) for a retryable call.
    #[inline]
    pub(crate) fn new(
        shared: Arc<Shared<S, dyn Policy>>,
        hook: Option<Attempts>,
        deadline: Option<Instant>,
    ) -> Self {
        Self {
            state: State::Done,
            retry: None,
            shared,
            hook,
            deadline,
            attempt: 1,
        }
    }

    /// Keeps a copy of `head`, the saved body and whether the deadline is
    /// enforced above, for the retries; the copy is written in place.
    #[inline]
    pub(crate) fn keep_for_retries(&mut self, head: &Parts, saved: M::Saved, enforced: bool) {
        let retrying = self.retry.insert(Retrying {
            template: Request::new(()).into_parts().0,
            saved,
            enforced,
            cold: None,
        });
        copy_head(head, &mut retrying.template);
    }

    /// Waits for `future`, the first attempt's (not yet polled, so the
    /// future can be written into place).
    #[inline]
    pub(crate) fn start(&mut self, future: S::Future) {
        self.state = State::Attempt { future };
    }
}

impl<S, B, M, ResB: 'static> Future for ResponseFuture<S, B, M>
where
    M: ReplayMode<B>,
    S: Service<Request<M::Body>, Response = Response<ResB>> + Clone,
    S::Error: Into<BoxError>,
{
    type Output = Result<Response<ResB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Attempt { future } => {
                    let result: Result<Response<ResB>, BoxError> =
                        ready!(future.poll(cx)).map_err(Into::into);
                    let (class, marked) = classify(&result, this.shared, *this.deadline);
                    if let Err(e) = &result {
                        if let Some(cold) = this.retry.as_mut().and_then(|r| r.cold.as_mut()) {
                            if tower_resilience_base::error::is_local_rejection(&**e) {
                                // A retry the bulkhead or the throttle below
                                // refused: the dependency never saw it.
                                cold.paid.refund();
                            }
                        }
                    }
                    if let Some(hook) = this.hook.as_mut() {
                        // The breaker above counts the attempt by the class
                        // decided here: the response is judged once.
                        hook.record(match &result {
                            Ok(response) => AttemptOutcome::Response(
                                ResponseView::of(response).with_class(class),
                            ),
                            Err(e) => AttemptOutcome::Error(&**e),
                        });
                    }
                    if class == Class::Success {
                        // The common case, handed out without a detour
                        // through the planner (which would return it as
                        // it is): the response is moved once, not thrice.
                        this.state.set(State::Done);
                        return Poll::Ready(result);
                    }
                    match next_step::<M, B, S, ResB>(
                        result,
                        (class, marked),
                        this.shared,
                        this.retry,
                        this.hook.as_ref(),
                        *this.attempt,
                        *this.deadline,
                    ) {
                        Step::Return(out) => {
                            this.state.set(State::Done);
                            return Poll::Ready(out);
                        }
                        Step::Sleep(delay) => this.state.set(State::Backoff {
                            sleep: Box::pin(tokio::time::sleep(delay)),
                        }),
                        Step::Claim(delay, claim, last, at) => this.state.set(State::Claiming {
                            claiming: Box::new(Claiming {
                                claim: Pending::new(claim),
                                sleep: Box::pin(tokio::time::sleep(delay)),
                                last: Some(last),
                                at,
                            }),
                        }),
                    }
                }
                StateProj::Claiming { claiming } => {
                    let Claiming {
                        claim,
                        sleep,
                        last,
                        at,
                    } = &mut **claiming;
                    let answer = ready!(claim.poll(cx));
                    let budget = &this.shared.budget;
                    let granted = match answer {
                        Claim::Granted => {
                            budget.count_granted(*at);
                            true
                        }
                        Claim::Unavailable => budget.withdraw_at(*at),
                        _ => {
                            budget.count_refused();
                            false
                        }
                    };
                    let Some(result) = last.take() else {
                        unreachable!("a claim keeps the last outcome until it answers");
                    };
                    if !granted {
                        this.shared.metrics.refused();
                        tracing::debug!(
                            attempt = *this.attempt,
                            "retry refused by the fleet's retry budget"
                        );
                        this.state.set(State::Done);
                        return Poll::Ready(give_up(
                            result,
                            StopReason::Budget,
                            *this.attempt,
                            true,
                        ));
                    }
                    drop(result);
                    if let Some(retrying) = this.retry.as_mut() {
                        let fleet = matches!(answer, Claim::Granted);
                        Cold::of(&mut retrying.cold).paid =
                            Paid::new(Arc::clone(budget), *at, fleet);
                    }
                    let sleep =
                        std::mem::replace(sleep, Box::pin(tokio::time::sleep(Duration::ZERO)));
                    this.state.set(State::Backoff { sleep });
                }
                StateProj::Backoff { sleep } => {
                    if sleep.as_mut().poll(cx).is_pending() {
                        // The deadline above need not arm a timer of its
                        // own for this wait (see `wake`).
                        wake::note(sleep.deadline());
                        return Poll::Pending;
                    }
                    this.state.set(State::Ready);
                }
                StateProj::Ready => {
                    let Some(retrying) = this.retry.as_mut() else {
                        unreachable!("a retry is only scheduled for a retryable request");
                    };
                    let template = &retrying.template;
                    let enforced = retrying.enforced;
                    let cold = Cold::of(&mut retrying.cold);
                    if cold.service.is_none() {
                        cold.service = this.shared.retry_service();
                    }
                    let Some(service) = cold.service.as_mut() else {
                        unreachable!("a retryable call sets the spare service up first");
                    };
                    if let Err(e) = ready!(service.poll_ready(cx)) {
                        cold.paid.refund();
                        this.state.set(State::Done);
                        return Poll::Ready(Err(e.into()));
                    }
                    if let Some(hook) = this.hook.as_mut() {
                        if let Err(e) = hook.admit() {
                            // Paid for, never sent: the budget gets it back.
                            cold.paid.refund();
                            tracing::debug!(
                                attempt = *this.attempt + 1,
                                error = %e,
                                "retry stopped by the attempt hook"
                            );
                            this.state.set(State::Done);
                            return Poll::Ready(Err(e));
                        }
                    }
                    let Some(body) = cold.next.take() else {
                        unreachable!("a retry is scheduled with its body");
                    };
                    let mut request = Request::from_parts(clone_head(template), body);
                    let config = &this.shared.config;
                    mark_attempt(
                        request.headers_mut(),
                        *this.attempt,
                        config.attempt_header.as_ref(),
                    );
                    *this.attempt += 1;
                    let attempt = *this.attempt;
                    let deadline = this.deadline.filter(|_| enforced);
                    let future = CallContext::scoped(
                        |cx| {
                            if let Some(at) = deadline {
                                cx.set_deadline(Deadline::at(at), true);
                            }
                            cx.set_attempt(attempt);
                            cx.set_now(Instant::now());
                        },
                        || service.call(request),
                    );
                    cold.paid.sent();
                    this.shared.metrics.retried();
                    this.state.set(State::Attempt { future });
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}

/// Drives the decision after an attempt: classifies the outcome, asks
/// [`plan`](crate::decide::plan), and for a planned retry asks the hook
/// (before any budget is spent), the budget, and the body to replay, in
/// that order.
fn next_step<M, B, S, ResB>(
    result: Result<Response<ResB>, BoxError>,
    (class, marked): (Class, bool),
    shared: &Shared<S, dyn Policy>,
    retry: &mut Option<Retrying<S, M::Saved, M::Body>>,
    hook: Option<&Attempts>,
    attempt: u32,
    deadline: Option<Instant>,
) -> Step<Response<ResB>>
where
    M: ReplayMode<B>,
{
    let config = &shared.config;
    if marked {
        // Retries for this failure were already spent below: keep the mark
        // on the answer, so no tier above retries it either.
        shared.metrics.do_not_retry();
        return Step::Return(give_up(result, StopReason::SpentBelow, attempt, false));
    }
    let replayable = retry.as_ref().is_some_and(|r| M::can_replay(&r.saved));
    let mut now = None;
    let plan = decide::plan(
        class,
        attempt,
        replayable,
        config,
        deadline,
        || *now.insert(Instant::now()),
        || match retry.as_mut() {
            Some(retrying) => {
                let random = &shared.random;
                let jitter = Cold::of(&mut retrying.cold)
                    .jitter
                    .get_or_insert_with(|| Jitter::new(random.next_u64()));
                config.backoff.delay(attempt - 1, jitter)
            }
            None => Duration::ZERO,
        },
    );
    let (delay, reason) = match plan {
        Plan::Return => return Step::Return(result),
        Plan::Stop { reason, retryable } => {
            return Step::Return(give_up(result, reason, attempt, retryable))
        }
        Plan::Wait { delay, reason } => (delay, reason),
    };
    if let Some(Err(e)) = hook.map(Attempts::check) {
        // The circuit opened (perhaps on this very failure): stop now
        // instead of sleeping first, and spend no budget.
        tracing::debug!(attempt, error = %e, "retry stopped by the attempt hook");
        return Step::Return(Err(e));
    }
    // The body before the budget, so that no token pays for a retry that
    // cannot be sent.
    let Some((retrying, body)) = retry
        .as_mut()
        .and_then(|r| M::replay(&r.saved).map(|b| (r, b)))
    else {
        return Step::Return(give_up(result, StopReason::NotRetryable, attempt, true));
    };
    let now = now.unwrap_or_else(Instant::now);
    if let Some(fleet) = shared.budget.shared() {
        // The fleet's budget decides: its answer is awaited during the
        // backoff, and the outcome kept to be returned if it refuses.
        Cold::of(&mut retrying.cold).next = Some(body);
        tracing::debug!(
            attempt = attempt + 1,
            delay_ms = delay.as_millis() as u64,
            reason,
            "claiming a retry from the fleet's budget"
        );
        return Step::Claim(delay, fleet.claim(), result, now);
    }
    if !shared.budget.withdraw_at(now) {
        shared.metrics.refused();
        tracing::debug!(attempt, reason, "retry refused by the retry budget");
        return Step::Return(give_up(result, StopReason::Budget, attempt, true));
    }
    let cold = Cold::of(&mut retrying.cold);
    cold.paid = Paid::new(Arc::clone(&shared.budget), now, false);
    cold.next = Some(body);
    tracing::debug!(
        attempt = attempt + 1,
        delay_ms = delay.as_millis() as u64,
        reason,
        "retrying request"
    );
    Step::Sleep(delay)
}

/// The class of an attempt's outcome by the policy, and whether the answer
/// carries the do-not-retry mark (then it is never retried).
fn classify<S, ResB>(
    result: &Result<Response<ResB>, BoxError>,
    shared: &Shared<S, dyn Policy>,
    deadline: Option<Instant>,
) -> (Class, bool) {
    match result {
        Ok(response) => {
            let headers = response.headers();
            let class = shared.policy.classify_response(response.status(), headers);
            // The mark matters only on an answer that would be retried: a
            // success (nearly every answer) pays no header lookup for it.
            let marked = class != Class::Success
                && !headers.is_empty()
                && headers.contains_key(NO_RETRY_HEADER);
            (class, marked)
        }
        Err(e) if is_attempt_timeout(&**e, deadline, shared.config.min_remaining) => (
            Class::Transient {
                reason: "attempt timeout",
                after: None,
            },
            false,
        ),
        Err(e) if is_local_rejection(&**e) => (Class::Local, false),
        Err(e) => (shared.policy.classify_error(&**e), false),
    }
}

/// The budget's payment for the latest retry: the budget, when it was
/// paid, and whether the fleet granted it (then the fleet gets it back
/// too). Refunded when the retry is not sent (dropped before it was
/// [`sent`](Paid::sent)), or when the layers below refuse it without
/// calling the dependency ([`refund`](Paid::refund) on a local rejection):
/// either way the dependency never saw it.
#[derive(Default)]
struct Paid {
    payment: Option<(Arc<RetryBudget>, Instant, bool)>,
    sent: bool,
}

impl Paid {
    fn new(budget: Arc<RetryBudget>, at: Instant, fleet: bool) -> Self {
        Self {
            payment: Some((budget, at, fleet)),
            sent: false,
        }
    }

    /// The retry was handed to the service below: the payment stands,
    /// unless that service refuses it locally.
    fn sent(&mut self) {
        self.sent = true;
    }

    /// The retry did not reach the dependency: the budget gets it back.
    fn refund(&mut self) {
        if let Some((budget, at, fleet)) = self.payment.take() {
            budget.refund_at(at);
            if let Some(shared) = budget.shared().filter(|_| fleet) {
                shared.give_back();
            }
        }
    }
}

impl Drop for Paid {
    fn drop(&mut self) {
        if !self.sent {
            self.refund();
        }
    }
}

/// Whether an error is a per-attempt timeout worth retrying: a
/// [`DeadlineExceeded`]
/// raised below this layer while the call's own deadline (the one this layer
/// knows, if any) still leaves more than the minimum slice. When the call's
/// deadline is what passed, the error is the caller's and is returned
/// unchanged (see [`is_local_rejection`]).
fn is_attempt_timeout(
    error: &(dyn Error + 'static),
    deadline: Option<Instant>,
    min_remaining: Duration,
) -> bool {
    tower_resilience_base::error::find::<DeadlineExceeded>(error).is_some()
        && deadline.is_none_or(|d| d.saturating_duration_since(Instant::now()) > min_remaining)
}

/// A copy of a request head for the next attempt.
pub(crate) fn clone_head(parts: &Parts) -> Parts {
    let (mut head, ()) = Request::new(()).into_parts();
    copy_head(parts, &mut head);
    head
}

/// Copies `parts` into `head`, a fresh (empty) head; an empty header map or
/// extension map is left as it is rather than cloned (which costs more
/// than nothing even when empty).
#[inline]
fn copy_head(parts: &Parts, head: &mut Parts) {
    head.method = parts.method.clone();
    head.uri = parts.uri.clone();
    head.version = parts.version;
    if !parts.headers.is_empty() {
        head.headers = parts.headers.clone();
    }
    if !parts.extensions.is_empty() {
        head.extensions = parts.extensions.clone();
    }
}

/// Marks a retry with its attempt number: `grpc-previous-rpc-attempts`
/// (attempts before this one) on gRPC requests, the configured header
/// (this attempt's number) on others.
pub(crate) fn mark_attempt(
    headers: &mut HeaderMap,
    previous: u32,
    http_header: Option<&http::HeaderName>,
) {
    if is_grpc(headers) {
        headers.insert(GRPC_PREVIOUS_RPC_ATTEMPTS, HeaderValue::from(previous));
    } else if let Some(name) = http_header {
        headers.insert(name.clone(), HeaderValue::from(previous + 1));
    }
}

/// The final outcome when the layer stops: a response says why in a
/// [`GaveUp`] extension (and, when a limit stopped a retryable failure,
/// with [`NO_RETRY_HEADER`]); an error stopped by a limit is wrapped in the
/// error that names it.
fn give_up<ResB>(
    result: Result<Response<ResB>, BoxError>,
    reason: StopReason,
    attempts: u32,
    retryable: bool,
) -> Result<Response<ResB>, BoxError> {
    let limit = retryable
        && matches!(
            reason,
            StopReason::Attempts | StopReason::Budget | StopReason::Deadline
        );
    if retryable {
        tracing::debug!(attempts, %reason, "giving up on a retryable failure");
    }
    match result {
        Ok(mut response) => {
            if limit {
                let headers = response.headers_mut();
                headers.insert(NO_RETRY_HEADER, HeaderValue::from_static("1"));
                if is_grpc(headers) {
                    // gRPC's own word for it, for clients that retry by
                    // gRPC's retry policy: a negative pushback means never.
                    headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
                }
            }
            response
                .extensions_mut()
                .insert(GaveUp::new(reason, attempts));
            Ok(response)
        }
        Err(e) if limit => Err(match reason {
            StopReason::Attempts => AttemptsExhausted::new(attempts, e).into(),
            StopReason::Budget => BudgetExhausted::new(attempts, e).into(),
            _ => DeadlineTooClose::new(attempts, e).into(),
        }),
        Err(e) => Err(e),
    }
}

impl<S, B, M> fmt::Debug for ResponseFuture<S, B, M>
where
    M: ReplayMode<B>,
    S: Service<Request<M::Body>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Attempt { .. } => "attempt",
            State::Claiming { .. } => "claiming",
            State::Backoff { .. } => "backoff",
            State::Ready => "ready",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("attempt", &self.attempt)
            .field("retryable", &self.retry.is_some())
            .field("deadline", &self.deadline)
            .finish()
    }
}
