//! The deadline of a call, and of the request being served.

use std::future::Future;
use std::time::Duration;

use http::Extensions;
use tokio::task::futures::TaskLocalFuture;
use tokio::time::Instant;

tokio::task_local! {
    static SERVING: Deadline;
}

/// Thirty years: what "no deadline in practice" means when a budget is too
/// large to add to the clock.
const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// The moment by which a logical call must be finished.
///
/// A deadline is absolute (a [`tokio::time::Instant`]), so it does not shrink
/// twice when it is handed from layer to layer; it is turned back into a
/// relative budget ([`remaining`](Deadline::remaining)) only at the edge,
/// when a request leaves the process.
///
/// `tower-deadline`'s server layer stores the deadline of the request being
/// served in the request's extensions and in a task-local scope for the
/// whole handler, so code running on behalf of that request can ask for it
/// with [`Deadline::current`], and every client layer of the toolkit
/// inherits it. Within one client stack the deadline travels in the
/// [`CallContext`](crate::CallContext).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_resilience_base::Deadline;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let deadline = Deadline::after(Duration::from_millis(300));
/// assert!(deadline.remaining() <= Duration::from_millis(300));
///
/// assert_eq!(Deadline::current(), None);
/// deadline
///     .scope(async move {
///         // Anything awaited here sees the deadline.
///         assert_eq!(Deadline::current(), Some(deadline));
///     })
///     .await;
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline {
    at: Instant,
}

// === impl Deadline ===

impl Deadline {
    /// A deadline at the given instant.
    #[must_use]
    pub const fn at(instant: Instant) -> Self {
        Self { at: instant }
    }

    /// A deadline `budget` from now.
    ///
    /// A budget too large to add to the clock is treated as thirty years,
    /// which is "no deadline" for any practical purpose; this never panics.
    #[must_use]
    pub fn after(budget: Duration) -> Self {
        Self::after_from(Instant::now(), budget)
    }

    /// A deadline `budget` after `now`, for a layer that has already read
    /// the clock. Saturates like [`after`](Deadline::after).
    #[must_use]
    pub fn after_from(now: Instant, budget: Duration) -> Self {
        let at = now
            .checked_add(budget)
            .unwrap_or_else(|| now + FAR_FUTURE.min(budget));
        Self { at }
    }

    /// The instant at which the deadline passes.
    #[must_use]
    pub const fn instant(self) -> Instant {
        self.at
    }

    /// The budget left from now; zero once the deadline has passed.
    ///
    /// This reads the clock; where a layer already holds `now`, it uses
    /// [`remaining_at`](Deadline::remaining_at).
    #[must_use]
    pub fn remaining(self) -> Duration {
        self.remaining_at(Instant::now())
    }

    /// The budget left at `now`; zero if the deadline is at or before `now`.
    #[must_use]
    pub fn remaining_at(self, now: Instant) -> Duration {
        self.at.saturating_duration_since(now)
    }

    /// Whether the deadline has passed (no budget remains).
    #[must_use]
    pub fn is_expired(self) -> bool {
        self.remaining().is_zero()
    }

    /// The earlier of two deadlines: combining budgets never extends one.
    #[must_use]
    pub fn earliest(self, other: Deadline) -> Deadline {
        self.min(other)
    }

    /// The deadline of the request being served by the current task, if any.
    ///
    /// It is set by `tower-deadline`'s server layer for the whole handler,
    /// and by [`Deadline::scope`] for any future.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_resilience_base::Deadline;
    ///
    /// // Outside any scope there is no deadline.
    /// assert_eq!(Deadline::current(), None);
    /// ```
    #[must_use]
    pub fn current() -> Option<Deadline> {
        SERVING.try_with(|d| *d).ok()
    }

    /// The deadline stored in a request's (or response's) extensions.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_resilience_base::Deadline;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let mut request = http::Request::new(());
    /// let deadline = Deadline::after(Duration::from_secs(1));
    /// request.extensions_mut().insert(deadline);
    /// assert_eq!(Deadline::from_extensions(request.extensions()), Some(deadline));
    /// # }
    /// ```
    #[must_use]
    pub fn from_extensions(extensions: &Extensions) -> Option<Deadline> {
        extensions.get::<Deadline>().copied()
    }

    /// Runs `future` with this deadline as the task-local
    /// [`current`](Deadline::current) one.
    ///
    /// The scope is exactly this deadline; to nest without ever extending an
    /// outer budget, combine first:
    /// `Deadline::current().map_or(d, |outer| outer.earliest(d)).scope(fut)`.
    pub fn scope<F: Future>(self, future: F) -> TaskLocalFuture<Deadline, F> {
        SERVING.scope(self, future)
    }

    /// Runs the closure `f` with this deadline as the task-local
    /// [`current`](Deadline::current) one.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_resilience_base::Deadline;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let d = Deadline::after(Duration::from_secs(1));
    /// assert_eq!(d.sync_scope(Deadline::current), Some(d));
    /// # }
    /// ```
    pub fn sync_scope<R>(self, f: impl FnOnce() -> R) -> R {
        SERVING.sync_scope(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn remaining_saturates_at_zero() {
        let d = Deadline::after(Duration::from_millis(10));
        tokio::time::advance(Duration::from_millis(9)).await;
        assert_eq!(d.remaining(), Duration::from_millis(1));
        assert!(!d.is_expired());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(d.is_expired());
        tokio::time::advance(Duration::from_millis(5)).await;
        assert_eq!(d.remaining(), Duration::ZERO);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn huge_budgets_do_not_panic() {
        let d = Deadline::after(Duration::MAX);
        assert!(d.remaining() >= FAR_FUTURE - Duration::from_secs(1));
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn earliest_never_extends() {
        let a = Deadline::after(Duration::from_millis(10));
        let b = Deadline::after(Duration::from_millis(20));
        assert_eq!(a.earliest(b), a);
        assert_eq!(b.earliest(a), a);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn scope_is_visible_across_awaits_and_gone_after() {
        let d = Deadline::after(Duration::from_secs(1));
        d.scope(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            assert_eq!(Deadline::current(), Some(d));
        })
        .await;
        assert_eq!(Deadline::current(), None);
    }
}
