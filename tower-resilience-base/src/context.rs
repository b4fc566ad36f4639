//! The per-call context the layers hand to each other during `call`, and
//! [`Captured`], for a layer that calls its inner service later.

use std::cell::Cell;
use std::marker::PhantomData;

use tokio::time::Instant;

use crate::hook::Attempts;
use crate::Deadline;

thread_local! {
    /// The plain fields: a `Cell` of a `Copy` value, so reading and
    /// restoring them costs a copy, not a borrow.
    static FIELDS: Cell<CallContext> = const { Cell::new(CallContext::EMPTY) };
    /// The attempt hook on offer, if any: a `Cell` too, moved in and out
    /// whole (no borrow flag to check).
    static ATTEMPTS: Cell<Option<Attempts>> = const { Cell::new(None) };
}

/// What the layers of one client stack tell the layers below them about a
/// call: its deadline (and whether a layer above already enforces it), the
/// clock reading the call started with, which attempt this is, and the
/// attempt hook of a breaker above.
///
/// A layer changes the context with [`scoped`](CallContext::scoped) (or
/// offers its hook with [`offer_attempts`](CallContext::offer_attempts))
/// for the duration of its inner service's `call`; the layers below read it
/// with [`current`](CallContext::current), or take the hook with
/// [`take_attempts`](CallContext::take_attempts), during their own `call`.
/// The context lives in thread-locals for exactly that synchronous call, so
/// it costs no allocation and no entry in the request's extensions.
///
/// | field | set by | read by |
/// |---|---|---|
/// | [`deadline`](CallContext::deadline), [`is_enforced`](CallContext::is_enforced) | the outer `ClientDeadline` | the retry layer (never sleeps past it), the per-attempt `ClientDeadline` (writes it on the wire, and cuts the attempt so the layers in between see a timeout, not a cancellation) |
/// | [`now`](CallContext::now) | the first layer that read the clock | every layer below that needs the time (one clock read per call) |
/// | [`attempt`](CallContext::attempt) | the retry layer | layers below that care (1 for the first attempt; 0 outside a retry layer) |
/// | the attempt hook ([`take_attempts`](CallContext::take_attempts)) | the breaker | the retry layer, which then reports every attempt (see [`hook`](crate::hook)) |
///
/// A deadline set as *enforced* is the earliest of every deadline the layer
/// that set it knew, [`Deadline::current`] included, so the layers below
/// need not look anywhere else (see
/// [`effective_deadline`](CallContext::effective_deadline)).
///
/// # Pitfall: deferred calls
///
/// A layer that does not call its inner service within its own `call`
/// (tower's `Buffer` calls it from a worker task, a spawn calls it later)
/// cuts the chain: the layers below it see no context. Put such layers
/// outside (above) the resilience stack. The layers degrade safely: the
/// breaker, seeing its hook untaken, counts the call once itself; the
/// per-attempt deadline falls back to the task-local and default deadline,
/// and the outer one still cuts the call. A layer of ours that must call
/// later (a bulkhead waiting for a slot) keeps the context with
/// [`CallContext::capture`].
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_resilience_base::{CallContext, Deadline};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let deadline = Deadline::after(Duration::from_secs(1));
/// let seen = CallContext::scoped(
///     |cx| cx.set_deadline(deadline, true),
///     // What a layer below sees during its `call`:
///     || CallContext::current(|cx| cx.deadline()),
/// );
/// assert_eq!(seen, Some(deadline));
/// // Outside the call, the context is gone.
/// assert_eq!(CallContext::current(|cx| cx.deadline()), None);
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct CallContext {
    deadline: Option<Deadline>,
    enforced: bool,
    now: Option<Instant>,
    attempt: u32,
}

