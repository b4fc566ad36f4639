//! What the futures of one poll tell the futures above them: the instant by
//! which a timer armed below will wake the task, so that a deadline above
//! need not arm a second timer for the same instant.
//!
//! A client stack has two deadlines on the way to the dependency: the
//! call's, outside, and each attempt's, inside, which is never later than
//! the call's. While an attempt waits for its answer, its timer already
//! guarantees that the task is polled again by the call's deadline; a
//! second timer outside would cost an allocation and a timer registration
//! per call for nothing. So a future that returns `Pending` with a timer
//! armed says so with [`note`], and a future above learns it by polling its
//! inner future within a [`Watch`] (or [`watch`]): if the earliest noted instant is not
//! later than its own deadline, it leaves its timer unarmed for that poll
//! (it still reads the clock when the inner future answers, and arms its
//! timer on any later poll whose inner future noted nothing in time: a
//! retry waiting for something untimed, say).
//!
//! The note lives in a thread-local for exactly one synchronous poll, as
//! [`CallContext`](crate::CallContext) does for one `call`: it costs no
//! allocation, and a future that does not take part is simply not trusted
//! (a watcher whose inner future noted nothing arms its own timer).
//!
//! # The rule for [`note`]
//!
//! Note only a timer that the future keeps and that was polled with the
//! task's waker during this poll, and only when returning `Pending` while
//! it is armed: the task is then woken no later than the noted instant.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tokio::time::Instant;
//! use tower_resilience_base::wake;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let at = Instant::now() + Duration::from_secs(1);
//! // An inner future, returning `Pending` with a timer armed for `at`:
//! let (polled, woken_by) = wake::watch(|| {
//!     wake::note(at);
//!     std::task::Poll::<()>::Pending
//! });
//! assert!(polled.is_pending());
//! assert_eq!(woken_by, Some(at));
//! // Outside any poll, nothing was noted.
//! assert_eq!(wake::watch(|| ()).1, None);
//! # }
//! ```

use std::cell::Cell;

use tokio::time::Instant;

thread_local! {
    /// The earliest instant noted in the current watch, if any.
    static NOTED: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Says that the future being polled returns `Pending` with a timer armed
/// that wakes the task by `at` (see the [module docs](self) for when that
/// holds). Outside any [`watch`], it is kept for nobody and costs a
/// thread-local write.
#[inline]
pub fn note(at: Instant) {
    // `try_with`: a future polled while the thread's locals are being
    // destroyed notes nothing, and nothing is trusted then.
    let _ = NOTED.try_with(|noted| noted.set(Some(earliest(noted.get(), at))));
}

/// A watch over the poll of an inner future: started just before it, and
/// [finished](Watch::finish) just after, it tells the earliest instant
/// noted in between.
///
/// Watches nest: what was noted within a finished watch is also noted for
/// the watch around it, since the timer that noted it wakes the same task.
/// A watch dropped unfinished gives the enclosing watch nothing: so a
/// future whose inner future answered (its timers are gone) drops it, and
/// so does a poll that unwinds.
///
/// A guard rather than a function taking the poll as a closure: the
/// inner future's output (often a whole response) is then not moved
/// through a closure's return.
#[derive(Debug)]
#[must_use = "a watch tells nothing until it is finished"]
pub struct Watch {
    /// What the enclosing watch had noted when this one started, and what
    /// it gets back when this one ends.
    outer: Option<Instant>,
}

impl Watch {
    /// Starts watching the notes of the poll that follows.
    #[inline]
    pub fn start() -> Self {
        Self {
            outer: NOTED.try_with(|noted| noted.replace(None)).unwrap_or(None),
        }
    }

    /// The earliest instant noted since [`start`](Watch::start), if any.
    #[inline]
    pub fn finish(mut self) -> Option<Instant> {
        let inner = NOTED.try_with(Cell::get).unwrap_or(None);
        if let Some(at) = inner {
            self.outer = Some(earliest(self.outer, at));
        }
        inner
    }
}

impl Drop for Watch {
    #[inline]
    fn drop(&mut self) {
        let outer = self.outer;
        let _ = NOTED.try_with(|noted| noted.set(outer));
    }
}

/// Runs `poll` (the poll of an inner future) within a [`Watch`] and
/// returns its result with the earliest instant noted during it, if any.
#[inline]
pub fn watch<R>(poll: impl FnOnce() -> R) -> (R, Option<Instant>) {
    let watch = Watch::start();
    let out = poll();
    (out, watch.finish())
}

/// The earlier of `earlier`, if any, and `at`.
#[inline]
fn earliest(earlier: Option<Instant>, at: Instant) -> Instant {
    match earlier {
        Some(earlier) if earlier <= at => earlier,
        _ => at,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_watch_sees_the_earliest_note_of_its_poll_only() {
        let t0 = Instant::now();
        let (early, late) = (t0 + Duration::from_secs(1), t0 + Duration::from_secs(2));
        note(t0); // outside any watch: kept for nobody
        let ((), seen) = watch(|| {
            note(late);
            note(early);
            note(late);
        });
        assert_eq!(seen, Some(early));
        assert_eq!(watch(|| ()).1, None, "a new watch starts empty");
    }

    #[test]
    fn nested_watches_pass_what_they_saw_outwards() {
        let t0 = Instant::now();
        let (early, late) = (t0 + Duration::from_secs(1), t0 + Duration::from_secs(2));
        let (inner_seen, outer_seen) = watch(|| {
            note(late);
            let ((), inner) = watch(|| note(early));
            inner
        });
        assert_eq!(inner_seen, Some(early));
        assert_eq!(outer_seen, Some(early));

        // An inner watch that saw nothing leaves the outer one's note.
        let ((), outer_seen) = watch(|| {
            note(late);
            let ((), inner) = watch(|| ());
            assert_eq!(inner, None);
        });
        assert_eq!(outer_seen, Some(late));
    }

    #[test]
    fn a_poll_that_panics_notes_nothing_for_the_watch_around_it() {
        let t0 = Instant::now();
        let ((), seen) = watch(|| {
            let unwound = std::panic::catch_unwind(|| {
                watch(|| {
                    note(t0);
                    panic!("the inner future panicked");
                })
            });
            assert!(unwound.is_err());
        });
        assert_eq!(
            seen, None,
            "the timer that noted it was dropped with the panic"
        );
    }
}
