//! Loom models of the state machine: the state word and the probe slots,
//! driven through the public [`Breaker`] and [`Permit`], with the model's
//! clock (`crate::sync::clock`) standing in for tokio's. Run with
//! `scripts/loom`.

use std::time::Duration;

use loom::thread;
use tower_resilience_base::loom_sync::model;

use super::super::{Breaker, Kind, Permit};
use crate::classify::Outcome;
use crate::config::BreakerConfig;
use crate::state::{Word, CLOSED, HALF_OPEN, OPEN};
use crate::sync::{clock, Ordering::Acquire};

const OPEN_PERIOD: Duration = Duration::from_secs(1);
const PROBE_WAIT: Duration = Duration::from_secs(10);

/// A breaker whose window of two opens on two failures (or on one with
/// `minimum_calls(1)`), open for [`OPEN_PERIOD`] with no jitter, probing
/// with `probes` slots, closing on the first successful probe, giving a
/// probe [`PROBE_WAIT`]; the clock at zero.
fn breaker(minimum_calls: u32, probes: u32) -> Breaker {
    clock::set(Duration::ZERO);
    Breaker::with_config(
        "loom",
        BreakerConfig::new()
            .count_window(2)
            .minimum_calls(minimum_calls)
            .failure_rate(0.5)
            .open_period(OPEN_PERIOD)
            .jitter(0.0)
            .permitted_probes(probes)
            .successes_to_close(1)
            .max_half_open_wait(PROBE_WAIT),
    )
}

/// The state word now.
fn word(b: &Breaker) -> Word {
    Word(b.core.word.load(Acquire))
}

/// Opens `b` with one failure and lets its open period pass: the next
/// caller moves it to half-open.
fn open_and_wait(b: &Breaker) {
    b.try_acquire().unwrap().record(Outcome::Failure);
    assert_eq!(word(b).state(), OPEN);
    clock::set(OPEN_PERIOD * 2);
}

/// Half-open, one probe slot: three callers race once the open period is
/// over (one of them also moves the circuit from open to half-open). Exactly
/// one of them gets the probe; the others are refused while it is out.
#[test]
fn half_open_admits_exactly_one_probe_among_racing_callers() {
    model(|| {
        let b = breaker(1, 1);
        open_and_wait(&b);
        let callers: Vec<_> = (0..3)
            .map(|_| {
                let b = b.clone();
                thread::spawn(move || b.try_acquire().ok())
            })
            .collect();
        let admitted: Vec<Permit> = callers
            .into_iter()
            .filter_map(|caller| caller.join().unwrap())
            .collect();
        assert_eq!(admitted.len(), 1, "admitted: {admitted:?}");
        assert!(admitted[0].is_probe());
        let w = word(&b);
        assert_eq!(w.state(), HALF_OPEN);
        assert_eq!(b.core.probes_held(w.gen()), 1);
    });
}

/// Half-open, two probe slots: two callers take a probe each and drop it
/// (a cancelled call), racing. Every dropped probe frees its slot: none is
/// held afterwards, and two new callers get both slots again (a third is
/// refused).
#[test]
fn a_dropped_probe_frees_its_slot() {
    model(|| {
        let b = breaker(1, 2);
        open_and_wait(&b);
        let callers: Vec<_> = (0..2)
            .map(|_| {
                let b = b.clone();
                thread::spawn(move || {
                    let permit = b.try_acquire().expect("a slot is free");
                    assert!(permit.is_probe());
                    drop(permit);
                })
            })
            .collect();
        for caller in callers {
            caller.join().unwrap();
        }
        let w = word(&b);
        assert_eq!(w.state(), HALF_OPEN);
        assert_eq!(b.core.probes_held(w.gen()), 0, "a slot leaked");
        let (first, second) = (b.try_acquire().unwrap(), b.try_acquire().unwrap());
        assert!(first.is_probe() && second.is_probe());
        assert!(b.try_acquire().is_err());
    });
}