/// The deadline and attempt number of a call's context, kept by a layer
/// that calls its inner service later than in its own `call` (a bulkhead
/// waiting for a slot), to give the layers below the same context then.
///
/// The clock reading is not kept (time has passed), nor the attempt hook
/// (it belongs to the layer that takes it during `call`).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_resilience_base::{CallContext, Deadline};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let deadline = Deadline::after(Duration::from_secs(1));
/// let captured = CallContext::scoped(|cx| cx.set_deadline(deadline, true), CallContext::capture);
/// // ... later, outside the original call:
/// let seen = captured.scoped(|| CallContext::current(|cx| cx.deadline()));
/// assert_eq!(seen, Some(deadline));
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Captured {
    context: CallContext,
}

/// A change of the call's context made by [`CallContext::enter`], undone
/// when this guard is dropped.
#[must_use = "the context's change is undone when the guard is dropped"]
#[derive(Debug)]
pub struct Entered {
    saved: Option<CallContext>,
    /// The context is the thread's: the guard stays on it.
    _not_send: PhantomData<*const ()>,
}

impl Drop for Entered {
    #[inline]
    fn drop(&mut self) {
        if let Some(saved) = self.saved {
            let _ = FIELDS.try_with(|fields| fields.set(saved));
        }
    }
}

// === impl CallContext ===

impl CallContext {
    const EMPTY: Self = Self {
        deadline: None,
        enforced: false,
        now: None,
        attempt: 0,
    };

    /// Runs `f` on the current context (an empty one outside any layer's
    /// call).
    #[inline]
    pub fn current<R>(f: impl FnOnce(&CallContext) -> R) -> R {
        f(&FIELDS.try_with(Cell::get).unwrap_or(Self::EMPTY))
    }

    /// Runs `call` (a call of the inner service) with the current context
    /// as `change` leaves it, then restores the deadline, clock reading and
    /// attempt number it had. The attempt hook is not touched: it passes
    /// through to the layers below.
    ///
    /// The previous values are restored even if `call` panics.
    #[inline(always)]
    pub fn scoped<R>(change: impl FnOnce(&mut CallContext), call: impl FnOnce() -> R) -> R {
        let _entered = Self::enter(change);
        call()
    }

    /// Changes the current context as `change` leaves it until the
    /// returned guard is dropped, which restores the deadline, clock
    /// reading and attempt number it had: [`scoped`](Self::scoped) for a
    /// layer whose inner call is not one closure (a breaker that reads the
    /// clock before it knows whether the call goes through, say). Drop the
    /// guard before the layer's `call` returns; it cannot be sent to
    /// another thread.
    ///
    /// # Example
    ///
    /// ```
    /// use tokio::time::Instant;
    /// use tower_resilience_base::CallContext;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let now = Instant::now();
    /// let entered = CallContext::enter(|cx| cx.set_now(now));
    /// // What a layer below sees during its `call`:
    /// assert_eq!(CallContext::current(|cx| cx.now()), Some(now));
    /// drop(entered);
    /// assert_eq!(CallContext::current(|cx| cx.now()), None);
    /// # }
    /// ```
    #[inline(always)]
    pub fn enter(change: impl FnOnce(&mut CallContext)) -> Entered {
        let Ok(saved) = FIELDS.try_with(Cell::get) else {
            // Thread-local storage is being torn down: no context at all.
            return Entered {
                saved: None,
                _not_send: PhantomData,
            };
        };
        let mut changed = saved;
        change(&mut changed);
        let _ = FIELDS.try_with(|fields| fields.set(changed));
        Entered {
            saved: Some(saved),
            _not_send: PhantomData,
        }
    }

    /// Runs `call` with `attempts` (a breaker's hook and its admission of
    /// the first attempt) in the context, for a retry layer below to take;
    /// returns `call`'s result and the hook if nobody took it.
    ///
    /// A hook already in the context (a breaker above this one) is hidden
    /// during `call` and put back afterwards.
    #[inline(always)]
    pub fn offer_attempts<R>(
        attempts: Attempts,
        call: impl FnOnce() -> R,
    ) -> (R, Option<Attempts>) {
        let mut left = None;
        let result = Self::offer_attempts_into(attempts, &mut left, call);
        (result, left)
    }

