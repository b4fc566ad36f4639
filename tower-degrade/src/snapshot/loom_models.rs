//! Loom models of the fallback counters: answers counted from two threads
//! while a third reads snapshots, and callers racing for the places of
//! the asynchronous sources. Run with `scripts/loom`.
//!
//! What a snapshot promises is what its docs say: each figure is one
//! relaxed load, so figures read while calls complete may disagree by the
//! calls in flight (a stale answer's age may be in the maximum and not yet
//! in the total). The models hold each figure to that, and every figure to
//! its exact value once the calls are done.

use std::sync::Arc;
use std::time::Duration;

use loom::thread;
use tower_resilience_base::loom_sync::model;

use super::*;

const SECOND: Duration = Duration::from_secs(1);

/// Two cached answers served from two threads (3 s stale for a failure,
/// 5 s stale for an open circuit) while the main thread takes a snapshot.
/// Each figure of the snapshot is a value it held: between none and both
/// answers, and the oldest age one of those recorded (never a torn or
/// made-up one). Once both are served, the totals are exact and the
/// oldest age is the larger one.
#[test]
fn snapshots_show_each_figure_between_before_and_after_racing_answers() {
    model(|| {
        let stats = Arc::new(Stats::new());
        let failure = {
            let stats = stats.clone();
            thread::spawn(move || stats.served(Cause::Failure, Some(3 * SECOND)))
        };
        let open = {
            let stats = stats.clone();
            thread::spawn(move || stats.served(Cause::CircuitOpen, Some(5 * SECOND)))
        };
        let s = stats.snapshot("loom".into(), 0);
        assert!(s.served.get(Cause::Failure) <= 1, "{s:?}");
        assert!(s.served.get(Cause::CircuitOpen) <= 1, "{s:?}");
        assert!(s.stale.served <= 2, "{s:?}");
        assert!(
            [0, 3, 5, 8]
                .map(|n| n * SECOND)
                .contains(&s.stale.total_age),
            "{s:?}"
        );
        assert!(
            [0, 3, 5].map(|n| n * SECOND).contains(&s.stale.max_age),
            "{s:?}"
        );

        // Each call's own answer is in the total it returns.
        let totals = [failure.join().unwrap(), open.join().unwrap()];
        assert!(totals.iter().all(|t| (1..=2).contains(t)), "{totals:?}");
        let done = stats.snapshot("loom".into(), 0);
        assert_eq!(done.served.get(Cause::Failure), 1);
        assert_eq!(done.served.get(Cause::CircuitOpen), 1);
        assert_eq!(done.served.total(), 2);
        assert_eq!(done.stale.served, 2);
        assert_eq!(done.stale.total_age, 8 * SECOND);
        assert_eq!(done.stale.max_age, 5 * SECOND);
        assert_eq!(done.stale.mean_age(), Some(4 * SECOND));
    });
}

/// Three cached answers for one cause, the oldest (9 s) and a 2 s one
/// from two threads racing, after a 4 s one: the oldest age kept is the
/// largest recorded, whichever update lands last (a smaller age never
/// overwrites a larger one), and no answer is lost from the counts. An
/// answer given nothing (unanswered) races along and is counted apart.
#[test]
fn the_oldest_age_is_the_largest_recorded_whatever_the_order() {
    model(|| {
        let stats = Arc::new(Stats::new());
        stats.served(Cause::Failure, Some(4 * SECOND));
        let oldest = {
            let stats = stats.clone();
            thread::spawn(move || {
                stats.served(Cause::Failure, Some(9 * SECOND));
            })
        };
        let newer = {
            let stats = stats.clone();
            thread::spawn(move || {
                stats.served(Cause::Failure, Some(2 * SECOND));
                stats.unanswered(Cause::Failure)
            })
        };
        let during = stats.snapshot("loom".into(), 0).stale.max_age;
        assert!(during == 4 * SECOND || during == 9 * SECOND, "{during:?}");
        oldest.join().unwrap();
        assert_eq!(newer.join().unwrap(), 1);
        let done = stats.snapshot("loom".into(), 0);
        assert_eq!(done.stale.max_age, 9 * SECOND);
        assert_eq!(done.served.get(Cause::Failure), 3);
        assert_eq!(done.stale.served, 3);
        assert_eq!(done.stale.total_age, 15 * SECOND);
        assert_eq!(done.unanswered.get(Cause::Failure), 1);
        assert_eq!(done.unanswered.total(), 1);
    });
}

/// Three callers race for two places to await an asynchronous source:
/// exactly two get one (never a third, and never fewer because a racing
/// caller's claim made one give up), the snapshot never shows more than
/// two awaited, and dropping the permits frees every place.
#[test]
fn async_places_are_granted_up_to_the_limit_and_all_given_back() {
    model(|| {
        let stats = Arc::new(Stats::new());
        let racers: Vec<_> = (0..2)
            .map(|_| {
                let stats = stats.clone();
                thread::spawn(move || stats.async_permit(2))
            })
            .collect();
        let mine = stats.async_permit(2);
        let waiting = stats.snapshot("loom".into(), 0).async_waiting;
        assert!((1..=2).contains(&waiting) || mine.is_none(), "{waiting}");
        assert!(waiting <= 2, "{waiting} awaited, above the limit");
        let permits: Vec<AsyncPermit> = racers
            .into_iter()
            .filter_map(|racer| racer.join().unwrap())
            .chain(mine)
            .collect();
        assert_eq!(permits.len(), 2, "two places, three callers");
        assert_eq!(stats.snapshot("loom".into(), 0).async_waiting, 2);
        drop(permits);
        assert_eq!(stats.snapshot("loom".into(), 0).async_waiting, 0);
    });
}
