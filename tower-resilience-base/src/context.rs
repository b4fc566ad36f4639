//! The per-call context the layers hand to each other during `call`.

use std::cell::RefCell;

use tokio::time::Instant;

use crate::hook::Attempts;
use crate::Deadline;

thread_local! {
    static FRAME: RefCell<CallContext> = const { RefCell::new(CallContext::new()) };
}

/// What the layers of one client stack tell the layers below them about a
/// call: its deadline (and whether a layer above already enforces it), the
/// clock reading the call started with, which attempt this is, and the
/// attempt hook of a breaker above.
///
/// A layer installs a context with [`enter`](CallContext::enter) for the
/// duration of its inner service's `call`; the layers below read it with
/// [`current`](CallContext::current) (or take the hook with
/// [`take_attempts`](CallContext::take_attempts)) during their own `call`.
/// The context lives in a thread-local for exactly that synchronous call,
/// so it costs no allocation and no entry in the request's extensions.
///
/// | field | set by | read by |
/// |---|---|---|
/// | [`deadline`](CallContext::deadline), [`is_enforced`](CallContext::is_enforced) | the outer `ClientDeadline` | the retry layer (never sleeps past it), the per-attempt `ClientDeadline` (writes it on the wire; arms no second timer for a deadline already enforced above) |
/// | [`now`](CallContext::now) | the first layer that read the clock | every layer below that needs the time (one clock read per call) |
/// | [`attempt`](CallContext::attempt) | the retry layer | layers below that care (1 for the first attempt; 0 outside a retry layer) |
/// | [`take_attempts`](CallContext::take_attempts) | the breaker | the retry layer, which then reports every attempt (see [`hook`](crate::hook)) |
///
/// # Pitfall: deferred calls
///
/// A layer that does not call its inner service within its own `call`
/// (tower's `Buffer` calls it from a worker task, a spawn calls it later)
/// cuts the chain: the layers below it see no context. Put such layers
/// outside (above) the resilience stack. The layers degrade safely: the
/// breaker, seeing its hook untaken, counts the call once itself; the
/// per-attempt deadline falls back to the task-local and default deadline.
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
/// let (seen, _after) = CallContext::inherit()
///     .with_deadline(deadline, true)
///     .enter(|| {
///         // What a layer below sees during its `call`.
///         CallContext::current(|cx| cx.deadline())
///     });
/// assert_eq!(seen, Some(deadline));
/// // Outside the call, the context is gone.
/// assert_eq!(CallContext::current(|cx| cx.deadline()), None);
/// # }
/// ```
#[derive(Debug, Default)]
pub struct CallContext {
    deadline: Option<Deadline>,
    enforced: bool,
    now: Option<Instant>,
    attempt: u32,
    attempts: Option<Attempts>,
}

// === impl CallContext ===

