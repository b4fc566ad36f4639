//! Loom models of the windows: every interleaving (within the preemption
//! bound of `loom_sync::model`) of two or three threads recording into, and
//! reading, one small window. Run with `scripts/loom`.

use std::sync::Arc;

use loom::thread;
use tower_resilience_base::loom_sync::model;

use super::*;

fn counts(calls: u64, failures: u64, slow: u64) -> Counts {
    Counts {
        calls,
        failures,
        slow,
    }
}

/// The counts the slots of `w` hold for `epoch`: what the aggregate must
/// equal once no record is in flight.
fn slot_counts(w: &CountWindow, epoch: u32) -> Counts {
    let mut c = Counts::default();
    for slot in w.slots.iter() {
        let s = slot.load(Relaxed);
        if s >> 2 == epoch && s & 0b11 != 0 {
            c = apply(c, s & 0b11, true);
        }
    }
    c
}

/// Count window, one epoch: two writers race on a ring of two slots (one
/// of them lapping it) while a reader reads. The aggregate never goes
/// below zero nor past the window plus the records in flight, never shows
/// more failures and slow calls than calls, and once the writers are done
/// it equals what the slots hold: no add or subtract is lost or doubled.
#[test]
fn count_window_aggregate_matches_the_slots_under_racing_records() {
    model(|| {
        let w = Arc::new(CountWindow::new(2));
        let a = {
            let w = w.clone();
            thread::spawn(move || {
                w.record(1, FAIL);
                w.record(1, OK);
            })
        };
        let b = {
            let w = w.clone();
            thread::spawn(move || w.record(1, SLOW))
        };
        let c = w.counts(1);
        assert!(c.calls <= 2 + 2, "{c:?}");
        assert!(c.failures <= 1 && c.slow <= 1, "{c:?}");
        assert!(c.failures + c.slow <= c.calls, "{c:?}");
        a.join().unwrap();
        b.join().unwrap();
        let c = w.counts(1);
        assert_eq!(c, slot_counts(&w, 1));
        assert_eq!(c.calls, 2, "a full window of two");
    });
}

/// Count window, an epoch change: a record of the old epoch (a call
/// admitted before the circuit moved on) races with records of the new one.
/// The old outcome never counts in the new epoch's window, and never takes
/// one of the new outcomes out of it.
#[test]
fn count_window_stale_epoch_never_counts_in_the_new_one() {
    model(|| {
        let w = Arc::new(CountWindow::new(2));
        let stale = {
            let w = w.clone();
            thread::spawn(move || w.record(1, FAIL))
        };
        let fresh = {
            let w = w.clone();
            thread::spawn(move || {
                w.record(2, SLOW);
                w.counts(2)
            })
        };
        let during = w.counts(2);
        assert_eq!(during.failures, 0, "{during:?}");
        stale.join().unwrap();
        let seen = fresh.join().unwrap();
        assert_eq!(seen, counts(1, 0, 1), "the writer sees its own record");
        assert_eq!(w.counts(2), counts(1, 0, 1));
    });
}

/// Count window, a record delayed across a close: its add lands in the old
/// epoch's aggregate, then the window moves to the next epoch and a new
/// outcome takes the one slot. The delayed record must not take that slot
/// back: once both are done, the new epoch's aggregate equals what the
/// slots hold (a window of one holds one call, never two).
#[test]
fn count_window_a_delayed_old_record_never_evicts_a_newer_one() {
    model(|| {
        let w = Arc::new(CountWindow::new(1));
        let stale = {
            let w = w.clone();
            thread::spawn(move || w.record(1, SLOW))
        };
        let fresh = {
            let w = w.clone();
            thread::spawn(move || w.record(2, FAIL))
        };
        stale.join().unwrap();
        fresh.join().unwrap();
        let c = w.counts(2);
        assert_eq!(
            c,
            slot_counts(&w, 2),
            "the aggregate counts a call no slot holds"
        );
        assert_eq!(c, counts(1, 1, 0));
    });
}

/// Time window, the rollover: the one bucket holds a lap of failures of
/// tick 0; two writers record a success and a slow call in tick 1, racing
/// to recycle the bucket, while a reader reads tick 1. The reader never
/// sees the old lap's failures nor more slow calls than calls, and once the
/// writers are done the bucket holds exactly their two outcomes: the reset
/// wiped nothing recorded after it, and the second writer waited for it.
/// (Loom's `spin_loop` yields, so a writer polling a busy bucket lets the
/// recycler finish; the outcome dropped after `BUSY_SPINS` polls of a
/// recycler descheduled that long is outside this model.)
#[test]
fn time_window_rollover_never_shows_the_old_lap_nor_loses_an_outcome() {
    const NS: u64 = 1_000;
    model(|| {
        let w = Arc::new(TimeWindow::new(1, NS));
        w.record(7, FAIL, 0);
        w.record(7, FAIL, 1);
        assert_eq!(w.counts(7, 0), counts(2, 2, 0));
        let ok = {
            let w = w.clone();
            thread::spawn(move || w.record(7, OK, NS))
        };
        let slow = {
            let w = w.clone();
            thread::spawn(move || w.record(7, SLOW, NS + 1))
        };
        let c = w.counts(7, NS);
        assert_eq!(c.failures, 0, "the old lap counted: {c:?}");
        assert!(c.slow <= c.calls && c.calls <= 2, "{c:?}");
        ok.join().unwrap();
        slow.join().unwrap();
        assert_eq!(w.counts(7, NS), counts(2, 0, 1));
    });
}

/// Time window, the seqlock read: a writer recycles a bucket full of the
/// old lap (two failures) for the next tick while a reader reads the
/// bucket's counts with any stamp. A read returns one lap or the other,
/// never the calls of one and the failures of the other.
#[test]
fn time_window_bucket_read_never_mixes_two_laps() {
    const NS: u64 = 1_000;
    model(|| {
        let w = Arc::new(TimeWindow::new(1, NS));
        w.record(3, FAIL, 0);
        w.record(3, FAIL, 0);
        let writer = {
            let w = w.clone();
            thread::spawn(move || w.record(3, OK, NS))
        };
        if let Some(read) = w.buckets[0].read(|_| true) {
            assert!(read == (2, 2) || read == (1, 0), "mixed laps: {read:?}");
        }
        writer.join().unwrap();
        assert_eq!(w.buckets[0].read(|_| true), Some((1, 0)));
    });
}

/// Time window, an epoch change within one tick: a failure of the old
/// epoch races with a success of the new one in the same bucket. The new
/// epoch's window never shows the old failure, and keeps its success.
#[test]
fn time_window_stale_epoch_never_counts_in_the_new_one() {
    model(|| {
        let w = Arc::new(TimeWindow::new(2, 1_000));
        let stale = {
            let w = w.clone();
            thread::spawn(move || w.record(4, FAIL, 10))
        };
        w.record(5, OK, 20);
        let c = w.counts(5, 30);
        assert_eq!(c, counts(1, 0, 0));
        stale.join().unwrap();
        assert_eq!(w.counts(5, 30), counts(1, 0, 0));
    });
}
