//! Loom models of a compartment: its slot counter, its waiter places and
//! the wake-ups a release sends to waiting calls, with two or three racing
//! threads. Run with `scripts/loom`.
//!
//! A waiting call is modelled as [`Permit::acquire_within`] runs it, less
//! the timeout (tokio's timer does not run under loom): a waiter place,
//! then [`wait_for_slot`] driven by `loom::future::block_on`. A wake-up
//! that is lost leaves that thread parked for ever, which loom reports as
//! a deadlock.

use std::sync::atomic::{AtomicUsize as Witness, Ordering::SeqCst};
use std::sync::Arc;

use loom::thread;
use tower_resilience_base::loom_sync::model;

use super::*;

fn compartment(limit: usize) -> Arc<Compartment> {
    Arc::new(Compartment::new("loom".into(), limit))
}

/// Holds the slot of `permit` for a moment in which the other threads may
/// run, counted in `held`: a witness outside the model (loom runs one
/// thread at a time, so it is exact), which is never past `limit`.
fn hold(permit: Permit, held: &Witness, limit: usize) {
    let now = held.fetch_add(1, SeqCst) + 1;
    assert!(now <= limit, "{now} calls hold a slot of {limit}");
    thread::yield_now();
    held.fetch_sub(1, SeqCst);
    drop(permit);
}

/// Waits for a slot as a call with `max_wait` does, if the compartment is
/// full and a waiter place is free; `None` if refused at once.
fn wait(c: &Arc<Compartment>, max_waiters: usize) -> Option<Permit> {
    if let Some(permit) = Permit::try_acquire(c) {
        return Some(permit);
    }
    let place = WaiterPlace::try_take(c, max_waiters)?;
    loom::future::block_on(wait_for_slot(&place.compartment));
    drop(place);
    Some(Permit::new(c))
}

/// Three calls race for a compartment of two slots, each taking a slot if
/// one is free and giving it back. Never more than two hold a slot at
/// once; at least two get one; every refusal is counted; and afterwards
/// every slot is free again (no release lost, none doubled).
#[test]
fn racing_calls_never_exceed_the_limit_and_return_every_slot() {
    model(|| {
        let c = compartment(2);
        let held = Arc::new(Witness::new(0));
        let calls: Vec<_> = (0..3)
            .map(|_| {
                let (c, held) = (c.clone(), held.clone());
                thread::spawn(move || {
                    match Admission::decide(&c, WaitPolicy::default(), Shedding::OFF, || {
                        Criticality::Critical
                    }) {
                        Admission::Go(permit) => {
                            hold(permit, &held, 2);
                            true
                        }
                        Admission::Full(_) => false,
                        Admission::Wait(_) => unreachable!("no max_wait"),
                    }
                })
            })
            .collect();
        let granted = calls
            .into_iter()
            .map(|call| call.join().unwrap())
            .filter(|&granted| granted)
            .count();
        assert!(granted >= 2, "only {granted} of 3 got a free slot");
        let stats = c.stats();
        assert_eq!(stats.in_flight(), 0, "a slot was not returned");
        assert_eq!(stats.rejected(), 3 - granted as u64);
    });
}

/// A compartment of one slot, held; a call waits for it while the holder
/// releases it, racing. The release always wakes the waiter (or the waiter
/// sees the free slot itself): it gets the slot, and afterwards the slot
/// and the waiter place are free.
#[test]
fn a_release_always_wakes_the_waiting_call() {
    model(|| {
        let c = compartment(1);
        let holder = Permit::try_acquire(&c).unwrap();
        let waiter = {
            let c = c.clone();
            thread::spawn(move || wait(&c, 1).expect("a waiter place is free"))
        };
        drop(holder);
        drop(waiter.join().unwrap());
        assert_eq!(c.stats().in_flight(), 0);
        assert_eq!(c.stats().waiting(), 0);
    });
}

/// A compartment of one slot, held; two calls wait for it (two waiter
/// places) while the holder releases it. Each release wakes one waiter,
/// so both get the slot in turn, never both at once, and afterwards the
/// slot and both places are free: no wake-up is lost, including one that
/// reached a waiter which had already taken the slot by itself.
#[test]
fn each_release_wakes_one_of_two_waiting_calls() {
    model(|| {
        let c = compartment(1);
        let held = Arc::new(Witness::new(0));
        let holder = Permit::try_acquire(&c).unwrap();
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (c, held) = (c.clone(), held.clone());
                thread::spawn(move || {
                    let permit = wait(&c, 2).expect("a waiter place is free");
                    hold(permit, &held, 1);
                })
            })
            .collect();
        drop(holder);
        for waiter in waiters {
            waiter.join().unwrap();
        }
        assert_eq!(c.stats().in_flight(), 0);
        assert_eq!(c.stats().waiting(), 0);
    });
}

/// Three calls race for two waiter places of a full compartment. Never
/// more than two hold a place at once, and every place is given back.
#[test]
fn waiter_places_never_exceed_max_waiters() {
    model(|| {
        let c = compartment(0);
        let held = Arc::new(Witness::new(0));
        let calls: Vec<_> = (0..3)
            .map(|_| {
                let (c, held) = (c.clone(), held.clone());
                thread::spawn(move || {
                    if let Some(place) = WaiterPlace::try_take(&c, 2) {
                        let now = held.fetch_add(1, SeqCst) + 1;
                        assert!(now <= 2, "{now} waiter places of 2 taken");
                        thread::yield_now();
                        held.fetch_sub(1, SeqCst);
                        drop(place);
                    }
                })
            })
            .collect();
        for call in calls {
            call.join().unwrap();
        }
        assert_eq!(c.stats().waiting(), 0);
    });
}