impl CallContext {
    /// An empty context: no deadline, no clock reading, no hook.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            deadline: None,
            enforced: false,
            now: None,
            attempt: 0,
            attempts: None,
        }
    }

    /// A copy of the current context without its hook (which belongs to
    /// one layer only), to extend and [`enter`](CallContext::enter) for the
    /// layers below.
    #[must_use]
    pub fn inherit() -> Self {
        Self::current(|cx| Self {
            deadline: cx.deadline,
            enforced: cx.enforced,
            now: cx.now,
            attempt: cx.attempt,
            attempts: None,
        })
    }

    /// Runs `f` on the current context (an empty one outside any
    /// [`enter`](CallContext::enter)).
    pub fn current<R>(f: impl FnOnce(&CallContext) -> R) -> R {
        if FRAME.try_with(|_| ()).is_err() {
            return f(&CallContext::new());
        }
        FRAME.with(|frame| f(&frame.borrow()))
    }

    /// Takes the attempt hook out of the current context: the caller is now
    /// the one that reports every attempt (see [`hook`](crate::hook)).
    #[must_use]
    pub fn take_attempts() -> Option<Attempts> {
        FRAME
            .try_with(|frame| frame.borrow_mut().attempts.take())
            .ok()
            .flatten()
    }

    /// Runs `f` (a call of the inner service) with `self` as the current
    /// context, then restores the previous one; returns `f`'s result and
    /// what is left of `self` (its hook is gone if a layer below took it).
    ///
    /// The previous context is restored even if `f` panics.
    pub fn enter<R>(self, f: impl FnOnce() -> R) -> (R, CallContext) {
        struct Restore(Option<CallContext>);

        impl Drop for Restore {
            fn drop(&mut self) {
                if let Some(previous) = self.0.take() {
                    let _ = FRAME.try_with(|frame| frame.replace(previous));
                }
            }
        }

        if FRAME.try_with(|_| ()).is_err() {
            // Thread-local storage is being torn down: no context at all.
            return (f(), self);
        }
        let previous = FRAME.with(|frame| frame.replace(self));
        let mut restore = Restore(Some(previous));
        let result = f();
        let previous = restore.0.take().unwrap_or_default();
        let after = FRAME
            .try_with(|frame| frame.replace(previous))
            .unwrap_or_default();
        (result, after)
    }

    /// This context with `deadline`; `enforced` says that the layer setting
    /// it cuts the call when it passes, so layers below need not arm a
    /// timer of their own for the same instant.
    #[must_use]
    pub fn with_deadline(mut self, deadline: Deadline, enforced: bool) -> Self {
        self.deadline = Some(deadline);
        self.enforced = enforced;
        self
    }

    /// This context with the clock reading the call (or attempt) started
    /// with.
    #[must_use]
    pub fn with_now(mut self, now: Instant) -> Self {
        self.now = Some(now);
        self
    }

    /// This context for attempt number `attempt` (1 for the first).
    #[must_use]
    pub fn with_attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// This context carrying an attempt hook for a layer below to take.
    #[must_use]
    pub fn with_attempts(mut self, attempts: Attempts) -> Self {
        self.attempts = Some(attempts);
        self
    }

    /// The call's deadline, as set by a layer above.
    #[must_use]
    pub fn deadline(&self) -> Option<Deadline> {
        self.deadline
    }

    /// The earliest of the call's deadline and the deadline of the request
    /// being served by this task ([`Deadline::current`]).
    #[must_use]
    pub fn effective_deadline(&self) -> Option<Deadline> {
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

    /// The clock reading the call started with, or a fresh one.
    #[must_use]
    pub fn now_or_read(&self) -> Instant {
        self.now.unwrap_or_else(Instant::now)
    }

    /// The attempt number: 1 for the first attempt, 0 when no retry layer
    /// above said.
    #[must_use]
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Whether the context carries an attempt hook that no layer took yet.
    #[must_use]
    pub fn has_attempts(&self) -> bool {
        self.attempts.is_some()
    }

    /// Takes the attempt hook out of this context (the one
    /// [`enter`](Self::enter) returns, when nobody below took it).
    #[must_use]
    pub fn into_attempts(self) -> Option<Attempts> {
        self.attempts
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
    async fn nested_contexts_restore_the_outer_one() {
        let outer = Deadline::after(Duration::from_secs(2));
        let inner = Deadline::after(Duration::from_secs(1));
        let ((), _) = CallContext::new().with_deadline(outer, true).enter(|| {
            let (seen, _) = CallContext::inherit()
                .with_deadline(inner, false)
                .with_attempt(2)
                .enter(|| CallContext::current(|cx| (cx.deadline(), cx.attempt())));
            assert_eq!(seen, (Some(inner), 2));
            assert_eq!(CallContext::current(|cx| cx.deadline()), Some(outer));
        });
        assert_eq!(CallContext::current(|cx| cx.deadline()), None);
    }

    #[test]
    fn a_taken_hook_is_gone_from_what_enter_returns() {
        let hook = Arc::new(Cancels::default());
        let attempts = Attempts::new(hook.clone(), AttemptToken::new(1, 1));
        let (taken, after) = CallContext::new()
            .with_attempts(attempts)
            .enter(CallContext::take_attempts);
        assert!(taken.is_some());
        assert!(!after.has_attempts());
        drop(taken);
        assert_eq!(hook.0.load(Ordering::Relaxed), 1, "dropped in flight: cancelled");
    }

    #[test]
    fn an_untaken_hook_comes_back_uncancelled() {
        let hook = Arc::new(Cancels::default());
        let attempts = Attempts::new(hook.clone(), AttemptToken::new(1, 1));
        let ((), after) = CallContext::new().with_attempts(attempts).enter(|| {});
        let token = after.into_attempts().and_then(Attempts::into_in_flight);
        assert_eq!(token, Some(AttemptToken::new(1, 1)));
        assert_eq!(hook.0.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_panicking_call_restores_the_previous_context() {
        let result = std::panic::catch_unwind(|| {
            CallContext::new()
                .with_attempt(3)
                .enter(|| panic!("inner service panicked"))
        });
        assert!(result.is_err());
        assert_eq!(CallContext::current(CallContext::attempt), 0);
    }
}