    /// [`offer_attempts`](Self::offer_attempts) that puts the hook, if
    /// nobody took it, in `left` and returns `call`'s result alone: a
    /// layer can then build its response future around the inner one in
    /// place rather than moving it out of a tuple (futures of a deep stack
    /// are hundreds of bytes).
    ///
    /// # Example
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tower_resilience_base::hook::{AttemptHook, AttemptOutcome, AttemptToken, Attempts};
    /// use tower_resilience_base::{BoxError, CallContext};
    ///
    /// #[derive(Debug)]
    /// struct Counts;
    ///
    /// impl AttemptHook for Counts {
    ///     fn admit(&self) -> Result<AttemptToken, BoxError> {
    ///         Ok(AttemptToken::new(0, 0))
    ///     }
    ///     fn record(&self, _: AttemptToken, _: AttemptOutcome<'_>) {}
    ///     fn cancel(&self, _: AttemptToken) {}
    /// }
    ///
    /// let offer = || Attempts::new(Arc::new(Counts), AttemptToken::new(0, 0));
    ///
    /// // Nobody below takes the hook: it comes back in `left`.
    /// let mut left = None;
    /// let answer = CallContext::offer_attempts_into(offer(), &mut left, || "sent");
    /// assert_eq!(answer, "sent");
    /// assert!(left.is_some());
    ///
    /// // A retry layer below takes it: `left` stays empty.
    /// let mut left = None;
    /// let taken = CallContext::offer_attempts_into(offer(), &mut left, CallContext::take_attempts);
    /// assert!(taken.is_some());
    /// assert!(left.is_none());
    /// ```
    #[inline(always)]
    pub fn offer_attempts_into<R>(
        attempts: Attempts,
        left: &mut Option<Attempts>,
        call: impl FnOnce() -> R,
    ) -> R {
        struct Restore<'a> {
            outer: Option<Option<Attempts>>,
            left: &'a mut Option<Attempts>,
        }

        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                if let Some(outer) = self.outer.take() {
                    *self.left = ATTEMPTS
                        .try_with(|slot| slot.replace(outer))
                        .unwrap_or_default();
                }
            }
        }

        let Ok(outer) = ATTEMPTS.try_with(|slot| slot.replace(Some(attempts))) else {
            // Torn down: `attempts` was dropped with the closure, which
            // cancelled its admission; nothing was offered.
            return call();
        };
        let _restore = Restore {
            outer: Some(outer),
            left,
        };
        call()
    }

    /// Takes the attempt hook out of the current context: the caller is now
    /// the one that reports every attempt (see [`hook`](crate::hook)).
    #[inline]
    #[must_use]
    pub fn take_attempts() -> Option<Attempts> {
        ATTEMPTS.try_with(Cell::take).ok().flatten()
    }

    /// The current context's deadline and attempt number, to re-enter later
    /// with [`Captured::scoped`].
    #[must_use]
    pub fn capture() -> Captured {
        let mut context = FIELDS.try_with(Cell::get).unwrap_or(Self::EMPTY);
        context.now = None;
        Captured { context }
    }

    /// Sets the call's deadline; `enforced` says that the layer setting it
    /// cuts the call when it passes, and that the deadline already is the
    /// earliest that layer knew, [`Deadline::current`] included, so the
    /// layers below need not look anywhere else.
    pub fn set_deadline(&mut self, deadline: Deadline, enforced: bool) {
        self.deadline = Some(deadline);
        self.enforced = enforced;
    }

    /// Sets the clock reading the call (or attempt) starts with.
    pub fn set_now(&mut self, now: Instant) {
        self.now = Some(now);
    }

    /// Sets the attempt number (1 for the first).
    pub fn set_attempt(&mut self, attempt: u32) {
        self.attempt = attempt;
    }

    /// The call's deadline, as set by a layer above.
    #[must_use]
    pub fn deadline(&self) -> Option<Deadline> {
        self.deadline
    }

    /// The earliest of the call's deadline and the deadline of the request
    /// being served by this task ([`Deadline::current`]); an enforced
    /// deadline already includes the latter.
    #[must_use]
    #[inline]
    pub fn effective_deadline(&self) -> Option<Deadline> {
        if self.enforced {
            return self.deadline;
        }
        match (self.deadline, Deadline::current()) {
            (Some(a), Some(b)) => Some(a.earliest(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether a layer above cuts the call at [`deadline`](Self::deadline).
    #[must_use]
    pub fn is_enforced(&self) -> bool {
        self.enforced
    }

    /// The clock reading the call (or this attempt) started with, if a layer
    /// above made one.
    #[must_use]
    pub fn now(&self) -> Option<Instant> {
        self.now
    }

    /// The attempt number: 1 for the first attempt, 0 when no retry layer
    /// above said.
    #[must_use]
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Whether the current context carries an attempt hook that no layer
    /// took yet.
    #[must_use]
    pub fn has_attempts(&self) -> bool {
        ATTEMPTS
            .try_with(|slot| {
                // A `Cell` is not peeked at: taken out and put back.
                let attempts = slot.take();
                let some = attempts.is_some();
                slot.set(attempts);
                some
            })
            .unwrap_or(false)
    }
}

// === impl Captured ===

impl Captured {
    /// Runs `call` with the captured deadline and attempt number in the
    /// context (and no clock reading).
    pub fn scoped<R>(self, call: impl FnOnce() -> R) -> R {
        CallContext::scoped(|cx| *cx = self.context, call)
    }

    /// Like [`scoped`](Captured::scoped), with the context further changed
    /// by `change` (a retry's attempt number and clock reading, say).
    pub fn scoped_with<R>(
        self,
        change: impl FnOnce(&mut CallContext),
        call: impl FnOnce() -> R,
    ) -> R {
        CallContext::scoped(
            |cx| {
                *cx = self.context;
                change(cx);
            },
            call,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::hook::{AttemptHook, AttemptOutcome, AttemptToken};
    use crate::BoxError;

    #[derive(Debug, Default)]
    struct Cancels(AtomicUsize);

    impl AttemptHook for Cancels {
        fn admit(&self) -> Result<AttemptToken, BoxError> {
            Ok(AttemptToken::new(0, 0))
        }
        fn record(&self, _: AttemptToken, _: AttemptOutcome<'_>) {}
        fn cancel(&self, _: AttemptToken) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn nested_scopes_restore_the_outer_values() {
        let outer = Deadline::after(Duration::from_secs(2));
        let inner = Deadline::after(Duration::from_secs(1));
        CallContext::scoped(
            |cx| cx.set_deadline(outer, true),
            || {
                let seen = CallContext::scoped(
                    |cx| {
                        cx.set_deadline(inner, false);
                        cx.set_attempt(2);
                    },
                    || CallContext::current(|cx| (cx.deadline(), cx.is_enforced(), cx.attempt())),
                );
                assert_eq!(seen, (Some(inner), false, 2));
                let back =
                    CallContext::current(|cx| (cx.deadline(), cx.is_enforced(), cx.attempt()));
                assert_eq!(back, (Some(outer), true, 0));
            },
        );
        assert_eq!(CallContext::current(CallContext::deadline), None);
    }

    #[test]
    fn a_taken_hook_does_not_come_back() {
        let hook = Arc::new(Cancels::default());
        let attempts = Attempts::new(hook.clone(), AttemptToken::new(1, 1));
        let (taken, left) = CallContext::offer_attempts(attempts, || {
            // A pass-through layer in between does not hide it.
            CallContext::scoped(|cx| cx.set_attempt(1), CallContext::take_attempts)
        });
        assert!(taken.is_some());
        assert!(left.is_none());
        drop(taken);
        assert_eq!(
            hook.0.load(Ordering::Relaxed),
            1,
            "dropped in flight: cancelled"
        );
    }

    #[test]
    fn an_untaken_hook_comes_back_uncancelled() {
        let hook = Arc::new(Cancels::default());
        let attempts = Attempts::new(hook.clone(), AttemptToken::new(1, 1));
        let ((), left) = CallContext::offer_attempts(attempts, || {});
        let token = left.and_then(Attempts::into_in_flight);
        assert_eq!(token, Some(AttemptToken::new(1, 1)));
        assert_eq!(hook.0.load(Ordering::Relaxed), 0);
        assert!(!CallContext::current(CallContext::has_attempts));
    }

    #[test]
    fn kept_attempts_restarted_cancel_only_a_stale_admission() {
        let hook = Arc::new(Cancels::default());
        let mut kept = None;
        for call in 1..=3 {
            let first = AttemptToken::new(call, call);
            let attempts = match kept.take() {
                Some(mut attempts) => {
                    Attempts::restart(&mut attempts, first);
                    attempts
                }
                None => Attempts::new(hook.clone(), first),
            };
            let mut left = None;
            CallContext::offer_attempts_into(attempts, &mut left, || {});
            let mut untaken = left.expect("nobody took the hook");
            assert_eq!(untaken.take_in_flight(), Some(first));
            kept = Some(untaken);
        }
        assert_eq!(
            hook.0.load(Ordering::Relaxed),
            0,
            "nothing in flight was cancelled"
        );
        assert_eq!(
            Arc::strong_count(&hook),
            2,
            "one hook kept, no clone per call"
        );

        // Restarting over an admission still in flight cancels it.
        let mut attempts = kept.take().expect("kept");
        attempts.restart(AttemptToken::new(8, 8));
        attempts.restart(AttemptToken::new(9, 9));
        assert_eq!(hook.0.load(Ordering::Relaxed), 1);
        drop(attempts);
        assert_eq!(
            hook.0.load(Ordering::Relaxed),
            2,
            "dropped in flight: cancelled"
        );
    }

    #[test]
    fn an_outer_hook_is_hidden_then_restored() {
        let hook = Arc::new(Cancels::default());
        let outer = Attempts::new(hook.clone(), AttemptToken::new(1, 1));
        let inner = Attempts::new(hook.clone(), AttemptToken::new(2, 2));
        let (inner_seen, outer_left) = CallContext::offer_attempts(outer, || {
            let (seen, left) = CallContext::offer_attempts(inner, || {
                CallContext::take_attempts().and_then(Attempts::into_in_flight)
            });
            assert!(left.is_none());
            seen
        });
        assert_eq!(inner_seen, Some(AttemptToken::new(2, 2)));
        let outer_token = outer_left.and_then(Attempts::into_in_flight);
        assert_eq!(outer_token, Some(AttemptToken::new(1, 1)));
        assert_eq!(hook.0.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_panicking_call_gives_the_outer_hook_back_and_cancels_the_offered_one() {
        let hook = Arc::new(Cancels::default());
        let outer = Attempts::new(hook.clone(), AttemptToken::new(1, 1));
        let (seen, outer_left) = CallContext::offer_attempts(outer, || {
            let offered = Attempts::new(hook.clone(), AttemptToken::new(2, 2));
            let mut left = None;
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                CallContext::offer_attempts_into::<()>(offered, &mut left, || {
                    panic!("inner service panicked")
                })
            }));
            assert!(result.is_err());
            // The offered hook came back untaken, and dropping it cancels
            // its admission; the outer one is in the context again.
            assert!(left.is_some());
            drop(left);
            assert_eq!(hook.0.load(Ordering::Relaxed), 1);
            CallContext::current(CallContext::has_attempts)
        });
        assert!(seen, "the outer hook is offered again after the panic");
        let outer_token = outer_left.and_then(Attempts::into_in_flight);
        assert_eq!(outer_token, Some(AttemptToken::new(1, 1)));
    }

    #[test]
    fn a_panicking_call_restores_the_previous_context() {
        let result = std::panic::catch_unwind(|| {
            CallContext::scoped(|cx| cx.set_attempt(3), || panic!("inner service panicked"))
        });
        assert!(result.is_err());
        assert_eq!(CallContext::current(CallContext::attempt), 0);
    }
}
