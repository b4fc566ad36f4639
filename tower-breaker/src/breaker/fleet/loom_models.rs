//! Loom models of the fleet link: what local callers and the syncs with
//! the store share. The store calls themselves run in spawned tasks, which
//! a model has no runtime for (they are dropped unrun, as the code expects
//! without one); the models check the parts beside them: the reports taken
//! from the totals, and the adoption of a decision pushed by the store,
//! each racing the hot path. Run with `scripts/loom`.

use std::sync::Arc;
use std::time::Duration;

use loom::thread;
use tower_resilience_base::loom_sync::model;

use super::super::Breaker;
use super::*;
use crate::classify::Outcome;
use crate::config::{BreakerConfig, FleetConfig};
use crate::store::MemoryStore;
use crate::sync::clock;

const OPEN_PERIOD: Duration = Duration::from_secs(1);
/// What the fleet's decision in the adoption model leaves of its opening.
const FLEET_REMAINING: Duration = Duration::from_secs(5);

/// A breaker sharing a [`MemoryStore`] (sharing its evidence with the
/// fleet's window if `fleet_window`), whose count window of `window` calls
/// opens on one failure in two once it holds `minimum_calls`, for
/// [`OPEN_PERIOD`] without jitter; the clock at zero. Neither its periodic
/// read nor a flush of failures is due, so the model's own syncs are the
/// only ones.
fn breaker(fleet_window: bool, window: usize, minimum_calls: u32) -> Breaker {
    clock::set(Duration::ZERO);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let b = Breaker::with_config(
        "loom",
        BreakerConfig::new()
            .count_window(window)
            .minimum_calls(minimum_calls)
            .failure_rate(0.5)
            .open_period(OPEN_PERIOD)
            .jitter(0.0)
            .fleet(FleetConfig::new(store).fleet_window(fleet_window)),
    );
    let link = b.core.store.as_ref().expect("a store");
    link.next_refresh_ns.store(u64::MAX / 2, Relaxed);
    link.next_flush_ns.store(u64::MAX / 2, Relaxed);
    b
}

/// Takes the report a sync would send now: its calls, failures and slow
/// calls (zeros when there is nothing to report).
fn take_report(core: &Core) -> [u64; 3] {
    let link = core.store.as_ref().expect("a store");
    let rule = link.fleet.expect("the fleet's window");
    core.take_report(link, rule, clock::now().as_nanos() as u64)
        .map_or([0; 3], |(r, _)| [r.calls, r.failures, r.slow])
}

fn add(a: [u64; 3], b: [u64; 3]) -> [u64; 3] {
    [a[0] + b[0], a[1] + b[1], a[2] + b[2]]
}

/// A caller records a success and a failure while a sync task takes two
/// reports and the main thread a third. Every outcome is reported exactly
/// once: once a last report has been taken after the caller is done, the
/// reports add up to the totals (none lost, none sent twice by two syncs
/// that read the same "already reported"), and what is recorded as
/// reported equals the totals.
#[test]
fn racing_reports_send_every_outcome_exactly_once() {
    model(|| {
        let b = breaker(true, 4, 4);
        let core = b.core.clone();
        let caller = thread::spawn(move || {
            b.try_acquire().unwrap().record(Outcome::Success);
            b.try_acquire().unwrap().record(Outcome::Failure);
        });
        let syncs = {
            let core = core.clone();
            thread::spawn(move || add(take_report(&core), take_report(&core)))
        };
        let mut sent = take_report(&core);
        assert!(sent[0] <= 2 && sent[1] <= 1, "{sent:?}");
        caller.join().unwrap();
        sent = add(sent, syncs.join().unwrap());
        sent = add(sent, take_report(&core));
        assert_eq!(sent, [2, 1, 0], "calls, failures, slow calls reported");
        let totals = core.totals();
        let link = core.store.as_ref().unwrap();
        let reported = *link.reported.lock().unwrap();
        assert_eq!(
            reported[..3],
            [totals.calls(), totals.failed, totals.slow],
            "recorded as reported"
        );
    });
}

/// A caller's failure opens the circuit here (for [`OPEN_PERIOD`]) while
/// the store pushes the fleet's opening (for [`FLEET_REMAINING`]), and the
/// main thread reads the state. The state read is one of those written:
/// closed, or open until one of the two deadlines. Once both are done the
/// circuit opened exactly once, by whichever came first: the fleet's
/// opening is adopted (and known as shared) only if it came first, and the
/// push is counted as synced.
#[test]
fn a_pushed_opening_racing_a_local_one_opens_once() {
    model(|| {
        let b = breaker(false, 2, 1);
        let core = b.core.clone();
        let closed = Word(core.word.load(Acquire));
        let local = thread::spawn(move || {
            if let Ok(permit) = b.try_acquire() {
                permit.record(Outcome::Failure);
            }
        });
        let pushed = {
            let core = core.clone();
            thread::spawn(move || {
                core.decided(Decision::Open {
                    remaining: FLEET_REMAINING,
                })
            })
        };
        let ms = |d: Duration| d.as_millis() as u64;
        let deadlines = [ms(OPEN_PERIOD), ms(FLEET_REMAINING)];
        let seen = Word(core.word.load(Acquire));
        assert!(
            seen == closed || seen.state() == OPEN && deadlines.contains(&seen.deadline_ms()),
            "{seen:?}"
        );
        local.join().unwrap();
        pushed.join().unwrap();
        let w = Word(core.word.load(Acquire));
        assert_eq!(w.state(), OPEN);
        assert!(deadlines.contains(&w.deadline_ms()), "{w:?}");
        assert_eq!(core.opened.load(Relaxed), 1, "opened twice");
        assert_eq!(core.transitions.load(Relaxed), 1);
        let link = core.store.as_ref().unwrap();
        assert_eq!(
            link.shared_open.load(Relaxed),
            w.deadline_ms() == ms(FLEET_REMAINING),
            "{w:?}"
        );
        assert_eq!(link.synced_ns.load(Acquire), 1, "asked at 0, plus one");
    });
}