/// A probe's success races with the caller that times that probe out (its
/// wait is over): whichever moves the circuit first wins, and a probe
/// outcome that arrives after the state moved on (a new generation) never
/// moves it again. So the state at the end is the one the racing caller's
/// answer implies: closed if it was let through, as a closed-state call or
/// with the slot the success freed just before it closed the circuit (that
/// probe's outcome is then stale), open if it was refused (it timed the
/// probe out); and the circuit opened at most once more.
#[test]
fn a_stale_probe_outcome_never_moves_the_new_state() {
    model(|| {
        let b = breaker(1, 1);
        open_and_wait(&b);
        let probe = b.try_acquire().unwrap();
        assert!(probe.is_probe());
        // The probe is overdue: the next caller may time it out.
        clock::set(OPEN_PERIOD * 2 + PROBE_WAIT + Duration::from_millis(1));
        let prober = thread::spawn(move || probe.record(Outcome::Success));
        let caller = {
            let b = b.clone();
            thread::spawn(move || b.try_acquire().ok().map(|p| (p.kind, p)))
        };
        prober.join().unwrap();
        let answer = caller.join().unwrap();
        let opened = b.core.totals().opened;
        let state = word(&b).state();
        match answer.as_ref().map(|(kind, _)| *kind) {
            Some(Kind::Tracked) => assert_eq!((state, opened), (CLOSED, 1)),
            Some(Kind::Probe) => assert_eq!((state, opened), (CLOSED, 1), "the success was lost"),
            None => assert_eq!((state, opened), (OPEN, 2), "a stale success closed it"),
            Some(Kind::Untracked) => panic!("automatic mode never passes untracked"),
        }
    });
}

/// Closed: two failures race to trip a window that one earlier failure
/// half fills. The circuit opens exactly once (the loser's transition,
/// from a word already gone, fails), and every outcome is counted once:
/// as a failure in the window, or as stale if it arrived after the circuit
/// opened.
#[test]
fn racing_failures_open_the_circuit_exactly_once() {
    model(|| {
        let b = breaker(2, 1);
        b.try_acquire().unwrap().record(Outcome::Failure);
        assert_eq!(word(&b).state(), CLOSED);
        let callers: Vec<_> = (0..2)
            .map(|_| {
                let permit = b.try_acquire().unwrap();
                thread::spawn(move || permit.record(Outcome::Failure))
            })
            .collect();
        for caller in callers {
            caller.join().unwrap();
        }
        let totals = b.core.totals();
        assert_eq!(word(&b).state(), OPEN);
        assert_eq!(totals.opened, 1, "opened twice");
        assert_eq!(totals.failed + totals.stale, 3);
    });
}

/// Half-open, two probe slots: a probe succeeds while another caller takes
/// the free slot, which first renews the probe deadline (same generation,
/// a new word). The success closes the circuit whatever the order: its
/// close retries from the renewed word instead of failing on the old one
/// and leaving the circuit half-open until some later probe (the
/// liveness gap). The racing caller is then let through closed, or holds
/// a probe whose outcome is stale.
#[test]
fn a_probe_success_closes_despite_a_racing_deadline_renewal() {
    model(|| {
        let b = breaker(1, 2);
        open_and_wait(&b);
        let probe = b.try_acquire().unwrap();
        assert!(probe.is_probe());
        // Later than the probe's start: the next probe renews the deadline.
        clock::set(OPEN_PERIOD * 3);
        let prober = thread::spawn(move || probe.record(Outcome::Success));
        let caller = {
            let b = b.clone();
            thread::spawn(move || b.try_acquire().ok().map(|p| p.kind))
        };
        prober.join().unwrap();
        let answer = caller.join().unwrap();
        assert_eq!(word(&b).state(), CLOSED, "the success left it half-open");
        assert!(
            matches!(answer, Some(Kind::Tracked | Kind::Probe)),
            "{answer:?}"
        );
        assert_eq!(b.core.totals().opened, 1);
    });
}

/// The same race with a failing probe: the failure re-opens the circuit
/// whatever the order, rather than being dropped when the renewal changed
/// the word first.
#[test]
fn a_probe_failure_reopens_despite_a_racing_deadline_renewal() {
    model(|| {
        let b = breaker(1, 2);
        open_and_wait(&b);
        let probe = b.try_acquire().unwrap();
        clock::set(OPEN_PERIOD * 3);
        let prober = thread::spawn(move || probe.record(Outcome::Failure));
        let caller = {
            let b = b.clone();
            thread::spawn(move || b.try_acquire().ok().map(|p| p.kind))
        };
        prober.join().unwrap();
        let answer = caller.join().unwrap();
        assert_eq!(word(&b).state(), OPEN, "the failure was dropped");
        assert_eq!(b.core.totals().opened, 2);
        assert!(matches!(answer, None | Some(Kind::Probe)), "{answer:?}");
    });
}
